// Bytes for the exchanges' tests (internal to tests/): a pattern that differs with its seed at
// every position, so that a byte out of place, or another process's, is seen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace lockstep::testing {

// `size` bytes of the pattern of `seed` (xorshift64, eight bytes at a time).
inline std::string pattern(std::size_t size, std::uint64_t seed) {
  std::string text(size, '\0');
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (std::size_t i = 0; i + 8 <= size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&text[i], &x, 8);
  }
  for (std::size_t i = size / 8 * 8; i < size; ++i) {
    text[i] = static_cast<char>(seed + i);
  }
  return text;
}

}  // namespace lockstep::testing
