#include "waiting/wait_controls.hpp"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "base/log.hpp"
#include "base/text.hpp"  // rounded_seconds
#include "lockstep/error.hpp"

namespace lockstep::detail {

namespace {
std::atomic<int> interrupt_fd{-1};
thread_local bool deaf_to_interrupts = false;  // ignore_interrupts_on_this_thread
std::atomic<std::int64_t> stall_after_ns{0};
}  // namespace

std::chrono::nanoseconds set_stall_warning(std::chrono::nanoseconds after) noexcept {
  return std::chrono::nanoseconds(
      stall_after_ns.exchange(std::max<std::int64_t>(after.count(), 0), std::memory_order_relaxed));
}

std::chrono::nanoseconds stall_warning() noexcept {
  return std::chrono::nanoseconds(stall_after_ns.load(std::memory_order_relaxed));
}

void say_stalled(int rank, const char* what, std::chrono::nanoseconds waited,
                 const std::string& whom) noexcept {
  try {
    const std::string amount = rounded_seconds(std::chrono::duration<double>(waited).count());
    log_line(rank, std::string(what) + " has waited " + amount + " s for " + whom +
                       "; still waiting (LOCKSTEP_STALL_WARNING sets when this is said)");
  } catch (...) {
    // Out of memory for a diagnostic: the wait goes on without it.
  }
}

int set_interrupt_fd(int fd) noexcept {
  return interrupt_fd.exchange(fd < 0 ? -1 : fd, std::memory_order_relaxed);
}

bool interrupt_pending() noexcept {
  // Relaxed: the descriptor is set before the wait by the thread that waits.
  const int fd = interrupt_fd.load(std::memory_order_relaxed);
  if (fd < 0 || deaf_to_interrupts) {  // the thread-local only read where a descriptor is set
    return false;
  }
  pollfd entry{fd, POLLIN, 0};
  return ::poll(&entry, 1, 0) > 0 && (entry.revents & POLLIN) != 0;
}

bool interrupt_armed() noexcept {
  return interrupt_fd.load(std::memory_order_relaxed) >= 0 && !deaf_to_interrupts;
}

void ignore_interrupts_on_this_thread() noexcept {
  deaf_to_interrupts = true;
}

void check_interrupt(const std::string& what) {
  if (interrupt_pending()) {
    throw InterruptedError(what + ": interrupted by a signal");
  }
}

}  // namespace lockstep::detail
