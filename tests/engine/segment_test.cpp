// The node segment: two jobs never meet, stale and torn segments are replaced, nothing is left.
#include "engine/segment.hpp"
#include "engine/segment_file.hpp"
#include "engine/status.hpp"
#include "job/launch_env.hpp"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <lockstep/lockstep.hpp>
#include <string>
#include <thread>
#include <utility>

#include "membership/backend.hpp"
#include "ranks.hpp"

namespace {

using lockstep::detail::segment_name;
using lockstep::testing::contains;
using lockstep::testing::expect_join_error;
using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::path_exists;
using lockstep::testing::run_ranks;
using lockstep::testing::segment_path;
using lockstep::testing::shared_array;
using lockstep::testing::start_ranks;
using lockstep::testing::unique_job_id;
using lockstep::testing::wait_ranks;

// A job body: `rounds` barriers with the counter check of the stress test.
void barriers(std::atomic<int>* counter, int rounds) {
  lockstep::State state;
  const int n = state.num_processes();
  for (int round = 0; round < rounds; ++round) {
    counter->fetch_add(1, std::memory_order_relaxed);
    state.wait_for_everyone();
    int seen = counter->load(std::memory_order_relaxed);
    RANK_CHECK(seen >= (round + 1) * n && seen <= (round + 2) * n);
  }
}

// A job of two processes that have joined `id` and hold their last barrier until finish().
class HeldJob {
 public:
  explicit HeldJob(const std::string& id)
      : flags_(shared_array<std::atomic<int>>(2)),
        running_(start_ranks(Job::of(2, id), [flags = flags_](int) {
          lockstep::State state;
          flags[0]++;
          while (flags[1].load() == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
          state.wait_for_everyone();
        })) {}

  // Whether both processes joined before the job's time limit.
  bool joined() const {
    while (flags_[0].load() < 2) {
      if (std::chrono::steady_clock::now() > running_.deadline) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  // Lets the processes finish; "" when both ended well (see failures()).
  std::string finish() {
    finished_ = true;
    flags_[1] = 1;
    return failures(wait_ranks(running_));
  }
  // A test that stopped early still releases (and, past the limit, kills) its processes.
  ~HeldJob() {
    if (!finished_) {
      (void)finish();
    }
  }
  HeldJob(const HeldJob&) = delete;
  HeldJob& operator=(const HeldJob&) = delete;

 private:
  std::atomic<int>* flags_;  // [0]: processes joined, [1]: released
  lockstep::testing::Running running_;
  bool finished_ = false;
};

// Another Unix user on the machine (created here: the test needs root) can neither open a job's
// segment nor join the job by giving its identity: its processes meet in a namespace of their
// own (the uid is part of the segment's name) and the job runs on undisturbed.
TEST(NodeSegment, AnotherUserCannotOpenOrJoinTheJob) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root, to create a second Unix user";
  }
  const char* other = "lockstep-other";
  if (::getpwnam(other) == nullptr &&
      std::system("useradd --system --no-create-home --shell /usr/sbin/nologin lockstep-other "
                  ">/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "could not create a second user (useradd)";
  }
  const passwd* user = ::getpwnam(other);
  ASSERT_NE(user, nullptr);
  const uid_t uid = user->pw_uid;
  const gid_t gid = user->pw_gid;
  std::string id = unique_job_id("other-user");
  HeldJob job(id);
  ASSERT_TRUE(job.joined());
  const std::string path = segment_path(id);
  ASSERT_TRUE(path_exists(path));
  auto* result = shared_array<int>(4);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) {
      ::_exit(3);
    }
    int fd = ::open(path.c_str(), O_RDWR);
    result[0] = fd < 0 ? errno : 0;
    fd = ::open(path.c_str(), O_RDONLY);
    result[1] = fd < 0 ? errno : 0;
    // The same identity, as the other job's rank 1: it must not join, only time out alone.
    ::setenv("LOCKSTEP_JOB_ID", id.c_str(), 1);
    ::setenv("RANK", "1", 1);
    ::setenv("LOCAL_RANK", "1", 1);
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("LOCAL_WORLD_SIZE", "2", 1);
    ::setenv("GROUP_RANK", "0", 1);
    ::setenv("LOCKSTEP_NNODES", "1", 1);
    ::setenv("LOCKSTEP_JOIN_TIMEOUT", "1", 1);
    try {
      lockstep::State state;
      result[2] = 1;  // joined someone: wrong
    } catch (const lockstep::TimeoutError&) {
      result[2] = 2;  // alone in its own namespace
    } catch (const std::exception&) {
      result[2] = 3;
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(result[0], EACCES) << "read-write open by another user";
  EXPECT_EQ(result[1], EACCES) << "read-only open by another user";
  EXPECT_EQ(result[2], 2) << "another user's process with the job's identity";
  EXPECT_EQ(job.finish(), "");  // the job was not disturbed
  EXPECT_FALSE(path_exists(path));
  // Nothing of the other user's attempt is left either.
  EXPECT_TRUE(lockstep::testing::shm_entries("lockstep-u" + std::to_string(uid) + "-").empty());
}

TEST(NodeSegment, IsOwnerOnlyWhileTheJobRunsAndGoneAfter) {
  std::string id = unique_job_id("mode");
  auto* mode = shared_array<std::atomic<unsigned>>(1);
  auto ends = run_ranks(Job::of(2, id), [&](int rank) {
    lockstep::State state;
    if (rank == 0) {
      struct stat st {};
      RANK_CHECK(::stat(segment_path(id).c_str(), &st) == 0);
      *mode = st.st_mode & 07777;
      RANK_CHECK(st.st_uid == ::geteuid());
    }
    state.wait_for_everyone();
  });
  ASSERT_EQ(failures(ends), "");
  EXPECT_EQ(mode->load(), 0600U);
  EXPECT_FALSE(path_exists(segment_path(id))) << "left behind after a clean exit";
}

TEST(NodeSegment, IsGoneAfterExitWhileAStateIsStillInScope) {
  std::string id = unique_job_id("exit");
  auto ends = run_ranks(Job::of(3, id), [](int) {
    lockstep::State state;
    state.wait_for_everyone();
    std::exit(0);  // NOLINT(concurrency-mt-unsafe): the local State is never destroyed
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_FALSE(path_exists(segment_path(id))) << "left behind by processes that called exit()";
}

TEST(NodeSegment, TwoJobsSideBySideNeverMeet) {
  auto* counters = shared_array<std::atomic<int>>(2);
  std::string a = unique_job_id("a");
  std::string b = unique_job_id("b");
  auto job_a = start_ranks(Job::of(2, a), [&](int) { barriers(&counters[0], 20'000); });
  auto job_b = start_ranks(Job::of(3, b), [&](int) { barriers(&counters[1], 20'000); });
  EXPECT_EQ(failures(wait_ranks(job_a)), "");
  EXPECT_EQ(failures(wait_ranks(job_b)), "");
  EXPECT_EQ(counters[0], 2 * 20'000);
  EXPECT_EQ(counters[1], 3 * 20'000);
  EXPECT_FALSE(path_exists(segment_path(a)));
  EXPECT_FALSE(path_exists(segment_path(b)));
}

TEST(NodeSegment, ASecondJobWithTheSameIdentityIsRefused) {
  std::string id = unique_job_id("same");
  HeldJob first(id);
  ASSERT_TRUE(first.joined());
  auto second = run_ranks(Job::of(2, id), [&](int) {
    expect_join_error<lockstep::ConfigError>([] { lockstep::State state; }, "already running");
  });
  EXPECT_EQ(first.finish(), "");
  EXPECT_EQ(failures(second), "");
  EXPECT_FALSE(path_exists(segment_path(id)));
}

class StaleSegment : public ::testing::TestWithParam<int> {};

// A job whose processes were all SIGKILLed leaves its segment; the next job with the same
// identity (and GetParam() processes) replaces it, and removes it when done.
TEST_P(StaleSegment, FromAKilledJobIsReplaced) {
  std::string id = unique_job_id("stale");
  auto killed = run_ranks(Job::of(3, id), [](int) {
    lockstep::State state;
    state.wait_for_everyone();
    ::raise(SIGKILL);
  });
  for (const auto& end : killed) {
    ASSERT_TRUE(end.killed_by(SIGKILL)) << end.describe();
  }
  ASSERT_TRUE(path_exists(segment_path(id))) << "the killed job should have left its segment";
  auto* counter = shared_array<std::atomic<int>>(1);
  auto ends = run_ranks(Job::of(GetParam(), id), [&](int) { barriers(counter, 1000); });
  EXPECT_EQ(failures(ends), "");
  EXPECT_FALSE(path_exists(segment_path(id)));
}

INSTANTIATE_TEST_SUITE_P(Processes, StaleSegment, ::testing::Values(2, 3, 4));

TEST(NodeSegment, AnEmptySegmentFromACreatorThatDiedIsLaidOut) {
  std::string id = unique_job_id("torn");
  int fd = ::open(segment_path(id).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  auto* counter = shared_array<std::atomic<int>>(1);
  EXPECT_EQ(failures(run_ranks(Job::of(2, id), [&](int) { barriers(counter, 100); })), "");
  EXPECT_FALSE(path_exists(segment_path(id)));
}

TEST(NodeSegment, ASegmentOthersCanOpenIsRefused) {
  std::string id = unique_job_id("open");
  std::string path = segment_path(id);
  int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ::fchmod(fd, 0644);
  ::close(fd);
  auto ends = run_ranks(Job::of(2, id), [](int) {
    expect_join_error<lockstep::ConfigError>([] { lockstep::State state; }, "mode 0644");
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_TRUE(path_exists(path)) << "a segment lockstep does not own must not be removed";
  ::unlink(path.c_str());
}

// Issue 21 #2: the refusal names the user who owns the squatting file.
TEST(NodeSegment, ASquattersFileIsRefusedNamingItsOwner) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root, to create a file owned by another user (nobody)";
  }
  std::string id = unique_job_id("squat");
  std::string path = segment_path(id);
  int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fchown(fd, 65534, 65534), 0);
  ::close(fd);
  auto ends = run_ranks(Job::of(2, id), [](int) {
    expect_join_error<lockstep::ConfigError>([] { lockstep::State state; },
                                             "owned by uid 65534 (nobody)");
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_TRUE(path_exists(path)) << "a segment lockstep does not own must not be removed";
  ::unlink(path.c_str());
}

TEST(NodeSegment, ProcessesThatDisagreeOnTheShapeAreRefused) {
  std::string id = unique_job_id("shape");
  auto* joined = shared_array<std::atomic<int>>(1);
  auto ends = run_ranks(Job::of(2, id), [&](int rank) {
    if (rank == 1) {
      while (joined->load() == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      ::setenv("WORLD_SIZE", "3", 1);
      ::setenv("LOCAL_WORLD_SIZE", "3", 1);
      expect_join_error<lockstep::ConfigError>([] { lockstep::State state; }, "disagree");
      joined->store(2);
      return;
    }
    ::setenv("LOCKSTEP_JOIN_TIMEOUT", "2", 1);
    try {
      std::thread signal([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        joined->store(1);
      });
      signal.detach();
      lockstep::State state;  // rank 1 never joins this shape
      RANK_CHECK(false);
    } catch (const lockstep::TimeoutError& error) {
      RANK_CHECK(contains(error.what(), "never joined"));
    }
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_FALSE(path_exists(segment_path(id)));
}

TEST(NodeSegment, TwoProcessesWithOneLocalRankAreRefused) {
  std::string id = unique_job_id("dup");
  Job job = Job::of(2, id);
  job.env["LOCKSTEP_JOIN_TIMEOUT"] = "2";
  auto* errors = shared_array<std::atomic<int>>(1);
  auto ends = run_ranks(job, [&](int rank) {
    if (rank == 1) {
      ::setenv("LOCAL_RANK", "0", 1);
      ::setenv("RANK", "0", 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    try {
      lockstep::State state;
    } catch (const lockstep::ConfigError& error) {
      RANK_CHECK(contains(error.what(), "same local rank"));
      (*errors)++;
    } catch (const lockstep::TimeoutError&) {
      // the first process waits for a local process 1 that never comes
    }
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_EQ(errors->load(), 1);
}

TEST(NodeSegment, LocalIndicesAreElectedWhenNotGiven) {
  Job job = Job::of(4);
  job.env["LOCAL_RANK"] = "";  // unset: the node elects
  job.env["LOCAL_WORLD_SIZE"] = "";
  job.env["GROUP_RANK"] = "";
  job.env["LOCKSTEP_NNODES"] = "";
  job.env["MASTER_PORT"] = "29999";
  auto ends = run_ranks(job, [](int rank) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * (3 - rank)));  // join in reverse
    lockstep::State state;
    RANK_CHECK(state.environment_source() == "torchrun");
    RANK_CHECK(state.local_process_index() == rank);  // rank order, not arrival order
    RANK_CHECK(state.num_local_processes() == 4);
    RANK_CHECK(state.is_local_main_process() == (rank == 0));
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
}

TEST(Environment, AMalformedVariableIsAConfigErrorInARealProcess) {
  Job job = Job::of(1);
  job.env["RANK"] = "abc";
  auto ends = run_ranks(job, [](int) {
    expect_join_error<lockstep::ConfigError>([] { lockstep::State state; },
                                             "RANK=\"abc\" is not an integer");
  });
  EXPECT_EQ(failures(ends), "");
}

TEST(Environment, MultiNodeWithoutABackendIsAConfigError) {
  if (!lockstep::detail::built_backends().empty()) {
    GTEST_SKIP() << "this build has a cross-node backend (tests/backends/multinode_test.cpp covers "
                    "multi-node jobs)";
  }
  Job job = Job::of(1);
  job.env["WORLD_SIZE"] = "2";
  job.env["LOCAL_WORLD_SIZE"] = "1";
  job.env["LOCKSTEP_NNODES"] = "2";
  job.env["MASTER_ADDR"] = "127.0.0.1";
  job.env["MASTER_PORT"] = "29500";
  auto ends = run_ranks(job, [](int) {
    expect_join_error<lockstep::ConfigError>([] { lockstep::State state; },
                                             "no cross-node backend");
  });
  EXPECT_EQ(failures(ends), "");
}

// Processes that leave the moment they have joined (or passed a barrier) must not look dead to
// peers that are still finishing the same join (or barrier).
TEST(NodeSegment, ProcessesThatLeaveAtOnceAreNotLost) {
#if defined(LOCKSTEP_TEST_ASAN)
  // 2,400 processes' leak checks at exit took 109 s under AddressSanitizer: it watches the
  // memory of the leaving path, which any round shows; the main build runs the 150 rounds that
  // race the leaves.
  constexpr int kRounds = 30;
#else
  constexpr int kRounds = 150;
#endif
  for (int round = 0; round < kRounds; ++round) {
    std::string id = unique_job_id("quick");
    EXPECT_EQ(failures(run_ranks(Job::of(8, id), [](int) { lockstep::State state; })), "")
        << "join, round " << round;
    EXPECT_EQ(failures(run_ranks(Job::of(8, id + "b"),
                                 [](int) {
                                   lockstep::State state;
                                   state.wait_for_everyone();
                                 })),
              "")
        << "barrier, round " << round;
    EXPECT_FALSE(path_exists(segment_path(id)));
  }
}

TEST(NodeSegment, RemoveAbandonedLeavesALiveJobAlone) {
  std::string id = unique_job_id("abandon");
  HeldJob running(id);
  ASSERT_TRUE(running.joined());
  EXPECT_FALSE(lockstep::detail::remove_abandoned_segment(
      segment_name(lockstep::detail::job_identity(id), 0)));
  EXPECT_TRUE(path_exists(segment_path(id)));
  EXPECT_EQ(running.finish(), "");
}

// Paths a test puts in /dev/shm, removed when it ends, whichever assertion ends it.
struct RemovedAtEnd {
  std::vector<std::string> paths;
  explicit RemovedAtEnd(std::vector<std::string> these = {}) : paths(std::move(these)) {}
  RemovedAtEnd(const RemovedAtEnd&) = delete;
  RemovedAtEnd& operator=(const RemovedAtEnd&) = delete;
  ~RemovedAtEnd() {
    for (const auto& path : paths) {
      ::unlink(path.c_str());
    }
  }
};

// /dev/shm is everyone's: another user's files (and links, and FIFOs) named with this user's
// prefix, more than the listing's cap, hid this user's running jobs from --status and its
// abandoned segments from the sweep. Only this user's owner-only regular files count.
TEST(StatusAndSweep, ForeignNamesWithTheUsersPrefixHideNothing) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root, to create files owned by another user (nobody)";
  }
  const std::string running_id = unique_job_id("seen");
  HeldJob running(running_id);
  ASSERT_TRUE(running.joined());
  // An abandoned segment: its processes killed.
  const std::string abandoned_id = unique_job_id("abandoned");
  (void)run_ranks(Job::of(2, abandoned_id), [](int) {
    lockstep::State state;
    state.wait_for_everyone();
    ::raise(SIGKILL);
  });
  const RemovedAtEnd missed({segment_path(abandoned_id)});  // should the sweep miss it
  ASSERT_TRUE(path_exists(segment_path(abandoned_id)));
  // Planted after them (tmpfs lists the newest names first), more than any cap.
  const std::string prefix =
      "/dev/shm/lockstep-u" + std::to_string(::geteuid()) + "-" + unique_job_id("planted") + "-";
  RemovedAtEnd planted_files;
  std::vector<std::string>& planted = planted_files.paths;
  for (int i = 0; i < 300; ++i) {
    planted.push_back(prefix + std::to_string(i));
    const int fd = ::open(planted.back().c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fchown(fd, 65534, 65534), 0);
    ::close(fd);
  }
  planted.push_back(prefix + "link");
  ASSERT_EQ(::symlink(segment_path(running_id).c_str(), planted.back().c_str()), 0);
  planted.push_back(prefix + "fifo");
  ASSERT_EQ(::mkfifo(planted.back().c_str(), 0600), 0);

  bool seen = false;
  for (const auto& job : lockstep::detail::job_statuses()) {
    EXPECT_EQ(job.path.find("planted"), std::string::npos) << job.path;
    seen = seen || job.path == segment_path(running_id);
  }
  EXPECT_TRUE(seen) << "--status did not list the running job";
  const auto removed = lockstep::detail::sweep_abandoned_segments(false);
  EXPECT_FALSE(path_exists(segment_path(abandoned_id))) << "the sweep missed it";
  EXPECT_TRUE(path_exists(segment_path(running_id)));
  for (const auto& path : planted) {
    EXPECT_TRUE(path_exists(path)) << "another user's file was removed: " << path;
  }
  EXPECT_EQ(running.finish(), "");
}

// A segment of this user whose header is malformed (0 processes, more than a segment holds):
// --status names what is wrong with it and goes on (it died of SIGFPE on 0).
TEST(StatusAndSweep, AMalformedSegmentIsNamedNotACrash) {
  const std::string path = "/dev/shm/lockstep-u" + std::to_string(::geteuid()) + "-" +
                           unique_job_id("malformed") + "-n0";
  for (const std::uint32_t slots : {0U, 5000U}) {
    const RemovedAtEnd made({path});
    const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(lockstep::detail::segment_size(slots))), 0);
    lockstep::detail::Prefix prefix{lockstep::detail::kSegmentMagic,
                                    lockstep::detail::kLayoutVersion, slots};
    ASSERT_EQ(::pwrite(fd, &prefix, sizeof prefix, 0), static_cast<ssize_t>(sizeof prefix));
    ::close(fd);
    bool named = false;
    for (const auto& job : lockstep::detail::job_statuses()) {
      if (job.path == path) {
        named = true;
        EXPECT_EQ(job.note, "malformed: its header says " + std::to_string(slots) +
                                " processes (a segment holds 1 to 4096)");
        EXPECT_TRUE(job.processes.empty());
      }
    }
    EXPECT_TRUE(named) << slots;
  }
}

}  // namespace

namespace {

// Issue 21: a FIFO put at a job's segment name made the launcher's "not joined yet" check block
// for ever (its ranks became zombies). The check returns at once, and joining says what is there.
TEST(Segment, AFifoAtTheSegmentNameIsRefusedWithoutBlocking) {
  const std::string id = unique_job_id("fifo");
  const std::string path = segment_path(id);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  const std::string name = path.substr(std::string("/dev/shm/").size());
  pid_t child = ::fork();
  if (child == 0) {
    ::_exit(lockstep::detail::joined_ranks(name) ? 1 : 0);
  }
  int status = -1;
  for (int i = 0; i < 200 && ::waitpid(child, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (::waitpid(child, &status, WNOHANG) == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    ADD_FAILURE() << "joined_ranks blocked on a FIFO";
  } else {
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a FIFO read as a segment";
  }
  Job job = Job::of(2, id);
  job.limit = std::chrono::seconds(30);
  auto ends = run_ranks(job, [](int) {
    expect_join_error<lockstep::ConfigError>([] { lockstep::State state; }, "not a regular file");
  });
  ::unlink(path.c_str());
  EXPECT_EQ(failures(ends), "");
}

}  // namespace
