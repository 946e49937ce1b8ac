// Issue 44: a wait that lasts or fails says where each process is: the late one's last call and
// how long ago it returned, the waiters' sites, and the last episode met from different places.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <lockstep/lockstep.hpp>
#include <stdexcept>
#include <string>
#include <thread>

#include "ranks.hpp"

namespace {

using lockstep::testing::contains;
using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::run_ranks;
using lockstep::testing::shared_array;

constexpr const char* kFile = "whereabouts_test.cpp:";

std::string at(int line) {
  return std::string(kFile) + std::to_string(line);
}

std::string read_and_remove(const std::string& path) {
  std::ifstream file(path);
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ::unlink(path.c_str());
  return text;
}

TEST(Whereabouts, ATimeoutNamesTheLateProcessesLastCallAndTheWaitersSite) {
  auto ends = run_ranks(Job::of(3), [](int rank) {
    lockstep::State state;
    const int first = __LINE__ + 1;
    state.wait_for_everyone();
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    } else {
      const int timed = __LINE__ + 2;
      try {
        state.wait_for_everyone(std::chrono::milliseconds(300));
        RANK_CHECK(false);  // process 2 sleeps
      } catch (const lockstep::TimeoutError& error) {
        const std::string text = error.what();
        RANK_CHECK(contains(text,
                            "process 2 of 3 had not arrived; process 2 is not in a lockstep "
                            "call: it returned from wait_for_everyone at " +
                                at(first) + " (episode 0) "));
        RANK_CHECK(contains(text, " in wait_for_everyone at " + at(timed) + " (episode 1)"));
      }
    }
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
}

// The hang users meet most: a wait that only the main process makes. Its first episode pairs
// the main process's extra wait with the other's common one; the stall notice of the next names
// the late process's last call and both places of the episode they met at apart.
TEST(Whereabouts, AStallNoticeNamesBothPlacesOfAMismatchedBarrier) {
  Job job = Job::of(2);
  job.env["LOCKSTEP_STALL_WARNING"] = "0.3";
  const std::string base = "/tmp/lockstep-where-" + std::to_string(::getpid()) + "-";
  int* lines = shared_array<int>(2);  // the two places, as the ranks see them
  auto ends = run_ranks(job, [&](int rank) {
    const std::string path = base + std::to_string(rank);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    RANK_CHECK(fd >= 0 && ::dup2(fd, STDERR_FILENO) == STDERR_FILENO);
    lockstep::State state;
    lines[0] = __LINE__ + 2;
    if (state.is_main_process()) {
      state.wait_for_everyone();
    }
    lines[1] = __LINE__ + 1;
    state.wait_for_everyone();
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1200));
      state.wait_for_everyone();  // meets the main process's common wait
    }
  });
  EXPECT_EQ(failures(ends), "");
  const int main_only = lines[0];
  const int common = lines[1];
  const std::string text = read_and_remove(base + "0");
  EXPECT_TRUE(contains(text, "wait_for_everyone has waited 0.3 s for process 1 of 2 (pid "))
      << text;
  EXPECT_TRUE(contains(text,
                       "; process 1 is not in a lockstep call: it returned from "
                       "wait_for_everyone at " +
                           at(common) + " (episode 0) "))
      << text;
  EXPECT_TRUE(
      contains(text, "; process 0 waits in wait_for_everyone at " + at(common) + " (episode 1)"))
      << text;
  EXPECT_TRUE(contains(text,
                       "; episode 0 met at different places: process 0 in "
                       "wait_for_everyone at " +
                           at(main_only) + ", process 1 in wait_for_everyone at " + at(common) +
                           ";"))
      << text;
  EXPECT_EQ(read_and_remove(base + "1"), "") << "process 1 never waited long";
}

TEST(Whereabouts, APeerLostErrorNamesTheLostProcessesLastCall) {
  auto ends = run_ranks(Job::of(2), [](int rank) {
    lockstep::State state;
    const int both = __LINE__ + 1;
    state.wait_for_everyone();
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ::_exit(0);  // dies without leaving
    }
    const int second = __LINE__ + 2;
    try {
      state.wait_for_everyone();
      RANK_CHECK(false);
    } catch (const lockstep::PeerLostError& error) {
      const std::string text = error.what();
      RANK_CHECK(contains(text, "process 1 had last been in wait_for_everyone at " + at(both) +
                                    " (episode 0), which returned "));
      RANK_CHECK(contains(
          text, "; process 0 waits in wait_for_everyone at " + at(second) + " (episode 1)"));
    }
  });
  EXPECT_EQ(failures(ends), "");
}

// main_process_first's two sides are named as such, at the guard's place.
TEST(Whereabouts, MainProcessFirstIsNamedByItsSide) {
  Job job = Job::of(2);
  job.env["LOCKSTEP_STALL_WARNING"] = "0.3";
  const std::string base = "/tmp/lockstep-first-" + std::to_string(::getpid()) + "-";
  int* guard = shared_array<int>(1);
  auto ends = run_ranks(job, [&](int rank) {
    const std::string path = base + std::to_string(rank);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    RANK_CHECK(fd >= 0 && ::dup2(fd, STDERR_FILENO) == STDERR_FILENO);
    lockstep::State state;
    *guard = __LINE__ + 2;
    {
      auto first = state.main_process_first();
      if (rank == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
      }
    }
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_EQ(read_and_remove(base + "0"), "");
  const std::string text = read_and_remove(base + "1");
  EXPECT_TRUE(contains(text,
                       "; process 1 waits in main_process_first (waiting for the main "
                       "process) at " +
                           at(*guard) + " (episode 0)"))
      << text;
  EXPECT_TRUE(contains(text,
                       "process 0 is not in a lockstep call: it returned from joining the "
                       "job at "))
      << text;
}

// A main_process_first block that raised on the main process, caught outside it: its next wait
// meets the others' guard. The others fail at once, naming both calls; the main process at its
// next call (it checks no plain wait), never passing the second.
TEST(Whereabouts, AWaitThatMeetsAnotherCallIsAnErrorEverywhere) {
  int* lines = shared_array<int>(2);
  auto ends = run_ranks(Job::of(3), [lines](int rank) {
    lockstep::State state;
    try {
      lines[0] = __LINE__ + 1;
      auto first = state.main_process_first();
      if (rank == 0) {
        throw std::runtime_error("the download failed");
      }
    } catch (const std::runtime_error& error) {
      RANK_CHECK(rank == 0 || contains(error.what(), "met from different calls"));
    }
    try {
      lines[1] = __LINE__ + 1;
      state.wait_for_everyone();
      state.wait_for_everyone();
      RANK_CHECK(false);  // nobody passes both
    } catch (const lockstep::Error& error) {
      const std::string text = error.what();
      RANK_CHECK(contains(text,
                          "episode 0 met from different calls: process 0 in "
                          "wait_for_everyone at " +
                              at(lines[1]) +
                              ", processes 1, 2 in main_process_first (waiting for the "
                              "main process) at " +
                              at(lines[0]) + " ("));
    }
  });
  EXPECT_EQ(failures(ends), "");
}

// Issue 46: a gather that meets a plain wait (a branch the main process took) is an error on the
// gathering processes at once, naming both calls, and the waiter never passes its next wait.
TEST(Whereabouts, AGatherThatMeetsAWaitIsAnErrorEverywhere) {
  int* lines = shared_array<int>(2);
  auto ends = run_ranks(Job::of(3), [lines](int rank) {
    lockstep::State state;
    try {
      if (rank == 0) {
        lines[0] = __LINE__ + 1;
        state.wait_for_everyone();
        state.wait_for_everyone();
      } else {
        lines[1] = __LINE__ + 1;
        (void)state.gather_object(std::string("results"));
      }
      RANK_CHECK(false);  // nobody passes
    } catch (const lockstep::Error& error) {
      const std::string text = error.what();
      RANK_CHECK(rank == 0 || contains(text,
                                       "episode 0 met from different calls: process 0 in "
                                       "wait_for_everyone at " +
                                           at(lines[0]) + ", processes 1, 2 in gather_object at " +
                                           at(lines[1]) + " ("));
    }
  });
  EXPECT_EQ(failures(ends), "");
}

// LOCKSTEP_CHECK=strict: waits at two places of one call are an error too, on every process.
TEST(Whereabouts, StrictChecksThePlaceOnEveryProcess) {
  Job job = Job::of(2);
  job.env["LOCKSTEP_CHECK"] = "strict";
  int* lines = shared_array<int>(2);
  auto ends = run_ranks(job, [lines](int rank) {
    lockstep::State state;
    state.wait_for_everyone();  // one place: fine
    try {
      if (rank == 0) {
        lines[0] = __LINE__ + 1;
        state.wait_for_everyone();
      } else {
        lines[1] = __LINE__ + 1;
        state.wait_for_everyone();
      }
      RANK_CHECK(false);
    } catch (const lockstep::Error& error) {
      RANK_CHECK(contains(error.what(),
                          "episode 1 met at different places: process 0 in "
                          "wait_for_everyone at " +
                              at(lines[0]) + ", process 1 in wait_for_everyone at " + at(lines[1]) +
                              " (LOCKSTEP_CHECK=strict"));
    }
  });
  EXPECT_EQ(failures(ends), "");
}

// LOCKSTEP_LOG: a failed call logs every process's flight record (its last calls).
TEST(Whereabouts, AFailedCallLogsTheFlightRecords) {
  Job job = Job::of(2);
  job.env["LOCKSTEP_LOG"] = "info";
  const std::string base = "/tmp/lockstep-flight-" + std::to_string(::getpid()) + "-";
  int* lines = shared_array<int>(2);
  auto ends = run_ranks(job, [&](int rank) {
    const std::string path = base + std::to_string(rank);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    RANK_CHECK(fd >= 0 && ::dup2(fd, STDERR_FILENO) == STDERR_FILENO);
    lockstep::State state;
    lines[0] = __LINE__ + 1;
    state.wait_for_everyone();
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
    } else {
      lines[1] = __LINE__ + 1;
      RANK_CHECK(!state.try_wait_for_everyone());  // a try in the record too (1 sleeps)
      try {
        state.wait_for_everyone(std::chrono::milliseconds(100));
        RANK_CHECK(false);
      } catch (const lockstep::TimeoutError&) {
      }
    }
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
  const std::string text = read_and_remove(base + "0");
  (void)read_and_remove(base + "1");
  EXPECT_TRUE(contains(text, "flight record of process 1 of 2 (pid ")) << text;
  EXPECT_TRUE(
      contains(text, std::string("), its last 2 calls, oldest first: joining the job at ") + kFile))
      << text;
  EXPECT_TRUE(contains(text, "; wait_for_everyone at " + at(lines[0]) + " (episode 0), began "))
      << text;
  EXPECT_TRUE(contains(text, "flight record of process 0 of 2 (pid ")) << text;
  EXPECT_TRUE(contains(text, "wait_for_everyone at " + at(lines[1]) + " (episode 1), began "))
      << text;
  EXPECT_TRUE(contains(text, " ago, gave up its quick try after ")) << text;
  EXPECT_TRUE(contains(text, " ago, timed out after ")) << text;
}

TEST(Whereabouts, ABadCheckSettingIsRefused) {
  Job job = Job::of(2);
  job.env["LOCKSTEP_CHECK"] = "pedantic";
  auto ends = run_ranks(job, [](int) {
    try {
      lockstep::State state;
      RANK_CHECK(false);
    } catch (const lockstep::ConfigError& error) {
      RANK_CHECK(contains(error.what(), "LOCKSTEP_CHECK"));
      RANK_CHECK(contains(error.what(), "is not one of kinds, strict"));
    }
  });
  EXPECT_EQ(failures(ends), "");
}

}  // namespace
