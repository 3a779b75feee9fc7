// Reuse of large CPU output buffers across calls (POSIX: the C++ kernels build on Linux and macOS).
//
// A fresh multi-megabyte output comes from mmap, so the kernel's first write to each 4 KiB page
// takes a page fault (and the OS zeroes the page first). On the VM where the CPU suite runs,
// allocating and writing 128 MB costs 48 ms against 16 ms for rewriting warm memory: for a
// gather-scatter whose sources are cache-resident, the page faults of its output are a third to
// a half of the call (community-arxiv, F=128, 87 MB output, 1 thread: 40 ms against 74 ms).
// Training calls the same op with the same shapes every step, so the buffers of outputs that
// have died are kept and handed to the next call of the same size.
//
// - Only blocks of at least kMinBytes = 32 MiB are cached: glibc's malloc serves smaller ones from
//   its heap once such a block has been freed (its mmap threshold rises to at most 32 MiB), so
//   they come back warm already, and the block the last call freed (whoever's it was) is the
//   warmest; ours would be colder (measured, Facebook F=32, 2.9 MB outputs interleaved with other
//   ops: 0.88 ms from our cache, 0.77 ms from malloc). A cached block serves a request of its
//   exact byte size.
// - At most `limit` bytes wait in the cache; the oldest blocks are freed first. The limit is
//   GNNFUSE_CPU_OUTPUT_CACHE_MB (read at the first large allocation), by default 1/8 of the
//   machine's memory; 0 turns the cache off.
// - The tensor is an ordinary resizable CPU tensor: its storage's allocator is the CPU allocator
//   (a resize_ that grows it moves it there), and only the block's deleter differs.
// - The cache never holds memory that a live tensor uses, and a block goes back to it only when
//   the last tensor viewing it dies, so results cannot depend on it: it changes speed only.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <list>
#include <mutex>
#include <new>
#include <utility>

namespace gnnfuse {

class OutputCache {
 public:
  static constexpr int64_t kMinBytes = int64_t{32} << 20;

  static OutputCache& instance() {
    static OutputCache* cache = new OutputCache();  // never destroyed: blocks may die during exit
    return *cache;
  }

  // An uninitialised contiguous tensor of `sizes` and `options` (a CPU dtype).
  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
    int64_t numel = 1;
    for (int64_t s : sizes) numel *= s;
    const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
    if (bytes < kMinBytes || bypass_ || limit() == 0) return at::empty(sizes, options);
    void* data = take(bytes);
    if (data == nullptr) {
      TORCH_CHECK(posix_memalign(&data, 64, static_cast<size_t>(bytes)) == 0, "gnnfuse: out of memory allocating ",
                  bytes, " bytes for an output");
    }
    auto* block = new Block{data, bytes};
    c10::DataPtr ptr(data, block, &OutputCache::release, c10::Device(c10::kCPU));
    c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(ptr), c10::GetCPUAllocator(),
                         /*resizable=*/true);
    return at::empty({0}, options).set_(storage, 0, sizes);
  }

  // Bytes currently waiting in the cache (for tests).
  int64_t cached_bytes() {
    std::lock_guard<std::mutex> guard(mutex_);
    return cached_;
  }

  // While on, outputs bypass the cache (fresh memory, as without it) and the cached blocks stay:
  // benchmarks time both in the same process. Returns the previous setting.
  bool set_bypass(bool on) { return bypass_.exchange(on); }

  // Frees every cached block.
  void clear() {
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto& b : free_) std::free(b.data);
    free_.clear();
    cached_ = 0;
  }

 private:
  struct Block {
    void* data;
    int64_t bytes;
  };

  int64_t limit() {
    std::call_once(limit_once_, [this] {
      const char* env = std::getenv("GNNFUSE_CPU_OUTPUT_CACHE_MB");
      if (env != nullptr && *env != '\0') {
        limit_ = std::max<int64_t>(0, std::atoll(env)) << 20;
      } else {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
        limit_ = (pages > 0 && page > 0) ? static_cast<int64_t>(pages) * page / 8 : int64_t{1} << 30;
      }
    });
    return limit_;
  }

  void* take(int64_t bytes) {
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto it = free_.rbegin(); it != free_.rend(); ++it) {  // newest first: its pages are warmest
      if (it->bytes == bytes) {
        void* data = it->data;
        cached_ -= bytes;
        free_.erase(std::next(it).base());
        return data;
      }
    }
    return nullptr;
  }

  static void release(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    instance().give_back(block->data, block->bytes);
    delete block;
  }

  void give_back(void* data, int64_t bytes) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (bytes > limit_) {
      std::free(data);
      return;
    }
    trim(bytes);
    free_.push_back(Block{data, bytes});
    cached_ += bytes;
  }

  // Frees the oldest blocks until `room` more bytes fit under the limit (mutex held).
  void trim(int64_t room) {
    while (cached_ + room > limit_ && !free_.empty()) {
      std::free(free_.front().data);
      cached_ -= free_.front().bytes;
      free_.pop_front();
    }
  }

  std::mutex mutex_;
  std::once_flag limit_once_;
  std::atomic<int64_t> limit_{0};
  std::atomic<bool> bypass_{false};
  int64_t cached_ = 0;
  std::list<Block> free_;  // oldest at the front
};

// An uninitialised CPU output, from the cache when it is large.
inline at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return OutputCache::instance().empty(sizes, options);
}

}  // namespace gnnfuse
