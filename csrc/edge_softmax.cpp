// The [E, H] per-edge ops on CPU: gnnfuse.edge_softmax (softmax of per-edge logits over each
// target row of the CSR) and the head-weighted gather-scatter (fused_gather_scatter with [E, H]
// edge weights: out[i, h, :] = sum_k w[k, h] x[col[k], h, :], optionally / deg(i)), with their
// backwards. Each output row is handled by one thread (no atomics, deterministic); half types
// accumulate in float. Part of the "attention" extension (its module is defined in attention.cpp).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <cmath>
#include <algorithm>
#include <limits>
#include <vector>

#include "reducer.h"

namespace gnnfuse {
namespace {

// gnnfuse.edge_softmax: p[e, h] = softmax of logits[e, h] over the edges e of e's target row.
// logits/out are in edge order; perm maps CSR positions to edge ids, so no permuted copy is made.
template <typename scalar_t, typename index_t>
void edge_softmax_kernel(const scalar_t* logits, const index_t* rowptr, const index_t* perm, scalar_t* out,
                         int64_t num_rows, int64_t H) {
  using acc_t = at::opmath_type<scalar_t>;
  parallel_over_rows(rowptr, num_rows, H, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        acc_t m = -std::numeric_limits<acc_t>::infinity(), z = 0;
        for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) m = std::max(m, acc_t(logits[int64_t(perm[k]) * H + h]));
        for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) z += std::exp(acc_t(logits[int64_t(perm[k]) * H + h]) - m);
        for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
          const int64_t q = int64_t(perm[k]) * H + h;
          out[q] = scalar_t(std::exp(acc_t(logits[q]) - m) / z);
        }
      }
    }
  });
}

// grad_logits = p * (g - sum_row(p * g)), per head.
template <typename scalar_t, typename index_t>
void edge_softmax_backward_kernel(const scalar_t* g, const scalar_t* p, const index_t* rowptr, const index_t* perm,
                                  scalar_t* grad, int64_t num_rows, int64_t H) {
  using acc_t = at::opmath_type<scalar_t>;
  parallel_over_rows(rowptr, num_rows, H, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        acc_t s = 0;
        for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
          const int64_t q = int64_t(perm[k]) * H + h;
          s += acc_t(p[q]) * acc_t(g[q]);
        }
        for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
          const int64_t q = int64_t(perm[k]) * H + h;
          grad[q] = scalar_t(acc_t(p[q]) * (acc_t(g[q]) - s));
        }
      }
    }
  });
}

at::Tensor edge_softmax(const at::Tensor& logits, const at::Tensor& rowptr, const at::Tensor& perm) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.size(0) == perm.numel(),
              "edge_softmax: logits must be a contiguous [E, H] tensor");
  auto out = at::zeros_like(logits);  // edges outside every row (none for a valid CSR) stay 0
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "edge_softmax", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "edge_softmax_index", [&] {
      edge_softmax_kernel<scalar_t, index_t>(logits.data_ptr<scalar_t>(), rowptr.data_ptr<index_t>(),
                                             perm.data_ptr<index_t>(), out.data_ptr<scalar_t>(), rowptr.numel() - 1,
                                             logits.size(1));
    });
  });
  return out;
}

at::Tensor edge_softmax_backward(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& rowptr,
                                 const at::Tensor& perm) {
  auto g = grad.contiguous();
  auto result = at::zeros_like(out);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "edge_softmax_backward", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "edge_softmax_backward_index", [&] {
      edge_softmax_backward_kernel<scalar_t, index_t>(g.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                                      rowptr.data_ptr<index_t>(), perm.data_ptr<index_t>(),
                                                      result.data_ptr<scalar_t>(), rowptr.numel() - 1, out.size(1));
    });
  });
  return result;
}

// ---- head-weighted gather-scatter: x [N, H, F], w [E, H] in CSR order -------------------------------
// out[r, h, :] = sum_{q in row r of (ptr, nbr)} w[pos(q), h] * scale(q) * x[nbr[q], h, :]. Forward:
// (rowptr, col), pos = q, scale = 1 / deg(r) for mean. x's gradient: the transpose (t_rowptr, t_col,
// t_pos), pos = t_pos[q], scale = 1 / deg(t_col[q]) for mean (deg from the graph's rowptr).
template <typename scalar_t, typename index_t>
void head_aggregate_kernel(const scalar_t* x, const scalar_t* w, const index_t* ptr, const index_t* nbr,
                           const index_t* pos, const index_t* rowptr, bool mean, scalar_t* out, int64_t num_rows,
                           int64_t H, int64_t F) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t HF = H * F;
  parallel_over_rows(ptr, num_rows, HF, [&](int64_t r0, int64_t r1) {
    std::vector<acc_t> acc(HF);
    for (int64_t r = r0; r < r1; ++r) {
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t q = ptr[r]; q < ptr[r + 1]; ++q) {
        const int64_t k = pos ? int64_t(pos[q]) : q, other = nbr[q];
        acc_t s = 1;
        if (mean && pos) s = acc_t(1) / acc_t(std::max<int64_t>(rowptr[other + 1] - rowptr[other], 1));
        const scalar_t* xr = x + other * HF;
        for (int64_t h = 0; h < H; ++h) {
          const acc_t c = acc_t(w[k * H + h]) * s;
          acc_t* a = acc.data() + h * F;
#pragma omp simd
          for (int64_t f = 0; f < F; ++f) a[f] += c * acc_t(xr[h * F + f]);
        }
      }
      const acc_t s = (mean && !pos) ? acc_t(1) / acc_t(std::max<int64_t>(ptr[r + 1] - ptr[r], 1)) : acc_t(1);
      for (int64_t f = 0; f < HF; ++f) out[r * HF + f] = scalar_t(acc[f] * s);
    }
  });
}

// grad w[k, h] = g[i, h, :] . x[col[k], h, :] (/ deg(i) for mean), k in row i: written by i's thread.
template <typename scalar_t, typename index_t>
void head_weight_grad_kernel(const scalar_t* g, const scalar_t* x, const index_t* rowptr, const index_t* col,
                             bool mean, scalar_t* gw, int64_t num_rows, int64_t H, int64_t F) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t HF = H * F;
  parallel_over_rows(rowptr, num_rows, HF, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const acc_t s = mean ? acc_t(1) / acc_t(std::max<int64_t>(rowptr[i + 1] - rowptr[i], 1)) : acc_t(1);
      const scalar_t* gi = g + i * HF;
      for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
        const scalar_t* xr = x + int64_t(col[k]) * HF;
        for (int64_t h = 0; h < H; ++h) {
          acc_t d = 0;
#pragma omp simd reduction(+ : d)
          for (int64_t f = 0; f < F; ++f) d += acc_t(gi[h * F + f]) * acc_t(xr[h * F + f]);
          gw[k * H + h] = scalar_t(d * s);
        }
      }
    }
  });
}

void check_head_inputs(const at::Tensor& x, const at::Tensor& w, const at::Tensor& rowptr, const at::Tensor& col) {
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous(), "head_gather_scatter: x must be a contiguous [N, H, F] tensor");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(0) == col.numel() && w.size(1) == x.size(1) &&
                  w.scalar_type() == x.scalar_type(),
              "head_gather_scatter: weight must be a contiguous [E, H] tensor with x's dtype");
  TORCH_CHECK(rowptr.scalar_type() == col.scalar_type(), "head_gather_scatter: rowptr and col dtypes differ");
}

at::Tensor head_gather_scatter(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
                               const at::Tensor& w, bool mean) {
  check_head_inputs(x, w, rowptr, col);
  const int64_t num_dst = rowptr.numel() - 1;
  auto out = at::empty({num_dst, x.size(1), x.size(2)}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "head_gather_scatter", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "head_gather_scatter_index", [&] {
      head_aggregate_kernel<scalar_t, index_t>(x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                                               rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(), nullptr,
                                               rowptr.data_ptr<index_t>(), mean, out.data_ptr<scalar_t>(), num_dst,
                                               x.size(1), x.size(2));
    });
  });
  return out;
}

// (grad x, grad w); a gradient not asked for comes back empty.
std::tuple<at::Tensor, at::Tensor> head_gather_scatter_backward(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& w,
    const at::Tensor& t_rowptr, const at::Tensor& t_col, const at::Tensor& t_pos, bool mean, bool need_x,
    bool need_w) {
  check_head_inputs(x, w, rowptr, col);
  auto g = grad.contiguous();
  TORCH_CHECK(g.dim() == 3 && g.size(0) == rowptr.numel() - 1 && g.size(1) == x.size(1) && g.size(2) == x.size(2),
              "head_gather_scatter_backward: grad must be [N_dst, H, F]");
  TORCH_CHECK(!need_x || t_rowptr.numel() - 1 == x.size(0),
              "head_gather_scatter_backward: the transpose must have N_src rows");
  auto gx = need_x ? at::empty_like(x) : x.new_empty({0});
  auto gw = need_w ? at::empty_like(w) : x.new_empty({0});
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "head_gather_scatter_backward", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "head_gather_scatter_backward_index", [&] {
      if (need_x)
        head_aggregate_kernel<scalar_t, index_t>(g.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                                                 t_rowptr.data_ptr<index_t>(), t_col.data_ptr<index_t>(),
                                                 t_pos.data_ptr<index_t>(), rowptr.data_ptr<index_t>(), mean,
                                                 gx.data_ptr<scalar_t>(), x.size(0), x.size(1), x.size(2));
      if (need_w)
        head_weight_grad_kernel<scalar_t, index_t>(g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                                   rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(), mean,
                                                   gw.data_ptr<scalar_t>(), rowptr.numel() - 1, x.size(1), x.size(2));
    });
  });
  return {gx, gw};
}

}  // namespace

void register_edge_softmax(pybind11::module& m) {
  m.def("edge_softmax", &edge_softmax);
  m.def("edge_softmax_backward", &edge_softmax_backward);
  m.def("head_gather_scatter", &head_gather_scatter);
  m.def("head_gather_scatter_backward", &head_gather_scatter_backward);
}

}  // namespace gnnfuse
