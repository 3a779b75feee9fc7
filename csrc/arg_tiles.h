// Register-resident row kernels of max/min with winners (the training path of max/min):
//   forward:  out[row, f] = max/min over the row's edges of m(e) * x[col[e], f], and arg[row, f] =
//             the CSR position of the winner (strictly better replaces: ties keep the first edge; a
//             NaN message replaces and a NaN is never replaced, exactly as Reducer::wins);
//   backward: grad_x[j, f] = sum over the transpose row j (edges e = (j -> i) at CSR position p) of
//             w[e] * grad_out[i, f] where arg[i, f] == p, else + 0, in the transpose's order.
// The features of a row are processed in tiles of NV 64-byte vectors whose accumulators (and
// winners) stay in registers over the row's edges; the tail narrower than a vector runs one
// scalar at a time. Results and winners are those of the one-element-at-a-time loop, bitwise.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "row_tiles.h"

namespace gnnfuse {

// A vector of winner positions with one lane per Vec64<T> lane (spelled per type pair: GCC drops
// vector_size on dependent types).
template <typename T, typename I>
struct WinVecOf;
template <>
struct WinVecOf<float, int32_t> {
  typedef int32_t type __attribute__((vector_size(64)));
};
template <>
struct WinVecOf<float, int64_t> {
  typedef int64_t type __attribute__((vector_size(128)));
};
template <>
struct WinVecOf<double, int32_t> {
  typedef int32_t type __attribute__((vector_size(32)));
};
template <>
struct WinVecOf<double, int64_t> {
  typedef int64_t type __attribute__((vector_size(64)));
};
template <typename T, typename I>
using WinVec = typename WinVecOf<T, I>::type;

template <typename V, typename S>
inline V load_any(const S* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename V, typename S>
inline void store_any(S* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

// Forward of features [f0, f0 + NV * lanes) of one row with edges [e0, e1) (e1 > e0). While
// prefetch_end > 0, the start of the source row `ahead` edges further on (below prefetch_end) is
// prefetched, as in row_tiles.h's reduce_row_tile.
template <int NV, typename T, typename index_t, bool kMax, bool kScaled, typename ScaleFn>
inline void arg_row_tile(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, int64_t f0,
                         const ScaleFn& scale, T* out_row, index_t* arg_row, int64_t ahead = 0,
                         int64_t prefetch_end = 0) {
  constexpr int64_t L = kLanes<T>;
  constexpr int kLines = NV < kPrefetchLines ? NV : kPrefetchLines;
  using W = WinVec<T, index_t>;
  Vec64<T> acc[NV];
  W win[NV];
  if (e0 + ahead < prefetch_end) prefetch_lines<kLines>(x + static_cast<int64_t>(col[e0 + ahead]) * F);
  {
    const T* xr = x + static_cast<int64_t>(col[e0]) * F + f0;
    const W first = W{} + static_cast<index_t>(e0);
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      acc[k] = scaled<kScaled, T>(load_vec(xr + k * L), scale, e0);
      win[k] = first;
    }
  }
  auto fold = [&](int64_t e) {
    const T* xr = x + static_cast<int64_t>(col[e]) * F + f0;
    const W pos = W{} + static_cast<index_t>(e);
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      const Vec64<T> v = scaled<kScaled, T>(load_vec(xr + k * L), scale, e);
      const auto take = (kMax ? (v > acc[k]) : (v < acc[k])) | (v != v);
      acc[k] = take ? v : acc[k];
      win[k] = __builtin_convertvector(take, W) ? pos : win[k];
    }
  };
  fold_rest_prefetched<kLines>(x, col, F, e0, e1, ahead, prefetch_end, fold);
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) {
    store_vec(out_row + f0 + k * L, acc[k]);
    store_any(arg_row + f0 + k * L, win[k]);
  }
}

// Forward of the features [f0, F) narrower than a vector, one scalar at a time.
template <typename T, typename index_t, typename Red, bool kScaled, typename ScaleFn>
inline void arg_row_scalar(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, int64_t f0,
                           const ScaleFn& scale, T* out_row, index_t* arg_row) {
  T acc[kLanes<T>];
  index_t win[kLanes<T>];
  const int64_t nf = F - f0;
  for (int64_t e = e0; e < e1; ++e) {
    const T* xr = x + static_cast<int64_t>(col[e]) * F + f0;
    const T s = kScaled ? static_cast<T>(scale(e)) : T(1);
    for (int64_t f = 0; f < nf; ++f) {
      const T v = kScaled ? xr[f] * s : xr[f];
      if (e == e0 || Red::wins(v, acc[f])) {
        acc[f] = v;
        win[f] = static_cast<index_t>(e);
      }
    }
  }
  for (int64_t f = 0; f < nf; ++f) {
    out_row[f0 + f] = acc[f];
    arg_row[f0 + f] = win[f];
  }
}

// One row of the forward with winners: tiles of 4, 2, 1 vectors, then the scalar tail. Only the
// first tile prefetches (prefetch_end > 0: see arg_row_tile); later tiles re-read the row's sources
// while they are in L1/L2.
template <typename T, typename index_t, typename Red, bool kScaled, typename ScaleFn>
inline void arg_row(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, const ScaleFn& scale,
                    T* out_row, index_t* arg_row_out, int64_t ahead = 0, int64_t prefetch_end = 0) {
  constexpr int64_t L = kLanes<T>;
  constexpr bool kMax = std::is_same_v<Red, Reducer<Reduce::Max>>;
  int64_t f0 = 0;
  for (; f0 + 4 * L <= F; f0 += 4 * L) {
    arg_row_tile<4, T, index_t, kMax, kScaled>(x, F, col, e0, e1, f0, scale, out_row, arg_row_out, ahead,
                                               prefetch_end);
    prefetch_end = 0;
  }
  if (f0 + 2 * L <= F) {
    arg_row_tile<2, T, index_t, kMax, kScaled>(x, F, col, e0, e1, f0, scale, out_row, arg_row_out, ahead,
                                               prefetch_end);
    f0 += 2 * L;
    prefetch_end = 0;
  }
  if (f0 + L <= F) {
    arg_row_tile<1, T, index_t, kMax, kScaled>(x, F, col, e0, e1, f0, scale, out_row, arg_row_out, ahead,
                                               prefetch_end);
    f0 += L;
  }
  if (f0 < F) arg_row_scalar<T, index_t, Red, kScaled>(x, F, col, e0, e1, f0, scale, out_row, arg_row_out);
}

// Backward of features [f0, f0 + NV * lanes) of source row j, transpose edges [q0, q1).
template <int NV, typename T, typename index_t, bool kScaled>
inline void winner_grad_tile(const T* grad_out, const index_t* arg, const T* weight, const index_t* t_col,
                             const index_t* t_pos, int64_t F, int64_t q0, int64_t q1, int64_t f0, T* gx_row) {
  constexpr int64_t L = kLanes<T>;
  using W = WinVec<T, index_t>;
  using M = decltype(Vec64<T>{} < Vec64<T>{});  // the lane mask type of a comparison
  Vec64<T> gx[NV];
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) gx[k] = Vec64<T>{};
  for (int64_t q = q0; q < q1; ++q) {
    const int64_t i = t_col[q];
    const index_t p = t_pos[q];
    const W pos = W{} + p;
    const T* go = grad_out + i * F + f0;
    const index_t* winner = arg + i * F + f0;
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      const M won = __builtin_convertvector(load_any<W>(winner + k * L) == pos, M);
      const Vec64<T> dm = won ? load_vec(go + k * L) : Vec64<T>{};
      if constexpr (kScaled) {
        gx[k] += dm * weight[p];
      } else {
        gx[k] += dm;
      }
    }
  }
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) store_vec(gx_row + f0 + k * L, gx[k]);
}

template <typename T, typename index_t, bool kScaled>
inline void winner_grad_scalar(const T* grad_out, const index_t* arg, const T* weight, const index_t* t_col,
                               const index_t* t_pos, int64_t F, int64_t q0, int64_t q1, int64_t f0, T* gx_row) {
  T gx[kLanes<T>] = {};
  const int64_t nf = F - f0;
  for (int64_t q = q0; q < q1; ++q) {
    const int64_t i = t_col[q];
    const index_t p = t_pos[q];
    const T w = kScaled ? weight[p] : T(1);
    for (int64_t f = 0; f < nf; ++f) {
      const T dm = arg[i * F + f0 + f] == p ? grad_out[i * F + f0 + f] : T(0);
      gx[f] += dm * w;
    }
  }
  for (int64_t f = 0; f < nf; ++f) gx_row[f0 + f] = gx[f];
}

// grad_x of one source row j for max/min (no weight gradient): tiles of 4, 2, 1 vectors, tail.
template <typename T, typename index_t, bool kScaled>
inline void winner_grad_row(const T* grad_out, const index_t* arg, const T* weight, const index_t* t_col,
                            const index_t* t_pos, int64_t F, int64_t q0, int64_t q1, T* gx_row) {
  constexpr int64_t L = kLanes<T>;
  int64_t f0 = 0;
  for (; f0 + 4 * L <= F; f0 += 4 * L) {
    winner_grad_tile<4, T, index_t, kScaled>(grad_out, arg, weight, t_col, t_pos, F, q0, q1, f0, gx_row);
  }
  if (f0 + 2 * L <= F) {
    winner_grad_tile<2, T, index_t, kScaled>(grad_out, arg, weight, t_col, t_pos, F, q0, q1, f0, gx_row);
    f0 += 2 * L;
  }
  if (f0 + L <= F) {
    winner_grad_tile<1, T, index_t, kScaled>(grad_out, arg, weight, t_col, t_pos, F, q0, q1, f0, gx_row);
    f0 += L;
  }
  if (f0 < F) winner_grad_scalar<T, index_t, kScaled>(grad_out, arg, weight, t_col, t_pos, F, q0, q1, f0, gx_row);
}

#if defined(__AVX512F__)
// Backward of max/min without edge weights, float values (AVX-512): the same sums as
// winner_grad_row, bitwise, with less memory traffic. Features go in blocks of up to 64:
//   1. over the CSR rows (targets i): masks[p] = the bit set of block features that edge p won,
//      from arg[i, block] (held in registers while the row's edges are compared with it);
//   2. over the transpose rows (sources j): each edge's mask is read, an edge that won nothing is
//      skipped, and the others add grad_out[i, f] on their won lanes only (masked loads: the chunks
//      of 16 features the edge did not win are not read).
// winner_grad_row reads a whole row of arg and of grad_out for every edge, won or not. Both add
// grad_out[i, f] for every won lane in the transpose's order (ascending target) and +0 for the
// others; a sum that starts at +0 never becomes -0, so the skipped +0 terms change nothing. (With
// weights, 0 * w is NaN for an infinite w: those keep winner_grad_row.) Scratch: 8 bytes an edge.

// The block's winner masks of one CSR row (edges [e0, e1), e1 > e0), bit f - f0 for feature f.
template <typename index_t>
inline void winner_masks_row(const index_t* arg_row, int64_t f0, int64_t nb, int64_t e0, int64_t e1,
                             uint64_t* masks) {
  if constexpr (sizeof(index_t) == 4) {
    __m512i w[4];
    __mmask16 live[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const int64_t rest = nb - 16 * k;
      live[k] = rest >= 16 ? __mmask16(0xffff) : rest > 0 ? __mmask16((1u << rest) - 1) : __mmask16(0);
      w[k] = _mm512_maskz_loadu_epi32(live[k], arg_row + f0 + 16 * k);
    }
    for (int64_t e = e0; e < e1; ++e) {
      const __m512i pos = _mm512_set1_epi32(static_cast<int32_t>(e));
      uint64_t m = 0;
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) m |= uint64_t(_mm512_mask_cmpeq_epi32_mask(live[k], w[k], pos)) << (16 * k);
      masks[e] = m;
    }
  } else {
    __m512i w[8];
    __mmask8 live[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const int64_t rest = nb - 8 * k;
      live[k] = rest >= 8 ? __mmask8(0xff) : rest > 0 ? __mmask8((1u << rest) - 1) : __mmask8(0);
      w[k] = _mm512_maskz_loadu_epi64(live[k], arg_row + f0 + 8 * k);
    }
    for (int64_t e = e0; e < e1; ++e) {
      const __m512i pos = _mm512_set1_epi64(static_cast<int64_t>(e));
      uint64_t m = 0;
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) m |= uint64_t(_mm512_mask_cmpeq_epi64_mask(live[k], w[k], pos)) << (8 * k);
      masks[e] = m;
    }
  }
}

// grad_x[j, f0 : f0 + nb] of one source row j: transpose edges [q0, q1), their masks looked up by CSR position.
template <typename index_t>
inline void winner_mask_grad_row(const float* grad_out, const uint64_t* masks, const index_t* t_col,
                                 const index_t* t_pos, int64_t F, int64_t f0, int64_t nb, int64_t q0, int64_t q1,
                                 float* gx_row) {
  __m512 gx[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t q = q0; q < q1; ++q) {
    const uint64_t m = masks[t_pos[q]];
    if (m == 0) continue;
    const float* go = grad_out + static_cast<int64_t>(t_col[q]) * F + f0;
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      gx[k] = _mm512_add_ps(gx[k], _mm512_maskz_loadu_ps(static_cast<__mmask16>(m >> (16 * k)), go + 16 * k));
    }
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const int64_t rest = nb - 16 * k;
    if (rest <= 0) break;
    _mm512_mask_storeu_ps(gx_row + f0 + 16 * k, rest >= 16 ? __mmask16(0xffff) : __mmask16((1u << rest) - 1), gx[k]);
  }
}
#endif

}  // namespace gnnfuse
