// The ops that turn tokens and images into sequences, and their derivatives: rows of a
// table by id, patches of images, a block of columns (the rest of basic_ops: ops.cpp).
#include "layers/ops.hpp"

#include "layers/detail/ops_require.hpp"

namespace nerve::layers {

template <class S>
auto basic_ops<S>::gather_rows(const array& table, const array& ids) -> array {
  detail::ops_require(table.dims.size() == 2, "gather_rows from a table of " + table.shape_string() + ", not [rows, cols]");
  const std::int64_t rows = table.rows(), cols = table.cols(), n = ids.size();
  auto dims = ids.dims;
  dims.push_back(cols);
  auto y = set_.alloc(std::move(dims));
  set_.gather_rows(table.data, rows, cols, ids.data, n, y.data);
  if (recording({&table})) {
    y.id = tape_->record([table, ids, rows, cols, n](basic_tape<S>& t, const array& dy) {
      auto g = t.set().alloc(table.dims);
      t.set().fill(g.size(), S(0), g.data);
      t.set().scatter_add_rows(dy.data, ids.data, n, rows, cols, g.data);
      t.accumulate(table.id, std::move(g), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::patchify(const array& x, std::int64_t patch) -> array {
  const auto g = window_over(x.dims, {patch, patch}, {patch, patch}, {0, 0});
  detail::ops_require(g.height % patch == 0 && g.width % patch == 0,
                      "patchify of " + x.shape_string() + " into " + std::to_string(patch) + "×" +
                          std::to_string(patch) + " patches: the height and width must be multiples of the patch");
  auto y = set_.alloc({g.batch, g.patch_cols(), g.patch_rows()});
  set_.patchify(g, x.data, y.data);
  if (recording({&x})) {
    y.id = tape_->record([g, xdims = x.dims, xid = x.id](basic_tape<S>& t, const array& dy) {
      auto gx = t.set().alloc(xdims);
      t.set().unpatchify(g, dy.data, gx.data);
      t.accumulate(xid, std::move(gx), true);
    });
  }
  return y;
}

template <class S>
auto basic_ops<S>::slice_cols(const array& x, std::int64_t first, std::int64_t count, std::vector<std::int64_t> dims)
    -> array {
  const std::int64_t rows = x.rows(), cols = x.cols();
  detail::ops_require(first >= 0 && count >= 0 && first + count <= cols,
                      "columns [" + std::to_string(first) + ", " + std::to_string(first + count) + ") of " +
                          x.shape_string());
  auto y = set_.alloc(std::move(dims));
  detail::ops_require(y.size() == rows * count, "a slice of " + std::to_string(rows * count) + " elements as " +
                                                    y.shape_string());
  set_.copy2d(rows, count, x.data + first, cols, y.data, count);
  if (recording({&x})) {
    y.id = tape_->record([xdims = x.dims, xid = x.id, rows, cols, first, count](basic_tape<S>& t, const array& dy) {
      auto g = t.set().alloc(xdims);
      t.set().fill(g.size(), S(0), g.data);
      t.set().copy2d(rows, count, dy.data, count, g.data + first, cols);
      t.accumulate(xid, std::move(g), true);
    });
  }
  return y;
}

#define NERVE_TOKEN_OPS(S)                                                                                   \
  template basic_array<S> basic_ops<S>::gather_rows(const basic_array<S>&, const basic_array<S>&);            \
  template basic_array<S> basic_ops<S>::patchify(const basic_array<S>&, std::int64_t);                         \
  template basic_array<S> basic_ops<S>::slice_cols(const basic_array<S>&, std::int64_t, std::int64_t,          \
                                                   std::vector<std::int64_t>);
NERVE_TOKEN_OPS(float)
NERVE_TOKEN_OPS(double)
#undef NERVE_TOKEN_OPS

}  // namespace nerve::layers
