// Uniform neighbour sampling for mini-batch training (gnnfuse.loader.NeighborSampler, CPU).
//
// The graph is given by target (CSC: colptr over targets, row = the source of each in-edge), so a
// node's in-neighbours are one contiguous run. Each hop samples up to `fanout` in-neighbours of
// every frontier node and emits its edges target by target: the batch's edge list comes out
// sorted by target (CSR order for the fused op), with no later sort.
//
// Parallel and reproducible: every target draws from its own counter-based stream
// splitmix64(seed, hop, target), and new nodes get local ids in order of first appearance in the
// hop's edge list (found with an atomic minimum per node, then a scan), so the output depends on
// the seed alone, never on the thread count.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "checks.h"

namespace gnnfuse {
namespace {

constexpr int64_t kGrain = 1024;
constexpr int64_t kUnseen = std::numeric_limits<int64_t>::max();

inline uint64_t next_random(uint64_t& state) {  // splitmix64
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline int64_t below(uint64_t& state, int64_t n) {  // uniform in [0, n) by multiply-shift
  return static_cast<int64_t>((static_cast<__uint128_t>(next_random(state)) * static_cast<uint64_t>(n)) >> 64);
}

inline void atomic_min(int64_t* slot, int64_t value) {
  int64_t seen = __atomic_load_n(slot, __ATOMIC_RELAXED);
  while (value < seen && !__atomic_compare_exchange_n(slot, &seen, value, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

inline int64_t sample_count(int64_t degree, int64_t fanout, bool replace) {
  if (fanout < 0) return degree;  // -1: every neighbour
  if (replace) return degree > 0 ? fanout : 0;
  return std::min(degree, fanout);
}

// The `count` positions (in [0, degree)) picked for one target; `count` from sample_count.
inline void pick(int64_t degree, int64_t count, bool replace, uint64_t state, int64_t* out) {
  if (count == degree && !replace) {
    for (int64_t i = 0; i < count; ++i) out[i] = i;
  } else if (replace) {
    for (int64_t i = 0; i < count; ++i) out[i] = below(state, degree);
  } else {  // Floyd's algorithm: `count` distinct positions, uniformly, in O(count^2) without a buffer
    for (int64_t i = 0; i < count; ++i) {
      const int64_t j = degree - count + i;
      const int64_t r = below(state, j + 1);
      bool taken = false;
      for (int64_t q = 0; q < i && !taken; ++q) taken = out[q] == r;
      out[i] = taken ? j : r;
    }
  }
}

struct Sample {
  std::vector<int64_t> nodes, rows, cols, edges, nodes_per_hop, edges_per_hop;
};

template <typename index_t>
Sample sample_kernel(const int64_t* colptr, const index_t* row, const int64_t* seeds, int64_t num_seeds,
                     const std::vector<int64_t>& fanouts, bool replace, uint64_t seed, int64_t* local,
                     int64_t* first) {
  Sample s;
  s.nodes.assign(seeds, seeds + num_seeds);
  for (int64_t i = 0; i < num_seeds; ++i) local[seeds[i]] = i;  // a repeated seed keeps its last id
  s.nodes_per_hop.push_back(num_seeds);
  int64_t hop_begin = 0;
  std::vector<int64_t> offsets, neighbours;
  std::vector<uint8_t> is_new;
  for (size_t hop = 0; hop < fanouts.size(); ++hop) {
    const int64_t fanout = fanouts[hop];
    const int64_t hop_end = static_cast<int64_t>(s.nodes.size());
    const int64_t T = hop_end - hop_begin;
    offsets.assign(T + 1, 0);
    at::parallel_for(0, T, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t v = s.nodes[hop_begin + t];
        offsets[t + 1] = sample_count(colptr[v + 1] - colptr[v], fanout, replace);
      }
    });
    for (int64_t t = 0; t < T; ++t) offsets[t + 1] += offsets[t];
    const int64_t E = offsets[T], base = static_cast<int64_t>(s.rows.size());
    s.rows.resize(base + E);
    s.cols.resize(base + E);
    s.edges.resize(base + E);
    neighbours.resize(E);
    at::parallel_for(0, T, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t v = s.nodes[hop_begin + t], start = colptr[v], count = offsets[t + 1] - offsets[t];
        int64_t* picked = s.edges.data() + base + offsets[t];
        uint64_t state = seed ^ (0x632BE59BD9B4E019ull * (hop + 1)) ^ (0x9E3779B97F4A7C15ull * (hop_begin + t));
        next_random(state);
        pick(colptr[v + 1] - start, count, replace, state, picked);
        for (int64_t i = 0; i < count; ++i) {
          picked[i] += start;  // CSC position of the edge
          neighbours[offsets[t] + i] = static_cast<int64_t>(row[picked[i]]);
          s.cols[base + offsets[t] + i] = hop_begin + t;
        }
      }
    });
    // New nodes, numbered in order of first appearance among the hop's edges.
    at::parallel_for(0, E, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p)
        if (local[neighbours[p]] < 0) atomic_min(first + neighbours[p], p);
    });
    is_new.assign(E, 0);
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), E / kGrain));
    std::vector<int64_t> chunk_new(chunks + 1, 0);
    at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c)
        for (int64_t p = E * c / chunks; p < E * (c + 1) / chunks; ++p) {
          const int64_t u = neighbours[p];
          is_new[p] = local[u] < 0 && first[u] == p;
          chunk_new[c + 1] += is_new[p];
        }
    });
    for (int64_t c = 0; c < chunks; ++c) chunk_new[c + 1] += chunk_new[c];
    s.nodes.resize(hop_end + chunk_new[chunks]);
    at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        int64_t id = hop_end + chunk_new[c];
        for (int64_t p = E * c / chunks; p < E * (c + 1) / chunks; ++p)
          if (is_new[p]) {
            const int64_t u = neighbours[p];
            s.nodes[id] = u;
            local[u] = id++;
            first[u] = kUnseen;
          }
      }
    });
    at::parallel_for(0, E, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) s.rows[base + p] = local[neighbours[p]];
    });
    s.nodes_per_hop.push_back(chunk_new[chunks]);
    s.edges_per_hop.push_back(E);
    hop_begin = hop_end;
  }
  // leave the scratch maps as they came: all -1 / all unseen
  at::parallel_for(0, static_cast<int64_t>(s.nodes.size()), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) local[s.nodes[i]] = -1;
  });
  return s;
}

at::Tensor to_tensor(const std::vector<int64_t>& v) {
  auto t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  return t;
}

// colptr [N + 1] int64, row [E] int32/int64 (CSC of the graph); seeds [B] int64; local/first [N]
// int64 scratch maps, all -1 / all INT64_MAX on entry and on return. Returns (node, row, col,
// edge = CSC position, nodes per hop, edges per hop). Arguments are checked in Python.
std::vector<at::Tensor> neighbor_sample(const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& seeds,
                                        std::vector<int64_t> fanouts, bool replace, int64_t seed, at::Tensor local,
                                        at::Tensor first) {
  TORCH_CHECK(colptr.scalar_type() == at::kLong && seeds.scalar_type() == at::kLong &&
                  local.scalar_type() == at::kLong && first.scalar_type() == at::kLong,
              "neighbor_sample: colptr, seeds and the scratch maps must be int64");
  TORCH_CHECK(colptr.is_contiguous() && row.is_contiguous() && seeds.is_contiguous() && local.is_contiguous() &&
                  first.is_contiguous(),
              "neighbor_sample: tensors must be contiguous");
  Sample s;
  {
    pybind11::gil_scoped_release no_gil;
    AT_DISPATCH_INDEX_TYPES(row.scalar_type(), "neighbor_sample", [&] {
      s = sample_kernel<index_t>(colptr.data_ptr<int64_t>(), row.data_ptr<index_t>(), seeds.data_ptr<int64_t>(),
                                 seeds.numel(), fanouts, replace, static_cast<uint64_t>(seed),
                                 local.data_ptr<int64_t>(), first.data_ptr<int64_t>());
    });
  }
  return {to_tensor(s.nodes), to_tensor(s.rows), to_tensor(s.cols), to_tensor(s.edges),
          to_tensor(s.nodes_per_hop), to_tensor(s.edges_per_hop)};
}

}  // namespace
}  // namespace gnnfuse

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("neighbor_sample", &gnnfuse::neighbor_sample); }
