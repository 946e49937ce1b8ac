// How long a waiter spins, yields and sleeps (internal).
#pragma once

#include <chrono>

#include "lockstep/state.hpp"

namespace lockstep::detail {

// The phases of one wait: busy-spin, then sched_yield, then futex sleep (if allowed).
struct WaitPlan {
  std::chrono::nanoseconds spin{0};
  std::chrono::nanoseconds yield{0};
  bool sleep = true;
};

// The plan for `policy` when `processes` processes share `cpus` usable CPUs.
//
// adaptive, one core or more per process: spin 20 us, yield 200 us, then sleep. ANCHORS.md (2-core
//   EPYC VM, 2026-11-29): a centralized barrier that spins ~20 us before its futex costs 0.26 us
//   at N=2, while a ~2 us spin falls through to the 10-15 us futex wake often enough to average
//   ~1 us. The yield phase keeps a moderately late peer off the futex path.
// adaptive, more processes than cores: no spin, yield up to 2 ms, then sleep. Spinning starves
//   the late arrivals sharing this core (ANCHORS.md: a pure spin costs whole 4 ms scheduler ticks
//   per episode); bench/barrier_bench on the same machine, 2026-11-29: a 1 us spin before
//   yielding cost 5.3 us per episode at N=4 and 14.8 us at N=8, yielding at once 2.1 and 5.0 us.
//   The 2 ms yield bound keeps a long wait under 0.3% of a core (one futex poll per 100 ms after).
// spin: spin for ever; block: sleep at once.
WaitPlan make_wait_plan(WaitPolicy policy, int processes, int cpus);

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cpus();

}  // namespace lockstep::detail
