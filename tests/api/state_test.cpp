// lockstep::State in real processes: queries, wrappers, guards and the barrier, N = 1, 2, 4, 8.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <lockstep/lockstep.hpp>
#include <string>
#include <thread>
#include <vector>

#include "membership/context.hpp"
#include "pattern.hpp"
#include "ranks.hpp"

namespace {

using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::pattern;
using lockstep::testing::run_ranks;
using lockstep::testing::shared_array;

class StateTest : public ::testing::TestWithParam<int> {
 protected:
  Job job() const {
    Job job;
    job.processes = GetParam();
    job.plain = GetParam() == 1;  // one process: no job variables at all
    return job;
  }
};

TEST_P(StateTest, QueriesDescribeTheJob) {
  const int n = GetParam();
  auto ends = run_ranks(job(), [n](int rank) {
    lockstep::State state;
    RANK_CHECK(state.process_index() == rank);
    RANK_CHECK(state.local_process_index() == rank);
    RANK_CHECK(state.num_processes() == n);
    RANK_CHECK(state.num_local_processes() == n);
    RANK_CHECK(state.node_index() == 0);
    RANK_CHECK(state.num_nodes() == 1);
    RANK_CHECK(state.is_main_process() == (rank == 0));
    RANK_CHECK(state.is_local_main_process() == (rank == 0));
    RANK_CHECK(state.is_last_process() == (rank == n - 1));
    RANK_CHECK(state.environment_source() == (n == 1 ? "none" : "lockstep-run"));
    // Every State of a process is a handle to the same membership.
    lockstep::State again;
    RANK_CHECK(again.process_index() == rank);
    state.wait_for_everyone();
    again.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
}

TEST_P(StateTest, WrappersRunOnTheChosenProcessOnly) {
  const int n = GetParam();
  // counts[k]: how often wrapper k ran, summed over processes.
  auto* counts = shared_array<std::atomic<int>>(8 + 2 * 8);
  auto ends = run_ranks(job(), [n, counts](int rank) {
    lockstep::State state;
    state.on_main_process([&] { counts[0]++; })();
    state.on_local_main_process([&] { counts[1]++; })();
    state.on_last_process([&] { counts[2]++; })();
    for (int k = 0; k < n; ++k) {
      state.on_process(k, [&](int which) { counts[8 + which]++; })(k);
      state.on_local_process(k, [&] { counts[16 + k]++; })();
    }
    state.on_process(n, [&] { counts[3]++; })();  // no such process: never runs
    auto value = state.on_main_process([](int a, int b) { return a + b; })(2, 3);
    RANK_CHECK(value.has_value() == (rank == 0));
    RANK_CHECK(!value || *value == 5);
    auto text = state.on_last_process([rank] { return std::to_string(rank); })();
    RANK_CHECK(text.has_value() == (rank == n - 1));
    bool threw = false;
    try {
      (void)state.on_process(-1, [] {});
    } catch (const lockstep::ConfigError&) {
      threw = true;
    }
    RANK_CHECK(threw);
    state.wait_for_everyone();
  });
  ASSERT_EQ(failures(ends), "");
  EXPECT_EQ(counts[0], 1);
  EXPECT_EQ(counts[1], 1);
  EXPECT_EQ(counts[2], 1);
  EXPECT_EQ(counts[3], 0);
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(counts[8 + k], 1) << "on_process(" << k << ")";
    EXPECT_EQ(counts[16 + k], 1) << "on_local_process(" << k << ")";
  }
}

// split_between_processes in a real job: every item once, contiguous, in process order; padded
// shares all as long as the longest; print on the main process only.
TEST_P(StateTest, SplitBetweenProcessesCoversEveryItemOnce) {
  const int n = GetParam();
  constexpr int kItems = 37;
  auto* owner = shared_array<std::atomic<int>>(kItems);
  auto* lengths = shared_array<std::atomic<int>>(8);
  auto ends = run_ranks(job(), [owner, lengths](int rank) {
    lockstep::State state;
    std::vector<int> items(kItems);
    for (int i = 0; i < kItems; ++i) {
      items[static_cast<std::size_t>(i)] = i;
    }
    std::span<int> mine = state.split_between_processes(items);
    for (int item : mine) {
      owner[item].fetch_add(rank + 1);
    }
    auto padded = state.split_between_processes(items, true);
    lengths[rank].store(static_cast<int>(padded.size()));
    RANK_CHECK(std::equal(mine.begin(), mine.end(), padded.begin()));
    const std::vector<int> constant(items);
    RANK_CHECK(state.split_between_processes(constant).size() == mine.size());
    state.print("print from the main process only: ", rank);
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
  lockstep::Share previous;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(lengths[rank].load(), (kItems + n - 1) / n) << "padded share of " << rank;
    const lockstep::Share share = lockstep::split_range(kItems, n, rank);
    EXPECT_EQ(share.begin, rank == 0 ? 0 : previous.end);
    for (std::size_t item = share.begin; item < share.end; ++item) {
      EXPECT_EQ(owner[item].load(), rank + 1) << "item " << item;
    }
    previous = share;
  }
  EXPECT_EQ(previous.end, static_cast<std::size_t>(kItems));
}

TEST_P(StateTest, MainProcessFirstRunsTheMainBlockBeforeTheOthers) {
  const int n = GetParam();
  auto* order = shared_array<std::atomic<int>>(2 + 16);  // [0]: next ticket, [2+rank]: ticket
  auto ends = run_ranks(job(), [order](int) {
    lockstep::State state;
    {
      auto guard = state.main_process_first();
      if (state.is_main_process()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // give the others a chance
      }
      order[2 + state.process_index()] = order[0]++;
    }
    {
      auto guard = state.local_main_process_first();
      if (!state.is_local_main_process()) {
        RANK_CHECK(order[1].load() == 1);  // the local main finished its block
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        order[1] = 1;
      }
    }
    state.wait_for_everyone();
  });
  ASSERT_EQ(failures(ends), "");
  EXPECT_EQ(order[2], 0) << "the main process entered first";
  for (int k = 1; k < n; ++k) {
    EXPECT_GT(order[2 + k], 0);
  }
}

// Nested first blocks (TRL's local block inside the global one, the same block twice, three
// deep): every body runs on its first process, and is done there, before any other process
// enters it. Under LOCKSTEP_CHECK=strict too, which compares the places of each episode's calls.
TEST_P(StateTest, FirstBlocksNestAndEachBodyRunsFirstWhereItShould) {
  constexpr int kBodies = 7;
  auto* done = shared_array<std::atomic<int>>(kBodies);  // [k]: body k finished on its first
  for (const bool strict : {false, true}) {
    for (int k = 0; k < kBodies; ++k) {
      done[k] = 0;
    }
    Job job = this->job();
    if (strict) {
      job.env["LOCKSTEP_CHECK"] = "strict";
    }
    auto ends = run_ranks(job, [done](int rank) {
      lockstep::State state;
      // Body k: the first process sleeps a little (the others would overtake it if let in),
      // then marks it done; every other process finds it done on entry.
      const auto body = [&](int k, bool first) {
        if (first) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10 + 3 * (rank % 3)));
          done[k] = 1;
        } else {
          RANK_CHECK(done[k].load() == 1);
        }
      };
      {
        auto outer = state.main_process_first();
        {
          auto inner = state.local_main_process_first();
          body(0, state.is_local_main_process());
        }
        body(1, state.is_main_process());
      }
      {
        auto outer = state.main_process_first();
        auto inner = state.main_process_first();
        body(2, state.is_main_process());
      }
      {
        auto outer = state.local_main_process_first();
        {
          auto middle = state.main_process_first();
          {
            auto inner = state.local_main_process_first();
            body(3, state.is_local_main_process());
          }
          body(4, state.is_main_process());
        }
        body(5, state.is_local_main_process());
      }
      {
        auto guard = state.main_process_first();
        guard.end();  // ended early, then another block at once
        auto again = state.main_process_first();
        body(6, state.is_main_process());
      }
      state.wait_for_everyone();
    });
    ASSERT_EQ(failures(ends), "") << (strict ? "strict" : "default");
  }
}

TEST_P(StateTest, WaitForEveryoneHoldsEveryoneUntilTheLastArrives) {
  const int n = GetParam();
  auto* arrived = shared_array<std::atomic<int>>(1);
  auto ends = run_ranks(job(), [n, arrived](int rank) {
    lockstep::State state;
    for (int round = 0; round < 20; ++round) {
      if (rank == round % n) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the late one
      }
      arrived->fetch_add(1);
      state.wait_for_everyone();
      RANK_CHECK(arrived->load() >= (round + 1) * n);
      state.wait_for_everyone();
    }
  });
  EXPECT_EQ(failures(ends), "");
}

// The try (what the Python package's waits do first): a try that meets a late process gives up
// within about a millisecond and withdraws its arrival, so that the next call arrives anew; mixed
// with plain waits and late arrivals (up to 3 ms, beyond the try's bound), no process passes an
// episode before every process has arrived at it, and the episodes stay in step (the second
// wait of each round). A withdrawal that left the arrival counted would let a round end early.
TEST_P(StateTest, TryWaitWithdrawsWhenItGivesUpAndNeverLetsAProcessThroughEarly) {
  const int n = GetParam();
  auto* arrived = shared_array<std::atomic<int>>(1);
  auto* gave_up = shared_array<std::atomic<int>>(1);
  auto ends = run_ranks(job(), [n, arrived, gave_up](int rank) {
    lockstep::State state;
    std::uint32_t draw = 2654435761U * static_cast<std::uint32_t>(rank + 1);
    auto next = [&draw] { return draw = draw * 1664525U + 1013904223U; };
    for (int round = 0; round < 300; ++round) {
      if (next() % 4 == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(next() % 3000));
      }
      arrived->fetch_add(1);
      if (next() % 2 == 0) {
        while (!state.try_wait_for_everyone()) {
          gave_up->fetch_add(1);
        }
      } else {
        state.wait_for_everyone();
      }
      RANK_CHECK(arrived->load() >= (round + 1) * n);
      if (next() % 2 == 0) {
        while (!state.try_wait_for_everyone()) {
        }
      } else {
        state.wait_for_everyone();
      }
    }
    if (n == 1) {
      RANK_CHECK(state.try_wait_for_everyone());  // a job of one waits for nobody
    }
  });
  EXPECT_EQ(failures(ends), "");
  if (n > 1) {
    EXPECT_GT(gave_up[0].load(), 0) << "no try gave up: the withdrawal was not exercised";
  }
}

// Issue 23, issue 58: main computes, everyone uses. Many rounds of sizes on both sides of the
// segment's area (32 KiB) and well past it, the main process late in some, the others in
// others; each round's bytes differ, so a process that read before the main process wrote, or
// after the next round's write, gets the wrong bytes. No spill is left after the rounds.
TEST_P(StateTest, BroadcastGivesEveryProcessTheMainProcesssBytes) {
  const int n = GetParam();
  auto ends = run_ranks(job(), [n](int rank) {
    lockstep::State state;
    constexpr std::size_t kArea = 32768;
    for (int round = 0; round < 60; ++round) {
      const auto r = static_cast<std::size_t>(round);
      const std::size_t sizes[] = {0, r * 977 % kArea, kArea, kArea + 1, kArea + r * 4099};
      const std::string text = pattern(sizes[r % 5], r);
      const std::string mine = rank == 0 ? text : "not this: process " + std::to_string(rank);
      if (rank == round % n) {
        std::this_thread::sleep_for(std::chrono::milliseconds(round % 4));  // the late one
      }
      RANK_CHECK(state.broadcast(mine) == text);
    }
    state.wait_for_everyone();
    RANK_CHECK(lockstep::testing::spill_files().empty());
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
}

// Issue 46, issue 58: everyone's results, everywhere. Many rounds, each process's bytes
// different in size (empty, within its region of the area, one byte past it, well past it) and
// content, a late process in each round; a process that read an entry before its owner wrote it,
// or after the next round's write, gets wrong bytes. No spill is left after the rounds.
TEST_P(StateTest, GatherGivesEveryProcessEveryProcesssBytes) {
  const int n = GetParam();
  auto ends = run_ranks(job(), [n](int rank) {
    lockstep::State state;
    const std::size_t region = 32768 / static_cast<std::size_t>(n) / 8 * 8 - 16;  // inline
    const auto bytes_of = [region](int of, int round) {
      const auto k = static_cast<std::size_t>(round) * 7 + static_cast<std::size_t>(of) * 3;
      const std::size_t sizes[] = {0, k * 131 % region, region, region + 1, region + k * 997};
      return pattern(sizes[k % 5], k * 64 + static_cast<std::size_t>(of));
    };
    for (int round = 0; round < 60; ++round) {
      if (rank == round % n) {
        std::this_thread::sleep_for(std::chrono::milliseconds(round % 4));  // the late one
      }
      const std::vector<std::string> all = state.gather_object(bytes_of(rank, round));
      RANK_CHECK(all.size() == static_cast<std::size_t>(n));
      for (int of = 0; of < n && of < static_cast<int>(all.size()); ++of) {
        RANK_CHECK(all[static_cast<std::size_t>(of)] == bytes_of(of, round));
      }
    }
    state.wait_for_everyone();
    RANK_CHECK(lockstep::testing::spill_files().empty());
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
}

// Accelerate's set_trigger / check_trigger: one process's mark makes every process's check true,
// once; a check with no mark is false everywhere; a mark set by another thread counts.
TEST_P(StateTest, ATriggerSetAnywhereIsSeenEverywhereOnce) {
  const int n = GetParam();
  auto ends = run_ranks(job(), [n](int rank) {
    lockstep::State state;
    RANK_CHECK(!state.check_trigger());
    for (int round = 0; round < 20; ++round) {
      const int setter = (round * 7) % n;
      if (rank == setter) {
        if (round % 2 == 0) {
          state.set_trigger();
        } else {
          std::thread([&state] { state.set_trigger(); }).join();
        }
      }
      RANK_CHECK(state.check_trigger());
      RANK_CHECK(!state.check_trigger());
    }
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
}

INSTANTIATE_TEST_SUITE_P(Processes, StateTest, ::testing::Values(1, 2, 4, 8),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

// State::leave (torch's destroy_process_group): the others' next wait names the process that
// left; its own later calls throw; the C API's lockstep_leave is the same call.
TEST(State, LeaveOnPurposeEndsThisProcesssPartOnly) {
  auto ends = run_ranks(Job::of(3), [](int rank) {
    lockstep::State state;
    RANK_CHECK(state.use_distributed());
    state.wait_for_everyone();
    if (rank == 2) {
      state.leave();
      try {
        state.wait_for_everyone();
        RANK_CHECK(false);
      } catch (const lockstep::Error& error) {
        RANK_CHECK(std::string(error.what()).find("has left the job (State::leave") !=
                   std::string::npos);
      }
      state.leave();  // twice: nothing more
      return;
    }
    try {
      state.wait_for_everyone(std::chrono::seconds(20));
      RANK_CHECK(false);
    } catch (const lockstep::PeerLostError& error) {
      RANK_CHECK(error.process_index() == 2);
    }
  });
  EXPECT_EQ(failures(ends), "");
}

TEST(State, JobOfOneWaitsForNobody) {
  auto ends = run_ranks(Job::plain_process(), [](int) {
    lockstep::State state;
    RANK_CHECK(state.num_processes() == 1);
    state.wait_for_everyone();
    state.wait_for_everyone(std::chrono::milliseconds(1));
  });
  EXPECT_EQ(failures(ends), "");
}

TEST(State, TwoThreadsInOneBarrierIsAnError) {
  auto ends = run_ranks(Job::of(2), [](int rank) {
    lockstep::State state;
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      state.wait_for_everyone();
      return;
    }
    std::atomic<bool> second_threw{false};
    std::thread waiter([&] { state.wait_for_everyone(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    try {
      state.wait_for_everyone();
    } catch (const lockstep::Error& error) {
      second_threw = std::string(error.what()).find("second thread") != std::string::npos;
    }
    waiter.join();
    RANK_CHECK(second_threw);
  });
  EXPECT_EQ(failures(ends), "");
}

// Calls that move between two threads of a process (in runs of 1 to 6, so that the plain entry
// is owned, revoked by the other thread with membarrier, and owned again) meet the other
// processes as one thread's would: no call refused, and none passes before every process
// arrived at its episode.
TEST(State, CallsThatMoveBetweenThreadsStillMeetEveryEpisode) {
  constexpr int kProcesses = 3;
  constexpr int kRounds = 3000;
  auto* arrived = shared_array<std::atomic<int>>(kProcesses);
  auto ends = run_ranks(Job::of(kProcesses), [arrived](int rank) {
    lockstep::State state;
    auto meet = [&](int round) {
      arrived[rank].store(round + 1);
      state.wait_for_everyone();
      for (int peer = 0; peer < kProcesses; ++peer) {
        RANK_CHECK(arrived[peer].load() >= round + 1);
      }
    };
    int round = 0;
    unsigned seed = static_cast<unsigned>(rank) + 7;
    while (round < kRounds) {
      seed = seed * 1103515245U + 12345U;
      const int run = std::min(kRounds - round, 1 + static_cast<int>((seed >> 16) % 6));
      const bool helper = rank != 2 && (seed >> 24) % 2 == 0;  // rank 2: one thread throughout
      auto calls = [&, first = round] {
        for (int i = 0; i < run; ++i) {
          meet(first + i);
        }
      };
      if (helper) {
        std::thread(calls).join();
      } else {
        calls();
      }
      round += run;
    }
  });
  EXPECT_EQ(failures(ends), "");
}

// The processes of a node share their load samples (Waiter::share_samples, a word in the
// job's segment): each reads /proc/loadavg only when no peer has read it within a sample period.
// Waits of milliseconds (a peer sleeps before most arrivals) make every process sample.
TEST(StateWaiting, TheProcessesOfANodeShareTheirLoadSamples) {
  constexpr int kProcesses = 4;
  auto* counts = shared_array<std::atomic<std::uint64_t>>(2);  // samples, of them shared
  Job job;
  job.processes = kProcesses;
  auto ends = run_ranks(job, [counts](int rank) {
    RANK_CHECK(::setenv("LOCKSTEP_WAIT_POLICY", "adaptive", 1) == 0);
    lockstep::State state;
    for (int round = 0; round < 200; ++round) {
      if ((round + rank) % kProcesses == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
      state.wait_for_everyone();
    }
    const auto stats = lockstep::detail::Context::instance()->wait_stats();
    counts[0] += stats.samples;
    counts[1] += stats.shared_samples;
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_GT(counts[0].load(), 0U) << "no load sample was taken: the test proves nothing";
  EXPECT_GT(counts[1].load(), 0U) << "of " << counts[0].load()
                                  << " load samples, none was another process's";
}

}  // namespace
