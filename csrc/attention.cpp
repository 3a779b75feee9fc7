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

#include "dropout_hash.h"
#include "reducer.h"

namespace gnnfuse {
namespace {

constexpr int64_t kMaxHeads = 64;  // per-row head state lives on the stack

struct Params {
  int64_t num_src, num_dst, num_edges, H, F, num_loops;  // num_loops: rows with a virtual self loop
  bool self_loops;
  double slope;
  uint32_t seed, threshold;  // threshold == 0: no dropout
  double scale;              // 1 / (1 - dropout)
  template <typename T>
  inline T keep(int64_t edge, int64_t h) const {
    return threshold == 0 ? T(scale) : (dropout_keep(seed, edge, H, h, threshold) ? T(scale) : T(0));
  }
  template <typename T>
  inline T lrelu(T s) const { return s > T(0) ? s : s * T(slope); }
  template <typename T>
  inline T dlrelu(T s) const { return s > T(0) ? T(1) : T(slope); }
};
// Logits, softmax statistics and accumulators use acc_t: float for float/half types, double for double.

// The logit of edge (row i, source j, edge-term pointer) for head h, before leaky_relu.
template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
inline acc_t logit(const scalar_t* a_src, const scalar_t* a_dst, const scalar_t* edge_term, int64_t j, int64_t i,
                   int64_t h, int64_t H) {
  acc_t s = acc_t(a_src[j * H + h]) + acc_t(a_dst[i * H + h]);
  if (edge_term) s += acc_t(edge_term[h]);
  return s;
}

// Calls fn(k, j, edge_term_row, dropout_id) for every edge of target row i, virtual loop last.
template <typename scalar_t, typename index_t, typename Fn>
inline void for_each_edge(const Params& P, const index_t* rowptr, const index_t* col, const scalar_t* a_edge,
                          const scalar_t* a_loop, int64_t i, Fn&& fn) {
  for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
    const int64_t j = col[k];
    if (P.self_loops && j == i) continue;
    fn(k, j, a_edge ? a_edge + k * P.H : nullptr, k);
  }
  if (i < P.num_loops) fn(int64_t(-1), i, a_loop ? a_loop + i * P.H : nullptr, P.num_edges + i);
}

template <typename scalar_t, typename index_t>
void forward_kernel(const Params& P, const scalar_t* x, const scalar_t* a_src, const scalar_t* a_dst,
                    const scalar_t* a_edge, const scalar_t* a_loop, const index_t* rowptr, const index_t* col,
                    scalar_t* out, at::opmath_type<scalar_t>* m_out, at::opmath_type<scalar_t>* z_out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t H = P.H, F = P.F, HF = H * F;
  parallel_over_rows(rowptr, P.num_dst, HF, [&](int64_t r0, int64_t r1) {
    std::vector<acc_t> acc(HF);
    acc_t m[kMaxHeads], z[kMaxHeads];
    for (int64_t i = r0; i < r1; ++i) {
      // Pass 1: the row's maximum logit per head (H numbers per edge, cheap next to x's rows).
      for (int64_t h = 0; h < H; ++h) m[h] = -std::numeric_limits<acc_t>::infinity(), z[h] = acc_t(0);
      for_each_edge(P, rowptr, col, a_edge, a_loop, i, [&](int64_t, int64_t j, const scalar_t* et, int64_t) {
        for (int64_t h = 0; h < H; ++h) m[h] = std::max(m[h], P.lrelu(logit(a_src, a_dst, et, j, i, h, H)));
      });
      // Pass 2: weights and the weighted sum of source rows.
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for_each_edge(P, rowptr, col, a_edge, a_loop, i, [&](int64_t, int64_t j, const scalar_t* et, int64_t id) {
        const scalar_t* xr = x + j * HF;
        for (int64_t h = 0; h < H; ++h) {
          const acc_t w = std::exp(P.lrelu(logit(a_src, a_dst, et, j, i, h, H)) - m[h]);
          z[h] += w;
          const acc_t c = w * P.keep<acc_t>(id, h);
          acc_t* a = acc.data() + h * F;
          const scalar_t* xh = xr + h * F;
#pragma omp simd
          for (int64_t f = 0; f < F; ++f) a[f] += c * acc_t(xh[f]);
        }
      });
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

template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
inline acc_t dot(const scalar_t* a, const scalar_t* b, int64_t F) {
  acc_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t f = 0; f < F; ++f) s += acc_t(a[f]) * acc_t(b[f]);
  return s;
}

struct Grads {
  void *x, *a_src, *a_dst, *a_edge, *a_loop;
};

// Pass A (rows of the graph): D_i, grad_a_dst, grad_a_edge, grad_a_loop.
template <typename scalar_t, typename index_t>
void backward_rows(const Params& P, const scalar_t* g, const scalar_t* out, const at::opmath_type<scalar_t>* m,
                   const at::opmath_type<scalar_t>* z,
                   const scalar_t* x, const scalar_t* a_src, const scalar_t* a_dst, const scalar_t* a_edge,
                   const scalar_t* a_loop, const index_t* rowptr, const index_t* col, at::opmath_type<scalar_t>* D,
                   Grads G, bool per_edge) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t H = P.H, F = P.F, HF = H * F;
  auto* gd = static_cast<scalar_t*>(G.a_dst);
  auto* ge = static_cast<scalar_t*>(G.a_edge);
  auto* gl = static_cast<scalar_t*>(G.a_loop);
  parallel_over_rows(rowptr, P.num_dst, per_edge ? HF : 1, [&](int64_t r0, int64_t r1) {
    acc_t acc[kMaxHeads];
    for (int64_t i = r0; i < r1; ++i) {
      for (int64_t h = 0; h < H; ++h) D[i * H + h] = dot(g + i * HF + h * F, out + i * HF + h * F, F), acc[h] = 0;
      if (!per_edge) continue;
      for_each_edge(P, rowptr, col, a_edge, a_loop, i, [&](int64_t k, int64_t j, const scalar_t* et, int64_t id) {
        for (int64_t h = 0; h < H; ++h) {
          const acc_t s = logit(a_src, a_dst, et, j, i, h, H);
          const acc_t p = std::exp(P.lrelu(s) - m[i * H + h]) / z[i * H + h];
          const acc_t gx = dot(g + i * HF + h * F, x + j * HF + h * F, F);
          const acc_t ds = p * (P.keep<acc_t>(id, h) * gx - D[i * H + h]) * P.dlrelu(s);
          acc[h] += ds;
          if (k >= 0 && ge) ge[k * H + h] = scalar_t(ds);
          if (k < 0 && gl) gl[i * H + h] = scalar_t(ds);
        }
      });
      if (gd)
        for (int64_t h = 0; h < H; ++h) gd[i * H + h] = scalar_t(acc[h]);
    }
  });
}

// Pass B (rows of the transpose, i.e. sources): grad_x and grad_a_src.
template <typename scalar_t, typename index_t>
void backward_sources(const Params& P, const scalar_t* g, const at::opmath_type<scalar_t>* m,
                      const at::opmath_type<scalar_t>* z, const scalar_t* x,
                      const scalar_t* a_src, const scalar_t* a_dst, const scalar_t* a_edge, const scalar_t* a_loop,
                      const index_t* t_rowptr, const index_t* t_col, const index_t* t_pos, const at::opmath_type<scalar_t>* D,
                      Grads G) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t H = P.H, F = P.F, HF = H * F;
  auto* gx = static_cast<scalar_t*>(G.x);
  auto* gs = static_cast<scalar_t*>(G.a_src);
  const int64_t num_t_rows = P.num_src;
  parallel_over_rows(t_rowptr, num_t_rows, HF, [&](int64_t r0, int64_t r1) {
    std::vector<acc_t> acc(HF);
    acc_t acc_s[kMaxHeads];
    for (int64_t j = r0; j < r1; ++j) {
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t h = 0; h < H; ++h) acc_s[h] = 0;
      const scalar_t* xj = x + j * HF;
      auto visit = [&](int64_t i, const scalar_t* et, int64_t id) {
        const scalar_t* gi = g + i * HF;
        for (int64_t h = 0; h < H; ++h) {
          const acc_t s = logit(a_src, a_dst, et, j, i, h, H);
          const acc_t p = std::exp(P.lrelu(s) - m[i * H + h]) / z[i * H + h];
          const acc_t keep = P.keep<acc_t>(id, h);
          const acc_t c = p * keep;
          acc_t* a = acc.data() + h * F;
          const scalar_t* gh = gi + h * F;
          if (gx) {
#pragma omp simd
            for (int64_t f = 0; f < F; ++f) a[f] += c * acc_t(gh[f]);
          }
          if (gs) acc_s[h] += p * (keep * dot(gh, xj + h * F, F) - D[i * H + h]) * P.dlrelu(s);
        }
      };
      for (int64_t q = t_rowptr[j]; q < t_rowptr[j + 1]; ++q) {
        const int64_t i = t_col[q], k = t_pos[q];
        if (P.self_loops && i == j) continue;
        visit(i, a_edge ? a_edge + k * H : nullptr, k);
      }
      if (j < P.num_loops) visit(j, a_loop ? a_loop + j * H : nullptr, P.num_edges + j);
      if (gx)
        for (int64_t f = 0; f < HF; ++f) gx[j * HF + f] = scalar_t(acc[f]);
      if (gs)
        for (int64_t h = 0; h < H; ++h) gs[j * H + h] = scalar_t(acc_s[h]);
    }
  });
}

Params make_params(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col, bool self_loops,
                   double slope, double dropout, int64_t seed) {
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous(), "gat_attention: x must be a contiguous [N_src, H, F] tensor");
  TORCH_CHECK(x.size(1) <= kMaxHeads, "gat_attention: at most 64 heads on CPU");
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0, "gat_attention: dropout must be in [0, 1)");
  Params P;
  P.num_src = x.size(0);
  P.num_dst = rowptr.numel() - 1;
  P.num_edges = col.numel();
  P.H = x.size(1);
  P.F = x.size(2);
  P.self_loops = self_loops;
  P.num_loops = self_loops ? std::min(P.num_src, P.num_dst) : 0;
  P.slope = slope;
  P.seed = uint32_t(seed);
  P.threshold = dropout_threshold(dropout);
  P.scale = 1.0 / (1.0 - dropout);
  return P;
}

template <typename T>
const T* ptr_or_null(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
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
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gat_forward", [&] {
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gat_forward_index", [&] {
      forward_kernel<scalar_t, index_t>(P, x.data_ptr<scalar_t>(), a_src.data_ptr<scalar_t>(),
                                        a_dst.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(a_edge),
                                        ptr_or_null<scalar_t>(a_loop), rowptr.data_ptr<index_t>(),
                                        col.data_ptr<index_t>(), out.data_ptr<scalar_t>(),
                                        m.data_ptr<at::opmath_type<scalar_t>>(), z.data_ptr<at::opmath_type<scalar_t>>());
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
  auto D = at::empty_like(m);  // D_i = g_i . out_i per head, in acc_t
  auto g = grad_out.contiguous();
  auto ptr = [](const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; };
  Grads G{ptr(grads[0]), ptr(grads[1]), ptr(grads[2]), ptr(grads[3]), ptr(grads[4])};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gat_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gat_backward_index", [&] {
      const scalar_t* ae = ptr_or_null<scalar_t>(a_edge);
      const scalar_t* al = ptr_or_null<scalar_t>(a_loop);
      const bool per_edge = G.a_dst || G.a_edge || G.a_loop;
      backward_rows<scalar_t, index_t>(P, g.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), m.data_ptr<acc_t>(),
                                       z.data_ptr<acc_t>(), x.data_ptr<scalar_t>(), a_src.data_ptr<scalar_t>(),
                                       a_dst.data_ptr<scalar_t>(), ae, al, rowptr.data_ptr<index_t>(),
                                       col.data_ptr<index_t>(), D.data_ptr<acc_t>(), G, per_edge);
      if (G.x || G.a_src)
        backward_sources<scalar_t, index_t>(P, g.data_ptr<scalar_t>(), m.data_ptr<acc_t>(), z.data_ptr<acc_t>(),
                                            x.data_ptr<scalar_t>(), a_src.data_ptr<scalar_t>(),
                                            a_dst.data_ptr<scalar_t>(), ae, al, t_rowptr.data_ptr<index_t>(),
                                            t_col.data_ptr<index_t>(), t_pos.data_ptr<index_t>(),
                                            D.data_ptr<acc_t>(), G);
    });
  });
  return grads;
}

}  // namespace
}  // namespace gnnfuse

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gat_forward", &gnnfuse::gat_forward);
  m.def("gat_backward", &gnnfuse::gat_backward);
  m.def("dropout_keep", [](int64_t seed, int64_t edge, int64_t H, int64_t h, double p) {
    return gnnfuse::dropout_keep(uint32_t(seed), edge, H, h, gnnfuse::dropout_threshold(p));
  });
}
