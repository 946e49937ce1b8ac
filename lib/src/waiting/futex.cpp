#include "waiting/futex.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>

namespace lockstep::detail {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t),
              "a futex word must be a plain 32-bit word");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "futex words must be lock-free");

namespace {
auto* address(const std::atomic<std::uint32_t>& word) noexcept {
  // The kernel reads the word itself; the cast only names its address.
  return reinterpret_cast<std::uint32_t*>(const_cast<std::atomic<std::uint32_t>*>(&word));
}
}  // namespace

FutexResult futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                       std::chrono::nanoseconds timeout) noexcept {
  if (timeout.count() <= 0) {
    return FutexResult::timed_out;
  }
  // Untimed when it may be: a timed FUTEX_WAIT costs an episode of a loaded machine's barrier
  // 12-15% more than an untimed one (docs/performance.md, "What a sleep costs").
  timespec relative{};
  const bool untimed = timeout == std::chrono::nanoseconds::max();
  relative.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  relative.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  long rc = ::syscall(SYS_futex, address(word), FUTEX_WAIT, expected, untimed ? nullptr : &relative,
                      nullptr, 0);
  if (rc == 0) {
    return FutexResult::woken;
  }
  switch (errno) {
    case EAGAIN:
      return FutexResult::value_changed;
    case ETIMEDOUT:
      return FutexResult::timed_out;
    case EINTR:
      return FutexResult::interrupted;
    default:
      return FutexResult::woken;  // EFAULT/EINVAL cannot happen on a mapped word: re-check it
  }
}

void futex_wake_all(const std::atomic<std::uint32_t>& word) noexcept {
  ::syscall(SYS_futex, address(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace lockstep::detail
