// The wait module alone: the policy (plan_wait) and the Waiter's loop, driven by a fake clock and
// fake load, with a fake site that counts what the Waiter did.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <optional>
#include <stdexcept>

#include "ranks.hpp"
#include "waiting/futex.hpp"
#include "waiting/line_claim.hpp"
#include "waiting/waiter.hpp"

namespace {

using lockstep::WaitPolicy;
using lockstep::detail::plan_wait;
using lockstep::detail::Waiter;
using lockstep::detail::WaitOptions;
using lockstep::detail::WaitShape;
using lockstep::detail::WaitSignals;
using lockstep::detail::WaitSite;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using Time = lockstep::detail::WaitClock::time_point;
namespace tuning = lockstep::detail::wait_tuning;

// A machine in a test: time moves only when the Waiter reads the clock (`read_cost` per read),
// yields (`yield_cost`: about nothing on an idle CPU, a whole slice when a competitor is queued)
// or blocks.
class FakeMachine : public WaitSignals {
 public:
  Time now() noexcept override {
    ++precise_reads;
    clock += read_cost;
    return clock;
  }
  Time coarse_now() noexcept override {
    ++coarse_reads;
    return clock;
  }
  int runnable_tasks() noexcept override {
    ++samples;
    return noise_every > 0 && samples % noise_every == 0 ? runnable + noise_tasks : runnable;
  }
  int online_cpus() noexcept override { return cpus; }
  void yield() noexcept override {
    ++yields;
    clock += yield_cost;
  }

  Time clock{std::chrono::seconds(1000)};
  nanoseconds read_cost{microseconds(1)};
  nanoseconds yield_cost{microseconds(1)};
  int runnable = 1;
  int cpus = 2;
  int noise_every = 0;  // every n-th sample sees more tasks (kernel threads' moment)
  int noise_tasks = 1;
  int samples = 0;
  int yields = 0;
  int precise_reads = 0;
  int coarse_reads = 0;
};

// What is awaited becomes true at `ready_at`; blocking sleeps until then or the limit.
class FakeSite : public WaitSite {
 public:
  explicit FakeSite(FakeMachine& machine) : machine_(machine) {}
  bool done() {
    ++polls;
    return machine_.clock >= ready_at;
  }
  void block(nanoseconds limit) {
    ++blocks;
    machine_.clock = std::min(machine_.clock + std::max(limit, nanoseconds(0)), ready_at);
  }
  bool check() {
    ++checks;
    if (lost) {
      throw std::runtime_error("peer lost");
    }
    return false;
  }
  [[nodiscard]] bool late_peer_here() const noexcept { return peer_here; }
  void spread() noexcept { ++spreads; }

  Time ready_at;
  int polls = 0;
  int spreads = 0;
  int blocks = 0;
  int checks = 0;
  bool lost = false;
  bool peer_here = true;

 private:
  FakeMachine& machine_;
};

// Takes `samples` load samples on each waiter, `step` apart.
void sample_all(FakeMachine& machine, std::initializer_list<Waiter*> waiters, int samples,
                nanoseconds step) {
  for (int i = 0; i < samples; ++i) {
    machine.clock += step;
    for (Waiter* waiter : waiters) {
      (void)waiter->sample_load(machine.clock);
    }
  }
}

// Runs one wait that completes `after` from now; returns the site to inspect.
FakeSite wait_once(Waiter& waiter, FakeMachine& machine, nanoseconds after,
                   std::optional<Time> deadline = std::nullopt) {
  FakeSite site(machine);
  site.ready_at = machine.clock + after;
  EXPECT_EQ(waiter.wait(site, deadline, milliseconds(100)), Waiter::End::done);
  return site;
}

TEST(WaitPlan, SpinAndBlockKeepTheirMeaning) {
  for (bool loaded : {false, true}) {
    for (WaitShape shape :
         {WaitShape{2, 2, false}, WaitShape{8, 2, false}, WaitShape{2, 2, true}}) {
      EXPECT_EQ(plan_wait(WaitPolicy::spin, shape, loaded, microseconds(20)),
                (WaitOptions{nanoseconds::max(), nanoseconds(0), false}));
      EXPECT_EQ(plan_wait(WaitPolicy::block, shape, loaded, microseconds(20)),
                (WaitOptions{nanoseconds(0), nanoseconds(0), true}));
    }
  }
}

TEST(WaitPlan, AdaptiveFollowsTheShapeWhenIdle) {
  EXPECT_EQ(plan_wait(WaitPolicy::adaptive, {2, 2, false}, false, microseconds(40)),
            (WaitOptions{microseconds(40), tuning::kYieldIdle, true}));
  EXPECT_EQ(plan_wait(WaitPolicy::adaptive, {8, 2, false}, false, microseconds(40)),
            (WaitOptions{nanoseconds(0), tuning::kYieldIdle, true}));
  const WaitOptions across = plan_wait(WaitPolicy::adaptive, {2, 2, true}, false, microseconds(40));
  EXPECT_EQ(across.spin, nanoseconds(0));
  EXPECT_GT(across.yield, nanoseconds(0));
  EXPECT_TRUE(across.sleep);
}

TEST(WaitPlan, AdaptiveNeverYieldsOnALoadedMachine) {
  for (WaitShape shape : {WaitShape{2, 2, false}, WaitShape{8, 2, false}, WaitShape{2, 2, true},
                          WaitShape{16, 16, false}}) {
    const WaitOptions options = plan_wait(WaitPolicy::adaptive, shape, true, tuning::kSpinMaxIdle);
    EXPECT_EQ(options.yield, nanoseconds(0)) << shape.processes << " on " << shape.cpus;
    EXPECT_LE(options.spin, nanoseconds(tuning::kSpinLoaded));
    EXPECT_TRUE(options.sleep);
  }
}

TEST(Waiter, ImmediateWaitReadsNoClock) {
  FakeMachine machine;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, false}, machine);
  const Time before = machine.clock;
  FakeSite site = wait_once(waiter, machine, nanoseconds(0));
  EXPECT_EQ(machine.clock, before);
  EXPECT_EQ(site.polls, 1);
  EXPECT_EQ(machine.samples, 0);
}

TEST(Waiter, IdleWithACpuEachSpinsThroughAShortWait) {
  FakeMachine machine;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, false}, machine);
  FakeSite site = wait_once(waiter, machine, microseconds(10));
  EXPECT_EQ(site.blocks, 0);
  EXPECT_EQ(machine.yields, 0);
  EXPECT_EQ(machine.samples, 0) << "a wait that the spin covers never reads /proc";
}

TEST(Waiter, IdleOversubscribedYieldsThenSleeps) {
  FakeMachine machine;
  machine.runnable = 4;  // the job's own four processes on two CPUs
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  FakeSite short_wait = wait_once(waiter, machine, microseconds(300));
  EXPECT_GT(machine.yields, 0);
  EXPECT_EQ(short_wait.blocks, 0);
  EXPECT_FALSE(waiter.loaded());
  FakeSite long_wait = wait_once(waiter, machine, milliseconds(50));
  EXPECT_GT(long_wait.blocks, 0);
}

TEST(Waiter, LoadedMachineSleepsInsteadOfYielding) {
  FakeMachine machine;
  machine.runnable = 4 + 2;  // four of the job's, two competitors, on two CPUs
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  for (int i = 0; i < 20; ++i) {
    machine.clock += milliseconds(2);  // let each wait take a sample
    (void)wait_once(waiter, machine, microseconds(500));
  }
  ASSERT_TRUE(waiter.loaded());
  EXPECT_EQ(waiter.stats().became_loaded, 1U);
  const int yields = machine.yields;
  FakeSite site = wait_once(waiter, machine, milliseconds(3));
  EXPECT_EQ(machine.yields, yields) << "no sched_yield once load is seen";
  EXPECT_GT(site.blocks, 0);
}

TEST(Waiter, AYieldThatLostTheCpuForASliceEndsTheYielding) {
  FakeMachine machine;
  machine.runnable = 4;
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  (void)wait_once(waiter, machine, microseconds(100));
  ASSERT_FALSE(waiter.loaded());
  // Two competitors appear; each yield now hands the CPU to one for a slice.
  machine.runnable = 6;
  machine.yield_cost = milliseconds(3);
  const int idle_yields = machine.yields;
  int waits = 0;
  while (!waiter.loaded() && waits < 10) {
    (void)wait_once(waiter, machine, milliseconds(20));
    ++waits;
  }
  EXPECT_TRUE(waiter.loaded());
  EXPECT_LE(machine.yields - idle_yields, 2) << "a slice lost is enough to see the load";
  const int yields = machine.yields;
  for (int i = 0; i < 10; ++i) {
    (void)wait_once(waiter, machine, milliseconds(20));
  }
  EXPECT_EQ(machine.yields, yields);
}

TEST(Waiter, LoadGoesAwayAndYieldingComesBack) {
  FakeMachine machine;
  machine.runnable = 6;
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  for (int i = 0; i < 10; ++i) {
    machine.clock += milliseconds(2);
    (void)wait_once(waiter, machine, milliseconds(1));
  }
  ASSERT_TRUE(waiter.loaded());
  machine.runnable = 4;
  // A sample per kLoadedSamplePeriod at most while loaded: kIdleWindow of them, and two more.
  const auto waits = static_cast<std::int64_t>(tuning::kIdleWindow + 2) *
                     (tuning::kLoadedSamplePeriod / milliseconds(2));
  for (std::int64_t i = 0; i < waits; ++i) {
    machine.clock += milliseconds(2);
    (void)wait_once(waiter, machine, milliseconds(1));
  }
  EXPECT_FALSE(waiter.loaded());
  EXPECT_GT(waiter.options().yield, nanoseconds(0));
}

TEST(Waiter, AFewSamplesThatMissTheCompetitorAreNotIdle) {
  // Four processes on two CPUs beside one busy process; samples taken while the barrier's
  // wake-ups are in flight can miss a task for a moment, several in a row.
  FakeMachine machine;
  machine.runnable = 4 + 1;
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  sample_all(machine, {&waiter}, 10, milliseconds(5));
  ASSERT_TRUE(waiter.loaded());
  const auto step = tuning::kLoadedSamplePeriod + milliseconds(1);  // a sample each
  machine.runnable = 4;
  sample_all(machine, {&waiter}, static_cast<int>(tuning::kIdleWindow) - 1, step);
  EXPECT_TRUE(waiter.loaded()) << "fewer than kIdleWindow samples without the competitor";
  machine.runnable = 4 + 1;
  sample_all(machine, {&waiter}, 1, step);
  machine.runnable = 4;
  sample_all(machine, {&waiter}, static_cast<int>(tuning::kIdleWindow) - 1, step);
  EXPECT_TRUE(waiter.loaded());
  sample_all(machine, {&waiter}, 1, step);
  EXPECT_FALSE(waiter.loaded()) << "kIdleWindow samples in a row without it";
  EXPECT_EQ(waiter.stats().became_idle, 1U);
}

TEST(Waiter, AKernelThreadsMomentIsNotLoad) {
  FakeMachine machine;
  machine.runnable = 4;
  machine.noise_every = 3;  // one sample in three sees two more tasks
  machine.noise_tasks = 2;
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  for (int i = 0; i < 100; ++i) {
    machine.clock += milliseconds(2);
    (void)wait_once(waiter, machine, microseconds(100));
    EXPECT_FALSE(waiter.loaded()) << "sample " << machine.samples;
  }
}

TEST(Waiter, BusyTasksBeyondAnIdleMachinesCpusAreNotLoad) {
  FakeMachine machine;
  machine.cpus = 16;
  machine.runnable = 4 + 6;  // six busy processes elsewhere, six CPUs still free
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);  // the job is pinned to two
  for (int i = 0; i < 20; ++i) {
    machine.clock += milliseconds(2);
    (void)wait_once(waiter, machine, microseconds(300));
  }
  EXPECT_FALSE(waiter.loaded());
}

TEST(Waiter, PeersAsleepAreNotCountedAsTheJobsRunnableTasks) {
  // Four processes on two CPUs and one competitor; in every other sample two of them are asleep
  // in the barrier, and the machine has three runnable tasks, of which only two are the job's.
  FakeMachine machine;
  int asleep = 0;
  Waiter blind(WaitPolicy::adaptive, {4, 2, false}, machine);
  Waiter watching(WaitPolicy::adaptive, {4, 2, false}, machine);
  watching.watch_peers([&asleep] { return asleep; });
  for (int i = 0; i < 20; ++i) {
    asleep = i % 2 == 0 ? 2 : 0;
    machine.runnable = 4 - asleep + 1;
    sample_all(machine, {&blind, &watching}, 1, milliseconds(5));
  }
  EXPECT_FALSE(blind.loaded());
  EXPECT_TRUE(watching.loaded());
}

TEST(Waiter, ACompetitorThatFitsOnlyWhileThePeersSleepIsLoad) {
  // Two processes on two CPUs beside one busy process, sampled while the peer sleeps: the
  // machine has two runnable tasks (the busy one and the sampler), no more than its CPUs, but
  // once the barrier wakes the peer three want two CPUs (a loaded waiter that sampled this way
  // turned idle, and yielded its CPU to the busy process thousands of times per second). The
  // first samples, idle, see the peer awake (it spins rather than sleeps).
  FakeMachine machine;
  int asleep = 0;
  machine.runnable = 3;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, false}, machine);
  waiter.watch_peers([&asleep] { return asleep; });
  sample_all(machine, {&waiter}, 4, milliseconds(5));
  ASSERT_TRUE(waiter.loaded());
  asleep = 1;
  machine.runnable = 2;
  sample_all(machine, {&waiter}, 20, milliseconds(20));
  EXPECT_TRUE(waiter.loaded());
  Waiter idle(WaitPolicy::adaptive, {2, 2, false}, machine);  // both awake: the job's two tasks
  sample_all(machine, {&idle}, 20, milliseconds(5));
  EXPECT_FALSE(idle.loaded());
}

// Eight processes on two CPUs whose waits sleep (loaded), three of them asleep at each sample.
// The kernel (Linux 6.12 and later: EEVDF's delayed dequeue) may still count a peer that has just
// gone to sleep as runnable: `counted` of the three.
struct SleepingPeers {
  SleepingPeers() {
    waiter.watch_peers([] { return kAsleep; });
  }
  // One sample: the job's awake processes and `counted` of its sleepers, and `foreign` tasks.
  void sample(int counted, int foreign) {
    machine.runnable = kProcesses - kAsleep + counted + foreign;
    sample_all(machine, {&waiter}, 1, tuning::kLoadedSamplePeriod);
  }
  static constexpr int kProcesses = 8;
  static constexpr int kAsleep = 3;
  FakeMachine machine;
  Waiter waiter{WaitPolicy::adaptive, {kProcesses, 2, false}, machine};
};

TEST(Waiter, SleepersTheKernelStillCountsDoNotKeepTheJobLoaded) {
  SleepingPeers job;
  for (int i = 0; i < 8; ++i) {
    job.sample(SleepingPeers::kAsleep, 1);  // a busy loop beside the job, every peer counted
  }
  ASSERT_TRUE(job.waiter.loaded());
  // The busy loop is gone; every other sample counts one to three sleepers as runnable, so no
  // kIdleWindow samples in a row see nothing (a job on an idle machine stayed loaded for good).
  int samples = 0;
  while (job.waiter.loaded() && samples < 200) {
    job.sample(samples % 2 == 0 ? 1 + samples % 3 : 0, 0);
    ++samples;
  }
  EXPECT_FALSE(job.waiter.loaded());
  EXPECT_LE(samples, 2 * static_cast<int>(tuning::kIdleWindow));
  EXPECT_EQ(job.waiter.stats().became_idle, 1U);
}

TEST(Waiter, ACompetitorBesideSleepersTheKernelCountsKeepsTheJobLoaded) {
  SleepingPeers job;
  for (int i = 0; i < 8; ++i) {
    job.sample(SleepingPeers::kAsleep, 1);
  }
  ASSERT_TRUE(job.waiter.loaded());
  // The busy loop stays. Most samples cannot tell it from a counted sleeper; one in four can
  // (every sleeper counted, and one task more); one in ten misses it (woken peers not yet on a
  // run queue: nothing foreign).
  for (int i = 0; i < 400; ++i) {
    if (i % 10 == 9) {
      job.sample(0, 0);
    } else {
      job.sample(i % 4 == 0 ? SleepingPeers::kAsleep : i % 3, 1);
    }
    ASSERT_TRUE(job.waiter.loaded()) << "sample " << i;
  }
  EXPECT_EQ(job.waiter.stats().became_idle, 0U);
}

TEST(Waiter, SleepersTheKernelStillCountsDoNotMakeTheJobLoaded) {
  // An idle job whose peers still sleep (they have not yet seen the machine idle again, or
  // their waits are long): every sample counts one of them, none sees one task more than the
  // job's processes. A node's first process to turn idle turned loaded again at once, and a
  // kernel thread's moment, with the sleeps it caused, turned an idle job loaded.
  SleepingPeers job;
  for (int i = 0; i < 100; ++i) {
    job.sample(1 + i % 3, 0);
    ASSERT_FALSE(job.waiter.loaded()) << "sample " << i;
  }
  // A kernel thread's slice: one sample sees one task more than the job's, surely, and the next
  // ones see the sleepers its slice caused.
  job.sample(SleepingPeers::kAsleep, 1);
  for (int i = 0; i < 3; ++i) {
    job.sample(1, 0);
  }
  EXPECT_FALSE(job.waiter.loaded());
  // A competitor that stays is seen surely again.
  job.sample(SleepingPeers::kAsleep, 1);
  job.sample(1, 0);
  job.sample(SleepingPeers::kAsleep, 1);
  job.sample(1, 0);
  EXPECT_TRUE(job.waiter.loaded());
}

TEST(Waiter, SimulatedNodesOnThisMachineAreNotForeignLoad) {
  // Four single-process nodes on two CPUs, meeting on loopback: the other three are the job's.
  FakeMachine machine;
  machine.runnable = 4;
  Waiter simulated(WaitPolicy::adaptive, {1, 2, true, 4}, machine);
  Waiter alone(WaitPolicy::adaptive, {1, 2, true}, machine);
  sample_all(machine, {&simulated, &alone}, 20, milliseconds(5));
  EXPECT_FALSE(simulated.loaded());
  EXPECT_TRUE(alone.loaded());
}

TEST(Waiter, LoadSamplesAreRateLimited) {
  FakeMachine machine;
  machine.runnable = 4;
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  for (int i = 0; i < 100; ++i) {
    (void)wait_once(waiter, machine, microseconds(5));  // 100 waits within about 1 ms
  }
  EXPECT_LE(machine.samples, 3);
}

// Loaded, a sample serves only to see the load go, and each read holds a CPU that a late peer
// may wait for (wait_tuning::kLoadedSamplePeriod).
TEST(Waiter, ALoadedWaiterSamplesLessOften) {
  FakeMachine machine;
  machine.runnable = 6;
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  sample_all(machine, {&waiter}, 10, milliseconds(5));
  ASSERT_TRUE(waiter.loaded());
  const int reads = machine.samples;
  const auto span = 10 * tuning::kLoadedSamplePeriod;
  sample_all(machine, {&waiter}, static_cast<int>(span / milliseconds(1)), milliseconds(1));
  EXPECT_EQ(machine.samples - reads, 10) << "one per kLoadedSamplePeriod";
  machine.runnable = 4;  // idle again, then the regular period
  sample_all(machine, {&waiter}, static_cast<int>(tuning::kIdleWindow),
             tuning::kLoadedSamplePeriod);
  ASSERT_FALSE(waiter.loaded());
  const int idle_reads = machine.samples;
  sample_all(machine, {&waiter}, static_cast<int>(span / milliseconds(1)), milliseconds(1));
  EXPECT_EQ(machine.samples - idle_reads, span / tuning::kLoadSamplePeriod);
}

// Two of four processes on two CPUs beside one busy loop (all awake: five runnable tasks), their
// load samples shared through `word` when `shared`.
struct TwoProcesses {
  explicit TwoProcesses(bool shared) {
    machine.runnable = 5;
    if (shared) {
      first.share_samples(&word);
      second.share_samples(&word);
    }
  }
  FakeMachine machine;
  std::atomic<std::uint64_t> word{0};
  Waiter first{WaitPolicy::adaptive, {4, 2, false}, machine};
  Waiter second{WaitPolicy::adaptive, {4, 2, false}, machine};
};

TEST(Waiter, TheNodesProcessesShareTheirLoadSamples) {
  TwoProcesses node(true);
  const auto step = tuning::kLoadedSamplePeriod + milliseconds(1);  // a period each (loaded)
  sample_all(node.machine, {&node.first, &node.second}, 20, step);
  EXPECT_EQ(node.machine.samples, 20) << "one read of /proc/loadavg per period for the node";
  EXPECT_EQ(node.first.stats().shared_samples + node.second.stats().shared_samples, 20u);
  EXPECT_TRUE(node.first.loaded());
  EXPECT_TRUE(node.second.loaded());
  // The word: when the last sample was taken (microseconds), and the one foreign task.
  const auto stamp = static_cast<std::uint64_t>(
      std::chrono::duration_cast<microseconds>(node.machine.clock.time_since_epoch()).count());
  EXPECT_EQ(node.word.load(), stamp << 16 | 1);

  // Without the word, each process reads its own.
  TwoProcesses apart(false);
  sample_all(apart.machine, {&apart.first, &apart.second}, 20, step);
  EXPECT_EQ(apart.machine.samples, 40);
}

TEST(Waiter, ASharedSampleIsCountedOnceAndOnlyWhileFresh) {
  TwoProcesses node(true);
  FakeMachine& machine = node.machine;
  sample_all(machine, {&node.first, &node.second}, 8, milliseconds(5));  // past the first ones
  ASSERT_TRUE(node.first.loaded());
  const auto period = tuning::kLoadedSamplePeriod;  // loaded
  const int reads = machine.samples;
  // The first reads one; the second comes a period later: too old, it reads its own.
  machine.clock += period + milliseconds(1);
  (void)node.first.sample_load(machine.clock);
  machine.clock += period;
  (void)node.second.sample_load(machine.clock);
  EXPECT_EQ(machine.samples, reads + 2);
  // The first, a period after its last, finds the second's fresh one and counts it; a period
  // later nobody has sampled since: it reads (it never counts one sample twice).
  (void)node.first.sample_load(machine.clock + microseconds(1));
  EXPECT_EQ(machine.samples, reads + 2);
  machine.clock += period + milliseconds(1);
  (void)node.first.sample_load(machine.clock);
  EXPECT_EQ(machine.samples, reads + 3);
  // A sample taken at once (a lost CPU) is always read, fresh word or not.
  (void)node.second.sample_load(machine.clock, true);
  EXPECT_EQ(machine.samples, reads + 4);
  EXPECT_TRUE(node.first.loaded());
  EXPECT_TRUE(node.second.loaded());
}

TEST(Waiter, SpinGrowsToCoverTheWaitsSeenOnAnIdleMachine) {
  FakeMachine machine;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, false}, machine);
  for (int i = 0; i < 10; ++i) {
    (void)wait_once(waiter, machine, microseconds(80));
  }
  EXPECT_GE(waiter.options().spin, microseconds(80));
  EXPECT_LE(waiter.options().spin, tuning::kSpinMaxIdle);
  const int yields = machine.yields;
  FakeSite site = wait_once(waiter, machine, microseconds(80));
  EXPECT_EQ(machine.yields, yields);
  EXPECT_EQ(site.blocks, 0);
}

TEST(Waiter, SpinShrinksWhenPeersAreLateByMilliseconds) {
  FakeMachine machine;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, false}, machine);
  for (int i = 0; i < 10; ++i) {
    (void)wait_once(waiter, machine, milliseconds(5));
  }
  EXPECT_EQ(waiter.options().spin, tuning::kSpinMin);
}

TEST(Waiter, LoadedSpinStaysShort) {
  FakeMachine machine;
  machine.runnable = 2 + 2;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, false}, machine);
  for (int i = 0; i < 30; ++i) {
    machine.clock += milliseconds(2);
    (void)wait_once(waiter, machine, microseconds(i % 2 == 0 ? 300 : 15));
  }
  ASSERT_TRUE(waiter.loaded());
  EXPECT_LE(waiter.options().spin, tuning::kSpinLoaded);
  EXPECT_EQ(waiter.options().yield, nanoseconds(0));
}

TEST(Waiter, LoadedMachineSkipsTheSpinWhenALatePeerSharesTheCpu) {
  FakeMachine machine;
  machine.runnable = 2 + 1;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, false}, machine);
  for (int i = 0; i < 10; ++i) {
    (void)waiter.sample_load(machine.clock + milliseconds(5 * i));
  }
  ASSERT_TRUE(waiter.loaded());
  ASSERT_GT(waiter.options().spin, nanoseconds(0));
  FakeSite elsewhere(machine);
  elsewhere.peer_here = false;
  elsewhere.ready_at = machine.clock + microseconds(1);
  EXPECT_EQ(waiter.wait(elsewhere, std::nullopt, milliseconds(100)), Waiter::End::done);
  EXPECT_EQ(elsewhere.blocks, 0) << "the peer runs elsewhere: a short spin catches it";
  EXPECT_EQ(waiter.stats().loaded_spins, 1U);
  EXPECT_EQ(waiter.stats().loaded_catches, 1U);
  FakeSite here(machine);
  here.peer_here = true;
  here.ready_at = machine.clock + microseconds(1);
  EXPECT_EQ(waiter.wait(here, std::nullopt, milliseconds(100)), Waiter::End::done);
  EXPECT_EQ(here.blocks, 1) << "the peer waits for this CPU: sleep at once";
  EXPECT_EQ(here.polls, 2) << "no quick polls either (they hold the CPU too): one poll before "
                              "sleeping, one after, as the block policy";
  EXPECT_EQ(waiter.stats().loaded_spins, 1U) << "no spin this time";
}

TEST(Waiter, ADescheduledSpinnerOnALoadedMachineSleeps) {
  FakeMachine machine;
  machine.runnable = 2 + 2;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, false}, machine);
  for (int i = 0; i < 10; ++i) {
    (void)waiter.sample_load(machine.clock + milliseconds(2 * i));
  }
  ASSERT_TRUE(waiter.loaded());
  machine.read_cost = microseconds(100);  // every clock read finds the CPU was lost meanwhile
  FakeSite site(machine);
  site.ready_at = machine.clock + milliseconds(10);
  EXPECT_EQ(waiter.wait(site, std::nullopt, milliseconds(100)), Waiter::End::done);
  EXPECT_GT(site.blocks, 0);
  EXPECT_EQ(machine.yields, 0);
}

TEST(Waiter, SpinPolicyNeverYieldsNorSleeps) {
  FakeMachine machine;
  machine.runnable = 10;
  Waiter waiter(WaitPolicy::spin, {8, 2, false}, machine);
  FakeSite site = wait_once(waiter, machine, milliseconds(20));
  EXPECT_EQ(site.blocks, 0);
  EXPECT_EQ(machine.yields, 0);
  EXPECT_EQ(machine.samples, 0);
}

TEST(Waiter, BlockPolicySleepsAtOnce) {
  FakeMachine machine;
  Waiter waiter(WaitPolicy::block, {2, 2, false}, machine);
  FakeSite site = wait_once(waiter, machine, milliseconds(1));
  EXPECT_EQ(site.blocks, 1);
  EXPECT_EQ(site.polls, 2) << "one poll before sleeping, one after";
  EXPECT_EQ(machine.yields, 0);
  EXPECT_EQ(machine.samples, 0);
}

// A wait that sleeps at once keeps times of the periodic check's scale only: the coarse clock
// serves it. One that spins, yields or has a deadline reads the precise one.
TEST(Waiter, OnlyAWaitThatSleepsAtOnceWithoutADeadlineReadsTheCoarseClock) {
  FakeMachine machine;
  Waiter block(WaitPolicy::block, {2, 2, false}, machine);
  const FakeSite undated = wait_once(block, machine, milliseconds(250));
  EXPECT_EQ(undated.blocks, 3) << "two periodic checks on the way";
  EXPECT_EQ(undated.checks, 2);
  EXPECT_EQ(machine.precise_reads, 0);
  EXPECT_GE(machine.coarse_reads, 3);

  machine.coarse_reads = 0;
  const FakeSite dated =
      wait_once(block, machine, milliseconds(250), machine.clock + milliseconds(500));
  EXPECT_EQ(dated.blocks, 3);
  EXPECT_GE(machine.precise_reads, 3) << "a deadline is kept to the precise clock";
  EXPECT_EQ(machine.coarse_reads, 0);

  machine.precise_reads = 0;
  Waiter adaptive(WaitPolicy::adaptive, {2, 2, false}, machine);
  (void)wait_once(adaptive, machine, microseconds(30));
  EXPECT_GT(machine.precise_reads, 0) << "a spin is timed to the microsecond";
  EXPECT_EQ(machine.coarse_reads, 0);
}

// After a sleep the clock is read only where the time serves: a read there cost 1-2% of a
// loaded machine's episode (bench/sleep-ab, docs/performance-history.md, "What a sleep costs"). A
// wait that learns from its length (adaptive, idle: SpinShrinksWhenPeersAreLateByMilliseconds) or
// goes on sleeping still reads it.
TEST(Waiter, AWaitThatEndsAtItsFirstWakeReadsTheClockOnlyBeforeItsSleep) {
  FakeMachine machine;
  Waiter block(WaitPolicy::block, {2, 2, false}, machine);
  const FakeSite once = wait_once(block, machine, milliseconds(50));
  EXPECT_EQ(once.blocks, 1);
  EXPECT_EQ(machine.coarse_reads, 1) << "the wait's start, for its periodic check";
  EXPECT_EQ(machine.precise_reads, 0);

  machine.coarse_reads = 0;
  const FakeSite twice = wait_once(block, machine, milliseconds(150));
  EXPECT_EQ(twice.blocks, 2);
  EXPECT_EQ(twice.checks, 1);
  EXPECT_EQ(machine.coarse_reads, 2) << "the start, and the check's time after the first wake";
}

// A watched site (the node barrier's, with its peer watch) is woken by whatever check() would
// find, so a wait that sleeps at once sleeps without a timeout, asking to be woken when its stall
// line is due. Such a wait is the whole of a loaded machine's episode after its wake-up, and
// takes a path of its own (Waiter::wait, then wait_long): a wake that finds it not done (a peer
// exited, the stall line) must still check at once, before it sleeps again.
struct WatchedSite : FakeSite {
  using FakeSite::FakeSite;
  static bool watched() noexcept { return true; }
  void wake_me_at(Time when) noexcept { asked.push_back(when); }
  void block(nanoseconds limit) {
    limits.push_back(limit);
    Time until = ready_at;
    if (!wakes.empty()) {
      until = std::min(until, wakes.front());
      wakes.erase(wakes.begin());
    }
    FakeSite::block(until - clock());
  }
  bool check() {
    checked_at.push_back(clock());
    return FakeSite::check();
  }
  [[nodiscard]] Time clock() const { return machine->clock; }

  FakeMachine* machine = nullptr;
  std::vector<Time> wakes;  // wakes before ready_at (not done), in order
  std::vector<nanoseconds> limits;
  std::vector<Time> asked;
  std::vector<Time> checked_at;
};

TEST(Waiter, AWatchedWaitSleepsUntimedAndChecksAtOnceWhenWokenNotDone) {
  FakeMachine machine;
  const nanoseconds before = lockstep::detail::set_stall_warning(std::chrono::seconds(1));
  for (WaitPolicy policy : {WaitPolicy::block, WaitPolicy::adaptive}) {
    // adaptive sleeps at once when loaded with more processes than CPUs.
    Waiter waiter(policy, {4, 2, false}, machine);
    machine.runnable = 6;
    sample_all(machine, {&waiter}, 4, milliseconds(1));
    ASSERT_EQ(waiter.options(), (WaitOptions{nanoseconds(0), nanoseconds(0), true}));
    machine.coarse_reads = machine.precise_reads = 0;
    const Time start = machine.clock;

    WatchedSite once(machine);
    once.machine = &machine;
    once.ready_at = start + milliseconds(30);
    EXPECT_EQ(waiter.wait(once, std::nullopt, milliseconds(100)), Waiter::End::done);
    EXPECT_EQ(once.limits, std::vector<nanoseconds>{nanoseconds::max()});
    EXPECT_EQ(once.asked, std::vector<Time>{start + std::chrono::seconds(1)}) << "the stall line";
    EXPECT_TRUE(once.checked_at.empty());
    EXPECT_EQ(machine.coarse_reads, 1) << "the wait's start, for its stall line";
    EXPECT_EQ(machine.precise_reads, 0);

    WatchedSite woken(machine);
    woken.machine = &machine;
    const Time second = machine.clock;
    woken.wakes = {second + milliseconds(40)};
    woken.ready_at = second + milliseconds(300);
    EXPECT_EQ(waiter.wait(woken, std::nullopt, milliseconds(100)), Waiter::End::done);
    EXPECT_EQ(woken.limits, (std::vector<nanoseconds>{nanoseconds::max(), nanoseconds::max()}));
    EXPECT_EQ(woken.checked_at, std::vector<Time>{second + milliseconds(40)})
        << "checked as it woke, not a check interval later";
    EXPECT_EQ(woken.asked.size(), 2U);
    EXPECT_EQ(woken.asked.back(), second + std::chrono::seconds(1)) << "the same stall line";

    WatchedSite lost(machine);
    lost.machine = &machine;
    lost.wakes = {machine.clock + milliseconds(5)};
    lost.ready_at = Time::max();
    lost.lost = true;
    EXPECT_THROW((void)waiter.wait(lost, std::nullopt, milliseconds(100)), std::runtime_error);
    EXPECT_EQ(lost.limits.size(), 1U);
    EXPECT_EQ(lost.checked_at.size(), 1U);
  }
  (void)lockstep::detail::set_stall_warning(before);
}

// A site whose watch raises its alarm at `alarm_at` (a peer exited): a sleeper is woken then, as
// the watch wakes the node's sleepers; a spinning or yielding wait is not.
struct AlarmedSite : FakeSite {
  using FakeSite::FakeSite;
  [[nodiscard]] bool watched() const noexcept { return clock() < alarm_at; }
  [[nodiscard]] bool alarmed() const noexcept { return clock() >= alarm_at; }
  void block(nanoseconds limit) {
    const Time start = clock();
    Time until =
        limit >= Time::max() - start ? Time::max() : start + std::max(limit, nanoseconds(0));
    if (start < alarm_at) {
      until = std::min(until, alarm_at);
    }
    FakeSite::block(until - start);
  }
  bool check() {
    checked_at.push_back(clock());
    return FakeSite::check();
  }
  [[nodiscard]] Time clock() const { return machine->clock; }

  FakeMachine* machine = nullptr;
  Time alarm_at = Time::max();
  std::vector<Time> checked_at;
};

// Issue 45: a peer lost while a wait spins or yields, or before a wait begins, is looked for at
// once (within 10 ms of the alarm, here within a few clock reads), not at the wait's next
// periodic check (0.1 s), under every policy and machine state.
TEST(Waiter, AnAlarmIsLookedIntoAtOnceWhateverTheWaitIsDoing) {
  struct Case {
    const char* name;
    WaitPolicy policy;
    int runnable;  // tasks on the 2 CPUs: 1 is idle
    nanoseconds alarm_after;
  };
  for (const Case& c : {Case{"spin, mid-spin", WaitPolicy::spin, 1, milliseconds(3)},
                        Case{"adaptive idle, mid-spin", WaitPolicy::adaptive, 1, microseconds(5)},
                        Case{"adaptive idle, yielding", WaitPolicy::adaptive, 1, milliseconds(1)},
                        Case{"block, asleep", WaitPolicy::block, 1, milliseconds(3)},
                        Case{"adaptive loaded", WaitPolicy::adaptive, 6, milliseconds(3)},
                        Case{"spin, before the wait", WaitPolicy::spin, 1, nanoseconds(0)},
                        Case{"block, before the wait", WaitPolicy::block, 1, nanoseconds(0)}}) {
    FakeMachine machine;
    Waiter waiter(c.policy, {2, 2, false}, machine);
    machine.runnable = c.runnable;
    sample_all(machine, {&waiter}, 4, milliseconds(1));
    AlarmedSite site(machine);
    site.machine = &machine;
    site.alarm_at = machine.clock + c.alarm_after;
    site.ready_at = Time::max();
    site.lost = true;
    EXPECT_THROW((void)waiter.wait(site, std::nullopt, milliseconds(100)), std::runtime_error)
        << c.name;
    ASSERT_EQ(site.checked_at.size(), 1U) << c.name;
    EXPECT_GE(site.checked_at.front(), site.alarm_at) << c.name;
    EXPECT_LT(site.checked_at.front() - site.alarm_at, milliseconds(10)) << c.name;
  }
}

// Loaded with a CPU per process, adaptive spins only where its late peer runs elsewhere; where the
// peer may be on this CPU it sleeps at once, and takes block's short path to that sleep (one
// coarse clock read, an untimed sleep), not wait_long's loop around it.
TEST(Waiter, ALoadedWaitWhoseLatePeerSharesTheCpuTakesBlocksShortPath) {
  FakeMachine machine;
  machine.runnable = 2 + 1;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, false}, machine);
  sample_all(machine, {&waiter}, 10, milliseconds(5));
  ASSERT_TRUE(waiter.loaded());
  ASSERT_EQ(waiter.options().spin, nanoseconds(tuning::kSpinLoaded));

  machine.coarse_reads = machine.precise_reads = 0;
  WatchedSite here(machine);
  here.machine = &machine;
  here.peer_here = true;
  here.ready_at = machine.clock + microseconds(30);
  EXPECT_EQ(waiter.wait(here, std::nullopt, milliseconds(100)), Waiter::End::done);
  EXPECT_EQ(here.limits, std::vector<nanoseconds>{nanoseconds::max()});
  EXPECT_EQ(here.polls, 2) << "one poll before the sleep, one after";
  EXPECT_EQ(machine.precise_reads, 0) << "no spin to time: the coarse clock, as block's";
  EXPECT_EQ(machine.coarse_reads, 1);
  EXPECT_EQ(waiter.stats().loaded_spins, 0U);

  WatchedSite elsewhere(machine);
  elsewhere.machine = &machine;
  elsewhere.peer_here = false;
  elsewhere.ready_at = machine.clock + microseconds(3);
  EXPECT_EQ(waiter.wait(elsewhere, std::nullopt, milliseconds(100)), Waiter::End::done);
  EXPECT_TRUE(elsewhere.limits.empty()) << "the peer runs elsewhere: the spin catches it";
  EXPECT_GT(machine.precise_reads, 0) << "a spin is timed to the microsecond";
  EXPECT_EQ(waiter.stats().loaded_spins, 1U);
  EXPECT_EQ(waiter.stats().loaded_catches, 1U);
}

TEST(Waiter, AcrossNodesYieldsFromTheStartWhenIdle) {
  FakeMachine machine;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, true}, machine);
  FakeSite site = wait_once(waiter, machine, microseconds(30));
  EXPECT_GT(machine.yields, 0);
  EXPECT_EQ(site.blocks, 0);
}

TEST(Waiter, DeadlineEndsTheWaitAfterALastCheck) {
  FakeMachine machine;
  Waiter waiter(WaitPolicy::adaptive, {2, 2, false}, machine);
  FakeSite site(machine);
  site.ready_at = Time::max();
  const Time deadline = machine.clock + milliseconds(350);
  EXPECT_EQ(waiter.wait(site, deadline, milliseconds(100)), Waiter::End::timed_out);
  EXPECT_GE(machine.clock, deadline);
  EXPECT_LT(machine.clock, deadline + milliseconds(1));
  EXPECT_EQ(site.checks, 4) << "at 100, 200, 300 ms and at the deadline";
}

// The stall warning (issue 23): a wait that lasts calls stalled() after the warning's time,
// then after twice as long each time (1 s, then 2 s, then 4 s later); none while it is off.
TEST(Waiter, AWaitThatLastsSaysSoAtGrowingIntervals) {
  struct StallSite : FakeSite {
    using FakeSite::FakeSite;
    void stalled(nanoseconds waited) noexcept { said.push_back(waited); }
    std::vector<nanoseconds> said;
  };
  FakeMachine machine;
  Waiter waiter(WaitPolicy::block, {2, 2, false}, machine);
  const nanoseconds before = lockstep::detail::set_stall_warning(std::chrono::seconds(1));
  StallSite site(machine);
  site.ready_at = machine.clock + std::chrono::milliseconds(7500);
  EXPECT_EQ(waiter.wait(site, std::nullopt, milliseconds(100)), Waiter::End::done);
  ASSERT_EQ(site.said.size(), 3U);
  const std::vector<double> expected = {1, 3, 7};
  for (std::size_t i = 0; i < site.said.size(); ++i) {
    EXPECT_NEAR(std::chrono::duration<double>(site.said[i]).count(), expected[i], 0.11) << i;
  }
  (void)lockstep::detail::set_stall_warning(nanoseconds(0));
  StallSite quiet(machine);
  quiet.ready_at = machine.clock + std::chrono::seconds(5);
  EXPECT_EQ(waiter.wait(quiet, std::nullopt, milliseconds(100)), Waiter::End::done);
  EXPECT_TRUE(quiet.said.empty());
  (void)lockstep::detail::set_stall_warning(before);
}

TEST(Waiter, ACheckThatThrowsEndsTheWait) {
  FakeMachine machine;
  Waiter waiter(WaitPolicy::block, {2, 2, false}, machine);
  FakeSite site(machine);
  site.ready_at = Time::max();
  site.lost = true;
  EXPECT_THROW((void)waiter.wait(site, std::nullopt, milliseconds(100)), std::runtime_error);
  EXPECT_EQ(site.checks, 1);
}

// Oversubscribed on an idle machine, a wait yields whether or not a late peer was last seen on
// its CPU: that record may be stale (the peer moved here), and a spin in place of the yield then
// held the CPU the late peer was queued for, putting whole runs into a slow state (4-5x at N = 4
// on 2 vCPUs). The record is kept only where it is asked for: on a loaded machine.
TEST(Waiter, OversubscribedYieldsWhereverTheLatePeerWasLastSeen) {
  FakeMachine machine;
  machine.runnable = 4;
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  EXPECT_TRUE(waiter.asks_where_peers_are()) << "idle, oversubscribed: polls before a yield";
  FakeSite site(machine);
  site.peer_here = false;
  site.ready_at = machine.clock + microseconds(30);
  EXPECT_EQ(waiter.wait(site, std::nullopt, milliseconds(100)), Waiter::End::done);
  const int yields_elsewhere = machine.yields;
  EXPECT_GT(yields_elsewhere, 0) << "the late peer last seen elsewhere: still a yield";
  site.peer_here = true;
  site.ready_at = machine.clock + microseconds(30);
  EXPECT_EQ(waiter.wait(site, std::nullopt, milliseconds(100)), Waiter::End::done);
  EXPECT_GT(machine.yields, yields_elsewhere);
  machine.runnable = 4 + 2;
  sample_all(machine, {&waiter}, 10, milliseconds(20));
  ASSERT_TRUE(waiter.loaded());
  EXPECT_TRUE(waiter.asks_where_peers_are()) << "loaded: a late peer on this CPU means sleep";
}

// With more processes than CPUs on an idle machine, a waiter whose late peers were all last
// seen on other CPUs polls kPollBeforeYield before each yield (a yield would go to a peer that
// waits too); one whose late peer may be on its CPU yields at once; neither holds the CPU
// longer than that between yields. Loaded, or across nodes, nothing polls before a yield.
TEST(Waiter, OversubscribedPollsBeforeAYieldWhereNoLatePeerIsHere) {
  FakeMachine machine;
  machine.runnable = 4;
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  FakeSite site(machine);
  site.peer_here = false;
  site.ready_at = machine.clock + tuning::kPollBeforeYield / 2;
  EXPECT_EQ(waiter.wait(site, std::nullopt, milliseconds(100)), Waiter::End::done);
  EXPECT_EQ(machine.yields, 0) << "caught by the poll before the yield";
  site.peer_here = true;
  site.ready_at = machine.clock + tuning::kPollBeforeYield / 2;
  EXPECT_EQ(waiter.wait(site, std::nullopt, milliseconds(100)), Waiter::End::done);
  EXPECT_GE(machine.yields, 1) << "a late peer may be here: a yield at once";
  // A long wait: between two yields, the poll and the yield's own steps (a clock read before the
  // yield's end and after it, the yield: 1 us each here), and a step for the wait's start.
  site.peer_here = false;
  machine.yields = 0;
  const Time start = machine.clock;
  site.ready_at = start + microseconds(100);
  EXPECT_EQ(waiter.wait(site, std::nullopt, milliseconds(100)), Waiter::End::done);
  const auto per_yield = (machine.clock - start) / std::max(machine.yields, 1);
  EXPECT_GE(machine.yields, 10);
  EXPECT_LE(per_yield, tuning::kPollBeforeYield + 2 * machine.read_cost + machine.yield_cost +
                           microseconds(1));

  Waiter across(WaitPolicy::adaptive, {4, 2, true}, machine);
  machine.yields = 0;
  site.ready_at = machine.clock + tuning::kPollBeforeYield / 2;
  EXPECT_EQ(across.wait(site, std::nullopt, milliseconds(100)), Waiter::End::done);
  EXPECT_GE(machine.yields, 1) << "across nodes: a yield at once";
  EXPECT_FALSE(across.polls_before_yield());
  Waiter own_cpus(WaitPolicy::adaptive, {2, 2, false}, machine);
  EXPECT_FALSE(own_cpus.polls_before_yield()) << "a CPU each: the spin phase serves";
  machine.runnable = 4 + 2;
  sample_all(machine, {&waiter}, 10, milliseconds(20));
  ASSERT_TRUE(waiter.loaded());
  EXPECT_FALSE(waiter.polls_before_yield()) << "loaded: sleeps, never holds the CPU";
}

// With more processes than CPUs on an idle machine, each regular load sample of a wait lets the
// site even out where the processes run (WaitSite::spread): once per sample period at most, and
// never loaded, with a CPU per process, across nodes or for another policy.
TEST(Waiter, AnIdleOversubscribedWaitSpreadsOncePerLoadSample) {
  FakeMachine machine;
  machine.runnable = 4;
  const auto waits = [&](Waiter& waiter, FakeSite& site, int count, nanoseconds each) {
    for (int i = 0; i < count; ++i) {
      site.ready_at = machine.clock + each;
      EXPECT_EQ(waiter.wait(site, std::nullopt, milliseconds(100)), Waiter::End::done);
    }
  };
  Waiter waiter(WaitPolicy::adaptive, {4, 2, false}, machine);
  sample_all(machine, {&waiter}, 20, milliseconds(5));  // its first samples: idle
  ASSERT_FALSE(waiter.loaded());
  machine.clock += tuning::kLoadSamplePeriod;
  FakeSite site(machine);
  waits(waiter, site, 100, microseconds(10));  // 1 ms or so: one sample period holds them all
  EXPECT_EQ(site.spreads, 1);
  machine.clock += tuning::kLoadSamplePeriod;
  waits(waiter, site, 1, microseconds(10));
  EXPECT_EQ(site.spreads, 2) << "the next period's sample";
  machine.runnable = 4 + 1;  // one sample sees a task that is not the job's: not loaded yet
  machine.clock += tuning::kLoadSamplePeriod;
  waits(waiter, site, 1, microseconds(10));
  machine.runnable = 4;
  for (std::size_t i = 1; i < tuning::kLoadWindow; ++i) {
    machine.clock += tuning::kLoadSamplePeriod;
    waits(waiter, site, 1, microseconds(10));
  }
  EXPECT_FALSE(waiter.loaded());
  EXPECT_EQ(site.spreads, 2) << "until kLoadWindow samples in a row saw none";
  machine.clock += tuning::kLoadSamplePeriod;
  waits(waiter, site, 1, microseconds(10));
  EXPECT_EQ(site.spreads, 3);

  for (const WaitShape shape : {WaitShape{2, 2, false}, WaitShape{4, 2, true}}) {
    Waiter other(WaitPolicy::adaptive, shape, machine);
    sample_all(machine, {&other}, 20, milliseconds(5));
    FakeSite elsewhere(machine);
    waits(other, elsewhere, 20, tuning::kLoadSamplePeriod);
    EXPECT_EQ(elsewhere.spreads, 0)
        << shape.processes << " processes, across nodes " << shape.across_nodes;
  }
  Waiter block(WaitPolicy::block, {4, 2, false}, machine);
  FakeSite blocked(machine);
  waits(block, blocked, 20, tuning::kLoadSamplePeriod);
  EXPECT_EQ(blocked.spreads, 0) << "block";
  machine.runnable = 4 + 2;
  sample_all(machine, {&waiter}, 20, milliseconds(20));
  ASSERT_TRUE(waiter.loaded());
  site.spreads = 0;
  waits(waiter, site, 20, tuning::kLoadedSamplePeriod);
  EXPECT_EQ(site.spreads, 0) << "loaded";
}

// The real machine's coarse clock is the steady clock as of a tick ago at most: never ahead of
// it, never behind by more than a tick (1-10 ms; 50 ms allows for a preemption between reads).
TEST(SystemSignals, TheCoarseClockIsTheSteadyClockLessATickAtMost) {
  WaitSignals& machine = lockstep::detail::system_signals();
  for (int i = 0; i < 1000; ++i) {
    const Time coarse = machine.coarse_now();
    const Time precise = machine.now();
    ASSERT_LE(coarse, precise);
    ASSERT_LT(precise - coarse, milliseconds(50));
  }
}

// The real machine: /proc/loadavg read as the waiter reads it, with busy processes made here.
TEST(SystemSignals, SeeBusyProcesses) {
  WaitSignals& machine = lockstep::detail::system_signals();
  ASSERT_GE(machine.runnable_tasks(), 1) << "/proc/loadavg unreadable";
  const int cpus = machine.online_cpus();
  ASSERT_GE(cpus, 1);
  std::vector<pid_t> busy;
  for (int i = 0; i < cpus + 2; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      // A loop with no side effect may be assumed to end ([intro.progress]): clang removed it,
      // and the children ran on into the test's own code. Reading a volatile is a side effect.
      volatile bool spinning = true;
      while (spinning) {
      }
    }
    ASSERT_GT(pid, 0);
    busy.push_back(pid);
  }
  Waiter waiter(WaitPolicy::adaptive, {1, cpus, false});
  for (int i = 0; i < 40 && !waiter.loaded(); ++i) {
    std::this_thread::sleep_for(milliseconds(5));
    (void)waiter.sample_load(lockstep::detail::WaitClock::now());
  }
  const bool loaded = waiter.loaded();
  const double foreign = waiter.foreign_load();
  for (pid_t pid : busy) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  EXPECT_TRUE(loaded) << cpus + 2 << " busy processes on " << cpus << " CPUs; foreign " << foreign;
}

// The futex calls (made in line, without libc's syscall()): each outcome of a wait, and the
// wake-up of another process (shared futexes: the word in MAP_SHARED memory).
using lockstep::detail::futex_wait;
using lockstep::detail::futex_wake_all;
using lockstep::detail::FutexResult;

// Waits (at most 5 s) until the thread or process whose /proc stat file is `stat` sleeps: the
// futex call under test, so that what ends it comes after it began, however late the scheduler
// ran it. Returns false when it never did (a broken call returned at once).
bool sleeps_soon(const std::string& stat) {
  for (int i = 0; i < 5000; ++i) {
    if (lockstep::testing::task_state(stat) == 'S') {
      return true;
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  return false;
}
std::string stat_of_thread(pid_t tid) {
  return "/proc/self/task/" + std::to_string(tid) + "/stat";
}

TEST(Futex, AWordThatNoLongerHoldsTheValueReturnsAtOnce) {
  std::atomic<std::uint32_t> word{7};
  EXPECT_EQ(futex_wait(word, 6, nanoseconds::max()), FutexResult::value_changed);
  EXPECT_EQ(futex_wait(word, 6, milliseconds(100)), FutexResult::value_changed);
}

TEST(Futex, ATimedWaitTimesOutAfterItsTimeout) {
  std::atomic<std::uint32_t> word{0};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(futex_wait(word, 0, milliseconds(20)), FutexResult::timed_out);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(20));
  EXPECT_EQ(futex_wait(word, 0, nanoseconds(0)), FutexResult::timed_out);
  EXPECT_EQ(futex_wait(word, 0, nanoseconds(-1)), FutexResult::timed_out);
}

TEST(Futex, AnUntimedWaitEndsWhenWoken) {
  std::atomic<std::uint32_t> word{0};
  const pid_t self = ::gettid();
  std::thread waker([&] {
    EXPECT_TRUE(sleeps_soon(stat_of_thread(self))) << "the wait never slept";
    word.fetch_add(1);
    futex_wake_all(word);
  });
  const FutexResult result = futex_wait(word, 0, nanoseconds::max());
  const std::uint32_t seen = word.load();
  waker.join();
  EXPECT_EQ(result, FutexResult::woken);
  EXPECT_EQ(seen, 1U) << "returned before the waker changed the word";
}

extern "C" void on_test_signal(int /*signal*/) {}

TEST(Futex, ASignalHandlerEndsAWait) {
  struct sigaction action {};
  action.sa_handler = on_test_signal;  // no SA_RESTART: the wait ends with EINTR
  struct sigaction previous {};
  ASSERT_EQ(::sigaction(SIGUSR1, &action, &previous), 0);
  std::atomic<std::uint32_t> word{0};
  const pthread_t self = ::pthread_self();
  const pid_t tid = ::gettid();
  std::thread signaller([&] {
    EXPECT_TRUE(sleeps_soon(stat_of_thread(tid))) << "the wait never slept";
    ::pthread_kill(self, SIGUSR1);
  });
  const FutexResult result = futex_wait(word, 0, std::chrono::seconds(10));
  signaller.join();
  ::sigaction(SIGUSR1, &previous, nullptr);
  EXPECT_EQ(result, FutexResult::interrupted);
}

TEST(Futex, AnotherProcessIsWoken) {
  void* memory = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(memory, MAP_FAILED);
  auto* word = new (memory) std::atomic<std::uint32_t>(0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(10);  // never outlive a broken wake-up
    const FutexResult result = futex_wait(*word, 0, nanoseconds::max());
    ::_exit(result != FutexResult::woken ? 1 : word->load() != 1 ? 2 : 0);
  }
  const bool slept = sleeps_soon("/proc/" + std::to_string(child) + "/stat");
  word->fetch_add(1);
  futex_wake_all(*word);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::munmap(memory, 4096);
  EXPECT_TRUE(slept) << "the child's wait never slept";
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not wake (status " << status << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the child's wait ended otherwise; 2: before the change";
}

// The CPUID bit that can_claim_lines() reads is the one Linux lists as 3dnowprefetch (Intel's
// PRFCHW): on an x86 CPU without it, PREFETCHW may fault.
TEST(LineClaim, AskedOnlyWhereTheCpuHasIt) {
#if defined(__x86_64__) || defined(__i386__)
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool listed = false;
  bool read = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      read = true;
      std::istringstream flags(line.substr(line.find(':') + 1));
      for (std::string flag; flags >> flag;) {
        listed = listed || flag == "3dnowprefetch";
      }
      break;
    }
  }
  if (!read) {
    GTEST_SKIP() << "/proc/cpuinfo lists no flags here";
  }
  EXPECT_EQ(lockstep::detail::can_claim_lines(), listed);
#else
  EXPECT_TRUE(lockstep::detail::can_claim_lines());
#endif
}

// A claim is a hint: the line keeps its value, and another process's write to it is read.
TEST(LineClaim, AClaimedLineKeepsItsValueAndSeesAnotherProcessWrite) {
  if (!lockstep::detail::can_claim_lines()) {
    GTEST_SKIP() << "this CPU has no prefetch for a write";
  }
  auto* word = lockstep::testing::shared_array<std::atomic<std::uint64_t>>(1);
  word->store(41);
  lockstep::detail::claim_line(word);
  EXPECT_EQ(word->load(), 41U);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(10);
    word->store(42, std::memory_order_release);
    ::_exit(0);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (word->load(std::memory_order_acquire) != 42 && std::chrono::steady_clock::now() < until) {
    lockstep::detail::claim_line(word);
  }
  EXPECT_EQ(word->load(), 42U);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child ended: " << status;
}

}  // namespace
