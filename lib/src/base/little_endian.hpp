// Little-endian integers in byte buffers (internal): what base/bytes.hpp's writer and reader
// are made of. Formats use those, not these.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::detail {

// Writes the `bytes` low bytes of `value` at `at`, least significant first.
inline void put_le(std::byte* at, std::uint64_t value, std::size_t bytes) noexcept {
  for (std::size_t i = 0; i < bytes; ++i) {
    at[i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
  }
}

// Reads `bytes` bytes at `at`, least significant first.
inline std::uint64_t get_le(const std::byte* at, std::size_t bytes) noexcept {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < bytes; ++i) {
    value |= static_cast<std::uint64_t>(at[i]) << (8 * i);
  }
  return value;
}

}  // namespace lockstep::detail
