// COO -> CSR by a stable parallel counting sort: O(E + N), no comparison sort.
// Edges are cut into one chunk per thread; each chunk counts its keys, the counts are
// turned into per-chunk write offsets, and each chunk writes its edges in order, so edges
// with the same key keep their original order (stable) whatever the thread count.
// Also here: the checks of a CSR built elsewhere, and the stamps that let a repeated call skip them.
#include <ATen/Dispatch.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "checks.h"
#include "reducer.h"

namespace gnnfuse {
namespace {

// Per-chunk histograms cost chunks x num_rows counters; cap them to keep memory modest.
constexpr int64_t kMaxHistogramEntries = int64_t{1} << 26;
constexpr int64_t kMinEdgesPerChunk = int64_t{1} << 16;
// The permutation check's per-thread bitmaps (E / 8 bytes each) stay within this many bytes together.
constexpr int64_t kMaxBitmapBytes = int64_t{1} << 28;
// A validation chunk (one thread's share) is at least this many edges: the scans take about
// 0.3 ns an edge (the permutation bitmap about 0.6), so a chunk is ~0.1 ms of work, far above the
// cost of waking a pool thread that the CSR build has just used. Below it one thread does it all.
constexpr int64_t kMinValidateEdgesPerChunk = int64_t{1} << 18;

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

// The largest of values[begin, end) read as unsigned, so that a negative id counts as huge: one
// max-reduction (it vectorises) tells whether every id lies in [0, limit).
template <typename index_t>
uint64_t largest_unsigned(const index_t* values, int64_t begin, int64_t end) {
  using unsigned_t = std::make_unsigned_t<index_t>;
  unsigned_t largest = 0;
  for (int64_t e = begin; e < end; ++e) largest = std::max(largest, unsigned_t(values[e]));
  return largest;
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

// ---- stamps: what must stay the same for a value derived from tensors to still hold ----------
// (gnnfuse/_tensor_cache.py describes what a stamp catches.) A stamp is a bytes object: a header
// (tensor count, mode), then per tensor its TensorImpl and StorageImpl addresses, data pointer,
// dtype and device, version, sizes and strides, and on CPU a fingerprint of its memory span. Both
// functions are plain CPython functions (METH_FASTCALL): a pybind11 call with three tensor
// arguments costs about 0.2 us, this about 0.03 us, and the comparison is most of what a
// repeated call with an unchanged graph pays for its check.
constexpr int64_t kFullBytes = 512;  // a span up to this many bytes is fingerprinted whole
constexpr int64_t kSamples = 32;     // else this many evenly spaced elements, the first and last included
enum StampMode : int64_t { kSameMemory = 0, kSameObject = 1 };

int64_t span_bytes(const at::TensorImpl& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return (last + 1) * int64_t(t.itemsize());
}

int64_t device_and_dtype(const at::TensorImpl& t) {
  return int64_t(t.dtype().toScalarType()) | int64_t(t.device_type()) << 16 | int64_t(t.device().index() + 1) << 32;
}

// The fingerprinted bytes of t's memory span, in order: the whole span, or kSamples elements.
template <typename Visit>
void visit_fingerprint(const at::TensorImpl& t, Visit&& visit) {
  if (t.device_type() != c10::kCPU) return;  // reading device memory would need a host sync
  const int64_t span = span_bytes(t);
  const char* base = static_cast<const char*>(t.data());
  if (span <= kFullBytes) {
    visit(base, span);
    return;
  }
  const int64_t item = t.itemsize(), n = span / item;
  for (int64_t i = 0; i < kSamples; ++i) visit(base + i * (n - 1) / (kSamples - 1) * item, item);
}

bool stampable(at::TensorImpl& t) {
  return !t.is_inference() && t.has_storage() && t.layout() == c10::kStrided;
}

void put(std::string& out, int64_t word) { out.append(reinterpret_cast<const char*>(&word), sizeof word); }

// take_stamp(mode, *tensors) -> bytes, or None when a tensor has no version counter (inference
// tensors) or no storage of its own. mode 1: the same tensor objects must come back (the stamp's
// owner keeps them alive, so their addresses stay theirs); mode 0: any tensor over the same
// memory (the owner keeps a weak reference to the storages and drops the stamp when one is freed).
PyObject* stamp_of(int64_t mode, PyObject* const* tensors, Py_ssize_t count) {
  std::string out;
  put(out, count);
  put(out, mode);
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!THPVariable_Check(tensors[i])) {
      PyErr_SetString(PyExc_TypeError, "take_stamp: expected tensors");
      return nullptr;
    }
    at::TensorImpl& t = *THPVariable_Unpack(tensors[i]).unsafeGetTensorImpl();
    if (!stampable(t)) Py_RETURN_NONE;
    put(out, reinterpret_cast<int64_t>(&t));
    put(out, reinterpret_cast<int64_t>(t.storage().unsafeGetStorageImpl()));
    put(out, reinterpret_cast<int64_t>(t.data()));
    put(out, device_and_dtype(t));
    put(out, int64_t(t.version_counter().current_version()));
    put(out, t.dim());
    for (int64_t d = 0; d < t.dim(); ++d) put(out, t.size(d));
    for (int64_t d = 0; d < t.dim(); ++d) put(out, t.stride(d));
    std::string print;
    visit_fingerprint(t, [&](const char* p, int64_t n) { print.append(p, n); });
    put(out, int64_t(print.size()));
    out += print;
    out.resize((out.size() + 7) / 8 * 8, '\0');
  }
  return PyBytes_FromStringAndSize(out.data(), Py_ssize_t(out.size()));
}

PyObject* take_stamp(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || !PyLong_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "take_stamp(mode, *tensors)");
    return nullptr;
  }
  try {
    return stamp_of(PyLong_AsLongLong(args[0]), args + 1, nargs - 1);
  } catch (const std::exception& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  }
}

bool same_as_stamp(const char* stamp, Py_ssize_t stamp_size, PyObject* const* tensors, Py_ssize_t count) {
  const char* const stamp_end = stamp + stamp_size;
  const int64_t* w = reinterpret_cast<const int64_t*>(stamp);
  if (stamp_size < 16 || w[0] != count) return false;
  const bool same_object = w[1] == kSameObject;
  w += 2;
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!THPVariable_Check(tensors[i])) return false;
    at::TensorImpl& t = *THPVariable_Unpack(tensors[i]).unsafeGetTensorImpl();
    if (same_object && w[0] != reinterpret_cast<int64_t>(&t)) return false;
    if (!stampable(t) || w[1] != reinterpret_cast<int64_t>(t.storage().unsafeGetStorageImpl()) ||
        w[2] != reinterpret_cast<int64_t>(t.data()) || w[3] != device_and_dtype(t) ||
        w[4] != int64_t(t.version_counter().current_version()) || w[5] != t.dim())
      return false;
    const int64_t dim = w[5];
    for (int64_t d = 0; d < dim; ++d) {
      if (w[6 + d] != t.size(d) || w[6 + dim + d] != t.stride(d)) return false;
    }
    w += 6 + 2 * dim;
    const int64_t print_size = *w++;
    const char* print = reinterpret_cast<const char*>(w);
    if (print + print_size > stamp_end) return false;
    bool same = true;
    int64_t offset = 0;
    visit_fingerprint(t, [&](const char* p, int64_t n) {
      same = same && offset + n <= print_size && std::memcmp(print + offset, p, n) == 0;
      offset += n;
    });
    if (!same || offset != print_size) return false;
    w += (print_size + 7) / 8;
  }
  return true;
}

// same_stamp(stamp, *tensors) -> bool: whether the tensors still match take_stamp(mode, *tensors).
PyObject* same_stamp(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || !PyBytes_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "same_stamp(stamp, *tensors)");
    return nullptr;
  }
  bool same = false;
  try {
    same = same_as_stamp(PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), args + 1, nargs - 1);
  } catch (const std::exception&) {  // e.g. a tensor whose sizes cannot be read: not the stamped one
    same = false;
  }
  return PyBool_FromLong(same);
}

PyMethodDef kStampFunctions[] = {
    {"take_stamp", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&take_stamp)), METH_FASTCALL,
     "take_stamp(mode, *tensors) -> bytes | None"},
    {"same_stamp", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&same_stamp)), METH_FASTCALL,
     "same_stamp(stamp, *tensors) -> bool"},
};

void add_function(pybind11::module& m, PyMethodDef& def) {
  m.add_object(def.ml_name, pybind11::reinterpret_steal<pybind11::object>(PyCFunction_NewEx(&def, nullptr, nullptr)));
}

void register_stamps(pybind11::module& m) {
  for (PyMethodDef& def : kStampFunctions) add_function(m, def);
}

// ---- validation of a CSR built elsewhere ----------------------------------------------------
// One pass per array; each chunk records its first bad position, and the lowest one is reported,
// so the message does not depend on the thread count. The structure (rowptr, col) is what every
// op reads; perm is read only by ops with per-edge inputs (edge weights, edge softmax, attention),
// so it is checked separately, the first time such an op reads it (see gnnfuse/csr_checks.py).
template <typename index_t>
void check_structure_kernel(const index_t* rowptr, int64_t num_dst, const index_t* col, int64_t E, int64_t num_src) {
  TORCH_CHECK_VALUE(rowptr[0] == 0, text("CSR.rowptr[0] is ", int64_t(rowptr[0]), "; it must be 0"));
  TORCH_CHECK_VALUE(int64_t(rowptr[num_dst]) == E,
                    text("CSR.rowptr[-1] is ", int64_t(rowptr[num_dst]), " but CSR.col has ", E,
                         " entries; rowptr must end at the number of edges"));
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(),
                                                                std::max(num_dst, E) / kMinValidateEdgesPerChunk));
  std::vector<int64_t> bad_row(chunks, -1), bad_col(chunks, -1);
  // Branch-free scans that vectorise (pointers copied into locals, one unsigned max: read through
  // the lambda's references with a min/max pair, the col scan did not vectorise and ran 14x
  // slower); a chunk that fails is scanned again for the first bad position.
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      const index_t* const ptr = rowptr;
      const index_t* const ids = col;
      const int64_t rb = num_dst * c / chunks, re = num_dst * (c + 1) / chunks;
      int drops = 0;  // an int, not a bool: the OR then vectorises (5x faster on Cora's rowptr)
      for (int64_t r = rb; r < re; ++r) drops |= ptr[r + 1] < ptr[r];
      if (drops) {
        for (int64_t r = rb; r < re && bad_row[c] < 0; ++r) bad_row[c] = ptr[r + 1] < ptr[r] ? r : -1;
      }
      const int64_t begin = E * c / chunks, end = E * (c + 1) / chunks;
      if (largest_unsigned(ids, begin, end) >= uint64_t(num_src)) check_range(ids, begin, end, num_src, bad_col[c]);
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
}

// Whether perm[e] == e throughout (as from_scipy and from_sorted_edge_index build it): then no
// bitmap is needed. A shuffled perm is told apart by its first ids, before the whole scan.
template <typename index_t>
bool is_identity(const index_t* perm, int64_t E) {
  using unsigned_t = std::make_unsigned_t<index_t>;
  const index_t* const ids = perm;
  if (uint64_t(E) > std::numeric_limits<unsigned_t>::max()) return false;  // ids too narrow for all of [0, E)
  for (int64_t e = 0; e < std::min<int64_t>(E, 64); ++e) {
    if (int64_t(ids[e]) != e) return false;
  }
  // OR of perm[e] ^ e, in the index width (E fits it), with an induction variable of that width:
  // it vectorises (1.7x faster on 10k int32 ids than with an int64_t counter)
  const unsigned_t n = unsigned_t(E);
  unsigned_t moved = 0;
  for (unsigned_t e = 0; e < n; ++e) moved |= unsigned_t(ids[e]) ^ e;
  return moved == 0;
}

// Sets bit min(id, limit) of `bits` for every id of ids[begin, end) (read as unsigned, so that a
// negative id counts as huge; `bits` has room for bit `limit`). The ids are taken from eight
// interleaved streams: consecutive ids of one stream often share a 64-bit word (an identity-like
// stretch), and each read-modify-write of a word waits for the previous one's store; eight
// streams keep eight such chains in flight (measured 1.3x faster on a shuffled perm, 2x on an
// ordered one, than one stream).
template <typename index_t>
void mark_ids(const index_t* ids, int64_t begin, int64_t end, uint64_t limit, uint64_t* bits) {
  using unsigned_t = std::make_unsigned_t<index_t>;
  constexpr int64_t kStreams = 8;
  const int64_t step = (end - begin) / kStreams;
  const index_t* const base = ids + begin;
  auto mark = [bits, limit](index_t id) {
    const uint64_t v = std::min<uint64_t>(unsigned_t(id), limit);
    bits[v >> 6] |= uint64_t{1} << (v & 63);
  };
  for (int64_t i = 0; i < step; ++i) {
    for (int64_t k = 0; k < kStreams; ++k) mark(base[k * step + i]);
  }
  for (int64_t e = begin + kStreams * step; e < end; ++e) mark(ids[e]);
}

// E ids form a permutation of [0, E) exactly when every id in [0, E) is hit (an id outside it
// leaves one unhit), so one marking pass over a bitmap proves it: no separate range scan. Each
// chunk of edges marks a bitmap of its own (E / 8 bytes: stays in cache; no atomics, no shared
// cache lines), and the bitmaps are OR-ed word by word. On failure a sequential pass names the
// first offender: an id out of range (IndexError), else the first repeated id (ValueError).
template <typename index_t>
void check_permutation_kernel(const index_t* perm, int64_t E) {
  if (E == 0 || is_identity(perm, E)) return;
  const int64_t words = E / 64 + 1;  // bit E: where ids outside [0, E) are marked
  int64_t chunks = std::min<int64_t>(at::get_num_threads(), E / kMinValidateEdgesPerChunk);
  chunks = std::max<int64_t>(1, std::min<int64_t>(chunks, kMaxBitmapBytes / (words * 8)));
  std::vector<uint64_t> seen(chunks * words, 0);
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) mark_ids(perm, E * c / chunks, E * (c + 1) / chunks, uint64_t(E),
                                               seen.data() + c * words);
  });
  const uint64_t* const bits = seen.data();
  const int64_t n_words = words, n_chunks = chunks, full = E / 64;
  auto merged = [&](int64_t w) {
    uint64_t any = 0;
    for (int64_t c = 0; c < n_chunks; ++c) any |= bits[c * n_words + w];
    return any;
  };
  uint64_t all = ~uint64_t{0};
  for (int64_t w = 0; w < full; ++w) all &= merged(w);
  const uint64_t tail = (uint64_t{1} << (E & 63)) - 1;  // the ids of the last word inside [0, E)
  const bool complete = all == ~uint64_t{0} && (merged(full) & tail) == tail;
  if (complete) return;
  int64_t bad = -1;
  check_range(perm, 0, E, E, bad);
  TORCH_CHECK_INDEX(bad < 0, text("CSR.perm contains edge id ", int64_t(perm[bad]), " at CSR position ", bad,
                                  ", outside [0, ", E, ")"));
  std::vector<uint8_t> repeat(E, 0);
  for (int64_t e = 0; e < E; ++e) {
    TORCH_CHECK_VALUE(!repeat[perm[e]], text("CSR.perm is not a permutation: edge id ", int64_t(perm[e]),
                                             " appears more than once (again at CSR position ", e, ")"));
    repeat[perm[e]] = 1;
  }
}

// Checks a CSR's structure (shapes and dtypes were checked in Python): rowptr starts at 0, is
// non-decreasing and ends at len(col); every col in [0, num_src). Raises IndexError for an
// out-of-range id, ValueError for a broken structure.
void validate_csr(const at::Tensor& rowptr, const at::Tensor& col, int64_t num_src) {
  const auto r = rowptr.contiguous(), c = col.contiguous();
  AT_DISPATCH_INDEX_TYPES(c.scalar_type(), "validate_csr", [&] {
    check_structure_kernel<index_t>(r.data_ptr<index_t>(), r.numel() - 1, c.data_ptr<index_t>(), c.numel(), num_src);
  });
}

// Checks that perm is a permutation of [0, len(perm)): IndexError for an id out of range,
// ValueError naming the first repeated id.
void validate_perm(const at::Tensor& perm) {
  const auto p = perm.contiguous();
  AT_DISPATCH_INDEX_TYPES(p.scalar_type(), "validate_perm", [&] {
    check_permutation_kernel<index_t>(p.data_ptr<index_t>(), p.numel());
  });
}

// ---- the first-use checks of a hand-built CSR, each returning the stamp that lets later uses skip it --
// check_structure(rowptr, col, perm, num_src) and check_perm(col, perm) run validate_csr's and
// validate_perm's checks (raising IndexError or ValueError), then return take_stamp(1, rowptr, col)
// or take_stamp(1, perm) (None where those cannot be stamped). They return False, checking
// nothing, unless every tensor is a plain CPU tensor of one index dtype with the shapes a CSR
// needs: gnnfuse/csr_checks.py then checks in Python (another device, a tensor subclass) or names
// what is wrong. Plain CPython calls: the same layout tests and stamps in Python cost about 2 us,
// as much as checking a Cora-sized graph.
bool plain_cpu_index(PyObject* obj) {
  if (!THPVariable_CheckExact(obj)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  return t.layout() == c10::kStrided && t.device().is_cpu() && t.dim() == 1 &&
         (t.scalar_type() == at::kInt || t.scalar_type() == at::kLong);
}

template <typename Check>
PyObject* check_then_stamp(Check&& check, PyObject* const* tensors, Py_ssize_t count) {
  try {
    check();
    return stamp_of(kSameObject, tensors, count);
  } catch (const c10::IndexError& exc) {
    PyErr_SetString(PyExc_IndexError, exc.what_without_backtrace());
  } catch (const c10::ValueError& exc) {
    PyErr_SetString(PyExc_ValueError, exc.what_without_backtrace());
  } catch (const c10::Error& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what_without_backtrace());
  } catch (const std::exception& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what());
  }
  return nullptr;
}

PyObject* check_structure(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "check_structure(rowptr, col, perm, num_src)");
    return nullptr;
  }
  if (!plain_cpu_index(args[0]) || !plain_cpu_index(args[1]) || !plain_cpu_index(args[2]) || !PyLong_CheckExact(args[3]))
    Py_RETURN_FALSE;
  const at::Tensor &rowptr = THPVariable_Unpack(args[0]), &col = THPVariable_Unpack(args[1]),
                   &perm = THPVariable_Unpack(args[2]);
  const int64_t num_src = PyLong_AsLongLong(args[3]);
  if (num_src == -1 && PyErr_Occurred()) {  // too large for int64: Python explains
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  const int64_t limit = col.scalar_type() == at::kInt ? int64_t{std::numeric_limits<int32_t>::max()}
                                                      : std::numeric_limits<int64_t>::max();
  if (rowptr.scalar_type() != col.scalar_type() || perm.scalar_type() != col.scalar_type() || rowptr.numel() < 1 ||
      perm.numel() != col.numel() || num_src < 0 || std::max({col.numel(), num_src, rowptr.numel() - 1}) > limit)
    Py_RETURN_FALSE;
  return check_then_stamp([&] { validate_csr(rowptr, col, num_src); }, args, 2);
}

PyObject* check_perm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "check_perm(col, perm)");
    return nullptr;
  }
  if (!plain_cpu_index(args[0]) || !plain_cpu_index(args[1])) Py_RETURN_FALSE;
  const at::Tensor &col = THPVariable_Unpack(args[0]), &perm = THPVariable_Unpack(args[1]);
  if (perm.scalar_type() != col.scalar_type() || perm.numel() != col.numel()) Py_RETURN_FALSE;
  return check_then_stamp([&] { validate_perm(perm); }, args + 1, 1);
}

PyMethodDef kCheckFunctions[] = {
    {"check_structure", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&check_structure)),
     METH_FASTCALL, "check_structure(rowptr, col, perm, num_src) -> bytes | None | False"},
    {"check_perm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&check_perm)), METH_FASTCALL,
     "check_perm(col, perm) -> bytes | None | False"},
};

}  // namespace

void register_csr(pybind11::module& m) {
  m.def("coo_to_csr", &coo_to_csr);
  m.def("validate_csr", &validate_csr);
  m.def("validate_perm", &validate_perm);
  register_stamps(m);
  for (PyMethodDef& def : kCheckFunctions) add_function(m, def);
}

}  // namespace gnnfuse
