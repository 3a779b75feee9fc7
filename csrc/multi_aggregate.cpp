// Several reductions of the same messages in one pass (CPU): for every CSR row (target) i and
// every requested reduction k, out[i, k*F:(k+1)*F] = REDUCE_k{e in row i} w[e] * x[col[e]].
// Each source row is read from memory once per edge; the per-reduction updates then run over the
// row while it is in L1. Rows are owned by one thread (parallel_over_rows): no atomics, and the
// result does not depend on the thread count. Codes are those of reduce_codes.h.
//
// Statistics kept per (row, feature): sum (sum, mean, var, std), sum of squares (var, std),
// max and min (with the winning CSR position when `need_arg`), product (mul).
// var = mean(m^2) - mean(m)^2 (biased, as PyG's VarAggregation); std = sqrt(max(var, 1e-5)),
// set to 0 where that is <= sqrt(1e-5) (PyG's StdAggregation). Empty rows give 0 everywhere.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <cmath>
#include <limits>
#include <vector>

#include "checks.h"
#include "reduce_codes.h"
#include "reducer.h"

namespace gnnfuse {
namespace {

constexpr int64_t kTile = 256;  // features per tile: 6 statistics of 256 floats stay in L1

struct Needs {
  bool sum = false, sq = false, max = false, min = false, mul = false;
};

Needs needs_of(const std::vector<int64_t>& codes) {
  Needs n;
  for (int64_t c : codes) {
    TORCH_CHECK_VALUE(c >= reduce_code::kSum && c <= reduce_code::kStd, text("multi_aggregate: unknown reduce code ", c));
    n.sum |= c == reduce_code::kSum || c == reduce_code::kMean || c == reduce_code::kVar || c == reduce_code::kStd;
    n.sq |= c == reduce_code::kVar || c == reduce_code::kStd;
    n.max |= c == reduce_code::kMax;
    n.min |= c == reduce_code::kMin;
    n.mul |= c == reduce_code::kMul;
  }
  return n;
}

template <typename scalar_t, typename index_t>
void multi_kernel(const scalar_t* x, const index_t* rowptr, const index_t* col, const scalar_t* weight,
                  const std::vector<int64_t>& codes, const Needs need, bool need_arg, scalar_t* out, index_t* arg,
                  int64_t num_rows, int64_t F) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t K = static_cast<int64_t>(codes.size());
  const int64_t num_arg = (need.max ? 1 : 0) + (need.min ? 1 : 0);
  // arg layout: [num_arg, num_rows, F], max first
  const int64_t max_slot = 0, min_slot = need.max ? 1 : 0;
  parallel_over_rows(rowptr, num_rows, F, [&](int64_t row_begin, int64_t row_end) {
    std::vector<acc_t> buf(6 * kTile);
    acc_t *s = buf.data(), *q = s + kTile, *mx = q + kTile, *mn = mx + kTile, *pr = mn + kTile, *m = pr + kTile;
    std::vector<index_t> wbuf(2 * kTile);
    index_t *wmax = wbuf.data(), *wmin = wmax + kTile;
    for (int64_t row = row_begin; row < row_end; ++row) {
      const int64_t e0 = rowptr[row], e1 = rowptr[row + 1];
      scalar_t* out_row = out + row * K * F;
      if (e0 == e1) {
        std::fill(out_row, out_row + K * F, scalar_t(0));
        if (need_arg) {
          for (int64_t a = 0; a < num_arg; ++a) std::fill(arg + (a * num_rows + row) * F, arg + (a * num_rows + row + 1) * F, index_t(-1));
        }
        continue;
      }
      for (int64_t f0 = 0; f0 < F; f0 += kTile) {
        const int64_t nf = std::min(kTile, F - f0);
        for (int64_t e = e0; e < e1; ++e) {
          const acc_t w = weight ? acc_t(weight[e]) : acc_t(1);
          const scalar_t* xr = x + static_cast<int64_t>(col[e]) * F + f0;
#pragma omp simd
          for (int64_t f = 0; f < nf; ++f) m[f] = w * acc_t(xr[f]);
          const bool first = e == e0;  // the first edge initialises: no identity values needed
          const index_t pos = static_cast<index_t>(e);
          if (need.sum) {
            if (first) std::copy(m, m + nf, s);
            else {
#pragma omp simd
              for (int64_t f = 0; f < nf; ++f) s[f] += m[f];
            }
          }
          if (need.sq) {
#pragma omp simd
            for (int64_t f = 0; f < nf; ++f) q[f] = (first ? acc_t(0) : q[f]) + m[f] * m[f];
          }
          if (need.mul) {
#pragma omp simd
            for (int64_t f = 0; f < nf; ++f) pr[f] = (first ? acc_t(1) : pr[f]) * m[f];
          }
          if (need.max) {
            if (first) {
              std::copy(m, m + nf, mx);
              std::fill(wmax, wmax + nf, pos);
            } else {
#pragma omp simd
              for (int64_t f = 0; f < nf; ++f) {
                const bool take = Reducer<Reduce::Max>::wins(m[f], mx[f]);
                mx[f] = take ? m[f] : mx[f];
                wmax[f] = take ? pos : wmax[f];
              }
            }
          }
          if (need.min) {
            if (first) {
              std::copy(m, m + nf, mn);
              std::fill(wmin, wmin + nf, pos);
            } else {
#pragma omp simd
              for (int64_t f = 0; f < nf; ++f) {
                const bool take = Reducer<Reduce::Min>::wins(m[f], mn[f]);
                mn[f] = take ? m[f] : mn[f];
                wmin[f] = take ? pos : wmin[f];
              }
            }
          }
        }
        const acc_t inv_deg = acc_t(1) / acc_t(e1 - e0);
        for (int64_t k = 0; k < K; ++k) {
          scalar_t* o = out_row + k * F + f0;
          switch (codes[k]) {
            case reduce_code::kSum:
              for (int64_t f = 0; f < nf; ++f) o[f] = scalar_t(s[f]);
              break;
            case reduce_code::kMean:
              for (int64_t f = 0; f < nf; ++f) o[f] = scalar_t(s[f] * inv_deg);
              break;
            case reduce_code::kMax:
              for (int64_t f = 0; f < nf; ++f) o[f] = scalar_t(mx[f]);
              break;
            case reduce_code::kMin:
              for (int64_t f = 0; f < nf; ++f) o[f] = scalar_t(mn[f]);
              break;
            case reduce_code::kMul:
              for (int64_t f = 0; f < nf; ++f) o[f] = scalar_t(pr[f]);
              break;
            case reduce_code::kVar:
            case reduce_code::kStd:
              for (int64_t f = 0; f < nf; ++f) {
                const acc_t mean = s[f] * inv_deg;
                const acc_t var = q[f] * inv_deg - mean * mean;
                if (codes[k] == reduce_code::kVar) {
                  o[f] = scalar_t(var);
                } else {
                  const acc_t sd = std::sqrt(std::max(var, acc_t(1e-5)));
                  o[f] = scalar_t(sd <= std::sqrt(acc_t(1e-5)) ? acc_t(0) : sd);
                }
              }
              break;
          }
        }
        if (need_arg && need.max) std::copy(wmax, wmax + nf, arg + (max_slot * num_rows + row) * F + f0);
        if (need_arg && need.min) std::copy(wmin, wmin + nf, arg + (min_slot * num_rows + row) * F + f0);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> multi_aggregate_forward(const at::Tensor& x, const at::Tensor& rowptr,
                                                           const at::Tensor& col,
                                                           const c10::optional<at::Tensor>& weight,
                                                           const std::vector<int64_t>& codes, bool need_arg) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "multi_aggregate: x must be a contiguous 2-D tensor");
  TORCH_CHECK(rowptr.dim() == 1 && col.dim() == 1 && rowptr.is_contiguous() && col.is_contiguous() &&
                  rowptr.scalar_type() == col.scalar_type(),
              "multi_aggregate: rowptr and col must be contiguous 1-D tensors of one dtype");
  if (weight.has_value()) {
    TORCH_CHECK(weight->dim() == 1 && weight->is_contiguous() && weight->numel() == col.numel() &&
                    weight->scalar_type() == x.scalar_type(),
                "multi_aggregate: weight must be a contiguous [E] tensor with x's dtype");
  }
  TORCH_CHECK_VALUE(!codes.empty(), "multi_aggregate: at least one reduction is needed");
  const Needs need = needs_of(codes);
  const int64_t num_rows = rowptr.numel() - 1, F = x.size(1), K = static_cast<int64_t>(codes.size());
  const int64_t num_arg = need_arg ? (need.max ? 1 : 0) + (need.min ? 1 : 0) : 0;
  auto out = at::empty({num_rows, K * F}, x.options());
  auto arg = num_arg ? at::empty({num_arg, num_rows, F}, rowptr.options()) : at::empty({0, 0, 0}, rowptr.options());
  if (num_rows == 0 || F == 0) return {out, arg};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "multi_aggregate_forward", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "multi_aggregate_forward_index", [&] {
      multi_kernel<scalar_t, index_t>(x.data_ptr<scalar_t>(), rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(),
                                      weight.has_value() ? weight->data_ptr<scalar_t>() : nullptr, codes, need,
                                      num_arg > 0, out.data_ptr<scalar_t>(),
                                      num_arg ? arg.data_ptr<index_t>() : nullptr, num_rows, F);
    });
  });
  return {out, arg};
}

}  // namespace
}  // namespace gnnfuse

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("multi_aggregate_forward", &gnnfuse::multi_aggregate_forward);
}
