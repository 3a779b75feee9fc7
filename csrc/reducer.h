// Compile-time reductions: every kernel body is written once and instantiated per Reduce.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "reduce_codes.h"

namespace gnnfuse {

// The values are the one table's (reduce_codes.h, shared with gnnfuse/reductions.py and the Triton kernels).
enum class Reduce {
  Sum = reduce_code::kSum,
  Mean = reduce_code::kMean,
  Max = reduce_code::kMax,
  Min = reduce_code::kMin,
  Mul = reduce_code::kMul,
};

inline Reduce parse_reduce(const std::string& name) {
  if (name == "sum") return Reduce::Sum;
  if (name == "mean") return Reduce::Mean;
  if (name == "max") return Reduce::Max;
  if (name == "min") return Reduce::Min;
  if (name == "mul") return Reduce::Mul;
  TORCH_CHECK_VALUE(false, "reduce must be one of sum, mean, max, min, mul; got '", name, "'");
}

template <Reduce R>
struct Reducer {
  static constexpr bool kTracksArg = (R == Reduce::Max || R == Reduce::Min);

  // Whether message `v` replaces the current best `acc` (max/min), without branches. Strict
  // comparison keeps ties at the lowest CSR position. A NaN message always replaces and a NaN
  // accumulator is never replaced by a number, so NaN propagates like torch.scatter_reduce.
  // (Two compares: a third one to keep the *first* NaN cost 25% at F=128.)
  template <typename T>
  static inline bool wins(T v, T acc) {
    const bool better = (R == Reduce::Max) ? (v > acc) : (v < acc);
    return better | (v != v);
  }

  // Folds message `v` into `acc`; returns true when `v` becomes the new winner (max/min).
  template <typename T>
  static inline bool update(T& acc, T v) {
    if constexpr (R == Reduce::Sum || R == Reduce::Mean) {
      acc += v;
      return false;
    } else if constexpr (R == Reduce::Mul) {
      acc *= v;
      return false;
    } else {
      const bool win = wins(v, acc);
      acc = win ? v : acc;
      return win;
    }
  }

  template <typename T>
  static inline T finish(T acc, int64_t count) {
    if constexpr (R == Reduce::Mean) {
      return acc / static_cast<T>(count);
    } else {
      return acc;
    }
  }
};

// Calls fn(std::integral_constant<Reduce, R>{}) for the runtime value `r`.
template <typename Fn>
void dispatch_reduce(Reduce r, Fn&& fn) {
  using RC = std::integral_constant<Reduce, Reduce::Sum>;
  switch (r) {
    case Reduce::Sum: fn(RC{}); break;
    case Reduce::Mean: fn(std::integral_constant<Reduce, Reduce::Mean>{}); break;
    case Reduce::Max: fn(std::integral_constant<Reduce, Reduce::Max>{}); break;
    case Reduce::Min: fn(std::integral_constant<Reduce, Reduce::Min>{}); break;
    case Reduce::Mul: fn(std::integral_constant<Reduce, Reduce::Mul>{}); break;
  }
}

// Runs fn(row_begin, row_end) over [0, num_rows) in parallel. Rows are cut into contiguous
// parts in id order (so a thread's rows keep the locality of the numbering) that each hold about
// the same number of edges + rows (power-law graphs stay balanced). A row is never split, so
// every row is reduced by one thread in CSR order: results are bitwise identical for any thread
// count. There are a few parts per thread, taken in order from a shared counter: on a machine
// shared with other work, a thread that was descheduled does not leave the others waiting on
// its fixed half. `row_width` (features per row) sizes the work.
template <typename index_t, typename Fn>
void parallel_over_rows(const index_t* rowptr, int64_t num_rows, int64_t row_width, Fn&& fn) {
  if (num_rows <= 0) return;
  const int64_t total = static_cast<int64_t>(rowptr[num_rows]) + num_rows;
  // Below ~64K element updates per part (a few microseconds), waking threads costs more than it saves.
  constexpr int64_t kMinWorkPerPart = 1 << 16;
  constexpr int64_t kPartsPerThread = 4;
  const int64_t work = total * std::max<int64_t>(row_width, 1);
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(1, work / kMinWorkPerPart));
  if (threads <= 1 || num_rows == 1) {
    fn(int64_t{0}, num_rows);
    return;
  }
  const int64_t parts = std::min<int64_t>(
      num_rows, std::min(threads * kPartsPerThread, std::max<int64_t>(threads, work / kMinWorkPerPart)));
  std::vector<int64_t> split(parts + 1);
  split[0] = 0;
  split[parts] = num_rows;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t target = total * p / parts;
    int64_t lo = split[p - 1], hi = num_rows;  // first row r with rowptr[r] + r >= target
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (static_cast<int64_t>(rowptr[mid]) + mid < target) lo = mid + 1; else hi = mid;
    }
    split[p] = lo;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t p = next.fetch_add(1); p < parts; p = next.fetch_add(1)) {
      if (split[p] < split[p + 1]) fn(split[p], split[p + 1]);
    }
  });
}

}  // namespace gnnfuse
