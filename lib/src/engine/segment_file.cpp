// The node segment as a file (segment_file.hpp).
#include "engine/segment_file.hpp"

#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <thread>

#include "lockstep/error.hpp"
#include "waiting/wait_controls.hpp"  // check_interrupt

namespace lockstep::detail {

std::string shm_path(const std::string& name) {
  return "/dev/shm/" + name;
}

FileLock::FileLock(int fd, std::chrono::steady_clock::time_point deadline, const std::string& name)
    : fd_(fd) {
  auto pause = std::chrono::microseconds(20);
  while (!try_lock()) {
    check_interrupt("lockstep: joining the job (locking " + shm_path(name) + ")");
    if (std::chrono::steady_clock::now() >= deadline) {
      struct stat st {};
      std::optional<pid_t> holder;
      if (::fstat(fd_, &st) == 0) {
        holder = flock_holder(st.st_ino);
      }
      throw TimeoutError(
          "lockstep: could not lock shared-memory segment " + shm_path(name) + " in time: " +
              (holder ? "process " + std::to_string(*holder) : std::string("another process")) +
              " holds its lock (is it stopped?)",
          {});
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(2));
  }
}

FileLock::FileLock(int fd, std::try_to_lock_t /*tag*/) : fd_(fd) {
  (void)try_lock();
}

FileLock::~FileLock() {
  if (held_) {
    ::flock(fd_, LOCK_UN);
  }
}

bool FileLock::try_lock() {
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return false;
    }
    if (errno != EINTR) {
      throw_errno("lockstep: locking the node segment", "flock");
    }
  }
  held_ = true;
  return true;
}

Peek peek(int fd, std::size_t size, Prefix& prefix) {
  if (size < sizeof(SegmentHeader) ||
      ::pread(fd, &prefix, sizeof prefix, 0) != static_cast<ssize_t>(sizeof prefix) ||
      prefix.magic != kSegmentMagic) {
    return Peek::torn;  // its creator died while laying it out (it held the lock we hold)
  }
  if (prefix.layout_version != kLayoutVersion) {
    return Peek::other_version;
  }
  return size >= segment_size(prefix.num_slots) ? Peek::ours : Peek::torn;
}

bool still_named(int fd, const std::string& name, struct stat& by_fd) {
  struct stat by_name {};
  if (::fstat(fd, &by_fd) != 0 || ::stat(shm_path(name).c_str(), &by_name) != 0) {
    return false;
  }
  return by_fd.st_ino == by_name.st_ino && by_fd.st_dev == by_name.st_dev;
}

bool made_by_us(const struct stat& st) {
  return S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 0077) == 0;
}

SlotStatus status_of(const Slot& slot) {
  // Acquire: the status is stored last, so a reader that sees it also sees the slot's pid,
  // start time and rank.
  return static_cast<SlotStatus>(slot.status.load(std::memory_order_acquire));
}

bool joined_and(const Slot& slot, Liveness liveness) {
  // Relaxed: ordered by status_of's acquire.
  return status_of(slot) == SlotStatus::joined &&
         process_liveness(slot.pid.load(std::memory_order_relaxed),
                          slot.start_time.load(std::memory_order_relaxed)) == liveness;
}

bool any_peer_alive(const Slot* slots, int num_slots, int except) {
  for (int i = 0; i < num_slots; ++i) {
    if (i != except && joined_and(slots[i], Liveness::alive)) {
      return true;
    }
  }
  return false;
}

Slot* slots_of(SegmentHeader* header) {
  return reinterpret_cast<Slot*>(header + 1);
}

}  // namespace lockstep::detail
