// The occupancy (lib/src/membership/busy_guard.hpp): one thread of a process at a time in the
// calls that meet the other processes, whether the thread that called last enters with plain
// stores (membarrier on the other side) or with a fence, and leave's question answered against
// a thread that enters at the same moment.
#include <gtest/gtest.h>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/error.hpp"
#include "membership/busy_guard.hpp"

namespace lockstep::detail {
namespace {

constexpr int kOwnAfter = 4;  // Occupancy's calls in a row before the plain entry

// Each case runs with membarrier (where the kernel gives it) and with the fenced entry.
class OccupancyModes : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam() && !Occupancy(true).asymmetric()) {
      GTEST_SKIP() << "membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) is refused here: "
                      "the process takes the fenced entry, which the other variant checks";
    }
  }
};

// Calls enter() `times` in a row from this thread, leaving each time.
void enter_times(Occupancy& occupancy, int times) {
  for (int i = 0; i < times; ++i) {
    const Occupancy::Entry entry = occupancy.enter("test");
  }
}

bool refused_as_second_thread(Occupancy& occupancy) {
  try {
    const Occupancy::Entry entry = occupancy.enter("test");
  } catch (const Error& error) {
    return std::string(error.what()).find("second thread") != std::string::npos;
  }
  return false;
}

TEST_P(OccupancyModes, TheThreadThatCallsInARowEntersWithPlainStores) {
  Occupancy occupancy(GetParam());
  enter_times(occupancy, kOwnAfter - 1);
  EXPECT_FALSE(occupancy.owned_by(pthread_self()));
  enter_times(occupancy, 1);
  EXPECT_TRUE(occupancy.owned_by(pthread_self()));
  std::thread([&] { enter_times(occupancy, 1); }).join();  // another thread takes over
  EXPECT_FALSE(occupancy.owned_by(pthread_self()));
}

TEST_P(OccupancyModes, ASecondThreadIsRefusedWhileOneIsInsideEitherWay) {
  for (const int calls_before : {0, kOwnAfter}) {  // under the mutex; with plain stores
    Occupancy occupancy(GetParam());
    enter_times(occupancy, calls_before);
    {
      const Occupancy::Entry inside = occupancy.enter("test");
      EXPECT_EQ(occupancy.owned_by(pthread_self()), calls_before > 0);
      bool refused = false;
      std::thread([&] { refused = refused_as_second_thread(occupancy); }).join();
      EXPECT_TRUE(refused) << calls_before << " calls before";
      EXPECT_TRUE(occupancy.occupied());
      EXPECT_TRUE(refused_as_second_thread(occupancy)) << "a call from within a call";
    }
    EXPECT_FALSE(occupancy.occupied());
    bool entered = false;
    std::thread([&] {
      const Occupancy::Entry later = occupancy.enter("test");
      entered = true;
    }).join();
    EXPECT_TRUE(entered) << "refused after the first thread left";
  }
}

// The owner read as the owner, then another thread took over before the owner's mark: the
// owner backs out, and its call goes on under the mutex.
TEST_P(OccupancyModes, AnOwnerRevokedBetweenItsReadAndItsMarkBacksOut) {
  Occupancy occupancy(GetParam());
  enter_times(occupancy, kOwnAfter);
  Occupancy::Record* read = occupancy.owner();
  ASSERT_TRUE(occupancy.owned_by(pthread_self()));
  std::thread([&] { enter_times(occupancy, 1); }).join();
  EXPECT_FALSE(occupancy.enter_owned(read)) << "entered with its ownership revoked";
  EXPECT_FALSE(occupancy.occupied());
  enter_times(occupancy, 1);
  // And not revoked: the mark holds.
  enter_times(occupancy, kOwnAfter);
  read = occupancy.owner();
  ASSERT_TRUE(occupancy.enter_owned(read));
  EXPECT_TRUE(occupancy.occupied());
  bool refused = false;
  std::thread([&] { refused = refused_as_second_thread(occupancy); }).join();
  EXPECT_TRUE(refused);
  read->inside.store(false, std::memory_order_release);  // what its Entry would do
  EXPECT_FALSE(occupancy.occupied());
}

// Threads that come and go (a later one may be given an earlier one's pthread_t) each take the
// plain entry and hand it on: none is refused, and none is left inside.
TEST_P(OccupancyModes, ThreadsThatComeAndGoEachTakeThePlainEntry) {
  Occupancy occupancy(GetParam());
  int owned = 0;
  for (int t = 0; t < 64; ++t) {
    std::thread([&] {
      enter_times(occupancy, kOwnAfter + 2);
      owned += occupancy.owned_by(pthread_self()) ? 1 : 0;
    }).join();
  }
  EXPECT_EQ(owned, 64);
  EXPECT_FALSE(occupancy.occupied());
}

// Threads more than the CPUs, each making runs of calls of random length (so that ownership
// goes from thread to thread, by revocation, all the time) and holding each entry a random
// while: never two inside at once, and every refusal while another was inside.
TEST_P(OccupancyModes, NoTwoThreadsAreEverInside) {
  constexpr int kThreads = 4;
  constexpr auto kFor = std::chrono::milliseconds(1500);
  Occupancy occupancy(GetParam());
  std::atomic<int> inside{0};
  std::atomic<std::uint64_t> overlaps{0};
  std::atomic<std::uint64_t> entries{0};
  std::atomic<std::uint64_t> owned_entries{0};
  std::atomic<std::uint64_t> refusals{0};
  const auto end = std::chrono::steady_clock::now() + kFor;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::minstd_rand random(static_cast<unsigned>(t) + 1);
      while (std::chrono::steady_clock::now() < end) {
        const int run = 1 + static_cast<int>(random() % 8);
        for (int i = 0; i < run; ++i) {
          try {
            const bool owned = occupancy.owned_by(pthread_self());
            const Occupancy::Entry entry = occupancy.enter("test");
            if (inside.fetch_add(1) != 0) {
              overlaps.fetch_add(1);
            }
            entries.fetch_add(1, std::memory_order_relaxed);
            if (owned) {
              owned_entries.fetch_add(1, std::memory_order_relaxed);
            }
            for (unsigned spin = random() % 64; spin > 0; --spin) {
              std::atomic_signal_fence(std::memory_order_seq_cst);
            }
            if (random() % 16 == 0) {
              std::this_thread::yield();  // preempted inside, as a waiter that sleeps
            }
            inside.fetch_sub(1);
          } catch (const Error&) {
            refusals.fetch_add(1, std::memory_order_relaxed);
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(overlaps.load(), 0U) << "of " << entries.load() << " entries";
  EXPECT_GT(owned_entries.load(), 1000U)
      << "too few plain entries (" << owned_entries.load() << " of " << entries.load() << ", "
      << refusals.load() << " refused): the test proves little";
  EXPECT_GT(refusals.load(), 0U) << "no call was refused: the threads never met";
}

// Context::leave sets left_ and asks occupied(); a thread entering at that moment reads left_
// after entering. Whichever comes first, one of them sees the other: never an entry that read
// left_ unset while leave was told that nobody is inside.
TEST_P(OccupancyModes, LeaveAndAnEntryAtTheSameMomentSeeOneAnother) {
  constexpr int kTrials = 3000;
  int missed = 0;
  int entered_unset = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    Occupancy occupancy(GetParam());
    std::atomic<bool> left{false};
    std::atomic<bool> go{false};
    std::atomic<bool> answered{false};
    bool saw_unset = false;
    std::thread entrant([&] {
      enter_times(occupancy, trial % 2 == 0 ? kOwnAfter : 0);  // plain stores, or the mutex
      while (!go.load(std::memory_order_acquire)) {
      }
      const Occupancy::Entry entry = occupancy.enter("test");
      saw_unset = !left.load(std::memory_order_seq_cst);
      while (saw_unset && !answered.load(std::memory_order_acquire)) {
      }
    });
    go.store(true, std::memory_order_release);
    for (int spin = trial % 256; spin > 0; --spin) {  // sweeps the moment against the entry's
      std::atomic_signal_fence(std::memory_order_seq_cst);
    }
    left.store(true, std::memory_order_seq_cst);
    const bool occupied = occupancy.occupied();
    answered.store(true, std::memory_order_release);
    entrant.join();
    entered_unset += saw_unset ? 1 : 0;
    missed += saw_unset && !occupied ? 1 : 0;
  }
  EXPECT_EQ(missed, 0) << "of " << entered_unset << " entries that read left_ unset";
}

INSTANTIATE_TEST_SUITE_P(Occupancy, OccupancyModes, testing::Values(true, false),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("membarrier") : std::string("fenced");
                         });

}  // namespace
}  // namespace lockstep::detail
