// Facts about other processes, from /proc (internal).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace lockstep::detail {

// The start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat); it tells a
// process apart from a later one that reuses its pid. Empty when the process does not exist.
std::optional<std::uint64_t> process_start_time(pid_t pid);

enum class Liveness { alive, dead };

// Whether the process registered as (`pid`, `start_time`) still runs. A zombie (exited, not yet
// reaped) is dead; so is a different process that now has the pid.
Liveness process_liveness(pid_t pid, std::uint64_t start_time);

// strerror for `error_number`, thread-safe.
std::string error_text(int error_number);

// Throws SystemError "<what>: <call> failed: <strerror>" for the current errno.
[[noreturn]] void throw_errno(const std::string& what, const char* call);

}  // namespace lockstep::detail
