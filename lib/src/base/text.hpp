// Small helpers for reading and writing text (internal).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::detail {

// Parses a whole decimal integer; empty when `text` is not one (no sign other than '-', no
// spaces, no trailing characters, within int's range).
std::optional<long long> parse_integer(std::string_view text);

// "3, 5, 7": numbers for a message.
std::string comma_list(const std::vector<int>& numbers);
// "ucx, nccl": words for a message.
std::string comma_list(const std::vector<std::string>& words);
// `text` as a JSON string, quoted, with quotes, backslashes and control characters escaped.
std::string json_string(const std::string& text);
// "2.0", "12": how long something has lasted, for a message (a tenth below 10 s, whole above).
std::string rounded_seconds(double seconds);
// "5", "0.5", "2.25": seconds for a message, in their shortest form (printf's %g).
std::string seconds_text(double seconds);

}  // namespace lockstep::detail
