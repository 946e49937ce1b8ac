#include "waiting/wait_signals.hpp"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <new>

#include "base/unique_fd.hpp"

namespace lockstep::detail {

namespace {

class SystemSignals final : public WaitSignals {
 public:
  SystemSignals() noexcept
      : loadavg_(::open("/proc/loadavg", O_RDONLY | O_CLOEXEC)),
        online_(static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)))) {}
  // Never destroyed (see system_signals): its descriptor goes with the process.
  ~SystemSignals() override = default;
  SystemSignals(const SystemSignals&) = delete;
  SystemSignals& operator=(const SystemSignals&) = delete;

  WaitClock::time_point now() noexcept override { return WaitClock::now(); }

  // steady_clock is CLOCK_MONOTONIC (libstdc++ and libc++ on Linux): the coarse clock counts
  // from the same origin.
  WaitClock::time_point coarse_now() noexcept override {
    timespec now{};
    if (::clock_gettime(CLOCK_MONOTONIC_COARSE, &now) != 0) {
      return WaitClock::now();
    }
    return WaitClock::time_point(std::chrono::seconds(now.tv_sec) +
                                 std::chrono::nanoseconds(now.tv_nsec));
  }

  // "0.43 0.83 0.41 4/80 4080": the numerator of the fourth field. pread at offset 0 makes the
  // kernel write the line anew, so the file is opened once (a fork inherits it: pread keeps no
  // offset to share).
  int runnable_tasks() noexcept override {
    if (!loadavg_) {
      return -1;
    }
    char text[128];
    const ssize_t length = ::pread(loadavg_.get(), text, sizeof text - 1, 0);
    if (length <= 0) {
      return -1;
    }
    text[length] = '\0';
    int spaces = 0;
    const char* p = text;
    for (; *p != '\0' && spaces < 3; ++p) {
      spaces += *p == ' ' ? 1 : 0;
    }
    char* end = nullptr;
    const long runnable = std::strtol(p, &end, 10);
    return end != p && *end == '/' && runnable > 0 && runnable < 1'000'000
               ? static_cast<int>(runnable)
               : -1;
  }

  int online_cpus() noexcept override { return online_; }

  void yield() noexcept override { ::sched_yield(); }

 private:
  UniqueFd loadavg_;
  int online_;
};

}  // namespace

WaitSignals& system_signals() noexcept {
  // Never destroyed: a thread may still wait in a barrier while its process exits (see
  // Context::leave), and a descriptor closed under it could be reused for another file.
  alignas(SystemSignals) static unsigned char storage[sizeof(SystemSignals)];
  static auto* const signals = new (storage) SystemSignals;
  return *signals;
}

}  // namespace lockstep::detail
