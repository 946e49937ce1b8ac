// Regression tests for the node segment's faults found when lockstep was tried as a hostile user
// would (issue 12: a full /dev/shm, abandoned segments, two launches with one job id, a stopped
// lock holder, another layout version): each failed before its fix.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <lockstep/lockstep.hpp>
#include <string>
#include <thread>

#include "engine/layout.hpp"
#include "engine/segment.hpp"
#include "ranks.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using lockstep::testing::contains;
using lockstep::testing::expect_join_error;
using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::path_exists;
using lockstep::testing::run_ranks;
using lockstep::testing::segment_path;
using lockstep::testing::shared_array;
using lockstep::testing::shm_entries;
using lockstep::testing::unique_job_id;

// Defect 2: a full /dev/shm killed every rank with SIGBUS (ftruncate reserves nothing on tmpfs)
// and left the segment. Runs in a mount namespace of its own with a 1 MiB tmpfs on /dev/shm.
TEST(FullDevShm, IsASystemErrorAndLeavesNothing) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!lockstep::testing::mount_full_dev_shm()) {
      ::_exit(77);  // no mount namespace here (not root, or no CAP_SYS_ADMIN)
    }
    auto ends = run_ranks(Job::of(3), [](int) {
      try {
        lockstep::State state;
        RANK_CHECK(false);
      } catch (const lockstep::SystemError& error) {
        RANK_CHECK(error.error_number() == ENOSPC);
        RANK_CHECK(contains(error.what(), "/dev/shm is full"));
      }
    });
    if (!failures(ends).empty()) {
      std::fprintf(stderr, "%s\n", failures(ends).c_str());
      ::_exit(1);
    }
    auto left = shm_entries("lockstep-");
    ::_exit(left.empty() ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  if (WEXITSTATUS(status) == 77) {
    GTEST_SKIP() << "cannot mount a small tmpfs on /dev/shm here (needs root in a mount namespace)";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: a rank failed otherwise; 2: a segment was left";
}

// Defect 6: ranks that end without leaving (SIGKILL, _exit; their launcher killed too) left a
// segment that no later job reclaimed (its name is random). The next State sweeps it.
TEST(AbandonedSegments, AreSweptByTheNextJob) {
  const std::string id = unique_job_id("abandoned");
  auto ends = run_ranks(Job::of(2, id), [](int) {
    lockstep::State state;
    state.wait_for_everyone();
    ::_exit(0);  // no leave
  });
  ASSERT_EQ(failures(ends), "");
  ASSERT_TRUE(path_exists(segment_path(id))) << "the test needs the abandoned segment";
  auto next = run_ranks(Job::of(2), [](int) {
    lockstep::State state;
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(next), "");
  EXPECT_FALSE(path_exists(segment_path(id)));
}

TEST(AbandonedSegments, ALiveJobsSegmentIsNeverSwept) {
  const std::string id = unique_job_id("alive");
  auto* phase = shared_array<std::atomic<int>>(1);
  auto running = lockstep::testing::start_ranks(Job::of(2, id), [phase](int) {
    lockstep::State state;
    state.wait_for_everyone();
    phase->fetch_add(1);
    while (phase->load() < 100) {
      std::this_thread::sleep_for(5ms);
    }
    state.wait_for_everyone();  // the segment must still work
  });
  while (phase->load() < 2) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_TRUE(lockstep::detail::sweep_abandoned_segments(true).empty() ||
              path_exists(segment_path(id)));
  EXPECT_TRUE(path_exists(segment_path(id)));
  phase->store(100);
  EXPECT_EQ(failures(lockstep::testing::wait_ranks(running)), "");
}

// Two launches given one job id (LOCKSTEP_LAUNCH_ID differs): in 2 of 10 tries one rank of each
// formed a job. Now the second launch's processes are refused, whatever the order.
TEST(TwoLaunches, WithOneJobIdNeverMeet) {
  Job job = Job::of(2);
  job.env["LOCKSTEP_JOIN_TIMEOUT"] = "1";
  job.env["LOCKSTEP_LAUNCH_ID"] = "a1";
  auto ends = run_ranks(job, [](int rank) {
    if (rank == 0) {
      expect_join_error<lockstep::TimeoutError>([] { lockstep::State state; }, "never joined");
      return;
    }
    std::this_thread::sleep_for(200ms);
    ::setenv("LOCKSTEP_LAUNCH_ID", "b2", 1);  // NOLINT(concurrency-mt-unsafe): one thread
    expect_join_error<lockstep::ConfigError>([] { lockstep::State state; },
                                             "started by another launch");
  });
  EXPECT_EQ(failures(ends), "");
}

// A process stopped while it holds the segment's join lock kept LOCKSTEP_JOIN_TIMEOUT=2 from
// reporting for 6.4 s: the join timeout bounds the whole join.
TEST(JoinLock, HeldByAStoppedProcessIsBoundedByTheJoinTimeout) {
  const std::string id = unique_job_id("locked");
  const std::string path = segment_path(id);
  std::fflush(nullptr);
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    int fd = ::open(path.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) {
      ::_exit(1);
    }
    ::raise(SIGSTOP);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(holder, &status, WUNTRACED), holder);
  ASSERT_TRUE(WIFSTOPPED(status));
  Job job = Job::of(2, id);
  job.env["LOCKSTEP_JOIN_TIMEOUT"] = "1";
  auto ends = run_ranks(job, [holder](int) {
    const auto start = Clock::now();
    expect_join_error<lockstep::TimeoutError>(
        [] { lockstep::State state; }, "process " + std::to_string(holder) + " holds its lock");
    RANK_CHECK(Clock::now() - start < 2500ms);
  });
  ::kill(holder, SIGKILL);
  ::waitpid(holder, &status, 0);
  (void)::unlink(path.c_str());
  EXPECT_EQ(failures(ends), "");
}

// A live segment of another layout version was taken as torn and replaced: the job hung for the
// join timeout. Now it is refused at once, naming both versions; once nobody maps it, it goes.
TEST(OtherLayoutVersion, LiveIsRefusedAndDeadIsReplaced) {
  const std::string id = unique_job_id("version");
  const std::string path = segment_path(id);
  auto* ready = shared_array<std::atomic<int>>(1);
  std::fflush(nullptr);
  const pid_t mapper = ::fork();
  ASSERT_GE(mapper, 0);
  if (mapper == 0) {
    int fd = ::open(path.c_str(), O_CREAT | O_RDWR, 0600);
    const std::size_t size = 1 << 16;
    if (fd < 0 || ::ftruncate(fd, size) != 0) {
      ::_exit(1);
    }
    auto* bytes = static_cast<unsigned char*>(
        ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    std::uint64_t magic = lockstep::detail::kSegmentMagic;
    std::uint32_t version = lockstep::detail::kLayoutVersion - 1;
    std::memcpy(bytes, &magic, sizeof magic);
    std::memcpy(bytes + 8, &version, sizeof version);
    ready->store(1);
    ::pause();
    ::_exit(0);
  }
  while (ready->load() == 0) {
    std::this_thread::sleep_for(2ms);
  }
  const auto start = Clock::now();
  auto refused = run_ranks(Job::of(2, id), [](int) {
    expect_join_error<lockstep::ConfigError>(
        [] { lockstep::State state; },
        "its layout version is " + std::to_string(lockstep::detail::kLayoutVersion - 1) +
            ", this process's (lockstep " LOCKSTEP_VERSION_STRING ") is " +
            std::to_string(lockstep::detail::kLayoutVersion));
  });
  EXPECT_EQ(failures(refused), "");
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_TRUE(path_exists(path));  // not ours to remove while it is used
  ::kill(mapper, SIGKILL);
  ::waitpid(mapper, nullptr, 0);
  auto joined = run_ranks(Job::of(2, id), [](int) {
    lockstep::State state;
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(joined), "");
}

}  // namespace

namespace {

// A file at /dev/shm/NAME as a spill is made (owner-only, regular).
void make_spill_file(const std::string& name) {
  const int fd = ::open(("/dev/shm/" + name).c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << name << ": " << std::strerror(errno);
  ASSERT_EQ(::write(fd, "spilled", 7), 7);
  ::close(fd);
}

}  // namespace

// Issue 58: an exchange's spill outlives it only when its writer died; it goes with its segment
// when the segment's last process leaves, or with the sweep once its segment is gone, and the
// sweep never takes one whose segment is still there (an exchange may be reading it).
TEST(Spills, GoWithTheirSegmentAndNeverBefore) {
  const std::string id = unique_job_id("spills");
  const std::string uid = std::to_string(::geteuid());
  const std::string orphan = "lockstep-u" + uid + "-00000000deadbeef-n0-x3";
  make_spill_file(orphan);
  auto* phase = shared_array<std::atomic<int>>(1);
  auto running = lockstep::testing::start_ranks(Job::of(2, id), [phase](int) {
    lockstep::State state;
    state.wait_for_everyone();
    phase->fetch_add(1);
    while (phase->load() < 100) {
      std::this_thread::sleep_for(5ms);
    }
    state.wait_for_everyone();
  });
  while (phase->load() < 2) {
    std::this_thread::sleep_for(5ms);
  }
  const std::string segment = segment_path(id).substr(std::strlen("/dev/shm/"));
  const std::string live = segment + "-x1";  // as a writer killed mid-exchange leaves it
  make_spill_file(live);
  (void)lockstep::detail::sweep_abandoned_segments(false);
  EXPECT_FALSE(path_exists("/dev/shm/" + orphan)) << "an orphan spill outlived the sweep";
  EXPECT_TRUE(path_exists("/dev/shm/" + live)) << "the sweep took a live segment's spill";
  phase->store(100);
  EXPECT_EQ(failures(lockstep::testing::wait_ranks(running)), "");
  EXPECT_FALSE(path_exists(segment_path(id)));
  EXPECT_FALSE(path_exists("/dev/shm/" + live)) << "the last process out left a spill";
}
