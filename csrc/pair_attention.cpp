// Fused attention whose logit needs both endpoints' feature vectors, on CPU: gnnfuse.gatv2_attention
// and gnnfuse.dot_attention (one op, gnnfuse::pair_attention; maths in gnnfuse/ops/pair_attention.py).
//
// Per target row i and head h, over the row's incoming edges k (source j = col[k]):
//   GATv2: e_k = sum_f att[h,f] leaky_relu(k[j,h,f] + q[i,h,f]);  dot: e_k = scale q[i,h,:] . k[j,h,:]
//   p_k = exp(e_k - m_i) / z_i,  out[i,h,:] = sum_k p_k keep_k / (1 - dropout) v[j,h,:].
// Optional edge features a [E (+ loops), H, F] (edge order, row perm[k] for CSR position k, or with no
// perm CSR order, row k; E + i for row i's virtual loop, or no term where a has E rows alone): GATv2
// adds a_k inside the leaky_relu, dot adds it to the key and the value.
// Only m and z [N_dst, H] are saved; the backward recomputes the logits. Row pass (rows of the
// graph): D_i = g_i . out_i, grad q and per-row partials of grad att (summed afterwards, in row
// order); transpose pass (source rows): grad k and grad v. Every output row is written by one
// thread: no atomics, bitwise identical for any thread count. Self loops and dropout as in
// attention.cpp (attention_common.h).
#include <ATen/Dispatch.h>

#include "attention_common.h"
#include "attention_tiles.h"
#include "pair_rows.h"

namespace gnnfuse {
namespace {

using namespace attention_detail;
using namespace pair_detail;

// One head's logit from the target's vector a (query), the source's vector b (key) and the edge's
// features ee (nullptr: none), F features each.
template <int FF, typename acc_t, typename scalar_t>
inline acc_t pair_logit(const Pair& A, const scalar_t* __restrict a, const scalar_t* __restrict b,
                        const scalar_t* __restrict ee, const scalar_t* __restrict att, int64_t F) {
  const int64_t n = FF ? FF : F;
  if (!A.gatv2) {
    if (!ee) return dot<FF, acc_t>(a, b, F) * acc_t(A.qk_scale);
    acc_t s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t f = 0; f < n; ++f) s += acc_t(a[f]) * (acc_t(b[f]) + acc_t(ee[f]));
    return s * acc_t(A.qk_scale);
  }
  const acc_t slope = acc_t(A.P.slope);
  acc_t s = 0;
  if (ee) {
#pragma omp simd reduction(+ : s)
    for (int64_t f = 0; f < n; ++f) {
      const acc_t u = acc_t(a[f]) + acc_t(b[f]) + acc_t(ee[f]);
      s += acc_t(att[f]) * (u > acc_t(0) ? u : u * slope);
    }
    return s;
  }
#pragma omp simd reduction(+ : s)
  for (int64_t f = 0; f < n; ++f) {
    const acc_t u = acc_t(a[f]) + acc_t(b[f]);
    s += acc_t(att[f]) * (u > acc_t(0) ? u : u * slope);
  }
  return s;
}

// The edge's contribution to the gradients of the logit's inputs, scaled by ds: adds
// ds * d e / d(own) to g_own and (GATv2) ds * leaky_relu(u) to g_att. `own` is the walking row's
// vector (the query when own_is_q), `other` the other endpoint's, ee the edge's features or nullptr.
template <int FF, typename acc_t, typename scalar_t>
inline void logit_grad(const Pair& A, acc_t ds, const scalar_t* __restrict own, const scalar_t* __restrict other,
                       const scalar_t* __restrict ee, const scalar_t* __restrict att, acc_t* __restrict g_own,
                       acc_t* __restrict g_att, bool own_is_q, int64_t F) {
  const int64_t n = FF ? FF : F;
  if (!A.gatv2) {
    axpy<FF>(g_own, other, ds * acc_t(A.qk_scale), F);
    if (ee && own_is_q) axpy<FF>(g_own, ee, ds * acc_t(A.qk_scale), F);  // d (q . (k + a)) / d q
    return;
  }
  const acc_t slope = acc_t(A.P.slope);
#pragma omp simd
  for (int64_t f = 0; f < n; ++f) {
    const acc_t u = acc_t(own[f]) + acc_t(other[f]) + (ee ? acc_t(ee[f]) : acc_t(0));
    g_own[f] += ds * acc_t(att[f]) * (u > acc_t(0) ? acc_t(1) : slope);
  }
  if (g_att) {
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) {
      const acc_t u = acc_t(own[f]) + acc_t(other[f]) + (ee ? acc_t(ee[f]) : acc_t(0));
      g_att[f] += ds * (u > acc_t(0) ? u : u * slope);
    }
  }
}

// The edge features' gradient of one (edge, head), written once: GATv2 ds att leaky_relu'(u);
// dot ds scale q_i + c g_i (the key and the value terms).
template <int FF, typename acc_t, typename scalar_t>
inline void edge_grad(const Pair& A, acc_t ds, acc_t c, const scalar_t* __restrict q, const scalar_t* __restrict k,
                      const scalar_t* __restrict ee, const scalar_t* __restrict g, const scalar_t* __restrict att,
                      scalar_t* __restrict out, int64_t F) {
  const int64_t n = FF ? FF : F;
  if (!A.gatv2) {
    const acc_t a = ds * acc_t(A.qk_scale);
    for (int64_t f = 0; f < n; ++f) out[f] = scalar_t(a * acc_t(q[f]) + c * acc_t(g[f]));
    return;
  }
  const acc_t slope = acc_t(A.P.slope);
  for (int64_t f = 0; f < n; ++f) {
    const acc_t u = acc_t(q[f]) + acc_t(k[f]) + acc_t(ee[f]);
    out[f] = scalar_t(ds * acc_t(att[f]) * (u > acc_t(0) ? acc_t(1) : slope));
  }
}

// The edge features' row of a walked edge: perm[pos] (rows in edge_index order) or pos (perm nullptr:
// rows in CSR order), E + i for row i's virtual loop where the tensor has the loops' rows. nullptr
// without edge features and for a loop without a row: no edge term (zero), no gradient row.
template <typename scalar_t, typename index_t>
inline const scalar_t* edge_row(const Pair& A, const scalar_t* edge, const index_t* perm, const Edge& E, int64_t HF) {
  if (!edge) return nullptr;
  if (E.pos < 0) return A.edge_loops ? edge + E.id * HF : nullptr;
  return edge + (perm ? int64_t(perm[E.pos]) : E.pos) * HF;
}

// Prefetches the edge features' row of edge e + kAhead of a row where the rows are in edge_index order
// (read through perm: scattered, the walk waited on each; in CSR order they stream and the hardware
// prefetcher finds them). On the 2-core EPYC (2 threads, loaded): the GATv2 / dot forwards through perm
// (arxiv-like and rfc-uniform, 8x8 and 4x64) 1.4-1.7x faster, CSR order still 1.4-2.0x faster than that
// (benchmarks/results/attention-edge-terms_cpu-2t_2026-11-24_edgefeat_loaded.md).
template <typename scalar_t, typename index_t>
GNNFUSE_ALWAYS_INLINE void prefetch_edge(const Pair& A, const scalar_t* edge, const index_t* perm,
                                         const EdgeList& edges, int64_t e, int64_t n, int64_t HF) {
  if (edge && perm && e + kAhead < n)
    if (const scalar_t* r = edge_row(A, edge, perm, edges[e + kAhead], HF)) prefetch_row(r, HF);
}

// Softmax weights of a row's edges, exp(e - m) with the row max m (forward: computed here).
template <typename acc_t>
void exp_shift(std::vector<acc_t>& w, const std::vector<acc_t>& s, int64_t n, int64_t H, const acc_t* m) {
  for (int64_t e = 0; e < n; ++e)
    for (int64_t h = 0; h < H; ++h) w[e * H + h] = s[e * H + h] - m[h];
  acc_t* wp = w.data();
#pragma omp simd
  for (int64_t q = 0; q < n * H; ++q) wp[q] = exp_simd(wp[q]);
}

template <typename scalar_t, typename index_t, int FF>
void forward_kernel(const Pair& A, const scalar_t* q, const scalar_t* k, const scalar_t* v, const scalar_t* att,
                    const scalar_t* edge, const index_t* perm, const index_t* rowptr, const index_t* col, scalar_t* out, at::opmath_type<scalar_t>* m_out,
                    at::opmath_type<scalar_t>* z_out) {
  using acc_t = at::opmath_type<scalar_t>;
  const Params& P = A.P;
  const int64_t H = P.H, F = P.F, HF = H * F;
  parallel_over_rows(rowptr, P.num_dst, HF, [&](int64_t r0, int64_t r1) {
    std::vector<acc_t> acc(HF);
    Scratch<acc_t> S;
    acc_t m[kMaxHeads], z[kMaxHeads];
    for (int64_t i = r0; i < r1; ++i) {
      collect_edges(P, rowptr, col, static_cast<const index_t*>(nullptr), i, S.edges, k, HF);
      const int64_t n = S.edges.size();
      S.size_for(H);
      S.fill_keep(P, H);
      for (int64_t h = 0; h < H; ++h) m[h] = -std::numeric_limits<acc_t>::infinity(), z[h] = acc_t(0);
      for (int64_t e = 0; e < n; ++e) {
        if (e + kAhead < n) prefetch_row(k + S.edges[e + kAhead].other * HF, HF);
        prefetch_edge(A, edge, perm, S.edges, e, n, HF);
        const scalar_t* kj = k + S.edges[e].other * HF;
        const scalar_t* ee = edge_row(A, edge, perm, S.edges[e], HF);
        for (int64_t h = 0; h < H; ++h) {
          const acc_t s = pair_logit<FF, acc_t>(A, q + i * HF + h * F, kj + h * F, ee ? ee + h * F : ee, att + h * F, F);
          S.s[e * H + h] = s;
          m[h] = s > m[h] ? s : m[h];
        }
      }
      exp_shift(S.w, S.s, n, H, m);
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t e = 0; e < n; ++e) {
        if (e + kAhead < n) prefetch_row(v + S.edges[e + kAhead].other * HF, HF);
        const scalar_t* vj = v + S.edges[e].other * HF;
        const scalar_t* ee = A.gatv2 ? nullptr : edge_row(A, edge, perm, S.edges[e], HF);  // dot: values + a_k
        for (int64_t h = 0; h < H; ++h) {
          const acc_t w = S.w[e * H + h];
          z[h] += w;
          const acc_t c = w * S.keep[e * H + h];
          axpy<FF>(acc.data() + h * F, vj + h * F, c, F);
          if (ee) axpy<FF>(acc.data() + h * F, ee + h * F, c, F);
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        const acc_t inv = z[h] > acc_t(0) ? acc_t(1) / z[h] : acc_t(0);
        for (int64_t f = 0; f < F; ++f) out[i * HF + h * F + f] = scalar_t(acc[h * F + f] * inv);
        m_out[i * H + h] = z[h] > acc_t(0) ? m[h] : acc_t(0);
        z_out[i * H + h] = z[h];
      }
    }
  });
}

struct PairGrads {
  void *q, *k, *v;
  void* att_rows;  // [N_dst, H * F] acc_t: per-row partials of grad att
  void* edge;      // [E (+ loops), H, F]: the edge features' gradient
};

// Row pass: D_i (kept in T with m_i and 1/z_i for the transpose pass), grad q, grad att partials.
template <typename scalar_t, typename index_t, int FF>
void backward_rows(const Pair& A, const scalar_t* g, const scalar_t* out, const at::opmath_type<scalar_t>* m,
                   const at::opmath_type<scalar_t>* z, const scalar_t* q, const scalar_t* k, const scalar_t* v,
                   const scalar_t* att, const scalar_t* edge, const index_t* perm, const index_t* rowptr,
                   const index_t* col, at::opmath_type<scalar_t>* T, PairGrads G) {
  using acc_t = at::opmath_type<scalar_t>;
  const Params& P = A.P;
  const int64_t H = P.H, F = P.F, HF = H * F;
  auto* gq = static_cast<scalar_t*>(G.q);
  auto* gatt = static_cast<acc_t*>(G.att_rows);
  auto* gedge = static_cast<scalar_t*>(G.edge);
  const bool per_edge = gq || gatt || gedge;
  parallel_over_rows(rowptr, P.num_dst, per_edge ? HF : 1, [&](int64_t r0, int64_t r1) {
    Scratch<acc_t> S;
    std::vector<acc_t> acc_q(HF), acc_att(HF);
    for (int64_t i = r0; i < r1; ++i) {
      const scalar_t* gi = g + i * HF;
      const scalar_t* qi = q + i * HF;
      acc_t* t = T + i * 3 * H;  // the transpose pass reads these three per-target values together
      for (int64_t h = 0; h < H; ++h) {
        t[h] = m[i * H + h];
        t[H + h] = z[i * H + h] > acc_t(0) ? acc_t(1) / z[i * H + h] : acc_t(0);
        t[2 * H + h] = dot<FF, acc_t>(gi + h * F, out + i * HF + h * F, F);
      }
      if (!per_edge) continue;
      collect_edges(P, rowptr, col, static_cast<const index_t*>(nullptr), i, S.edges, k, HF);
      const int64_t n = S.edges.size();
      S.size_for(H);
      S.fill_keep(P, H);
      for (int64_t e = 0; e < n; ++e) {
        prefetch_edge(A, edge, perm, S.edges, e, n, HF);
        const scalar_t* ee = edge_row(A, edge, perm, S.edges[e], HF);
        for (int64_t h = 0; h < H; ++h)
          S.s[e * H + h] = pair_logit<FF, acc_t>(A, qi + h * F, k + S.edges[e].other * HF + h * F,
                                                 ee ? ee + h * F : ee, att + h * F, F);
      }
      exp_shift(S.w, S.s, n, H, t);
      std::fill(acc_q.begin(), acc_q.end(), acc_t(0));
      std::fill(acc_att.begin(), acc_att.end(), acc_t(0));
      for (int64_t e = 0; e < n; ++e) {
        const Edge& E = S.edges[e];
        if (e + kAhead < n) prefetch_row(v + S.edges[e + kAhead].other * HF, HF);
        const scalar_t *kj = k + E.other * HF, *vj = v + E.other * HF;
        const scalar_t* ee = edge_row(A, edge, perm, E, HF);
        for (int64_t h = 0; h < H; ++h) {
          const acc_t p = S.w[e * H + h] * t[H + h];
          const acc_t keep = S.keep[e * H + h];
          acc_t gv = dot<FF, acc_t>(gi + h * F, vj + h * F, F);
          if (ee && !A.gatv2) gv += dot<FF, acc_t>(gi + h * F, ee + h * F, F);  // dot: the value carries a_k
          const acc_t ds = p * (keep * gv - t[2 * H + h]);
          const scalar_t* eh = ee ? ee + h * F : ee;
          logit_grad<FF>(A, ds, qi + h * F, kj + h * F, eh, att + h * F, acc_q.data() + h * F,
                         gatt ? acc_att.data() + h * F : static_cast<acc_t*>(nullptr), true, F);
          if (gedge && ee)  // (a loop without an edge row has no gradient row)
            edge_grad<FF>(A, ds, p * keep, qi + h * F, kj + h * F, eh, gi + h * F, att + h * F,
                          gedge + (ee - edge) + h * F, F);
        }
      }
      if (gq)
        for (int64_t f = 0; f < HF; ++f) gq[i * HF + f] = scalar_t(acc_q[f]);
      if (gatt) std::copy(acc_att.begin(), acc_att.end(), gatt + i * HF);
    }
  });
}

// Transpose pass (source rows): grad k and grad v.
template <typename scalar_t, typename index_t, int FF>
void backward_sources(const Pair& A, const scalar_t* g, const scalar_t* q, const scalar_t* k, const scalar_t* v,
                      const scalar_t* att, const scalar_t* edge, const index_t* perm, const index_t* t_rowptr,
                      const index_t* t_col, const index_t* t_pos, const at::opmath_type<scalar_t>* T, PairGrads G) {
  using acc_t = at::opmath_type<scalar_t>;
  const Params& P = A.P;
  const int64_t H = P.H, F = P.F, HF = H * F;
  auto* gk = static_cast<scalar_t*>(G.k);
  auto* gv = static_cast<scalar_t*>(G.v);
  parallel_over_rows(t_rowptr, P.num_src, HF, [&](int64_t r0, int64_t r1) {
    Scratch<acc_t> S;
    std::vector<acc_t> acc_k(HF), acc_v(HF);
    for (int64_t j = r0; j < r1; ++j) {
      collect_edges(P, t_rowptr, t_col, t_pos, j, S.edges, q, HF);
      const int64_t n = S.edges.size();
      S.size_for(H);
      S.fill_keep(P, H);
      const scalar_t *kj = k + j * HF, *vj = v + j * HF;
      std::fill(acc_k.begin(), acc_k.end(), acc_t(0));
      std::fill(acc_v.begin(), acc_v.end(), acc_t(0));
      for (int64_t e = 0; e < n; ++e) {
        const Edge& E = S.edges[e];
        if (e + kAhead < n) prefetch_row(g + S.edges[e + kAhead].other * HF, HF);
        prefetch_edge(A, edge, perm, S.edges, e, n, HF);
        const scalar_t *qi = q + E.other * HF, *gi = g + E.other * HF;
        const acc_t* t = T + E.other * 3 * H;
        const scalar_t* ee = edge_row(A, edge, perm, E, HF);
        for (int64_t h = 0; h < H; ++h) {
          const scalar_t* eh = ee ? ee + h * F : ee;
          const acc_t s = pair_logit<FF, acc_t>(A, qi + h * F, kj + h * F, eh, att + h * F, F);
          const acc_t p = exp_simd(s - t[h]) * t[H + h];
          const acc_t keep = S.keep[e * H + h];
          if (gv) axpy<FF>(acc_v.data() + h * F, gi + h * F, p * keep, F);
          if (gk) {
            acc_t g_dot_v = dot<FF, acc_t>(gi + h * F, vj + h * F, F);
            if (eh && !A.gatv2) g_dot_v += dot<FF, acc_t>(gi + h * F, eh, F);
            const acc_t ds = p * (keep * g_dot_v - t[2 * H + h]);
            logit_grad<FF>(A, ds, kj + h * F, qi + h * F, eh, att + h * F, acc_k.data() + h * F,
                           static_cast<acc_t*>(nullptr), false, F);
          }
        }
      }
      if (gk)
        for (int64_t f = 0; f < HF; ++f) gk[j * HF + f] = scalar_t(acc_k[f]);
      if (gv)
        for (int64_t f = 0; f < HF; ++f) gv[j * HF + f] = scalar_t(acc_v[f]);
    }
  });
}

// ---- float rows on register tiles (attention_tiles.h), H in 1, 2, 4, 8, 16, no edge features -----
// The logits (q_i . k_j or att . leaky_relu(q_i + k_j), per head) in one tile pass over the row's
// keys, the softmax on head vectors, the weighted sums and GATv2's leaky_relu gradients in register
// tiles.
inline bool tiles_apply(const Pair& A, bool has_edge) {
  return !has_edge && head_vectors_fit(A.P.H) && register_tiles_fit<float, float>(A.P.H, A.P.F);
}

// s[e*H + h]: the logits (unscaled) of the walked row's edges, `own` being the walking row's
// vector and `rows` the other endpoints' (the query and keys, or in the transpose the reverse).
template <typename Row>
inline void pair_logits(const Pair& A, const Row& edges, const float* own, const float* rows, const float* att,
                        const HeadLanes& heads, float* s) {
  if (A.gatv2) head_dots(edges, rows, own, A.P.H, heads, s, LeakyAttOp{att, float(A.P.slope)});
  else head_dots(edges, rows, own, A.P.H, heads, s, MulOp{});
}

// w[0 : n*H] *= scale; returns the per-head max.
template <int HH>
GNNFUSE_ALWAYS_INLINE HeadVec<HH> scale_row_logits(float* __restrict w, const int64_t n, const float scale) {
  using HV = HeadVec<HH>;
  HV m = HV{} - std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < n; ++e) {
    const HV s = load_heads<HH>(w + e * HH) * scale;
    store_heads<HH>(w + e * HH, s);
    m = s > m ? s : m;
  }
  return m;
}


// The backwards' logits (unscaled), as pair_logits writes them: at 8 heads x 8 through
// pair_logits_8x8 (the same bits; its max and its -inf past an odd row's end go unused).
template <int HH>
inline void row_logits(const Pair& A, const EdgeList& edges, const float* own, const float* rows, const float* att,
                       const HeadLanes& heads, float* s) {
  if constexpr (HH == 8 && kPairLogits) {
    if (A.P.F == 8) {
      if (A.gatv2) pair_logits_8x8<true>(edges, own, rows, att, float(A.P.slope), 1.0f, s);
      else pair_logits_8x8<false>(edges, own, rows, att, float(A.P.slope), 1.0f, s);
      return;
    }
  }
  pair_logits(A, edges, own, rows, att, heads, s);
}

// kPairs8x8 (H = F = 8 with AVX-512): the logits and their max from pair_logits_8x8, and no
// prefetch in the weighted sum where the values are the keys (GATv2: the key pass has just read
// and prefetched those rows).
template <typename index_t, int HH, bool kPairs8x8 = false>
void forward_tiles(const Pair& A, const float* q, const float* k, const float* v, const float* att,
                   const index_t* rowptr, const index_t* col, float* out, float* m_out, float* z_out) {
  using HV = HeadVec<HH>;
  const Params& P = A.P;
  const int64_t H = HH, F = P.F, HF = H * F;
  const HeadLanes heads(H, F);
  const float scale = A.gatv2 ? 1.0f : float(A.qk_scale);
  const int64_t ahead = tile_prefetch_ahead(HF, P.num_src);
  parallel_over_rows(rowptr, P.num_dst, HF, [&](int64_t r0, int64_t r1) {
    Scratch<float> S;
    RowCopy<index_t> copy;
    const int64_t stream_end = rowptr[r1];
    auto general_row = [&](int64_t i) {
      // the query row two rows on (the keys' and values' reads in between hide it from the hardware
      // prefetcher: the tile loop's first load waited on it)
      if (i + 2 < r1) prefetch_bytes(q + (i + 2) * HF, HF * int64_t(sizeof(float)));
      const CsrRow<index_t> row = csr_row(P, rowptr, col, i, stream_end, ahead, copy);
      const int64_t n = row.size();
      float* w = row_buffer(S.w, n * H);
      if constexpr (kPairs8x8) {
        const float slope = float(P.slope);
        const HV m = A.gatv2 ? pair_logits_8x8<true>(row, q + i * HF, k, att, slope, scale, w)
                             : pair_logits_8x8<false>(row, q + i * HF, k, att, slope, scale, w);
        CsrRow<index_t> values = row;
        if (v == k) values.stream_end = 0;
        finish_row_tiles<HH, true>(P, S, values, w, m, heads, v, out + i * HF, m_out + i * H, z_out + i * H);
      } else {
        pair_logits(A, row, q + i * HF, k, att, heads, w);
        const HV m = scale_row_logits<HH>(w, n, scale);
        finish_row_tiles<HH>(P, S, row, w, m, heads, v, out + i * HF, m_out + i * H, z_out + i * H);
      }
    };
    constexpr bool kRows4x64 = HH == 4 && kPairLogits;
    if (kPairs8x8 || (kRows4x64 && F == 64)) {  // the rows in one loop (pair_rows_*), a row with an edge to itself here
      int64_t longest = 0;
      for (int64_t i = r0; i < r1; ++i) longest = std::max<int64_t>(longest, int64_t(rowptr[i + 1]) - rowptr[i]);
      const int64_t row_floats = (longest + 2) * H + kWeightPad;  // a row's logits (and the odd row's -inf edge)
      std::vector<float> logits(2 * row_floats);  // two rows' (pair_rows_8x8 works on two rows at a time)
      for (int64_t i = r0; i < r1;) {
        auto rows = [&](auto gatv2_c, auto keep_c) {
          if constexpr (kPairs8x8)
            return pair_rows_8x8<index_t, decltype(gatv2_c)::value, decltype(keep_c)::value>(
                A, q, k, v, att, rowptr, col, out, m_out, z_out, ahead, i, r1, stream_end, logits.data(),
                logits.data() + row_floats);
          else if constexpr (kRows4x64)
            return pair_rows_4x64<index_t, decltype(gatv2_c)::value, decltype(keep_c)::value>(
                A, q, k, v, att, rowptr, col, out, m_out, z_out, ahead, i, r1, stream_end, logits.data(),
                logits.data() + row_floats);
          else
            return r1;
        };
        using yes = std::true_type;
        using no = std::false_type;
        if (P.threshold) i = A.gatv2 ? rows(yes{}, yes{}) : rows(no{}, yes{});
        else i = A.gatv2 ? rows(yes{}, no{}) : rows(no{}, no{});
        if (i < r1) general_row(i++);
      }
      return;
    }
    for (int64_t i = r0; i < r1; ++i) general_row(i);
  });
}

// The backward on register tiles. Row pass: D_i, the weights and ds from the logits and g_i . v_j,
// grad q (dot: sum ds scale k_j; GATv2: sum ds att leaky_relu'(q_i + k_j)) and GATv2's per-row
// grad att partials. Transpose pass: grad v = sum p keep g_i, grad k likewise from ds.
template <typename index_t, int HH>
void backward_rows_tiles(const Pair& A, const float* g, const float* out, const float* m, const float* z,
                         const float* q, const float* k, const float* v, const float* att, const index_t* rowptr,
                         const index_t* col, float* T, float* gq, float* gatt) {
  using HV = HeadVec<HH>;
  const Params& P = A.P;
  const int64_t H = HH, F = P.F, HF = H * F;
  const HeadLanes heads(H, F);
  const float scale = A.gatv2 ? 1.0f : float(A.qk_scale), slope = float(P.slope);
  const bool per_edge = gq || gatt;
  parallel_over_rows(rowptr, P.num_dst, per_edge ? HF : 1, [&](int64_t r0, int64_t r1) {
    Scratch<float> S;
    std::vector<float> own(HF);  // grad q's row when only GATv2's grad att is wanted
    for (int64_t i = r0; i < r1; ++i) {
      const float* gi = g + i * HF;
      float* t = T + i * 3 * H;  // the transpose pass reads these three per-target values together
      for (int64_t h = 0; h < H; ++h) {
        t[h] = m[i * H + h];
        t[H + h] = z[i * H + h] > 0.0f ? 1.0f / z[i * H + h] : 0.0f;
        t[2 * H + h] = dot<0, float>(gi + h * F, out + i * HF + h * F, F);
      }
      if (!per_edge) continue;
      collect_edges(P, rowptr, col, static_cast<const index_t*>(nullptr), i, S.edges, k, HF);
      prefetch_next_row(rowptr, col, i + 1, r1, k, HF, v, HF);
      const int64_t n = S.edges.size();
      S.fill_keep(P, H);
      float* s = row_buffer(S.s, n * H);
      float* gv = row_buffer(S.dots, n * H);
      row_logits<HH>(A, S.edges, q + i * HF, k, att, heads, s);
      head_dots(S.edges, v, gi, H, heads, gv, MulOp{});
      const HV mi = load_heads<HH>(t), invz = load_heads<HH>(t + H), D = load_heads<HH>(t + 2 * H);
      float* c = row_buffer(S.c, n * H);
      for (int64_t e = 0; e < n; ++e) {
        const HV p = exp_vec(load_heads<HH>(s + e * H) * scale - mi) * invz;
        const HV ds = p * (load_heads<HH>(S.keep.data() + e * H) * load_heads<HH>(gv + e * H) - D);
        store_heads<HH>(c + e * H, ds * scale);
      }
      float* d_own = gq ? gq + i * HF : own.data();
      if (A.gatv2) leaky_grad_row(S.edges, c, H, heads, k, q + i * HF, att, slope, d_own, gatt ? gatt + i * HF : nullptr);
      else weighted_row_sum(S.edges, c, H, heads, k, d_own);
    }
  });
}

template <typename index_t, int HH>
void backward_sources_tiles(const Pair& A, const float* g, const float* q, const float* k, const float* v,
                            const float* att, const index_t* t_rowptr, const index_t* t_col, const index_t* t_pos,
                            const float* T, float* gk, float* gv) {
  using HV = HeadVec<HH>;
  const Params& P = A.P;
  const int64_t H = HH, F = P.F, HF = H * F;
  const HeadLanes heads(H, F);
  const float scale = A.gatv2 ? 1.0f : float(A.qk_scale), slope = float(P.slope);
  parallel_over_rows(t_rowptr, P.num_src, HF, [&](int64_t r0, int64_t r1) {
    Scratch<float> S;
    std::vector<float> ck_buf;
    for (int64_t j = r0; j < r1; ++j) {
      collect_edges(P, t_rowptr, t_col, t_pos, j, S.edges, q, HF);
      prefetch_next_row(t_rowptr, t_col, j + 1, r1, q, HF, g, HF);
      const int64_t n = S.edges.size();
      S.fill_keep(P, H);
      float* s = row_buffer(S.s, n * H);
      row_logits<HH>(A, S.edges, k + j * HF, q, att, heads, s);  // both logits are symmetric in q and k
      float* gd = nullptr;
      if (gk) {
        gd = row_buffer(S.dots, n * H);
        head_dots(S.edges, g, v + j * HF, H, heads, gd, MulOp{});
      }
      float* cv = row_buffer(S.c, n * H);
      float* ck = row_buffer(ck_buf, n * H);
      for (int64_t e = 0; e < n; ++e) {
        const float* t = T + S.edges[e].other * 3 * H;
        const HV p = exp_vec(load_heads<HH>(s + e * H) * scale - load_heads<HH>(t)) * load_heads<HH>(t + H);
        const HV keep = load_heads<HH>(S.keep.data() + e * H);
        store_heads<HH>(cv + e * H, p * keep);
        if (gk) store_heads<HH>(ck + e * H, p * (keep * load_heads<HH>(gd + e * H) - load_heads<HH>(t + 2 * H)) * scale);
      }
      if (gv) weighted_row_sum(S.edges, cv, H, heads, g, gv + j * HF);
      if (gk) {
        if (A.gatv2) leaky_grad_row(S.edges, ck, H, heads, q, k + j * HF, att, slope, gk + j * HF, nullptr);
        else weighted_row_sum(S.edges, ck, H, heads, q, gk + j * HF);
      }
    }
  });
}

Pair make_pair(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& att,
               const at::Tensor& rowptr, const at::Tensor& col, bool self_loops, bool gatv2, double slope,
               double scale, double dropout, int64_t seed) {
  Pair A{make_params(k, rowptr, col, self_loops, slope, dropout, seed, "pair_attention"), gatv2, scale};
  TORCH_CHECK(q.is_contiguous() && v.is_contiguous() && q.dim() == 3 && q.size(0) == A.P.num_dst &&
                  q.size(1) == A.P.H && q.size(2) == A.P.F && v.sizes() == k.sizes(),
              "pair_attention: q must be [N_dst, H, F] and v like k, contiguous");
  TORCH_CHECK(!gatv2 || (att.has_value() && att->is_contiguous() && att->numel() == A.P.H * A.P.F),
              "pair_attention: GATv2 needs a contiguous att [H, F]");
  return A;
}

// The edge features, checked (and A.edge_loops set): nullptr when absent.
template <typename scalar_t>
const scalar_t* edge_ptr(Pair& A, const c10::optional<at::Tensor>& edge, const c10::optional<at::Tensor>& perm,
                         const at::Tensor& col) {
  if (!edge.has_value()) return nullptr;
  const Params& P = A.P;
  TORCH_CHECK(edge->is_contiguous() && edge->dim() == 3 &&
                  (edge->size(0) == P.num_edges || edge->size(0) >= P.num_edges + P.num_loops) &&
                  edge->size(1) == P.H && edge->size(2) == P.F &&
                  (!perm.has_value() || (perm->scalar_type() == col.scalar_type() && perm->numel() == P.num_edges)),
              "pair_attention: edge must be a contiguous [E (+ loops), H, F] tensor (perm: the CSR's, or none for "
              "rows in CSR order)");
  A.edge_loops = P.num_loops > 0 && edge->size(0) >= P.num_edges + P.num_loops;
  return edge->data_ptr<scalar_t>();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pair_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& att,
    const c10::optional<at::Tensor>& edge, const at::Tensor& rowptr, const at::Tensor& col,
    const c10::optional<at::Tensor>& perm, bool self_loops, bool gatv2, double slope, double scale, double dropout,
    int64_t seed) {
  Pair A = make_pair(q, k, v, att, rowptr, col, self_loops, gatv2, slope, scale, dropout, seed);
  const Params& P = A.P;
  auto out = at::empty({P.num_dst, P.H, P.F}, k.options());
  const auto stat = k.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;  // acc_t
  auto m = at::empty({P.num_dst, P.H}, k.options().dtype(stat));
  auto z = at::empty({P.num_dst, P.H}, k.options().dtype(stat));
  if (k.scalar_type() == at::kFloat && tiles_apply(A, edge.has_value())) {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "pair_forward_index", [&] {
      dispatch_heads(P.H, [&](auto hh) {
        constexpr int HH = decltype(hh)::value;
        auto run = [&](auto pairs_8x8) {
          forward_tiles<index_t, HH, decltype(pairs_8x8)::value>(
              A, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
              att.has_value() ? att->data_ptr<float>() : q.data_ptr<float>(),  // dot: never read
              rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(), out.data_ptr<float>(), m.data_ptr<float>(),
              z.data_ptr<float>());
        };
        if constexpr (HH == 8 && kPairLogits) {
          if (P.F == 8) return run(std::true_type{});
        }
        run(std::false_type{});
      });
    });
    return {out, m, z};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, k.scalar_type(), "pair_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "pair_forward_index", [&] {
      const scalar_t* ee = edge_ptr<scalar_t>(A, edge, perm, col);
      dispatch_width(P.F, [&](auto ff) {
        forward_kernel<scalar_t, index_t, decltype(ff)::value>(
            A, q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
            att.has_value() ? att->data_ptr<scalar_t>() : q.data_ptr<scalar_t>(),  // dot: never read
            ee, ptr_or_null<index_t>(perm), rowptr.data_ptr<index_t>(),
            col.data_ptr<index_t>(), out.data_ptr<scalar_t>(), m.data_ptr<acc_t>(), z.data_ptr<acc_t>());
      });
    });
  });
  return {out, m, z};
}

// needs: (q, k, v, att, edge); a gradient not needed comes back as an empty tensor.
std::vector<at::Tensor> pair_backward(const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& m,
                                      const at::Tensor& z, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const c10::optional<at::Tensor>& att,
                                      const c10::optional<at::Tensor>& edge, const at::Tensor& rowptr,
                                      const at::Tensor& col, const c10::optional<at::Tensor>& perm,
                                      const at::Tensor& t_rowptr,
                                      const at::Tensor& t_col, const at::Tensor& t_pos, bool self_loops, bool gatv2,
                                      double slope, double scale, double dropout, int64_t seed,
                                      std::vector<bool> needs) {
  Pair A = make_pair(q, k, v, att, rowptr, col, self_loops, gatv2, slope, scale, dropout, seed);
  const Params& P = A.P;
  TORCH_CHECK(needs.size() == 5, "pair_attention_backward: needs must have 5 entries");
  TORCH_CHECK(t_rowptr.numel() - 1 == P.num_src, "pair_attention_backward: the transpose must have N_src rows");
  auto maybe = [&](bool need, const at::Tensor& like) { return need ? at::empty_like(like) : k.new_empty({0}); };
  const bool need_att = needs[3] && gatv2;
  const bool need_edge = needs[4] && edge.has_value();
  // the edge gradient: every row written, but for the graph's own self loops that self loops skip (zeros)
  const bool every_row = need_edge && !self_loops && edge->size(0) == P.num_edges;
  std::vector<at::Tensor> grads = {maybe(needs[0], q), maybe(needs[1], k), maybe(needs[2], v), k.new_empty({0}),
                                   need_edge ? (every_row ? at::empty_like(*edge) : at::zeros_like(*edge))
                                             : k.new_empty({0})};
  auto att_rows = need_att ? at::empty({P.num_dst, P.H * P.F}, m.options()) : m.new_empty({0});
  auto T = at::empty({P.num_dst, 3 * P.H}, m.options());  // per target: row max, 1 / row sum, D
  auto g = grad_out.contiguous();
  auto ptr = [](const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; };
  PairGrads G{ptr(grads[0]), ptr(grads[1]), ptr(grads[2]), ptr(att_rows), ptr(grads[4])};
  if (k.scalar_type() == at::kFloat && tiles_apply(A, edge.has_value())) {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "pair_backward_index", [&] {
      const float* a = att.has_value() ? att->data_ptr<float>() : q.data_ptr<float>();  // dot: never read
      dispatch_heads(P.H, [&](auto hh) {
        constexpr int HH = decltype(hh)::value;
        backward_rows_tiles<index_t, HH>(A, g.data_ptr<float>(), out.data_ptr<float>(), m.data_ptr<float>(),
                                         z.data_ptr<float>(), q.data_ptr<float>(), k.data_ptr<float>(),
                                         v.data_ptr<float>(), a, rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(),
                                         T.data_ptr<float>(), static_cast<float*>(G.q),
                                         static_cast<float*>(G.att_rows));
        if (G.k || G.v)
          backward_sources_tiles<index_t, HH>(A, g.data_ptr<float>(), q.data_ptr<float>(), k.data_ptr<float>(),
                                              v.data_ptr<float>(), a, t_rowptr.data_ptr<index_t>(),
                                              t_col.data_ptr<index_t>(), t_pos.data_ptr<index_t>(),
                                              T.data_ptr<float>(), static_cast<float*>(G.k), static_cast<float*>(G.v));
      });
    });
    if (need_att) grads[3] = att_rows.sum(0).view({P.H, P.F});  // rows in order: deterministic
    return grads;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, k.scalar_type(), "pair_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "pair_backward_index", [&] {
      const scalar_t* a = att.has_value() ? att->data_ptr<scalar_t>() : q.data_ptr<scalar_t>();  // dot: never read
      const scalar_t* ee = edge_ptr<scalar_t>(A, edge, perm, col);
      const index_t* pm = ptr_or_null<index_t>(perm);
      dispatch_width(P.F, [&](auto ff) {
        constexpr int FF = decltype(ff)::value;
        backward_rows<scalar_t, index_t, FF>(A, g.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), m.data_ptr<acc_t>(),
                                             z.data_ptr<acc_t>(), q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                                             v.data_ptr<scalar_t>(), a, ee, pm, rowptr.data_ptr<index_t>(),
                                             col.data_ptr<index_t>(), T.data_ptr<acc_t>(), G);
        if (G.k || G.v)
          backward_sources<scalar_t, index_t, FF>(A, g.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(),
                                                  k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), a, ee, pm,
                                                  t_rowptr.data_ptr<index_t>(), t_col.data_ptr<index_t>(),
                                                  t_pos.data_ptr<index_t>(), T.data_ptr<acc_t>(), G);
      });
    });
  });
  if (need_att) grads[3] = att_rows.sum(0).view({P.H, P.F}).to(k.scalar_type());  // rows in order: deterministic
  return grads;
}

}  // namespace

void register_pair_attention(pybind11::module& m) {
  m.def("pair_forward", &pair_forward);
  m.def("pair_backward", &pair_backward);
}

}  // namespace gnnfuse
