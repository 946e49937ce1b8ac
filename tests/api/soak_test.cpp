// Soak: four processes per usable CPU run barriers with random delays for a while (60 s, or
// LOCKSTEP_SOAK_SECONDS), and after every barrier each checks that every process has entered the
// round (an early pass) and none has run two rounds ahead. It prints what it counted.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <lockstep/lockstep.hpp>
#include <random>
#include <string>
#include <thread>

#include "base/proc.hpp"  // usable_cpus
#include "ranks.hpp"

namespace {

using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::run_ranks;
using lockstep::testing::shared_array;
using Clock = std::chrono::steady_clock;

double soak_seconds() {
  const char* value = std::getenv("LOCKSTEP_SOAK_SECONDS");  // NOLINT(concurrency-mt-unsafe)
  return value != nullptr ? std::atof(value) : 60.0;
}

struct alignas(64) Counter {
  std::atomic<std::int64_t> value;
};

TEST(Soak, OversubscribedRandomDelaysNoEarlyPass) {
  const int processes = std::max(8, 4 * lockstep::detail::usable_cpus());
  const double seconds = soak_seconds();
  auto* round = shared_array<Counter>(static_cast<std::size_t>(processes));
  auto* stop = shared_array<std::atomic<int>>(1);
  auto* early = shared_array<std::atomic<std::int64_t>>(1);
  auto* rounds_done = shared_array<std::atomic<std::int64_t>>(1);
  Job job = Job::of(processes);
  job.limit = std::chrono::seconds(static_cast<long>(seconds) + 120);
  const auto start = Clock::now();
  auto ends = run_ranks(job, [&](int rank) {
    lockstep::State state;
    std::mt19937 random(static_cast<unsigned>(rank) * 2654435761U + 1U);
    for (std::int64_t r = 1;; ++r) {
      round[rank].value.store(r, std::memory_order_relaxed);
      const auto dice = random() % 100;
      if (dice == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 500));
      } else if (dice == 1) {
        std::this_thread::yield();
      }
      if (dice == 2) {
        state.wait_for_everyone(std::chrono::seconds(60));  // the timed form, never timing out
      } else {
        state.wait_for_everyone();
      }
      // Nobody can be past the second barrier below, so every process must be in round r.
      for (int p = 0; p < processes; ++p) {
        if (round[p].value.load(std::memory_order_relaxed) != r) {
          early->fetch_add(1);
        }
      }
      // Rank 0 decides to stop before the second barrier; everyone reads it after.
      if (rank == 0 && Clock::now() - start > std::chrono::duration<double>(seconds)) {
        stop->store(1);
      }
      state.wait_for_everyone();
      if (stop->load() != 0) {
        if (rank == 0) {
          rounds_done->store(r);
        }
        return;
      }
    }
  });
  EXPECT_EQ(failures(ends), "");
  std::cout << "soak: " << processes << " processes on " << lockstep::detail::usable_cpus()
            << " CPUs for " << std::chrono::duration<double>(Clock::now() - start).count()
            << " s: " << rounds_done->load() * 2 << " barriers each, " << early->load()
            << " early passes" << std::endl;
  EXPECT_EQ(early->load(), 0);
  EXPECT_GT(rounds_done->load(), 0);
}

}  // namespace
