#include "base/text.hpp"

#include <charconv>
#include <cstdio>
#include <limits>
#include <string_view>

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

namespace {

bool continuation(unsigned char c) {
  return (c & 0xc0) == 0x80;
}

// The length of the valid UTF-8 character at `text[at]` (1 to 4), or 0 if the bytes there are
// not one (a stray continuation, an overlong form, a surrogate, past U+10FFFF, cut short).
std::size_t utf8_length(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) {
    return at + i < text.size() ? static_cast<unsigned char>(text[at + i]) : 0;
  };
  const unsigned char lead = byte(0);
  if (lead < 0x80) {
    return 1;
  }
  std::size_t length = 0;
  unsigned char low = 0x80;  // the second byte's bounds
  unsigned char high = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    low = lead == 0xe0 ? 0xa0 : 0x80;
    high = lead == 0xed ? 0x9f : 0xbf;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    low = lead == 0xf0 ? 0x90 : 0x80;
    high = lead == 0xf4 ? 0x8f : 0xbf;
  } else {
    return 0;
  }
  if (byte(1) < low || byte(1) > high) {
    return 0;
  }
  for (std::size_t i = 2; i < length; ++i) {
    if (!continuation(byte(i))) {
      return 0;
    }
  }
  return length;
}

// `text` with every character passed to `control` (a C0, DEL or C1 one, by its code point) or
// `plain` (any other, by its bytes), and each invalid byte to `invalid`.
template <class Control, class Plain, class Invalid>
void each_character(std::string_view text, Control control, Plain plain, Invalid invalid) {
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t length = utf8_length(text, at);
    const auto lead = static_cast<unsigned char>(text[at]);
    if (length == 0) {
      invalid();
      at += 1;
      continue;
    }
    if (length == 1 && (lead < 0x20 || lead == 0x7f)) {
      control(static_cast<unsigned>(lead));
    } else if (length == 2 && lead == 0xc2 && static_cast<unsigned char>(text[at + 1]) < 0xa0) {
      control(static_cast<unsigned>(static_cast<unsigned char>(text[at + 1])));  // C1
    } else {
      plain(text.substr(at, length));
    }
    at += length;
  }
}

constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD

}  // namespace

std::string json_string(std::string_view text) {
  std::string out = "\"";
  each_character(
      text,
      [&](unsigned code) {
        char escaped[16];  // "\\u" and up to 8 hex digits, as the compiler counts
        (void)std::snprintf(escaped, sizeof escaped, "\\u%04x", code);
        out += escaped;
      },
      [&](std::string_view character) {
        if (character == "\"" || character == "\\") {
          out += '\\';
        }
        out += character;
      },
      [&] { out += kReplacement; });
  return out + "\"";
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  each_character(
      text,
      [&](unsigned code) {
        char escaped[16];  // "\\u" and up to 8 hex digits, as the compiler counts
        if (code < 0x80) {
          (void)std::snprintf(escaped, sizeof escaped, "\\x%02x", code);
        } else {
          (void)std::snprintf(escaped, sizeof escaped, "\\u%04x", code);
        }
        out += escaped;
      },
      [&](std::string_view character) { out += character; }, [&] { out += kReplacement; });
  return out;
}

std::size_t utf8_head(std::string_view text, std::size_t limit) {
  if (limit >= text.size()) {
    return text.size();
  }
  std::size_t end = limit;
  while (end > 0 && continuation(static_cast<unsigned char>(text[end]))) {
    --end;  // the cut falls inside a character: keep none of it
  }
  return end;
}

std::size_t utf8_tail(std::string_view text, std::size_t limit) {
  if (limit >= text.size()) {
    return 0;
  }
  std::size_t begin = text.size() - limit;
  while (begin < text.size() && continuation(static_cast<unsigned char>(text[begin]))) {
    ++begin;  // the rest of a character whose lead is cut off
  }
  return begin;
}

}  // namespace lockstep::detail
