// Facts about other processes, from /proc (internal).
#pragma once

#include <sys/types.h>

#include <array>
#include <bitset>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

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

// Reads `size` bytes at `address` of process `pid` into `to` (process_vm_readv: one copy, no
// file between); false when it cannot (not permitted, the process gone, a fault point).
bool read_other_memory(pid_t pid, std::uint64_t address, std::byte* to,
                       std::uint64_t size) noexcept;

// This boot of this host (/proc/sys/kernel/random/boot_id, its 32 hex digits as two words),
// {0, 0} if unknown: with pid_namespace(), whether a process of another machine runs beside this
// one, where its pid and start time can be looked up.
std::array<std::uint64_t, 2> boot_id();

// A process as another machine's process sees it: its host's boot, its pid namespace, its pid
// and start time. Zeros: not known.
struct ProcessMark {
  std::array<std::uint64_t, 2> boot{};
  std::uint64_t pid_namespace = 0;
  std::uint32_t pid = 0;
  std::uint64_t start_time = 0;
  bool operator==(const ProcessMark&) const = default;
};
ProcessMark this_process_mark();

enum class Fate { unknown, alive, dead };

// What became of the process `mark` names, as far as this process can tell: unknown unless it
// ran on this boot of this host, in this pid namespace. A process whose connection was seen to
// end may take a moment more to be gone: a live one is looked at again for up to `grace`.
Fate fate_of(const ProcessMark& mark, std::chrono::milliseconds grace);

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cpus() noexcept;

// The CPU numbers an affinity mask of glibc's fixed size can name (CPU_SETSIZE).
inline constexpr int kMaxCpus = 1024;
// The CPUs the calling thread may run on (its affinity mask); none where it cannot be read.
std::bitset<kMaxCpus> affinity() noexcept;
// Moves the calling thread to `cpu` now and leaves its affinity mask as it was: the mask set to
// `cpu` alone (the kernel migrates the running thread before the call returns), then back. Only
// the calling thread moves: threads it starts later inherit the mask, not the CPU. False where a
// call failed (`cpu` is not in the mask, or the thread's cpuset changed): the mask is then as it
// was.
bool move_to_cpu(int cpu) noexcept;

// Whether an address lies in a read-only segment of a loaded image (the program or a shared
// library: its string literals, __func__, std::source_location's strings), whose bytes cannot
// change while it is loaded. False for the heap, the stack, writable data and null. The
// segments are read once and again only when an image was loaded or unloaded since (the
// loader's counts), so that a process with hundreds of libraries pays a lookup, not a walk of
// them all (about 1 us for 60). One thread at a time.
class ReadOnlyImages {
 public:
  [[nodiscard]] bool contains(const void* address) noexcept;

 private:
  struct Segment {
    std::uintptr_t begin;
    std::uintptr_t end;
  };
  bool read_ = false;
  unsigned long long adds_ = 0;    // NOLINT(google-runtime-int): dl_phdr_info's type
  unsigned long long subs_ = 0;    // NOLINT(google-runtime-int)
  std::vector<Segment> segments_;  // sorted by begin
};
// ReadOnlyImages::contains, reading the segments anew.
[[nodiscard]] bool in_read_only_image(const void* address) noexcept;

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
