// One round of majority voting over in-neighbours, the refinement step of
// gnnfuse.reorder(method="community-refined") on CPU (gnnfuse/ordering.py, refine_blocks).
//
// Every target row with in-edges takes the label that most of its first `max_votes` in-neighbours
// (in CSR order) carry; ties go to the highest label; rows without in-edges keep their own. The
// torch-ops version in ordering.py (_vote_torch: the fallback and the tests' reference) and the
// Triton one (gnnfuse/triton/vote.py, the GPU path) compute exactly the same labels; this one exists
// because the torch version's [rows, max_votes, max_votes] comparison costs seconds per round on a
// 2-core CPU, where one pass over the rows here costs tens of milliseconds.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>

#include "checks.h"

namespace gnnfuse {
namespace {

constexpr int64_t kMaxVotes = 64;  // the per-row buffer lives on the stack
constexpr int64_t kGrain = 2048;

template <typename index_t>
void vote_rows(const index_t* rowptr, const index_t* col, const int64_t* label, int64_t* out, int64_t rows,
               int64_t max_votes) {
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    int64_t votes[kMaxVotes];
    for (int64_t r = begin; r < end; ++r) {
      const int64_t lo = rowptr[r], n = std::min<int64_t>(int64_t(rowptr[r + 1]) - lo, max_votes);
      if (n <= 0) {
        out[r] = label[r];
        continue;
      }
      for (int64_t k = 0; k < n; ++k) votes[k] = label[col[lo + k]];
      std::sort(votes, votes + n);
      int64_t best = votes[0], best_count = 0, run = 0;
      for (int64_t k = 0; k < n; ++k) {
        run = (k > 0 && votes[k] == votes[k - 1]) ? run + 1 : 1;
        if (run >= best_count) {  // >=: among equal counts the later (higher) label wins
          best_count = run;
          best = votes[k];
        }
      }
      out[r] = best;
    }
  });
}

torch::Tensor majority_vote(const torch::Tensor& rowptr, const torch::Tensor& col, const torch::Tensor& label,
                            int64_t max_votes) {
  TORCH_CHECK(rowptr.dim() == 1 && rowptr.numel() >= 1 && rowptr.is_contiguous() && !rowptr.is_cuda(),
              "majority_vote: rowptr must be a contiguous 1-D CPU tensor");
  TORCH_CHECK(col.dim() == 1 && col.is_contiguous() && col.scalar_type() == rowptr.scalar_type(),
              "majority_vote: col must be contiguous 1-D with rowptr's dtype");
  TORCH_CHECK(label.dim() == 1 && label.is_contiguous() && label.scalar_type() == torch::kInt64,
              "majority_vote: label must be a contiguous 1-D int64 tensor");
  TORCH_CHECK(label.numel() == rowptr.numel() - 1, text("majority_vote: label has ", label.numel(),
                                                        " entries, rowptr describes ", rowptr.numel() - 1, " rows"));
  TORCH_CHECK(max_votes >= 1 && max_votes <= kMaxVotes, text("majority_vote: max_votes must be in 1..", kMaxVotes,
                                                              "; got ", max_votes));
  auto out = torch::empty_like(label);
  const int64_t rows = label.numel();
  AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "majority_vote", [&] {
    vote_rows<index_t>(rowptr.data_ptr<index_t>(), col.data_ptr<index_t>(), label.data_ptr<int64_t>(),
                       out.data_ptr<int64_t>(), rows, max_votes);
  });
  return out;
}

}  // namespace
}  // namespace gnnfuse

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("majority_vote", &gnnfuse::majority_vote); }
