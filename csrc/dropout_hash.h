// Counter-based dropout mask for the attention kernels: keep(seed, edge, head) is a pure function,
// so forward and backward (and the C++ and Triton kernels, see gnnfuse/triton/attention.py's
// `_dropout_keep`) regenerate the same mask without storing it. All arithmetic is on uint32 with
// wrap-around, identical in both languages: counter = edge * H + head; r = fmix(fmix(counter) ^ seed)
// with murmur3's 32-bit finaliser; keep iff (r >> 8) >= threshold, threshold = round(p * 2^24).
#pragma once

#include <cmath>
#include <cstdint>

namespace gnnfuse {

// murmur3's finaliser on uint32 or on vector lanes of uint32 (GCC vector extensions): the same steps
template <typename U>
inline U fmix32_lanes(U h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

inline uint32_t fmix32(uint32_t h) { return fmix32_lanes(h); }

inline uint32_t dropout_threshold(double p) { return uint32_t(std::llround(p * double(1u << 24))); }

inline bool dropout_keep(uint32_t seed, int64_t edge, int64_t H, int64_t h, uint32_t threshold) {
  const uint32_t counter = uint32_t(edge) * uint32_t(H) + uint32_t(h);
  return (fmix32(fmix32(counter) ^ seed) >> 8) >= threshold;
}

}  // namespace gnnfuse
