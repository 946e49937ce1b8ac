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
// `text` as a JSON string, quoted, with quotes, backslashes and control characters (C0, DEL and
// C1) escaped, and each byte that is not part of valid UTF-8 written as U+FFFD: what any strict
// JSON parser takes, whatever the bytes (a file name is any bytes but '/' and '\0').
std::string json_string(std::string_view text);
// `text` for a message or a terminal: valid UTF-8 as it is, each invalid byte as U+FFFD, control
// characters (C0, DEL and C1) as \xNN or \uNNNN, so that a file name cannot move a cursor or
// end a line.
std::string printable(std::string_view text);
// How many of `text`'s first `limit` bytes to keep so that no character is cut: `limit`, less the
// lead of a character that would be cut at it.
std::size_t utf8_head(std::string_view text, std::size_t limit);
// Where the last `limit` bytes of `text` begin, moved past the rest of a character they would cut.
std::size_t utf8_tail(std::string_view text, std::size_t limit);
// "2.0", "12": how long something has lasted, for a message (a tenth below 10 s, whole above).
std::string rounded_seconds(double seconds);
// "5", "0.5", "2.25": seconds for a message, in their shortest form (printf's %g).
std::string seconds_text(double seconds);

}  // namespace lockstep::detail
