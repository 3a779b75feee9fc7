// Transparent huge pages for the large outputs of the CPU kernels.
//
// A fresh output tensor of hundreds of MB is first touched by the kernel that fills it. With 4 KiB
// pages that is one page fault per 4 KiB, which costs as much as the gather itself on a graph whose
// source rows are cache-resident (measured, one thread: allocating and writing 128 MB took 48 ms,
// rewriting it 16 ms, allocating and writing it with huge pages 22 ms). Where the kernel allows
// transparent huge pages on request (the common `madvise` setting), the output's 2 MiB-aligned
// interior is marked before anything touches it. Only a hint: on other systems, or if the kernel
// declines, nothing changes. (PyTorch's THP_MEM_ALLOC_ENABLE=1 does the same for every allocation.)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace gnnfuse {

inline void advise_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (t.nbytes() < 4 * kHuge || !t.is_cpu()) return;  // small outputs: few faults, and they may share pages
  const uintptr_t p = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t begin = (p + kHuge - 1) / kHuge * kHuge, end = (p + t.nbytes()) / kHuge * kHuge;
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

}  // namespace gnnfuse
