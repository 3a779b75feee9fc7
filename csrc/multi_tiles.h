// Register tiles of the one-pass multi-statistic kernels (csrc/multi_aggregate.cpp), float and double.
//
// Forward: one row's features in tiles of NV 64-byte vectors; every statistic the request needs
// (sum, sum of squares, max and min, the winners of max/min as int32 offsets into the row) is a
// vector value, so all of them stay in registers over the row's edges and each source vector is
// loaded once per edge. Max/min are compare + blend on the whole vector (one NaN test shared by
// both), no branch per element. The tile then writes every requested output (sum, mean, max,
// min, var, std) straight from its registers (with non-temporal stores when the output is far larger
// than the caches: Outputs::stream). The feature tail narrower than a vector is one
// masked vector (AVX-512; scalars elsewhere). Every element is folded in CSR order, one edge after
// another: results and winners do not depend on the thread count, and are those of the
// one-element-at-a-time loop (ties keep the first edge; a NaN message replaces, a NaN is never
// replaced, as Reducer::wins).
//
// Backward (the linear part): grad_x[j] = sum_e w c[i] + x[j] sum_e w^2 d[i] over the transpose row
// j (edges e = j -> i) with per-target coefficient rows c, d stored side by side ([N, 2F]): two
// accumulators per vector in registers, one contiguous coefficient row read per edge.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "arg_tiles.h"
#include "reduce_codes.h"
#include "row_tiles.h"

namespace gnnfuse {
namespace multi {

// The statistics a forward tile keeps (template bit set).
constexpr int kLin = 1;    // sum (sum, mean, var, std)
constexpr int kSq = 2;     // sum of squares (var, std)
constexpr int kExt = 4;    // max and min
constexpr int kTrack = 8;  // the winners of max and min

// Winner offsets from the row's first edge: int32 lanes, one per Vec64<T> lane.
template <typename T>
using Offsets = WinVec<T, int32_t>;

// The outputs a tile writes: out_row[k*F + f] for k < K is codes[k] (reduce_codes.h; no "mul").
// arg_max/arg_min: the row's winner rows (index_t [F]), or nullptr. stream: full vectors are written
// with non-temporal stores (no read of the line before the write; every full vector's address is
// 64-byte aligned, see stream_vec), for outputs far larger than the caches.
template <typename index_t>
struct Outputs {
  const int* codes;
  int K;
  index_t* arg_max;
  index_t* arg_min;
  bool stream = false;
};

// A non-temporal store of a vector of `bytes` (32, 64 or 128) at a 64-byte aligned p (32-byte for
// 32): the line goes to memory without first being read into the cache (a plain store reads it: for
// a [N, K*F] output beyond the caches that read is a third of the traffic). The caller ends its
// stores with stream_fence() before another thread reads them.
template <typename V>
inline void stream_vec(void* p, const V& v) {
#if defined(__AVX512F__)
  static_assert(sizeof(V) == 32 || sizeof(V) == 64 || sizeof(V) == 128, "a 32, 64 or 128-byte vector");
  if constexpr (sizeof(V) == 32) {
    __m256i u;
    std::memcpy(&u, &v, 32);
    _mm256_stream_si256(static_cast<__m256i*>(p), u);
  } else {
    for (size_t b = 0; b < sizeof(V); b += 64) {
      __m512i u;
      std::memcpy(&u, reinterpret_cast<const char*>(&v) + b, 64);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(static_cast<char*>(p) + b), u);
    }
  }
#else
  std::memcpy(p, &v, sizeof(V));
#endif
}

inline void stream_fence() {
#if defined(__AVX512F__)
  _mm_sfence();
#endif
}

// Whether the stores of a [rows, K*F] output at `out` (and winners at `arg`, may be null) may
// stream: every full vector aligned (F a whole number of 64-byte vectors), and the output large
// (below ~16 MB the lines a plain store reads stay in the caches, and the next op reads them there:
// measured on this VM, 1 thread, 2.8 and 5.6 MB: plain stores faster; 23 MB: streaming 1.5x faster).
template <typename T, typename index_t>
inline bool should_stream(const T* out, const index_t* arg, int64_t rows, int64_t K, int64_t F) {
#if defined(__AVX512F__)
  constexpr int64_t kMinBytes = int64_t{16} << 20;
  const bool aligned = (F * static_cast<int64_t>(sizeof(T))) % 64 == 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0 &&
                       (arg == nullptr || reinterpret_cast<uintptr_t>(arg) % 64 == 0);
  return aligned && rows * K * F * static_cast<int64_t>(sizeof(T)) >= kMinBytes;
#else
  (void)out, (void)arg, (void)rows, (void)K, (void)F;
  return false;
#endif
}

// PyG's StdAggregation on a vector: sqrt(max(var, 1e-5)), and 0 where that is <= sqrt(1e-5).
// (A NaN var stays NaN, as std::max(var, 1e-5) keeps it.)
template <typename T>
inline Vec64<T> std_vec(Vec64<T> var) {
  const Vec64<T> floor = Vec64<T>{} + T(1e-5);
  const Vec64<T> cut = Vec64<T>{} + std::sqrt(T(1e-5));
  var = var < floor ? floor : var;
  Vec64<T> sd;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    sd = (Vec64<T>)_mm512_sqrt_ps((__m512)var);
  } else {
    sd = (Vec64<T>)_mm512_sqrt_pd((__m512d)var);
  }
#else
  for (int64_t l = 0; l < kLanes<T>; ++l) sd[l] = std::sqrt(var[l]);
#endif
  return sd <= cut ? Vec64<T>{} : sd;
}

// Folds message v into max/min (and their winners: offset pos) of one vector. kExact: with the NaN
// rule of Reducer::wins (a NaN message replaces, a NaN is never replaced). Without it the plain
// comparisons are exact for numbers; the tile then checks its sums for a NaN (a NaN message makes
// the sum NaN) and redoes itself exactly where one shows up: NaNs cost nothing until they appear.
// With AVX-512 the comparisons write mask registers directly (GCC's generic vectors would turn
// them into vectors and back, five extra instructions per vector).
template <bool kExact, bool kTrack, typename T>
inline void fold_ext(const Vec64<T>& v, Vec64<T>& mx, Vec64<T>& mn, Offsets<T>& wx, Offsets<T>& wn,
                     const Offsets<T>& pos) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 a = (__m512)v, hi = (__m512)mx, lo = (__m512)mn;
    if constexpr (kExact) {  // keep = v is a number and not better
      const __mmask16 number = _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q);
      const __mmask16 keep_hi = _mm512_mask_cmp_ps_mask(number, a, hi, _CMP_NGT_UQ);
      const __mmask16 keep_lo = _mm512_mask_cmp_ps_mask(number, a, lo, _CMP_NLT_UQ);
      mx = (Vec64<T>)_mm512_mask_blend_ps(keep_hi, a, hi);
      mn = (Vec64<T>)_mm512_mask_blend_ps(keep_lo, a, lo);
      if constexpr (kTrack) {
        wx = (Offsets<T>)_mm512_mask_blend_epi32(keep_hi, (__m512i)pos, (__m512i)wx);
        wn = (Offsets<T>)_mm512_mask_blend_epi32(keep_lo, (__m512i)pos, (__m512i)wn);
      }
    } else {
      if constexpr (kTrack) {
        wx = (Offsets<T>)_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(a, hi, _CMP_GT_OQ), (__m512i)wx, (__m512i)pos);
        wn = (Offsets<T>)_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(a, lo, _CMP_LT_OQ), (__m512i)wn, (__m512i)pos);
      }
      mx = (Vec64<T>)_mm512_max_ps(a, hi);  // a > hi ? a : hi
      mn = (Vec64<T>)_mm512_min_ps(a, lo);  // a < lo ? a : lo
    }
    return;
  } else if constexpr (std::is_same_v<T, double>) {
    const __m512d a = (__m512d)v, hi = (__m512d)mx, lo = (__m512d)mn;
    if constexpr (kExact) {
      const __mmask8 number = _mm512_cmp_pd_mask(a, a, _CMP_ORD_Q);
      const __mmask8 keep_hi = _mm512_mask_cmp_pd_mask(number, a, hi, _CMP_NGT_UQ);
      const __mmask8 keep_lo = _mm512_mask_cmp_pd_mask(number, a, lo, _CMP_NLT_UQ);
      mx = (Vec64<T>)_mm512_mask_blend_pd(keep_hi, a, hi);
      mn = (Vec64<T>)_mm512_mask_blend_pd(keep_lo, a, lo);
      if constexpr (kTrack) {
        wx = (Offsets<T>)_mm256_mask_blend_epi32(keep_hi, (__m256i)pos, (__m256i)wx);
        wn = (Offsets<T>)_mm256_mask_blend_epi32(keep_lo, (__m256i)pos, (__m256i)wn);
      }
    } else {
      if constexpr (kTrack) {
        wx = (Offsets<T>)_mm256_mask_blend_epi32(_mm512_cmp_pd_mask(a, hi, _CMP_GT_OQ), (__m256i)wx, (__m256i)pos);
        wn = (Offsets<T>)_mm256_mask_blend_epi32(_mm512_cmp_pd_mask(a, lo, _CMP_LT_OQ), (__m256i)wn, (__m256i)pos);
      }
      mx = (Vec64<T>)_mm512_max_pd(a, hi);
      mn = (Vec64<T>)_mm512_min_pd(a, lo);
    }
    return;
  }
#endif
  auto nan = v != v;
  if constexpr (!kExact) nan = decltype(nan){};
  const auto up = (v > mx) | nan;
  const auto down = (v < mn) | nan;
  mx = up ? v : mx;
  mn = down ? v : mn;
  if constexpr (kTrack) {
    wx = __builtin_convertvector(up, Offsets<T>) ? pos : wx;
    wn = __builtin_convertvector(down, Offsets<T>) ? pos : wn;
  }
}

// a * b + c in one rounding where the ISA has it (GCC does not contract a * b + c under ISO C++).
template <typename T>
inline Vec64<T> fma_vec(const Vec64<T>& a, const Vec64<T>& b, const Vec64<T>& c) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return (Vec64<T>)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
  else return (Vec64<T>)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#else
  return a * b + c;
#endif
}

template <typename T>
inline bool any_nan(const Vec64<T>& v) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return _mm512_cmp_ps_mask((__m512)v, (__m512)v, _CMP_UNORD_Q) != 0;
  else return _mm512_cmp_pd_mask((__m512d)v, (__m512d)v, _CMP_UNORD_Q) != 0;
#else
  for (int64_t l = 0; l < kLanes<T>; ++l) if (v[l] != v[l]) return true;
  return false;
#endif
}

// Stores the winners (offsets + e0) of `n` lanes (all of them unless kMasked; streamed when `stream`).
template <bool kMasked, typename T, typename index_t>
inline void store_winners(index_t* dst, const Offsets<T>& off, int64_t e0, int64_t n, bool stream) {
  using W = WinVec<T, index_t>;
  const W pos = __builtin_convertvector(off, W) + static_cast<index_t>(e0);
  if constexpr (kMasked) {
    for (int64_t l = 0; l < n; ++l) dst[l] = pos[l];
  } else if (stream) {
    stream_vec(dst, pos);
  } else {
    store_any(dst, pos);
  }
}

// Forward of features [f0, f0 + NV * lanes) of one row with edges [e0, e1) (e1 > e0); kMasked: one
// vector of which the lanes in load.mask are real (nf of them). Prefetching as reduce_row_tile.
template <int NV, int S, bool kMasked, typename T, typename index_t, bool kScaled, bool kExact = false,
          typename ScaleFn>
inline void stats_tile(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, int64_t f0,
                       const ScaleFn& scale, T* out_row, const Outputs<index_t>& outs, int64_t ahead,
                       int64_t prefetch_end, TileLoad<T, kMasked> load = {}, int64_t nf = 0) {
  static_assert(!kMasked || NV == 1, "a masked tile is one vector");
  constexpr bool kQ = S & kSq, kE = S & kExt, kW = S & kTrack;
  constexpr bool kL = (S & kLin) || (kE && !kExact);  // (the sum is max/min's NaN detector)
  static_assert(!kQ || kL, "the sum of squares comes with the sum");
  static_assert(!kW || kE, "winners come with max/min");
  constexpr int64_t L = kLanes<T>;
  constexpr int kLines = NV < kPrefetchLines ? NV : kPrefetchLines;
  using V = Vec64<T>;
  using O = Offsets<T>;
  V s[NV], q[NV], mx[NV], mn[NV];
  O wx[NV], wn[NV];
  auto message = [&](int64_t e, int k) {
    return scaled<kScaled, T>(load(x + static_cast<int64_t>(col[e]) * F + f0 + k * L), scale, e);
  };
  if (e0 + ahead < prefetch_end) prefetch_lines<kLines>(x + static_cast<int64_t>(col[e0 + ahead]) * F);
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) {
    const V v = message(e0, k);
    if constexpr (kL) s[k] = v;
    if constexpr (kQ) q[k] = v * v;
    if constexpr (kE) mx[k] = mn[k] = v;
    if constexpr (kW) wx[k] = wn[k] = O{};
  }
  auto fold = [&](int64_t e) {
    const O pos = O{} + static_cast<int32_t>(e - e0);
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      const V v = message(e, k);
      if constexpr (kL) s[k] += v;
      if constexpr (kQ) q[k] = fma_vec<T>(v, v, q[k]);
      if constexpr (kE) fold_ext<kExact, kW, T>(v, mx[k], mn[k], wx[k], wn[k], pos);
    }
  };
  fold_rest_prefetched<kLines>(x, col, F, e0, e1, ahead, prefetch_end, fold);
  if constexpr (kE && !kExact) {
    bool nan = false;
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) nan |= any_nan<T>(s[k]);
    if (nan) {  // a NaN message (or inf - inf): redo the tile with the NaN rule
      return stats_tile<NV, S, kMasked, T, index_t, kScaled, true>(x, F, col, e0, e1, f0, scale, out_row, outs, ahead,
                                                                   0, load, nf);
    }
  }

  const T inv = T(1) / static_cast<T>(e1 - e0);
  for (int c = 0; c < outs.K; ++c) {
    T* o = out_row + c * F + f0;
    const int code = outs.codes[c];
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      V r = V{};
      switch (code) {
        case reduce_code::kSum: if constexpr (kL) r = s[k]; break;
        case reduce_code::kMean: if constexpr (kL) r = s[k] * inv; break;
        case reduce_code::kMax: if constexpr (kE) r = mx[k]; break;
        case reduce_code::kMin: if constexpr (kE) r = mn[k]; break;
        default:  // var, std
          if constexpr (kQ) {
            const V mean = s[k] * inv;
            r = q[k] * inv - mean * mean;
            if (code == reduce_code::kStd) r = std_vec<T>(r);
          }
          break;
      }
      if constexpr (!kMasked) {
        if (outs.stream) {
          stream_vec(o + k * L, r);
          continue;
        }
      }
      load.store(o + k * L, r);
    }
  }
  if constexpr (kW) {
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      if (outs.arg_max) store_winners<kMasked, T>(outs.arg_max + f0 + k * L, wx[k], e0, nf, outs.stream);
      if (outs.arg_min) store_winners<kMasked, T>(outs.arg_min + f0 + k * L, wn[k], e0, nf, outs.stream);
    }
  }
}

// The same for features [f0, F) narrower than a vector, one scalar at a time (no AVX-512).
template <int S, typename T, typename index_t, bool kScaled, typename ScaleFn>
inline void stats_scalar(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, int64_t f0,
                         const ScaleFn& scale, T* out_row, const Outputs<index_t>& outs) {
  constexpr int64_t L = kLanes<T>;
  T s[L] = {}, q[L] = {}, mx[L] = {}, mn[L] = {};
  int64_t wx[L] = {}, wn[L] = {};
  const int64_t nf = F - f0;
  for (int64_t e = e0; e < e1; ++e) {
    const T* xr = x + static_cast<int64_t>(col[e]) * F + f0;
    const T w = kScaled ? static_cast<T>(scale(e)) : T(1);
    for (int64_t f = 0; f < nf; ++f) {
      const T v = kScaled ? xr[f] * w : xr[f];
      const bool first = e == e0;
      s[f] = first ? v : s[f] + v;
      q[f] = first ? v * v : q[f] + v * v;
      if (first || Reducer<Reduce::Max>::wins(v, mx[f])) {
        mx[f] = v;
        wx[f] = e;
      }
      if (first || Reducer<Reduce::Min>::wins(v, mn[f])) {
        mn[f] = v;
        wn[f] = e;
      }
    }
  }
  const T inv = T(1) / static_cast<T>(e1 - e0);
  for (int c = 0; c < outs.K; ++c) {
    T* o = out_row + c * F + f0;
    for (int64_t f = 0; f < nf; ++f) {
      const T mean = s[f] * inv, var = q[f] * inv - mean * mean;
      switch (outs.codes[c]) {
        case reduce_code::kSum: o[f] = s[f]; break;
        case reduce_code::kMean: o[f] = mean; break;
        case reduce_code::kMax: o[f] = mx[f]; break;
        case reduce_code::kMin: o[f] = mn[f]; break;
        case reduce_code::kVar: o[f] = var; break;
        default: {
          const T sd = std::sqrt(std::max(var, T(1e-5)));
          o[f] = sd <= std::sqrt(T(1e-5)) ? T(0) : sd;
        }
      }
    }
  }
  if constexpr ((S & kTrack) != 0) {
    for (int64_t f = 0; f < nf; ++f) {
      if (outs.arg_max) outs.arg_max[f0 + f] = static_cast<index_t>(wx[f]);
      if (outs.arg_min) outs.arg_min[f0 + f] = static_cast<index_t>(wn[f]);
    }
  }
}

// One row (e1 > e0), all F features: tiles of up to kMaxNV vectors (4 when max/min are kept: six
// statistics per vector fill the 32 vector registers), then the tail. Only the first tile
// prefetches; later tiles re-read the row's sources from L1/L2.
template <int S, typename T, typename index_t, bool kScaled, typename ScaleFn>
inline void stats_row(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, const ScaleFn& scale,
                      T* out_row, const Outputs<index_t>& outs, int64_t ahead, int64_t prefetch_end) {
  constexpr int64_t L = kLanes<T>;
  constexpr int kMaxNV = (S & kExt) ? 4 : 8;
  int64_t f0 = 0;
  for (; f0 + kMaxNV * L <= F; f0 += kMaxNV * L) {
    stats_tile<kMaxNV, S, false, T, index_t, kScaled>(x, F, col, e0, e1, f0, scale, out_row, outs, ahead,
                                                      prefetch_end);
    prefetch_end = 0;
  }
  if constexpr (kMaxNV > 4) {
    if (f0 + 4 * L <= F) {
      stats_tile<4, S, false, T, index_t, kScaled>(x, F, col, e0, e1, f0, scale, out_row, outs, ahead, prefetch_end);
      f0 += 4 * L;
      prefetch_end = 0;
    }
  }
  if (f0 + 2 * L <= F) {
    stats_tile<2, S, false, T, index_t, kScaled>(x, F, col, e0, e1, f0, scale, out_row, outs, ahead, prefetch_end);
    f0 += 2 * L;
    prefetch_end = 0;
  }
  if (f0 + L <= F) {
    stats_tile<1, S, false, T, index_t, kScaled>(x, F, col, e0, e1, f0, scale, out_row, outs, ahead, prefetch_end);
    f0 += L;
    prefetch_end = 0;
  }
  if (f0 < F) {
#if defined(__AVX512F__)
    const TileLoad<T, true> masked{(1u << (F - f0)) - 1u};
    stats_tile<1, S, true, T, index_t, kScaled>(x, F, col, e0, e1, f0, scale, out_row, outs, ahead, prefetch_end,
                                                masked, F - f0);
#else
    stats_scalar<S, T, index_t, kScaled>(x, F, col, e0, e1, f0, scale, out_row, outs);
#endif
  }
}

// Backward, linear part, features [f0, f0 + NV * lanes) of source row j with transpose edges
// [q0, q1): gx = sum_q w c[i] + x[j] * sum_q w^2 d[i], c and d the first and second F columns of
// coef's [N, 2F] rows (kQuadratic; else coef is [N, F] of c alone). w = weight[t_pos[q]] (kScaled).
template <int NV, bool kQuadratic, bool kScaled, bool kMasked, typename T, typename index_t>
inline void linear_grad_tile(const T* coef, const T* x, const T* weight, const index_t* t_col, const index_t* t_pos,
                             int64_t F, int64_t q0, int64_t q1, int64_t f0, T* gx_row, int64_t ahead,
                             int64_t prefetch_end, TileLoad<T, kMasked> load = {}) {
  constexpr int64_t L = kLanes<T>;
  constexpr int64_t W = kQuadratic ? 2 : 1;  // coefficient row width in units of F
  constexpr int kLines = NV < kPrefetchLines ? NV : kPrefetchLines;
  using V = Vec64<T>;
  V c[NV], d[NV];
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) c[k] = d[k] = V{};
  auto fold = [&](int64_t q) {
    const T* row = coef + static_cast<int64_t>(t_col[q]) * W * F + f0;
    const T w = kScaled ? weight[t_pos[q]] : T(1);
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) {
      if constexpr (kScaled) {
        c[k] += load(row + k * L) * w;
        if constexpr (kQuadratic) d[k] += load(row + F + k * L) * (w * w);
      } else {
        c[k] += load(row + k * L);
        if constexpr (kQuadratic) d[k] += load(row + F + k * L);
      }
    }
  };
  const int64_t prefetch_until = std::max<int64_t>(q0, std::min<int64_t>(q1, prefetch_end - ahead));
  int64_t q = q0;
  for (; q < prefetch_until; ++q) {
    const T* ahead_row = coef + static_cast<int64_t>(t_col[q + ahead]) * W * F;
    prefetch_lines<kLines>(ahead_row);
    if constexpr (kQuadratic) prefetch_lines<kLines>(ahead_row + F);
    fold(q);
  }
  for (; q < q1; ++q) fold(q);
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) {
    V g = c[k];
    if constexpr (kQuadratic) g += load(x + f0 + k * L) * d[k];
    load.store(gx_row + f0 + k * L, g);
  }
}

// The same for features [f0, F) narrower than a vector, one scalar at a time (no AVX-512).
template <bool kQuadratic, bool kScaled, typename T, typename index_t>
inline void linear_grad_scalar(const T* coef, const T* x, const T* weight, const index_t* t_col, const index_t* t_pos,
                               int64_t F, int64_t q0, int64_t q1, int64_t f0, T* gx_row) {
  constexpr int64_t W = kQuadratic ? 2 : 1;
  T c[kLanes<T>] = {}, d[kLanes<T>] = {};
  const int64_t nf = F - f0;
  for (int64_t q = q0; q < q1; ++q) {
    const T* row = coef + static_cast<int64_t>(t_col[q]) * W * F + f0;
    const T w = kScaled ? weight[t_pos[q]] : T(1);
    for (int64_t f = 0; f < nf; ++f) {
      c[f] += kScaled ? row[f] * w : row[f];
      if constexpr (kQuadratic) d[f] += kScaled ? row[F + f] * (w * w) : row[F + f];
    }
  }
  for (int64_t f = 0; f < nf; ++f) gx_row[f0 + f] = kQuadratic ? c[f] + x[f0 + f] * d[f] : c[f];
}

// One source row j (x points at x[j]), all F features; rows without edges get 0.
template <bool kQuadratic, bool kScaled, typename T, typename index_t>
inline void linear_grad_row(const T* coef, const T* x, const T* weight, const index_t* t_col, const index_t* t_pos,
                            int64_t F, int64_t q0, int64_t q1, T* gx_row, int64_t ahead, int64_t prefetch_end) {
  constexpr int64_t L = kLanes<T>;
  int64_t f0 = 0;
  for (; f0 + 4 * L <= F; f0 += 4 * L) {
    linear_grad_tile<4, kQuadratic, kScaled, false, T, index_t>(coef, x, weight, t_col, t_pos, F, q0, q1, f0, gx_row,
                                                               ahead, prefetch_end);
    prefetch_end = 0;
  }
  if (f0 + 2 * L <= F) {
    linear_grad_tile<2, kQuadratic, kScaled, false, T, index_t>(coef, x, weight, t_col, t_pos, F, q0, q1, f0, gx_row,
                                                               ahead, prefetch_end);
    f0 += 2 * L;
    prefetch_end = 0;
  }
  if (f0 + L <= F) {
    linear_grad_tile<1, kQuadratic, kScaled, false, T, index_t>(coef, x, weight, t_col, t_pos, F, q0, q1, f0, gx_row,
                                                               ahead, prefetch_end);
    f0 += L;
    prefetch_end = 0;
  }
  if (f0 < F) {
#if defined(__AVX512F__)
    const TileLoad<T, true> masked{(1u << (F - f0)) - 1u};
    linear_grad_tile<1, kQuadratic, kScaled, true, T, index_t>(coef, x, weight, t_col, t_pos, F, q0, q1, f0, gx_row,
                                                              ahead, prefetch_end, masked);
#else
    linear_grad_scalar<kQuadratic, kScaled, T, index_t>(coef, x, weight, t_col, t_pos, F, q0, q1, f0, gx_row);
#endif
  }
}

}  // namespace multi
}  // namespace gnnfuse
