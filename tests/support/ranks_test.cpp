// The test harness itself (tests/support/ranks.cpp).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>

#include "ranks.hpp"

namespace {

using lockstep::testing::ended;
using lockstep::testing::Job;

// A test process killed while its ranks run (meson's timeout, a Ctrl-C) takes them with it: once,
// a hung test's ranks polled on for half an hour after their test was killed.
TEST(Harness, RanksDieWithTheTestProcess) {
  auto* pids = lockstep::testing::shared_array<std::atomic<pid_t>>(2);
  const pid_t test = ::fork();
  ASSERT_GE(test, 0);
  if (test == 0) {
    // The "test process": starts two ranks that would run for 30 s, then waits.
    Job job = Job::of(2);
    job.plain = true;
    (void)lockstep::testing::start_ranks(job, [pids](int rank) {
      pids[rank].store(::getpid());
      std::this_thread::sleep_for(std::chrono::seconds(30));
    });
    for (;;) {
      ::pause();
    }
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((pids[0].load() == 0 || pids[1].load() == 0) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_NE(pids[0].load(), 0);
  ASSERT_NE(pids[1].load(), 0);
  ::kill(test, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(test, &status, 0), test);
  const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!(ended(pids[0]) && ended(pids[1])) && std::chrono::steady_clock::now() < grace) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool both_ended = ended(pids[0]) && ended(pids[1]);
  for (int rank = 0; rank < 2; ++rank) {
    ::kill(pids[rank], SIGKILL);  // should they have outlived it: not past this test
  }
  EXPECT_TRUE(both_ended) << "a rank outlived its killed test process";
}

}  // namespace
