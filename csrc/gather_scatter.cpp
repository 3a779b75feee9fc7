// Fused gather-scatter on CPU: out[i] = REDUCE_{e in row i} w[e] * x[col[e]].
// Forward is parallel over CSR rows (targets), backward over rows of the transpose
// (sources): each output row is owned by one thread, so there are no atomics and the
// result does not depend on the thread count.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <limits>
#include <memory>

#include "arg_tiles.h"
#include "fast_call.h"
#include "output_cache.h"
#include "reducer.h"
#include "row_tiles.h"

namespace gnnfuse {
namespace {

// Features are processed in tiles so the accumulator stays in L1 for very wide rows.
constexpr int64_t kTile = 512;
// Source rows are random reads into x, so upcoming rows are prefetched. Narrow rows need a
// longer look-ahead to keep enough bytes in flight (measured on arxiv-like, 1 thread: no
// prefetch 68 ms, 4 ahead 25.5 ms, 16 ahead 20.3 ms at F=32; 16 ahead is best at F=128 too,
// within noise of 8).
template <typename scalar_t>
inline int64_t prefetch_distance(int64_t row_elems) {
  return row_elems * static_cast<int64_t>(sizeof(scalar_t)) <= 512 ? 16 : 8;
}

template <typename scalar_t>
inline void prefetch_row(const scalar_t* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(scalar_t));
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 1);
}

// Below this many bytes of gathered rows the sources stay in the caches between calls and the
// software prefetch only costs instructions (this VM, 1 thread, sum forward, kernel alone: Cora
// F=16 19.6 us without it against 23.4-25.0 us with it, F=32 26.7 against 30.8-32.7 us; Facebook
// F=64, 5.5 MB, 1.59 against 1.64 ms). Larger sources keep it (community-arxiv scrambled, 10 MB at
// F=16: 5.7 ms with it, 6.1 ms without).
constexpr int64_t kPrefetchMinSourceBytes = int64_t{8} << 20;
// The max/min forward with winners does more work per edge between its loads and gains from the
// prefetch once the sources outgrow the L2 cache (2 MiB a core here).
constexpr int64_t kArgPrefetchMinSourceBytes = int64_t{2} << 20;
constexpr int64_t kWinnerMaskMinFeatures = 32;  // the max/min backward's winner masks pay from this width

// Forward of one dtype whose accumulator is itself (float, double), without winner tracking:
// each row's features in register tiles, source rows prefetched across row boundaries (when
// ``prefetch``); on graphs of short rows the narrow tiles walk their edges in chunks (row_tiles.h).
template <typename T, typename index_t, typename Red, bool kScaled, typename ScaleFn>
void forward_rows_vectorised(const T* x, const index_t* rowptr, const index_t* col, const ScaleFn& scale, T* out,
                             int64_t num_rows, int64_t F, bool prefetch) {
  const int64_t ahead = prefetch_ahead(F * static_cast<int64_t>(sizeof(T)));
  const bool short_rows = num_rows > 0 && int64_t(rowptr[num_rows]) <= kShortRowEdges * num_rows;
  parallel_over_rows(rowptr, num_rows, F, [&](int64_t row_begin, int64_t row_end) {
    const int64_t prefetch_end = prefetch ? int64_t(rowptr[row_end]) : 0;  // 0: no edge is prefetched
    for (int64_t row = row_begin; row < row_end; ++row) {
      const int64_t e0 = rowptr[row], e1 = rowptr[row + 1];
      T* out_row = out + row * F;
      if (e0 == e1) {
        std::fill(out_row, out_row + F, T(0));
      } else {
        reduce_row<T, index_t, Red, kScaled>(x, F, col, e0, e1, scale, out_row, ahead, prefetch_end, short_rows);
      }
    }
  });
}

// TrackArg: max/min record the winning CSR position per (row, feature) for the backward;
// inference skips it and keeps the inner loop a plain vectorised max/min.
template <typename scalar_t, typename index_t, Reduce R, bool TrackArg>
void forward_kernel(const scalar_t* x, const index_t* rowptr, const index_t* col,
                    const scalar_t* weight, scalar_t* out, index_t* arg,
                    int64_t num_rows, int64_t F, int64_t num_src) {
  using acc_t = at::opmath_type<scalar_t>;
  using Red = Reducer<R>;
  static_assert(!TrackArg || Red::kTracksArg, "only max/min have a winner to track");
  if constexpr (!TrackArg && std::is_same_v<scalar_t, acc_t>) {  // float/double: register tiles
    const bool prefetch = num_src * F * int64_t(sizeof(scalar_t)) > kPrefetchMinSourceBytes;
    if (weight) {
      forward_rows_vectorised<scalar_t, index_t, Red, true>(x, rowptr, col, [weight](int64_t e) { return weight[e]; },
                                                            out, num_rows, F, prefetch);
    } else {
      forward_rows_vectorised<scalar_t, index_t, Red, false>(x, rowptr, col, Unscaled{}, out, num_rows, F, prefetch);
    }
    return;
  }
  if constexpr (TrackArg && std::is_same_v<scalar_t, acc_t>) {  // float/double: register tiles (arg_tiles.h)
    // sources past L2 are prefetched (Facebook F=64, 5.7 MB, 1 thread, variants interleaved on a
    // loaded machine: 6.6 ms without, 4.8 ms 16 edges ahead)
    const bool prefetch = num_src * F * int64_t(sizeof(scalar_t)) > kArgPrefetchMinSourceBytes;
    const int64_t ahead = prefetch_ahead(F * static_cast<int64_t>(sizeof(scalar_t)));
    auto rows = [&](const auto& scale, auto scaled_tag) {
      parallel_over_rows(rowptr, num_rows, F, [&](int64_t row_begin, int64_t row_end) {
        const int64_t prefetch_end = prefetch ? int64_t(rowptr[row_end]) : 0;
        for (int64_t row = row_begin; row < row_end; ++row) {
          const int64_t e0 = rowptr[row], e1 = rowptr[row + 1];
          if (e0 == e1) {  // empty row: 0 and no winner
            std::fill(out + row * F, out + (row + 1) * F, scalar_t(0));
            std::fill(arg + row * F, arg + (row + 1) * F, index_t(-1));
          } else {
            arg_row<scalar_t, index_t, Red, decltype(scaled_tag)::value>(x, F, col, e0, e1, scale, out + row * F,
                                                                         arg + row * F, ahead, prefetch_end);
          }
        }
      });
    };
    if (weight) rows([weight](int64_t e) { return weight[e]; }, std::true_type{});
    else rows(Unscaled{}, std::false_type{});
    return;
  }
  parallel_over_rows(rowptr, num_rows, F, [&](int64_t row_begin, int64_t row_end) {
    acc_t acc[kTile];
    index_t win[kTile];
    for (int64_t row = row_begin; row < row_end; ++row) {
      const int64_t e0 = rowptr[row], e1 = rowptr[row + 1];
      scalar_t* out_row = out + row * F;
      if (e0 == e1) {  // empty row: 0 (and no winner)
        std::fill(out_row, out_row + F, scalar_t(0));
        if constexpr (TrackArg) std::fill(arg + row * F, arg + (row + 1) * F, index_t(-1));
        continue;
      }
      for (int64_t f0 = 0; f0 < F; f0 += kTile) {
        const int64_t nf = std::min(kTile, F - f0);
        const int64_t ahead = prefetch_distance<scalar_t>(nf);
        {  // the first edge initialises, so no identity value (and no -inf special case) is needed
          const acc_t w = weight ? acc_t(weight[e0]) : acc_t(1);
          const scalar_t* xr = x + static_cast<int64_t>(col[e0]) * F + f0;
#pragma omp simd
          for (int64_t f = 0; f < nf; ++f) acc[f] = w * acc_t(xr[f]);
          if constexpr (TrackArg) std::fill(win, win + nf, index_t(e0));
        }
        for (int64_t e = e0 + 1; e < e1; ++e) {
          if (e + ahead < e1) prefetch_row(x + static_cast<int64_t>(col[e + ahead]) * F + f0, nf);
          const acc_t w = weight ? acc_t(weight[e]) : acc_t(1);
          const scalar_t* xr = x + static_cast<int64_t>(col[e]) * F + f0;
          if constexpr (TrackArg) {
            const index_t pos = static_cast<index_t>(e);
#pragma omp simd
            for (int64_t f = 0; f < nf; ++f) {
              const acc_t v = w * acc_t(xr[f]);
              const bool take = Red::wins(v, acc[f]);  // branch-free so the loop vectorises
              acc[f] = take ? v : acc[f];
              win[f] = take ? pos : win[f];
            }
          } else {
#pragma omp simd
            for (int64_t f = 0; f < nf; ++f) Red::update(acc[f], w * acc_t(xr[f]));
          }
        }
        for (int64_t f = 0; f < nf; ++f) out_row[f0 + f] = scalar_t(Red::finish(acc[f], e1 - e0));
        if constexpr (TrackArg) std::copy(win, win + nf, arg + row * F + f0);
      }
    }
  });
}

// For reduce="mul": per (row, feature) the product of the non-zero messages and the number
// of zero messages, so the backward can form exclusive products without dividing by zero.
template <typename scalar_t, typename index_t>
void mul_zero_stats(const scalar_t* x, const index_t* rowptr, const index_t* col,
                    const scalar_t* weight, at::opmath_type<scalar_t>* prod_nonzero,
                    int32_t* zero_count, int64_t num_rows, int64_t F) {
  using acc_t = at::opmath_type<scalar_t>;
  parallel_over_rows(rowptr, num_rows, F, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t row = row_begin; row < row_end; ++row) {
      acc_t* prod = prod_nonzero + row * F;
      int32_t* zeros = zero_count + row * F;
      std::fill(prod, prod + F, acc_t(1));
      std::fill(zeros, zeros + F, 0);
      for (int64_t e = rowptr[row]; e < rowptr[row + 1]; ++e) {
        const acc_t w = weight ? acc_t(weight[e]) : acc_t(1);
        const scalar_t* xr = x + static_cast<int64_t>(col[e]) * F;
        for (int64_t f = 0; f < F; ++f) {
          const acc_t m = w * acc_t(xr[f]);
          if (m == acc_t(0)) zeros[f] += 1; else prod[f] *= m;
        }
      }
    }
  });
}

// Backward over the transpose: for source row j and each edge e = (j -> i) at CSR position p,
// the gradient of the message m[e, f] = w[e] * x[j, f] is dm = grad_out[i, f] * dOut/dm, and
//   grad_x[j, f] += dm * w[e],   grad_w[p] = sum_f dm * x[j, f]   (only when NeedW).
// Each edge is visited once by the thread owning its source row: no atomics, no E x F buffer.
// `t_weight` (may be null) is weight[t_pos] laid out in transpose order, cached by the caller
// across calls: the x-gradient then reads each edge's weight next to its t_col entry instead of
// through t_pos (a dependent random read per edge). Same values, same results. (The caller passes
// it for sum/mean; max/min's winner tiles keep the lookup, they need t_pos for the winner test.)
template <typename scalar_t, typename index_t, Reduce R, bool NeedW>
void backward_kernel(const scalar_t* grad_out, const scalar_t* x, const index_t* rowptr,
                     const scalar_t* weight, const scalar_t* t_weight, const index_t* t_rowptr, const index_t* t_col,
                     const index_t* t_pos, const index_t* arg,
                     const at::opmath_type<scalar_t>* prod_nonzero, const int32_t* zero_count,
                     scalar_t* grad_x, scalar_t* grad_w, int64_t num_src, int64_t F, int64_t num_rows) {
  using acc_t = at::opmath_type<scalar_t>;
  if constexpr ((R == Reduce::Sum || R == Reduce::Mean) && !NeedW && std::is_same_v<scalar_t, acc_t>) {
    // grad_x[j] = sum over the transpose row j of grad_out[i] * w[e] (/ deg(i) for mean): the
    // forward's register-tiled row reduction over the transpose, with that per-edge scale.
    if (grad_x == nullptr) return;
    // mean: 1 / in-degree of each target, computed once here instead of a division per edge
    std::vector<acc_t> inv_degree(R == Reduce::Mean ? std::max<int64_t>(num_rows, 0) : 0);
    if constexpr (R == Reduce::Mean) {
      acc_t* inv = inv_degree.data();
#pragma omp simd
      for (int64_t i = 0; i < num_rows; ++i) inv[i] = acc_t(1) / acc_t(rowptr[i + 1] - rowptr[i]);
    }
    const acc_t* inv = inv_degree.data();
    // the sources here are grad_out's rows: prefetched under the forward's rule
    const bool prefetch = num_rows * F * int64_t(sizeof(scalar_t)) > kPrefetchMinSourceBytes;
    auto scaled_rows = [&](const auto& weight_at) {  // weight_at(q): the weight of transpose position q
      auto scale = [weight_at, t_col, inv](int64_t q) {
        const acc_t w = weight_at(q);
        return (R == Reduce::Mean) ? w * inv[t_col[q]] : w;
      };
      forward_rows_vectorised<scalar_t, index_t, Reducer<Reduce::Sum>, true>(grad_out, t_rowptr, t_col, scale,
                                                                             grad_x, num_src, F, prefetch);
    };
    if (t_weight) {
      scaled_rows([t_weight](int64_t q) { return acc_t(t_weight[q]); });
    } else if (weight) {
      scaled_rows([weight, t_pos](int64_t q) { return acc_t(weight[t_pos[q]]); });
    } else if (R == Reduce::Mean) {
      scaled_rows([](int64_t) { return acc_t(1); });
    } else {
      forward_rows_vectorised<scalar_t, index_t, Reducer<Reduce::Sum>, false>(grad_out, t_rowptr, t_col, Unscaled{},
                                                                              grad_x, num_src, F, prefetch);
    }
    return;
  }
  if constexpr ((R == Reduce::Max || R == Reduce::Min) && !NeedW && std::is_same_v<scalar_t, acc_t>) {
    // grad_x[j] = sum over the transpose row j of w * grad_out[i] where j's edge won: register tiles
    if (grad_x == nullptr) return;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<scalar_t, float>) {
      // the won lanes only, through per-edge winner masks (arg_tiles.h). Facebook, 1 thread, loaded
      // machine: F=64 10.8 -> 6.2 ms, F=128 17.5 -> 14.1 ms; at F=4 whole rows cost less (1.7 against
      // 2.7 ms), at F=20 the same.
      if (weight == nullptr && F >= kWinnerMaskMinFeatures) {
        const int64_t num_edges = rowptr[num_rows];
        std::unique_ptr<uint64_t[]> masks(new uint64_t[std::max<int64_t>(num_edges, 1)]);  // every edge written
        for (int64_t f0 = 0; f0 < F; f0 += 64) {
          const int64_t nb = std::min<int64_t>(64, F - f0);
          parallel_over_rows(rowptr, num_rows, nb, [&](int64_t row_begin, int64_t row_end) {
            for (int64_t i = row_begin; i < row_end; ++i) {
              if (rowptr[i] < rowptr[i + 1]) winner_masks_row(arg + i * F, f0, nb, rowptr[i], rowptr[i + 1], masks.get());
            }
          });
          parallel_over_rows(t_rowptr, num_src, nb, [&](int64_t src_begin, int64_t src_end) {
            for (int64_t j = src_begin; j < src_end; ++j) {
              winner_mask_grad_row(grad_out, masks.get(), t_col, t_pos, F, f0, nb, t_rowptr[j], t_rowptr[j + 1],
                                   grad_x + j * F);
            }
          });
        }
        return;
      }
    }
#endif
    parallel_over_rows(t_rowptr, num_src, F, [&](int64_t src_begin, int64_t src_end) {
      for (int64_t j = src_begin; j < src_end; ++j) {
        if (weight) {
          winner_grad_row<scalar_t, index_t, true>(grad_out, arg, weight, t_col, t_pos, F, t_rowptr[j],
                                                   t_rowptr[j + 1], grad_x + j * F);
        } else {
          winner_grad_row<scalar_t, index_t, false>(grad_out, arg, weight, t_col, t_pos, F, t_rowptr[j],
                                                    t_rowptr[j + 1], grad_x + j * F);
        }
      }
    });
    return;
  }
  // grad_w needs the whole row's dot product, so with NeedW the features are not tiled.
  const int64_t tile = NeedW ? F : std::min(kTile, F);
  parallel_over_rows(t_rowptr, num_src, F, [&](int64_t src_begin, int64_t src_end) {
    std::vector<acc_t> gx_buf(tile);
    acc_t* gx = gx_buf.data();
    for (int64_t j = src_begin; j < src_end; ++j) {
      const int64_t q0 = t_rowptr[j], q1 = t_rowptr[j + 1];
      for (int64_t f0 = 0; f0 < F; f0 += tile) {
        const int64_t nf = std::min(tile, F - f0);
        const int64_t ahead = prefetch_distance<scalar_t>(nf);
        std::fill(gx, gx + nf, acc_t(0));
        const scalar_t* xj = x + j * F + f0;
        for (int64_t q = q0; q < q1; ++q) {
          if (q + ahead < q1) prefetch_row(grad_out + static_cast<int64_t>(t_col[q + ahead]) * F + f0, nf);
          const int64_t i = t_col[q];
          const int64_t p = t_pos[q];
          const acc_t w = t_weight ? acc_t(t_weight[q]) : weight ? acc_t(weight[p]) : acc_t(1);
          const scalar_t* go = grad_out + i * F + f0;
          acc_t dot = 0;
          if constexpr (R == Reduce::Sum || R == Reduce::Mean) {
            const acc_t scale = (R == Reduce::Mean) ? acc_t(1) / acc_t(rowptr[i + 1] - rowptr[i]) : acc_t(1);
            const acc_t ws = w * scale;
            if constexpr (NeedW) {
#pragma omp simd reduction(+ : dot)
              for (int64_t f = 0; f < nf; ++f) {
                gx[f] += acc_t(go[f]) * ws;
                dot += acc_t(go[f]) * acc_t(xj[f]);
              }
              dot *= scale;
            } else {
#pragma omp simd
              for (int64_t f = 0; f < nf; ++f) gx[f] += acc_t(go[f]) * ws;
            }
          } else if constexpr (R == Reduce::Max || R == Reduce::Min) {
            const index_t* winner = arg + i * F + f0;
            const index_t pos = static_cast<index_t>(p);
#pragma omp simd reduction(+ : dot)
            for (int64_t f = 0; f < nf; ++f) {
              const acc_t dm = (winner[f] == pos) ? acc_t(go[f]) : acc_t(0);
              gx[f] += dm * w;
              if constexpr (NeedW) dot += dm * acc_t(xj[f]);
            }
          } else {  // Mul: dOut/dm = product of the row's other messages
            const acc_t* prod = prod_nonzero + i * F + f0;
            const int32_t* zeros = zero_count + i * F + f0;
            for (int64_t f = 0; f < nf; ++f) {
              const acc_t m = w * acc_t(xj[f]);
              acc_t others = 0;
              if (zeros[f] == 0) others = prod[f] / m;
              else if (zeros[f] == 1 && m == acc_t(0)) others = prod[f];
              const acc_t dm = acc_t(go[f]) * others;
              gx[f] += dm * w;
              if constexpr (NeedW) dot += dm * acc_t(xj[f]);
            }
          }
          if constexpr (NeedW) grad_w[p] = scalar_t(dot);
        }
        if (grad_x) {
          scalar_t* gxj = grad_x + j * F + f0;
          for (int64_t f = 0; f < nf; ++f) gxj[f] = scalar_t(gx[f]);
        }
      }
    }
  });
}

void check_csr_args(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
                    const c10::optional<at::Tensor>& weight) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "gather_scatter: x must be a contiguous 2-D tensor");
  TORCH_CHECK(rowptr.dim() == 1 && col.dim() == 1 && rowptr.is_contiguous() && col.is_contiguous(),
              "gather_scatter: rowptr and col must be contiguous 1-D tensors");
  TORCH_CHECK(rowptr.scalar_type() == col.scalar_type(), "gather_scatter: rowptr and col dtypes differ");
  if (weight.has_value()) {
    TORCH_CHECK(weight->dim() == 1 && weight->is_contiguous() && weight->numel() == col.numel() &&
                    weight->scalar_type() == x.scalar_type(),
                "gather_scatter: weight must be a contiguous [E] tensor with x's dtype");
  }
}

std::tuple<at::Tensor, at::Tensor> gather_scatter_forward(const at::Tensor& x, const at::Tensor& rowptr,
                                                          const at::Tensor& col,
                                                          const c10::optional<at::Tensor>& weight,
                                                          const std::string& reduce_name, bool need_arg) {
  check_csr_args(x, rowptr, col, weight);
  const Reduce reduce = parse_reduce(reduce_name);
  const int64_t num_rows = rowptr.numel() - 1, F = x.size(1);
  auto out = empty_output({num_rows, F}, x.options());
  const bool tracks_arg = need_arg && (reduce == Reduce::Max || reduce == Reduce::Min);
  auto arg = at::empty({tracks_arg ? num_rows : 0, tracks_arg ? F : 0}, rowptr.options());
  if (num_rows == 0 || F == 0) return {out, arg};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gather_scatter_forward", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gather_scatter_forward_index", [&] {
      dispatch_reduce(reduce, [&](auto rc) {
        constexpr Reduce R = decltype(rc)::value;
        auto run = [&](auto track) {
          forward_kernel<scalar_t, index_t, R, decltype(track)::value>(
              x.data_ptr<scalar_t>(), rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(),
              weight.has_value() ? weight->data_ptr<scalar_t>() : nullptr, out.data_ptr<scalar_t>(),
              tracks_arg ? arg.data_ptr<index_t>() : nullptr, num_rows, F, x.size(0));
        };
        if constexpr (Reducer<R>::kTracksArg) {
          if (tracks_arg) run(std::true_type{}); else run(std::false_type{});
        } else {
          run(std::false_type{});
        }
      });
    });
  });
  return {out, arg};
}

std::tuple<at::Tensor, at::Tensor> gather_scatter_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
    const c10::optional<at::Tensor>& weight, const at::Tensor& t_rowptr, const at::Tensor& t_col,
    const at::Tensor& t_pos, const at::Tensor& arg, const std::string& reduce_name, bool need_x_grad,
    bool need_weight_grad, const c10::optional<at::Tensor>& t_weight) {
  check_csr_args(x, rowptr, col, weight);
  if (t_weight.has_value()) {
    TORCH_CHECK(weight.has_value(), "gather_scatter_backward: t_weight given without weight");
    TORCH_CHECK(t_weight->dim() == 1 && t_weight->is_contiguous() && t_weight->numel() == col.numel() &&
                    t_weight->scalar_type() == x.scalar_type(),
                "gather_scatter_backward: t_weight must be a contiguous [E] tensor with x's dtype (weight[t_pos])");
  }
  TORCH_CHECK(grad_out.is_contiguous() && grad_out.size(0) == rowptr.numel() - 1 && grad_out.size(1) == x.size(1),
              "gather_scatter_backward: grad_out must be contiguous [num_rows, F]");
  TORCH_CHECK(t_rowptr.numel() - 1 <= x.size(0), "gather_scatter_backward: transpose has more rows than x");
  const Reduce reduce = parse_reduce(reduce_name);
  const int64_t num_rows = rowptr.numel() - 1, F = x.size(1), num_src = t_rowptr.numel() - 1;
  auto grad_x = need_x_grad ? empty_output(x.sizes(), x.options()) : at::empty({0}, x.options());
  // Sources past the transpose's last row have no edges: their gradient is 0.
  if (need_x_grad && x.size(0) > num_src) grad_x.narrow(0, num_src, x.size(0) - num_src).zero_();
  const bool need_w = need_weight_grad && weight.has_value();
  auto grad_w = need_w ? at::empty({col.numel()}, x.options()) : at::empty({0}, x.options());
  if (F == 0 || col.numel() == 0 || (!need_x_grad && !need_w)) {
    if (need_x_grad) grad_x.zero_();
    if (need_w) grad_w.zero_();
    return {grad_x, grad_w};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gather_scatter_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gather_scatter_backward_index", [&] {
      const scalar_t* w = weight.has_value() ? weight->data_ptr<scalar_t>() : nullptr;
      const scalar_t* w_t = t_weight.has_value() ? t_weight->data_ptr<scalar_t>() : nullptr;
      at::Tensor prod_nonzero, zero_count;
      if (reduce == Reduce::Mul) {
        prod_nonzero = at::empty({num_rows, F}, x.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
        zero_count = at::empty({num_rows, F}, x.options().dtype(at::kInt));
        mul_zero_stats<scalar_t, index_t>(x.data_ptr<scalar_t>(), rowptr.data_ptr<index_t>(),
                                          col.data_ptr<index_t>(), w, prod_nonzero.data_ptr<acc_t>(),
                                          zero_count.data_ptr<int32_t>(), num_rows, F);
      }
      dispatch_reduce(reduce, [&](auto rc) {
        auto run = [&](auto need_w_tag) {
        backward_kernel<scalar_t, index_t, decltype(rc)::value, decltype(need_w_tag)::value>(
            grad_out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), rowptr.data_ptr<index_t>(), w, w_t,
            t_rowptr.data_ptr<index_t>(), t_col.data_ptr<index_t>(), t_pos.data_ptr<index_t>(),
            arg.numel() ? arg.data_ptr<index_t>() : nullptr,
            prod_nonzero.defined() ? prod_nonzero.data_ptr<acc_t>() : nullptr,
            zero_count.defined() ? zero_count.data_ptr<int32_t>() : nullptr,
            need_x_grad ? grad_x.data_ptr<scalar_t>() : nullptr,
            need_w ? grad_w.data_ptr<scalar_t>() : nullptr, num_src, F, num_rows);
        };
        if (need_w) run(std::true_type{}); else run(std::false_type{});
      });
    });
  });
  return {grad_x, grad_w};
}

// The kernels of the registered ops, with their schemas' arguments (gnnfuse/ops/gather_scatter.py
// defines the schemas): the dispatcher calls them for CPU tensors without going back into Python,
// and the ops' eager route calls the same functions through fast_call.h's binding.
std::tuple<at::Tensor, at::Tensor> gather_scatter_op(const at::Tensor& x, const at::Tensor& rowptr,
                                                     const at::Tensor& col, const c10::optional<at::Tensor>& weight,
                                                     const c10::optional<at::Tensor>& t_rowptr,
                                                     const c10::optional<at::Tensor>& /*t_col*/,
                                                     const c10::optional<at::Tensor>& /*t_pos*/,
                                                     c10::string_view reduce) {
  // the transpose is passed exactly when gradients are wanted: only then are max/min winners kept
  return gather_scatter_forward(x, rowptr, col, weight, std::string(reduce), t_rowptr.has_value());
}

std::tuple<at::Tensor, at::Tensor> gather_scatter_backward_op(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
    const c10::optional<at::Tensor>& weight, const at::Tensor& t_rowptr, const at::Tensor& t_col,
    const at::Tensor& t_pos, const at::Tensor& arg, c10::string_view reduce, bool need_x_grad,
    bool need_weight_grad, const c10::optional<at::Tensor>& t_weight) {
  return gather_scatter_backward(grad_out, x, rowptr, col, weight, t_rowptr, t_col, t_pos, arg, std::string(reduce),
                                 need_x_grad, need_weight_grad, t_weight);
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnfuse, CPU, m) {
  m.impl("gather_scatter", &gather_scatter_op);
  m.impl("gather_scatter_backward", &gather_scatter_backward_op);
}

void register_gather_scatter(pybind11::module& m) {
  // the eager route's kernels: bound without pybind11's per-call argument machinery (fast_call.h);
  // a left-out trailing t_weight counts as None (callers from before it pass twelve arguments)
  m.add_object("gather_scatter", fast_function<&gather_scatter_op>("gather_scatter"));
  m.add_object("gather_scatter_backward", fast_function<&gather_scatter_backward_op>("gather_scatter_backward"));
  m.def("gather_scatter_forward", &gather_scatter_forward);  // the kernel alone (benchmarks)
  // the same kernels through pybind11, as the eager route called them before (bench_cpu_overhead's "before")
  m.def("gather_scatter_pybind", &gather_scatter_op);
  namespace py = pybind11;
  m.def("gather_scatter_backward_pybind", &gather_scatter_backward_op, py::arg("grad_out"), py::arg("x"),
        py::arg("rowptr"), py::arg("col"), py::arg("weight"), py::arg("t_rowptr"), py::arg("t_col"), py::arg("t_pos"),
        py::arg("arg"), py::arg("reduce"), py::arg("need_x_grad"), py::arg("need_weight_grad"),
        py::arg("t_weight") = py::none());
  m.def("output_cache_bytes", [] { return OutputCache::instance().cached_bytes(); });
  m.def("clear_output_cache", [] { OutputCache::instance().clear(); });
  m.def("output_cache_bypass", [](bool on) { return OutputCache::instance().set_bypass(on); });
}

}  // namespace gnnfuse
