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
// The futex system call with its four arguments that FUTEX_WAIT and FUTEX_WAKE read; the result,
// or -errno. Made in line, not through libc's syscall(): a sleeper's first instructions after its
// wake-up are this function's return path, and libc's wrapper is one more return (each
// mispredicted after a context switch: see Waiter::wait) and a trip through the PLT.
long futex_call(std::uint32_t* word, int op, std::uint32_t value,
                const timespec* timeout) noexcept {
#if defined(__x86_64__)
  long rc = SYS_futex;
  register const timespec* r10 asm("r10") = timeout;
  asm volatile("syscall"
               : "+a"(rc)
               : "D"(word), "S"(static_cast<long>(op)), "d"(static_cast<long>(value)), "r"(r10)
               : "rcx", "r11", "memory");
  return rc;
#elif defined(__aarch64__)
  register long x8 asm("x8") = SYS_futex;
  register long x0 asm("x0") = reinterpret_cast<long>(word);
  register long x1 asm("x1") = op;
  register long x2 asm("x2") = static_cast<long>(value);
  register long x3 asm("x3") = reinterpret_cast<long>(timeout);
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
  return x0;
#else
  const long rc = ::syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
  return rc == -1 ? -errno : rc;
#endif
}
}  // namespace

FutexResult futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                       std::chrono::nanoseconds timeout) noexcept {
  if (timeout.count() <= 0) {
    return FutexResult::timed_out;
  }
  // Untimed when it may be: a timed FUTEX_WAIT costs an episode of a loaded machine's barrier
  // 12-15% more than an untimed one (docs/performance-history.md, "What a sleep costs").
  timespec relative{};
  const bool untimed = timeout == std::chrono::nanoseconds::max();
  relative.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  relative.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  const long rc = futex_call(address(word), FUTEX_WAIT, expected, untimed ? nullptr : &relative);
  if (rc == 0) {
    return FutexResult::woken;
  }
  switch (-rc) {
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
  (void)futex_call(address(word), FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace lockstep::detail
