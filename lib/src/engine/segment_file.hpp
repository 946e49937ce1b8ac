// The node segment as a file in /dev/shm, for engine/segment*.cpp (internal): its path, its
// lock, its first fields read without mapping it, and the liveness of its slots.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>  // std::try_to_lock_t
#include <string>

#include "base/proc.hpp"  // Liveness
#include "engine/layout.hpp"

namespace lockstep::detail {

std::string shm_path(const std::string& name);

// Holds flock(LOCK_EX) on a descriptor. The kernel drops it if the process dies; a process
// that holds it while stopped (SIGSTOP) must not block the others beyond their deadline.
class FileLock {
 public:
  // Waits for the lock until `deadline`, then throws TimeoutError naming the holder.
  FileLock(int fd, std::chrono::steady_clock::time_point deadline, const std::string& name);
  // Tries once; held() says whether it got the lock.
  FileLock(int fd, std::try_to_lock_t /*tag*/);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  [[nodiscard]] bool held() const noexcept { return held_; }

 private:
  bool try_lock();

  int fd_;
  bool held_ = false;
};

// The header fields every layout version keeps in place, read without mapping the file.
struct Prefix {
  std::uint64_t magic = 0;
  std::uint32_t layout_version = 0;
  std::uint32_t num_slots = 0;
};
enum class Peek { ours, torn, other_version };

Peek peek(int fd, std::size_t size, Prefix& prefix);

// Whether `name` still names the file open on `fd` (another process may have replaced it).
bool still_named(int fd, const std::string& name, struct stat& by_fd);

// Whether `st` is a file as lockstep makes its segments: regular, this user's, owner-only.
bool made_by_us(const struct stat& st);

SlotStatus status_of(const Slot& slot);

// Whether the slot's process has joined and is (or is no longer) running. A zombie, or another
// process that now has the pid, is not running.
bool joined_and(const Slot& slot, Liveness liveness);

bool any_peer_alive(const Slot* slots, int num_slots, int except);

Slot* slots_of(SegmentHeader* header);

}  // namespace lockstep::detail
