#include "base/text.hpp"

#include <charconv>
#include <cstdio>
#include <limits>

namespace lockstep::detail {

std::optional<long long> parse_integer(std::string_view text) {
  long long value = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (text.empty()) {
    return std::nullopt;
  }
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc{} || ptr != end || value < std::numeric_limits<int>::min() ||
      value > std::numeric_limits<int>::max()) {
    return std::nullopt;
  }
  return value;
}

std::string comma_list(const std::vector<int>& numbers) {
  std::string out;
  for (int number : numbers) {
    // Appended in two steps: GCC 12's link-time optimization of "..." + std::string warned of a
    // copy past any object's size (-Wstringop-overflow, a false alarm) in release builds.
    if (!out.empty()) {
      out += ", ";
    }
    out += std::to_string(number);
  }
  return out;
}

std::string rounded_seconds(double seconds) {
  char text[32];
  (void)std::snprintf(text, sizeof text, seconds < 10 ? "%.1f" : "%.0f", seconds);
  return text;
}

std::string seconds_text(double seconds) {
  char text[32];
  (void)std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

std::string comma_list(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& word : words) {
    out += (out.empty() ? "" : ", ") + word;
  }
  return out;
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      (void)std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace lockstep::detail
