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

// Forward of features [f0, f0 + NV * lanes) of one row with edges [e0, e1) (e1 > e0).
template <int NV, typename T, typename index_t, bool kMax, bool kScaled, typename ScaleFn>
inline void arg_row_tile(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, int64_t f0,
                         const ScaleFn& scale, T* out_row, index_t* arg_row) {
  constexpr int64_t L = kLanes<T>;
  using W = WinVec<T, index_t>;
  Vec64<T> acc[NV];
  W win[NV];
  {
    const T* xr = x + static_cast<int64_t>(col[e0]) * F + f0;
    const W first = W{} + static_cast<index_t>(e0);
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      acc[k] = scaled<kScaled, T>(load_vec(xr + k * L), scale, e0);
      win[k] = first;
    }
  }
  for (int64_t e = e0 + 1; e < e1; ++e) {
    const T* xr = x + static_cast<int64_t>(col[e]) * F + f0;
    const W pos = W{} + static_cast<index_t>(e);
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      const Vec64<T> v = scaled<kScaled, T>(load_vec(xr + k * L), scale, e);
      const auto take = (kMax ? (v > acc[k]) : (v < acc[k])) | (v != v);
      acc[k] = take ? v : acc[k];
      win[k] = __builtin_convertvector(take, W) ? pos : win[k];
    }
  }
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

// One row of the forward with winners: tiles of 4, 2, 1 vectors, then the scalar tail.
template <typename T, typename index_t, typename Red, bool kScaled, typename ScaleFn>
inline void arg_row(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, const ScaleFn& scale,
                    T* out_row, index_t* arg_row_out) {
  constexpr int64_t L = kLanes<T>;
  constexpr bool kMax = std::is_same_v<Red, Reducer<Reduce::Max>>;
  int64_t f0 = 0;
  for (; f0 + 4 * L <= F; f0 += 4 * L) {
    arg_row_tile<4, T, index_t, kMax, kScaled>(x, F, col, e0, e1, f0, scale, out_row, arg_row_out);
  }
  if (f0 + 2 * L <= F) {
    arg_row_tile<2, T, index_t, kMax, kScaled>(x, F, col, e0, e1, f0, scale, out_row, arg_row_out);
    f0 += 2 * L;
  }
  if (f0 + L <= F) {
    arg_row_tile<1, T, index_t, kMax, kScaled>(x, F, col, e0, e1, f0, scale, out_row, arg_row_out);
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

}  // namespace gnnfuse
