// A one-off scatter on CPU with no sort: out[t] = reduce(x[s] for every s with targets[s] == t).
//
// gnnfuse.scatter sorts an index once and keeps the sort on the index tensor, so a repeated index
// (a GNN's edge index) runs the CSR kernels. The first call with an index would pay for that sort
// (about as long as the reduction itself) and may never come back: this kernel serves it instead.
//
// Why owner-computes: every thread owns a contiguous range of targets holding about 1/threads of
// the rows (split on the targets' counts), scans the whole index, and reduces only the rows aimed
// at its own targets, in index order. No atomics, no per-thread copies of the output, and each
// target's values are combined in the order a sequential loop would use: the result is the same
// for any thread count. The extra cost is every thread reading the whole index (4-8 bytes a row,
// against the row's F values).
#include <torch/extension.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "checks.h"
#include "reducer.h"

namespace gnnfuse {
namespace {

// Rows per target (also the check that every target lies in [0, T)).
template <typename index_t>
std::vector<int64_t> target_counts(const index_t* targets, int64_t S, int64_t T) {
  std::vector<int64_t> counts(static_cast<size_t>(T), 0);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t t = static_cast<int64_t>(targets[s]);
    TORCH_CHECK_INDEX(t >= 0 && t < T, text("targets contains ", t, " at position ", s, ", outside [0, ", T, ")"));
    ++counts[static_cast<size_t>(t)];
  }
  return counts;
}

// parts + 1 target boundaries splitting the rows into parts of about S / parts each.
std::vector<int64_t> owner_ranges(const std::vector<int64_t>& counts, int64_t S, int64_t parts) {
  std::vector<int64_t> bounds(static_cast<size_t>(parts) + 1, static_cast<int64_t>(counts.size()));
  bounds[0] = 0;
  int64_t seen = 0, part = 1;
  for (size_t t = 0; t < counts.size() && part < parts; ++t) {
    seen += counts[t];
    while (part < parts && seen * parts >= S * part) bounds[static_cast<size_t>(part++)] = static_cast<int64_t>(t) + 1;
  }
  return bounds;
}

// One thread's targets [lo, hi): each row aimed at them folded in index order (Reducer<R>::update:
// the sorted kernels' NaN-propagating max/min).
template <Reduce R, typename scalar_t, typename index_t>
void reduce_owned(const scalar_t* x, const index_t* targets, int64_t S, int64_t F, int64_t lo, int64_t hi,
                  scalar_t* out) {
  for (int64_t s = 0; s < S; ++s) {
    const int64_t t = static_cast<int64_t>(targets[s]);
    if (t < lo || t >= hi) continue;
    const scalar_t* row = x + s * F;
    scalar_t* acc = out + t * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) Reducer<R>::update(acc[f], row[f]);
  }
}

// Empty targets give 0; mean divides by the count. (max/min start at -inf/+inf and a NaN wins and
// sticks, as in the sorted kernels.)
template <typename scalar_t>
void finish_owned(const std::vector<int64_t>& counts, int64_t F, int64_t lo, int64_t hi, Reduce reduce,
                  scalar_t* out) {
  for (int64_t t = lo; t < hi; ++t) {
    const int64_t n = counts[static_cast<size_t>(t)];
    scalar_t* acc = out + t * F;
    if (n == 0) {
      std::fill(acc, acc + F, scalar_t(0));
    } else if (reduce == Reduce::Mean) {  // a division, as the sorted kernels' finish: the same bits
      const scalar_t count = static_cast<scalar_t>(n);
      for (int64_t f = 0; f < F; ++f) acc[f] /= count;
    }
  }
}

}  // namespace

torch::Tensor scatter_unsorted(const torch::Tensor& x, const torch::Tensor& targets, int64_t T,
                               const std::string& reduce_name) {
  const Reduce reduce = parse_reduce(reduce_name);
  TORCH_CHECK_VALUE(reduce != Reduce::Mul, "reduce must be one of sum, mean, max, min; got 'mul'");
  TORCH_CHECK_VALUE(x.device().is_cpu() && targets.device().is_cpu(), "x and targets must be CPU tensors");
  TORCH_CHECK_VALUE(x.dim() == 2, text("x must be 2-D [S, F]; got ", x.dim(), " dimensions"));
  TORCH_CHECK_VALUE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
                    text("x must be float32 or float64; got ", x.scalar_type()));
  TORCH_CHECK_VALUE(targets.dim() == 1 && targets.size(0) == x.size(0),
                    text("targets must be 1-D with x's ", x.size(0), " rows; got shape ", targets.sizes()));
  TORCH_CHECK_VALUE(targets.scalar_type() == at::kInt || targets.scalar_type() == at::kLong,
                    text("targets must be int32 or int64; got ", targets.scalar_type()));
  TORCH_CHECK_VALUE(T >= 0, text("T must be non-negative; got ", T));
  const auto xc = x.contiguous();
  const auto tc = targets.contiguous();
  const int64_t S = xc.size(0), F = xc.size(1);
  auto out = torch::empty({T, F}, xc.options());
  if (T == 0 || F == 0) return out;
  AT_DISPATCH_INDEX_TYPES(tc.scalar_type(), "scatter_unsorted", [&] {
    const index_t* tgt = tc.data_ptr<index_t>();
    const std::vector<int64_t> counts = target_counts(tgt, S, T);
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), T));
    const std::vector<int64_t> bounds = owner_ranges(counts, S, parts);
    AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "scatter_unsorted", [&] {
      scalar_t* o = out.data_ptr<scalar_t>();
      const scalar_t* xp = xc.data_ptr<scalar_t>();
      dispatch_reduce(reduce, [&](auto rc) {
        constexpr Reduce R = decltype(rc)::value;
        const scalar_t start = R == Reduce::Max   ? -std::numeric_limits<scalar_t>::infinity()
                               : R == Reduce::Min ? std::numeric_limits<scalar_t>::infinity()
                                                  : scalar_t(0);
        at::parallel_for(0, parts, 1, [&](int64_t pb, int64_t pe) {
          for (int64_t p = pb; p < pe; ++p) {
            const int64_t lo = bounds[static_cast<size_t>(p)], hi = bounds[static_cast<size_t>(p) + 1];
            std::fill(o + lo * F, o + hi * F, start);
            reduce_owned<R>(xp, tgt, S, F, lo, hi, o);
            finish_owned(counts, F, lo, hi, reduce, o);
          }
        });
      });
    });
  });
  return out;
}

}  // namespace gnnfuse

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scatter_unsorted", &gnnfuse::scatter_unsorted, "one-off scatter of [S, F] rows into [T, F] with no sort");
}
