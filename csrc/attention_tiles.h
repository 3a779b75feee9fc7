// The attention forwards' weighted row sum with the accumulators in registers:
//   acc[h*F + f] = sum over the row's edges e of c[e*H + h] * rows[other_e, h*F + f]
// in tiles of up to 4 vectors of 16 floats. A per-edge loop of one axpy per head through a
// memory accumulator makes every edge a load-add-store round trip per head (at 8 heads x 8
// features, 8 stores per edge, which is where the forward spent most of its time); here the tile
// stays in registers over the row. A vector's lanes take their head's weight: a broadcast when a
// head spans whole vectors (F a multiple of 16), a lane shuffle of the edge's weights when a
// vector holds several heads (F = 1, 2, 4, 8). Each element is still folded edge after edge in
// the row's order, with the same multiply-add as the memory loop: results are bitwise the same.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_common.h"
#include "row_tiles.h"

namespace gnnfuse {
namespace attention_detail {

// Whether weighted_row_sum takes a row of H heads of F features: float rows, whole vectors, and
// (GCC's lane shuffle) heads that tile a vector exactly. Other rows use the callers' scalar loop.
template <typename scalar_t, typename acc_t>
inline bool register_tiles_fit(int64_t H, int64_t F) {
#if defined(__GNUC__) && !defined(__clang__)
  constexpr int64_t L = kLanes<float>;
  return std::is_same_v<scalar_t, float> && std::is_same_v<acc_t, float> && (H * F) % L == 0 &&
         (F % L == 0 || L % F == 0);
#else
  return false;
#endif
}

#if defined(__GNUC__) && !defined(__clang__)
typedef int32_t LaneIndex __attribute__((vector_size(64)));

// Which head each lane of each vector of a row belongs to, worked out once per kernel call (per
// row it cost as much as the sums on short rows): vector v starts in head first[v]; a head spans
// whole vectors (one_head) or, with `levels` = log2(F), each vector holds 16 / F heads, lane l in
// head first[v] + l / F. For head_dots with several heads per vector (F = 1, 2, 4, 8), `levels`
// halving steps fold each head's F lanes to one: step k takes two vectors and adds lanes lo[k] and
// hi[k] of their concatenation (the first and second half of each head's lanes).
struct HeadLanes {
  std::vector<int64_t> first;
  bool one_head;   // every vector within one head: a broadcast of its weight
  bool tile_head;  // every tile of 4 vectors within one head (F a multiple of 64)
  int levels = 0;
  LaneIndex lo[4] = {}, hi[4] = {};
  HeadLanes(int64_t H, int64_t F) : one_head(F % kLanes<float> == 0), tile_head(F % (4 * kLanes<float>) == 0) {
    constexpr int64_t L = kLanes<float>;
    for (int64_t f0 = 0; f0 + L <= H * F; f0 += L) first.push_back(f0 / F);
    for (int64_t w = F; !one_head && w > 1; w /= 2, ++levels)
      for (int64_t o = 0; o < L; ++o) {
        lo[levels][o] = int32_t(o / (w / 2) * w + o % (w / 2));
        hi[levels][o] = lo[levels][o] + int32_t(w / 2);
      }
  }
};

// Calls tile(v0, std::integral_constant<int, NV>{}) over a row's nvec vectors in tiles of up to 4
// (NV a compile-time count, so each tile's accumulators stay in registers).
template <typename Tile>
GNNFUSE_ALWAYS_INLINE void for_each_tile(int64_t nvec, const Tile& tile) {
  for (int64_t v0 = 0; v0 < nvec; v0 += 4) {
    const int64_t nv = std::min<int64_t>(4, nvec - v0);
    if (nv == 4) tile(v0, std::integral_constant<int, 4>{});
    else if (nv == 3) tile(v0, std::integral_constant<int, 3>{});
    else if (nv == 2) tile(v0, std::integral_constant<int, 2>{});
    else tile(v0, std::integral_constant<int, 1>{});
  }
}

// Calls fn(std::integral_constant<int, kLevels>{}) with the row's head layout as a compile-time
// constant: kLevels < 0 where a head spans whole vectors, else log2(F) (16 / F heads a vector).
template <typename Fn>
GNNFUSE_ALWAYS_INLINE void dispatch_levels(const HeadLanes& heads, const Fn& fn) {
  if (heads.one_head) fn(std::integral_constant<int, -1>{});
  else if (heads.levels == 0) fn(std::integral_constant<int, 0>{});
  else if (heads.levels == 1) fn(std::integral_constant<int, 1>{});
  else if (heads.levels == 2) fn(std::integral_constant<int, 2>{});
  else fn(std::integral_constant<int, 3>{});
}

// An edge's weights ce[0 : H] spread over one vector's lanes (heads h0 ...), each lane taking its
// head's weight: a broadcast (kLevels < 0), or a load of exactly the vector's 16 >> kLevels heads
// spread over their lanes. (A whole-vector load of the weights just stored, at an offset that
// straddles two of the stores, stalled on store forwarding at 8 heads x 8.)
template <int kLevels, size_t... I>
inline Vec64<float> spread_heads(const float* ce, std::index_sequence<I...>) {
  constexpr int kHeads = int(kLanes<float>) >> kLevels;  // 2, 4, 8 or 16
  const LaneIndex idx{int32_t(I >> kLevels)...};
#if defined(__AVX512F__)
  __m512 w;
  if constexpr (kHeads == 16) return load_vec(ce);
  else if constexpr (kHeads == 8) w = _mm512_castps256_ps512(_mm256_loadu_ps(ce));
  else if constexpr (kHeads == 4) w = _mm512_castps128_ps512(_mm_loadu_ps(ce));
  else w = _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(ce))));
  return (Vec64<float>)_mm512_permutexvar_ps((__m512i)idx, w);
#else
  return __builtin_shuffle(load_vec(ce), idx);  // 16 floats: the weights have kWeightPad readable past them
#endif
}
template <int kLevels>
inline Vec64<float> edge_weight_lanes(const float* ce, int64_t h0) {
  if constexpr (kLevels < 0) return Vec64<float>{} + ce[h0];
  else return spread_heads<kLevels>(ce + h0, std::make_index_sequence<kLanes<float>>{});
}

template <int NV, int kLevels, typename Row>
GNNFUSE_ALWAYS_INLINE void weighted_tile(const Row& edges, const float* c, int64_t H, const HeadLanes& heads, int64_t v0,
                          const float* rows, int64_t width, float* acc, const float* scale) {
  constexpr int64_t L = kLanes<float>;
  constexpr int kLines = NV < kPrefetchLines ? NV : kPrefetchLines;
  const int64_t f0 = v0 * L;
  const int64_t* h0 = heads.first.data() + v0;
  Vec64<float> a[NV];
  for (int v = 0; v < NV; ++v) a[v] = Vec64<float>{};
  const int64_t n = edges.size();
  for (int64_t e = 0; e < n; ++e) {
    if (Row::kPrefetchPerTile || f0 == 0) edges.template prefetch_ahead<kLines>(rows, width, e, f0);
    const float* x = rows + edges.other(e) * width + f0;
    const float* ce = c + e * H;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const Vec64<float> cv = edge_weight_lanes<kLevels>(ce, h0[v]);
      a[v] += cv * load_vec(x + v * L);
    }
  }
  if (scale)
    for (int v = 0; v < NV; ++v) a[v] *= edge_weight_lanes<kLevels>(scale, h0[v]);
  for (int v = 0; v < NV; ++v) store_vec(acc + f0 + v * L, a[v]);
}

// acc[0 : H*F] = the row's weighted sum (see the top of the file), each head's part times
// scale[h] where scale is given (it then needs kWeightPad readable entries past its H, as c);
// call only where register_tiles_fit. c holds n * H weights (and kWeightPad readable entries past
// them, which the shuffle without AVX-512 reads).
template <typename Row>
GNNFUSE_ALWAYS_INLINE void weighted_row_sum(const Row& edges, const float* c, int64_t H, const HeadLanes& heads, const float* rows,
                             float* acc, const float* scale = nullptr) {
  const int64_t nvec = heads.first.size(), width = nvec * kLanes<float>;
  dispatch_levels(heads, [&](auto levels) {
    for_each_tile(nvec, [&](int64_t v0, auto nv_c) {
      weighted_tile<decltype(nv_c)::value, decltype(levels)::value>(edges, c, H, heads, v0, rows, width, acc, scale);
    });
  });
}

// ---- per-head dot products of the row's edges with a fixed row ---------------------------------
// dots[e*H + h] = sum over f of op(fixed[h*F + f], rows[other_e, h*F + f]) for every edge e of the
// row: the backwards' g . x per head, the dot-product logits q . k, GATv2's att . lrelu(q + k).
// The fixed row stays in registers (tiles of up to 4 vectors, as weighted_row_sum); a head's
// lanes are folded by halving shuffles (several heads per vector) or one lane sum (a head spans
// whole vectors). The folding order is fixed: results are the same for any thread count.
struct MulOp {
  inline Vec64<float> operator()(const Vec64<float>& a, const Vec64<float>& b, int64_t) const { return a * b; }
};
// GATv2's logit terms att[f] * leaky_relu(q[f] + k[f]) (the fixed row is the query).
struct LeakyAttOp {
  const float* att;
  float slope;
  inline Vec64<float> operator()(const Vec64<float>& q, const Vec64<float>& k, int64_t f) const {
    const Vec64<float> u = q + k;
    return load_vec(att + f) * (u > Vec64<float>{} ? u : u * slope);
  }
};

inline float lane_sum(const Vec64<float>& v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#else
  float s = 0;
  for (int l = 0; l < kLanes<float>; ++l) s += v[l];
  return s;
#endif
}

// p[0 .. N) -> p[0 .. ceil(N / 2^kLevels)): kLevels halving steps (see HeadLanes).
template <int N, int kLevels>
inline void fold_heads(Vec64<float>* p, const LaneIndex* lo, const LaneIndex* hi) {
  if constexpr (kLevels > 0) {
    constexpr int half = (N + 1) / 2;
#pragma GCC unroll 4
    for (int k = 0; k < half; ++k) {
      const Vec64<float> a = p[2 * k], b = 2 * k + 1 < N ? p[2 * k + 1] : Vec64<float>{};
      p[k] = __builtin_shuffle(a, b, lo[0]) + __builtin_shuffle(a, b, hi[0]);
    }
    fold_heads<half, kLevels - 1>(p, lo + 1, hi + 1);
  }
}

// kLevels < 0: a head spans whole vectors (dots must start at 0; partial sums are added); -2: the
// tile's NV vectors all lie in one head (HeadLanes::tile_head), added up before one lane sum (a lane
// sum per vector and a store-forwarded add into dots per vector cost the 4 x 64 dot-product logits
// as much as reading the keys).
template <int NV, int kLevels, typename Row, typename Op>
inline void head_dot_tile(const Row& edges, const float* rows, int64_t width, const float* fixed, int64_t H,
                          const HeadLanes& heads, int64_t v0, float* dots, const Op& op) {
  constexpr int64_t L = kLanes<float>;
  constexpr int kLines = NV < kPrefetchLines ? NV : kPrefetchLines;
  const int64_t f0 = v0 * L, h0 = heads.first[v0];
  Vec64<float> b[NV];
  for (int v = 0; v < NV; ++v) b[v] = load_vec(fixed + f0 + v * L);
  const int64_t n = edges.size();
  for (int64_t e = 0; e < n; ++e) {
    if (Row::kPrefetchPerTile || f0 == 0) edges.template prefetch_ahead<kLines>(rows, width, e, f0);
    const float* x = rows + edges.other(e) * width + f0;
    float* d = dots + e * H;
    Vec64<float> p[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) p[v] = op(b[v], load_vec(x + v * L), f0 + v * L);
    if constexpr (kLevels == -2) {
      static_assert(NV == 4, "a tile within one head has 4 vectors");
      d[h0] += lane_sum((p[0] + p[1]) + (p[2] + p[3]));
    } else if constexpr (kLevels < 0) {
      for (int v = 0; v < NV; ++v) d[heads.first[v0 + v]] += lane_sum(p[v]);
    } else {
      fold_heads<NV, kLevels>(p, heads.lo, heads.hi);
      constexpr int kHeads = (NV * L) >> kLevels;  // heads in this tile, all of them whole
      constexpr int kOut = (kHeads + L - 1) / L;
      for (int k = 0; k < kOut; ++k) {
        constexpr int kLast = kHeads - (kOut - 1) * L;
        if (k + 1 < kOut) store_vec(d + h0 + k * L, p[k]);
        else std::memcpy(d + h0 + k * L, &p[k], sizeof(float) * kLast);
      }
    }
  }
}

// dots[0 : n*H] as above; call only where register_tiles_fit.
template <typename Row, typename Op>
inline void head_dots(const Row& edges, const float* rows, const float* fixed, int64_t H, const HeadLanes& heads,
                      float* dots, const Op& op) {
  const int64_t nvec = heads.first.size(), width = nvec * kLanes<float>;
  if (heads.one_head) std::fill(dots, dots + edges.size() * H, 0.0f);
  for_each_tile(nvec, [&](int64_t v0, auto nv_c) {
    constexpr int NV = decltype(nv_c)::value;
    if constexpr (NV == 4) {
      if (heads.tile_head) return head_dot_tile<NV, -2>(edges, rows, width, fixed, H, heads, v0, dots, op);
    }
    if (heads.one_head) head_dot_tile<NV, -1>(edges, rows, width, fixed, H, heads, v0, dots, op);
    else if (heads.levels == 0) head_dot_tile<NV, 0>(edges, rows, width, fixed, H, heads, v0, dots, op);
    else if (heads.levels == 1) head_dot_tile<NV, 1>(edges, rows, width, fixed, H, heads, v0, dots, op);
    else if (heads.levels == 2) head_dot_tile<NV, 2>(edges, rows, width, fixed, H, heads, v0, dots, op);
    else head_dot_tile<NV, 3>(edges, rows, width, fixed, H, heads, v0, dots, op);
  });
}

// ---- GATv2's gradient through the leaky_relu, per row on register tiles -----------------------
//   d_own[f] = sum_e c[e, h(f)] att[f] leaky_relu'(fixed[f] + rows[other_e, f])
//   d_att[f] = sum_e c[e, h(f)] leaky_relu(fixed[f] + rows[other_e, f])        (kAtt)
// the weights spread over the lanes as in weighted_tile, the edges folded in the row's order.
template <int NV, int kLevels, bool kAtt>
inline void leaky_grad_tile(const EdgeList& edges, const float* c, int64_t H, const HeadLanes& heads, int64_t v0,
                            const float* rows, int64_t width, const float* fixed, const float* att, float slope,
                            float* d_own, float* d_att) {
  constexpr int64_t L = kLanes<float>;
  const int64_t f0 = v0 * L;
  Vec64<float> a[NV], b[NV], fx[NV], at[NV], ats[NV];
  int64_t h0[NV];
  for (int v = 0; v < NV; ++v) {
    a[v] = b[v] = Vec64<float>{};
    fx[v] = load_vec(fixed + f0 + v * L), at[v] = load_vec(att + f0 + v * L), ats[v] = at[v] * slope;
    h0[v] = heads.first[v0 + v];
  }
  const int64_t n = edges.size();
  for (int64_t e = 0; e < n; ++e) {
    if (f0 == 0) edges.template prefetch_ahead<kPrefetchLines>(rows, width, e, f0);
    const float* x = rows + edges.other(e) * width + f0;
    const float* ce = c + e * H;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const Vec64<float> cv = edge_weight_lanes<kLevels>(ce, h0[v]);
      const Vec64<float> u = fx[v] + load_vec(x + v * L);
      const auto pos = u > Vec64<float>{};
      a[v] += cv * (pos ? at[v] : ats[v]);
      if constexpr (kAtt) b[v] += cv * (pos ? u : u * slope);
    }
  }
  for (int v = 0; v < NV; ++v) {
    store_vec(d_own + f0 + v * L, a[v]);
    if constexpr (kAtt) store_vec(d_att + f0 + v * L, b[v]);
  }
}

// d_own[0 : H*F] (and d_att unless null) as above; call only where register_tiles_fit. c holds
// n * H weights and kWeightPad readable entries past them.
inline void leaky_grad_row(const EdgeList& edges, const float* c, int64_t H, const HeadLanes& heads, const float* rows,
                           const float* fixed, const float* att, float slope, float* d_own, float* d_att) {
  const int64_t nvec = heads.first.size(), width = nvec * kLanes<float>;
  dispatch_levels(heads, [&](auto levels) {
    for_each_tile(nvec, [&](int64_t v0, auto nv_c) {
      constexpr int NV = decltype(nv_c)::value, kLevels = decltype(levels)::value;
      if (d_att) leaky_grad_tile<NV, kLevels, true>(edges, c, H, heads, v0, rows, width, fixed, att, slope, d_own, d_att);
      else leaky_grad_tile<NV, kLevels, false>(edges, c, H, heads, v0, rows, width, fixed, att, slope, d_own, d_att);
    });
  });
}
#else  // never called (register_tiles_fit is false): the callers' scalar loop runs
struct HeadLanes {
  HeadLanes(int64_t, int64_t) {}
};
struct MulOp {};
struct LeakyAttOp {
  const float* att;
  float slope;
};
template <typename Row>
inline void weighted_row_sum(const Row&, const float*, int64_t, const HeadLanes&, const float*, float*,
                             const float* = nullptr) {}
template <typename Row, typename Op>
inline void head_dots(const Row&, const float*, const float*, int64_t, const HeadLanes&, float*, const Op&) {}
inline void leaky_grad_row(const EdgeList&, const float*, int64_t, const HeadLanes&, const float*, const float*,
                           const float*, float, float*, float*) {}
#endif

// A head vector repeated over a 16-lane vector (16 / HH copies), and the k-th HH lanes of one.
template <int HH, size_t... I>
inline Vec64<float> repeat_heads(const HeadVec<HH>& m, std::index_sequence<I...>) {
  if constexpr (HH == 1) return Vec64<float>{} + m[0];
  else if constexpr (HH == kLanes<float>) return m;
  else return __builtin_shufflevector(m, m, int(I % HH)...);
}
template <int HH, int K, size_t... I>
inline HeadVec<HH> heads_part(const Vec64<float>& p, std::index_sequence<I...>) {
  if constexpr (HH == 1) return HeadVec<1>{p[K]};
  else if constexpr (HH == kLanes<float>) return p;
  else return __builtin_shufflevector(p, p, int(K * HH + I)...);
}
template <int HH, size_t... K>
inline void add_parts(HeadVec<HH>& z, const Vec64<float>& p, std::index_sequence<K...>) {
  ((z += heads_part<HH, int(K)>(p, std::make_index_sequence<HH>{})), ...);  // in edge order
}

// 16 floats at w, written just before edge by edge (HH floats a store), loaded in those pieces
// where they are 4 or 8 floats: a vector load spanning several recent stores waits for them to
// reach the cache (no store forwarding), which cost a fifth of the GAT forward at 8 heads.
template <int HH>
inline Vec64<float> load_edge_pieces(const float* w) {
  if constexpr (HH == 8) {
    const HeadVec<8> a = load_heads<8>(w), b = load_heads<8>(w + 8);
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  } else if constexpr (HH == 4) {
    const HeadVec<8> a = __builtin_shufflevector(load_heads<4>(w), load_heads<4>(w + 4), 0, 1, 2, 3, 4, 5, 6, 7);
    const HeadVec<8> b = __builtin_shufflevector(load_heads<4>(w + 8), load_heads<4>(w + 12), 0, 1, 2, 3, 4, 5, 6, 7);
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  } else {
    return load_vec(w);
  }
}

// w[0 : n*H] (the row's logits, edge after edge) -> exp(w - m), m the per-head max; returns the
// per-head sums z. The exps run on 16-lane vectors, 16 / H edges a vector (the lanes past n*H
// are set to -inf: their exp is 0 and they add nothing); z adds the edges one after another, as
// a loop over edges would. w needs kWeightPad writable entries past n*H (row_buffer).
// kWholeVectors: the caller wrote the logits 16 floats a store, the lanes past n*H set to -inf.
template <int HH, bool kWholeVectors = false>
inline HeadVec<HH> softmax_weights(float* w, int64_t n, const HeadVec<HH>& m) {
  using HV = HeadVec<HH>;
  constexpr int64_t L = kLanes<float>;
  const Vec64<float> mm = repeat_heads<HH>(m, std::make_index_sequence<L>{});
  const int64_t total = n * HH;
  if constexpr (!kWholeVectors)
    for (int64_t q = total; q < (total + L - 1) / L * L; q += HH)  // an edge's worth a store, as the logits
      store_heads<HH>(w + q, HV{} - std::numeric_limits<float>::infinity());
  HV z = HV{};
  for (int64_t q = 0; q < total; q += L) {
    const Vec64<float> p = exp_vec((kWholeVectors ? load_vec(w + q) : load_edge_pieces<HH>(w + q)) - mm);
    store_vec(w + q, p);
    add_parts<HH>(z, p, std::make_index_sequence<L / HH>{});
  }
  return z;
}

#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
constexpr bool kFusedRows8x8 = true;
// An 8 x 8 row's weighted sum keeps 4 vectors of 2 heads each: lane l of vector v takes head 2v + l / 8
// of a pair's first edge (idx[v]) or of its second (idx[4 + v]).
GNNFUSE_ALWAYS_INLINE void head_indices_8x8(__m512i idx[8]) {
  for (int v = 0; v < 4; ++v) {
    idx[v] = _mm512_setr_epi32(2 * v, 2 * v, 2 * v, 2 * v, 2 * v, 2 * v, 2 * v, 2 * v, 2 * v + 1, 2 * v + 1, 2 * v + 1,
                               2 * v + 1, 2 * v + 1, 2 * v + 1, 2 * v + 1, 2 * v + 1);
    idx[4 + v] = _mm512_add_epi32(idx[v], _mm512_set1_epi32(8));
  }
}

// An 8 x 8 row's end: z from the two halves of the exp sums zz (the pairs' first and second edges,
// added in that order), the saved statistics m_row, z_row (zeros for a row without edges) and out_row,
// the weighted sums a times 1 / z. Returns z.
GNNFUSE_ALWAYS_INLINE HeadVec<8> end_row_8x8(const Vec64<float>& zz, const Vec64<float> a[4], const __m512i idx[8],
                                             const HeadVec<8> m, float* out_row, float* m_row, float* z_row) {
  const HeadVec<8> z = heads_part<8, 0>(zz, std::make_index_sequence<8>{}) +
                       heads_part<8, 1>(zz, std::make_index_sequence<8>{});
  store_heads<8>(m_row, z > HeadVec<8>{} ? m : HeadVec<8>{});
  store_heads<8>(z_row, z);
  const HeadVec<8> inv = z > HeadVec<8>{} ? (HeadVec<8>{} + 1.0f) / z : HeadVec<8>{};
  const __m512 iv = _mm512_castps256_ps512((__m256)inv);
  for (int v = 0; v < 4; ++v) store_vec(out_row + 16 * v, a[v] * (Vec64<float>)_mm512_permutexvar_ps(idx[v], iv));
  return z;
}

// finish_row_tiles at 8 heads x 8 features (a row of 4 vectors, each holding 2 heads): the softmax
// weights of two edges (one exp vector) go straight into the weighted sum, no pass storing and
// reloading them; z adds the even edges and the odd edges apart, then the two (a fixed order).
// The weighted sum folds each element edge after edge with the multiply-add weighted_tile uses.
template <bool kWholeVectors, typename Row>
GNNFUSE_ALWAYS_INLINE HeadVec<8> fused_row_8x8(const Params& P, Scratch<float>& S, const Row& row, float* w,
                                               const HeadVec<8> m, const float* values, float* out_row,
                                               float* m_row, float* z_row) {
  using V = Vec64<float>;
  const int64_t n = row.size();
  if constexpr (!kWholeVectors)
    if (n & 1) store_heads<8>(w + n * 8, HeadVec<8>{} - std::numeric_limits<float>::infinity());
  const float* keep = nullptr;
  if (P.threshold) {
    S.fill_keep(P, 8, row);
    S.keep.resize(n * 8 + 8);  // the odd row's last vector reads 8 past (its weights there are 0)
    keep = S.keep.data();
  }
  __m512i idx[8];
  head_indices_8x8(idx);
  const V mm = repeat_heads<8>(m, std::make_index_sequence<16>{});
  V a[4] = {}, zz = {};
  // Edge e's weighted row (half 0: the pair's first edge, 1: its second) into the sums, lanes k only.
  // kWholeVectors (the pair attentions): an odd row's last pair has no second edge; it reads the
  // first edge's row again with k = 0, leaving the sums as they are (no branch on the row's parity,
  // which short rows mispredicted: Cora GATv2 8 x 8 1.05x). GAT keeps the branch (the masked form
  // measured 0.95x on Facebook 8 x 8).
  auto edge = [&](const V& c, int64_t e, int64_t e_row, int half, __mmask16 k) {
    row.template prefetch_ahead<kPrefetchLines>(values, 64, e, 0);
    const float* x = values + row.other(e_row) * 64;
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v)
      a[v] = (V)_mm512_mask3_fmadd_ps(_mm512_permutexvar_ps(idx[4 * half + v], (__m512)c), (__m512)load_vec(x + 16 * v),
                                      (__m512)a[v], k);
  };
  for (int64_t e = 0; e < n; e += 2) {
    const V p = exp_vec16((kWholeVectors ? load_vec(w + e * 8) : load_edge_pieces<8>(w + e * 8)) - mm);
    zz += p;
    const V c = keep ? p * load_vec(keep + e * 8) : p;
    edge(c, e, e, 0, 0xffff);
    const bool second = e + 1 < n;
    if constexpr (kWholeVectors) edge(c, e + 1, second ? e + 1 : e, 1, __mmask16(second ? 0xffff : 0));
    else if (second) edge(c, e + 1, e + 1, 1, 0xffff);
  }
  return end_row_8x8(zz, a, idx, m, out_row, m_row, z_row);
}
#else
constexpr bool kFusedRows8x8 = false;
template <bool kWholeVectors, typename Row>
HeadVec<8> fused_row_8x8(const Params&, Scratch<float>&, const Row&, float*, const HeadVec<8>, const float*, float*,
                         float*, float*) {
  return HeadVec<8>{};  // never called
}
#endif

// The end of a tile forward's row, shared by GAT and the pair attentions: w [n, H] holds the logits
// (already scaled) of the row's edges (`row`, an EdgeList or CsrRow) and m their per-head max (by
// value: a reference kept the caller's running max in memory, a store and a load per edge).
// Softmax weights (one exp per edge and head, z their sum), dropout, the weighted sum of the value
// rows times 1 / z into out_row [H * F], and the saved statistics m_row, z_row [H] (a row without
// edges: zeros). kWholeVectors: as softmax_weights.
template <int HH, bool kWholeVectors = false, typename Row>
inline void finish_row_tiles(const Params& P, Scratch<float>& S, const Row& row, float* w, const HeadVec<HH> m,
                             const HeadLanes& heads, const float* values, float* out_row, float* m_row,
                             float* z_row) {
  using HV = HeadVec<HH>;
  const int64_t n = row.size(), H = HH;
  if constexpr (HH == 8 && kFusedRows8x8) {
    if (heads.first.size() == 4 && heads.levels == 3) {  // 8 features a head
      fused_row_8x8<kWholeVectors>(P, S, row, w, m, values, out_row, m_row, z_row);
      return;
    }
  }
  const HV z = softmax_weights<HH, kWholeVectors>(w, n, m);
  // m and z stored, and 1 / z worked out, before any call: a vector live across a call is kept in
  // memory (no callee-saved vector registers), and GCC then kept the running max and sum there
  // through their loops too.
  store_heads<HH>(m_row, z > HV{} ? m : HV{});
  store_heads<HH>(z_row, z);
  float inv[HH + kWeightPad] = {};  // weighted_row_sum's scale reads whole vectors
  store_heads<HH>(inv, z > HV{} ? (HV{} + 1.0f) / z : HV{});
  if (P.threshold) {
    S.fill_keep(P, H, row);
    const float* keep = S.keep.data();
#pragma omp simd
    for (int64_t q = 0; q < n * H; ++q) w[q] *= keep[q];
  }
  weighted_row_sum(row, w, H, heads, values, out_row, inv);
}

}  // namespace attention_detail
}  // namespace gnnfuse
