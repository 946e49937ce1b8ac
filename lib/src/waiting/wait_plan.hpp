// Waiting: the plan of one wait (internal): how long it spins, then yields, then whether it
// sleeps, for each wait policy, the job's shape and the machine's load; and the tuned numbers
// behind it, each with where it came from. waiting/waiter.hpp follows the plan and adapts it.
#pragma once

#include <chrono>
#include <cstddef>

#include "lockstep/wait_policy.hpp"

namespace lockstep::detail {

// The phases of one wait: busy-poll, then poll with sched_yield between polls, then block on the
// site (if `sleep`). `spin == nanoseconds::max()` spins for ever.
struct WaitOptions {
  std::chrono::nanoseconds spin{0};
  std::chrono::nanoseconds yield{0};
  bool sleep = true;
  friend bool operator==(const WaitOptions&, const WaitOptions&) = default;
};

// Who waits. Fixed for a process's membership.
struct WaitShape {
  int processes = 1;          // the job's processes on this node
  int cpus = 1;               // CPUs this process may run on (its affinity mask)
  bool across_nodes = false;  // the job spans nodes: every wait includes a network round trip
  // The job's processes on this machine (0: `processes`), for load samples: more than the node's
  // when simulated nodes share the machine.
  int processes_here = 0;
};

// The tuned numbers, each with where it came from.
namespace wait_tuning {
using std::chrono::microseconds;
using std::chrono::milliseconds;
// Spins before the first clock read, so that the common, immediate case reads no clock.
inline constexpr int kQuickSpins = 64;
// Of those, the polls before a site is told that its wait stays (WaitSite::staying): about 50 ns
// (a pause costs 25 ns on a 2-vCPU AMD EPYC host, 10-40 ns elsewhere), longer than a release
// takes between SMT siblings of one core (a round trip of 0.06-0.07 us there).
inline constexpr int kPollsBeforeStaying = 2;
// Spins between clock reads (a clock read costs ~25 ns here, a pause ~10-40 ns).
inline constexpr int kSpinsPerClockRead = 64;
// The spin phase of a process that has a CPU to itself on an idle machine, between these bounds,
// sized from the waits it has seen (see Waiter::learn). 20 us is where it starts: the anchor
// measurements (docs/performance.md; a 2-core EPYC VM) found a centralized barrier that
// spins ~20 us before its futex at 0.26 us for N=2, while a ~2 us spin falls through to the 10-15
// us futex wake often enough to average ~1 us. Up to 200 us: a training-like loop (compute of 0-100
// us, then a barrier) has waits of that order, and a wake-up costs 10-15 us each time the spin
// falls short. On a loaded machine the spin is kSpinLoaded, sized to catch the peer that this
// process has just woken (a CPU each): a rank that completes an episode and wakes its peer comes
// back to the next one first, and the woken peer returns 5-6.5 us after it (bench/sleep-ab
// --wakes, N=2 beside one busy loop, 2 vCPUs). A spin that covers that catches the
// peer, and both ranks then run on while the competitors wait (a median episode of 0.1-0.5 us
// beside two or four busy loops); one that falls short sleeps, and the two keep waking each
// other (12-15 us). With 6 us against 1 us, `lockstep-bench -n 2 -f adaptive -i 300000` beside one,
// two and four busy loops, three runs each alternating: 8.3-8.8 against 11.4-11.9 us, 2.1-9.3
// against 11.9-17.0, 5.5-12.2 against 24.6-37.1. The paired runs, which sleep every episode, and
// the training-like loop did not move (docs/performance-history.md, "Where the loaded spin's cost
// goes"). Those 6 us followed the 64 quick polls (about 1.6 us); since a loaded wait makes one poll
// only (Waiter::wait), the spin runs 8 us from its first clock read, the same reach: beside two
// busy loops at N=2, BM_LockstepAdaptive/ranks:2 at 6 us against 8 us, 16 runs alternating, had
// medians 4.71 and 3.42 us (8 us faster in 12 of 16), beside one busy loop 11.9 and 11.2, beside
// one busy loop and two bursty processes 20.5 and 19.7; the training-like loop (sleep-ab --compute
// 50) did not move. Longer costs more where it misses: in the training-like loop with
// two busy processes beside N=2, a 20 us spin cost 240 us of overhead per episode and the quick
// spins alone 48: a waiter that spins spends the lag that would let it preempt the
// competitor when woken.
inline constexpr microseconds kSpinStart{20};
inline constexpr microseconds kSpinMin{2};
inline constexpr microseconds kSpinMaxIdle{200};
inline constexpr microseconds kSpinLoaded{8};
// After the spin (or at once, with more processes than CPUs), on an idle machine only: poll with
// sched_yield this long before sleeping. On an idle machine nobody else wants the CPU, and a
// sleep is dear: waking a halted vCPU costs 10-15 us, and sometimes milliseconds when the host
// has given the core away (bench/barrier_bench's training loop, N=2: with 200 us of
// yielding, 1-2 sleeps per 1,400 episodes raised the overhead per episode from 0.6 to 3 us in
// one run in four). More processes than CPUs: a 1 us spin before yielding cost
// 5.3 us per episode at N=4 and 14.8 us at N=8, yielding at once 2.1 and 5.0 us. The 2 ms bound
// keeps a 1 s wait at 0.2% of a core (the node barrier then wakes once per check_interval, 100 ms).
inline constexpr milliseconds kYieldIdle{2};
// Across nodes with a CPU per process: yield this long, then sleep (see plan_wait).
inline constexpr microseconds kYieldAcrossNodes{220};
// More processes than CPUs on an idle machine: a waiter whose late peers were each last seen on
// another CPU polls this long before each yield. Its CPU's other processes of the job have
// arrived (they wait, yielding), so a yield would only hand the CPU to one of them, which yields
// it back: two context switches (1.5 us each on 2 vCPUs of an AMD EPYC host, where a yield
// that switches nothing costs 0.5 us), and the episode's completion is seen only when the
// switch in progress ends. Polling, the last of a CPU's processes to arrive sees the completion
// at once, runs to its next arrival and only then yields to the next of them. About two
// switches: the time the other CPU takes to bring its last process in. Bounded, since the hint
// is one episode old (a late peer that moved to this CPU since waits that long behind the
// poll; a 50 us spin on the same hint put whole runs into a slow state: see asks_where_peers_are).
// BM_LockstepAdaptive/ranks:4 on 2 vCPUs, idle, ranks bound: 2.6 us -> 1.9 (the floor, one
// switch per CPU per episode, is 1.5); unbound 2.6-2.9 -> 2.2; ranks:8 bound 6.3 -> 5.7.
inline constexpr microseconds kPollBeforeYield{3};
// A gap this long between two clock reads of a spin loop means the waiter lost its CPU (a clock
// read plus 64 pauses take about 1-3 us); one this long across a sched_yield means the CPU went
// to a task for a good part of a scheduler slice (0.7-3 ms), longer than a peer of the job uses
// it to arrive (a context switch and a few microseconds). Either takes a load sample at once.
inline constexpr microseconds kDescheduledGap{50};
inline constexpr microseconds kYieldedAwayGap{500};
// Regular load samples are at most this frequent (one scheduler tick here): a pread of
// /proc/loadavg costs 1.5-5 us, and at one per millisecond per process the samples cost 8
// simulated nodes on 2 vCPUs about 10% per barrier (BM_LockstepCrossNode). A yield
// or spin that lost the CPU for long takes one at once, whatever the period. Until a process
// has kLoadWindow samples it takes them every kFirstSamplesPeriod, so that a job that starts on
// a loaded machine sees it within its first milliseconds (each slice a yield loses there costs
// ~3 ms: with the regular period, ten yields per process went to competitors first, ~10% of a
// 0.2 s benchmark run at H=2, N=4).
inline constexpr milliseconds kLoadSamplePeriod{4};
inline constexpr microseconds kFirstSamplesPeriod{250};
// While loaded, a sample serves only to see the load go, and each read still holds a CPU that a
// late peer may wait for: at one per 4 ms per node, the reads put `adaptive`'s p99 at 1.03-1.06x
// `block`'s beside 1+burst2@2 at N = 4 on 2 vCPUs, and without them at 0.94-1.00x (eight sets of
// six `sleep-ab 4 60 200` runs each). At one per 16 ms, idle again takes 256 ms.
inline constexpr milliseconds kLoadedSamplePeriod{16};
// Samples that must agree before the machine counts as loaded, and as idle again (see
// Waiter::sample_load). Idle takes more: a sample is taken as a wait begins, just after the
// barrier woke the peers, and a peer woken but not yet on a run queue (a wake-up sent to another
// vCPU waits for its interrupt) is neither asleep nor runnable, so a sample then can miss the
// competitor; beside one busy loop at N=4 on 2 vCPUs, 10-20% of samples read no foreign task,
// in runs of four often enough to turn the job idle a few times per second of barriers, each
// time for thousands of yields to the busy loop (bench/sleep-ab's waiter counts). A sample that
// only a peer's sleep may explain (Waiter::Sample::uncertain) counts toward neither idle window,
// and kLoadWindow of them turn the machine loaded only with kSureToLoad sure ones among them.
inline constexpr std::size_t kLoadWindow = 4;
inline constexpr std::size_t kSureToLoad = 2;
inline constexpr std::size_t kIdleWindow = 16;
static_assert(kIdleWindow >= kLoadWindow, "the samples kept serve both windows");
static_assert(kSureToLoad <= kLoadWindow, "sure samples are of the load window");
}  // namespace wait_tuning

// The options of one wait for `policy`, given whether the machine is `loaded` and the spin the
// waiter has learned (adaptive only):
//   spin:     spin for ever, never yield or sleep.
//   block:    sleep at once.
//   adaptive, one node, a CPU per process: spin `learned_spin` and yield kYieldIdle on an idle
//             machine, spin kSpinLoaded on a loaded one; then sleep. (Loaded, a wait polls once
//             before its first clock read, and one whose late peer may be on this CPU does not
//             spin at all: Waiter::wait.)
//   adaptive, one node, more processes than CPUs: yield kYieldIdle (idle machine only), then
//             sleep.
//   adaptive, across nodes: no spin (a message takes microseconds); yield as above on an idle
//             machine; then sleep.
// Never sched_yield on a loaded machine. Under the EEVDF scheduler a yield hands the CPU to a
// busy competitor for a whole slice (0.7-3 ms), and a waiter that spun or yielded has spent its
// lag, so it is not picked when its peer finally arrives; a sleeper keeps its lag and preempts
// the competitor when woken (the anchor measurements, docs/performance.md: spinning-and-yielding
// costs 400-2,600 us per episode there, sleeping 25-220 us).
WaitOptions plan_wait(WaitPolicy policy, const WaitShape& shape, bool loaded,
                      std::chrono::nanoseconds learned_spin) noexcept;

}  // namespace lockstep::detail
