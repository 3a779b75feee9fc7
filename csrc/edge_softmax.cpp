// gnnfuse.edge_softmax on CPU: softmax of per-edge logits over each target row of the CSR, and its
// backward. Each row is handled by one thread (no atomics, deterministic); half types accumulate
// in float. Part of the "attention" extension (its module is defined in attention.cpp).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <cmath>
#include <limits>

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

}  // namespace

void register_edge_softmax(pybind11::module& m) {
  m.def("edge_softmax", &edge_softmax);
  m.def("edge_softmax_backward", &edge_softmax_backward);
}

}  // namespace gnnfuse
