// COO -> CSR by a stable parallel counting sort: O(E + N), no comparison sort.
// Edges are cut into one chunk per thread; each chunk counts its keys, the counts are
// turned into per-chunk write offsets, and each chunk writes its edges in order, so edges
// with the same key keep their original order (stable) whatever the thread count.
#include <ATen/Dispatch.h>
#include <torch/extension.h>

#include "checks.h"
#include "reducer.h"

namespace gnnfuse {
namespace {

// Per-chunk histograms cost chunks x num_rows counters; cap them to keep memory modest.
constexpr int64_t kMaxHistogramEntries = int64_t{1} << 26;
constexpr int64_t kMinEdgesPerChunk = int64_t{1} << 16;

template <typename index_t>
void check_range(const index_t* values, int64_t begin, int64_t end, int64_t limit, int64_t& bad_pos) {
  for (int64_t e = begin; e < end; ++e) {
    const int64_t v = values[e];
    if (v < 0 || v >= limit) {
      bad_pos = e;
      return;
    }
  }
}

template <typename index_t>
void coo_to_csr_kernel(const index_t* key, const index_t* other, int64_t E, int64_t num_rows,
                       int64_t num_other, index_t* rowptr, index_t* col, index_t* perm) {
  int64_t chunks = std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(1, E / kMinEdgesPerChunk));
  chunks = std::max<int64_t>(1, std::min(chunks, kMaxHistogramEntries / std::max<int64_t>(num_rows, 1)));
  auto chunk_begin = [&](int64_t c) { return E * c / chunks; };

  // counts[c * num_rows + r]: first the number of edges of chunk c with key r, then the
  // position where chunk c writes its next edge of row r.
  std::vector<int64_t> counts(chunks * num_rows, 0);
  std::vector<int64_t> bad_key(chunks, -1), bad_other(chunks, -1);
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      check_range(key, chunk_begin(c), chunk_begin(c + 1), num_rows, bad_key[c]);
      check_range(other, chunk_begin(c), chunk_begin(c + 1), num_other, bad_other[c]);
      if (bad_key[c] >= 0) continue;
      int64_t* cnt = counts.data() + c * num_rows;
      for (int64_t e = chunk_begin(c); e < chunk_begin(c + 1); ++e) cnt[key[e]] += 1;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) {
    TORCH_CHECK_VALUE(bad_key[c] < 0, text("edge_index[1] (targets) contains node id ", int64_t(key[bad_key[c]]),
                                           " at edge ", bad_key[c], ", outside [0, ", num_rows,
                                           "); pass num_nodes >= max target + 1 (or a larger x)"));
    TORCH_CHECK_VALUE(bad_other[c] < 0, text("edge_index[0] (sources) contains node id ",
                                             int64_t(other[bad_other[c]]), " at edge ", bad_other[c], ", outside [0, ",
                                             num_other, "); x must have more rows than the largest source id"));
  }

  // rowptr by an exclusive scan over rows; then per-chunk offsets inside each row.
  rowptr[0] = 0;
  int64_t running = 0;
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t& slot = counts[c * num_rows + r];
      const int64_t n = slot;
      slot = running;
      running += n;
    }
    rowptr[r + 1] = static_cast<index_t>(running);
  }

  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      int64_t* next = counts.data() + c * num_rows;
      for (int64_t e = chunk_begin(c); e < chunk_begin(c + 1); ++e) {
        const int64_t pos = next[key[e]]++;
        col[pos] = other[e];
        perm[pos] = static_cast<index_t>(e);
      }
    }
  });
}

// Sorts edges (key[e] -> other[e]) by key. Returns rowptr [num_rows + 1], col [E] (other,
// sorted) and perm [E] (sorted position -> original edge id), all in the input index dtype.
std::tuple<at::Tensor, at::Tensor, at::Tensor> coo_to_csr(const at::Tensor& key, const at::Tensor& other,
                                                          int64_t num_rows, int64_t num_other) {
  TORCH_CHECK(key.dim() == 1 && other.dim() == 1 && key.numel() == other.numel(),
              "coo_to_csr: key and other must be 1-D tensors of equal length");
  TORCH_CHECK(key.scalar_type() == other.scalar_type(), "coo_to_csr: key and other dtypes differ");
  TORCH_CHECK(num_rows >= 0 && num_other >= 0, "coo_to_csr: node counts must be non-negative");
  const auto k = key.contiguous(), o = other.contiguous();
  const int64_t E = k.numel();
  auto rowptr = at::empty({num_rows + 1}, k.options());
  auto col = at::empty({E}, k.options());
  auto perm = at::empty({E}, k.options());
  AT_DISPATCH_INDEX_TYPES(k.scalar_type(), "coo_to_csr", [&] {
    coo_to_csr_kernel<index_t>(k.data_ptr<index_t>(), o.data_ptr<index_t>(), E, num_rows, num_other,
                               rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(), perm.data_ptr<index_t>());
  });
  return {rowptr, col, perm};
}

}  // namespace

void register_csr(pybind11::module& m) { m.def("coo_to_csr", &coo_to_csr); }

}  // namespace gnnfuse
