// Register-resident row reductions for the CPU gather-scatter kernels.
//
// A CSR row's reduction out[row, :] = REDUCE_e m(e) * x[col[e], :] is computed in feature tiles
// of NV vectors of 64 bytes (one AVX-512 register each; the compiler splits them on narrower
// ISAs). The tile's accumulators are vector values, so they stay in registers over the row's
// edges instead of making a load-add-store round trip through memory per edge. The tail narrower
// than a vector is one masked vector (AVX-512; scalars elsewhere). Every output element is still
// folded in CSR order, one edge after another: the result is the same for any thread count and
// from run to run.
//
// Rows are random reads into x. While walking its edges a thread prefetches (the start of) the source
// row `ahead` edges further on in its own edge range, across row boundaries: most rows of a sparse
// graph are shorter than any useful prefetch distance, so a look-ahead within the row would find
// nothing to fetch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "reducer.h"

namespace gnnfuse {

// (Spelled per type: GCC drops vector_size on a dependent alias template.)
template <typename T>
struct Vec64Of;
template <>
struct Vec64Of<float> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct Vec64Of<double> {
  typedef double type __attribute__((vector_size(64)));
};
template <typename T>
using Vec64 = typename Vec64Of<T>::type;
static_assert(sizeof(Vec64<float>) == 64 && sizeof(Vec64<double>) == 64, "vector_size ignored");

template <typename T>
constexpr int64_t kLanes = 64 / static_cast<int64_t>(sizeof(T));

template <typename T>
inline Vec64<T> load_vec(const T* p) {
  Vec64<T> v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}

template <typename T>
inline void store_vec(T* p, const Vec64<T>& v) {
  std::memcpy(p, &v, sizeof v);
}

// How many edges ahead to prefetch, and how much of each row: enough bytes in flight to hide a
// DRAM miss (~8 KiB per thread), at least 4 rows, and only a row's first 256 bytes (the hardware
// prefetcher streams the rest of a longer row once its first lines are read). Measured on
// community-1m in generated order, 2 threads, variants interleaved on a loaded machine (medians):
// F=128 whole rows 8 ahead 882 ms, whole rows 16 ahead 855 ms, 256 bytes 16 ahead 822 ms
// (torch.sparse.mm 1606 ms); F=32 (128-byte rows) 32 ahead 417 ms, 64 ahead 411 ms.
constexpr int kPrefetchLines = 4;  // 256 bytes
inline int64_t prefetch_ahead(int64_t row_bytes) {
  constexpr int64_t kBytesInFlight = 8192;
  const int64_t ahead = kBytesInFlight / std::max<int64_t>(row_bytes, 64);
  return std::max<int64_t>(4, std::min<int64_t>(ahead, 64));
}

// Prefetches `bytes` starting at p into the cache hierarchy.
inline __attribute__((always_inline)) void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 3);
}

// Prefetches the first `kLines` cache lines of the row at p (a compile-time count: no loop and
// no branch per edge, which matters at F=32 where an edge is two vector adds). Always inlined: GCC
// counts a function of prefetches alone as free of side effects, and where it kept one out of line
// it deleted the calls (pair_attention.cpp lost every 4-line prefetch of its weighted sums so).
template <int kLines>
inline __attribute__((always_inline)) void prefetch_lines(const void* p) {
  const char* c = static_cast<const char*>(p);
#pragma GCC unroll 8
  for (int l = 0; l < kLines; ++l) __builtin_prefetch(c + 64 * l, 0, 3);
}

// Folds a row's edges e0 + 1 .. e1 - 1 in CSR order with fold(e) (the caller took edge e0),
// prefetching `kLines` lines of the source row `ahead` edges further on while that edge lies
// below prefetch_end; the edges past that point are folded without the prefetch test.
template <int kLines, typename T, typename index_t, typename Fold>
inline void fold_rest_prefetched(const T* x, const index_t* col, int64_t F, int64_t e0, int64_t e1, int64_t ahead,
                                 int64_t prefetch_end, const Fold& fold) {
  const int64_t prefetch_until = std::max<int64_t>(e0 + 1, std::min<int64_t>(e1, prefetch_end - ahead));
  int64_t e = e0 + 1;
  for (; e < prefetch_until; ++e) {
    prefetch_lines<kLines>(x + static_cast<int64_t>(col[e + ahead]) * F);
    fold(e);
  }
  for (; e < e1; ++e) fold(e);
}

// The message scale m(e) is a functor `T scale(int64_t e)`: weight[e] in the forward with edge
// weights, or the backward's per-edge factor. kScaled=false (no weights) skips the multiply.
struct Unscaled {
  template <typename I>
  float operator()(I) const { return 1.0f; }
};

template <bool kScaled, typename T, typename ScaleFn>
inline Vec64<T> scaled(const Vec64<T>& v, const ScaleFn& scale, int64_t e) {
  if constexpr (kScaled) return v * static_cast<T>(scale(e)); else return v;
}

template <typename Red, typename T>
inline Vec64<T> fold_vec(Vec64<T> acc, Vec64<T> v) {
  if constexpr (std::is_same_v<Red, Reducer<Reduce::Sum>> || std::is_same_v<Red, Reducer<Reduce::Mean>>) {
    return acc + v;
  } else if constexpr (std::is_same_v<Red, Reducer<Reduce::Mul>>) {
    return acc * v;
  } else {  // max/min, NaN-propagating exactly as Reducer::wins
    constexpr bool is_max = std::is_same_v<Red, Reducer<Reduce::Max>>;
    const auto take = (is_max ? (v > acc) : (v < acc)) | (v != v);
    return take ? v : acc;
  }
}

// A tile's source vectors: full 64-byte vectors, or (kMasked) one vector of which only the lanes
// in `mask` are read (the others are 0; AVX-512 masked loads never touch them) and written.
template <typename T, bool kMasked>
struct TileLoad {
  uint32_t mask;
  inline Vec64<T> operator()(const T* p) const {
#if defined(__AVX512F__)
    if constexpr (kMasked) {
      if constexpr (std::is_same_v<T, float>) {
        return (Vec64<T>)_mm512_maskz_loadu_ps(static_cast<__mmask16>(mask), p);
      } else {
        return (Vec64<T>)_mm512_maskz_loadu_pd(static_cast<__mmask8>(mask), p);
      }
    }
#endif
    return load_vec(p);
  }
  inline void store(T* p, const Vec64<T>& v) const {
#if defined(__AVX512F__)
    if constexpr (kMasked) {
      if constexpr (std::is_same_v<T, float>) {
        _mm512_mask_storeu_ps(p, static_cast<__mmask16>(mask), (__m512)v);
      } else {
        _mm512_mask_storeu_pd(p, static_cast<__mmask8>(mask), (__m512d)v);
      }
      return;
    }
#endif
    store_vec(p, v);
  }
};

#if defined(__AVX512F__)
// `take ? new_v : old_v` for a whole vector, without a branch (a mask register blend).
template <typename T>
inline Vec64<T> select_vec(bool take, const Vec64<T>& old_v, const Vec64<T>& new_v) {
  if constexpr (std::is_same_v<T, float>) {
    const auto m = static_cast<__mmask16>(-static_cast<int>(take));
    return (Vec64<T>)_mm512_mask_blend_ps(m, (__m512)old_v, (__m512)new_v);
  } else {
    const auto m = static_cast<__mmask8>(-static_cast<int>(take));
    return (Vec64<T>)_mm512_mask_blend_pd(m, (__m512d)old_v, (__m512d)new_v);
  }
}
#endif

// Reduces features [f0, f0 + NV * lanes) of one row with edges [e0, e1) (e1 > e0) into out_row.
// `scale(e)` is the message scale; kScaled=false skips the multiply. Every element is folded in
// CSR order, one edge after another. Prefetching (when prefetch_end > 0) covers the start of the
// source row `ahead` edges further on, up to prefetch_end: the edge loop is split where that
// look-ahead runs out, so neither part tests it per edge, and the line count is a constant.
//
// Without prefetching (kChunk > 0, AVX-512) the edges are walked in chunks of kChunk: the loop
// runs ceil((n - 1) / kChunk) times and the edges past the row's end in the last chunk re-read its
// last edge and drop the result (a blend keeps the accumulator). The loop's exit, which depends
// on the row length, is then mispredicted about once per kChunk edges less often.
template <int NV, int kChunk, bool kMasked, typename T, typename index_t, typename Red, bool kScaled, typename ScaleFn>
inline void reduce_row_tile(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, int64_t f0,
                            const ScaleFn& scale, T* out_row, int64_t ahead, int64_t prefetch_end,
                            TileLoad<T, kMasked> load = {}) {
  static_assert(!kMasked || NV == 1, "a masked tile is one vector");
  constexpr int64_t L = kLanes<T>;
  constexpr int kLines = NV < kPrefetchLines ? NV : kPrefetchLines;  // never past this tile's bytes
  Vec64<T> acc[NV];
  auto message = [&](int64_t e, int k) {
    return scaled<kScaled, T>(load(x + static_cast<int64_t>(col[e]) * F + f0 + k * L), scale, e);
  };
  auto fold = [&](int64_t e) {
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) acc[k] = fold_vec<Red, T>(acc[k], message(e, k));
  };
  if (e0 + ahead < prefetch_end) prefetch_lines<kLines>(x + static_cast<int64_t>(col[e0 + ahead]) * F);
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) acc[k] = message(e0, k);
#if defined(__AVX512F__)
  if constexpr (kChunk > 0) {
    for (int64_t e = e0 + 1; e < e1; e += kChunk) {
#pragma GCC unroll 8
      for (int j = 0; j < kChunk; ++j) {
        const bool inside = e + j < e1;
        const int64_t ej = inside ? e + j : e1 - 1;
#pragma GCC unroll 8
        for (int k = 0; k < NV; ++k) acc[k] = select_vec<T>(inside, acc[k], fold_vec<Red, T>(acc[k], message(ej, k)));
      }
    }
  } else
#endif
  {
    fold_rest_prefetched<kLines>(x, col, F, e0, e1, ahead, prefetch_end, fold);
  }
  if constexpr (std::is_same_v<Red, Reducer<Reduce::Mean>>) {
    const T count = static_cast<T>(e1 - e0);
#pragma GCC unroll 8
    for (int k = 0; k < NV; ++k) acc[k] = acc[k] / count;
  }
#pragma GCC unroll 8
  for (int k = 0; k < NV; ++k) load.store(out_row + f0 + k * L, acc[k]);
}

// Same reduction for a feature tail narrower than one vector (nf < lanes), one scalar at a time:
// edges outside, features inside, so each edge's index and scale are read once (a narrow layer,
// e.g. F=4 classes, would otherwise walk the row nf times). Every element is folded in CSR order.
// Prefetching as in reduce_row_tile (one line: the tail of a row is at most 60 bytes). Used
// where masked vector loads are not available.
template <typename T, typename index_t, typename Red, bool kScaled, typename ScaleFn>
inline void reduce_row_scalar(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, int64_t f0,
                              int64_t nf, const ScaleFn& scale, T* out_row, int64_t ahead, int64_t prefetch_end) {
  T acc[kLanes<T>];
  auto message = [&](const T* xr, int64_t f, int64_t e) {
    T v = xr[f];
    if constexpr (kScaled) v *= static_cast<T>(scale(e));
    return v;
  };
  if (e0 + ahead < prefetch_end) prefetch_lines<1>(x + static_cast<int64_t>(col[e0 + ahead]) * F);
  {
    const T* xr = x + static_cast<int64_t>(col[e0]) * F + f0;
    for (int64_t f = 0; f < nf; ++f) acc[f] = message(xr, f, e0);
  }
  const int64_t prefetch_until = std::max<int64_t>(e0 + 1, std::min<int64_t>(e1, prefetch_end - ahead));
  for (int64_t e = e0 + 1; e < e1; ++e) {
    if (e < prefetch_until) prefetch_lines<1>(x + static_cast<int64_t>(col[e + ahead]) * F);
    const T* xr = x + static_cast<int64_t>(col[e]) * F + f0;
    if constexpr (kScaled) {
      const T s = static_cast<T>(scale(e));
      for (int64_t f = 0; f < nf; ++f) Red::update(acc[f], xr[f] * s);
    } else {
      for (int64_t f = 0; f < nf; ++f) Red::update(acc[f], xr[f]);
    }
  }
  for (int64_t f = 0; f < nf; ++f) out_row[f0 + f] = Red::finish(acc[f], e1 - e0);
}

// One row, all F features: tiles of 8, 4, 2, 1 vectors, then the tail narrower than a vector
// (one masked vector with AVX-512, else scalars). Only the first tile prefetches (later tiles
// re-read the row's sources while they are in L1/L2). `short_rows` (the graph's rows average at
// most kShortRowEdges edges) walks the edges of narrow tiles (at most two vectors) in chunks of 4
// where nothing is prefetched: there the loop exits, not the loads, bound the time.
// Measured on this VM (1 thread, kernel alone, thread CPU time, fastest of 15, loaded machine):
// Cora F=16 sum 30.0 -> 24.4 us, F=32 36.3 -> 31.3 us; on Facebook (15 edges a row) chunks cost
// 7-18% at F=4..64, and at F=128 on Cora 10%: there the one-edge loop stays.
constexpr int64_t kShortRowEdges = 8;

template <int NV, bool kMasked, typename T, typename index_t, typename Red, bool kScaled, typename ScaleFn>
inline void reduce_row_tile_walk(bool short_rows, const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1,
                                 int64_t f0, const ScaleFn& scale, T* out_row, int64_t ahead, int64_t prefetch_end,
                                 TileLoad<T, kMasked> load = {}) {
  if constexpr (NV <= 2) {
    if (short_rows && prefetch_end <= 0) {
      return reduce_row_tile<NV, 4, kMasked, T, index_t, Red, kScaled>(x, F, col, e0, e1, f0, scale, out_row, ahead, 0,
                                                                       load);
    }
  }
  reduce_row_tile<NV, 0, kMasked, T, index_t, Red, kScaled>(x, F, col, e0, e1, f0, scale, out_row, ahead, prefetch_end,
                                                            load);
}

template <typename T, typename index_t, typename Red, bool kScaled, typename ScaleFn>
inline void reduce_row(const T* x, int64_t F, const index_t* col, int64_t e0, int64_t e1, const ScaleFn& scale,
                       T* out_row, int64_t ahead, int64_t prefetch_end, bool short_rows) {
  constexpr int64_t L = kLanes<T>;
  int64_t f0 = 0;
  for (; f0 + 8 * L <= F; f0 += 8 * L) {
    reduce_row_tile<8, 0, false, T, index_t, Red, kScaled>(x, F, col, e0, e1, f0, scale, out_row, ahead, prefetch_end);
    prefetch_end = 0;
  }
  if (f0 + 4 * L <= F) {
    reduce_row_tile<4, 0, false, T, index_t, Red, kScaled>(x, F, col, e0, e1, f0, scale, out_row, ahead, prefetch_end);
    f0 += 4 * L;
    prefetch_end = 0;
  }
  if (f0 + 2 * L <= F) {
    reduce_row_tile_walk<2, false, T, index_t, Red, kScaled>(short_rows, x, F, col, e0, e1, f0, scale, out_row, ahead,
                                                             prefetch_end);
    f0 += 2 * L;
    prefetch_end = 0;
  }
  if (f0 + L <= F) {
    reduce_row_tile_walk<1, false, T, index_t, Red, kScaled>(short_rows, x, F, col, e0, e1, f0, scale, out_row, ahead,
                                                             prefetch_end);
    f0 += L;
    prefetch_end = 0;
  }
  if (f0 < F) {
#if defined(__AVX512F__)
    const TileLoad<T, true> masked{(1u << (F - f0)) - 1u};
    reduce_row_tile_walk<1, true, T, index_t, Red, kScaled>(short_rows, x, F, col, e0, e1, f0, scale, out_row, ahead,
                                                            prefetch_end, masked);
#else
    reduce_row_scalar<T, index_t, Red, kScaled>(x, F, col, e0, e1, f0, F - f0, scale, out_row, ahead, prefetch_end);
#endif
  }
}

}  // namespace gnnfuse
