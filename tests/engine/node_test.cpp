// The node engine on its own: lib/src/engine and the rooms below it (base, waiting, job), linked
// without membership, the backends, the GPU room or the public State (tests/meson.build). What
// tests/model/barrier.pml checks in the model, on real processes: no process returns from an
// episode before every process has arrived at it (many rounds, more processes than CPUs, random
// delays, every policy), and a process that dies before it arrives is reported, not waited for.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>
#include <csignal>

#include <array>
#include <atomic>
#include <bitset>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "base/proc.hpp"
#include "engine/node_barrier.hpp"
#include "engine/peer_watch.hpp"
#include "engine/placement.hpp"
#include "engine/segment.hpp"
#include "job/job_config.hpp"
#include "lockstep/error.hpp"
#include "ranks.hpp"
#include "waiting/waiter.hpp"

namespace {

using lockstep::WaitPolicy;
using lockstep::detail::CallAt;
using lockstep::detail::CallKind;
using lockstep::detail::CallLog;
using lockstep::detail::CrossNodeStep;
using lockstep::detail::JobConfig;
using lockstep::detail::NodeBarrier;
using lockstep::detail::NodeSegment;
using lockstep::detail::PeerWatch;
using lockstep::detail::Waiter;
using lockstep::detail::WaitShape;
using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::run_ranks;
using lockstep::testing::shared_array;
using Clock = std::chrono::steady_clock;

JobConfig node_job(int rank, int processes, const std::string& id, WaitPolicy policy) {
  JobConfig job;
  job.source = "node_test";
  job.rank = rank;
  job.world_size = processes;
  job.local_rank = rank;
  job.local_size = processes;
  job.identity = "node-test:" + id;
  job.wait_policy = policy;
  job.join_timeout = std::chrono::seconds(30);
  return job;
}

std::string fresh_id() {
  static int count = 0;
  return std::to_string(::getpid()) + "-" + std::to_string(++count);
}

// One rank's node engine as these tests make it: its segment, its peer watch where `watched`,
// its waiter and its barrier (which uses the watch).
struct RankEngine {
  RankEngine(int rank, int processes, const std::string& id, WaitPolicy policy,
             bool watched = false)
      : segment(NodeSegment::join(node_job(rank, processes, id, policy))),
        watch(watched ? PeerWatch::start(*segment) : nullptr),
        waiter(policy, WaitShape{processes, lockstep::detail::usable_cpus(), false}),
        barrier(*segment, waiter, CrossNodeStep{}, false, watch.get()) {}
  std::unique_ptr<NodeSegment> segment;
  std::unique_ptr<PeerWatch> watch;
  Waiter waiter;
  NodeBarrier barrier;
};

class NodeEngine : public ::testing::TestWithParam<WaitPolicy> {};

TEST_P(NodeEngine, NoProcessLeavesAnEpisodeBeforeEveryoneArrived) {
  const WaitPolicy policy = GetParam();
  const int processes = 2 * static_cast<int>(std::thread::hardware_concurrency()) + 1;
  constexpr int kRounds = 400;
  auto* arrived = shared_array<std::atomic<int>>(kRounds);
  auto* early = shared_array<std::atomic<int>>(1);
  const std::string id = fresh_id();
  Job job = Job::of(processes);
  job.plain = true;
  auto ends = run_ranks(job, [&](int rank) {
    RankEngine engine(rank, processes, id, policy);
    NodeBarrier& barrier = engine.barrier;
    std::mt19937 random(static_cast<unsigned>(rank) * 7919U + 1U);
    for (int round = 0; round < kRounds; ++round) {
      if (random() % 4 == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 300));
      }
      arrived[round].fetch_add(1);
      barrier.arrive_and_wait(Clock::now() + std::chrono::seconds(30), "node test");
      if (arrived[round].load() != processes) {
        early->fetch_add(1);
      }
    }
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_EQ(early->load(), 0) << "returns from an episode before every process had arrived";
}

// A plain wait whose entry is deferred (its waits are short, as between SMT siblings) still
// leaves each call's entry, in order, with its place; and one whose wait lasts writes its entry
// before it spins on, so that the others see where it waits while it does.
TEST_P(NodeEngine, ADeferredEntryIsWrittenForEveryCallAndBeforeAWaitLasts) {
  const WaitPolicy policy = GetParam();
  constexpr int kProcesses = 2;
  constexpr int kRounds = 200;  // fewer than one timed wait in kShortWaitSample: stays deferred
  const std::string id = fresh_id();
  Job job = Job::of(kProcesses);
  job.plain = true;
  auto ends = run_ranks(job, [&](int rank) {
    RankEngine engine(rank, kProcesses, id, policy);
    NodeBarrier& barrier = engine.barrier;
    barrier.defer_entries(true);
    static constexpr lockstep::SourceLocation kLoop("loop.cpp", 11, "train");
    for (int round = 0; round < kRounds; ++round) {
      barrier.arrive_and_wait(Clock::now() + std::chrono::seconds(30), "node test",
                              CallAt(CallKind::wait, kLoop));
    }
    RANK_CHECK(barrier.defers_entries());
    barrier.arrive_and_wait(Clock::now() + std::chrono::seconds(30), "node test");
    // Each process reads its own log: a peer's may already hold the next call's entry.
    const std::span<const CallLog> node(engine.segment->call_logs());
    const auto calls = lockstep::detail::recent_calls(node, rank);
    RANK_CHECK(calls.size() == lockstep::detail::kCallRing);
    for (std::size_t i = 0; i + 1 < calls.size(); ++i) {  // the loop's last calls
      RANK_CHECK(calls[i].episode == kRounds - calls.size() + 1 + i);
      RANK_CHECK(calls[i].kind == CallKind::wait && calls[i].line == 11);
      RANK_CHECK(calls[i].file == "loop.cpp" && calls[i].ended != 0);
    }
    // Rank 0 waits; rank 1 looks at where it is before arriving.
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const auto waiting = lockstep::detail::latest_call(node, 0);
      RANK_CHECK(waiting && waiting->episode == kRounds + 1 && waiting->ended == 0);
    }
    barrier.arrive_and_wait(Clock::now() + std::chrono::seconds(30), "node test",
                            CallAt(CallKind::wait, kLoop));
  });
  EXPECT_EQ(failures(ends), "");
}

TEST_P(NodeEngine, AProcessThatDiesBeforeItArrivesIsReported) {
  const WaitPolicy policy = GetParam();
  constexpr int kProcesses = 3;
  const std::string id = fresh_id();
  Job job = Job::of(kProcesses);
  job.plain = true;
  auto ends = run_ranks(job, [&](int rank) {
    RankEngine engine(rank, kProcesses, id, policy);
    NodeBarrier& barrier = engine.barrier;
    barrier.arrive_and_wait(Clock::now() + std::chrono::seconds(30), "node test");
    if (rank == 2) {
      ::_exit(0);  // dies without leaving: the others must find its pid gone
    }
    try {
      barrier.arrive_and_wait(Clock::now() + std::chrono::seconds(30), "node test");
      RANK_CHECK(false);
    } catch (const lockstep::PeerLostError& error) {
      RANK_CHECK(error.process_index() == 2);
    }
  });
  EXPECT_EQ(failures(ends), "");
}

TEST_P(NodeEngine, WatchedSleepsHaveNoTimeoutYetMissNoEpisodeAndNoDeath) {
  // Issue 24: with a watch of the peers (engine/peer_watch.hpp), a wait without a deadline
  // sleeps without a timeout. A lost wake-up would now hang for ever (the job's limit fails
  // it), and so would a death that the watch does not announce: one process dies without
  // arriving at round kDeath, and every other must hear of it.
  const WaitPolicy policy = GetParam();
  const int processes = 2 * static_cast<int>(std::thread::hardware_concurrency()) + 1;
  const int victim = processes - 1;
  constexpr int kRounds = 400;
  constexpr int kDeath = 300;
  auto* arrived = shared_array<std::atomic<int>>(kRounds);
  auto* early = shared_array<std::atomic<int>>(1);
  auto* untimed = shared_array<std::atomic<long>>(1);
  const std::string id = fresh_id();
  Job job = Job::of(processes);
  job.plain = true;
  job.limit = std::chrono::seconds(40);
  auto ends = run_ranks(job, [&](int rank) {
    RankEngine engine(rank, processes, id, policy, true);
    RANK_CHECK(engine.watch != nullptr && !engine.watch->alarmed());
    NodeBarrier& barrier = engine.barrier;
    std::mt19937 random(static_cast<unsigned>(rank) * 7919U + 3U);
    for (int round = 0; round < kRounds; ++round) {
      if (random() % 4 == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 300));
      }
      if (rank == victim && round == kDeath) {
        ::kill(::getpid(), SIGKILL);  // dies without leaving or arriving
      }
      arrived[round].fetch_add(1);
      try {
        barrier.arrive_and_wait(std::nullopt, "node test");
      } catch (const lockstep::PeerLostError& error) {
        RANK_CHECK(round == kDeath && error.process_index() == victim);
        untimed->fetch_add(static_cast<long>(engine.waiter.stats().untimed_blocks));
        return;
      }
      if (arrived[round].load() != processes) {
        early->fetch_add(1);
      }
    }
    RANK_CHECK(false);  // past the round where a peer died
  });
  EXPECT_EQ(failures(ends, victim), "");
  EXPECT_EQ(early->load(), 0) << "returns from an episode before every process had arrived";
  if (policy == WaitPolicy::block) {
    EXPECT_GT(untimed->load(), 0) << "no sleep went without a timeout: the watch was not used";
  }
}

TEST(PeerWatch, APeerThatExitedBeforeTheWatchStartedAlarmsIt) {
  // The watch opens each peer's pidfd after the rendezvous; a peer gone by then (its pid may
  // be another process's already) must not be taken as watched.
  const std::string id = fresh_id();
  Job job = Job::of(2);
  job.plain = true;
  auto* joined = shared_array<std::atomic<int>>(1);
  auto ends = run_ranks(job, [&](int rank) {
    auto segment = NodeSegment::join(node_job(rank, 2, id, WaitPolicy::block));
    if (rank == 1) {
      ::kill(::getpid(), SIGKILL);
    }
    while (::kill(::getppid(), 0) == 0 && joined->load() == 0) {
      // Until the peer is a zombie: its pid no longer runs it.
      if (lockstep::detail::process_liveness(static_cast<pid_t>(segment->slot(1).pid.load()),
                                             segment->slot(1).start_time.load()) ==
          lockstep::detail::Liveness::dead) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    auto watch = PeerWatch::start(*segment);
    RANK_CHECK(watch == nullptr || watch->alarmed());
  });
  EXPECT_EQ(failures(ends, 1), "");
}

// The CPU a process moves to: the usable one with the fewest of the node's processes, and only
// where the move evens them out (two fewer than its own, which counts it).
TEST(Placement, AProcessMovesOnlyWhereItsMoveEvensTheCpusOut) {
  using lockstep::detail::emptier_cpu;
  using lockstep::detail::kMaxCpus;
  std::bitset<kMaxCpus> usable;
  usable.set(0).set(1).set(2).set(3);
  std::array<std::uint16_t, 4> on{3, 1, 2, 1};
  EXPECT_EQ(emptier_cpu(on, 0, usable), 1) << "the fewest, the lowest number of those";
  EXPECT_EQ(emptier_cpu(on, 2, usable), -1) << "2 against 1: a move would trade places";
  on = {2, 2, 2, 2};
  EXPECT_EQ(emptier_cpu(on, 3, usable), -1);
  on = {4, 0, 0, 0};
  usable.reset(1).reset(2);
  EXPECT_EQ(emptier_cpu(on, 0, usable), 3) << "only a CPU of its affinity";
  usable.reset(3);
  EXPECT_EQ(emptier_cpu(on, 0, usable), -1) << "nowhere else to go";
  usable.set(600);
  EXPECT_EQ(emptier_cpu(on, 0, usable), 600) << "a CPU past the counts holds none of them";
}

// NodeBarrier::spread moves the highest slot of a crowded CPU to the emptier one, now, and leaves
// its affinity mask as it was; a lower slot there stays. Each process's CPU record is written
// here as its spread would find it (no barrier runs in between to write its own).
TEST(Placement, TheHighestSlotOfACrowdedCpuMovesAndKeepsItsMask) {
  if (lockstep::detail::usable_cpus() < 2) {
    GTEST_SKIP() << "one usable CPU: nowhere to move";
  }
  constexpr int kProcesses = 3;
  const std::string id = fresh_id();
  Job job = Job::of(kProcesses);
  job.plain = true;
  auto* step = shared_array<std::atomic<int>>(1);
  auto ends = run_ranks(job, [&](int rank) {
    RankEngine engine(rank, kProcesses, id, WaitPolicy::adaptive);
    const auto record = [&](int slot, int cpu) { engine.segment->slot(slot).cpu.store(cpu); };
    const auto mask = lockstep::detail::affinity();
    if (rank == 1) {  // below slot 2: stays, wherever the kernel runs it
      for (int attempt = 0; attempt < 20; ++attempt) {
        const int here = ::sched_getcpu();
        record(0, here);
        record(2, here);
        engine.barrier.spread();
        RANK_CHECK(engine.barrier.moves() == 0);
      }
      step->store(1);
    }
    if (rank == 2) {
      while (step->load() == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      int here = -1;
      // Retried only where the kernel moved it between the records and the look (it then ran
      // alone on its CPU).
      for (int attempt = 0; attempt < 100 && engine.barrier.moves() == 0; ++attempt) {
        here = ::sched_getcpu();
        record(0, here);
        record(1, here);
        engine.barrier.spread();
      }
      RANK_CHECK(engine.barrier.moves() == 1);
      const int target = engine.segment->slot(2).cpu.load();
      RANK_CHECK(::sched_getcpu() == target);
      RANK_CHECK(target != here && mask[static_cast<std::size_t>(target)]);
      RANK_CHECK(lockstep::detail::affinity() == mask);
      step->store(2);
    }
    while (step->load() != 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  EXPECT_EQ(failures(ends), "");
}

INSTANTIATE_TEST_SUITE_P(Policies, NodeEngine,
                         ::testing::Values(WaitPolicy::adaptive, WaitPolicy::spin,
                                           WaitPolicy::block),
                         [](const auto& info) {
                           switch (info.param) {
                             case WaitPolicy::spin:
                               return std::string("spin");
                             case WaitPolicy::block:
                               return std::string("block");
                             default:
                               return std::string("adaptive");
                           }
                         });

}  // namespace
