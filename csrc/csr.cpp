// COO -> CSR by a stable parallel counting sort: O(E + N), no comparison sort.
// Edges are cut into one chunk per thread; each chunk counts its keys, the counts are
// turned into per-chunk write offsets, and each chunk writes its edges in order, so edges
// with the same key keep their original order (stable) whatever the thread count.
#include <ATen/Dispatch.h>
#include <torch/extension.h>

#include <atomic>

#include "checks.h"
#include "reducer.h"

namespace gnnfuse {
namespace {

// Per-chunk histograms cost chunks x num_rows counters; cap them to keep memory modest.
constexpr int64_t kMaxHistogramEntries = int64_t{1} << 26;
constexpr int64_t kMinEdgesPerChunk = int64_t{1} << 16;
// The permutation check's per-thread bitmaps (E / 8 bytes each) stay within this many bytes together.
constexpr int64_t kMaxBitmapBytes = int64_t{1} << 28;
constexpr int64_t kMergeGrain = int64_t{1} << 16;  // words of the permutation bitmaps merged inline
// The validation scans run near memory bandwidth on one thread (~0.4 ms for 1.2M edges); waking a
// second thread cost more than it saved below a few million edges (measured 0.87 vs 0.37 ms on a
// 2-vCPU VM), so a validation chunk is at least this many edges.
constexpr int64_t kMinValidateEdgesPerChunk = int64_t{1} << 22;

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

// in_t: the ids as given (range-checked in that type, so an int64 id is never narrowed before
// its check); out_t: the CSR's index type (int32 whenever the graph fits, see csr.py).
template <typename in_t, typename out_t>
void coo_to_csr_kernel(const in_t* key, const in_t* other, int64_t E, int64_t num_rows,
                       int64_t num_other, out_t* rowptr, out_t* col, out_t* perm) {
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
    TORCH_CHECK_INDEX(bad_key[c] < 0, text("edge_index[1] (targets) contains node id ", int64_t(key[bad_key[c]]),
                                           " at edge ", bad_key[c], ", outside [0, ", num_rows,
                                           "); pass num_nodes >= max target + 1 (or a larger x)"));
    TORCH_CHECK_INDEX(bad_other[c] < 0, text("edge_index[0] (sources) contains node id ",
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
    rowptr[r + 1] = static_cast<out_t>(running);
  }

  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      int64_t* next = counts.data() + c * num_rows;
      for (int64_t e = chunk_begin(c); e < chunk_begin(c + 1); ++e) {
        const int64_t pos = next[key[e]]++;
        col[pos] = static_cast<out_t>(other[e]);
        perm[pos] = static_cast<out_t>(e);
      }
    }
  });
}

// Sorts edges (key[e] -> other[e]) by key. Returns rowptr [num_rows + 1], col [E] (other,
// sorted) and perm [E] (sorted position -> original edge id), int32 if `out_int32`, else of the
// input's index dtype. Ids are range-checked in the input dtype before any narrowing.
std::tuple<at::Tensor, at::Tensor, at::Tensor> coo_to_csr(const at::Tensor& key, const at::Tensor& other,
                                                          int64_t num_rows, int64_t num_other,
                                                          bool out_int32) {
  TORCH_CHECK(key.dim() == 1 && other.dim() == 1 && key.numel() == other.numel(),
              "coo_to_csr: key and other must be 1-D tensors of equal length");
  TORCH_CHECK(key.scalar_type() == other.scalar_type(), "coo_to_csr: key and other dtypes differ");
  TORCH_CHECK(num_rows >= 0 && num_other >= 0, "coo_to_csr: node counts must be non-negative");
  const auto out_type = out_int32 ? at::kInt : key.scalar_type();
  const auto k = key.contiguous(), o = other.contiguous();
  const int64_t E = k.numel();
  const auto options = k.options().dtype(out_type);
  auto rowptr = at::empty({num_rows + 1}, options);
  auto col = at::empty({E}, options);
  auto perm = at::empty({E}, options);
  AT_DISPATCH_INDEX_TYPES(k.scalar_type(), "coo_to_csr", [&] {
    using in_t = index_t;
    AT_DISPATCH_INDEX_TYPES(out_type, "coo_to_csr_out", [&] {
      coo_to_csr_kernel<in_t, index_t>(k.data_ptr<in_t>(), o.data_ptr<in_t>(), E, num_rows, num_other,
                                       rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(),
                                       perm.data_ptr<index_t>());
    });
  });
  return {rowptr, col, perm};
}

// ---- validation of a CSR built elsewhere ----------------------------------------------------
// One parallel pass per array; each chunk records its first bad position, and the lowest one is
// reported, so the message does not depend on the thread count.
template <typename index_t>
void validate_csr_kernel(const index_t* rowptr, int64_t num_dst, const index_t* col, const index_t* perm, int64_t E,
                         int64_t num_src) {
  TORCH_CHECK_VALUE(rowptr[0] == 0, text("CSR.rowptr[0] is ", int64_t(rowptr[0]), "; it must be 0"));
  TORCH_CHECK_VALUE(int64_t(rowptr[num_dst]) == E,
                    text("CSR.rowptr[-1] is ", int64_t(rowptr[num_dst]), " but CSR.col has ", E,
                         " entries; rowptr must end at the number of edges"));
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(),
                                                                std::max(num_dst, E) / kMinValidateEdgesPerChunk));
  std::vector<int64_t> bad_row(chunks, -1), bad_col(chunks, -1), bad_perm(chunks, -1);
  std::vector<char> identity(chunks, 1);  // perm[e] == e throughout the chunk (then no marking pass)
  // Branch-free scans (they vectorise); a chunk that fails is scanned again for the first bad position.
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      const int64_t rb = num_dst * c / chunks, re = num_dst * (c + 1) / chunks;
      bool drops = false;
      for (int64_t r = rb; r < re; ++r) drops |= rowptr[r + 1] < rowptr[r];
      if (drops) {
        for (int64_t r = rb; r < re && bad_row[c] < 0; ++r) bad_row[c] = rowptr[r + 1] < rowptr[r] ? r : -1;
      }
      const int64_t begin = E * c / chunks, end = E * (c + 1) / chunks;
      index_t col_min = 0, col_max = 0, perm_min = 0, perm_max = 0;
      int64_t moved = 0;  // OR of perm[e] ^ e: zero exactly when perm is the identity here
      if (begin < end) col_min = col_max = col[begin], perm_min = perm_max = perm[begin];
      for (int64_t e = begin; e < end; ++e) {  // min/max reductions: vectorised by the compiler
        col_min = std::min(col_min, col[e]);
        col_max = std::max(col_max, col[e]);
      }
      for (int64_t e = begin; e < end; ++e) {
        perm_min = std::min(perm_min, perm[e]);
        perm_max = std::max(perm_max, perm[e]);
        moved |= int64_t(perm[e]) ^ e;
      }
      const bool col_bad = col_min < 0 || int64_t(col_max) >= num_src;
      const bool perm_bad = perm_min < 0 || int64_t(perm_max) >= E;
      const bool same = moved == 0;
      if (col_bad) check_range(col, begin, end, num_src, bad_col[c]);
      if (perm_bad) check_range(perm, begin, end, E, bad_perm[c]);
      identity[c] = same;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r = bad_row[c];
    TORCH_CHECK_VALUE(r < 0, text("CSR.rowptr must be non-decreasing; rowptr[", r, "] = ", int64_t(rowptr[r]),
                                  " > rowptr[", r + 1, "] = ", int64_t(rowptr[r + 1])));
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t e = bad_col[c];
    TORCH_CHECK_INDEX(e < 0, text("CSR.col contains node id ", int64_t(col[e]), " at CSR position ", e,
                                  ", outside [0, num_src=", num_src, ")"));
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t e = bad_perm[c];
    TORCH_CHECK_INDEX(e < 0, text("CSR.perm contains edge id ", int64_t(perm[e]), " at CSR position ", e,
                                  ", outside [0, ", E, ")"));
  }
  if (E == 0 || std::all_of(identity.begin(), identity.end(), [](char same) { return same != 0; })) return;
  // E ids, all in [0, E): a permutation exactly when every id is hit. Each group of edges marks its
  // ids in a bitmap of its own (E / 8 bytes: stays in cache; no atomics, no shared cache lines), then
  // the bitmaps are OR-ed word by word. Groups are capped so that the bitmaps together stay within
  // kMaxBitmapBytes. (Loop bounds and pointers are copied into locals: the bitmaps' uint64_t stores
  // may alias the int64_t values captured by reference, which would make the compiler reload them,
  // and redo the divisions, at every step.)
  const int64_t words = (E + 63) / 64;
  const int64_t groups = std::max<int64_t>(1, std::min<int64_t>(chunks, kMaxBitmapBytes / (words * 8)));
  std::vector<uint64_t> seen(groups * words, 0);
  at::parallel_for(0, groups, 1, [&](int64_t gb, int64_t ge) {
    for (int64_t g = gb; g < ge; ++g) {
      uint64_t* const bits = seen.data() + g * words;
      const index_t* const ids = perm;
      const int64_t begin = E * g / groups, end = E * (g + 1) / groups;
      for (int64_t e = begin; e < end; ++e) {
        const uint64_t v = uint64_t(ids[e]);
        bits[v >> 6] |= uint64_t{1} << (v & 63);
      }
    }
  });
  const int64_t tail = E - (words - 1) * 64;
  const uint64_t last_word = tail == 64 ? ~uint64_t{0} : (uint64_t{1} << tail) - 1;
  std::atomic<bool> complete{true};
  // The merge runs inline up to kMergeGrain words (4M edges): a parallel region costs more than it
  // saves there, and much more where threads are descheduled (a shared machine).
  at::parallel_for(0, words, kMergeGrain, [&](int64_t wb, int64_t we) {
    const uint64_t* const bits = seen.data();
    const int64_t n_words = words, n_groups = groups;
    bool full = true;
    for (int64_t w = wb; w < we; ++w) {
      uint64_t any = 0;
      for (int64_t g = 0; g < n_groups; ++g) any |= bits[g * n_words + w];
      full &= any == (w + 1 == n_words ? last_word : ~uint64_t{0});
    }
    if (!full) complete.store(false, std::memory_order_relaxed);
  });
  if (complete.load()) return;
  std::vector<uint8_t> repeat(E, 0);
  // Not a permutation: name the first repeated id (a sequential pass, on failure only).
  for (int64_t e = 0; e < E; ++e) {
    TORCH_CHECK_VALUE(!repeat[perm[e]], text("CSR.perm is not a permutation: edge id ", int64_t(perm[e]),
                                             " appears more than once (again at CSR position ", e, ")"));
    repeat[perm[e]] = 1;
  }
}

// Checks a CSR's structure (shapes and dtypes were checked in Python): rowptr starts at 0, is
// non-decreasing and ends at len(col); every col in [0, num_src); perm a permutation of [0, E).
// Raises IndexError for an out-of-range id, ValueError for a broken structure.
void validate_csr(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, int64_t num_src) {
  const auto r = rowptr.contiguous(), c = col.contiguous(), p = perm.contiguous();
  AT_DISPATCH_INDEX_TYPES(c.scalar_type(), "validate_csr", [&] {
    validate_csr_kernel<index_t>(r.data_ptr<index_t>(), r.numel() - 1, c.data_ptr<index_t>(), p.data_ptr<index_t>(),
                                 c.numel(), num_src);
  });
}

}  // namespace

void register_csr(pybind11::module& m) {
  m.def("coo_to_csr", &coo_to_csr);
  m.def("validate_csr", &validate_csr);
}

}  // namespace gnnfuse
