// Facts about other processes, from /proc (internal).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace lockstep::detail {

// The start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat); it tells a
// process apart from a later one that reuses its pid. Empty when the process does not exist.
std::optional<std::uint64_t> process_start_time(pid_t pid);

enum class Liveness { alive, dead };

// Whether the process registered as (`pid`, `start_time`) still runs. A zombie (exited, not yet
// reaped) is dead; so is a different process that now has the pid.
Liveness process_liveness(pid_t pid, std::uint64_t start_time);

// A process (other than this one) that has the file `path` (inode `inode`) mapped, if any: a
// scan of /proc/*/maps, for rare paths only (a segment of another lockstep version, a torn one).
// Processes of other users and other pid namespaces are not seen.
std::optional<pid_t> process_mapping(const std::string& path, ino_t inode);

// The process holding a flock() on the file with inode `inode`, from /proc/locks, if any.
std::optional<pid_t> flock_holder(ino_t inode);

// The inode of this process's pid namespace (/proc/self/ns/pid), 0 if unknown: pids and start
// times mean something only within one namespace.
std::uint64_t pid_namespace();

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cpus() noexcept;

// strerror for `error_number`, thread-safe.
std::string error_text(int error_number);

// "uid 1001 (mallory)", or "uid 1001" where the user database has no name for it.
std::string user_of(uid_t uid);

// Fills `bytes` from the kernel's random source (getrandom); SystemError naming `what` when it
// gives none.
void fill_random(std::span<std::byte> bytes, const std::string& what);

// Throws SystemError "<what>: <call> failed: <strerror>" for the current errno.
[[noreturn]] void throw_errno(const std::string& what, const char* call);

}  // namespace lockstep::detail
