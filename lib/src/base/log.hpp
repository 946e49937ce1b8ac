// Diagnostics on request (internal): LOCKSTEP_LOG=info|debug (or LOCKSTEP_DEBUG=1, as info)
// makes each process say once what it detected, and at debug also its joins, leaves, timeouts and
// peer losses, each line on stderr with a timestamp and its rank. Off by default; nothing here is
// on the barrier's path (the debug lines come from the join, the leave and the error paths).
#pragma once

#include <string>

namespace lockstep::detail {

enum class LogLevel { off = 0, info = 1, debug = 2 };

// Writes "lockstep [<UTC time> rank <rank>] <text>\n" to stderr in one write.
void log_line(int rank, const std::string& text) noexcept;

}  // namespace lockstep::detail
