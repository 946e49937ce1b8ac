// Bytes as the tests write them down (pinned formats): hex text, and text's bytes.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace lockstep::testing {

inline std::string hex(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (std::byte b : bytes) {
    out += kDigits[std::to_integer<unsigned>(b) >> 4];
    out += kDigits[std::to_integer<unsigned>(b) & 15];
  }
  return out;
}

inline std::vector<std::byte> unhex(const std::string& text) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i + 1 < text.size(); i += 2) {
    out.push_back(static_cast<std::byte>(std::stoi(text.substr(i, 2), nullptr, 16)));
  }
  return out;
}

inline std::vector<std::byte> bytes_of(const std::string& text) {
  const auto span = std::as_bytes(std::span(text.data(), text.size()));
  return {span.begin(), span.end()};
}

}  // namespace lockstep::testing
