// Several reductions of the same messages in one pass (CPU): for every CSR row (target) i and
// every requested reduction k, out[i, k*F:(k+1)*F] = REDUCE_k{e in row i} w[e] * x[col[e]].
// Each source row is read from memory once per edge; the per-reduction updates then run over the
// row while it is in L1. Rows are owned by one thread (parallel_over_rows): no atomics, and the
// result does not depend on the thread count. Codes are those of reduce_codes.h.
//
// Forward: sum, sum of squares, max and min (with the winning CSR position when `need_arg`) are
// kept together in one vectorised loop per edge (cheap next to reading the row); the product only
// for "mul".
// var = mean(m^2) - mean(m)^2 (biased, as PyG's VarAggregation); std = sqrt(max(var, 1e-5)),
// set to 0 where that is <= sqrt(1e-5) (PyG's StdAggregation). Empty rows give 0 everywhere.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include <vector>

#include "checks.h"
#include "fast_call.h"
#include "multi_tiles.h"
#include "output_cache.h"
#include "reduce_codes.h"
#include "reducer.h"
#include "row_tiles.h"

namespace gnnfuse {
namespace {

constexpr int64_t kTile = 256;  // features per tile: the statistics of 256 features stay in L1

struct Needs {
  bool sum = false, sq = false, max = false, min = false, mul = false;
};

// PyG's StdAggregation: sqrt(max(var, 1e-5)), and 0 where that is <= sqrt(1e-5).
template <typename T>
inline T std_of(T var) {
  const T sd = std::sqrt(std::max(var, T(1e-5)));
  return sd <= std::sqrt(T(1e-5)) ? T(0) : sd;
}

// std_of over n values in place. A scalar sqrt per element cost more than the whole statistics
// pass over a short-row graph (GCC does not vectorise sqrt under errno semantics), so with AVX the
// square roots go 8 (float) or 4 (double) at a time; the arguments are >= 1e-5 (or NaN).
template <typename T>
void std_in_place(T* v, int64_t n) {
  int64_t f = 0;
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float>) {
    const __m256 floor = _mm256_set1_ps(1e-5f), cut = _mm256_set1_ps(std::sqrt(1e-5f)), zero = _mm256_setzero_ps();
    for (; f + 8 <= n; f += 8) {
      const __m256 x = _mm256_loadu_ps(v + f);
      const __m256 sd = _mm256_sqrt_ps(_mm256_blendv_ps(x, floor, _mm256_cmp_ps(x, floor, _CMP_LT_OQ)));
      _mm256_storeu_ps(v + f, _mm256_blendv_ps(sd, zero, _mm256_cmp_ps(sd, cut, _CMP_LE_OQ)));
    }
  } else if constexpr (std::is_same_v<T, double>) {
    const __m256d floor = _mm256_set1_pd(1e-5), cut = _mm256_set1_pd(std::sqrt(1e-5)), zero = _mm256_setzero_pd();
    for (; f + 4 <= n; f += 4) {
      const __m256d x = _mm256_loadu_pd(v + f);
      const __m256d sd = _mm256_sqrt_pd(_mm256_blendv_pd(x, floor, _mm256_cmp_pd(x, floor, _CMP_LT_OQ)));
      _mm256_storeu_pd(v + f, _mm256_blendv_pd(sd, zero, _mm256_cmp_pd(sd, cut, _CMP_LE_OQ)));
    }
  }
#endif
  for (; f < n; ++f) v[f] = std_of(v[f]);
}

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

// One row's statistics over features [f0, f0 + nf), nf <= W: sum, and when asked sum of squares (Sq)
// and max/min (Ext, + the winners when Track) in one loop per edge. With nf == W (a compile-time
// width) the accumulators live in registers across the row's edges; the first edge initialises
// them. Statistics nobody asked for are not computed: on short rows (Cora: ~4 edges) this loop is
// compute-bound, and each unused statistic cost as much as the sum.
template <int64_t W, typename scalar_t, typename index_t, bool Track, bool Sq, bool Ext>
inline void row_stats(const scalar_t* x, const index_t* col, const scalar_t* weight, int64_t e0, int64_t e1,
                      int64_t f0, int64_t nf, int64_t F, int64_t ahead, int64_t prefetch_end,
                      at::opmath_type<scalar_t>* s_out, at::opmath_type<scalar_t>* q_out,
                      at::opmath_type<scalar_t>* mx_out, at::opmath_type<scalar_t>* mn_out, index_t* wmax_out,
                      index_t* wmin_out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n = W > 0 ? W : nf;
  acc_t s[W > 0 ? W : kTile], q[W > 0 ? W : kTile], mx[W > 0 ? W : kTile], mn[W > 0 ? W : kTile];
  index_t wmax[W > 0 ? W : kTile], wmin[W > 0 ? W : kTile];
  {
    const acc_t w = weight ? acc_t(weight[e0]) : acc_t(1);
    const scalar_t* xr = x + static_cast<int64_t>(col[e0]) * F + f0;
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) {
      const acc_t v = w * acc_t(xr[f]);
      s[f] = v;
      if constexpr (Sq) q[f] = v * v;
      if constexpr (Ext) {
        mx[f] = v;
        mn[f] = v;
      }
      if constexpr (Track && Ext) {
        wmax[f] = static_cast<index_t>(e0);
        wmin[f] = static_cast<index_t>(e0);
      }
    }
  }
  for (int64_t e = e0 + 1; e < e1; ++e) {
    if (e + ahead < prefetch_end) prefetch_bytes(x + static_cast<int64_t>(col[e + ahead]) * F + f0,
                                                 n * static_cast<int64_t>(sizeof(scalar_t)));
    const acc_t w = weight ? acc_t(weight[e]) : acc_t(1);
    const scalar_t* xr = x + static_cast<int64_t>(col[e]) * F + f0;
    const index_t pos = static_cast<index_t>(e);
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) {
      const acc_t v = w * acc_t(xr[f]);
      s[f] += v;
      if constexpr (Sq) q[f] += v * v;
      if constexpr (Ext) {
        const bool up = Reducer<Reduce::Max>::wins(v, mx[f]);
        const bool down = Reducer<Reduce::Min>::wins(v, mn[f]);
        mx[f] = up ? v : mx[f];
        mn[f] = down ? v : mn[f];
        if constexpr (Track) {
          wmax[f] = up ? pos : wmax[f];
          wmin[f] = down ? pos : wmin[f];
        }
      }
    }
  }
  std::copy(s, s + n, s_out);
  if constexpr (Sq) std::copy(q, q + n, q_out);
  if constexpr (Ext) {
    std::copy(mx, mx + n, mx_out);
    std::copy(mn, mn + n, mn_out);
  }
  if constexpr (Track && Ext) {
    std::copy(wmax, wmax + n, wmax_out);
    std::copy(wmin, wmin + n, wmin_out);
  }
}

template <typename scalar_t, typename index_t, bool Track, bool Sq, bool Ext>
void multi_kernel(const scalar_t* x, const index_t* rowptr, const index_t* col, const scalar_t* weight,
                  const std::vector<int64_t>& codes, const Needs need, scalar_t* out, index_t* arg,
                  int64_t num_rows, int64_t F) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int64_t W = 128 / static_cast<int64_t>(sizeof(acc_t));  // two 64-byte vectors per statistic
  const int64_t K = static_cast<int64_t>(codes.size());
  // arg layout: [A, num_rows, F], max first
  const int64_t min_slot = need.max ? 1 : 0;
  const int64_t ahead = prefetch_ahead(F * static_cast<int64_t>(sizeof(scalar_t)));
  parallel_over_rows(rowptr, num_rows, F, [&](int64_t row_begin, int64_t row_end) {
    std::vector<acc_t> buf(5 * kTile);
    acc_t *s = buf.data(), *q = s + kTile, *mx = q + kTile, *mn = mx + kTile, *pr = mn + kTile;
    std::vector<index_t> wbuf(2 * kTile);
    index_t *wmax = wbuf.data(), *wmin = wmax + kTile;
    const int64_t prefetch_end = rowptr[row_end];
    for (int64_t row = row_begin; row < row_end; ++row) {
      const int64_t e0 = rowptr[row], e1 = rowptr[row + 1];
      scalar_t* out_row = out + row * K * F;
      if (e0 == e1) {
        std::fill(out_row, out_row + K * F, scalar_t(0));
        if constexpr (Track) {
          if (need.max) std::fill(arg + row * F, arg + (row + 1) * F, index_t(-1));
          if (need.min) std::fill(arg + (min_slot * num_rows + row) * F, arg + (min_slot * num_rows + row + 1) * F,
                                  index_t(-1));
        }
        continue;
      }
      for (int64_t f0 = 0; f0 < F; f0 += kTile) {
        const int64_t nf = std::min(kTile, F - f0);
        for (int64_t t = 0; t < nf; t += W) {
          const int64_t nt = std::min(W, nf - t);
          if (nt == W) {
            row_stats<W, scalar_t, index_t, Track, Sq, Ext>(x, col, weight, e0, e1, f0 + t, W, F, ahead, prefetch_end, s + t,
                                                   q + t, mx + t, mn + t, wmax + t, wmin + t);
          } else {
            row_stats<0, scalar_t, index_t, Track, Sq, Ext>(x, col, weight, e0, e1, f0 + t, nt, F, ahead, prefetch_end, s + t,
                                                   q + t, mx + t, mn + t, wmax + t, wmin + t);
          }
        }
        if (need.mul) {
          std::fill(pr, pr + nf, acc_t(1));
          for (int64_t e = e0; e < e1; ++e) {
            const acc_t w = weight ? acc_t(weight[e]) : acc_t(1);
            const scalar_t* xr = x + static_cast<int64_t>(col[e]) * F + f0;
#pragma omp simd
            for (int64_t f = 0; f < nf; ++f) pr[f] *= w * acc_t(xr[f]);
          }
        }
        const acc_t inv_deg = acc_t(1) / acc_t(e1 - e0);
        for (int64_t k = 0; k < K; ++k) {
          scalar_t* o = out_row + k * F + f0;
          if (need.mul && (codes[k] == reduce_code::kVar || codes[k] == reduce_code::kStd)) {
            for (int64_t f = 0; f < nf; ++f) {  // pr holds the product: a scalar loop of its own
              const acc_t mean = s[f] * inv_deg;
              const acc_t var = q[f] * inv_deg - mean * mean;
              o[f] = scalar_t(codes[k] == reduce_code::kVar ? var : std_of(var));
            }
            continue;
          }
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
#pragma omp simd
              for (int64_t f = 0; f < nf; ++f) {
                const acc_t mean = s[f] * inv_deg;
                pr[f] = q[f] * inv_deg - mean * mean;  // (pr is free unless "mul", handled above)
              }
              if (codes[k] == reduce_code::kStd) std_in_place(pr, nf);
              for (int64_t f = 0; f < nf; ++f) o[f] = scalar_t(pr[f]);
              break;
          }
        }
        if constexpr (Track) {
          if (need.max) std::copy(wmax, wmax + nf, arg + row * F + f0);
          if (need.min) std::copy(wmin, wmin + nf, arg + (min_slot * num_rows + row) * F + f0);
        }
      }
    }
  });
}

// Below this many bytes of gathered source rows they stay in the caches between calls and software
// prefetching only costs instructions: the sum kernel's threshold (csrc/gather_scatter.cpp).
constexpr int64_t kPrefetchMinSourceBytes = int64_t{8} << 20;
// The forward keeps four statistics per vector (more work per edge between its loads than the sum),
// and gains from the prefetch once the sources outgrow the L2 cache (2 MiB a core here), as the
// max/min forward with winners does. Facebook F=64 (5.5 MB of sources), 1 thread, mean/min/max/std,
// kernel alone, thread CPU time, variants interleaved on a loaded machine (fastest of 15-31): 3.3-6.5 ms
// without, 2.6-4.0 ms with; with winners 4.9-6.3 ms without, 3.7-4.6 ms with. Cora (0.7 MB): none.
constexpr int64_t kStatsPrefetchMinSourceBytes = int64_t{2} << 20;

// Forward of float/double without "mul": every statistic in registers (multi_tiles.h). S: the
// statistics kept (multi::kLin | kSq | kExt | kTrack).
template <int S, typename T, typename index_t>
void multi_kernel_tiled(const T* x, const index_t* rowptr, const index_t* col, const T* weight,
                        const std::vector<int64_t>& codes, const Needs need, T* out, index_t* arg, int64_t num_rows,
                        int64_t F, int64_t num_src) {
  const std::vector<int> codes32(codes.begin(), codes.end());
  const int K = static_cast<int>(codes.size());
  const int64_t min_slot = need.max ? 1 : 0;  // arg layout: [A, num_rows, F], max first
  const bool prefetch = num_src * F * static_cast<int64_t>(sizeof(T)) > kStatsPrefetchMinSourceBytes;
  const int64_t ahead = prefetch_ahead(F * static_cast<int64_t>(sizeof(T)));
  const bool stream = multi::should_stream(out, arg, num_rows, K, F);
  auto rows = [&](const auto& scale, auto scaled_tag) {
    constexpr bool kScaled = decltype(scaled_tag)::value;
    parallel_over_rows(rowptr, num_rows, K * F, [&](int64_t row_begin, int64_t row_end) {
      const int64_t prefetch_end = prefetch ? static_cast<int64_t>(rowptr[row_end]) : 0;
      for (int64_t row = row_begin; row < row_end; ++row) {
        const int64_t e0 = rowptr[row], e1 = rowptr[row + 1];
        T* out_row = out + row * K * F;
        index_t* arg_max = (S & multi::kTrack) && need.max ? arg + row * F : nullptr;
        index_t* arg_min = (S & multi::kTrack) && need.min ? arg + (min_slot * num_rows + row) * F : nullptr;
        if (e0 == e1) {  // empty row: 0 everywhere, no winner
          std::fill(out_row, out_row + K * F, T(0));
          if (arg_max) std::fill(arg_max, arg_max + F, index_t(-1));
          if (arg_min) std::fill(arg_min, arg_min + F, index_t(-1));
          continue;
        }
        const multi::Outputs<index_t> outs{codes32.data(), K, arg_max, arg_min, stream};
        multi::stats_row<S, T, index_t, kScaled>(x, F, col, e0, e1, scale, out_row, outs, ahead, prefetch_end);
      }
      if (stream) multi::stream_fence();  // this thread's streamed stores, visible before the join
    });
  };
  if (weight) rows([weight](int64_t e) { return weight[e]; }, std::true_type{});
  else rows(Unscaled{}, std::false_type{});
}

// Calls fn(std::integral_constant<int, S>{}) for the statistics set S that `need` (and tracking) asks.
template <typename Fn>
void dispatch_stats(const Needs need, bool track, Fn&& fn) {
  using namespace multi;
  const bool ext = need.max || need.min;
  const int s = (need.sum ? kLin : 0) | (need.sq ? kSq : 0) | (ext ? kExt : 0) | (ext && track ? kTrack : 0);
  switch (s) {
    case kLin: return fn(std::integral_constant<int, kLin>{});
    case kLin | kSq: return fn(std::integral_constant<int, kLin | kSq>{});
    case kExt: return fn(std::integral_constant<int, kExt>{});
    case kExt | kTrack: return fn(std::integral_constant<int, kExt | kTrack>{});
    case kLin | kExt: return fn(std::integral_constant<int, kLin | kExt>{});
    case kLin | kExt | kTrack: return fn(std::integral_constant<int, kLin | kExt | kTrack>{});
    case kLin | kSq | kExt: return fn(std::integral_constant<int, kLin | kSq | kExt>{});
    default: return fn(std::integral_constant<int, kLin | kSq | kExt | kTrack>{});
  }
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
  // (large outputs reuse the buffers of dead ones: no page faults on every training step)
  auto out = empty_output({num_rows, K * F}, x.options());
  auto arg = num_arg ? empty_output({num_arg, num_rows, F}, rowptr.options()) : at::empty({0, 0, 0}, rowptr.options());
  if (num_rows == 0 || F == 0) return {out, arg};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "multi_aggregate_forward", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "multi_aggregate_forward_index", [&] {
      auto run = [&](auto track, auto sq, auto ext) {
        multi_kernel<scalar_t, index_t, decltype(track)::value, decltype(sq)::value, decltype(ext)::value>(
            x.data_ptr<scalar_t>(), rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(),
            weight.has_value() ? weight->data_ptr<scalar_t>() : nullptr, codes, need, out.data_ptr<scalar_t>(),
            num_arg ? arg.data_ptr<index_t>() : nullptr, num_rows, F);
      };
      if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>) {
        if (!need.mul) {
          dispatch_stats(need, num_arg > 0, [&](auto stats) {
            multi_kernel_tiled<decltype(stats)::value, scalar_t, index_t>(
                x.data_ptr<scalar_t>(), rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(),
                weight.has_value() ? weight->data_ptr<scalar_t>() : nullptr, codes, need, out.data_ptr<scalar_t>(),
                num_arg ? arg.data_ptr<index_t>() : nullptr, num_rows, F, x.size(0));
          });
          return;
        }
      }
      const bool ext = need.max || need.min;
      if (num_arg) {  // (winners are tracked only for max/min)
        if (need.sq) run(std::true_type{}, std::true_type{}, std::true_type{});
        else run(std::true_type{}, std::false_type{}, std::true_type{});
      } else if (need.sq) {
        if (ext) run(std::false_type{}, std::true_type{}, std::true_type{});
        else run(std::false_type{}, std::true_type{}, std::false_type{});
      } else {
        if (ext) run(std::false_type{}, std::false_type{}, std::true_type{});
        else run(std::false_type{}, std::false_type{}, std::false_type{});
      }
    });
  });
  return {out, arg};
}


// Backward in one pass over the transpose. The gradient of message m = w[e] x[j] (edge e = j -> i,
// CSR position p) is
//   dm = c[i] + d[i] m + [winner of max] g_max[i] + [winner of min] g_min[i] + g_mul[i] prod_{others}
// where sum/mean/var/std give the per-target terms (c, d: d var / d m = 2 (m - mean) / deg, and
// d std = d var / (2 std) where std > 0). A first pass over target rows forms c, d (and the row
// products for mul); the second walks source rows: grad_x[j] = sum_e w dm, grad_w[p] = <dm, x[j]>
// for every term but max/min's, which a third pass over the [N, F] winners adds.
template <typename scalar_t, typename index_t>
void multi_backward_kernel(const scalar_t* grad_out, const scalar_t* x, const scalar_t* out, const index_t* rowptr,
                           const index_t* col, const scalar_t* weight, const index_t* t_rowptr,
                           const index_t* t_col, const index_t* t_pos, const index_t* arg,
                           const std::vector<int64_t>& codes, const Needs need, scalar_t* grad_x, scalar_t* grad_w,
                           int64_t num_rows, int64_t num_src, int64_t F) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t K = static_cast<int64_t>(codes.size());
  auto find = [&](int64_t code) {
    for (int64_t k = 0; k < K; ++k) if (codes[k] == code) return k;
    return int64_t(-1);
  };
  const int64_t k_max = find(reduce_code::kMax), k_min = find(reduce_code::kMin), k_mul = find(reduce_code::kMul);
  const int64_t k_mean = find(reduce_code::kMean);
  const bool linear = need.sum, quadratic = need.sq;
  const int64_t min_slot = need.max ? 1 : 0;
  std::vector<acc_t> c(linear ? num_rows * F : 0), d(quadratic ? num_rows * F : 0);
  std::vector<acc_t> prod(need.mul ? num_rows * F : 0);
  std::vector<int32_t> zeros(need.mul ? num_rows * F : 0);
  parallel_over_rows(rowptr, num_rows, F, [&](int64_t row_begin, int64_t row_end) {
    std::vector<acc_t> mean_buf(quadratic && k_mean < 0 ? F : 0);
    for (int64_t i = row_begin; i < row_end; ++i) {
      const int64_t e0 = rowptr[i], e1 = rowptr[i + 1];
      const acc_t inv = acc_t(1) / acc_t(std::max<int64_t>(e1 - e0, 1));
      const scalar_t* g = grad_out + i * K * F;
      const scalar_t* o = out + i * K * F;
      if (need.mul) {
        acc_t* pr = prod.data() + i * F;
        int32_t* z = zeros.data() + i * F;
        std::fill(pr, pr + F, acc_t(1));
        std::fill(z, z + F, 0);
        for (int64_t e = e0; e < e1; ++e) {
          const acc_t w = weight ? acc_t(weight[e]) : acc_t(1);
          const scalar_t* xr = x + static_cast<int64_t>(col[e]) * F;
          for (int64_t f = 0; f < F; ++f) {
            const acc_t m = w * acc_t(xr[f]);
            if (m == acc_t(0)) z[f] += 1; else pr[f] *= m;
          }
        }
      }
      if (!linear) continue;
      const acc_t* mean = nullptr;
      if (quadratic) {
        if (k_mean >= 0) {
          mean_buf.resize(F);
          for (int64_t f = 0; f < F; ++f) mean_buf[f] = acc_t(o[k_mean * F + f]);
        } else {  // the mean of the messages is not among the outputs: one pass over the row
          std::fill(mean_buf.begin(), mean_buf.end(), acc_t(0));
          for (int64_t e = e0; e < e1; ++e) {
            const acc_t w = weight ? acc_t(weight[e]) : acc_t(1);
            const scalar_t* xr = x + static_cast<int64_t>(col[e]) * F;
            for (int64_t f = 0; f < F; ++f) mean_buf[f] += w * acc_t(xr[f]) * inv;
          }
        }
        mean = mean_buf.data();
      }
      acc_t* ci = c.data() + i * F;
      acc_t* di = quadratic ? d.data() + i * F : nullptr;
      std::fill(ci, ci + F, acc_t(0));
      if (di) std::fill(di, di + F, acc_t(0));
      for (int64_t k = 0; k < K; ++k) {
        const scalar_t* gk = g + k * F;
        const scalar_t* ok = o + k * F;
        switch (codes[k]) {
          case reduce_code::kSum:
            for (int64_t f = 0; f < F; ++f) ci[f] += acc_t(gk[f]);
            break;
          case reduce_code::kMean:
            for (int64_t f = 0; f < F; ++f) ci[f] += acc_t(gk[f]) * inv;
            break;
          case reduce_code::kVar:
          case reduce_code::kStd:
            for (int64_t f = 0; f < F; ++f) {
              acc_t gv = acc_t(gk[f]);
              if (codes[k] == reduce_code::kStd) gv = acc_t(ok[f]) > acc_t(0) ? gv / (acc_t(2) * acc_t(ok[f])) : acc_t(0);
              ci[f] -= acc_t(2) * gv * mean[f] * inv;
              di[f] += acc_t(2) * gv * inv;
            }
            break;
          default:
            break;
        }
      }
    }
  });
  const bool need_w = grad_w != nullptr;
  parallel_over_rows(t_rowptr, num_src, F, [&](int64_t src_begin, int64_t src_end) {
    std::vector<acc_t> gx_buf(F), dm_buf(F);
    acc_t* gx = gx_buf.data();
    acc_t* dm = dm_buf.data();
    for (int64_t j = src_begin; j < src_end; ++j) {
      std::fill(gx, gx + F, acc_t(0));
      const scalar_t* xj = x + j * F;
      for (int64_t q = t_rowptr[j]; q < t_rowptr[j + 1]; ++q) {
        const int64_t i = t_col[q];
        const int64_t p = t_pos[q];
        const acc_t w = weight ? acc_t(weight[p]) : acc_t(1);
        const scalar_t* g = grad_out + i * K * F;
        // one simple loop per term, each vectorised
        if (linear) {
          const acc_t* ci = c.data() + i * F;
#pragma omp simd
          for (int64_t f = 0; f < F; ++f) dm[f] = ci[f];
        } else {
          std::fill(dm, dm + F, acc_t(0));
        }
        if (quadratic) {
          const acc_t* di = d.data() + i * F;
#pragma omp simd
          for (int64_t f = 0; f < F; ++f) dm[f] += di[f] * w * acc_t(xj[f]);
        }
        if (k_mul >= 0) {
          const acc_t* pr = prod.data() + i * F;
          const int32_t* z = zeros.data() + i * F;
          const scalar_t* gk = g + k_mul * F;
          for (int64_t f = 0; f < F; ++f) {
            const acc_t m = w * acc_t(xj[f]);
            const acc_t others = z[f] == 0 ? pr[f] / m : (z[f] == 1 && m == acc_t(0) ? pr[f] : acc_t(0));
            dm[f] += acc_t(gk[f]) * others;
          }
        }
        acc_t dot = 0;
        if (need_w) {
#pragma omp simd reduction(+ : dot)
          for (int64_t f = 0; f < F; ++f) {
            gx[f] += dm[f] * w;
            dot += dm[f] * acc_t(xj[f]);
          }
          grad_w[p] = scalar_t(dot);
        } else {
#pragma omp simd
          for (int64_t f = 0; f < F; ++f) gx[f] += dm[f] * w;
        }
      }
      if (grad_x) {
        for (int64_t f = 0; f < F; ++f) grad_x[j * F + f] = scalar_t(gx[f]);
      }
    }
  });
  // max/min: each (target, feature) sends its gradient to its one winner. Walking the transpose for
  // this read the targets' winners and gradients once per edge (4 extra [F] rows per edge: the
  // backward cost 13x the forward on a power-law graph); going over the [N, F] winners reads them
  // once. Targets in ascending order, so the additions into a source row come in a fixed order for
  // any thread count. Threads split the features (grad_x only), or it runs serially when w's
  // gradient (a sum over features) is wanted.
  const int64_t k_win[2] = {k_max, k_min};
  const int64_t slot_of[2] = {0, min_slot};
  auto winners = [&](int64_t f0, int64_t f1) {
    for (int s = 0; s < 2; ++s) {
      if (k_win[s] < 0) continue;
      for (int64_t i = 0; i < num_rows; ++i) {
        const index_t* win = arg + (slot_of[s] * num_rows + i) * F;
        const scalar_t* gk = grad_out + i * K * F + k_win[s] * F;
        for (int64_t f = f0; f < f1; ++f) {
          const int64_t p = win[f];
          if (p < 0) continue;  // an empty row
          const int64_t j = col[p];
          const acc_t g = acc_t(gk[f]);
          if (grad_x) grad_x[j * F + f] = scalar_t(acc_t(grad_x[j * F + f]) + g * (weight ? acc_t(weight[p]) : acc_t(1)));
          if (need_w) grad_w[p] = scalar_t(acc_t(grad_w[p]) + g * acc_t(x[j * F + f]));
        }
      }
    }
  };
  if (k_max >= 0 || k_min >= 0) {
    if (need_w) winners(0, F);
    else at::parallel_for(0, F, 1, winners);
  }
}

// Backward of x alone for float/double without "mul" (the training path of PNA-style layers), in
// three vectorised steps:
//   1. per target row i: the coefficients of dm = c[i] + d[i] m (see multi_backward_kernel) into
//      coef, rows of [c | d] (2F) or [c] (F);
//   2. per source row j: grad_x[j] = sum_e w c[i] + x[j] sum_e w^2 d[i] over its transpose row, in
//      register tiles (multi_tiles.h): one contiguous coefficient row read per edge, where the
//      one-pass kernel read c, d and built each edge's dm in memory;
//   3. max/min: each (target, feature) adds its gradient into its winner's source row, max then
//      min per target, targets in ascending order, threads splitting the features: the additions
//      into an element come in one fixed order for any thread count.
// grad_out's rows are g_stride apart: K*F, or 0 for one row broadcast over all targets (the gradient
// of out.sum() or out.mean(), read in place instead of a [N, K*F] copy).
template <typename T, typename index_t>
void multi_backward_x(const T* grad_out, const T* x, const T* out, const index_t* rowptr, const index_t* col,
                      const T* weight, const index_t* t_rowptr, const index_t* t_col, const index_t* t_pos,
                      const index_t* arg, const std::vector<int64_t>& codes, const Needs need, T* grad_x,
                      int64_t num_rows, int64_t num_src, int64_t num_x_rows, int64_t F, int64_t g_stride) {
  const int64_t K = static_cast<int64_t>(codes.size());
  auto find = [&](int64_t code) {
    for (int64_t k = 0; k < K; ++k) if (codes[k] == code) return k;
    return int64_t(-1);
  };
  const int64_t k_max = find(reduce_code::kMax), k_min = find(reduce_code::kMin);
  const int64_t k_mean = find(reduce_code::kMean), k_sum = find(reduce_code::kSum);
  const bool linear = need.sum, quadratic = need.sq;
  const int64_t W = quadratic ? 2 : 1;  // coefficient row width in units of F
  if (linear) {
    std::unique_ptr<T[]> coef_buf(new T[num_rows * W * F]);  // (rows of empty targets are never read)
    T* coef = coef_buf.get();
    parallel_over_rows(rowptr, num_rows, K * F, [&](int64_t row_begin, int64_t row_end) {
      const bool mean_from_edges = quadratic && k_mean < 0 && k_sum < 0;
      std::vector<T> mean_buf(mean_from_edges ? F : 0);
      const int mean_code = reduce_code::kMean;
      const multi::Outputs<index_t> mean_out{&mean_code, 1, nullptr, nullptr};
      for (int64_t i = row_begin; i < row_end; ++i) {
        const int64_t e0 = rowptr[i], e1 = rowptr[i + 1];
        if (e0 == e1) continue;
        const T inv = T(1) / static_cast<T>(e1 - e0);
        const T* g = grad_out + i * g_stride;
        const T* o = out + i * K * F;
        T* ci = coef + i * W * F;
        T* di = ci + F;
        const T* mean = nullptr;
        T mean_scale = T(1);
        if (quadratic) {
          if (k_mean >= 0) {
            mean = o + k_mean * F;
          } else if (k_sum >= 0) {
            mean = o + k_sum * F;
            mean_scale = inv;
          } else {  // the mean is not among the outputs: one register-tiled pass over the row
            if (weight) {
              multi::stats_row<multi::kLin, T, index_t, true>(x, F, col, e0, e1, [weight](int64_t e) { return weight[e]; },
                                                             mean_buf.data(), mean_out, 0, 0);
            } else {
              multi::stats_row<multi::kLin, T, index_t, false>(x, F, col, e0, e1, Unscaled{}, mean_buf.data(), mean_out,
                                                              0, 0);
            }
            mean = mean_buf.data();
          }
        }
        std::fill(ci, ci + W * F, T(0));
        for (int64_t k = 0; k < K; ++k) {
          const T* gk = g + k * F;
          const T* ok = o + k * F;
          switch (codes[k]) {
            case reduce_code::kSum:
#pragma omp simd
              for (int64_t f = 0; f < F; ++f) ci[f] += gk[f];
              break;
            case reduce_code::kMean:
#pragma omp simd
              for (int64_t f = 0; f < F; ++f) ci[f] += gk[f] * inv;
              break;
            case reduce_code::kVar:
#pragma omp simd
              for (int64_t f = 0; f < F; ++f) {  // d var / d m = 2 (m - mean) / deg
                ci[f] -= T(2) * gk[f] * (mean[f] * mean_scale) * inv;
                di[f] += T(2) * gk[f] * inv;
              }
              break;
            case reduce_code::kStd:
#pragma omp simd
              for (int64_t f = 0; f < F; ++f) {  // d std = d var / (2 std) where std > 0
                const T gv = ok[f] > T(0) ? gk[f] / (T(2) * ok[f]) : T(0);
                ci[f] -= T(2) * gv * (mean[f] * mean_scale) * inv;
                di[f] += T(2) * gv * inv;
              }
              break;
            default:
              break;
          }
        }
      }
    });
    const bool prefetch = num_rows * W * F * static_cast<int64_t>(sizeof(T)) > kPrefetchMinSourceBytes;
    const int64_t ahead = prefetch_ahead(W * F * static_cast<int64_t>(sizeof(T)));
    parallel_over_rows(t_rowptr, num_src, W * F, [&](int64_t src_begin, int64_t src_end) {
      const int64_t prefetch_end = prefetch ? static_cast<int64_t>(t_rowptr[src_end]) : 0;
      for (int64_t j = src_begin; j < src_end; ++j) {
        const int64_t q0 = t_rowptr[j], q1 = t_rowptr[j + 1];
        T* gx = grad_x + j * F;
        if (q0 == q1) {
          std::fill(gx, gx + F, T(0));
        } else if (quadratic) {
          if (weight) multi::linear_grad_row<true, true>(coef, x + j * F, weight, t_col, t_pos, F, q0, q1, gx, ahead, prefetch_end);
          else multi::linear_grad_row<true, false>(coef, x + j * F, weight, t_col, t_pos, F, q0, q1, gx, ahead, prefetch_end);
        } else {
          if (weight) multi::linear_grad_row<false, true>(coef, x + j * F, weight, t_col, t_pos, F, q0, q1, gx, ahead, prefetch_end);
          else multi::linear_grad_row<false, false>(coef, x + j * F, weight, t_col, t_pos, F, q0, q1, gx, ahead, prefetch_end);
        }
      }
    });
    std::fill(grad_x + num_src * F, grad_x + num_x_rows * F, T(0));  // sources without edges
  } else {
    std::fill(grad_x, grad_x + num_x_rows * F, T(0));
  }
  if (k_max < 0 && k_min < 0) return;
  const int64_t min_slot = need.max ? 1 : 0;
  const index_t* win_max = k_max >= 0 ? arg : nullptr;
  const index_t* win_min = k_min >= 0 ? arg + min_slot * num_rows * F : nullptr;
  // A row's winners in a vector of L features are at most its degree distinct edges: a row of at most
  // L edges adds each edge's gradient into the lanes that edge won, one vector read-modify-write of
  // the edge's source row per edge, instead of one scalar read-modify-write per feature (1 thread,
  // min+max backward: Cora 313 -> 244 us; Facebook, 15 edges a row, unchanged within noise). Lanes an
  // edge did not win are written back unchanged, and each
  // (source, feature) still receives its additions in the same order (targets ascending, max then
  // min): the results are the scalar loop's, bitwise. Longer rows (and the tail) go one feature at a time.
  constexpr int64_t L = kLanes<T>;
  using V = Vec64<T>;
  using Winners = WinVec<T, index_t>;
  using M = decltype(V{} < V{});  // the lane mask type of a comparison
  // Past the L2 the read-modify-writes wait on memory: before row i, the source rows of the first L
  // edges of row i + kAheadRows are prefetched for writing (the slice's lines; a longer row's winners
  // are among its edges, not necessarily those). 1 thread, thread CPU time, min+max backward, load 5-6,
  // interleaved, medians: power-law 60K/1.2M 26.6 -> 20.3-20.7 ms (2-8 rows ahead), all four
  // 56.5 -> 51.0 ms; Facebook min+max 7.8 -> 6.7 ms, all four 18.7 -> 18.1 ms (fastest runs within noise).
  constexpr int64_t kAheadRows = 4;
  const bool prefetch = num_x_rows * F * static_cast<int64_t>(sizeof(T)) > kStatsPrefetchMinSourceBytes;
  auto scatter = [&](int64_t f0, int64_t f1) {
    for (int64_t i = 0; i < num_rows; ++i) {
      const int64_t e0 = rowptr[i], e1 = rowptr[i + 1];
      if (prefetch && i + kAheadRows < num_rows) {
        const int64_t a0 = rowptr[i + kAheadRows];
        const int64_t a1 = std::min<int64_t>(rowptr[i + kAheadRows + 1], a0 + L);
        for (int64_t p = a0; p < a1; ++p) {
          const T* dst = grad_x + static_cast<int64_t>(col[p]) * F;
          for (int64_t f = f0; f < f1; f += L) __builtin_prefetch(dst + f, 1, 3);
        }
      }
      if (e0 == e1) continue;  // an empty row: no winner
      const T* g = grad_out + i * g_stride;
      for (int s = 0; s < 2; ++s) {
        const index_t* win = (s == 0 ? win_max : win_min);
        if (win == nullptr) continue;
        win += i * F;
        const T* gk = g + (s == 0 ? k_max : k_min) * F;
        int64_t f = f0;
        if (e1 - e0 <= L) {
          for (; f + L <= f1; f += L) {
            const Winners won_by = load_any<Winners>(win + f);
            const V gv = load_vec(gk + f);
            for (int64_t p = e0; p < e1; ++p) {
              const M won = __builtin_convertvector(won_by == (Winners{} + static_cast<index_t>(p)), M);
              T* dst = grad_x + static_cast<int64_t>(col[p]) * F + f;
              const V add = weight ? gv * weight[p] : gv;
              const V cur = load_vec(dst);
              store_vec(dst, won ? cur + add : cur);
            }
          }
        }
        for (; f < f1; ++f) {
          const int64_t p = win[f];
          const T w = weight ? weight[p] : T(1);
          grad_x[static_cast<int64_t>(col[p]) * F + f] += gk[f] * w;
        }
      }
    }
  };
  // threads take whole vectors of features (at least 64 bytes each: no shared cache line)
  const int64_t slices = (F + L - 1) / L;
  if (num_rows * F < (int64_t{1} << 16) || slices == 1) {
    scatter(0, F);
  } else {
    at::parallel_for(0, slices, 1, [&](int64_t s0, int64_t s1) { scatter(s0 * L, std::min(F, s1 * L)); });
  }
}

std::tuple<at::Tensor, at::Tensor> multi_aggregate_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& out, const at::Tensor& rowptr,
    const at::Tensor& col, const c10::optional<at::Tensor>& weight, const at::Tensor& t_rowptr,
    const at::Tensor& t_col, const at::Tensor& t_pos, const at::Tensor& arg, const std::vector<int64_t>& codes,
    bool need_x_grad, bool need_weight_grad) {
  // grad_out: contiguous, or one contiguous row broadcast over the targets (stride 0)
  const bool broadcast_rows = !grad_out.is_contiguous() && grad_out.dim() == 2 && grad_out.stride(0) == 0 &&
                              (grad_out.stride(1) == 1 || grad_out.size(1) <= 1);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (grad_out.is_contiguous() || broadcast_rows) &&
                  out.is_contiguous() && grad_out.sizes() == out.sizes(),
              "multi_aggregate_backward: x and out must be contiguous, grad_out shaped like out (contiguous, or one "
              "row expanded over the rows)");
  const Needs need = needs_of(codes);
  const int64_t num_rows = rowptr.numel() - 1, F = x.size(1), num_src = t_rowptr.numel() - 1;
  TORCH_CHECK(num_src <= x.size(0), "multi_aggregate_backward: transpose has more rows than x");
  TORCH_CHECK(!(need.max || need.min) || arg.dim() == 3, "multi_aggregate_backward: max/min need their winners");
  const bool need_w = need_weight_grad && weight.has_value();
  const bool fast = need_x_grad && !need_w && !need.mul &&
                    (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
  auto grad_x = need_x_grad ? (fast ? at::empty_like(x) : at::zeros_like(x)) : at::empty({0}, x.options());
  auto grad_w = need_w ? at::zeros({col.numel()}, x.options()) : at::empty({0}, x.options());
  if (F == 0 || col.numel() == 0 || (!need_x_grad && !need_w)) {
    if (need_x_grad) grad_x.zero_();
    return {grad_x, grad_w};
  }
  if (fast) {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "multi_aggregate_backward_x", [&] {
      AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "multi_aggregate_backward_x_index", [&] {
        multi_backward_x<scalar_t, index_t>(
            grad_out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
            rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(),
            weight.has_value() ? weight->data_ptr<scalar_t>() : nullptr, t_rowptr.data_ptr<index_t>(),
            t_col.data_ptr<index_t>(), t_pos.data_ptr<index_t>(), arg.numel() ? arg.data_ptr<index_t>() : nullptr,
            codes, need, grad_x.data_ptr<scalar_t>(), num_rows, num_src, x.size(0), F,
            broadcast_rows ? 0 : grad_out.size(1));
      });
    });
    return {grad_x, grad_w};
  }
  const at::Tensor g = grad_out.contiguous();  // (this path reads rows of a contiguous grad_out only)
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "multi_aggregate_backward", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "multi_aggregate_backward_index", [&] {
      multi_backward_kernel<scalar_t, index_t>(
          g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
          rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(),
          weight.has_value() ? weight->data_ptr<scalar_t>() : nullptr, t_rowptr.data_ptr<index_t>(),
          t_col.data_ptr<index_t>(), t_pos.data_ptr<index_t>(), arg.numel() ? arg.data_ptr<index_t>() : nullptr,
          codes, need, need_x_grad ? grad_x.data_ptr<scalar_t>() : nullptr,
          need_w ? grad_w.data_ptr<scalar_t>() : nullptr, num_rows, num_src, F);
    });
  });
  return {grad_x, grad_w};
}

// A control for benchmarks (benchmarks/bench_multi_cpu.py): the forward's output stores alone. Fills
// out [N, W] (float, W a multiple of 16) with ones, rows split over threads as the forward splits
// them and stored as it stores them (streamed exactly where it would stream an output of that size):
// with W = K*F against W = F it gives what writing the wider output costs by itself, the floor of a
// pass of K reductions next to one sum pass where the stores, not the gathers, bound the time.
void output_writes_only(at::Tensor& out, const at::Tensor& rowptr) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.scalar_type() == at::kFloat && out.size(1) % 16 == 0 &&
                  rowptr.scalar_type() == at::kInt && rowptr.numel() == out.size(0) + 1,
              "output_writes_only: out must be a contiguous float [N, W] (W a multiple of 16), rowptr int32 [N + 1]");
  float* o = out.data_ptr<float>();
  const int32_t* rp = rowptr.data_ptr<int32_t>();
  const int64_t N = out.size(0), W = out.size(1);
  const bool stream = multi::should_stream(o, static_cast<const int32_t*>(nullptr), N, 1, W);
  parallel_over_rows(rp, N, W, [&](int64_t row_begin, int64_t row_end) {
    const Vec64<float> ones = Vec64<float>{} + 1.0f;
    for (int64_t row = row_begin; row < row_end; ++row) {
      for (int64_t f = 0; f < W; f += 16) {
        if (stream) multi::stream_vec(o + row * W + f, ones);
        else store_vec(o + row * W + f, ones);
      }
    }
    if (stream) multi::stream_fence();
  });
}

// The reductions of the op's `aggrs` argument: canonical names joined by "," (gnnfuse/ops/multi_aggregate.py
// resolves aliases), as codes.
std::vector<int64_t> codes_of(c10::string_view aggrs) {
  static constexpr const char* kNames[] = {"sum", "mean", "max", "min", "mul", "var", "std"};  // by code
  std::vector<int64_t> codes;
  size_t start = 0;
  while (start <= aggrs.size()) {
    const size_t end = std::min(aggrs.find(',', start), aggrs.size());
    const c10::string_view name = aggrs.substr(start, end - start);
    int64_t code = -1;
    for (int64_t c = 0; c < 7; ++c) {
      if (name == kNames[c]) code = c;
    }
    TORCH_CHECK_VALUE(code >= 0, "multi_aggregate: unknown reduction '", std::string(name), "' in aggrs '",
                      std::string(aggrs), "'");
    codes.push_back(code);
    start = end + 1;
  }
  return codes;
}

// The kernels of the registered ops, with their schemas' arguments (gnnfuse/ops/multi_aggregate.py
// defines the schemas): the dispatcher calls them for CPU tensors without going back into Python,
// and the ops' eager route calls the same functions through fast_call.h's binding.
std::tuple<at::Tensor, at::Tensor> multi_aggregate_op(const at::Tensor& x, const at::Tensor& rowptr,
                                                      const at::Tensor& col, const c10::optional<at::Tensor>& weight,
                                                      const c10::optional<at::Tensor>& t_rowptr,
                                                      const c10::optional<at::Tensor>& /*t_col*/,
                                                      const c10::optional<at::Tensor>& /*t_pos*/,
                                                      c10::string_view aggrs) {
  // the transpose is passed exactly when gradients are wanted: only then are max/min winners kept
  return multi_aggregate_forward(x, rowptr, col, weight, codes_of(aggrs), t_rowptr.has_value());
}

std::tuple<at::Tensor, at::Tensor> multi_aggregate_backward_op(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& out, const at::Tensor& rowptr,
    const at::Tensor& col, const c10::optional<at::Tensor>& weight, const at::Tensor& t_rowptr,
    const at::Tensor& t_col, const at::Tensor& t_pos, const at::Tensor& arg, c10::string_view aggrs,
    bool need_x_grad, bool need_weight_grad) {
  return multi_aggregate_backward(grad_out, x, out, rowptr, col, weight, t_rowptr, t_col, t_pos, arg,
                                  codes_of(aggrs), need_x_grad, need_weight_grad);
}

}  // namespace
}  // namespace gnnfuse

TORCH_LIBRARY_IMPL(gnnfuse, CPU, m) {
  m.impl("multi_aggregate", &gnnfuse::multi_aggregate_op);
  m.impl("multi_aggregate_backward", &gnnfuse::multi_aggregate_backward_op);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using gnnfuse::fast_function;
  // the eager route's kernels: bound without pybind11's per-call argument machinery (fast_call.h)
  m.add_object("multi_aggregate", fast_function<&gnnfuse::multi_aggregate_op>("multi_aggregate"));
  m.add_object("multi_aggregate_backward",
               fast_function<&gnnfuse::multi_aggregate_backward_op>("multi_aggregate_backward"));
  // the kernels alone, taking codes (benchmarks)
  m.def("multi_aggregate_forward", &gnnfuse::multi_aggregate_forward);
  m.def("multi_aggregate_backward_codes", &gnnfuse::multi_aggregate_backward);
  m.def("output_writes_only", &gnnfuse::output_writes_only);
}
