// Integer codes of the reduce names, shared with Python: gnnfuse/reductions.py holds the same
// table (tests/test_reductions.py parses this file and checks that the two agree).
#pragma once

namespace gnnfuse {
namespace reduce_code {
constexpr int kSum = 0;
constexpr int kMean = 1;
constexpr int kMax = 2;
constexpr int kMin = 3;
constexpr int kMul = 4;
constexpr int kVar = 5;
constexpr int kStd = 6;
}  // namespace reduce_code
}  // namespace gnnfuse
