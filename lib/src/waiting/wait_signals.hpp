// Waiting: what a wait reads of the machine (internal): the clocks, the runnable tasks and the
// CPUs online (/proc/loadavg, sysconf), and sched_yield, behind one interface, so that tests drive
// the waiter with a fake clock and fake load (waiting/waiter.hpp).
#pragma once

#include <chrono>

namespace lockstep::detail {

using WaitClock = std::chrono::steady_clock;

// What the adaptive policy reads of the machine.
class WaitSignals {
 public:
  WaitSignals() = default;
  virtual ~WaitSignals() = default;
  WaitSignals(const WaitSignals&) = delete;
  WaitSignals& operator=(const WaitSignals&) = delete;

  [[nodiscard]] virtual WaitClock::time_point now() noexcept = 0;
  // The same clock read cheaply, as of the last scheduler tick (CLOCK_MONOTONIC_COARSE: never
  // ahead of now(), behind it by a tick at most, 1-10 ms). For the times a wait that sleeps at
  // once keeps, whose scale is the periodic check's and the stall line's (see Waiter::wait).
  [[nodiscard]] virtual WaitClock::time_point coarse_now() noexcept { return now(); }
  // Tasks runnable on the machine at this instant, the caller included (the numerator of
  // /proc/loadavg's fourth field), or -1 when it cannot be read.
  [[nodiscard]] virtual int runnable_tasks() noexcept = 0;
  // CPUs online on the machine.
  [[nodiscard]] virtual int online_cpus() noexcept = 0;
  // Offers the CPU to another runnable task (sched_yield).
  virtual void yield() noexcept = 0;
};

// The machine itself: the steady clock, /proc/loadavg (opened once, read with pread) and
// sched_yield.
WaitSignals& system_signals() noexcept;

}  // namespace lockstep::detail
