#pragma once
/// \file
/// The element kernels of sequences (gpu/kernels/ops.hpp's contract: `op(i)` computes
/// element `i`, compiled by nvcc and by the stand-in): rows of a table by id and patches
/// of images (the embeddings), the row softmax and the head permutations (attention).
/// gpu/kernels/ops.hpp's `pointwise_op` lists them.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "gpu/kernels.hpp"
#include "gpu/kernels/element.hpp"

namespace nerve::gpu::ops {

// ---- rows of a table by id, patches of images ----------------------------------------

/// Whether `id` (a float holding an integer) names a row of a table of `rows`: an integer
/// in [0, rows); NaN is not.
NERVE_HOST_DEVICE inline bool is_row(float id, std::size_t rows) {
  return id >= 0.0f && id < float(rows) && id == floorf(id);
}
/// y[i] = table[ids[i / cols]][i % cols], or 0 where that id names no row (never a read
/// outside the table).
struct gather_rows {
  const float *table, *ids;
  float* y;
  std::size_t rows, cols;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t t = i / cols, c = i - t * cols;
    const float id = read_only(ids[t]);
    y[i] = is_row(id, rows) ? read_only(table[std::size_t(id) * cols + c]) : 0.0f;
  }
};
/// The columns one thread of `scatter_add_rows` adds: a warp spans a row's neighbouring
/// columns, and the ids are scanned once per chunk rather than once per element.
inline constexpr std::size_t scatter_chunk = 32;
/// Element i is (row r, chunk k) of the table: table[r][c] += dy[t][c] for every t with
/// ids[t] = r, t in increasing order (the CPU's order: the same bits), for the chunk's
/// columns c. A gather per row instead of a scatter with atomics: deterministic.
struct scatter_add_rows {
  const float *dy, *ids;
  float* table;
  std::size_t n, cols, chunks;  // chunks: ceil(cols / scatter_chunk)
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t r = i / chunks, c0 = (i - r * chunks) * scatter_chunk;
    const std::size_t c1 = c0 + scatter_chunk < cols ? c0 + scatter_chunk : cols;
    for (std::size_t t = 0; t < n; ++t) {
      const float id = read_only(ids[t]);
      if (id != float(r)) continue;
      for (std::size_t c = c0; c < c1; ++c) table[r * cols + c] += read_only(dy[t * cols + c]);
    }
  }
};
/// Image element i of `[N, C, H, W]` and its place in the patches `[N, patches, C·p·q]`
/// (a window with stride = kernel = p × q, H and W multiples of it).
NERVE_HOST_DEVICE inline std::size_t patch_index(const window_geometry& g, std::size_t i) {
  const std::size_t p = std::size_t(g.kernel_h), q = std::size_t(g.kernel_w), C = std::size_t(g.channels);
  const std::size_t H = std::size_t(g.height), W = std::size_t(g.width);
  const std::size_t w = i % W, h = (i / W) % H, c = (i / (W * H)) % C, n = i / (W * H * C);
  const std::size_t patches = (H / p) * (W / q), patch = (h / p) * (W / q) + w / q;
  return (n * patches + patch) * (C * p * q) + (c * p + h % p) * q + w % q;
}
/// y = the patches of x (`Forward`), or x = the images of y (the inverse); element i is
/// image element i either way.
template <bool Forward>
struct patch_permute {
  const float* from;
  float* to;
  window_geometry g;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    if constexpr (Forward)
      to[patch_index(g, i)] = read_only(from[i]);
    else
      to[i] = read_only(from[patch_index(g, i)]);
  }
};
// ---- attention: the row softmax and the head permutations --------------------------

/// Row r's softmax (one thread per row), columns past its last visible one 0 (layers'
/// causal_mask: row r % block_rows of its block sees the columns ≤ that + offset). Plain
/// loads, not the read-only path: the thread reads back what it wrote into y.
struct softmax_rows {
  const float* x;
  float* y;
  std::size_t cols;
  bool causal;
  std::size_t block_rows;
  std::int64_t offset;
  NERVE_HOST_DEVICE void operator()(std::size_t r) const {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    std::int64_t last = std::int64_t(cols) - 1;
    if (causal) {
      const std::int64_t mine = std::int64_t(r % block_rows) + offset;
      if (mine < last) last = mine;
    }
    float top = last >= 0 ? xr[0] : 0.0f;
    for (std::int64_t c = 1; c <= last; ++c) top = xr[c] > top ? xr[c] : top;
    double sum = 0.0;
    for (std::int64_t c = 0; c <= last; ++c) {
      const float e = expf(xr[c] - top);
      yr[c] = e;
      sum += double(e);
    }
    for (std::int64_t c = 0; c <= last; ++c) yr[c] = float(double(yr[c]) / sum);
    for (std::int64_t c = last + 1; c < std::int64_t(cols); ++c) yr[c] = 0.0f;
  }
};
/// dx = y·(dy − Σ_c dy·y) over row r (one thread per row), the sum in double.
struct softmax_rows_backward {
  const float *y, *dy;
  float* dx;
  std::size_t cols;
  NERVE_HOST_DEVICE void operator()(std::size_t r) const {
    const std::size_t at = r * cols;
    double dot = 0.0;
    for (std::size_t c = 0; c < cols; ++c) dot += double(read_only(dy[at + c])) * double(read_only(y[at + c]));
    const float d = float(dot);
    for (std::size_t c = 0; c < cols; ++c) dx[at + c] = read_only(y[at + c]) * (read_only(dy[at + c]) - d);
  }
};
/// Element i of one head layout from the other: `Split` writes `[parts, B, H, T, D]`
/// element i from `[B, T, parts, H, D]`, else the reverse (a gather either way).
template <bool Split>
struct permute_heads {
  const float* from;
  float* to;
  head_layout g;
  NERVE_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t d = i % g.head_dim;
    std::size_t rest = i / g.head_dim;
    if constexpr (Split) {  // i is (p, b, h, t, d)
      const std::size_t t = rest % g.tokens;
      rest /= g.tokens;
      const std::size_t h = rest % g.heads;
      rest /= g.heads;
      const std::size_t b = rest % g.batch, p = rest / g.batch;
      to[i] = read_only(from[(((b * g.tokens + t) * g.parts + p) * g.heads + h) * g.head_dim + d]);
    } else {  // i is (b, t, p, h, d)
      const std::size_t h = rest % g.heads;
      rest /= g.heads;
      const std::size_t p = rest % g.parts;
      rest /= g.parts;
      const std::size_t t = rest % g.tokens, b = rest / g.tokens;
      to[i] = read_only(from[(((p * g.batch + b) * g.heads + h) * g.tokens + t) * g.head_dim + d]);
    }
  }
};

}  // namespace nerve::gpu::ops
