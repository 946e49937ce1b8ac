// The one way lockstep writes and reads its byte formats (internal): the UCX backend's messages,
// the places desk's frames, the exchanges' records, the join's words. Integers are little-endian
// whatever the machine. A reader checks every read against the bytes it has and every count
// against a limit, and throws BytesError naming what did not fit: nothing a peer sends can make
// it read out of bounds or allocate without bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/little_endian.hpp"

namespace lockstep::detail {

// Bytes that are not what their format says: truncated, over a limit, or of an unknown kind.
class BytesError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ByteWriter {
 public:
  ByteWriter() = default;
  // Goes on after what `out` holds (its bytes are moved in; take() gives them back).
  explicit ByteWriter(std::vector<std::byte> out) noexcept : out_(std::move(out)) {}

  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void i32(std::int32_t v) { put(static_cast<std::uint32_t>(v), 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  // The bytes as they are (their length is the format's, or written before them).
  void raw(std::span<const std::byte> data) { out_.insert(out_.end(), data.begin(), data.end()); }
  // A u32 length, then the bytes.
  void sized(std::span<const std::byte> data) {
    u32(static_cast<std::uint32_t>(data.size()));
    raw(data);
  }
  void text(std::string_view s) { sized(std::as_bytes(std::span(s.data(), s.size()))); }

  [[nodiscard]] std::size_t size() const noexcept { return out_.size(); }
  [[nodiscard]] std::vector<std::byte> take() { return std::move(out_); }

 private:
  void put(std::uint64_t v, std::size_t size) {
    out_.resize(out_.size() + size);
    put_le(out_.data() + out_.size() - size, v, size);
  }
  std::vector<std::byte> out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> in) noexcept : in_(in) {}

  std::uint8_t u8() { return static_cast<std::uint8_t>(get(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(get(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(get(4)); }
  std::int32_t i32() { return static_cast<std::int32_t>(u32()); }
  std::uint64_t u64() { return get(8); }
  // The next `n` bytes, in place.
  std::span<const std::byte> raw(std::uint64_t n, const char* what) {
    if (n > left()) {
      throw BytesError(std::string(what) + ": " + std::to_string(n) + " bytes do not fit in the " +
                       std::to_string(left()) + " left");
    }
    const auto out = in_.subspan(at_, static_cast<std::size_t>(n));
    at_ += static_cast<std::size_t>(n);
    return out;
  }
  // A u32 count of items of `item_size` bytes each (at least), checked against `limit` and the
  // bytes left.
  std::size_t count(std::size_t limit, std::size_t item_size, const char* what) {
    const std::size_t n = u32();
    if (n > limit) {
      throw BytesError(std::string(what) + ": " + std::to_string(n) + " is over the limit of " +
                       std::to_string(limit));
    }
    if (n * item_size > left()) {
      throw BytesError(std::string(what) + ": " + std::to_string(n) + " items do not fit in the " +
                       std::to_string(left()) + " bytes left");
    }
    return n;
  }
  // A u32 length (at most `limit`), then the bytes.
  std::span<const std::byte> sized(std::size_t limit, const char* what) {
    return raw(count(limit, 1, what), what);
  }
  std::string text(std::size_t limit, const char* what) {
    const auto bytes = sized(limit, what);
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }

  [[nodiscard]] std::size_t left() const noexcept { return in_.size() - at_; }
  // Throws unless every byte was read (a format whose length is its own).
  void finish() const {
    if (left() != 0) {
      throw BytesError(std::to_string(left()) + " bytes after the end of the message");
    }
  }

 private:
  std::uint64_t get(std::size_t size) {
    if (left() < size) {
      throw BytesError("truncated message (" + std::to_string(in_.size()) + " bytes)");
    }
    const std::uint64_t v = get_le(in_.data() + at_, size);
    at_ += size;
    return v;
  }
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
};

}  // namespace lockstep::detail
