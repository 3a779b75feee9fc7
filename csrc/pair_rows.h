// The pair attention's (pair_attention.cpp) float32 forward paths at 8 heads x 8 and 4 heads x 64 features
// on AVX-512 register tiles: two edges' 8 x 8 logits folded together (pair_sums_8x8, pair_logits_8x8, which
// the backwards use too) and the forwards that walk a thread's rows in one loop (pair_rows_8x8,
// pair_rows_4x64). Builds without AVX-512 (F and DQ, GCC) get stubs that are never called (kPairLogits false).
// Included by pair_attention.cpp alone; the op's parameters (Pair) live here so these paths can read them.
#pragma once

#include "attention_common.h"
#include "attention_tiles.h"

namespace gnnfuse {
namespace pair_detail {

using namespace attention_detail;

struct Pair {
  Params P;
  bool gatv2;
  double qk_scale;          // dot: the logit's scale
  bool edge_loops = false;  // the edge features have the self loops' rows (E + loops rows; E rows: zero terms)
};

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__GNUC__) && !defined(__clang__)
// ---- 8 heads x 8 features: two edges' logits at once --------------------------------------------
// head_dot_tile folds an edge's 64 products to its 8 head sums in three halving steps of
// two-source lane permutes, the last one half empty. Here two edges take the same steps together:
// the first adds feature f to f + 4 (128-bit chunk pairs, vshuff32x4), the second f to f + 2 and the
// third f to f + 1 (within 128-bit lanes, vshufps), the third joining the two edges' sums in one
// vector; one permute then puts the 16 sums in edge-major order. Each logit is the same additions
// in the same tree as head_dot_tile's: the same bits (test_attention_cpu_tiles.py checks the tree).
// The forward and both backward passes take their 8 x 8 logits from here. (Facebook 8 x 8, 1
// thread: GATv2 forward 1.2x, dot 1.1x, dot backward 1.1x; prefetching 16 or 64 edges ahead
// instead of 32 was slower.)
constexpr bool kPairLogits = true;

inline __m512 fold_chunks(__m512 a, __m512 b) {  // chunks [a0 + a1, a2 + a3, b0 + b1, b2 + b3]
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}
inline __m512 fold_by_two(__m512 a, __m512 b) {  // each 128-bit lane: [a0 + a2, a1 + a3, b0 + b2, b1 + b3]
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
inline __m512 fold_by_one(__m512 a, __m512 b) {  // each 128-bit lane: [a0 + a1, a2 + a3, b0 + b1, b2 + b3]
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// lane 4c + 2j + i of fold_by_one's result holds edge j's head c + 4i: this permute puts it in
// edge-major order [edge 0's heads, edge 1's heads]
inline __m512i pair_order_8x8() { return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15); }

// Two edges' 8 head sums (unscaled logits), edge-major, from the fixed row's vectors fx (GATv2: and
// att's, at) and the two other endpoints' rows x0, x1: each edge's 64 terms (LeakyAttOp's or MulOp's)
// folded twice (128-bit lane c holding heads c and c + 4, two partial sums each), then the two edges
// together once (fold_by_one) and put in order.
template <bool kGatv2, bool kOrdered = true>
GNNFUSE_ALWAYS_INLINE __m512 pair_sums_8x8(const Vec64<float> fx[4], const Vec64<float> at[4], float slope,
                                           __m512i order, const float* x0, const float* x1) {
  using V = Vec64<float>;
  auto half_folded = [&](const float* x) {
    __m512 p[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const V k = load_vec(x + 16 * v);
      if constexpr (kGatv2) {
        const V u = fx[v] + k;
        p[v] = (__m512)(at[v] * (u > V{} ? u : u * slope));
      } else {
        p[v] = (__m512)(fx[v] * k);
      }
    }
    return fold_by_two(fold_chunks(p[0], p[1]), fold_chunks(p[2], p[3]));
  };
  const __m512 a = half_folded(x0), b = half_folded(x1);
  if constexpr (!kOrdered) return fold_by_one(a, b);  // lane 4c + 2j + i: edge j's head c + 4i
  return _mm512_permutexvar_ps(order, fold_by_one(a, b));
}

// s[e*8 + h] (times scale for the dot product) for the row's edges, as pair_logits then
// scale_row_logits write them, 16 floats a store (an odd row's last store: -inf past n * 8, as
// softmax_weights<8, true> wants them); returns the per-head max. s needs 8 writable entries past
// n * 8.
template <bool kGatv2, typename Row>
GNNFUSE_ALWAYS_INLINE HeadVec<8> pair_logits_8x8(const Row& edges, const float* own, const float* rows,
                                                 const float* att, float slope, float scale, float* s) {
  using V = Vec64<float>;
  V fx[4], at[4];
  for (int v = 0; v < 4; ++v) {
    fx[v] = load_vec(own + 16 * v);
    if constexpr (kGatv2) at[v] = load_vec(att + 16 * v);
  }
  const __m512i order = pair_order_8x8();
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const int64_t n = edges.size();
  for (int64_t e = 0; e < n; e += 2) {
    const int64_t e1 = e + 1 < n ? e + 1 : e;  // an odd row's last edge twice (its copy set to -inf)
    edges.template prefetch_ahead<kPrefetchLines>(rows, 64, e, 0);
    edges.template prefetch_ahead<kPrefetchLines>(rows, 64, e + 1, 0);  // e + 1 = n: bounds-checked, an edge further on
    __m512 sv = pair_sums_8x8<kGatv2>(fx, at, slope, order, rows + edges.other(e) * 64, rows + edges.other(e1) * 64);
    if constexpr (!kGatv2) sv = _mm512_mul_ps(sv, _mm512_set1_ps(scale));
    // no branch on the row's parity (short rows mispredicted it at their last pair)
    sv = _mm512_mask_mov_ps(sv, __mmask16(e1 == e ? 0xff00 : 0), _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
    _mm512_storeu_ps(s + e * 8, sv);
    m = _mm512_max_ps(sv, m);  // sv > m ? sv : m, as scale_row_logits
  }
  const __m256 lo = _mm512_castps512_ps256(m), hi = _mm512_extractf32x8_ps(m, 1);
  return (HeadVec<8>)_mm256_max_ps(hi, lo);
}

// Rows r0 .. r1 software-pipelined by rows (pair_rows_8x8, pair_rows_4x64): row i + 1's logits
// (row_logits(i + 1, its buffer) -> {row_max, self}) come before row i's sums (row_sums(i, its buffer,
// its row_max)) in program order, so the sums (whose exps wait on nothing: the max is known) and the next
// logits are ready together and a row's chains (logits -> max -> exps, z -> 1 / z -> stores) overlap the
// next row's work. w, w2: a row's logits each, swapped row by row. Returns the first row not done: r1, or
// a row with an edge to itself to skip (self_loops), which the caller takes on the general path.
template <typename LogitsFn, typename SumsFn>
GNNFUSE_ALWAYS_INLINE int64_t rows_pipelined(int64_t r0, int64_t r1, bool self_loops, float* w, float* w2,
                                             LogitsFn& row_logits, SumsFn& row_sums) {
  using Logits = decltype(row_logits(r0, w));
  if (r0 >= r1) return r1;
  Logits cur = row_logits(r0, w);
  if (self_loops && cur.self) [[unlikely]]
    return r0;
  float* wc = w;
  float* wn = w2;
  for (int64_t i = r0; i < r1; ++i) {
    Logits next{};
    if (i + 1 < r1) next = row_logits(i + 1, wn);
    row_sums(i, wc, cur.row_max);
    if (self_loops && next.self) [[unlikely]]
      return i + 1;
    cur = next;
    std::swap(wc, wn);
  }
  return r1;
}

// The pair forward at 8 heads x 8 features, rows r0 .. r1 in one loop with nothing called per row (as
// attention.cpp's gat_rows_8x8): a row's logits two edges at a time (pair_sums_8x8) with their max and,
// in the same walk, the test for edges to itself to skip (self loops); then one exp vector per two
// edges, its weights straight into the weighted sum of the value rows (fused_row_8x8's steps), and
// end_row_8x8. Per row the general path (csr_row, pair_logits_8x8, finish_row_tiles) reloaded the
// query's and att's vectors and the permute and exp constants, kept its state through the stack and
// scanned the row for self loops in a loop of its own. The same operations in the same order as that
// path: the same bits. Dropout (kKeep): a pair's 16 keep factors hashed in the loop (fill_keep's
// factors bit for bit). Returns the first row not done: r1, or a row with an edge to itself to skip,
// which the caller takes on the general path. w: the row's logits, (longest row + 2) * 8 floats.
template <typename index_t, bool kGatv2, bool kKeep>
GNNFUSE_ALWAYS_INLINE int64_t pair_rows_8x8(const Pair& A, const float* __restrict q, const float* __restrict k,
                                            const float* __restrict v, const float* __restrict att,
                                            const index_t* __restrict rowptr, const index_t* __restrict col,
                                            float* out, float* m_out, float* z_out, int64_t ahead, int64_t r0,
                                            int64_t r1, int64_t stream_end, float* __restrict w, float* __restrict w2) {
  using V = Vec64<float>;
  const Params& P = A.P;
  const bool self_loops = P.self_loops;
  const int64_t num_loops = P.num_loops, num_edges = P.num_edges;
  const int64_t value_end = v == k ? 0 : stream_end;  // GATv2's values are its keys: just read (and prefetched)
  const uint32_t seed = P.seed, threshold = P.threshold;
  const V kept = V{} + float(P.scale);
  // the logits stay in fold_by_one's lanes (no permute to edge-major order): lane 4c + 2j + i holds
  // edge j's (the pair's first or second) head c + 4i; kSecond: the second edge's lanes
  constexpr __mmask16 kSecond = 0xcccc;
  const UInt16Lanes head_lane{0, 4, 0, 4, 1, 5, 1, 5, 2, 6, 2, 6, 3, 7, 3, 7};
  const __m512i heads_in_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 4, 8, 12, 1, 5, 9, 13);
  const float slope = float(P.slope);
  const __m512 scale = _mm512_set1_ps(float(A.qk_scale)), ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512i order = pair_order_8x8();
  V at[4];
  for (int c = 0; c < 4; ++c) at[c] = kGatv2 ? load_vec(att + 16 * c) : V{};
  __m512i idx[8], inv_idx[4];  // lane l of vector v: head h = 2v + l / 8 of edge j (idx[4j + v]), or its 1 / z
  for (int v4 = 0; v4 < 4; ++v4) {
    alignas(64) int32_t lanes[3][16];
    for (int l = 0; l < 16; ++l) {
      const int h = 2 * v4 + l / 8;
      lanes[0][l] = 4 * (h % 4) + h / 4, lanes[1][l] = lanes[0][l] + 2, lanes[2][l] = lanes[0][l];
    }
    idx[v4] = _mm512_load_si512(lanes[0]), idx[4 + v4] = _mm512_load_si512(lanes[1]);
    inv_idx[v4] = _mm512_load_si512(lanes[2]);
  }
  // Row i's logits into wr (returns their max on the lanes, mm, and whether the row has an edge to itself)
  struct Logits {
    V row_max;
    bool self;
  };
  auto row_logits = [&](int64_t i, float* __restrict wr) __attribute__((always_inline)) {
    // the query row two rows on (the keys' and values' reads in between hide it from the hardware prefetcher)
    if (i + 2 < r1) prefetch_lines<kPrefetchLines>(q + (i + 2) * 64);
    const int64_t begin = rowptr[i], n = int64_t(rowptr[i + 1]) - begin;
    const index_t* nbr = col + begin;
    const int64_t count = n + (i < num_loops ? 1 : 0);  // edge n: the virtual self loop
    V fx[4];
    for (int c = 0; c < 4; ++c) fx[c] = load_vec(q + i * 64 + 16 * c);
    __m512 m = ninf;
    bool self = false;
    for (int64_t e = 0; e < count; e += 2) {
      const int64_t e1 = e + 1 < count ? e + 1 : e;  // an odd row's last edge twice (its copy set to -inf)
      if (begin + e + ahead < stream_end) prefetch_lines<kPrefetchLines>(k + int64_t(col[begin + e + ahead]) * 64);
      if (begin + e + 1 + ahead < stream_end)
        prefetch_lines<kPrefetchLines>(k + int64_t(col[begin + e + 1 + ahead]) * 64);
      const int64_t j0 = e < n ? int64_t(nbr[e]) : i, j1 = e1 < n ? int64_t(nbr[e1]) : i;
      self |= (j0 == i) & (e < n);
      self |= (j1 == i) & (e1 < n);
      __m512 sv = pair_sums_8x8<kGatv2, false>(fx, at, slope, order, k + j0 * 64, k + j1 * 64);
      if constexpr (!kGatv2) sv = _mm512_mul_ps(sv, scale);
      sv = _mm512_mask_mov_ps(sv, __mmask16(e1 == e ? kSecond : 0), ninf);
      _mm512_storeu_ps(wr + e * 8, sv);
      m = _mm512_max_ps(sv, m);
    }
    // the head's max over both edges' lanes: max(second's, first's), as _mm256_max_ps(hi, lo) in edge-major order
    const __m512 m_other = _mm512_permute_ps(m, _MM_SHUFFLE(1, 0, 3, 2));
    return Logits{(V)_mm512_mask_max_ps(_mm512_max_ps(m_other, m), kSecond, m, m_other), self};
  };
  // Row i's softmax weights from its logits wr and max mm, the weighted sum of its value rows, its row end.
  auto row_sums = [&](int64_t i, const float* __restrict wr, const V mm) __attribute__((always_inline)) {
    const int64_t begin = rowptr[i], n = int64_t(rowptr[i + 1]) - begin;
    const index_t* nbr = col + begin;
    const int64_t count = n + (i < num_loops ? 1 : 0);
    V a[4] = {}, zz = {};
    for (int64_t e = 0; e < count; e += 2) {
      const V p = exp_vec16(load_vec(wr + e * 8) - mm);
      zz += p;
      V c = p;
      if constexpr (kKeep) {  // counters id * 8 + h of edges e (lanes of the first) and e + 1 (kSecond)
        const uint32_t id0 = uint32_t(e < n ? begin + e : num_edges + i) * 8u;
        const uint32_t id1 = uint32_t(e + 1 < n ? begin + e + 1 : num_edges + i) * 8u;
        UInt16Lanes h = (UInt16Lanes)_mm512_mask_blend_epi32(kSecond, _mm512_set1_epi32(int(id0)), _mm512_set1_epi32(int(id1))) +
                        head_lane;
        h = fmix32_lanes(fmix32_lanes(h) ^ seed);  // dropout_keep's hash on 16 lanes
        c = p * ((h >> 8) >= threshold ? kept : V{});
      }
      const bool second = e + 1 < count;
      const int64_t j0 = e < n ? int64_t(nbr[e]) : i, j1 = !second ? j0 : e + 1 < n ? int64_t(nbr[e + 1]) : i;
      if (begin + e + ahead < value_end) prefetch_lines<kPrefetchLines>(v + int64_t(col[begin + e + ahead]) * 64);
      if (begin + e + 1 + ahead < value_end)
        prefetch_lines<kPrefetchLines>(v + int64_t(col[begin + e + 1 + ahead]) * 64);
      const float *x0 = v + j0 * 64, *x1 = v + j1 * 64;
      const __mmask16 k1 = __mmask16(second ? 0xffff : 0);
#pragma GCC unroll 4
      for (int c4 = 0; c4 < 4; ++c4)
        a[c4] = (V)_mm512_fmadd_ps(_mm512_permutexvar_ps(idx[c4], (__m512)c), (__m512)load_vec(x0 + 16 * c4),
                                   (__m512)a[c4]);
#pragma GCC unroll 4
      for (int c4 = 0; c4 < 4; ++c4)
        a[c4] = (V)_mm512_mask3_fmadd_ps(_mm512_permutexvar_ps(idx[4 + c4], (__m512)c),
                                         (__m512)load_vec(x1 + 16 * c4), (__m512)a[c4], k1);
    }
    // end_row_8x8 in these lanes: z = first + second (either order: the same bits), m and z stored in head order
    const __m512 z = _mm512_add_ps((__m512)zz, _mm512_permute_ps((__m512)zz, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 z8 = _mm512_permutexvar_ps(heads_in_order, z);
    const __mmask16 pos = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_GT_OQ),
                    pos8 = _mm512_cmp_ps_mask(z8, _mm512_setzero_ps(), _CMP_GT_OQ);
    _mm256_storeu_ps(m_out + i * 8, _mm512_castps512_ps256(_mm512_maskz_permutexvar_ps(pos8, heads_in_order, (__m512)mm)));
    _mm256_storeu_ps(z_out + i * 8, _mm512_castps512_ps256(z8));
    const __m512 inv = _mm512_maskz_div_ps(pos, _mm512_set1_ps(1.0f), z);
    for (int c4 = 0; c4 < 4; ++c4)
      store_vec(out + i * 64 + 16 * c4, a[c4] * (V)_mm512_permutexvar_ps(inv_idx[c4], inv));
  };
  return rows_pipelined(r0, r1, self_loops, w, w2, row_logits, row_sums);
}

// The pair forward at 4 heads x 64 features in the form of pair_rows_8x8 (one loop over a thread's
// rows, pipelined by rows, a row with an edge to itself to skip left to the general path): a row's
// logits in one walk of its keys (all four heads of an edge at once: the query's and att's vectors
// read from memory, not in registers), the exps 4 edges a vector, then one walk of its values with
// the 16 vectors of the weighted sum in registers. The general path walks a row's keys and values
// in four tiles each (a loop, its exit and its prefetch stream per head), and the exps in a pass of
// their own with the dropout factors filled per row. The same operations in the same order as
// head_dot_tile<4, -2>, scale_row_logits, softmax_weights and weighted_tile: the same bits.
template <typename index_t, bool kGatv2, bool kKeep>
GNNFUSE_ALWAYS_INLINE int64_t pair_rows_4x64(const Pair& A, const float* __restrict q, const float* __restrict k,
                                             const float* __restrict v, const float* __restrict att,
                                             const index_t* __restrict rowptr, const index_t* __restrict col,
                                             float* out, float* m_out, float* z_out, int64_t ahead, int64_t r0,
                                             int64_t r1, int64_t stream_end, float* __restrict w,
                                             float* __restrict w2) {
  using V = Vec64<float>;
  using HV = HeadVec<4>;
  constexpr int64_t HF = 256;
  const Params& P = A.P;
  // whole rows (16 lines) prefetched per edge: the whole-row distance (tile_prefetch_ahead's for tiles of
  // 4 lines put 32 KB in flight where the rows come from memory)
  ahead = prefetch_ahead(HF * int64_t(sizeof(float)));
  const bool self_loops = P.self_loops;
  const int64_t num_loops = P.num_loops, num_edges = P.num_edges;
  const int64_t value_end = v == k ? 0 : stream_end;  // GATv2's values are its keys: just read (and prefetched)
  const uint32_t seed = P.seed, threshold = P.threshold;
  const V kept = V{} + float(P.scale);
  const UInt16Lanes head_lane{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  const Int16Lanes edge_lane{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  const float slope = float(P.slope), scale = A.gatv2 ? 1.0f : float(A.qk_scale);
  const HV ninf = HV{} - std::numeric_limits<float>::infinity();
  const __m512i lane0_of_chunks = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
  struct Logits {
    HV row_max;
    bool self;
  };
  auto row_logits = [&](int64_t i, float* __restrict wr) __attribute__((always_inline)) {
    if (i + 2 < r1) prefetch_bytes(q + (i + 2) * HF, HF * int64_t(sizeof(float)));
    const int64_t begin = rowptr[i], n = int64_t(rowptr[i + 1]) - begin;
    const index_t* nbr = col + begin;
    const int64_t count = n + (i < num_loops ? 1 : 0);  // edge n: the virtual self loop
    const float* qi = q + i * HF;
    HV m = ninf;
    bool self = false;
    for (int64_t e = 0; e < count; ++e) {
      if (begin + e + ahead < stream_end) prefetch_lines<16>(k + int64_t(col[begin + e + ahead]) * HF);
      const int64_t j = e < n ? int64_t(nbr[e]) : i;
      self |= (j == i) & (e < n);
      const float* x = k + j * HF;
      __m512 t[4];
#pragma GCC unroll 4
      for (int h = 0; h < 4; ++h) {
        V p[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const int64_t f = 64 * h + 16 * c;
          if constexpr (kGatv2) {
            const V u = load_vec(qi + f) + load_vec(x + f);
            p[c] = load_vec(att + f) * (u > V{} ? u : u * slope);
          } else {
            p[c] = load_vec(qi + f) * load_vec(x + f);
          }
        }
        t[h] = (__m512)((p[0] + p[1]) + (p[2] + p[3]));
      }
      // the four heads' lane sums together, in lane_sum's tree (GCC's _mm512_reduce_add_ps: 256-bit halves
      // added, then 128-bit halves, then elements {2, 3} to {0, 1}, then element 1 to 0): the same bits
      const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)),
                                      _mm512_shuffle_f32x4(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)));
      const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(t[2], t[3], _MM_SHUFFLE(3, 2, 3, 2)),
                                      _mm512_shuffle_f32x4(t[2], t[3], _MM_SHUFFLE(1, 0, 1, 0)));
      const __m512 t6 = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)),
                                      _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)));
      const __m512 t8 = _mm512_add_ps(t6, _mm512_permute_ps(t6, _MM_SHUFFLE(1, 0, 3, 2)));
      const __m512 sums = _mm512_add_ps(t8, _mm512_permute_ps(t8, _MM_SHUFFLE(0, 0, 0, 1)));
      // head_dots: a zero-filled entry += the sum
      HV s = HV{} + (HV)_mm512_castps512_ps128(_mm512_permutexvar_ps(lane0_of_chunks, sums));
      s = s * scale;
      store_heads<4>(wr + e * 4, s);
      m = s > m ? s : m;
    }
    return Logits{m, self};
  };
  auto row_sums = [&](int64_t i, float* __restrict wr, const HV m) __attribute__((always_inline)) {
    const int64_t begin = rowptr[i], n = int64_t(rowptr[i + 1]) - begin;
    const index_t* nbr = col + begin;
    const int64_t count = n + (i < num_loops ? 1 : 0);
    const V mm = repeat_heads<4>(m, std::make_index_sequence<16>{});
    const int64_t total = count * 4;
    for (int64_t t = total; t < (total + 15) / 16 * 16; t += 4) store_heads<4>(wr + t, ninf);
    HV z = HV{};
    for (int64_t t = 0; t < total; t += 16) {  // 4 edges a vector
      const V p = exp_vec16(load_vec(wr + t) - mm);
      V c = p;
      if constexpr (kKeep) {  // counters id * 4 + h, lane 4g + h: edge t / 4 + g (the loop's id for edge n)
        const Int16Lanes e = edge_lane + int32_t(t / 4);
        const UInt16Lanes id = e < int32_t(n) ? (UInt16Lanes)e + uint32_t(begin) : UInt16Lanes{} + uint32_t(num_edges + i);
        UInt16Lanes h = id * 4u + head_lane;
        h = fmix32_lanes(fmix32_lanes(h) ^ seed);  // dropout_keep's hash on 16 lanes
        c = p * ((h >> 8) >= threshold ? kept : V{});
      }
      store_vec(wr + t, c);
      add_parts<4>(z, p, std::make_index_sequence<4>{});
    }
    V a[16];
    for (int c = 0; c < 16; ++c) a[c] = V{};
    for (int64_t e = 0; e < count; ++e) {
      if (begin + e + ahead < value_end) prefetch_lines<16>(v + int64_t(col[begin + e + ahead]) * HF);
      const int64_t j = e < n ? int64_t(nbr[e]) : i;
      const float* x = v + j * HF;
#pragma GCC unroll 4
      for (int h = 0; h < 4; ++h) {
        const V cv = V{} + wr[e * 4 + h];
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) a[4 * h + c] += cv * load_vec(x + 64 * h + 16 * c);
      }
    }
    store_heads<4>(m_out + i * 4, z > HV{} ? m : HV{});
    store_heads<4>(z_out + i * 4, z);
    const HV inv = z > HV{} ? (HV{} + 1.0f) / z : HV{};
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      const V iv = V{} + inv[h];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) store_vec(out + i * HF + 64 * h + 16 * c, a[4 * h + c] * iv);
    }
  };
  return rows_pipelined(r0, r1, self_loops, w, w2, row_logits, row_sums);
}
#else
constexpr bool kPairLogits = false;
template <bool kGatv2, typename Row>
HeadVec<8> pair_logits_8x8(const Row&, const float*, const float*, const float*, float, float, float*) {
  return HeadVec<8>{};  // never called
}
template <typename index_t, bool kGatv2, bool kKeep>
int64_t pair_rows_4x64(const Pair&, const float*, const float*, const float*, const float*, const index_t*,
                       const index_t*, float*, float*, float*, int64_t, int64_t, int64_t r1, int64_t, float*, float*) {
  return r1;  // never called
}
template <typename index_t, bool kGatv2, bool kKeep>
int64_t pair_rows_8x8(const Pair&, const float*, const float*, const float*, const float*, const index_t*,
                      const index_t*, float*, float*, float*, int64_t, int64_t, int64_t r1, int64_t, float*, float*) {
  return r1;  // never called
}
#endif

}  // namespace pair_detail
}  // namespace gnnfuse
