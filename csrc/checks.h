// Error messages for TORCH_CHECK, assembled as one std::string.
//
// Why: on some torch builds (seen with torch 2.11+cu130 and the host's gcc 13.3, even for an
// extension built with no extra flags) streaming an integer into a TORCH_CHECK message
// segfaults inside std::ostream, turning a clear ValueError into a crash. Strings stream fine,
// so every message that mentions a number goes through gnnfuse::text(...).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <string>
#include <type_traits>

namespace gnnfuse {

inline void append_text(std::string& s, const std::string& v) { s += v; }
inline void append_text(std::string& s, const char* v) { s += v; }
inline void append_text(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
inline void append_text(std::string& s, c10::IntArrayRef v) {
  s += "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  s += "]";
}
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
inline void append_text(std::string& s, T v) {
  s += std::to_string(v);
}

template <typename... Args>
std::string text(const Args&... args) {
  std::string s;
  (append_text(s, args), ...);
  return s;
}

}  // namespace gnnfuse
