// Pieces shared by the fused attention kernels (attention.cpp: GAT; pair_attention.cpp: GATv2 and
// dot-product): the parameters and dropout, a vectorisable exp, the walk of a row's edges (with
// PyG's remove + add self loops), feature-loop helpers and row scratch space.
#pragma once
#include <ATen/OpMathType.h>
#include <torch/extension.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "dropout_hash.h"
#include "reducer.h"
#include "row_tiles.h"

// The tile kernels' row helpers are inlined into each kernel (left to itself GCC calls some of them
// once per row and tile through the PLT, and keeps their state in memory).
#if defined(__GNUC__)
#define GNNFUSE_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define GNNFUSE_ALWAYS_INLINE inline
#endif

namespace gnnfuse {
namespace attention_detail {

constexpr int64_t kMaxHeads = 64;  // per-row head state lives on the stack

struct Params {
  int64_t num_src, num_dst, num_edges, H, F, num_loops;  // num_loops: rows with a virtual self loop
  bool self_loops;
  double slope;
  uint32_t seed, threshold;  // threshold == 0: no dropout
  double scale;              // 1 / (1 - dropout)
  template <typename T>
  inline T lrelu(T s) const { return s > T(0) ? s : s * T(slope); }
  template <typename T>
  inline T dlrelu(T s) const { return s > T(0) ? T(1) : T(slope); }
};
// Logits, softmax statistics and accumulators use acc_t: float for float/half types, double for double.

// exp for the softmax weights, written so that `omp simd` loops vectorise it (std::exp, std::floor
// and std::fmax are library calls that keep GCC from vectorising): Cephes' expf (round-to-nearest
// range reduction by ln 2 with the 1.5 * 2^23 trick, degree-6 polynomial; relative error < 1e-7 on
// [-87, 0]); x < -87 gives 0 (exp(-inf) = 0), NaN stays NaN. Arguments are logit - row max <= 0.
inline float exp_simd(float x0) {
  const float x = x0 > -87.0f ? (x0 < 88.0f ? x0 : 88.0f) : -87.0f;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float two_n = __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
  const float y = x0 >= -87.0f ? p * two_n : 0.0f;
  return x0 != x0 ? x0 : y;
}
inline double exp_simd(double x) { return std::exp(x); }

// exp on GCC vector types: the softmax weights of the register-tile kernels (every tile forward and
// backward, so the backwards recompute the forward's weights bit for bit). exp(x) = 2^(k/16) e^r
// with k = round(16 x / ln 2) and r = x - k ln 2 / 16 (Cody-Waite, |r| <= ln 2 / 32): 2^(k/16) is
// 2^(k >> 4) (exponent bits) times a 16-entry table of 2^(j/16), e^r ~ 1 + r + r^2 (1/2 + r/6).
// Short dependency chains (the forwards' rows are a few edges long, so the exp's latency is what
// they wait on): 7 FMAs deep against the degree-6 polynomial's 13. Relative error <= 1.2e-7 on
// [-87.3, 0] (every float there, against double exp), exp(0) = 1; x < -87.3 (and -inf) gives 0,
// NaN stays NaN, x > 88 counts as 88 (never inf). Not exp_simd's bits (the scalar kernels' exp).
alignas(64) inline constexpr float kExp2Sixteenths[16] = {  // 2^(j / 16) rounded to float
    1.0f, 1.04427378242741384f, 1.09050773266525766f, 1.13878863475669165f, 1.18920711500272107f,
    1.24185781207348405f, 1.29683955465100967f, 1.35425554693689273f, 1.41421356237309505f, 1.47682614593949931f,
    1.54221082540794082f, 1.61049033194925431f, 1.68179283050742909f, 1.75625216037329948f, 1.83400808640934246f,
    1.91520656139714729f};
typedef int32_t Int16Lanes __attribute__((vector_size(64)));
typedef uint32_t UInt16Lanes __attribute__((vector_size(64)));  // shifts that drop high bits: defined unsigned

// Lane l: kExp2Sixteenths[k[l] & 15].
inline Vec64<float> exp2_sixteenths(const Int16Lanes& k) {
#if defined(__AVX512F__)
  return (Vec64<float>)_mm512_permutexvar_ps((__m512i)k, _mm512_load_ps(kExp2Sixteenths));
#elif defined(__AVX2__)
  const __m256 lo = _mm256_load_ps(kExp2Sixteenths), hi = _mm256_load_ps(kExp2Sixteenths + 8);
  __m256i idx[2];
  __m256 out[2];
  std::memcpy(idx, &k, sizeof idx);
  for (int half = 0; half < 2; ++half)  // bit 3 of the index picks the table's upper half
    out[half] = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx[half]), _mm256_permutevar8x32_ps(hi, idx[half]),
                                 _mm256_castsi256_ps(_mm256_slli_epi32(idx[half], 28)));
  Vec64<float> y;
  std::memcpy(&y, out, sizeof y);
  return y;
#else
  Vec64<float> y;
  for (int l = 0; l < kLanes<float>; ++l) y[l] = kExp2Sixteenths[k[l] & 15];
  return y;
#endif
}

inline Vec64<float> exp_vec16(const Vec64<float>& x0) {
  using V = Vec64<float>;
#if defined(__AVX512F__)
  const V x = (V)_mm512_min_ps(_mm512_set1_ps(88.0f), (__m512)x0);  // NaN stays NaN (vminps returns its second)
#else
  const V x = x0 > 88.0f ? V{} + 88.0f : x0;  // NaN stays NaN
#endif
  const V t = x * 23.0831206542233f + 12582912.0f;  // 16 / ln 2; adding 1.5 * 2^23 rounds to an integer
  const V k = t - 12582912.0f;
  const V r = (x - k * 0.0433349609375f) + k * 1.32621525e-5f;  // ln 2 / 16 = 0.0433349609375 - 1.32621525e-5
  const V q = (r * 0.166666672f + 0.5f) * (r * r) + r;          // e^r - 1
  const Int16Lanes kb = (Int16Lanes)t;                          // k + 1.5 * 2^23 in the low bits
  // 2^(k/16): the table entry plus k >> 4 in the exponent bits (k >> 4 >= -126 above -87.3)
  const V s = (V)((Int16Lanes)exp2_sixteenths(kb) + (Int16Lanes)((UInt16Lanes)(kb & ~15) << 19));
  const V y = q * s + s;
  return x0 < -87.3f ? V{} : y;
}

// exp_vec16 on any head vector (HeadVec<1 .. 16>): its N lanes repeated over 16, the same operations.
template <typename V, size_t... I>
inline Vec64<float> repeat_lanes(const V& x, std::index_sequence<I...>) {
  constexpr size_t N = sizeof(V) / sizeof(float);
  if constexpr (N == 1) return Vec64<float>{} + x[0];
  else return __builtin_shufflevector(x, x, int(I % N)...);
}
template <typename V, size_t... I>
inline V first_lanes(const Vec64<float>& y, std::index_sequence<I...>) {
  if constexpr (sizeof...(I) == 1) return V{y[0]};
  else return __builtin_shufflevector(y, y, int(I)...);
}
template <typename V>
inline V exp_vec(const V& x) {
  constexpr size_t N = sizeof(V) / sizeof(float);
  if constexpr (N == kLanes<float>) return exp_vec16(x);
  else return first_lanes<V>(exp_vec16(repeat_lanes(x, std::make_index_sequence<kLanes<float>>{})),
                             std::make_index_sequence<N>{});
}

// H per-head values of one edge as one vector (H = 1, 2, 4, 8, 16), loaded and stored unaligned.
template <int N>
struct HeadVecOf;
template <>
struct HeadVecOf<1> {
  typedef float type __attribute__((vector_size(4)));
};
template <>
struct HeadVecOf<2> {
  typedef float type __attribute__((vector_size(8)));
};
template <>
struct HeadVecOf<4> {
  typedef float type __attribute__((vector_size(16)));
};
template <>
struct HeadVecOf<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct HeadVecOf<16> {
  typedef float type __attribute__((vector_size(64)));
};
template <int N>
using HeadVec = typename HeadVecOf<N>::type;

template <int N>
inline HeadVec<N> load_heads(const float* p) {
  HeadVec<N> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int N>
inline void store_heads(float* p, const HeadVec<N>& v) {
  std::memcpy(p, &v, sizeof v);
}
template <int N>
inline HeadVec<N> lrelu_heads(const HeadVec<N>& s, float slope) {
  return s > HeadVec<N>{} ? s : s * slope;
}
template <int N>
inline HeadVec<N> dlrelu_heads(const HeadVec<N>& s, float slope) {
  return s > HeadVec<N>{} ? HeadVec<N>{} + 1.0f : HeadVec<N>{} + slope;
}

// One edge of a row as the kernels walk it: the other endpoint, the CSR position (-1 for the
// virtual self loop) and the dropout id (the CSR position, E + node for the loop).
struct Edge {
  int64_t other, pos, id;
};

// A row's edges, in a buffer that only grows (once the longest row has been seen no row
// allocates) and with an append the compiler inlines (std::vector's push_back stayed an
// out-of-line call per edge, a tenth of the GAT forward's time).
class EdgeList {
 public:
  void clear() { n_ = 0; }
  void reserve(int64_t count) {
    if (int64_t(buf_.size()) < count) buf_.resize(count);
  }
  void push_back(const Edge& e) { buf_[n_++] = e; }  // within what reserve() made room for
  int64_t size() const { return n_; }
  const Edge& operator[](int64_t i) const { return buf_[i]; }
  // The row walk the tile kernels take (attention_tiles.h; CsrRow is the other): edge e's other
  // endpoint, and a prefetch of the rows (width `width`) read kAhead edges further on in this row.
  int64_t other(int64_t e) const { return buf_[e].other; }
  static constexpr bool kPrefetchPerTile = false;  // the first tile prefetches the whole row
  template <int kLines, typename T>
  void prefetch_ahead(const T* rows, int64_t width, int64_t e, int64_t f0) const;

 private:
  std::vector<Edge> buf_;
  int64_t n_ = 0;
};

// Feature rows of other endpoints are random reads: the first kAhead are prefetched while the
// row's edges are collected, later ones kAhead edges before use (as the gather-scatter kernel does).
constexpr int64_t kAhead = 8;

template <typename scalar_t>
GNNFUSE_ALWAYS_INLINE void prefetch_row(const scalar_t* row, int64_t elems) {
  const char* c = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < elems * int64_t(sizeof(scalar_t)); b += 64) __builtin_prefetch(c + b, 0, 1);
}

template <int kLines, typename T>
void EdgeList::prefetch_ahead(const T* rows, int64_t width, int64_t e, int64_t) const {
  if (e + kAhead < n_) prefetch_row(rows + buf_[e + kAhead].other * width, width);  // the whole row
}

// A target row's incoming edges as the tile forwards walk them, read in place from the CSR (no
// per-edge copy): edges 0 .. n-1 are nbr[0 : n) at CSR positions begin + e (their dropout ids;
// a row with self loops to skip walks a compacted copy that keeps its positions in ids), then,
// with self loops, the virtual loop (other = node) as edge n. The rows the walk reads are
// prefetched as the sum kernel does (row_tiles.h): `ahead` edges further on in CSR order, across
// row boundaries up to stream_end (the end of the thread's rows), the first lines of each row.
template <typename index_t>
struct CsrRow {
  const index_t* col;  // the whole CSR's neighbours: the prefetch stream
  const index_t* nbr;  // this row's walked edges
  const int64_t* ids;  // nullptr: edge e sits at CSR position begin + e
  int64_t begin, n, count, node, loop_id, stream_end, ahead;
  int64_t size() const { return count; }
  int64_t other(int64_t e) const { return e < n ? int64_t(nbr[e]) : node; }
  int64_t pos(int64_t e) const { return ids ? ids[e] : begin + e; }  // a real edge's CSR position
  int64_t id(int64_t e) const { return e < n ? pos(e) : loop_id; }
  static constexpr bool kPrefetchPerTile = true;
  // Lines [f0, f0 + kLines * 16 floats) of the row `ahead` edges further on in CSR order: each
  // tile prefetches what its own walk of the rows reads (a whole 1 KB row at once per edge, 4 x 64,
  // left the next rows' prefetches waiting on the line fill buffers).
  template <int kLines, typename T>
  GNNFUSE_ALWAYS_INLINE void prefetch_ahead(const T* rows, int64_t width, int64_t e, int64_t f0) const {
    const int64_t q = begin + e + ahead;
    if (q < stream_end) prefetch_lines<kLines>(rows + int64_t(col[q]) * width + f0);
  }
};

// How many edges ahead a tile forward's CsrRow prefetches, for rows of HF floats read from a matrix
// of num_rows rows: each tile prefetches only its own lines of a row (at most kPrefetchLines), so
// where the rows come from memory the bytes in flight that prefetch_ahead aims at are counted in
// those lines, not in whole rows (4 x 64 rows, 1 KB: 32 edges instead of 8). Facebook 4 x 64 (23 MB
// of rows), 1 thread, same process: dot forward 20.1 -> 16.3 ms, GATv2 14.5 -> 12.7, GAT 10.3 ->
// 8.9 (64 edges: no faster). Where the rows fit in this CPU's caches (kCachedRows) the whole-row
// distance stays: Cora 4 x 64 (2.7 MB) took GAT 294 -> 319 us with 32. Rows up to 256 bytes
// (8 x 8 and narrower) get the same distance either way.
constexpr int64_t kCachedRows = int64_t(8) << 20;
inline int64_t tile_prefetch_ahead(int64_t HF, int64_t num_rows) {
  const int64_t row_bytes = HF * int64_t(sizeof(float));
  if (num_rows * row_bytes <= kCachedRows) return prefetch_ahead(row_bytes);
  return prefetch_ahead(std::min<int64_t>(row_bytes, kPrefetchLines * 64));
}

// Where a row with self loops to skip keeps its compacted edges (rare: most graphs have none).
template <typename index_t>
struct RowCopy {
  std::vector<index_t> nbr;
  std::vector<int64_t> ids;
};

// Row `node` of (rowptr, col) as a CsrRow (see there); the prefetch stream runs `ahead` edges on,
// up to stream_end.
template <typename index_t>
inline CsrRow<index_t> csr_row(const Params& P, const index_t* rowptr, const index_t* col, int64_t node,
                               int64_t stream_end, int64_t ahead, RowCopy<index_t>& copy) {
  const int64_t begin = rowptr[node], n = int64_t(rowptr[node + 1]) - begin;
  CsrRow<index_t> row{col, col + begin, nullptr, begin, n, n, node, P.num_edges + node, stream_end, ahead};
  if (P.self_loops) {
    bool self = false;
    for (int64_t e = 0; e < n; ++e) self |= int64_t(row.nbr[e]) == node;
    if (self) {
      copy.nbr.resize(n), copy.ids.resize(n);
      int64_t kept = 0;
      for (int64_t e = 0; e < n; ++e)
        if (int64_t(row.nbr[e]) != node) copy.nbr[kept] = row.nbr[e], copy.ids[kept++] = begin + e;
      row.nbr = copy.nbr.data(), row.ids = copy.ids.data(), row.n = kept;
    }
  }
  row.count = row.n + (node < P.num_loops ? 1 : 0);
  return row;
}

// The edges of `node`'s row in (ptr, nbr[, pos]): the graph (targets) or its transpose (sources).
// With self loops, edges to the node itself are skipped and the virtual loop comes last.
// `rows` (row width `width`) is the feature matrix the caller will read at the other endpoints.
template <typename index_t, typename scalar_t>
void collect_edges(const Params& P, const index_t* ptr, const index_t* nbr, const index_t* pos, int64_t node,
                   EdgeList& edges, const scalar_t* rows, int64_t width) {
  edges.clear();
  edges.reserve(int64_t(ptr[node + 1] - ptr[node]) + 1);  // the row's edges and the virtual loop
  for (int64_t q = ptr[node]; q < ptr[node + 1]; ++q) {
    const int64_t other = nbr[q], k = pos ? int64_t(pos[q]) : q;
    if (P.self_loops && other == node) continue;
    if (int64_t(edges.size()) < kAhead) prefetch_row(rows + other * width, width);
    edges.push_back({other, k, k});
  }
  if (node < P.num_loops) edges.push_back({node, -1, P.num_edges + node});
}

// Prefetches what row `node` of (ptr, nbr) reads at its other endpoints -- the rows_a and rows_b
// rows of its first kAheadRow edges -- while the row before it is worked on. Rows of sparse graphs
// are short (tens of edges), so a look-ahead within the row alone leaves each row's first reads
// waiting on memory (the register-tile kernels spent a fifth of their time there).
constexpr int64_t kAheadRow = 16;
template <typename index_t, typename A, typename B>
inline void prefetch_next_row(const index_t* ptr, const index_t* nbr, int64_t node, int64_t num_rows,
                              const A* rows_a, int64_t width_a, const B* rows_b, int64_t width_b) {
  if (node >= num_rows) return;
  const int64_t q1 = std::min<int64_t>(int64_t(ptr[node + 1]), int64_t(ptr[node]) + kAheadRow);
  for (int64_t q = ptr[node]; q < q1; ++q) {
    const int64_t other = nbr[q];
    prefetch_row(rows_a + other * width_a, width_a);
    prefetch_row(rows_b + other * width_b, width_b);
  }
}

// Feature loops with the head width F as a compile-time constant where it is common (8, 16), so
// each head's update is a few full vector instructions; FF = 0 is the runtime-width fallback.
template <int FF, typename acc_t, typename scalar_t>
inline void axpy(acc_t* __restrict a, const scalar_t* __restrict x, acc_t c, int64_t F) {
  const int64_t n = FF ? FF : F;
#pragma omp simd
  for (int64_t f = 0; f < n; ++f) a[f] += c * acc_t(x[f]);
}

template <int FF, typename acc_t, typename scalar_t>
inline acc_t dot(const scalar_t* __restrict a, const scalar_t* __restrict b, int64_t F) {
  const int64_t n = FF ? FF : F;
  acc_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t f = 0; f < n; ++f) s += acc_t(a[f]) * acc_t(b[f]);
  return s;
}

template <typename Fn>
void dispatch_width(int64_t F, Fn&& fn) {
  if (F == 8) fn(std::integral_constant<int, 8>{});
  else if (F == 16) fn(std::integral_constant<int, 16>{});
  else fn(std::integral_constant<int, 0>{});
}

// Readable entries past a row's n * H softmax weights (attention_tiles.h loads a whole vector
// of an edge's weights).
constexpr int64_t kWeightPad = 16;

// A row buffer of at least `count` entries and kWeightPad readable ones past them; it only grows.
template <typename T>
inline T* row_buffer(std::vector<T>& v, int64_t count) {
  if (int64_t(v.size()) < count + kWeightPad) v.resize(count + kWeightPad);
  return v.data();
}

// The head count as a compile-time constant (1, 2, 4, 8, 16) for the register-tile kernels: their
// per-edge work over the heads (logits, softmax, gradients) is then one HeadVec of instructions.
inline bool head_vectors_fit(int64_t H) { return H == 1 || H == 2 || H == 4 || H == 8 || H == 16; }
template <typename Fn>
void dispatch_heads(int64_t H, Fn&& fn) {
  if (H == 8) fn(std::integral_constant<int, 8>{});
  else if (H == 4) fn(std::integral_constant<int, 4>{});
  else if (H == 2) fn(std::integral_constant<int, 2>{});
  else if (H == 16) fn(std::integral_constant<int, 16>{});
  else fn(std::integral_constant<int, 1>{});  // only where head_vectors_fit
}

inline int64_t edge_id(const EdgeList& edges, int64_t e) { return edges[e].id; }
template <typename index_t>
inline int64_t edge_id(const CsrRow<index_t>& row, int64_t e) { return row.id(e); }

// The dropout counters of a row's edges, counter[e * H + h] = id(e) * H + h.
inline void edge_counters(const EdgeList& edges, int64_t H, uint32_t* counter) {
  for (int64_t e = 0; e < edges.size(); ++e)
    for (int64_t h = 0; h < H; ++h) counter[e * H + h] = uint32_t(edges[e].id) * uint32_t(H) + uint32_t(h);
}
// A CsrRow's, with the test of row.ids out of the loop: inside it, GCC vectorised the choice into a
// masked load of ids[e] that, with ids null, took a fault-suppression assist per vector on this AMD
// CPU (a third of the GAT forward's time on Facebook 8x8 with dropout).
template <typename index_t>
inline void edge_counters(const CsrRow<index_t>& row, int64_t H, uint32_t* counter) {
  const uint32_t HH = uint32_t(H);
  if (row.ids) {
    for (int64_t e = 0; e < row.n; ++e)
      for (int64_t h = 0; h < H; ++h) counter[e * H + h] = uint32_t(row.ids[e]) * HH + uint32_t(h);
  } else {
    for (int64_t e = 0; e < row.n; ++e)
      for (int64_t h = 0; h < H; ++h) counter[e * H + h] = uint32_t(row.begin + e) * HH + uint32_t(h);
  }
  for (int64_t e = row.n; e < row.count; ++e)  // the virtual self loop
    for (int64_t h = 0; h < H; ++h) counter[e * H + h] = uint32_t(row.loop_id) * HH + uint32_t(h);
}

template <typename acc_t>
struct Scratch {
  EdgeList edges;
  std::vector<acc_t> s, w, keep;  // per (edge, head): pre-activation logit; softmax weight; dropout factor
  std::vector<acc_t> dots, c;     // per (edge, head): the register-tile paths' dot products and coefficients
  std::vector<uint32_t> counter;
  void size_for(int64_t H) {
    s.resize(edges.size() * H);
    w.resize(edges.size() * H + kWeightPad);
  }
  // keep[e * H + h]: edge e's dropout factor for head h, 1 / (1 - p) where kept and 0 where
  // dropped (dropout_keep's mask, bit for bit), for the whole row at once: the counters first,
  // then the hash in one loop over n * H lanes that the compiler vectorises (computed per (edge,
  // head) inside the kernels' loops it ran scalar and cost more than the softmax).
  void fill_keep(const Params& P, int64_t H) { fill_keep(P, H, edges); }
  template <typename Row>  // EdgeList or CsrRow: edge e's dropout id is row[e].id or row.id(e)
  void fill_keep(const Params& P, int64_t H, const Row& row) {
    const int64_t n = row.size();
    keep.resize(n * H);
    const acc_t kept = acc_t(P.scale);
    if (P.threshold == 0) {
      std::fill(keep.begin(), keep.end(), kept);
      return;
    }
    counter.resize(n * H);
    edge_counters(row, H, counter.data());
    const uint32_t seed = P.seed, threshold = P.threshold;
    const uint32_t* c = counter.data();
    acc_t* k = keep.data();
#pragma omp simd
    for (int64_t q = 0; q < n * H; ++q) k[q] = (fmix32(fmix32(c[q]) ^ seed) >> 8) >= threshold ? kept : acc_t(0);
  }
};

inline Params make_params(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col, bool self_loops,
                          double slope, double dropout, int64_t seed, const std::string& op = "gat_attention") {
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous(), op + ": x must be a contiguous [N_src, H, F] tensor");
  TORCH_CHECK(x.size(1) <= kMaxHeads, op + ": at most 64 heads on CPU");
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0, op + ": dropout must be in [0, 1)");
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

}  // namespace attention_detail
}  // namespace gnnfuse
