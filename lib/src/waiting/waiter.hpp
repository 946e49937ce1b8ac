// Waiting: how every wait of a process spins, yields and sleeps (internal).
//
// One object, the Waiter, owns the decision for every wait a process makes: the node barrier's
// (lib/src/engine), and a node leader's waits for the other nodes (backends/). Each of those is a
// Site that knows how to poll what it waits for and how to block on it (a futex, an event fd);
// the Waiter decides, step by step, which of the three to do, and adapts to what it sees:
//
//   - the shape of the job (processes on this node against usable CPUs, one node or several);
//   - load that is not the job's: runnable tasks on the machine beyond the job's own, sampled
//     from /proc/loadavg at most once per kLoadSamplePeriod (kLoadedSamplePeriod while loaded),
//     and only when a wait already costs microseconds (never on the fast path);
//   - having been descheduled: a gap between two clock reads of its own polling loop;
//   - how long its recent waits lasted (the spin phase is sized from them).
//
// Everything it reads goes through WaitSignals, so tests drive it with a fake clock and fake load.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "lockstep/wait_policy.hpp"

namespace lockstep::detail {

using WaitClock = std::chrono::steady_clock;

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

// Interrupting waits (lockstep_set_interrupt_fd): while the descriptor set here (-1: none) is
// readable, every wait of the process gives up (a signal handler's self-pipe, such as Python's
// signal.set_wakeup_fd: a signal that arrives while a wait sleeps ends the sleep with EINTR,
// and one that arrives while it spins is seen at its next check). Returns the previous one.
int set_interrupt_fd(int fd) noexcept;
// Whether the interrupt descriptor is readable (one poll(2), only while one is set).
bool interrupt_pending() noexcept;
// Throws InterruptedError ("<what>: interrupted by a signal") if interrupt_pending().
void check_interrupt(const std::string& what);
// Whether an interrupt descriptor is set: then an interruptible wait never sleeps without a
// timeout (the signal may be handled on another thread, and not end its sleep).
bool interrupt_armed() noexcept;
// From now on the calling thread's waits are not interrupted (interrupt_pending and
// interrupt_armed say no there): for a thread of the library's own (the GPU relay across nodes)
// that waits for the other nodes while the user's threads take the signals.
void ignore_interrupts_on_this_thread() noexcept;

// A wait that lasts says so (LOCKSTEP_STALL_WARNING, set by the context when it joins): after
// `after` (zero: never), then again after twice as long each time, a wait calls its site's
// stalled(), which names what it waits for. Returns the previous setting.
std::chrono::nanoseconds set_stall_warning(std::chrono::nanoseconds after) noexcept;
[[nodiscard]] std::chrono::nanoseconds stall_warning() noexcept;
// The stall line every site says, one wording for the node barrier, the join and the backends:
// "<what> has waited <s> s for <whom>; still waiting (LOCKSTEP_STALL_WARNING ...)", on stderr
// with the process's rank (base/log.hpp). Never throws: a wait goes on without its diagnostic.
void say_stalled(int rank, const char* what, std::chrono::nanoseconds waited,
                 const std::string& whom) noexcept;

// The tuned numbers, each with where it came from.
namespace wait_tuning {
using std::chrono::microseconds;
using std::chrono::milliseconds;
// Spins before the first clock read, so that the common, immediate case reads no clock.
inline constexpr int kQuickSpins = 64;
// Spins between clock reads (a clock read costs ~25 ns here, a pause ~10-40 ns).
inline constexpr int kSpinsPerClockRead = 64;
// The spin phase of a process that has a CPU to itself on an idle machine, between these bounds,
// sized from the waits it has seen (see Waiter::learn). 20 us is where it starts: the anchor
// measurements (docs/performance.md; 2-core EPYC VM, 2026-11-29) found a centralized barrier that
// spins ~20 us before its futex at 0.26 us for N=2, while a ~2 us spin falls through to the 10-15
// us futex wake often enough to average ~1 us. Up to 200 us: a training-like loop (compute of 0-100
// us, then a barrier) has waits of that order, and a wake-up costs 10-15 us each time the spin
// falls short. On a loaded machine the spin is kSpinLoaded, sized to catch the peer that this
// process has just woken (a CPU each): a rank that completes an episode and wakes its peer comes
// back to the next one first, and the woken peer returns 5-6.5 us after it (bench/sleep-ab
// --wakes, N=2 beside one busy loop, 2 vCPUs, 2026-12-02). A spin that covers that catches the
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
// 50) did not move (2026-12-02). Longer costs more where it misses: in the training-like loop with
// two busy processes beside N=2, a 20 us spin cost 240 us of overhead per episode and the quick
// spins alone 48 (2026-11-30): a waiter that spins spends the lag that would let it preempt the
// competitor when woken.
inline constexpr microseconds kSpinStart{20};
inline constexpr microseconds kSpinMin{2};
inline constexpr microseconds kSpinMaxIdle{200};
inline constexpr microseconds kSpinLoaded{8};
// After the spin (or at once, with more processes than CPUs), on an idle machine only: poll with
// sched_yield this long before sleeping. On an idle machine nobody else wants the CPU, and a
// sleep is dear: waking a halted vCPU costs 10-15 us, and sometimes milliseconds when the host
// has given the core away (bench/barrier_bench's training loop, N=2, 2026-11-30: with 200 us of
// yielding, 1-2 sleeps per 1,400 episodes raised the overhead per episode from 0.6 to 3 us in
// one run in four). More processes than CPUs, 2026-11-29: a 1 us spin before yielding cost
// 5.3 us per episode at N=4 and 14.8 us at N=8, yielding at once 2.1 and 5.0 us. The 2 ms bound
// keeps a 1 s wait at 0.2% of a core (the node barrier then wakes once per check_interval, 100 ms).
inline constexpr milliseconds kYieldIdle{2};
// Across nodes with a CPU per process: yield this long, then sleep (see plan_wait).
inline constexpr microseconds kYieldAcrossNodes{220};
// An oversubscribed waiter spins instead of yielding, at most this long per wait, while no late
// peer was last seen on its CPU (the site's hint): bounds the cost of a stale hint.
inline constexpr microseconds kYieldlessSpin{50};
// A gap this long between two clock reads of a spin loop means the waiter lost its CPU (a clock
// read plus 64 pauses take about 1-3 us); one this long across a sched_yield means the CPU went
// to a task for a good part of a scheduler slice (0.7-3 ms), longer than a peer of the job uses
// it to arrive (a context switch and a few microseconds). Either takes a load sample at once.
inline constexpr microseconds kDescheduledGap{50};
inline constexpr microseconds kYieldedAwayGap{500};
// Regular load samples are at most this frequent (one scheduler tick here): a pread of
// /proc/loadavg costs 1.5-5 us, and at one per millisecond per process the samples cost 8
// simulated nodes on 2 vCPUs about 10% per barrier (BM_LockstepCrossNode, 2026-11-30). A yield
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
// six `sleep-ab 4 60 200` runs each, 2026-12-02). At one per 16 ms, idle again takes 256 ms.
inline constexpr milliseconds kLoadedSamplePeriod{16};
// Samples that must agree before the machine counts as loaded, and as idle again (see
// Waiter::sample_load). Idle takes more: a sample is taken as a wait begins, just after the
// barrier woke the peers, and a peer woken but not yet on a run queue (a wake-up sent to another
// vCPU waits for its interrupt) is neither asleep nor runnable, so a sample then can miss the
// competitor; beside one busy loop at N=4 on 2 vCPUs, 10-20% of samples read no foreign task,
// in runs of four often enough to turn the job idle a few times per second of barriers, each
// time for thousands of yields to the busy loop (bench/sleep-ab's waiter counts, 2026-12-02).
inline constexpr std::size_t kLoadWindow = 4;
inline constexpr std::size_t kIdleWindow = 16;
static_assert(kIdleWindow >= kLoadWindow, "the samples kept serve both windows");
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

// Base of the places that wait; a Site overrides what it has.
//   bool done()                 polls what is awaited (may make progress, may throw)
//   void block(nanoseconds)     sleeps until woken or the time passes (required); checks
//                               before it sleeps (what it waits for may come meanwhile)
//   bool check()                every check_interval and at the deadline: may throw (a lost
//                               peer); true if what is awaited is done after all
//   bool late_peer_here()       whether a peer this wait waits for may need this CPU
//   void stalled(nanoseconds)   the wait has lasted this long (see set_stall_warning): says
//                               what it still waits for (one line on stderr); must not throw
//   bool watched()              whether whatever would make check() throw also wakes a
//                               sleeper (engine/peer_watch.hpp): then a wait checks whenever a
//                               block ends without it being done, and one without a deadline
//                               blocks with nanoseconds::max() (no timeout), asking first to be
//                               woken when its stall line is due: wake_me_at(time_point)
//   bool alarmed()              whether something that check() looks for has happened since the
//                               job began (a peer exited, a loss recorded): a wait that sees it
//                               checks at once, once, rather than at its next check_interval
//                               (a spinning or yielding wait is not woken by the watch)
struct WaitSite {
  static bool check() { return false; }
  static bool alarmed() noexcept { return false; }
  static bool late_peer_here() noexcept { return true; }
  static void stalled(std::chrono::nanoseconds /*waited*/) noexcept {}
  static bool watched() noexcept { return false; }
  static void wake_me_at(WaitClock::time_point /*when*/) noexcept {}
};

// One process's waiting. Not thread-safe: a process waits in one place at a time (Context
// refuses a second thread).
class Waiter {
 public:
  enum class End { done, timed_out, interrupted };

  Waiter(WaitPolicy policy, WaitShape shape, WaitSignals& signals = system_signals()) noexcept;

  // `peers_asleep` (must not throw): how many of the node's other processes of the job sleep in
  // a wait now; the others are counted as runnable in a load sample. Unset: all are.
  void watch_peers(std::function<int()> peers_asleep) { peers_asleep_ = std::move(peers_asleep); }
  // `word` (a hint in memory the node's processes share; null: none): the node's latest load
  // sample. A regular sample that another process took less than a sample period ago, and that
  // this one has not counted yet, is counted instead of reading /proc/loadavg again; a sample
  // this one reads is written there. So a node reads about one sample per period, not one per
  // process: each read costs 1.5-5 us of a CPU that a late peer may be waiting for, and at N=4
  // and 8 beside a busy loop on 2 vCPUs the samples cost the episodes' p99 2-6%
  // (docs/performance-history.md, "Sharing the load samples"). A sample taken at once (a lost CPU)
  // is always read.
  void share_samples(std::atomic<std::uint64_t>* word) noexcept { shared_ = word; }

  // Waits until `site.done()`, or until `deadline` passes (then End::timed_out, after a last
  // site.check()), or until interrupt_pending() (End::interrupted: asked around each sleep and
  // at each check). Calls site.check() every `check_interval`; whatever a site call throws
  // propagates. Spins, yields and blocks per this waiter's options, which it adapts as it goes.
  // A wait that must not end early (`interruptible` false) ignores the interrupt descriptor.
  template <class Site>
  [[gnu::flatten]] End wait(Site& site, std::optional<WaitClock::time_point> deadline,
                            std::chrono::nanoseconds check_interval, bool interruptible = true);

  [[nodiscard]] WaitPolicy policy() const noexcept { return policy_; }
  [[nodiscard]] const WaitShape& shape() const noexcept { return shape_; }
  // The options the next wait starts with.
  [[nodiscard]] const WaitOptions& options() const noexcept { return options_; }
  // Whether the machine was last seen loaded with work that is not the job's.
  [[nodiscard]] bool loaded() const noexcept { return loaded_; }
  // The mean count of runnable tasks that are not the job's in the last samples.
  [[nodiscard]] double foreign_load() const noexcept;
  // Whether the next wait asks the site whether a late peer may need this CPU (then the site's
  // hint, each process's CPU, is worth keeping): to yield to it when the job has more processes
  // than CPUs, and, on a loaded machine, to sleep at once rather than spin in its way.
  [[nodiscard]] bool asks_where_peers_are() const noexcept {
    return adaptive_ && !shape_.across_nodes && (shape_.processes > shape_.cpus || loaded_);
  }

  // Adaptive only: takes a load sample unless one was taken less than a period ago
  // (kLoadSamplePeriod, kLoadedSamplePeriod while loaded; any time when `now_or_never`); returns
  // loaded().
  bool sample_load(WaitClock::time_point now, bool now_or_never = false) noexcept;
  // Feeds back one finished wait of `waited`.
  void learn(std::chrono::nanoseconds waited) noexcept;
  // Whether learn() uses what it is fed: adaptive, one node, a CPU per process, idle.
  [[nodiscard]] bool learns() const noexcept {
    return adaptive_ && !loaded_ && !shape_.across_nodes && shape_.processes <= shape_.cpus;
  }

  // What this waiter did, counted on its slow paths only (for tests and diagnostics).
  struct Stats {
    std::uint64_t timed_waits = 0;   // waits that outlasted the quick spins
    std::uint64_t loaded_waits = 0;  // of those, waits begun with the machine seen loaded
    std::uint64_t yields = 0;
    std::uint64_t blocks = 0;
    std::uint64_t untimed_blocks = 0;  // of those, blocks without a timeout (a watched site)
    std::uint64_t samples = 0;
    std::uint64_t shared_samples = 0;  // of those, samples another process of the node read
    std::uint64_t loaded_spins = 0;    // waits that spun kSpinLoaded
    std::uint64_t loaded_catches = 0;  // of those, waits the spin ended
    std::uint64_t became_loaded = 0;
    std::uint64_t became_idle = 0;
  };
  [[nodiscard]] const Stats& stats() const noexcept { return stats_; }

 private:
  // The rest of wait(): every wait that does not sleep at once untimed, and one whose sleep at
  // once ended not done (`woken`: the time it began). Out of line, so that wait()'s path after
  // its sleep stays short (see wait).
  template <class Site>
  [[gnu::noinline]] End wait_long(Site& site, std::optional<WaitClock::time_point> deadline,
                                  std::chrono::nanoseconds check_interval, bool interruptible,
                                  WaitOptions options, std::optional<WaitClock::time_point> woken);

  static void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }

  WaitPolicy policy_;
  WaitShape shape_;
  WaitSignals& signals_;
  std::function<int()> peers_asleep_;
  bool adaptive_;
  std::chrono::nanoseconds spin_ = wait_tuning::kSpinStart;
  bool loaded_ = false;
  std::array<int, wait_tuning::kIdleWindow> recent_{};  // the last samples' foreign tasks
  std::size_t next_ = 0;                                // samples taken
  WaitClock::time_point last_sample_{};
  std::atomic<std::uint64_t>* shared_ = nullptr;  // see share_samples
  std::uint64_t last_stamp_ = 0;                  // the stamp of the last sample counted
  WaitOptions options_;  // plan_wait() of the above, kept current by sample_load and learn
  Stats stats_;
};

template <class Site>
Waiter::End Waiter::wait(Site& site, std::optional<WaitClock::time_point> deadline,
                         std::chrono::nanoseconds check_interval, bool interruptible) {
  using namespace wait_tuning;
  WaitOptions options = options_;
  // Poll before anything else: what a yield or a sleep would wait for may be there already. A
  // loaded waiter polls once: its late peer may be runnable on this CPU, and then any spin holds
  // the CPU that it needs (the 64 quick polls, 1-2 us, were what adaptive did beyond block at
  // N=2 beside a busy loop, where every loaded wait found its peer on its CPU: 1.09x pthread's
  // episode against block's 1.03x, 1.04x without them; bench/sleep-ab 2 60 200, 2 vCPUs,
  // 2026-12-02). Whether to spin is decided below, asking the site only when loaded. (Asking it
  // here, before the polls, cost the idle fast path 5-10% at N=2: barrier_bench.)
  const int quick_spins = options.spin.count() > 0 && !loaded_ ? kQuickSpins : 1;
  for (int i = 0; i < quick_spins; ++i) {
    if (site.done()) {
      return End::done;  // immediate: nothing to learn, no clock read
    }
    cpu_relax();
  }
  // Loaded, a wait whose late peer may be on this CPU does not spin: a spin would hold the CPU
  // that the peer waits for. It sleeps at once, so it takes the short path below as block's
  // waits do, not wait_long's loop around the same sleep (adaptive / pthread_barrier_t at N = 2
  // beside one busy loop on 2 vCPUs, where almost every loaded wait finds its peer on its CPU:
  // 1.04-1.05x -> 1.02-1.03x, bench/sleep-ab, 2026-12-03, docs/performance.md). This is the
  // one place that decides it (wait_long is reached only from here). Asked only when loaded
  // (only adaptive's waiter is ever loaded, and its spin is never unbounded): the idle path is
  // unchanged.
  if (loaded_ && options.spin.count() != 0 && !shape_.across_nodes && site.late_peer_here()) {
    options.spin = std::chrono::nanoseconds{0};
  }
  if (options.spin.count() != 0 || options.yield.count() != 0 || !options.sleep || deadline ||
      !site.watched() || (interruptible && interrupt_armed())) {
    return wait_long(site, deadline, check_interval, interruptible, options, std::nullopt);
  }
  // A wait that sleeps at once, untimed (block; adaptive, loaded, with more processes than
  // CPUs or its late peer on this CPU): one sleep, and almost always done when it ends. This path
  // is all a loaded machine's episode runs after its wake-up, and each sleep is a context switch
  // after which the caches and branch predictors hold another process's code: so it is kept short
  // and straight, and the rest of the wait (a wake that finds the wait not done) is out of line in
  // wait_long (block / pthread_barrier_t beside 1+burst2@2 at N = 4 on 2 vCPUs: 1.08-1.09x,
  // against 1.10x with this path inside the general loop; bench/sleep-ab, 2026-12-03,
  // docs/performance.md). wait() is flattened (the site's sleep and the futex call inlined): each
  // return after the sleep's context switch is mispredicted here (the kernel refills the return
  // stack), and two fewer frames took block from 1.08x to 1.07x there, and from 1.06x to 1.04x
  // beside burst4@2 at N = 8. The node barrier's caller, Context::wait, is flattened too, with this
  // inlined in it, and the futex call is made in line (waiting/futex.cpp): 1.02x there, 2026-12-03.
  // The coarse clock: such a wait keeps times of 100 ms and more only (the periodic check, the
  // stall line), and a precise read costs ~30 ns warm, and after a sleep, on a loaded machine,
  // enough to be 2-3% of a barrier episode (bench/sleep-ab's "clock" steps, docs/performance.md).
  const auto start = signals_.coarse_now();
  ++stats_.timed_waits;
  stats_.loaded_waits += loaded_ ? 1 : 0;
  if (adaptive_) {
    (void)sample_load(start);  // for the next waits: this one sleeps at once either way
  }
  const auto stall = stall_warning();
  site.wake_me_at(stall.count() > 0 ? start + stall : WaitClock::time_point::max());
  site.block(std::chrono::nanoseconds::max());
  ++stats_.blocks;
  ++stats_.untimed_blocks;
  // The time after the sleep would serve only a wait that goes on (nothing here learns: see
  // learns()); a read here, on a loaded machine, cost 1-2% of block's episode.
  if (site.done()) [[likely]] {
    return End::done;
  }
  return wait_long(site, deadline, check_interval, interruptible, options, start);
}

template <class Site>
Waiter::End Waiter::wait_long(Site& site, std::optional<WaitClock::time_point> deadline,
                              std::chrono::nanoseconds check_interval, bool interruptible,
                              WaitOptions options, std::optional<WaitClock::time_point> woken) {
  using namespace wait_tuning;
  const auto forever = WaitClock::time_point::max();
  // A wait that sleeps at once and has no deadline: the coarse clock (see wait).
  const bool coarse =
      options.spin.count() == 0 && options.yield.count() == 0 && options.sleep && !deadline;
  auto clock = [&] { return coarse ? signals_.coarse_now() : signals_.now(); };
  // `woken`: the wait began at that time, slept at once and was woken, not done (see wait).
  const auto start = woken ? *woken : clock();
  if (!woken) {
    ++stats_.timed_waits;
    stats_.loaded_waits += loaded_ ? 1 : 0;
  }
  auto now = woken ? clock() : start;
  auto spin_end = options.spin == std::chrono::nanoseconds::max() ? forever : start + options.spin;
  auto yield_end = spin_end == forever ? forever : spin_end + options.yield;
  // Woken, not done: a peer may be lost, or the stall line due (the site is watched).
  auto next_check = woken ? now : start + check_interval;
  // The stall warning, read once per wait that reaches a clock read (never by an immediate one).
  auto stall_interval = stall_warning();
  auto next_stall = stall_interval.count() > 0 ? start + stall_interval : forever;
  const bool loaded_spin = loaded_ && spin_end > start && spin_end != forever;
  stats_.loaded_spins += loaded_spin ? 1 : 0;
  bool sampled = woken.has_value();  // this wait's one regular load sample, after the spin
  auto finish = [&] {
    stats_.loaded_catches += loaded_spin && now < spin_end ? 1 : 0;
    learn(now - start);
    return End::done;
  };
  auto interrupted = [&] { return interruptible && interrupt_pending(); };
  bool alarm_heard = false;  // site.alarmed() seen, and checked for at once
  for (;;) {
    if (!alarm_heard && site.alarmed()) [[unlikely]] {
      // A peer may be lost: look now. A spinning or yielding wait is not woken by the watch, and
      // one that began after the alarm would otherwise look only check_interval later (0.1 s,
      // seen from Python: issue 45).
      alarm_heard = true;
      next_check = now;
    }
    if (now >= next_check || (deadline && now >= *deadline)) {
      if (site.check()) {
        return finish();
      }
      if (interrupted()) {
        return End::interrupted;
      }
      next_check = now + check_interval;
      if (deadline && now >= *deadline) {
        return End::timed_out;
      }
      if (now >= next_stall) {
        site.stalled(now - start);
        stall_interval *= 2;
        next_stall = now + stall_interval;
      }
    }
    if (adaptive_ && !sampled && now >= spin_end) {
      sampled = true;
      if (sample_load(now)) {
        yield_end = std::min(yield_end, now);  // loaded: no yield, sleep
      }
    }
    if (now < spin_end) {
      for (int i = 0; i < kSpinsPerClockRead; ++i) {
        if (site.done()) {
          return finish();
        }
        cpu_relax();
      }
      const auto before = now;
      now = signals_.now();
      if (adaptive_ && now - before > kDescheduledGap && sample_load(now, true)) {
        spin_end = yield_end = now;  // lost the CPU to work that is not the job's: sleep
      }
    } else if (now < yield_end || !options.sleep) {
      // Yield only to a late peer that may need this CPU; while every late peer runs elsewhere,
      // a short spin steals nothing from them. A hint can be stale (the peer moved here since),
      // so spinning instead of yielding is bounded per wait.
      if (!shape_.across_nodes && now - spin_end < kYieldlessSpin && !site.late_peer_here()) {
        for (int i = 0; i < kSpinsPerClockRead; ++i) {
          if (site.done()) {
            return finish();
          }
          cpu_relax();
        }
        now = signals_.now();
        continue;
      }
      signals_.yield();
      ++stats_.yields;
      if (site.done()) {
        now = signals_.now();
        return finish();
      }
      const auto before = now;
      now = signals_.now();
      if (adaptive_ && now - before > kYieldedAwayGap && sample_load(now, true)) {
        yield_end = now;  // the yield went to work that is not the job's: sleep instead
      }
    } else {
      // A watched site is woken by whatever check() would find: it sleeps without a timeout,
      // which a loaded machine's sleeps pay for (see engine/peer_watch.hpp), unless a deadline
      // or an interrupt descriptor wants it back.
      const bool watched = site.watched();
      const bool untimed = !deadline && watched && !(interruptible && interrupt_armed());
      auto limit = untimed ? std::chrono::nanoseconds::max() : next_check - now;
      if (deadline) {
        limit = std::min(limit, *deadline - now);
      }
      if (interrupted()) {
        return End::interrupted;
      }
      if (untimed) {
        site.wake_me_at(next_stall);
      }
      site.block(limit);
      ++stats_.blocks;
      stats_.untimed_blocks += untimed ? 1 : 0;
      // The time after a sleep serves only learning and a wait that goes on: a read here, on a
      // loaded machine, cost 1-2% of block's episode (see `coarse` above), so a wait that ends
      // finishes with the time before the sleep (finish() uses it only to learn).
      if (!learns() && site.done()) {
        return finish();
      }
      now = clock();
      if (site.done()) {
        return finish();
      }
      if (interrupted()) {
        return End::interrupted;
      }
      if (watched) {
        next_check = now;  // woken, not done: a peer may be lost, or the stall line due
      }
    }
  }
}

}  // namespace lockstep::detail
