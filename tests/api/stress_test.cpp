// Many consecutive barriers: nobody may pass early, whatever the policy, the delays or the load.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <lockstep/lockstep.hpp>
#include <random>
#include <thread>

#include "ranks.hpp"

namespace {

using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::run_ranks;
using lockstep::testing::shared_array;

struct StressCase {
  int processes;
  const char* policy;
  int rounds;
  bool random_delays;
};

class BarrierStress : public ::testing::TestWithParam<StressCase> {};

// Each round, every process increments a shared counter, then waits. After round r's barrier
// the counter must hold at least (r + 1) * n increments (everyone arrived) and at most
// (r + 2) * n (nobody is two rounds ahead). Relaxed accesses: only the barrier orders them.
TEST_P(BarrierStress, NobodyLeavesBeforeTheLastArrives) {
  const StressCase param = GetParam();
  auto* counter = shared_array<std::atomic<std::uint64_t>>(1);
  auto* seconds = shared_array<double>(1);
  Job job = Job::of(param.processes);
  job.env["LOCKSTEP_WAIT_POLICY"] = param.policy;
  job.limit = std::chrono::seconds(240);
  auto ends = run_ranks(job, [&](int rank) {
    lockstep::State state;
    const auto n = static_cast<std::uint64_t>(state.num_processes());
    std::mt19937 random(static_cast<unsigned>(rank) * 7919U + 1U);
    std::uniform_int_distribution<int> chance(0, 15);
    std::uniform_int_distribution<int> micros(0, 300);
    state.wait_for_everyone();
    auto start = std::chrono::steady_clock::now();
    for (int round = 0; round < param.rounds; ++round) {
      if (param.random_delays) {
        int roll = chance(random);
        if (roll == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(micros(random)));
        } else if (roll == 1) {
          std::this_thread::yield();
        }
      }
      counter->fetch_add(1, std::memory_order_relaxed);
      state.wait_for_everyone();
      std::uint64_t seen = counter->load(std::memory_order_relaxed);
      const auto r = static_cast<std::uint64_t>(round);
      if (seen < (r + 1) * n || seen > (r + 2) * n) {
        throw std::logic_error("round " + std::to_string(round) + ": counter " +
                               std::to_string(seen) + " outside [" + std::to_string((r + 1) * n) +
                               ", " + std::to_string((r + 2) * n) + "]");
      }
    }
    if (rank == 0) {
      *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  });
  ASSERT_EQ(failures(ends), "");
  EXPECT_EQ(counter->load(), static_cast<std::uint64_t>(param.rounds) * param.processes);
  double per_barrier_us = *seconds * 1e6 / param.rounds;
  std::printf("stress N=%d policy=%s%s: %d barriers in %.3f s: %.2f us per barrier, %.0f/s\n",
              param.processes, param.policy, param.random_delays ? " (random delays)" : "",
              param.rounds, *seconds, per_barrier_us, param.rounds / *seconds);
  RecordProperty("us_per_barrier", std::to_string(per_barrier_us));
}

INSTANTIATE_TEST_SUITE_P(
    Rounds, BarrierStress,
    ::testing::Values(StressCase{2, "adaptive", 100'000, false},
                      StressCase{4, "adaptive", 100'000, false},
                      StressCase{8, "adaptive", 100'000, false},
                      StressCase{2, "spin", 100'000, false}, StressCase{2, "block", 20'000, false},
                      StressCase{4, "block", 20'000, false}, StressCase{4, "adaptive", 5'000, true},
                      StressCase{8, "adaptive", 3'000, true},
                      StressCase{16, "adaptive", 3'000, true}, StressCase{8, "block", 3'000, true}),
    [](const auto& info) {
      return "N" + std::to_string(info.param.processes) + "_" + info.param.policy +
             (info.param.random_delays ? "_random_delays" : "");
    });

}  // namespace
