// gnnfuse.gine_aggregate on CPU: out[i] = reduce over the edges e of target row i of
// relu(x[src(e)] + edge_attr[e]) (GINEConv's message), sum or mean, and its backward, without an
// [E, F] message tensor. Each row is handled by one thread (no atomics, deterministic); half types
// accumulate in float. Its own small extension ("edge_message"), module defined at the end.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <algorithm>
#include <vector>

#include "checks.h"
#include "reducer.h"

namespace gnnfuse {
namespace {

// edge_attr is in edge order; perm maps a CSR position to its edge id, so no permuted copy is made.
template <typename scalar_t, typename index_t>
void forward_kernel(const scalar_t* x, const scalar_t* ea, const index_t* rowptr, const index_t* col,
                    const index_t* perm, scalar_t* out, int64_t num_rows, int64_t F, bool mean) {
  using acc_t = at::opmath_type<scalar_t>;
  parallel_over_rows(rowptr, num_rows, F, [&](int64_t r0, int64_t r1) {
    std::vector<acc_t> acc(F);
    for (int64_t i = r0; i < r1; ++i) {
      std::fill(acc.begin(), acc.end(), acc_t(0));
      const int64_t begin = rowptr[i], end = rowptr[i + 1];
      for (int64_t k = begin; k < end; ++k) {
        const scalar_t* xs = x + int64_t(col[k]) * F;
        const scalar_t* es = ea + int64_t(perm[k]) * F;
        for (int64_t f = 0; f < F; ++f) acc[f] += std::max(acc_t(xs[f]) + acc_t(es[f]), acc_t(0));
      }
      const acc_t scale = (mean && end > begin) ? acc_t(1) / acc_t(end - begin) : acc_t(1);
      for (int64_t f = 0; f < F; ++f) out[i * F + f] = scalar_t(acc[f] * scale);
    }
  });
}

// grad_edge_attr[e] = g[row(e)] * scale(row) * (x[src(e)] + edge_attr[e] > 0): row-parallel over
// the CSR (each edge belongs to one row, so every output row is written by one thread).
template <typename scalar_t, typename index_t>
void grad_edge_kernel(const scalar_t* g, const scalar_t* x, const scalar_t* ea, const index_t* rowptr,
                      const index_t* col, const index_t* perm, scalar_t* grad_ea, int64_t num_rows, int64_t F,
                      bool mean) {
  using acc_t = at::opmath_type<scalar_t>;
  parallel_over_rows(rowptr, num_rows, F, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t begin = rowptr[i], end = rowptr[i + 1];
      const acc_t scale = (mean && end > begin) ? acc_t(1) / acc_t(end - begin) : acc_t(1);
      const scalar_t* gi = g + i * F;
      for (int64_t k = begin; k < end; ++k) {
        const scalar_t* xs = x + int64_t(col[k]) * F;
        const int64_t e = int64_t(perm[k]) * F;
        for (int64_t f = 0; f < F; ++f) {
          const bool active = acc_t(xs[f]) + acc_t(ea[e + f]) > acc_t(0);
          grad_ea[e + f] = scalar_t(active ? acc_t(gi[f]) * scale : acc_t(0));
        }
      }
    }
  });
}

// grad_x[j] = sum over the edges e leaving j of g[dst(e)] * scale(dst(e)) * (pre-activation > 0):
// row-parallel over the transpose (t_col = the edge's target row, t_pos = its CSR position).
template <typename scalar_t, typename index_t>
void grad_x_kernel(const scalar_t* g, const scalar_t* x, const scalar_t* ea, const index_t* rowptr,
                   const index_t* perm, const index_t* t_rowptr, const index_t* t_col, const index_t* t_pos,
                   scalar_t* grad_x, int64_t num_src, int64_t F, bool mean) {
  using acc_t = at::opmath_type<scalar_t>;
  parallel_over_rows(t_rowptr, num_src, F, [&](int64_t r0, int64_t r1) {
    std::vector<acc_t> acc(F);
    for (int64_t j = r0; j < r1; ++j) {
      std::fill(acc.begin(), acc.end(), acc_t(0));
      const scalar_t* xj = x + j * F;
      for (int64_t q = t_rowptr[j]; q < t_rowptr[j + 1]; ++q) {
        const int64_t i = t_col[q], k = t_pos[q];
        const int64_t deg = int64_t(rowptr[i + 1]) - int64_t(rowptr[i]);
        const acc_t scale = mean ? acc_t(1) / acc_t(deg) : acc_t(1);
        const scalar_t* gi = g + i * F;
        const scalar_t* es = ea + int64_t(perm[k]) * F;
        for (int64_t f = 0; f < F; ++f) {
          if (acc_t(xj[f]) + acc_t(es[f]) > acc_t(0)) acc[f] += acc_t(gi[f]) * scale;
        }
      }
      for (int64_t f = 0; f < F; ++f) grad_x[j * F + f] = scalar_t(acc[f]);
    }
  });
}

void check_args(const at::Tensor& x, const at::Tensor& ea, const at::Tensor& rowptr, const at::Tensor& col,
                const at::Tensor& perm) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "gine_aggregate: x must be a contiguous 2-D tensor");
  TORCH_CHECK(ea.dim() == 2 && ea.is_contiguous() && ea.size(0) == col.numel() && ea.size(1) == x.size(1) &&
                  ea.scalar_type() == x.scalar_type(),
              text("gine_aggregate: edge_attr must be a contiguous [E, F] = [", col.numel(), ", ", x.size(1),
                   "] tensor with x's dtype"));
  TORCH_CHECK(rowptr.is_contiguous() && col.is_contiguous() && perm.is_contiguous() &&
                  rowptr.scalar_type() == col.scalar_type() && col.scalar_type() == perm.scalar_type(),
              "gine_aggregate: rowptr, col and perm must be contiguous and share one index dtype");
}

at::Tensor gine_aggregate(const at::Tensor& x, const at::Tensor& ea, const at::Tensor& rowptr,
                          const at::Tensor& col, const at::Tensor& perm, bool mean) {
  check_args(x, ea, rowptr, col, perm);
  const int64_t num_rows = rowptr.numel() - 1, F = x.size(1);
  auto out = at::empty({num_rows, F}, x.options());
  if (num_rows == 0 || F == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gine_aggregate", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gine_aggregate_index", [&] {
      forward_kernel<scalar_t, index_t>(x.data_ptr<scalar_t>(), ea.data_ptr<scalar_t>(), rowptr.data_ptr<index_t>(),
                                        col.data_ptr<index_t>(), perm.data_ptr<index_t>(), out.data_ptr<scalar_t>(),
                                        num_rows, F, mean);
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> gine_aggregate_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& ea, const at::Tensor& rowptr,
    const at::Tensor& col, const at::Tensor& perm, const at::Tensor& t_rowptr, const at::Tensor& t_col,
    const at::Tensor& t_pos, bool mean, bool need_x_grad, bool need_edge_grad) {
  check_args(x, ea, rowptr, col, perm);
  TORCH_CHECK(grad_out.is_contiguous() && grad_out.dim() == 2 && grad_out.size(0) == rowptr.numel() - 1 &&
                  grad_out.size(1) == x.size(1),
              "gine_aggregate_backward: grad_out must be contiguous [num_rows, F]");
  TORCH_CHECK(t_rowptr.numel() - 1 <= x.size(0), "gine_aggregate_backward: transpose has more rows than x");
  const int64_t num_rows = rowptr.numel() - 1, F = x.size(1), num_src = t_rowptr.numel() - 1;
  auto grad_x = need_x_grad ? at::zeros_like(x) : at::empty({0}, x.options());
  auto grad_ea = need_edge_grad ? at::zeros_like(ea) : at::empty({0}, x.options());
  if (F == 0 || col.numel() == 0) return {grad_x, grad_ea};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gine_aggregate_backward", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gine_aggregate_backward_index", [&] {
      if (need_edge_grad) {
        grad_edge_kernel<scalar_t, index_t>(grad_out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                            ea.data_ptr<scalar_t>(), rowptr.data_ptr<index_t>(),
                                            col.data_ptr<index_t>(), perm.data_ptr<index_t>(),
                                            grad_ea.data_ptr<scalar_t>(), num_rows, F, mean);
      }
      if (need_x_grad) {
        grad_x_kernel<scalar_t, index_t>(grad_out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                         ea.data_ptr<scalar_t>(), rowptr.data_ptr<index_t>(), perm.data_ptr<index_t>(),
                                         t_rowptr.data_ptr<index_t>(), t_col.data_ptr<index_t>(),
                                         t_pos.data_ptr<index_t>(), grad_x.data_ptr<scalar_t>(), num_src, F, mean);
      }
    });
  });
  return {grad_x, grad_ea};
}

// The registered op's CPU kernel, with its schema's arguments (gnnfuse/ops/edge_message.py defines
// the schemas; the transpose is passed for the backward and not read here).
at::Tensor gine_aggregate_op(const at::Tensor& x, const at::Tensor& ea, const at::Tensor& rowptr, const at::Tensor& col,
                             const at::Tensor& perm, const c10::optional<at::Tensor>& /*t_rowptr*/,
                             const c10::optional<at::Tensor>& /*t_col*/, const c10::optional<at::Tensor>& /*t_pos*/,
                             bool mean) {
  return gine_aggregate(x, ea, rowptr, col, perm, mean);
}

}  // namespace
}  // namespace gnnfuse

// CPU kernels of gnnfuse::gine_aggregate(_backward), called by the dispatcher without Python; the
// eager route calls the same functions through pybind.
TORCH_LIBRARY_IMPL(gnnfuse, CPU, m) {
  m.impl("gine_aggregate", &gnnfuse::gine_aggregate_op);
  m.impl("gine_aggregate_backward", &gnnfuse::gine_aggregate_backward);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gine_aggregate", &gnnfuse::gine_aggregate_op);
  m.def("gine_aggregate_backward", &gnnfuse::gine_aggregate_backward);
}
