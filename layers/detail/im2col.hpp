#pragma once
/// \file
/// im2col / col2im for one `[C, H, W]` sample (internal to conv2d).

#include <cstdint>

namespace nerve::layers::detail {

/// Geometry of one convolution over one sample.
struct conv_geometry {
  std::int64_t c, h, w, kh, kw, sh, sw, ph, pw, oh, ow;
};

/// Writes the `(C·kh·kw) × (OH·OW)` column matrix of `x` into `col` (zero padding).
template <class Scalar>
void im2col(const conv_geometry& g, const Scalar* x, Scalar* col) {
  for (std::int64_t c = 0; c < g.c; ++c)
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        Scalar* out = col + ((c * g.kh + i) * g.kw + j) * g.oh * g.ow;
        for (std::int64_t y = 0; y < g.oh; ++y) {
          const std::int64_t iy = y * g.sh - g.ph + i;
          Scalar* o = out + y * g.ow;
          if (iy < 0 || iy >= g.h) {
            for (std::int64_t x0 = 0; x0 < g.ow; ++x0) o[x0] = Scalar(0);
            continue;
          }
          const Scalar* row = x + (c * g.h + iy) * g.w;
          for (std::int64_t x0 = 0; x0 < g.ow; ++x0) {
            const std::int64_t ix = x0 * g.sw - g.pw + j;
            o[x0] = (ix >= 0 && ix < g.w) ? row[ix] : Scalar(0);
          }
        }
      }
}

/// Adds the column matrix `col` back into the image `dx` (which the caller zeroed).
template <class Scalar>
void col2im(const conv_geometry& g, const Scalar* col, Scalar* dx) {
  for (std::int64_t c = 0; c < g.c; ++c)
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        const Scalar* in = col + ((c * g.kh + i) * g.kw + j) * g.oh * g.ow;
        for (std::int64_t y = 0; y < g.oh; ++y) {
          const std::int64_t iy = y * g.sh - g.ph + i;
          if (iy < 0 || iy >= g.h) continue;
          Scalar* row = dx + (c * g.h + iy) * g.w;
          const Scalar* src = in + y * g.ow;
          for (std::int64_t x0 = 0; x0 < g.ow; ++x0) {
            const std::int64_t ix = x0 * g.sw - g.pw + j;
            if (ix >= 0 && ix < g.w) row[ix] += src[x0];
          }
        }
      }
}

}  // namespace nerve::layers::detail
