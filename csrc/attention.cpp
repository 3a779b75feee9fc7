// Fused graph attention (GAT) on CPU: gnnfuse.gat_attention.
//
// Per target row i and head h, over the row's incoming edges k (source j = col[k]):
//   s_k = a_src[j,h] + a_dst[i,h] (+ a_edge[k,h]),  e_k = leaky_relu(s_k),
//   p_k = exp(e_k - m_i) / z_i  (softmax over the row),  c_k = p_k * keep_k / (1 - dropout),
//   out[i,h,:] = sum_k c_k x[j,h,:].
// Only m [N_dst, H] and z [N_dst, H] are saved; the backward recomputes every logit. With
// self_loops, existing edges j == i are skipped and each row i < min(N_src, N_dst) gets one
// virtual edge j = i whose edge term is a_loop[i,h] (PyG's remove + add self loops, no graph copy).
//
// Backward, with g = grad_out and D_i = g_i . out_i (per head):
//   ds_k = p_k (keep_k/(1-dropout) g_i . x_j - D_i) * leaky_relu'(s_k)
//   grad_a_dst[i] = sum_k ds_k, grad_a_edge[k] = ds_k       (pass A: rows of the graph)
//   grad_x[j] = sum_k c_k g_i, grad_a_src[j] = sum_k ds_k    (pass B: rows of the transpose)
// Every output row is written by one thread (no atomics): bitwise identical for any thread count.
// Dropout keeps an edge when hash(seed, edge id, head) clears a threshold (csrc/dropout_hash.h),
// so the mask is never stored and matches the Triton kernels bit for bit.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention_common.h"
#include "attention_tiles.h"

namespace gnnfuse {
namespace {

using namespace attention_detail;

// s[n*H + h] = a_node[h] + a_other[other_n, h] (+ the edge term): the logits before leaky_relu.
// a_other's rows are `stride` apart (the transpose pass reads a_dst from a packed per-target row).
template <typename scalar_t, typename other_t, typename acc_t>
void edge_logits(const Params& P, const EdgeList& edges, const scalar_t* a_node, const other_t* a_other,
                 int64_t stride, const scalar_t* a_edge, const scalar_t* a_loop_row, acc_t* s) {
  const int64_t H = P.H, n_edges = edges.size();
  for (int64_t n = 0; n < std::min(kAhead, n_edges); ++n) prefetch_row(a_other + edges[n].other * stride, stride);
  for (int64_t n = 0; n < n_edges; ++n) {
    const Edge& e = edges[n];
    if (n + kAhead < n_edges) prefetch_row(a_other + edges[n + kAhead].other * stride, stride);
    const other_t* ao = a_other + e.other * stride;
    const scalar_t* et = e.pos >= 0 ? (a_edge ? a_edge + e.pos * H : nullptr) : a_loop_row;
    acc_t* sn = s + n * H;
    for (int64_t h = 0; h < H; ++h) sn[h] = acc_t(a_node[h]) + acc_t(ao[h]);
    if (et)
      for (int64_t h = 0; h < H; ++h) sn[h] += acc_t(et[h]);
  }
}

template <typename scalar_t, typename index_t, int FF>
void forward_kernel(const Params& P, const scalar_t* x, const scalar_t* a_src, const scalar_t* a_dst,
                    const scalar_t* a_edge, const scalar_t* a_loop, const index_t* rowptr, const index_t* col,
                    scalar_t* out, at::opmath_type<scalar_t>* m_out, at::opmath_type<scalar_t>* z_out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t H = P.H, F = P.F, HF = H * F;
  const bool tiles = register_tiles_fit<scalar_t, acc_t>(H, F);
  const HeadLanes heads(H, F);
  parallel_over_rows(rowptr, P.num_dst, HF, [&](int64_t r0, int64_t r1) {
    std::vector<acc_t> acc(HF);
    Scratch<acc_t> S;
    acc_t m[kMaxHeads], z[kMaxHeads];
    for (int64_t i = r0; i < r1; ++i) {
      collect_edges(P, rowptr, col, static_cast<const index_t*>(nullptr), i, S.edges, x, HF);
      const int64_t n = S.edges.size();
      S.size_for(H);
      edge_logits(P, S.edges, a_dst + i * H, a_src, H, a_edge, a_loop ? a_loop + i * H : nullptr, S.s.data());
      for (int64_t h = 0; h < H; ++h) m[h] = -std::numeric_limits<acc_t>::infinity(), z[h] = acc_t(0);
      acc_t* w = S.w.data();
      const acc_t slope = acc_t(P.slope);
#pragma omp simd
      for (int64_t q = 0; q < n * H; ++q) w[q] = S.s[q] > acc_t(0) ? S.s[q] : S.s[q] * slope;
      for (int64_t e = 0; e < n; ++e)
        for (int64_t h = 0; h < H; ++h) m[h] = w[e * H + h] > m[h] ? w[e * H + h] : m[h];
      for (int64_t e = 0; e < n; ++e)
        for (int64_t h = 0; h < H; ++h) w[e * H + h] -= m[h];
#pragma omp simd
      for (int64_t q = 0; q < n * H; ++q) w[q] = exp_simd(w[q]);
      for (int64_t e = 0; e < n; ++e)
        for (int64_t h = 0; h < H; ++h) z[h] += w[e * H + h];
      if (P.threshold) {
        S.fill_keep(P, H);
        const acc_t* k = S.keep.data();
#pragma omp simd
        for (int64_t q = 0; q < n * H; ++q) w[q] *= k[q];
      }
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (tiles) weighted_row_sum(S.edges, w, H, heads, x, acc.data());
      }
      if (!tiles) {
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t e = 0; e < n; ++e) {
          if (e + kAhead < n) prefetch_row(x + S.edges[e + kAhead].other * HF, HF);
          const scalar_t* xr = x + S.edges[e].other * HF;
          for (int64_t h = 0; h < H; ++h) axpy<FF>(acc.data() + h * F, xr + h * F, w[e * H + h], F);
        }
      }
      scalar_t* o = out + i * HF;
      for (int64_t h = 0; h < H; ++h) {
        const acc_t inv = z[h] > acc_t(0) ? acc_t(1) / z[h] : acc_t(0);
        for (int64_t f = 0; f < F; ++f) o[h * F + f] = scalar_t(acc[h * F + f] * inv);
        m_out[i * H + h] = z[h] > acc_t(0) ? m[h] : acc_t(0);
        z_out[i * H + h] = z[h];
      }
    }
  });
}

// ---- float rows on register tiles (attention_tiles.h), H in 1, 2, 4, 8, 16 ------------------------
// Same maths as the kernels above. Each edge's H logits, softmax weights and gradients are one
// head vector (HeadVec); the row max is found while the logits are made (GAT's need no feature
// reads), then one exp per edge and head; the feature-wide work (weighted sums, per-head dot
// products) runs in register tiles.

// The pre-activation logits of edge E: a_node + a_other[E.other] (+ the edge term).
template <int HH>
inline HeadVec<HH> gat_logit(const HeadVec<HH>& a_node, const float* a_other, int64_t stride, const Edge& E,
                             const float* a_edge, const float* a_loop_row) {
  HeadVec<HH> s = a_node + load_heads<HH>(a_other + E.other * stride);
  const float* et = E.pos >= 0 ? (a_edge ? a_edge + E.pos * HH : nullptr) : a_loop_row;
  if (et) s += load_heads<HH>(et);
  return s;
}

// w[e*H : (e+1)*H] = leaky_relu of the row's logits (edge n: the virtual loop, if any); returns
// their per-head max. (Arguments by value: GCC then keeps the walk and the max in registers.)
template <int HH, typename index_t>
GNNFUSE_ALWAYS_INLINE HeadVec<HH> gat_row_logits(const CsrRow<index_t> row, const HeadVec<HH> ad,
                                                 const float* __restrict a_src, const float* __restrict a_edge,
                                                 const float* __restrict a_loop, const float slope,
                                                 float* __restrict w) {
  using HV = HeadVec<HH>;
  constexpr int64_t H = HH;
  HV m = HV{} - std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < row.n; ++e) {
    row.template prefetch_ahead<1>(a_src, H, e, 0);
    HV s = ad + load_heads<HH>(a_src + int64_t(row.nbr[e]) * H);
    if (a_edge) s += load_heads<HH>(a_edge + row.pos(e) * H);
    const HV a = lrelu_heads<HH>(s, slope);
    store_heads<HH>(w + e * H, a);
    m = a > m ? a : m;
  }
  if (row.count > row.n) {  // the virtual self loop
    HV s = ad + load_heads<HH>(a_src + row.node * H);
    if (a_loop) s += load_heads<HH>(a_loop + row.node * H);
    const HV a = lrelu_heads<HH>(s, slope);
    store_heads<HH>(w + row.n * H, a);
    m = a > m ? a : m;
  }
  return m;
}

// (AVX512DQ: _mm512_broadcast_f32x8)
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__GNUC__) && !defined(__clang__)
// GAT's forward at 8 heads x 8 features, rows r0 .. r1 in one loop with nothing called per row: the
// row's logits (and the test for self loops to skip, in the same walk of its edges, not a walk of its
// own), their max, and fused_row_8x8's softmax and weighted sum. Per row the general path (csr_row,
// gat_row_logits, finish_row_tiles) reloaded its state through the lambda captures and the stack (the
// row max was stored and reloaded twice before the exps), set up the weighted sum's lane indices and
// exp constants, and scanned the row for self loops in a loop of its own (one more mispredicted loop
// exit per row). The same operations in the same order as that path: the same bits. The max is kept
// on 16 lanes (the edge's 8 logits in both halves: the same sequential max, and the exp's shift needs
// no shuffle). Dropout (kKeep): a pair's 16 keep factors hashed in the pair loop (dropout_keep's mask
// and fill_keep's factors, bit for bit). Returns the first row not done: r1, or a row with an edge to
// itself to skip (with self_loops), which the caller takes on the general path (no call in this loop:
// every vector live across a call is kept in memory).
template <typename index_t, bool kEdge, bool kKeep>
GNNFUSE_ALWAYS_INLINE int64_t gat_rows_8x8(const Params& P, const float* __restrict x, const float* __restrict a_src,
                                        const float* __restrict a_dst, const float* __restrict a_edge,
                                        const float* __restrict a_loop, const index_t* __restrict rowptr,
                                        const index_t* __restrict col, float* out, float* m_out, float* z_out,
                                        int64_t ahead, int64_t r0, int64_t r1, int64_t stream_end,
                                        float* __restrict w) {
  using V = Vec64<float>;
  using HV = HeadVec<8>;
  const bool self_loops = P.self_loops;
  const int64_t num_loops = P.num_loops;
  const uint32_t seed = P.seed, threshold = P.threshold;
  const V kept = V{} + float(P.scale);
  const UInt16Lanes head_lane{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7};
  const V slope = V{} + float(P.slope), ninf = V{} - std::numeric_limits<float>::infinity();
  __m512i idx[8];
  head_indices_8x8(idx);
  auto twice = [](const float* p) { return (V)_mm512_broadcast_f32x8(_mm256_loadu_ps(p)); };
  auto lower = [](const V& v) { return (HV)_mm512_castps512_ps256((__m512)v); };
  for (int64_t i = r0; i < r1; ++i) {
    const int64_t begin = rowptr[i], n = int64_t(rowptr[i + 1]) - begin;
    const index_t* nbr = col + begin;
    const V ad = twice(a_dst + i * 8);
    V m = ninf;
    bool self = false;
    for (int64_t e = 0; e < n; ++e) {
      const int64_t q = begin + e + ahead;
      if (q < stream_end) prefetch_lines<1>(a_src + int64_t(col[q]) * 8);
      const int64_t j = nbr[e];
      self |= j == i;
      V s = ad + twice(a_src + j * 8);
      if constexpr (kEdge) s += twice(a_edge + (begin + e) * 8);
      const V a = s > V{} ? s : s * slope;
      store_heads<8>(w + e * 8, lower(a));
      m = a > m ? a : m;
    }
    if (self_loops && self) [[unlikely]]
      return i;
    int64_t count = n;
    if (i < num_loops) {  // the virtual self loop
      V s = ad + twice(a_src + i * 8);
      if (a_loop) s += twice(a_loop + i * 8);
      const V a = s > V{} ? s : s * slope;
      store_heads<8>(w + n * 8, lower(a));
      m = a > m ? a : m;
      count = n + 1;
    }
    if (count & 1) store_heads<8>(w + count * 8, lower(ninf));
    V a[4] = {}, zz = {};
    auto edge = [&](const V& c, int64_t e, int half) {
      const int64_t q = begin + e + ahead;
      if (q < stream_end) prefetch_lines<kPrefetchLines>(x + int64_t(col[q]) * 64);
      const float* xr = x + (e < n ? int64_t(nbr[e]) : i) * 64;
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v)
        a[v] = (V)_mm512_fmadd_ps(_mm512_permutexvar_ps(idx[4 * half + v], (__m512)c), (__m512)load_vec(xr + 16 * v),
                                  (__m512)a[v]);
    };
    for (int64_t e = 0; e < count; e += 2) {
      const V p = exp_vec16(load_edge_pieces<8>(w + e * 8) - m);
      zz += p;
      V c = p;
      if constexpr (kKeep) {  // counters id * 8 + h of edges e (lanes 0-7) and e + 1 (lanes 8-15)
        const uint32_t id0 = uint32_t(e < n ? begin + e : P.num_edges + i) * 8u;
        const uint32_t id1 = uint32_t(e + 1 < n ? begin + e + 1 : P.num_edges + i) * 8u;
        UInt16Lanes h = (UInt16Lanes)_mm512_inserti32x8(_mm512_set1_epi32(int(id0)), _mm256_set1_epi32(int(id1)), 1) +
                        head_lane;
        h = fmix32_lanes(fmix32_lanes(h) ^ seed);  // dropout_keep's hash on 16 lanes
        c = p * ((h >> 8) >= threshold ? kept : V{});
      }
      edge(c, e, 0);
      if (e + 1 < count) edge(c, e + 1, 1);
    }
    end_row_8x8(zz, a, idx, lower(m), out + i * 64, m_out + i * 8, z_out + i * 8);
  }
  return r1;
}

// GAT's forward at 4 heads x 64 features, rows r0 .. r1 in one loop as gat_rows_8x8 (nothing called per
// row, the self-loop test in the logit walk, the row max in a register), with finish_row_tiles' maths in
// its order: the exps on 16 lanes (4 edges a vector, lanes past the row's edges -inf), z adding the
// edges one after another, dropout's keep factors (hashed here, 4 edges a vector), then the weighted sum
// of the row's 1 KB value rows in one walk of its edges with all 16 accumulators in registers (the
// general path walked the row 4 times, a head a walk, through a call per row and a per-vector lookup of
// its head), each element folded edge after edge with the same multiply-add, and times 1 / z at the
// end: the same bits. The walk prefetches a row's first 4 lines `ahead` edges on, as the sum does (the
// hardware prefetcher streams the rest): the whole 1 KB row took Cora 1.18x and Facebook 1.12x longer,
// 8 lines Facebook 1.02x (1 thread, same process). Returns as gat_rows_8x8.
template <typename index_t, bool kEdge, bool kKeep>
GNNFUSE_ALWAYS_INLINE int64_t gat_rows_4x64(const Params& P, const float* __restrict x, const float* __restrict a_src,
                                         const float* __restrict a_dst, const float* __restrict a_edge,
                                         const float* __restrict a_loop, const index_t* __restrict rowptr,
                                         const index_t* __restrict col, float* out, float* m_out, float* z_out,
                                         int64_t ahead, int64_t r0, int64_t r1, int64_t stream_end,
                                         float* __restrict w) {
  using V = Vec64<float>;
  using HV = HeadVec<4>;
  const bool self_loops = P.self_loops;
  const int64_t num_loops = P.num_loops;
  const uint32_t seed = P.seed, threshold = P.threshold;
  const V kept = V{} + float(P.scale);
  const Int16Lanes lane{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const float slope = float(P.slope), ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = r0; i < r1; ++i) {
    const int64_t begin = rowptr[i], n = int64_t(rowptr[i + 1]) - begin;
    const index_t* nbr = col + begin;
    const HV ad = load_heads<4>(a_dst + i * 4);
    HV m = HV{} + ninf;
    bool self = false;
    for (int64_t e = 0; e < n; ++e) {
      const int64_t q = begin + e + ahead;
      if (q < stream_end) prefetch_lines<1>(a_src + int64_t(col[q]) * 4);
      const int64_t j = nbr[e];
      self |= j == i;
      HV s = ad + load_heads<4>(a_src + j * 4);
      if constexpr (kEdge) s += load_heads<4>(a_edge + (begin + e) * 4);
      const HV a = lrelu_heads<4>(s, slope);
      store_heads<4>(w + e * 4, a);
      m = a > m ? a : m;
    }
    if (self_loops && self) [[unlikely]]
      return i;
    int64_t count = n;
    if (i < num_loops) {  // the virtual self loop
      HV s = ad + load_heads<4>(a_src + i * 4);
      if (a_loop) s += load_heads<4>(a_loop + i * 4);
      const HV a = lrelu_heads<4>(s, slope);
      store_heads<4>(w + n * 4, a);
      m = a > m ? a : m;
      count = n + 1;
    }
    const int64_t total = count * 4;
    for (int64_t q = total; q < (total + 15) / 16 * 16; q += 4) store_heads<4>(w + q, HV{} + ninf);
    const V mm = (V)_mm512_broadcast_f32x4((__m128)m);  // (a shufflevector went through the stack)
    HV z = HV{};
    for (int64_t q = 0; q < total; q += 16) {
      const V p = exp_vec16(load_edge_pieces<4>(w + q) - mm);
      z += __builtin_shufflevector(p, p, 0, 1, 2, 3);
      z += __builtin_shufflevector(p, p, 4, 5, 6, 7);
      z += __builtin_shufflevector(p, p, 8, 9, 10, 11);
      z += __builtin_shufflevector(p, p, 12, 13, 14, 15);
      V c = p;
      if constexpr (kKeep) {  // counters id * 4 + h of edges q / 4 .. q / 4 + 3 (the loop's id: E + i)
        const Int16Lanes loop = lane >= int(n * 4 - q);
        const UInt16Lanes real = UInt16Lanes{} + uint32_t(begin * 4 + q) + (UInt16Lanes)lane;
        const UInt16Lanes own = UInt16Lanes{} + uint32_t(P.num_edges + i) * 4u + (UInt16Lanes)(lane & 3);
        UInt16Lanes h = loop ? own : real;
        h = fmix32_lanes(fmix32_lanes(h) ^ seed);  // dropout_keep's hash on 16 lanes
        c = p * ((h >> 8) >= threshold ? kept : V{});
      }
      store_vec(w + q, c);
    }
    V a[16] = {};
    for (int64_t e = 0; e < count; ++e) {
      const int64_t q = begin + e + ahead;
      if (q < stream_end) prefetch_lines<4>(x + int64_t(col[q]) * 256);
      const float* xr = x + (e < n ? int64_t(nbr[e]) : i) * 256;
#pragma GCC unroll 4
      for (int h = 0; h < 4; ++h) {
        const __m512 c = _mm512_set1_ps(w[e * 4 + h]);
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v)
          a[4 * h + v] = (V)_mm512_fmadd_ps(c, (__m512)load_vec(xr + 64 * h + 16 * v), (__m512)a[4 * h + v]);
      }
    }
    store_heads<4>(m_out + i * 4, z > HV{} ? m : HV{});
    store_heads<4>(z_out + i * 4, z);
    const HV inv = z > HV{} ? (HV{} + 1.0f) / z : HV{};
    float* o = out + i * 256;
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      const V iv = V{} + inv[h];
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) store_vec(o + 64 * h + 16 * v, a[4 * h + v] * iv);
    }
  }
  return r1;
}
#endif

template <typename index_t, int HH>
void forward_tiles(const Params& P, const float* x, const float* a_src, const float* a_dst, const float* a_edge,
                   const float* a_loop, const index_t* rowptr, const index_t* col, float* out, float* m_out,
                   float* z_out) {
  using HV = HeadVec<HH>;
  const int64_t H = HH, F = P.F, HF = H * F;
  const HeadLanes heads(H, F);
  const float slope = float(P.slope);
  const int64_t ahead = tile_prefetch_ahead(HF, P.num_src);
  parallel_over_rows(rowptr, P.num_dst, HF, [&](int64_t r0, int64_t r1) {
    Scratch<float> S;
    RowCopy<index_t> copy;
    const int64_t stream_end = rowptr[r1];
    auto gat_row = [&](int64_t i) {
      const CsrRow<index_t> row = csr_row(P, rowptr, col, i, stream_end, ahead, copy);
      float* w = row_buffer(S.w, row.count * H);
      const HV m = gat_row_logits<HH>(row, load_heads<HH>(a_dst + i * H), a_src, a_edge, a_loop, slope, w);
      finish_row_tiles<HH>(P, S, row, w, m, heads, x, out + i * HF, m_out + i * H, z_out + i * H);
    };
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__GNUC__) && !defined(__clang__)
    if constexpr (HH == 8 || HH == 4) {
      if (HH == 8 ? F == 8 : F == 64) {  // 8 x 8 or 4 x 64
        int64_t longest = 0;
        for (int64_t i = r0; i < r1; ++i) longest = std::max<int64_t>(longest, int64_t(rowptr[i + 1]) - rowptr[i]);
        std::vector<float> logits((longest + 4) * H);  // a row's logits (and the -inf pad past them)
        for (int64_t i = r0; i < r1;) {
          auto rows = [&](auto edge_c, auto keep_c) {
            constexpr bool kEdge = decltype(edge_c)::value, kKeep = decltype(keep_c)::value;
            if constexpr (HH == 8)
              return gat_rows_8x8<index_t, kEdge, kKeep>(P, x, a_src, a_dst, a_edge, a_loop, rowptr, col, out, m_out,
                                                          z_out, ahead, i, r1, stream_end, logits.data());
            else
              return gat_rows_4x64<index_t, kEdge, kKeep>(P, x, a_src, a_dst, a_edge, a_loop, rowptr, col, out, m_out,
                                                           z_out, ahead, i, r1, stream_end, logits.data());
          };
          using yes = std::true_type;
          using no = std::false_type;
          if (P.threshold) i = a_edge ? rows(yes{}, yes{}) : rows(no{}, yes{});
          else i = a_edge ? rows(yes{}, no{}) : rows(no{}, no{});
          if (i < r1) gat_row(i++);
        }
        return;
      }
    }
#endif
    for (int64_t i = r0; i < r1; ++i) gat_row(i);
  });
}

struct Grads {
  void *x, *a_src, *a_dst, *a_edge, *a_loop;
};

// Pass A (rows of the graph): D_i = g_i . out_i, and with per_edge grad_a_dst, grad_a_edge, grad_a_loop.
template <typename scalar_t, typename index_t, int FF>
void backward_rows(const Params& P, const scalar_t* g, const scalar_t* out, const at::opmath_type<scalar_t>* m,
                   const at::opmath_type<scalar_t>* z, const scalar_t* x, const scalar_t* a_src, const scalar_t* a_dst,
                   const scalar_t* a_edge, const scalar_t* a_loop, const index_t* rowptr, const index_t* col,
                   at::opmath_type<scalar_t>* T, Grads G, bool per_edge) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t H = P.H, F = P.F, HF = H * F;
  auto* gd = static_cast<scalar_t*>(G.a_dst);
  auto* ge = static_cast<scalar_t*>(G.a_edge);
  auto* gl = static_cast<scalar_t*>(G.a_loop);
  parallel_over_rows(rowptr, P.num_dst, per_edge ? HF : 1, [&](int64_t r0, int64_t r1) {
    Scratch<acc_t> S;
    acc_t acc[kMaxHeads];
    for (int64_t i = r0; i < r1; ++i) {
      const scalar_t* gi = g + i * HF;
      acc_t D[kMaxHeads];
      for (int64_t h = 0; h < H; ++h) {
        D[h] = dot<FF, acc_t>(gi + h * F, out + i * HF + h * F, F), acc[h] = 0;
        acc_t* t = T + i * 4 * H;  // the transpose pass reads these four per-target values together
        t[h] = acc_t(a_dst[i * H + h]), t[H + h] = m[i * H + h], t[3 * H + h] = D[h];
        t[2 * H + h] = z[i * H + h] > acc_t(0) ? acc_t(1) / z[i * H + h] : acc_t(0);
      }
      if (!per_edge) continue;
      collect_edges(P, rowptr, col, static_cast<const index_t*>(nullptr), i, S.edges, x, HF);
      const int64_t n = S.edges.size();
      S.size_for(H);
      S.fill_keep(P, H);
      edge_logits(P, S.edges, a_dst + i * H, a_src, H, a_edge, a_loop ? a_loop + i * H : nullptr, S.s.data());
      acc_t* w = S.w.data();
      for (int64_t e = 0; e < n; ++e)
        for (int64_t h = 0; h < H; ++h) w[e * H + h] = P.lrelu(S.s[e * H + h]) - m[i * H + h];
#pragma omp simd
      for (int64_t q = 0; q < n * H; ++q) w[q] = exp_simd(w[q]);
      for (int64_t e = 0; e < n; ++e) {
        const Edge& E = S.edges[e];
        if (e + kAhead < n) prefetch_row(x + S.edges[e + kAhead].other * HF, HF);
        const scalar_t* xj = x + E.other * HF;
        for (int64_t h = 0; h < H; ++h) {
          const acc_t p = w[e * H + h] / z[i * H + h];
          const acc_t gx = dot<FF, acc_t>(gi + h * F, xj + h * F, F);
          const acc_t ds = p * (S.keep[e * H + h] * gx - D[h]) * P.dlrelu(S.s[e * H + h]);
          acc[h] += ds;
          if (E.pos >= 0 && ge) ge[E.pos * H + h] = scalar_t(ds);
          if (E.pos < 0 && gl) gl[i * H + h] = scalar_t(ds);
        }
      }
      if (gd)
        for (int64_t h = 0; h < H; ++h) gd[i * H + h] = scalar_t(acc[h]);
    }
  });
}

// Pass B (rows of the transpose, i.e. sources): grad_x and grad_a_src.
template <typename scalar_t, typename index_t, int FF>
void backward_sources(const Params& P, const scalar_t* g, const scalar_t* x, const scalar_t* a_src,
                      const scalar_t* a_edge, const scalar_t* a_loop, const index_t* t_rowptr, const index_t* t_col,
                      const index_t* t_pos, const at::opmath_type<scalar_t>* T, Grads G) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t H = P.H, F = P.F, HF = H * F;
  auto* gx = static_cast<scalar_t*>(G.x);
  auto* gs = static_cast<scalar_t*>(G.a_src);
  parallel_over_rows(t_rowptr, P.num_src, HF, [&](int64_t r0, int64_t r1) {
    std::vector<acc_t> acc(HF);
    Scratch<acc_t> S;
    acc_t acc_s[kMaxHeads];
    for (int64_t j = r0; j < r1; ++j) {
      collect_edges(P, t_rowptr, t_col, t_pos, j, S.edges, g, HF);
      const int64_t n = S.edges.size();
      S.size_for(H);
      S.fill_keep(P, H);
      // a_loop's row for j's own loop is j's row (the loop's target is j)
      edge_logits(P, S.edges, a_src + j * H, T, 4 * H, a_edge, a_loop ? a_loop + j * H : nullptr, S.s.data());
      acc_t* w = S.w.data();
      for (int64_t e = 0; e < n; ++e) {
        const acc_t* t = T + S.edges[e].other * 4 * H;
        for (int64_t h = 0; h < H; ++h) w[e * H + h] = P.lrelu(S.s[e * H + h]) - t[H + h];
      }
#pragma omp simd
      for (int64_t q = 0; q < n * H; ++q) w[q] = exp_simd(w[q]);
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t h = 0; h < H; ++h) acc_s[h] = 0;
      const scalar_t* xj = x + j * HF;
      for (int64_t e = 0; e < n; ++e) {
        const Edge& E = S.edges[e];
        if (e + kAhead < n) prefetch_row(g + S.edges[e + kAhead].other * HF, HF);
        const scalar_t* gi = g + E.other * HF;
        const acc_t* t = T + E.other * 4 * H;
        for (int64_t h = 0; h < H; ++h) {
          const acc_t p = w[e * H + h] * t[2 * H + h];
          const acc_t keep = S.keep[e * H + h];
          if (gx) axpy<FF>(acc.data() + h * F, gi + h * F, p * keep, F);
          if (gs)
            acc_s[h] += p * (keep * dot<FF, acc_t>(gi + h * F, xj + h * F, F) - t[3 * H + h]) *
                        P.dlrelu(S.s[e * H + h]);
        }
      }
      if (gx)
        for (int64_t f = 0; f < HF; ++f) gx[j * HF + f] = scalar_t(acc[f]);
      if (gs)
        for (int64_t h = 0; h < H; ++h) gs[j * H + h] = scalar_t(acc_s[h]);
    }
  });
}

// Pass A on register tiles: the dot products g_i . x_j per head in one tile pass over the row,
// then one pass over the edges for the logits, weights and ds.
template <typename index_t, int HH>
void backward_rows_tiles(const Params& P, const float* g, const float* out, const float* m, const float* z,
                         const float* x, const float* a_src, const float* a_dst, const float* a_edge,
                         const float* a_loop, const index_t* rowptr, const index_t* col, float* T, Grads G,
                         bool per_edge) {
  using HV = HeadVec<HH>;
  const int64_t H = HH, F = P.F, HF = H * F;
  const HeadLanes heads(H, F);
  auto* gd = static_cast<float*>(G.a_dst);
  auto* ge = static_cast<float*>(G.a_edge);
  auto* gl = static_cast<float*>(G.a_loop);
  const float slope = float(P.slope);
  parallel_over_rows(rowptr, P.num_dst, per_edge ? HF : 1, [&](int64_t r0, int64_t r1) {
    Scratch<float> S;
    for (int64_t i = r0; i < r1; ++i) {
      const float* gi = g + i * HF;
      float* t = T + i * 4 * H;  // the transpose pass reads these four per-target values together
      for (int64_t h = 0; h < H; ++h) {
        t[h] = a_dst[i * H + h], t[H + h] = m[i * H + h];
        t[2 * H + h] = z[i * H + h] > 0.0f ? 1.0f / z[i * H + h] : 0.0f;
        t[3 * H + h] = dot<0, float>(gi + h * F, out + i * HF + h * F, F);
      }
      if (!per_edge) continue;
      collect_edges(P, rowptr, col, static_cast<const index_t*>(nullptr), i, S.edges, x, HF);
      prefetch_next_row(rowptr, col, i + 1, r1, x, HF, a_src, H);
      const int64_t n = S.edges.size();
      S.fill_keep(P, H);
      float* dots = row_buffer(S.dots, n * H);
      head_dots(S.edges, x, gi, H, heads, dots, MulOp{});
      const HV ad = load_heads<HH>(t), mi = load_heads<HH>(t + H), invz = load_heads<HH>(t + 2 * H),
               D = load_heads<HH>(t + 3 * H);
      const float* loop_row = a_loop ? a_loop + i * H : nullptr;
      HV acc = HV{};
      for (int64_t e = 0; e < n; ++e) {
        const Edge& E = S.edges[e];
        const HV s = gat_logit<HH>(ad, a_src, H, E, a_edge, loop_row);
        const HV p = exp_vec(lrelu_heads<HH>(s, slope) - mi) * invz;
        const HV ds = p * (load_heads<HH>(S.keep.data() + e * H) * load_heads<HH>(dots + e * H) - D) *
                      dlrelu_heads<HH>(s, slope);
        acc += ds;
        float* dst = E.pos >= 0 ? (ge ? ge + E.pos * H : nullptr) : (gl ? gl + i * H : nullptr);
        if (dst) store_heads<HH>(dst, ds);
      }
      if (gd) store_heads<HH>(gd + i * H, acc);
    }
  });
}

// Pass B on register tiles: grad_x as a weighted sum of g rows, grad_a_src from the dot products
// g_i . x_j per head.
template <typename index_t, int HH>
void backward_sources_tiles(const Params& P, const float* g, const float* x, const float* a_src,
                            const float* a_edge, const float* a_loop, const index_t* t_rowptr, const index_t* t_col,
                            const index_t* t_pos, const float* T, Grads G) {
  using HV = HeadVec<HH>;
  const int64_t H = HH, F = P.F, HF = H * F;
  const HeadLanes heads(H, F);
  auto* gx = static_cast<float*>(G.x);
  auto* gs = static_cast<float*>(G.a_src);
  const float slope = float(P.slope);
  parallel_over_rows(t_rowptr, P.num_src, HF, [&](int64_t r0, int64_t r1) {
    Scratch<float> S;
    for (int64_t j = r0; j < r1; ++j) {
      collect_edges(P, t_rowptr, t_col, t_pos, j, S.edges, g, HF);
      prefetch_next_row(t_rowptr, t_col, j + 1, r1, g, HF, T, 4 * H);
      const int64_t n = S.edges.size();
      S.fill_keep(P, H);
      float* c = row_buffer(S.c, n * H);   // p * keep: grad_x's weights
      float* pd = row_buffer(S.w, n * H);  // p * leaky_relu'(s): grad_a_src's
      const HV as = load_heads<HH>(a_src + j * H);
      const float* loop_row = a_loop ? a_loop + j * H : nullptr;  // j's own loop: its target is j
      for (int64_t e = 0; e < n; ++e) {
        const float* t = T + S.edges[e].other * 4 * H;
        if (e + kAhead < n) prefetch_row(T + S.edges[e + kAhead].other * 4 * H, 4 * H);
        const HV s = gat_logit<HH>(as, T, 4 * H, S.edges[e], a_edge, loop_row);
        const HV p = exp_vec(lrelu_heads<HH>(s, slope) - load_heads<HH>(t + H)) * load_heads<HH>(t + 2 * H);
        store_heads<HH>(c + e * H, p * load_heads<HH>(S.keep.data() + e * H));
        store_heads<HH>(pd + e * H, p * dlrelu_heads<HH>(s, slope));
      }
      if (gx) weighted_row_sum(S.edges, c, H, heads, g, gx + j * HF);
      if (gs) {
        float* dots = row_buffer(S.dots, n * H);
        head_dots(S.edges, g, x + j * HF, H, heads, dots, MulOp{});
        HV acc = HV{};
        for (int64_t e = 0; e < n; ++e) {
          const float* t = T + S.edges[e].other * 4 * H;
          acc += load_heads<HH>(pd + e * H) *
                 (load_heads<HH>(S.keep.data() + e * H) * load_heads<HH>(dots + e * H) - load_heads<HH>(t + 3 * H));
        }
        store_heads<HH>(gs + j * H, acc);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_forward(
    const at::Tensor& x, const at::Tensor& a_src, const at::Tensor& a_dst, const c10::optional<at::Tensor>& a_edge,
    const c10::optional<at::Tensor>& a_loop, const at::Tensor& rowptr, const at::Tensor& col, bool self_loops,
    double slope, double dropout, int64_t seed) {
  const Params P = make_params(x, rowptr, col, self_loops, slope, dropout, seed);
  auto out = at::empty({P.num_dst, P.H, P.F}, x.options());
  const auto stat = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;  // acc_t
  auto m = at::empty({P.num_dst, P.H}, x.options().dtype(stat));
  auto z = at::empty({P.num_dst, P.H}, x.options().dtype(stat));
  if (x.scalar_type() == at::kFloat && head_vectors_fit(P.H) && register_tiles_fit<float, float>(P.H, P.F)) {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gat_forward_index", [&] {
      dispatch_heads(P.H, [&](auto hh) {
        forward_tiles<index_t, decltype(hh)::value>(
            P, x.data_ptr<float>(), a_src.data_ptr<float>(), a_dst.data_ptr<float>(), ptr_or_null<float>(a_edge),
            ptr_or_null<float>(a_loop), rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(), out.data_ptr<float>(),
            m.data_ptr<float>(), z.data_ptr<float>());
      });
    });
    return {out, m, z};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gat_forward", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gat_forward_index", [&] {
      dispatch_width(P.F, [&](auto ff) {
      forward_kernel<scalar_t, index_t, decltype(ff)::value>(P, x.data_ptr<scalar_t>(), a_src.data_ptr<scalar_t>(),
                                        a_dst.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(a_edge),
                                        ptr_or_null<scalar_t>(a_loop), rowptr.data_ptr<index_t>(),
                                        col.data_ptr<index_t>(), out.data_ptr<scalar_t>(),
                                        m.data_ptr<at::opmath_type<scalar_t>>(), z.data_ptr<at::opmath_type<scalar_t>>());
      });
    });
  });
  return {out, m, z};
}

// needs: (x, a_src, a_dst, a_edge, a_loop); a gradient not needed comes back as an empty tensor.
std::vector<at::Tensor> gat_backward(const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& m,
                                     const at::Tensor& z, const at::Tensor& x, const at::Tensor& a_src,
                                     const at::Tensor& a_dst, const c10::optional<at::Tensor>& a_edge,
                                     const c10::optional<at::Tensor>& a_loop, const at::Tensor& rowptr,
                                     const at::Tensor& col, const at::Tensor& t_rowptr, const at::Tensor& t_col,
                                     const at::Tensor& t_pos, bool self_loops, double slope, double dropout,
                                     int64_t seed, std::vector<bool> needs) {
  const Params P = make_params(x, rowptr, col, self_loops, slope, dropout, seed);
  TORCH_CHECK(needs.size() == 5, "gat_attention_backward: needs must have 5 entries");
  TORCH_CHECK(t_rowptr.numel() - 1 == P.num_src, "gat_attention_backward: the transpose must have N_src rows");
  auto maybe = [&](bool need, const at::Tensor& like) { return need ? at::empty_like(like) : x.new_empty({0}); };
  const bool need_edge = needs[3] && a_edge.has_value(), need_loop = needs[4] && a_loop.has_value();
  std::vector<at::Tensor> grads = {maybe(needs[0], x), maybe(needs[1], a_src), maybe(needs[2], a_dst),
                                   need_edge ? at::zeros_like(*a_edge)  // skipped self loops keep 0
                                              : x.new_empty({0}),
                                   need_loop ? at::zeros_like(*a_loop) : x.new_empty({0})};
  // per target: a_dst, row max, 1 / row sum, D = g . out (per head, acc_t), packed for the transpose pass
  auto T = at::empty({P.num_dst, 4 * P.H}, m.options());
  auto g = grad_out.contiguous();
  auto ptr = [](const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; };
  Grads G{ptr(grads[0]), ptr(grads[1]), ptr(grads[2]), ptr(grads[3]), ptr(grads[4])};
  const bool per_edge = G.a_dst || G.a_edge || G.a_loop;
  if (x.scalar_type() == at::kFloat && head_vectors_fit(P.H) && register_tiles_fit<float, float>(P.H, P.F)) {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gat_backward_index", [&] {
      const float* ae = ptr_or_null<float>(a_edge);
      const float* al = ptr_or_null<float>(a_loop);
      dispatch_heads(P.H, [&](auto hh) {
        constexpr int HH = decltype(hh)::value;
        backward_rows_tiles<index_t, HH>(P, g.data_ptr<float>(), out.data_ptr<float>(), m.data_ptr<float>(),
                                         z.data_ptr<float>(), x.data_ptr<float>(), a_src.data_ptr<float>(),
                                         a_dst.data_ptr<float>(), ae, al, rowptr.data_ptr<index_t>(),
                                         col.data_ptr<index_t>(), T.data_ptr<float>(), G, per_edge);
        if (G.x || G.a_src)
          backward_sources_tiles<index_t, HH>(P, g.data_ptr<float>(), x.data_ptr<float>(), a_src.data_ptr<float>(),
                                              ae, al, t_rowptr.data_ptr<index_t>(), t_col.data_ptr<index_t>(),
                                              t_pos.data_ptr<index_t>(), T.data_ptr<float>(), G);
      });
    });
    return grads;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gat_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gat_backward_index", [&] {
      const scalar_t* ae = ptr_or_null<scalar_t>(a_edge);
      const scalar_t* al = ptr_or_null<scalar_t>(a_loop);
      dispatch_width(P.F, [&](auto ff) {
      constexpr int FF = decltype(ff)::value;
      backward_rows<scalar_t, index_t, FF>(P, g.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), m.data_ptr<acc_t>(),
                                       z.data_ptr<acc_t>(), x.data_ptr<scalar_t>(), a_src.data_ptr<scalar_t>(),
                                       a_dst.data_ptr<scalar_t>(), ae, al, rowptr.data_ptr<index_t>(),
                                       col.data_ptr<index_t>(), T.data_ptr<acc_t>(), G, per_edge);
      if (G.x || G.a_src)
        backward_sources<scalar_t, index_t, FF>(P, g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                                a_src.data_ptr<scalar_t>(), ae, al, t_rowptr.data_ptr<index_t>(),
                                                t_col.data_ptr<index_t>(), t_pos.data_ptr<index_t>(),
                                                T.data_ptr<acc_t>(), G);
      });
    });
  });
  return grads;
}

}  // namespace
}  // namespace gnnfuse

namespace gnnfuse {
void register_edge_softmax(pybind11::module& m);
void register_pair_attention(pybind11::module& m);
}  // namespace gnnfuse

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gat_forward", &gnnfuse::gat_forward);
  m.def("gat_backward", &gnnfuse::gat_backward);
  gnnfuse::register_edge_softmax(m);
  gnnfuse::register_pair_attention(m);
  m.def("exp_vec16", [](const at::Tensor& x) {  // for tests: the register-tile kernels' exp, lane by lane
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.numel() % 16 == 0,
                "exp_vec16: x must be a contiguous float tensor of a multiple of 16 elements");
    auto y = at::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); i += 16)
      gnnfuse::attention_detail::store_heads<16>(
          out + i, gnnfuse::attention_detail::exp_vec(gnnfuse::attention_detail::load_heads<16>(in + i)));
    return y;
  });
  m.def("dropout_keep", [](int64_t seed, int64_t edge, int64_t H, int64_t h, double p) {
    return gnnfuse::dropout_keep(uint32_t(seed), edge, H, h, gnnfuse::dropout_threshold(p));
  });
}
