// COO -> CSR by a stable parallel counting sort: O(E + N), no comparison sort.
// Edges are cut into one chunk per thread; each chunk counts its keys, the counts are
// turned into per-chunk write offsets, and each chunk writes its edges in order, so edges
// with the same key keep their original order (stable) whatever the thread count.
// Also here: the checks of a CSR built elsewhere, and the stamps that let a repeated call skip them.
#include <ATen/Dispatch.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <atomic>
#include <cstring>
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
PyObject* take_stamp(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || !PyLong_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "take_stamp(mode, *tensors)");
    return nullptr;
  }
  std::string out;
  put(out, nargs - 1);
  put(out, PyLong_AsLongLong(args[0]));
  try {
    for (Py_ssize_t i = 1; i < nargs; ++i) {
      if (!THPVariable_Check(args[i])) {
        PyErr_SetString(PyExc_TypeError, "take_stamp: expected tensors");
        return nullptr;
      }
      at::TensorImpl& t = *THPVariable_Unpack(args[i]).unsafeGetTensorImpl();
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
  } catch (const std::exception& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  }
  return PyBytes_FromStringAndSize(out.data(), Py_ssize_t(out.size()));
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

void register_stamps(pybind11::module& m) {
  for (PyMethodDef& def : kStampFunctions) {
    m.add_object(def.ml_name, pybind11::reinterpret_steal<pybind11::object>(PyCFunction_NewEx(&def, nullptr, nullptr)));
  }
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
      bool drops = false;
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

template <typename index_t>
void check_permutation_kernel(const index_t* perm, int64_t E) {
  if (E == 0) return;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), E / kMinValidateEdgesPerChunk));
  std::vector<int64_t> bad_perm(chunks, -1);
  std::vector<char> identity(chunks, 1);  // perm[e] == e throughout the chunk (then no marking pass)
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      const index_t* const ids = perm;
      const int64_t begin = E * c / chunks, end = E * (c + 1) / chunks;
      std::make_unsigned_t<index_t> largest = 0;  // as in largest_unsigned, fused with the identity test
      int64_t moved = 0;  // OR of perm[e] ^ e: zero exactly when perm is the identity here
      for (int64_t e = begin; e < end; ++e) {
        largest = std::max(largest, std::make_unsigned_t<index_t>(ids[e]));
        moved |= int64_t(ids[e]) ^ e;
      }
      if (uint64_t(largest) >= uint64_t(E)) check_range(ids, begin, end, E, bad_perm[c]);
      identity[c] = moved == 0;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t e = bad_perm[c];
    TORCH_CHECK_INDEX(e < 0, text("CSR.perm contains edge id ", int64_t(perm[e]), " at CSR position ", e,
                                  ", outside [0, ", E, ")"));
  }
  if (std::all_of(identity.begin(), identity.end(), [](char same) { return same != 0; })) return;
  // E ids, all in [0, E): a permutation exactly when every id is hit. Each group of edges marks its
  // ids in a bitmap of its own (E / 8 bytes: stays in cache; no atomics, no shared cache lines), then
  // the bitmaps are OR-ed word by word. Groups are capped so that the bitmaps together stay within
  // kMaxBitmapBytes. (A byte per id instead of a bit, plain stores with no read of the old value,
  // measured slower: 1.4 vs 0.9 ms for 1.17M shuffled ids, its E fresh bytes cost page faults. Loop
  // bounds and pointers are copied into locals: the bitmaps' uint64_t stores may alias the int64_t
  // values captured by reference, which would make the compiler reload them at every step.)
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

}  // namespace

void register_csr(pybind11::module& m) {
  m.def("coo_to_csr", &coo_to_csr);
  m.def("validate_csr", &validate_csr);
  m.def("validate_perm", &validate_perm);
  register_stamps(m);
}

}  // namespace gnnfuse
