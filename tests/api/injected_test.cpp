// Fault injection: a process SIGKILLs itself at each step of joining, waiting and leaving
// (LOCKSTEP_FAULT_POINT, see lib/src/base/fault_points.hpp). The survivors must end, with an error
// naming it or, where it died after everyone needed it, normally; within the detection bound, never
// hanging. A new job with the same identity must then start cleanly, and nothing may be left
// in /dev/shm.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <lockstep/lockstep.hpp>
#include <string>
#include <thread>

#include "engine/segment.hpp"
#include "job/launch_env.hpp"
#include "ranks.hpp"

namespace {

using lockstep::testing::contains;
using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::run_ranks;
using lockstep::testing::shared_array;
using Clock = std::chrono::steady_clock;

constexpr int kProcesses = 4;
constexpr int kVictim = 2;
constexpr int kRounds = 10;

// How a survivor ended.
enum Outcome : int { kPassed = 1, kLost = 2, kTimedOut = 3, kOther = 4 };

struct Point {
  const char* spec;  // LOCKSTEP_FAULT_POINT for the victim
  bool may_pass;     // whether survivors may finish normally (it died after they needed it)
  // Whether the point is on a waiter's path only (not the last arrival's): then the others come
  // a moment later to every barrier, so that the victim waits (on a 2-vCPU host it was the last
  // to arrive in 8 or more rounds of 10, never reached barrier.waiting a third time, and exited
  // normally).
  bool victim_waits = false;
};

class Injected : public ::testing::TestWithParam<Point> {};

TEST_P(Injected, SurvivorsGetAnErrorAndTheNextJobStartsCleanly) {
  const Point point = GetParam();
  const std::string id = lockstep::testing::unique_job_id("injected");
  auto* outcome = shared_array<int>(kProcesses);
  auto* seconds = shared_array<double>(kProcesses);
  // The message of an unexpected error, per rank, for the failure's line.
  constexpr std::size_t kMessage = 512;
  auto* messages = shared_array<char>(kProcesses * kMessage);
  auto keep = [&](int rank, const char* what) {
    (void)std::snprintf(messages + static_cast<std::size_t>(rank) * kMessage, kMessage, "%s", what);
  };
  Job job = Job::of(kProcesses, id);
  // NAME@RANK[:N]
  std::string spec = point.spec;
  const auto colon = spec.find(':');
  spec.insert(colon == std::string::npos ? spec.size() : colon, "@" + std::to_string(kVictim));
  job.env["LOCKSTEP_FAULT_POINT"] = spec;
  job.env["LOCKSTEP_JOIN_TIMEOUT"] = "3";
  job.limit = std::chrono::seconds(30);
  auto ends = run_ranks(job, [&](int rank) {
    const auto start = Clock::now();
    try {
      lockstep::State state;
      for (int round = 0; round < kRounds; ++round) {
        if (point.victim_waits && rank != kVictim) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        state.wait_for_everyone();
      }
      outcome[rank] = kPassed;
    } catch (const lockstep::PeerLostError& error) {
      outcome[rank] = error.process_index() == kVictim ? kLost : kOther;
      keep(rank, error.what());
    } catch (const lockstep::TimeoutError& error) {
      // The victim died before claiming a slot: only the join timeout can tell.
      outcome[rank] = contains(error.what(), "never joined") ? kTimedOut : kOther;
      keep(rank, error.what());
    } catch (const lockstep::Error& error) {
      outcome[rank] = kOther;
      keep(rank, error.what());
    }
    seconds[rank] = std::chrono::duration<double>(Clock::now() - start).count();
  });
  EXPECT_EQ(failures(ends, kVictim), "") << point.spec;
  for (int rank = 0; rank < kProcesses; ++rank) {
    if (rank == kVictim) {
      continue;
    }
    EXPECT_TRUE(outcome[rank] == kLost || outcome[rank] == kTimedOut ||
                (point.may_pass && outcome[rank] == kPassed))
        << point.spec << ": rank " << rank << " ended with outcome " << outcome[rank] << " ("
        << messages + static_cast<std::size_t>(rank) * kMessage << ")";
    // Detection bound: 0.1 s polls; 3 s where only the join timeout can tell.
    EXPECT_LT(seconds[rank], 5.0) << point.spec << ": rank " << rank;
  }
  // The same identity again: it starts cleanly and leaves nothing behind.
  Job again = Job::of(kProcesses, id);
  auto second = run_ranks(again, [](int) {
    lockstep::State state;
    for (int round = 0; round < kRounds; ++round) {
      state.wait_for_everyone();
    }
  });
  EXPECT_EQ(failures(second), "") << point.spec;
  EXPECT_TRUE(lockstep::testing::shm_entries(
                  lockstep::detail::segment_name(lockstep::detail::job_identity(id), 0))
                  .empty())
      << point.spec;
}

INSTANTIATE_TEST_SUITE_P(
    EveryStep, Injected,
    ::testing::Values(Point{"join.locked", false}, Point{"join.claimed", false},
                      Point{"join.joined", false}, Point{"barrier.arrived:3", false},
                      Point{"barrier.waiting:3", false, true}, Point{"barrier.passed:3", false},
                      Point{"barrier.passed:10", true}, Point{"leave.marked", true}),
    [](const auto& info) {
      std::string name = info.param.spec;
      for (char& c : name) {
        if (c == '.' || c == ':') {
          c = '_';
        }
      }
      return name;
    });

TEST(FaultPoint, AMalformedSpecIsAConfigError) {
  Job job = Job::of(1);
  job.env["LOCKSTEP_FAULT_POINT"] = "barrier.passed:zero";
  auto ends = run_ranks(job, [](int) {
    lockstep::testing::expect_join_error<lockstep::ConfigError>([] { lockstep::State state; },
                                                                "LOCKSTEP_FAULT_POINT");
  });
  EXPECT_EQ(failures(ends), "");
}

}  // namespace
