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

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

#include "lockstep/wait_policy.hpp"
#include "waiting/wait_controls.hpp"
#include "waiting/wait_plan.hpp"
#include "waiting/wait_signals.hpp"

namespace lockstep::detail {

// Base of the places that wait; a Site overrides what it has.
//   bool done()                 polls what is awaited (may make progress, may throw)
//   void block(nanoseconds)     sleeps until woken or the time passes (required); checks
//                               before it sleeps (what it waits for may come meanwhile)
//   bool check()                every check_interval and at the deadline: may throw (a lost
//                               peer); true if what is awaited is done after all
//   bool late_peer_here()       whether a peer this wait waits for may need this CPU
//   void staying()              the wait's first polls (kPollsBeforeStaying) found it not done:
//                               the site does what it put off for a wait that ends at once
//                               (the node barrier's entry in its call log); called once,
//                               before any further poll, clock read, yield or sleep
//   void spread()               a load sample found the machine idle while the job's processes
//                               here outnumber the CPUs: the site may move this process to a
//                               CPU where fewer of them run (once per sample period at most)
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
// Waiter::wait is flattened: every call in it, a site's included, is inlined as deep as it goes,
// so that the node barrier's poll is a few loads. A site whose calls are heavy (a backend's,
// which progresses UCX and builds messages) marks them [[gnu::noinline]]: flattened under the
// link-time optimization, each backend's wait was 0.4-0.8 MB of machine code, and linking the
// library took 400 CPU-seconds (docs/performance-history.md, "A backend's wait, flattened").
struct WaitSite {
  static bool check() { return false; }
  static bool alarmed() noexcept { return false; }
  static bool late_peer_here() noexcept { return true; }
  static void staying() noexcept {}
  static void spread() noexcept {}
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
  // Whether the last `count` samples (at most kIdleWindow) all saw a task that is not the job's
  // compete with it (`load`), or all saw none; false before `count` samples.
  [[nodiscard]] bool all_saw(std::size_t count, bool load) const noexcept;
  // Whether kSureToLoad of the last kLoadWindow samples surely saw a competitor (Sample).
  [[nodiscard]] bool sure_in_window() const noexcept;
  // How many of the last `count` samples (at most kIdleWindow, and taken) `pred` holds for.
  template <class Pred>
  [[nodiscard]] std::size_t count_last(std::size_t count, Pred pred) const noexcept;
  // Whether the next wait asks the site whether a late peer may need this CPU (then the site's
  // hint, each process's CPU, is worth keeping): on a loaded machine, to sleep at once rather
  // than spin in its way; with more processes than CPUs on an idle one, to poll a moment before
  // each yield (kPollBeforeYield) where no late peer was last seen on this CPU. (That poll is
  // bounded: a spin in place of the yield, 50 us at most, put whole runs into a slow state when
  // the hint was stale, the late peer queued behind the spinner: at N = 4 on 2 vCPUs 8 runs in
  // 20 at 7.9-10.6 us, the others at 1.9-3.5; yielding, 20 of 20 at 1.8-2.7 us.
  // docs/performance-history.md, "The barrier's speed, third pass".)
  [[nodiscard]] bool asks_where_peers_are() const noexcept {
    return adaptive_ && !shape_.across_nodes && (loaded_ || shape_.processes > shape_.cpus);
  }

  // Whether a yield waits for a moment first where no late peer was last seen on this CPU
  // (kPollBeforeYield): adaptive, one node, more processes than CPUs, idle.
  [[nodiscard]] bool polls_before_yield() const noexcept {
    return adaptive_ && !shape_.across_nodes && !loaded_ && shape_.processes > shape_.cpus;
  }

  // Adaptive only: takes a load sample unless one was taken less than a period ago
  // (kLoadSamplePeriod, kLoadedSamplePeriod while loaded; any time when `now_or_never`); returns
  // loaded().
  bool sample_load(WaitClock::time_point now, bool now_or_never = false) noexcept;
  // One load sample: the foreign tasks that compete with the job (at most: a peer asleep taken
  // as off the run queue), and whether there may be none after all (the kernel may still count
  // a peer that just went to sleep: see own_sample). An uncertain sample counts toward turning
  // loaded (as a competitor beside a sleeping peer does) where sure ones are among them, and
  // neither for nor against idle again.
  struct Sample {
    int competing = 0;
    bool uncertain = false;
    [[nodiscard]] bool sure() const noexcept { return competing > 0 && !uncertain; }
  };
  // A peer's sample (share_samples) taken less than `period` before `stamp` and not yet
  // counted; none if there is none.
  std::optional<Sample> peers_sample(std::uint64_t stamp, std::chrono::nanoseconds period) noexcept;
  // This process's own sample at `stamp`, shared with the peers; none without /proc.
  std::optional<Sample> own_sample(std::uint64_t stamp) noexcept;
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
  // its sleep stays short (see wait). A loop of steps, each inlined in it.
  template <class Site>
  [[gnu::noinline]] End wait_long(Site& site, std::optional<WaitClock::time_point> deadline,
                                  std::chrono::nanoseconds check_interval, bool interruptible,
                                  WaitOptions options, std::optional<WaitClock::time_point> woken);

  // One wait in wait_long: what it was asked, its times, and what it has done so far.
  struct Course {
    std::optional<WaitClock::time_point> deadline;
    std::chrono::nanoseconds check_interval;
    bool interruptible;
    bool sleep;   // the options' sleep: whether it ever blocks
    bool coarse;  // it sleeps at once and has no deadline: the coarse clock serves (see wait)
    WaitClock::time_point start;  // when the wait began
    WaitClock::time_point now;    // the last clock read
    WaitClock::time_point spin_end;
    WaitClock::time_point yield_end;
    WaitClock::time_point next_check;
    WaitClock::time_point next_stall;
    std::chrono::nanoseconds stall_interval;
    bool loaded_spin;  // it spins kSpinLoaded (Stats::loaded_spins)
    bool sampled;      // its one regular load sample is taken (after the spin)
    bool alarm_heard;  // site.alarmed() seen, and checked for at once
  };
  Course begin_course(std::optional<WaitClock::time_point> deadline,
                      std::chrono::nanoseconds check_interval, bool interruptible,
                      const WaitOptions& options,
                      std::optional<WaitClock::time_point> woken) noexcept;
  [[nodiscard]] WaitClock::time_point read_clock(const Course& course) noexcept {
    return course.coarse ? signals_.coarse_now() : signals_.now();
  }
  // The wait is done: learns from it.
  End finish(const Course& course) noexcept {
    stats_.loaded_catches += course.loaded_spin && course.now < course.spin_end ? 1 : 0;
    learn(course.now - course.start);
    return End::done;
  }
  [[nodiscard]] static bool interrupted(const Course& course) noexcept {
    return course.interruptible && interrupt_pending();
  }
  // wait_long's steps: each returns how the wait ended, or nothing if it goes on.
  template <class Site>
  std::optional<End> check_when_due(Site& site, Course& course);
  template <class Site>
  void sample_after_spin(Site& site, Course& course) noexcept;
  template <class Site>
  std::optional<End> spin_step(Site& site, Course& course);
  template <class Site>
  std::optional<End> yield_step(Site& site, Course& course);
  template <class Site>
  std::optional<End> sleep_step(Site& site, Course& course);
  // kSpinsPerClockRead polls: whether the site was done.
  template <class Site>
  static bool poll_some(Site& site) {
    for (int i = 0; i < wait_tuning::kSpinsPerClockRead; ++i) {
      if (site.done()) {
        return true;
      }
      cpu_relax();
    }
    return false;
  }

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
  std::array<Sample, wait_tuning::kIdleWindow> recent_{};  // the last samples
  std::size_t next_ = 0;                                   // samples taken
  // Samples that saw no competitor since the last that surely saw one (uncertain ones skipped):
  // a loaded waiter turns idle again at kIdleWindow.
  std::size_t quiet_ = 0;
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
  // the CPU that it needs. Where the late peer is is asked below, and only when loaded: asked
  // here, before the polls, it cost the idle fast path 5-10% at N=2.
  const int quick_spins = options.spin.count() > 0 && !loaded_ ? kQuickSpins : 1;
  const int first_polls = std::min(quick_spins, kPollsBeforeStaying);
  for (int i = 0; i < first_polls; ++i) {
    if (site.done()) {
      return End::done;  // immediate: nothing to learn, no clock read
    }
    cpu_relax();
  }
  site.staying();
  for (int i = first_polls; i < quick_spins; ++i) {
    if (site.done()) {
      return End::done;
    }
    cpu_relax();
  }
  // Loaded, a wait whose late peer may be on this CPU does not spin: a spin would hold the CPU
  // that the peer waits for. It sleeps at once, so it takes the short path below as block's
  // waits do, not wait_long's loop around the same sleep. This is the one place that decides
  // it (wait_long is reached only from here).
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
  // and straight, the rest of the wait out of line in wait_long, and the frames few (wait() and
  // its caller Context::wait are flattened, the futex call made in line: each return after the
  // switch is mispredicted). The coarse clock: such a wait keeps times of 100 ms and more only
  // (the periodic check, the stall line), and a precise read after a sleep on a loaded machine
  // costs 2-3% of an episode. (The measurements: docs/performance-history.md.)
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
  Course course = begin_course(deadline, check_interval, interruptible, options, woken);
  for (;;) {
    if (auto end = check_when_due(site, course)) {
      return *end;
    }
    sample_after_spin(site, course);
    std::optional<End> end;
    if (course.now < course.spin_end) {
      end = spin_step(site, course);
    } else if (course.now < course.yield_end || !course.sleep) {
      end = yield_step(site, course);
    } else {
      end = sleep_step(site, course);
    }
    if (end) {
      return *end;
    }
  }
}

[[gnu::always_inline]] inline Waiter::Course Waiter::begin_course(
    std::optional<WaitClock::time_point> deadline, std::chrono::nanoseconds check_interval,
    bool interruptible, const WaitOptions& options,
    std::optional<WaitClock::time_point> woken) noexcept {
  const auto forever = WaitClock::time_point::max();
  Course course{};
  course.deadline = deadline;
  course.check_interval = check_interval;
  course.interruptible = interruptible;
  course.sleep = options.sleep;
  course.coarse =
      options.spin.count() == 0 && options.yield.count() == 0 && options.sleep && !deadline;
  // `woken`: the wait began at that time, slept at once and was woken, not done (see wait).
  course.start = woken ? *woken : read_clock(course);
  if (!woken) {
    ++stats_.timed_waits;
    stats_.loaded_waits += loaded_ ? 1 : 0;
  }
  course.now = woken ? read_clock(course) : course.start;
  course.spin_end =
      options.spin == std::chrono::nanoseconds::max() ? forever : course.start + options.spin;
  course.yield_end = course.spin_end == forever ? forever : course.spin_end + options.yield;
  // Woken, not done: a peer may be lost, or the stall line due (the site is watched).
  course.next_check = woken ? course.now : course.start + check_interval;
  // The stall warning, read once per wait that reaches a clock read (never by an immediate one).
  course.stall_interval = stall_warning();
  course.next_stall =
      course.stall_interval.count() > 0 ? course.start + course.stall_interval : forever;
  course.loaded_spin = loaded_ && course.spin_end > course.start && course.spin_end != forever;
  stats_.loaded_spins += course.loaded_spin ? 1 : 0;
  course.sampled = woken.has_value();
  course.alarm_heard = false;
  return course;
}

// Every check_interval, at the deadline, and at once when the site's alarm is first seen: asks
// the site (a lost peer throws), the interrupt descriptor, the deadline, and says the stall line
// when it is due.
template <class Site>
[[gnu::always_inline]] inline std::optional<Waiter::End> Waiter::check_when_due(Site& site,
                                                                                Course& course) {
  if (!course.alarm_heard && site.alarmed()) [[unlikely]] {
    // A peer may be lost: look now. A spinning or yielding wait is not woken by the watch, and
    // one that began after the alarm would otherwise look only check_interval later (0.1 s,
    // as seen from Python).
    course.alarm_heard = true;
    course.next_check = course.now;
  }
  const bool past_deadline = course.deadline && course.now >= *course.deadline;
  if (course.now < course.next_check && !past_deadline) {
    return std::nullopt;
  }
  if (site.check()) {
    return finish(course);
  }
  if (interrupted(course)) {
    return End::interrupted;
  }
  course.next_check = course.now + course.check_interval;
  if (past_deadline) {
    return End::timed_out;
  }
  if (course.now >= course.next_stall) {
    site.stalled(course.now - course.start);
    course.stall_interval *= 2;
    course.next_stall = course.now + course.stall_interval;
  }
  return std::nullopt;
}

// Adaptive: the wait's one regular load sample, once its spin is over; loaded, it does not yield
// but sleeps. With more processes than CPUs, a sample that finds the machine quiet (its last
// kLoadWindow samples saw no task that is not the job's) lets the site even out where they run
// (WaitSite::spread).
template <class Site>
[[gnu::always_inline]] inline void Waiter::sample_after_spin(Site& site, Course& course) noexcept {
  if (adaptive_ && !course.sampled && course.now >= course.spin_end) {
    course.sampled = true;
    const std::uint64_t samples = stats_.samples;
    if (sample_load(course.now)) {
      course.yield_end = std::min(course.yield_end, course.now);
    } else if (stats_.samples != samples && polls_before_yield() &&
               all_saw(wait_tuning::kLoadWindow, false)) {
      site.spread();  // not while load comes and goes (beside a busy loop, moves gained nothing)
    }
  }
}

// Polls, then reads the clock; a gap between two reads means the CPU went to another task.
template <class Site>
[[gnu::always_inline]] inline std::optional<Waiter::End> Waiter::spin_step(Site& site,
                                                                           Course& course) {
  if (poll_some(site)) {
    return finish(course);
  }
  const auto before = course.now;
  course.now = signals_.now();
  if (adaptive_ && course.now - before > wait_tuning::kDescheduledGap &&
      sample_load(course.now, true)) {
    course.spin_end = course.yield_end = course.now;  // lost the CPU to work not the job's: sleep
  }
  return std::nullopt;
}

// Yields the CPU to whoever may need it (a late peer queued behind this waiter), then polls.
// With more processes than CPUs, one node, and no late peer last seen on this CPU, it polls
// kPollBeforeYield first: the yield would go to a peer that waits too (see kPollBeforeYield).
template <class Site>
[[gnu::always_inline]] inline std::optional<Waiter::End> Waiter::yield_step(Site& site,
                                                                            Course& course) {
  if (polls_before_yield() && !site.late_peer_here()) {
    const auto until = course.now + wait_tuning::kPollBeforeYield;
    do {
      if (poll_some(site)) {
        return finish(course);
      }
      course.now = signals_.now();
    } while (course.now < until);
  }
  signals_.yield();
  ++stats_.yields;
  if (site.done()) {
    course.now = signals_.now();
    return finish(course);
  }
  const auto before = course.now;
  course.now = signals_.now();
  if (adaptive_ && course.now - before > wait_tuning::kYieldedAwayGap &&
      sample_load(course.now, true)) {
    course.yield_end = course.now;  // the yield went to work that is not the job's: sleep instead
  }
  return std::nullopt;
}

// A watched site is woken by whatever check() would find: it sleeps without a timeout, which a
// loaded machine's sleeps pay for (see engine/peer_watch.hpp), unless a deadline or an interrupt
// descriptor wants it back.
template <class Site>
[[gnu::always_inline]] inline std::optional<Waiter::End> Waiter::sleep_step(Site& site,
                                                                            Course& course) {
  const bool watched = site.watched();
  const bool untimed = !course.deadline && watched && !(course.interruptible && interrupt_armed());
  auto limit = untimed ? std::chrono::nanoseconds::max() : course.next_check - course.now;
  if (course.deadline) {
    limit = std::min(limit, *course.deadline - course.now);
  }
  if (interrupted(course)) {
    return End::interrupted;
  }
  if (untimed) {
    site.wake_me_at(course.next_stall);
  }
  site.block(limit);
  ++stats_.blocks;
  stats_.untimed_blocks += untimed ? 1 : 0;
  // The time after a sleep serves only learning and a wait that goes on: a read here, on a
  // loaded machine, cost 1-2% of block's episode (see `coarse` in begin_course), so a wait that
  // ends finishes with the time before the sleep (finish() uses it only to learn).
  if (!learns() && site.done()) {
    return finish(course);
  }
  course.now = read_clock(course);
  if (site.done()) {
    return finish(course);
  }
  if (interrupted(course)) {
    return End::interrupted;
  }
  if (watched) {
    course.next_check = course.now;  // woken, not done: a peer may be lost, or the stall line due
  }
  return std::nullopt;
}

}  // namespace lockstep::detail
