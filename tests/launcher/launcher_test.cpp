// lockstep-run, run as a user runs it: flags, environment, failures, signals, clean-up.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/segment.hpp"
#include "job/launch_env.hpp"
#include "ranks.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using lockstep::testing::contains;
using lockstep::testing::ended;

std::string tool(const char* variable) {
  const char* path = std::getenv(variable);  // NOLINT(concurrency-mt-unsafe)
  if (path == nullptr) {
    ADD_FAILURE() << variable << " is not set (meson test sets it)";
    return "/nonexistent";
  }
  return path;
}

struct Result {
  int status = -1;
  std::string out;
  std::string err;
  double seconds = 0;
  double first_return_seconds = -1;  // when a '\r' first reached stdout
  double first_out_seconds = -1;     // when stdout's first bytes came
  [[nodiscard]] int code() const {
    if (WIFEXITED(status)) {
      return WEXITSTATUS(status);
    }
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  }
};

// Runs `args`; sends `signal_to_send` to it after `signal_after` when given; kills it after 60 s.
Result run(const std::vector<std::string>& args, int signal_to_send = 0,
           std::chrono::milliseconds signal_after = std::chrono::milliseconds(0)) {
  int out[2];
  int err[2];
  EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
  EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
  auto start = Clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& arg : args) {
      argv.push_back(const_cast<char*>(arg.c_str()));
    }
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  ::close(out[1]);
  ::close(err[1]);
  Result result;
  bool signalled = signal_to_send == 0;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_streams = 2;
  while (open_streams > 0) {
    auto elapsed = Clock::now() - start;
    if (!signalled && elapsed >= signal_after) {
      ::kill(pid, signal_to_send);
      signalled = true;
    }
    if (elapsed > std::chrono::seconds(60)) {
      ::kill(pid, SIGKILL);
    }
    ::poll(fds, 2, 20);
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP)) != 0) {
        char buffer[4096];
        ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
        if (n <= 0) {
          ::close(fds[i].fd);
          fds[i].fd = -1;
          --open_streams;
        } else {
          (i == 0 ? result.out : result.err).append(buffer, static_cast<std::size_t>(n));
          if (i == 0 && result.first_out_seconds < 0) {
            result.first_out_seconds = std::chrono::duration<double>(Clock::now() - start).count();
          }
          if (i == 0 && result.first_return_seconds < 0 &&
              std::memchr(buffer, '\r', static_cast<std::size_t>(n)) != nullptr) {
            result.first_return_seconds =
                std::chrono::duration<double>(Clock::now() - start).count();
          }
        }
      }
    }
  }
  ::waitpid(pid, &result.status, 0);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) {
    ++n;
  }
  return n;
}

TEST(Launcher, RunsTheExampleWithFourProcesses) {
  std::string result_file = "/tmp/lockstep-launcher-test-" + std::to_string(::getpid());
  auto result =
      run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "4", tool("LOCKSTEP_EXAMPLE"), result_file});
  EXPECT_EQ(result.code(), 0) << result.err;
  EXPECT_EQ(count(result.out, "job of 4 processes on 1 machine(s)"), 1) << result.out;
  EXPECT_EQ(count(result.out, "machine 0 runs 4 processes"), 1) << result.out;
  EXPECT_EQ(count(result.out, "only process 0 of 4 runs this"), 1) << result.out;
  EXPECT_EQ(count(result.out, "the last process (3) says goodbye"), 1) << result.out;
  std::ifstream file(result_file);
  std::stringstream content;
  content << file.rdbuf();
  EXPECT_EQ(content.str(), "processes 4\nsum 2100\n");
  ::unlink(result_file.c_str());
}

// Without a result file the example writes nothing where it runs (issue 22: it left
// lockstep-example-result.txt in the directory the README's commands run from).
TEST(Launcher, TheExampleWithoutAResultFileWritesNothingWhereItRuns) {
  std::string dir = "/tmp/lockstep-launcher-cwd-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  auto result = run({"/bin/sh", "-c", "cd \"$0\" && exec \"$1\" --nproc-per-node 2 \"$2\"", dir,
                     tool("LOCKSTEP_RUN"), tool("LOCKSTEP_EXAMPLE")});
  EXPECT_EQ(result.code(), 0) << result.err;
  EXPECT_EQ(count(result.out, "give a result file"), 1) << result.out;
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    left.push_back(entry.path().filename().string());
  }
  EXPECT_TRUE(left.empty()) << left.front();
  std::filesystem::remove_all(dir);
}

// Issue 23: a progress bar (text, then '\r', redrawn in place) reached the terminal only at the
// next newline when the launcher relays the output (--tag-output, --log-dir, --tee).
TEST(Launcher, AProgressBarIsRelayedAsItIsDrawn) {
  const std::string script = "printf 'step 1\\r'; sleep 2; printf 'step 2\\r'; printf 'done\\r\\n'";
  auto result = run({tool("LOCKSTEP_RUN"), "--tag-output", "/bin/sh", "-c", script});
  EXPECT_EQ(result.code(), 0) << result.err;
  EXPECT_EQ(result.out, "[rank 0] step 1\r[rank 0] step 2\r[rank 0] done\r\n");
  EXPECT_GE(result.first_return_seconds, 0);
  EXPECT_LT(result.first_return_seconds, 1.5) << "the first frame waited for the newline";
}

// Issue 23: an MPI program under lockstep-run ran as N MPI jobs of one process, without a word.
TEST(Launcher, AnMpiProgramIsToldHowToStart) {
  auto mpi =
      run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", tool("LOCKSTEP_FAKE_MPI_PROGRAM")});
  EXPECT_EQ(mpi.code(), 0) << mpi.err;
  EXPECT_TRUE(contains(mpi.err, "is an MPI program (it links libmpi.so.40)")) << mpi.err;
  EXPECT_TRUE(contains(mpi.err, "(mpirun -n 2 ")) << mpi.err;
  auto plain = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", tool("LOCKSTEP_EXAMPLE")});
  EXPECT_EQ(plain.code(), 0) << plain.err;
  EXPECT_FALSE(contains(plain.err, "MPI program")) << plain.err;
}

TEST(Launcher, GivesEachProcessTorchrunsVariables) {
  const std::string script =
      "echo $RANK/$LOCAL_RANK/$WORLD_SIZE/$LOCAL_WORLD_SIZE/$GROUP_RANK/"
      "$MASTER_ADDR/$MASTER_PORT/${LOCKSTEP_JOB_ID:+id}";
  auto result = run({tool("LOCKSTEP_RUN"), "--nproc_per_node=3", "--master-port", "4321",
                     "--tag-output", "/bin/sh", "-c", script});
  EXPECT_EQ(result.code(), 0) << result.err;
  for (int rank = 0; rank < 3; ++rank) {
    std::string line = "[rank " + std::to_string(rank) + "] " + std::to_string(rank) + "/" +
                       std::to_string(rank) + "/3/3/0/127.0.0.1/4321/id\n";
    EXPECT_TRUE(contains(result.out, line)) << result.out;
  }
}

// A rank holds no descriptor of the launcher's beyond its stdin, stdout and stderr (those this
// test itself holds open are inherited, and allowed): the launcher's own descriptor for
// /dev/null, opened without close-on-exec, stayed open in every rank's program.
TEST(Launcher, ARankHoldsNoDescriptorOfTheLaunchersBesideItsStdio) {
  std::set<int> ours;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ours.insert(std::stoi(entry.path().filename().string()));
  }
  auto result =
      run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "1", "/bin/ls", "-l", "/proc/self/fd"});
  EXPECT_EQ(result.code(), 0) << result.err;
  std::istringstream lines(result.out);
  int listed = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto arrow = line.find(" -> ");
    if (arrow == std::string::npos) {
      continue;  // "total 0"
    }
    const auto name = line.rfind(' ', arrow - 1);
    const int fd = std::stoi(line.substr(name + 1, arrow - name - 1));
    const std::string target = line.substr(arrow + 4);
    ++listed;
    const bool ls_own = target.starts_with("/proc/") && target.ends_with("/fd");
    EXPECT_TRUE(fd <= 2 || ours.count(fd) != 0 || ls_own) << "fd " << fd << " -> " << target;
  }
  EXPECT_GE(listed, 3) << result.out;
}

TEST(Launcher, TagsEveryLineWithItsRank) {
  auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", "--tag-output",
                     tool("LOCKSTEP_WORKER"), "print"});
  EXPECT_EQ(result.code(), 0) << result.err;
  for (int rank = 0; rank < 2; ++rank) {
    std::string r = std::to_string(rank);
    EXPECT_TRUE(contains(result.out, "[rank " + r + "] hello from " + r + "\n")) << result.out;
    EXPECT_TRUE(contains(result.out, "[rank " + r + "] partial line from " + r + "\n"))
        << result.out;
    EXPECT_TRUE(contains(result.err, "[rank " + r + "] error line from " + r + "\n")) << result.err;
  }
}

TEST(Launcher, AFailedRankStopsTheOthersAndIsReported) {
  auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "3", "--grace-period", "2",
                     tool("LOCKSTEP_WORKER"), "fail", "1", "3"});
  EXPECT_EQ(result.code(), 3) << result.err;
  EXPECT_TRUE(contains(result.err, "rank 1 (pid ")) << result.err;
  EXPECT_TRUE(contains(result.err, "exited with status 3")) << result.err;
  EXPECT_LT(result.seconds, 10) << "the sleeping ranks were not stopped";
}

TEST(Launcher, AKilledRankIsReportedWithItsSignal) {
  auto result = run(
      {tool("LOCKSTEP_RUN"), "--nproc-per-node", "3", tool("LOCKSTEP_WORKER"), "killself", "2"});
  EXPECT_EQ(result.code(), 128 + SIGKILL) << result.err;
  EXPECT_TRUE(contains(result.err, "rank 2 (pid ")) << result.err;
  EXPECT_TRUE(contains(result.err, "was killed by signal 9 (SIGKILL)")) << result.err;
  EXPECT_LT(result.seconds, 10);
}

TEST(Launcher, ForwardsSigintToTheRanks) {
  auto result =
      run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", tool("LOCKSTEP_WORKER"), "sleep"}, SIGINT,
          std::chrono::milliseconds(500));
  EXPECT_EQ(result.code(), 128 + SIGINT) << result.err;
  EXPECT_TRUE(contains(result.err, "received SIGINT; forwarding it to 2 rank(s)")) << result.err;
  EXPECT_LT(result.seconds, 5);
}

TEST(Launcher, KillsRanksThatIgnoreSigtermAfterTheGracePeriod) {
  auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", "--grace-period", "0.5",
                     tool("LOCKSTEP_WORKER"), "ignore-term"},
                    SIGTERM, std::chrono::milliseconds(500));
  EXPECT_EQ(result.code(), 128 + SIGTERM) << result.err;
  EXPECT_TRUE(contains(result.err, "grace period of 0.5 s over")) << result.err;
  EXPECT_LT(result.seconds, 5);
}

TEST(Launcher, RemovesTheSegmentOfAJobWhoseRanksWereKilled) {
  std::string id = "launcher-test-" + std::to_string(::getpid());
  const auto identity = lockstep::detail::job_identity(id + "@127.0.0.1:29500");
  auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", "--job-id", id,
                     tool("LOCKSTEP_WORKER"), "allkill"});
  EXPECT_EQ(result.code(), 128 + SIGKILL) << result.err;
  EXPECT_EQ(lockstep::detail::segments_of(identity, 0), std::vector<std::string>{})
      << "left behind";
}

// Issue 21 #2: another user who creates the file at a job's predictable segment name first
// stopped the job. The launcher's jobs are named by its random launch id as well: a squatter at
// the name the job id alone gives changes nothing.
TEST(Launcher, ASquatterAtThePredictableNameDoesNotStopTheJob) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root, to create a file owned by another user (nobody)";
  }
  const std::string id = "squatted-" + std::to_string(::getpid());
  const std::string path =
      "/dev/shm/" +
      lockstep::detail::segment_name(lockstep::detail::job_identity(id + "@127.0.0.1:29500"), 0);
  const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::fchown(fd, 65534, 65534), 0);
  ::close(fd);
  auto result =
      run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", "--job-id", id, tool("LOCKSTEP_WORKER")});
  EXPECT_EQ(result.code(), 0) << result.err;
  (void)::unlink(path.c_str());
}

struct BadFlags {
  std::vector<std::string> args;
  std::string message;
};

class LauncherFlags : public ::testing::TestWithParam<BadFlags> {};

TEST_P(LauncherFlags, AreRefusedWithAClearMessage) {
  std::vector<std::string> args{tool("LOCKSTEP_RUN")};
  for (const auto& arg : GetParam().args) {
    args.push_back(arg);
  }
  auto result = run(args);
  EXPECT_EQ(result.code(), 2) << result.err;
  EXPECT_TRUE(contains(result.err, GetParam().message)) << result.err;
  // One line, lockstep-run's, and no huge numbers (CLI11's own ranges print 1.8e308).
  EXPECT_TRUE(result.err.starts_with("lockstep-run: ")) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_LT(result.err.size(), 400U) << result.err;
}

INSTANTIATE_TEST_SUITE_P(
    Bad, LauncherFlags,
    ::testing::Values(
        BadFlags{{"--nproc-per-node", "0", "true"}, "--nproc-per-node"},
        BadFlags{{"--nproc-per-node", "two", "true"}, "--nproc-per-node"},
        BadFlags{{"--bogus", "true"}, "unknown option '--bogus'"},
        BadFlags{{"--nproc-per-node", "2"}, "no program given"},
        BadFlags{{"--node-rank", "1", "true"}, "must be below --nnodes"},
        BadFlags{{"--master-port", "70000", "true"}, "--master-port"},
        BadFlags{{"--wait-policy", "fast", "true"}, "--wait-policy"},
        BadFlags{{"--job-id", "", "true"}, "--job-id must not be empty"},
        BadFlags{{"--master-addr", "", "true"}, "--master-addr must not be empty"},
        BadFlags{{"--backend", "mpi", "true"}, "--backend"},
        BadFlags{{"--job-id", std::string(500, 'x'), "true"}, "--job-id is 500 characters long"},
        BadFlags{{"--cleanup", "true"}, "--cleanup runs no program"},
        BadFlags{{"--nproc-per-node", "abc", "true"},
                 "--nproc-per-node abc: not a number of processes from 1 to 4096, "
                 "nor auto, gpu or cpu"},
        BadFlags{{"--nproc-per-node", "5000", "true"}, "from 1 to 4096"},
        BadFlags{{"--node-rank", "-1", "true"}, "--node-rank -1 must be 0 or more"},
        BadFlags{{"--nnodes", "1:4", "true"}, "elastic sizes (MIN:MAX) are not"},
        BadFlags{{"--nnodes", "x", "true"}, "--nnodes x: not a number of nodes"},
        BadFlags{{"--max-restarts", "3", "true"}, "does not restart failed"},
        BadFlags{{"--max_restarts=3", "true"}, "does not restart failed"},
        BadFlags{{"--max-restarts", "x", "true"}, "--max-restarts x: not a number of restarts"},
        BadFlags{{"--monitor-interval", "-1", "true"}, "--monitor-interval -1: not a number"},
        BadFlags{{"--start-method", "thread", "true"}, "not one of spawn, fork, forkserver"},
        BadFlags{{"--rdzv-backend", "etcd", "true"}, "no rendezvous backend but static and c10d"},
        BadFlags{{"--rdzv-conf", "join_timeout=900", "true"}, "no rendezvous backend"},
        BadFlags{{"--rdzv_endpoint", "::1:29400", "true"}, "an IPv6 address in brackets"},
        BadFlags{{"--rdzv-endpoint", "h:0", "true"}, "with a port from 1 to 65535"},
        BadFlags{{"--rdzv-endpoint", "h:1", "--master-port", "5", "true"},
                 "leave out --master-addr and --master-port"},
        BadFlags{{"--standalone", "--rdzv-endpoint", "h:1", "true"}, "leave out --standalone"},
        BadFlags{{"no-such-script.py"},
                 "cannot run 'no-such-script.py': No such file or directory (the Python script"},
        BadFlags{{"--nproc-per-node"}, "--nproc-per-node"},
        BadFlags{{"--redirects", "3", "true"}, "--redirects needs --log-dir"},
        BadFlags{{"--log-dir", "/tmp", "--tee", "4", "true"}, "--tee 4: not 0-3"},
        BadFlags{{"--nproc-per-node", "2", "--log-dir", "/tmp", "--tee", "2:1", "true"},
                 "with local ranks 0 to 1"},
        BadFlags{{"--local-ranks-filter", "0,x", "true"},
                 "--local-ranks-filter 0,x: not a list of local ranks"},
        // Issue 21: NaN passed the range check and killed at once.
        BadFlags{{"--grace-period", "nan", "true"}, "--grace-period nan: not a number"},
        BadFlags{{"--grace-period", "inf", "true"}, "--grace-period inf: not a number"}));

// --nproc-per-node cpu and auto (no GPU here) start one process per usable CPU; gpu without a
// device is refused, saying why.
TEST(Launcher, ProcessesPerNodeByCpusOrGpus) {
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  const int cpus = CPU_COUNT(&set);
  for (const char* how : {"cpu", "auto"}) {
    auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", how, "--dry-run", "true"});
    EXPECT_EQ(result.code(), 0) << result.err;
    if (std::string(how) == "auto" && contains(result.out, "CUDA")) {
      continue;
    }
    EXPECT_EQ(std::count(result.out.begin(), result.out.end(), '\n'), cpus) << how << result.out;
  }
  auto gpu = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "gpu", "--dry-run", "true"});
  if (gpu.code() == 0) {
    GTEST_SKIP() << "a CUDA device is visible here: gpu gave " << gpu.out;
  }
  EXPECT_EQ(gpu.code(), 2);
  EXPECT_TRUE(contains(gpu.err, "--nproc-per-node gpu: no CUDA device is visible (")) << gpu.err;
}

// LOCKSTEP_DEBUG=1: each process says once what it detected; LOCKSTEP_LOG=debug adds its join,
// leave and failed waits, each line with a UTC timestamp and the rank.
TEST(Launcher, DebugLinesSayWhatEachProcessDetected) {
  const std::string result_file = "/tmp/lockstep-launcher-debug-" + std::to_string(::getpid());
  auto info = run({"/usr/bin/env", "LOCKSTEP_DEBUG=1", tool("LOCKSTEP_RUN"), "--nproc-per-node",
                   "3", "--wait-policy", "block", tool("LOCKSTEP_EXAMPLE"), result_file});
  EXPECT_EQ(info.code(), 0) << info.err;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string r = std::to_string(rank);
    EXPECT_EQ(count(info.err, "rank " + r + "] process " + r + " of 3, local " + r +
                                  " of 3, node 0 of 1; from lockstep-run (RANK=" + r +
                                  " WORLD_SIZE=3 LOCAL_RANK=" + r),
              1)
        << info.err;
  }
  EXPECT_EQ(count(info.err, "; segment /dev/shm/lockstep-u"), 3) << info.err;
  // How a dead peer is noticed (issue 24): each process watches the others' pidfds.
  EXPECT_EQ(count(info.err, "; wait policy block; peers watched (pidfds); joined in "), 3)
      << info.err;
  EXPECT_EQ(count(info.err, "leaving the job"), 0) << info.err;
  auto debug = run({"/usr/bin/env", "LOCKSTEP_LOG=debug", tool("LOCKSTEP_RUN"), "--nproc-per-node",
                    "2", tool("LOCKSTEP_EXAMPLE"), result_file});
  EXPECT_EQ(debug.code(), 0) << debug.err;
  EXPECT_EQ(count(debug.err, "] joining the job (lockstep-run)"), 2) << debug.err;
  EXPECT_EQ(count(debug.err, "] leaving the job"), 2) << debug.err;
  EXPECT_EQ(count(debug.err, "lockstep [20"), 6) << debug.err;  // a timestamp on each line
  auto quiet =
      run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", tool("LOCKSTEP_EXAMPLE"), result_file});
  EXPECT_EQ(count(quiet.err, "lockstep ["), 0) << quiet.err;
  ::unlink(result_file.c_str());
}

// The one run folder under `dir` (--log-dir makes one per run).
std::string run_folder(const std::string& dir) {
  std::string found;
  if (DIR* listing = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      if (std::string(entry->d_name).starts_with("run-")) {
        found = dir + "/" + entry->d_name;
      }
    }
    ::closedir(listing);
  }
  return found;
}

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// --log-dir: every process's stdout and stderr in owner-only files of a folder of this run's,
// and on the console too (as --tee 3).
TEST(Launcher, LogDirKeepsEachProcesssOutput) {
  const std::string dir = "/tmp/lockstep-logs-" + std::to_string(::getpid());
  // stderr's last line has no newline: the file holds exactly what the rank wrote (issue 45: the
  // launcher added one), the console gets the line ended.
  auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "3", "--log-dir", dir, "sh", "-c",
                     "echo out $RANK; printf 'err %s' $RANK >&2"});
  EXPECT_EQ(result.code(), 0) << result.err;
  const std::string folder = run_folder(dir);
  ASSERT_FALSE(folder.empty()) << result.err;
  EXPECT_TRUE(contains(result.err, "logs of each process in " + folder)) << result.err;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string r = std::to_string(rank);
    EXPECT_EQ(read_text(folder + "/rank" + r + ".stdout"), "out " + r + "\n");
    EXPECT_EQ(read_text(folder + "/rank" + r + ".stderr"), "err " + r);
    EXPECT_EQ(count(result.err, "err " + r + "\n"), 1) << result.err;
    struct stat st {};
    ASSERT_EQ(::stat((folder + "/rank" + r + ".stdout").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600U);
    EXPECT_EQ(count(result.out, "out " + r + "\n"), 1) << result.out;
  }
  struct stat st {};
  ASSERT_EQ(::stat(folder.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700U);
  (void)std::system(("rm -rf " + dir).c_str());  // NOLINT(concurrency-mt-unsafe, cert-env33-c)
}

// --redirects: the streams go to the files only; a process that fails has its last lines
// repeated by the launcher; --local-ranks-filter hides the others' console output.
TEST(Launcher, RedirectedOutputOfAFailedProcessIsShownByTheLauncher) {
  const std::string dir = "/tmp/lockstep-logs-r-" + std::to_string(::getpid());
  const std::string script =
      "echo out $RANK; i=0; while [ $i -lt 15 ]; do i=$((i+1)); echo \"line $i of $RANK\" >&2; "
      "done; if [ $RANK = 2 ]; then sleep 0.5; exit 3; fi; sleep 5";
  auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "3", "--log-dir", dir, "--redirects",
                     "2:2", "--local-ranks-filter", "0,2", "sh", "-c", script});
  EXPECT_EQ(result.code(), 3) << result.err;
  const std::string folder = run_folder(dir);
  EXPECT_TRUE(contains(result.err, "the last lines of rank 2's stderr (" + folder +
                                       "/rank2.stderr):\n  line 6 of 2\n"))
      << result.err;
  EXPECT_TRUE(contains(result.err, "  line 15 of 2\n")) << result.err;
  EXPECT_FALSE(contains(result.err, "line 5 of 2\n")) << result.err;
  EXPECT_EQ(count(read_text(folder + "/rank2.stderr"), "\n"), 15);
  EXPECT_EQ(count(result.out, "out 0"), 1) << result.out;
  EXPECT_EQ(count(result.out, "out 2"), 1) << result.out;
  EXPECT_EQ(count(result.out, "out 1"), 0) << result.out;  // filtered out of the console
  EXPECT_EQ(read_text(folder + "/rank1.stdout"), "");      // --redirects 2:2 alone: no tee
  (void)std::system(("rm -rf " + dir).c_str());  // NOLINT(concurrency-mt-unsafe, cert-env33-c)
}

// Issue 21 #3: --log-dir on a full disk lost the output silently. Now the launcher says so once
// per file, naming it and the error, and the output goes on to the terminal: in full where it was
// teed, from there on where it was redirected. Runs in a mount namespace with a 64 KiB tmpfs as
// the log folder; each rank writes about 250 KB, the last line long (300 KB before its newline;
// rank 1's a second after rank 0's, so that the two rarely interleave).
TEST(Launcher, ALogDirThatCannotBeWrittenIsSaidOnceAndTheTerminalKeepsTheOutput) {
  const std::string dir = "/tmp/lockstep-full-logs-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string job =
      "i=0; while [ $i -lt 4000 ]; do echo \"line $i of rank $RANK, to fill the disk\"; "
      "i=$((i+1)); done; [ $RANK = 1 ] && sleep 1; head -c 300000 /dev/zero | tr \\\\0 x; echo \" "
      "end of $RANK\"";
  const std::string script = "mount -t tmpfs -o size=64k tmpfs " + dir + " || exit 77; exec " +
                             tool("LOCKSTEP_RUN") + " --nproc-per-node 2 --log-dir " + dir +
                             " --tee 0:1 --redirects 1:1 sh -c '" + job + "'";
  auto result = run({"/usr/bin/unshare", "-m", "--propagation", "private", "sh", "-c", script});
  ::rmdir(dir.c_str());
  if (result.code() == 77) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root in a mount namespace): " << result.err;
  }
  EXPECT_EQ(result.code(), 0) << result.err;
  EXPECT_EQ(count(result.err, "lockstep-run: cannot write " + dir), 2) << result.err;
  EXPECT_TRUE(contains(result.err,
                       "/rank0.stdout: No space left on device; rank 0's stdout goes "
                       "on to the terminal only from here"))
      << result.err;
  EXPECT_TRUE(contains(result.err,
                       "/rank1.stdout: No space left on device; rank 1's stdout goes "
                       "on to the terminal instead from here"))
      << result.err;
  // Rank 0's stdout was teed: all of it on the terminal; rank 1's from the failure on, its long
  // last line too.
  EXPECT_EQ(count(result.out, "of rank 0,"), 4000);
  EXPECT_GT(count(result.out, "of rank 1,"), 0);
  // The long lines are relayed in pieces as they come (the two may interleave, even before a
  // line's last words), none lost.
  EXPECT_EQ(std::count(result.out.begin(), result.out.end(), 'x'), 600000);
  EXPECT_TRUE(contains(result.out, " end of 0\n"));
  EXPECT_TRUE(contains(result.out, " end of 1\n"));
}

// --cpu-bind: the mask each process gets. core: local rank r on the r-th usable CPU (wrapping);
// numa: the CPUs of NUMA node r mod nodes (one node here: all of them); gpu without a GPU and an
// unknown mode refused. (A machine with several NUMA nodes or a GPU was not available to test the
// other cases.)
TEST(Launcher, CpuBindGivesEachProcessItsCpus) {
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) {
      cpus.push_back(cpu);
    }
  }
  const int n = static_cast<int>(cpus.size()) + 1;  // one more than CPUs: the last wraps
  auto core =
      run({tool("LOCKSTEP_RUN"), "--nproc-per-node", std::to_string(n), "--cpu-bind", "core", "sh",
           "-c", "echo \"$LOCAL_RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)\""});
  EXPECT_EQ(core.code(), 0) << core.err;
  for (int r = 0; r < n; ++r) {
    const int cpu = cpus[static_cast<std::size_t>(r) % cpus.size()];
    EXPECT_EQ(count(core.out, std::to_string(r) + " " + std::to_string(cpu) + "\n"), 1) << core.out;
  }
  auto numa = run(
      {tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", "--cpu-bind", "numa", "--dry-run", "true"});
  if (numa.code() == 0) {
    EXPECT_EQ(count(numa.out, " on CPUs "), 2) << numa.out;
  } else {
    EXPECT_TRUE(contains(numa.err, "shows no NUMA nodes")) << numa.err;
  }
  auto gpu = run({tool("LOCKSTEP_RUN"), "--cpu-bind", "gpu", "true"});
  if (gpu.code() != 0) {
    EXPECT_TRUE(contains(gpu.err, "--cpu-bind gpu: cannot tell local rank 0's GPU (")) << gpu.err;
  }
  auto bad = run({tool("LOCKSTEP_RUN"), "--cpu-bind", "socket", "true"});
  EXPECT_EQ(bad.code(), 2);
  EXPECT_TRUE(contains(bad.err, "--cpu-bind socket: not one of none, core, numa, gpu")) << bad.err;
  auto none = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", "--dry-run", "true"});
  EXPECT_EQ(count(none.out, " on CPUs "), 0) << none.out;
}

// A process that has not joined after 5 s is named, once; a job that joins at once hears
// nothing.
TEST(Launcher, NamesTheProcessesNotJoinedAfterFiveSeconds) {
  auto late = run(
      {tool("LOCKSTEP_RUN"), "--nproc-per-node", "3", tool("LOCKSTEP_WORKER"), "late", "2", "7"});
  EXPECT_EQ(late.code(), 0) << late.err;
  EXPECT_EQ(count(late.err,
                  "lockstep-run: after 5 s, rank 2 of this node has not joined the job "
                  "yet (still starting, or stuck before its first lockstep::State)"),
            1)
      << late.err;
  auto quick = run(
      {tool("LOCKSTEP_RUN"), "--nproc-per-node", "3", tool("LOCKSTEP_WORKER"), "late", "2", "0"});
  EXPECT_EQ(quick.code(), 0) << quick.err;
  EXPECT_EQ(count(quick.err, "not joined"), 0) << quick.err;
}

// --dry-run prints each rank's environment and command, shell-quoted, and starts nothing.
TEST(Launcher, DryRunPrintsEachRankAndStartsNothing) {
  const std::string marker = "/tmp/lockstep-dry-run-" + std::to_string(::getpid());
  auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "3", "--dry-run", "--job-id", "dry",
                     "touch", marker, "a b"});
  EXPECT_EQ(result.code(), 0) << result.err;
  EXPECT_NE(::access(marker.c_str(), F_OK), 0) << "--dry-run ran the program";
  for (int rank = 0; rank < 3; ++rank) {
    const std::string r = std::to_string(rank);
    EXPECT_TRUE(contains(result.out, "rank " + r + ": RANK=" + r + " LOCAL_RANK=" + r +
                                         " WORLD_SIZE=3 LOCAL_WORLD_SIZE=3"))
        << result.out;
  }
  EXPECT_TRUE(contains(result.out, "LOCKSTEP_JOB_ID=dry@127.0.0.1:29500")) << result.out;
  EXPECT_TRUE(contains(result.out, "OMP_NUM_THREADS=1 touch " + marker + " 'a b'\n")) << result.out;
  EXPECT_FALSE(contains(result.out, "secret:")) << "one node needs no secret: " << result.out;
  // Several nodes: which secret the nodes will prove, and where it comes from.
  auto nodes =
      run({"/usr/bin/env", "LOCKSTEP_SECRET=0123456789abcdef", tool("LOCKSTEP_RUN"), "--nnodes",
           "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--dry-run", "true"});
  EXPECT_EQ(nodes.code(), 0) << nodes.err;
  EXPECT_TRUE(contains(nodes.out, "secret: LOCKSTEP_SECRET\n")) << nodes.out;
}

// Issue 21: a newline inside an argument broke --dry-run's one line per process. A word with a
// control character is printed in $'...', which bash reads back as it was.
TEST(Launcher, DryRunKeepsAnArgumentWithANewlineOnItsLine) {
  const std::string word = "two\nlines\tand 'quotes' \\ \x01";
  auto result =
      run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", "--dry-run", "printf", "%s", word});
  EXPECT_EQ(result.code(), 0) << result.err;
  EXPECT_EQ(count(result.out, "\n"), 2) << result.out;
  const std::string line = result.out.substr(0, result.out.find('\n'));
  const std::string printed = line.substr(line.find(" printf ") + 1);
  auto back = run({"/bin/bash", "-c", printed});  // the command as the user would paste it
  EXPECT_EQ(back.out, word) << printed;
}

// Issue 21: a rank that exits 0 left its child, which ignores SIGTERM, running after
// lockstep-run returned. It is killed after the grace period, as a failed job's ranks are.
TEST(Launcher, WhatARankLeavesRunningIsKilledAfterTheGracePeriod) {
  const std::string pidfile = "/tmp/lockstep-linger-" + std::to_string(::getpid());
  auto result = run({tool("LOCKSTEP_RUN"), "--grace-period", "1", "sh", "-c",
                     "trap '' TERM; sleep 60 >/dev/null 2>&1 & echo $! > " + pidfile + "; exit 0"});
  EXPECT_EQ(result.code(), 0) << result.err;
  std::ifstream in(pidfile);
  pid_t pid = 0;
  in >> pid;
  ::unlink(pidfile.c_str());
  ASSERT_GT(pid, 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!ended(pid) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(ended(pid)) << "the rank's child (pid " << pid << ") still runs";
  if (!ended(pid)) {
    ::kill(pid, SIGKILL);
  }
  EXPECT_TRUE(contains(result.err, "killing what the ranks left running")) << result.err;
}

// Several processes get OMP_NUM_THREADS=1 with a notice, unless the user set it; one gets none.
TEST(Launcher, SetsOmpNumThreadsForSeveralProcessesUnlessGiven) {
  auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", "sh", "-c",
                     "echo \"threads=${OMP_NUM_THREADS:-unset}\""});
  EXPECT_EQ(result.code(), 0) << result.err;
  EXPECT_EQ(std::count(result.out.begin(), result.out.end(), '1'), 2) << result.out;
  EXPECT_TRUE(contains(result.err, "setting OMP_NUM_THREADS=1 for each of the 2 processes"))
      << result.err;
  auto one = run({tool("LOCKSTEP_RUN"), "sh", "-c", "echo \"threads=${OMP_NUM_THREADS:-unset}\""});
  EXPECT_EQ(one.out, "threads=unset\n");
  EXPECT_FALSE(contains(one.err, "OMP_NUM_THREADS")) << one.err;
  auto given = run({"/usr/bin/env", "OMP_NUM_THREADS=3", tool("LOCKSTEP_RUN"), "--nproc-per-node",
                    "2", "sh", "-c", "echo \"threads=${OMP_NUM_THREADS:-unset}\""});
  EXPECT_EQ(given.out, "threads=3\nthreads=3\n");
  EXPECT_FALSE(contains(given.err, "OMP_NUM_THREADS")) << given.err;
}

TEST(Launcher, RanksAreStoppedWhenTheLauncherIsKilled) {
  // The launcher is SIGKILLed: it cannot forward anything, so the ranks must learn it by
  // themselves (PR_SET_PDEATHSIG) instead of running on as orphans.
  std::string marker = "/tmp/lockstep-orphan-" + std::to_string(::getpid());
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string script = "echo $$ > " + marker + ".$RANK; exec sleep 60";
    ::execl(tool("LOCKSTEP_RUN").c_str(), "lockstep-run", "--nproc-per-node", "2", "/bin/sh", "-c",
            script.c_str(), nullptr);
    ::_exit(126);
  }
  std::vector<pid_t> ranks;
  for (int attempt = 0; attempt < 500 && ranks.size() < 2; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ranks.clear();
    for (int rank = 0; rank < 2; ++rank) {
      std::ifstream file(marker + "." + std::to_string(rank));
      pid_t rank_pid = 0;
      if (file >> rank_pid) {
        ranks.push_back(rank_pid);
      }
    }
  }
  ASSERT_EQ(ranks.size(), 2U);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  for (pid_t rank_pid : ranks) {
    bool gone = false;
    for (int attempt = 0; attempt < 200 && !gone; ++attempt) {
      gone = ::kill(rank_pid, 0) != 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(gone) << "rank pid " << rank_pid << " outlived its launcher";
    ::kill(rank_pid, SIGKILL);
  }
  for (int rank = 0; rank < 2; ++rank) {
    ::unlink((marker + "." + std::to_string(rank)).c_str());
  }
}

// Issue 12: a launcher killed with SIGKILL left its segment for good (its ranks die of SIGTERM
// without leaving, and the random job id means no later job reclaims it). lockstep-run --cleanup
// removes it, and so does the next lockstep-run without being asked.
TEST(Launcher, ASegmentLeftByAKilledLauncherIsCleanedUp) {
  for (const bool ask : {true, false}) {
    const std::string id = "killed-launcher-" + std::to_string(::getpid()) + (ask ? "a" : "b");
    const auto identity = lockstep::detail::job_identity(id + "@127.0.0.1:29500");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl(tool("LOCKSTEP_RUN").c_str(), "lockstep-run", "--nproc-per-node", "2", "--job-id",
              id.c_str(), tool("LOCKSTEP_WORKER").c_str(), "sleep", nullptr);
      ::_exit(126);
    }
    // The name carries the launcher's random launch id: found by the job's identity.
    std::vector<std::string> names;
    for (int attempt = 0; attempt < 500 && names.empty(); ++attempt) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      names = lockstep::detail::segments_of(identity, 0);
    }
    ASSERT_EQ(names.size(), 1U);
    const std::string path = "/dev/shm/" + names.front();
    struct stat st {};
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both ranks joined
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the ranks die (SIGTERM)
    ASSERT_EQ(::stat(path.c_str(), &st), 0) << "the test needs the segment left behind";
    for (int attempt = 0; attempt < 50 && ::stat(path.c_str(), &st) == 0; ++attempt) {
      if (ask) {
        auto result = run({tool("LOCKSTEP_RUN"), "--cleanup"});
        EXPECT_EQ(result.code(), 0) << result.err;
        if (::stat(path.c_str(), &st) != 0) {
          EXPECT_TRUE(contains(result.out, "removed " + path)) << result.out;
        }
      } else {
        auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", tool("LOCKSTEP_WORKER")});
        EXPECT_EQ(result.code(), 0) << result.err;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_NE(::stat(path.c_str(), &st), 0) << path << " was left behind (ask=" << ask << ")";
  }
}

// Issue 12: with /dev/shm full, lockstep-run itself died of SIGBUS (in its stale-segment check)
// and so did every rank. Now the ranks fail with a SystemError naming the full /dev/shm and the
// launcher reports it. Runs in a mount namespace with a full 1 MiB tmpfs on /dev/shm.
TEST(Launcher, AFullDevShmIsReportedNotACrash) {
  int err[2];
  ASSERT_EQ(::pipe2(err, O_CLOEXEC), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(err[1], STDERR_FILENO);
    if (!lockstep::testing::mount_full_dev_shm()) {
      ::_exit(77);
    }
    ::execl(tool("LOCKSTEP_RUN").c_str(), "lockstep-run", "--nproc-per-node", "2",
            tool("LOCKSTEP_WORKER").c_str(), nullptr);
    ::_exit(126);
  }
  ::close(err[1]);
  std::string output;
  char buffer[4096];
  for (ssize_t got = 0; (got = ::read(err[0], buffer, sizeof buffer)) > 0;) {
    output.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(err[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    GTEST_SKIP() << "cannot mount a small tmpfs on /dev/shm here (needs root in a mount namespace)";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "lockstep-run was killed by signal " << WTERMSIG(status);
  // The worker does not catch the error (std::terminate): the launcher reports that rank.
  EXPECT_NE(WEXITSTATUS(status), 0) << output;
  EXPECT_NE(WEXITSTATUS(status), 128 + SIGBUS) << output;
  EXPECT_TRUE(contains(output, "/dev/shm is full")) << output;
  EXPECT_FALSE(contains(output, "signal 7")) << output;  // no rank died of SIGBUS
}

// Issue 23, torchrun's habits: a .py program runs with python3 -u, -m runs a module, --no-python
// runs the program as it is, -r and -t are --redirects and --tee, --standalone takes a free port.
TEST(Launcher, RunsPythonAsTorchrunDoes) {
  const std::string dir = "/tmp/lockstep-python-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  // One write per line: unbuffered, print() writes each argument on its own, and the two ranks'
  // words would interleave on the shared terminal.
  std::ofstream(dir + "/job_script.py")
      << "import os, sys\nsys.stdout.write(f\"script {os.environ['RANK']} {sys.argv[1:]} "
         "{sys.stdout.write_through}\\n\")\n";
  std::ofstream(dir + "/job_module.py")
      << "import os, sys\nsys.stdout.write(f\"module {os.environ['RANK']} {sys.argv[1:]}\\n\")\n";
  // Without PYTHONUNBUFFERED (which may be set here), so that only -u makes it unbuffered.
  auto script = run({"/usr/bin/env", "-u", "PYTHONUNBUFFERED", tool("LOCKSTEP_RUN"),
                     "--nproc-per-node", "2", dir + "/job_script.py", "a"});
  EXPECT_EQ(script.code(), 0) << script.err;
  EXPECT_TRUE(contains(script.out, "script 0 ['a'] True\n")) << script.out;  // python3 -u
  EXPECT_TRUE(contains(script.out, "script 1 ['a'] True\n")) << script.out;
  auto module = run({"/usr/bin/env", "PYTHONPATH=" + dir, tool("LOCKSTEP_RUN"), "--nproc-per-node",
                     "2", "-m", "job_module", "b"});
  EXPECT_EQ(module.code(), 0) << module.err;
  EXPECT_TRUE(contains(module.out, "module 1 ['b']\n")) << module.out;
  auto dry = run({tool("LOCKSTEP_RUN"), "--dry-run", dir + "/job_script.py"});
  EXPECT_TRUE(contains(dry.out, " python3 -u " + dir + "/job_script.py\n")) << dry.out;
  // --no-python: the file itself (not executable here), which cannot be run.
  auto plain = run({tool("LOCKSTEP_RUN"), "--no-python", dir + "/job_script.py"});
  EXPECT_NE(plain.code(), 0);
  EXPECT_TRUE(contains(plain.err, "cannot run '" + dir + "/job_script.py'")) << plain.err;
  auto both = run({tool("LOCKSTEP_RUN"), "-m", "--no-python", "job_module"});
  EXPECT_EQ(both.code(), 2);
  EXPECT_TRUE(contains(both.err, "give one of them")) << both.err;
  auto logs = run({tool("LOCKSTEP_RUN"), "--log-dir", dir, "-r", "1", "-t", "2", "sh", "-c",
                   "echo out; echo err >&2"});
  EXPECT_EQ(logs.code(), 0) << logs.err;
  EXPECT_FALSE(contains(logs.out, "out\n")) << logs.out;  // redirected: the file only
  EXPECT_TRUE(contains(logs.err, "err\n")) << logs.err;   // teed: the console too
  // --standalone: a free port, not 29500; one given is kept; more nodes refused.
  auto standalone = run({tool("LOCKSTEP_RUN"), "--standalone", "--dry-run", "true"});
  EXPECT_EQ(standalone.code(), 0) << standalone.err;
  EXPECT_TRUE(contains(standalone.out, "MASTER_PORT=")) << standalone.out;
  EXPECT_FALSE(contains(standalone.out, "MASTER_PORT=29500 ")) << standalone.out;
  auto given =
      run({tool("LOCKSTEP_RUN"), "--standalone", "--master-port", "4321", "--dry-run", "true"});
  EXPECT_TRUE(contains(given.out, "MASTER_PORT=4321 ")) << given.out;
  auto nodes = run({tool("LOCKSTEP_RUN"), "--standalone", "--nnodes", "2", "true"});
  EXPECT_EQ(nodes.code(), 2);
  EXPECT_TRUE(contains(nodes.err, "--standalone is a job of one node")) << nodes.err;
  (void)std::system(("rm -rf " + dir).c_str());  // NOLINT(concurrency-mt-unsafe, cert-env33-c)
}

// Issue 46: torchrun command lines copied from real scripts ran nowhere (exit 2). The flags whose
// values lockstep-run already has are accepted; c10d's endpoint stands for node 0's address and
// port; the ranks get torchrun's TORCHELASTIC_* variables; PYTHON_EXEC names the interpreter.
TEST(Launcher, TorchrunCommandLinesFromRealScriptsRun) {
  auto dry =
      run({tool("LOCKSTEP_RUN"), "--nnodes", "1", "--nproc_per_node", "2", "--max-restarts", "0",
           "--monitor-interval", "5", "--start-method", "spawn", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:29555", "--rdzv-id", "myjob", "--dry-run", "true"});
  EXPECT_EQ(dry.code(), 0) << dry.err;
  EXPECT_TRUE(contains(dry.out, " MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 ")) << dry.out;
  EXPECT_TRUE(contains(dry.out, " LOCKSTEP_JOB_ID=myjob@127.0.0.1:29555 ")) << dry.out;
  EXPECT_TRUE(contains(dry.out,
                       " TORCHELASTIC_RUN_ID=myjob@127.0.0.1:29555 "
                       "TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0 "))
      << dry.out;
  auto v6 = run({tool("LOCKSTEP_RUN"), "--rdzv_endpoint=[::1]", "--dry-run", "true"});
  EXPECT_TRUE(contains(v6.out, " MASTER_ADDR=::1 MASTER_PORT=29400 ")) << v6.out;  // torchrun's
  const std::string dir = "/tmp/lockstep-pyexec-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  // An interpreter of the user's choosing: a wrapper that says it ran, then runs python3.
  std::ofstream(dir + "/my-python") << "#!/bin/sh\necho \"my-python $*\"\nexec python3 \"$@\"\n";
  ASSERT_EQ(::chmod((dir + "/my-python").c_str(), 0700), 0);
  std::ofstream(dir + "/job.py") << "import os\nprint('job', os.environ['RANK'])\n";
  auto ran = run({"/usr/bin/env", "PYTHON_EXEC=" + dir + "/my-python", tool("LOCKSTEP_RUN"),
                  "--nproc-per-node", "2", "--tag-output", dir + "/job.py"});
  EXPECT_EQ(ran.code(), 0) << ran.err;
  EXPECT_TRUE(contains(ran.out, "[rank 1] my-python -u " + dir + "/job.py\n")) << ran.out;
  EXPECT_TRUE(contains(ran.out, "[rank 1] job 1\n")) << ran.out;
  auto empty = run({"/usr/bin/env", "PYTHON_EXEC=", tool("LOCKSTEP_RUN"), dir + "/job.py"});
  EXPECT_EQ(empty.code(), 2);
  EXPECT_TRUE(contains(empty.err, "PYTHON_EXEC is set but empty")) << empty.err;
  (void)std::system(("rm -rf " + dir).c_str());  // NOLINT(concurrency-mt-unsafe, cert-env33-c)
}

// Issues 45 and 46: started inside another job (mpirun, srun, a shell that ran one), lockstep-run
// gave its ranks that job's OMPI_* and a stale LOCKSTEP_MASTER_PORT (which outranks MASTER_PORT);
// it clears them, --dry-run says which, and several lockstep-runs on one machine under mpirun
// are warned about.
TEST(Launcher, AnotherJobsVariablesDoNotReachTheRanks) {
  const std::string show =
      "echo \"$RANK ${OMPI_COMM_WORLD_SIZE-none} ${LOCKSTEP_MASTER_PORT-none} "
      "${LOCKSTEP_WAIT_POLICY-none}\"";
  auto ran = run({"/usr/bin/env", "OMPI_COMM_WORLD_SIZE=8", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
                  "LOCKSTEP_MASTER_PORT=1", "LOCKSTEP_WAIT_POLICY=block", tool("LOCKSTEP_RUN"),
                  "--nproc-per-node", "2", "--tag-output", "sh", "-c", show});
  EXPECT_EQ(ran.code(), 0) << ran.err;
  // The user's choice of wait policy passes; the other job's variables do not.
  EXPECT_TRUE(contains(ran.out, "[rank 0] 0 none none block\n")) << ran.out;
  EXPECT_TRUE(contains(ran.out, "[rank 1] 1 none none block\n")) << ran.out;
  EXPECT_TRUE(contains(ran.err,
                       "warning: lockstep-run itself runs under an MPI launcher "
                       "(OMPI_COMM_WORLD_LOCAL_SIZE=2)"))
      << ran.err;
  auto dry = run({"/usr/bin/env", "OMPI_COMM_WORLD_SIZE=8", "LOCKSTEP_MASTER_PORT=1",
                  tool("LOCKSTEP_RUN"), "--dry-run", "true"});
  EXPECT_TRUE(contains(dry.out,
                       "cleared from each rank's environment (another job's): "
                       "OMPI_COMM_WORLD_SIZE LOCKSTEP_MASTER_PORT\n"))
      << dry.out;
  EXPECT_FALSE(contains(dry.err, "MPI launcher")) << dry.err;  // one process per machine: fine
}

// Issue 46: Python processes that lockstep-run runs unbuffered (python3 -u, as torchrun) write a
// print() in pieces, and two of them on one terminal cut each other's lines (7 of 20 there).
// Relayed, every line arrives whole; a line's start that waits more than a second for its end
// (a prompt, "working...") is shown as it is, not held.
TEST(Launcher, PythonProcessesPrintWholeLines) {
  const std::string dir = "/tmp/lockstep-lines-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  // Each argument a separate write, 1 ms apart (an object slow to format, a tensor).
  std::ofstream(dir + "/lines.py") << "import os, time\n"
                                      "class Slow:\n"
                                      "    def __str__(self):\n"
                                      "        time.sleep(0.001)\n"
                                      "        return 'slow'\n"
                                      "rank = os.environ['RANK']\n"
                                      "for i in range(40):\n"
                                      "    print('line', rank, i, Slow(), Slow(), 'end')\n";
  auto lines = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", dir + "/lines.py"});
  EXPECT_EQ(lines.code(), 0) << lines.err;
  std::istringstream text(lines.out);
  int whole = 0;
  for (std::string line; std::getline(text, line);) {
    const bool ok = (line.starts_with("line 0 ") || line.starts_with("line 1 ")) &&
                    line.ends_with(" slow slow end") && line.size() <= 24;
    EXPECT_TRUE(ok) << "a line cut: '" << line << "'";
    whole += ok ? 1 : 0;
  }
  EXPECT_EQ(whole, 80) << lines.out;
  std::ofstream(dir + "/pause.py") << "import os, time\n"
                                      "if os.environ['RANK'] == '0':\n"
                                      "    print('working...', end='')\n"
                                      "    time.sleep(3)\n"
                                      "    print(' done')\n";
  auto pause = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", dir + "/pause.py"});
  EXPECT_EQ(pause.code(), 0) << pause.err;
  EXPECT_EQ(pause.out, "working... done\n");
  EXPECT_GE(pause.first_out_seconds, 0);
  EXPECT_LT(pause.first_out_seconds, 2.5) << "the line's start waited for its end";
  (void)std::system(("rm -rf " + dir).c_str());  // NOLINT(concurrency-mt-unsafe, cert-env33-c)
}

// Issue 45: lockstep-run wrote the ranks' relayed output to its console itself, and blocked on a
// console that nobody read (a paused `| less`): a failed rank then did not stop the job until the
// reader came back. Here rank 0 writes without end, rank 1 fails after 0.5 s, and the launcher's
// stdout is a pipe that is read only after 4 s: by 3 s rank 0 must be stopped.
TEST(Launcher, AConsoleNobodyReadsDoesNotKeepAFailedJobRunning) {
  const std::string dir = "/tmp/lockstep-console-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string script = "if [ $RANK = 0 ]; then echo $$ > " + dir +
                             "/pid; while :; do echo 0123456789012345678901234567890123456789; "
                             "done; else sleep 0.5; exit 3; fi";
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  const std::string err_path = dir + "/err";
  const std::string launcher = tool("LOCKSTEP_RUN");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(err, STDERR_FILENO);
    ::execl(launcher.c_str(), launcher.c_str(), "--nproc-per-node", "2", "--tag-output", "/bin/sh",
            "-c", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(126);
  }
  ::close(out[1]);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const std::string rank0 = read_text(dir + "/pid");
  ASSERT_FALSE(rank0.empty()) << read_text(err_path);
  const bool stopped = ::kill(std::stoi(rank0), 0) != 0;
  std::this_thread::sleep_for(std::chrono::seconds(1));
  char buffer[65536];
  while (::read(out[0], buffer, sizeof buffer) > 0) {
  }
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(stopped) << "rank 0 still ran 2.5 s after rank 1 failed";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << read_text(err_path);
  EXPECT_TRUE(contains(read_text(err_path), "rank 1 (pid ")) << read_text(err_path);
  (void)std::system(("rm -rf " + dir).c_str());  // NOLINT(concurrency-mt-unsafe, cert-env33-c)
}

TEST(Launcher, HelpDocumentsEveryFlag) {
  auto result = run({tool("LOCKSTEP_RUN"), "--help"});
  EXPECT_EQ(result.code(), 0);
  for (const char* flag :
       {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--job-id",
        "--tag-output", "--grace-period", "--wait-policy", "--standalone", "--cleanup", "--version",
        "--module", "--no-python", "--redirects", "--tee"}) {
    EXPECT_TRUE(contains(result.out, flag)) << flag;
  }
}

// Every option --help prints is in the manual page, in the man page's escaped spelling.
TEST(Launcher, TheManualPageNamesEveryOptionOfHelp) {
  auto result = run({tool("LOCKSTEP_RUN"), "--help"});
  ASSERT_EQ(result.code(), 0);
  std::ifstream file(tool("LOCKSTEP_MAN"));
  ASSERT_TRUE(file) << "cannot read " << tool("LOCKSTEP_MAN");
  std::stringstream text;
  text << file.rdbuf();
  std::string man = text.str();
  for (std::size_t at = man.find("\\-"); at != std::string::npos; at = man.find("\\-", at)) {
    man.replace(at, 2, "-");  // roff's "\\-\\-nnodes" is "--nnodes"
  }
  int options = 0;
  for (std::size_t at = result.out.find("--"); at != std::string::npos;
       at = result.out.find("--", at + 2)) {
    std::size_t end = result.out.find_first_not_of("abcdefghijklmnopqrstuvwxyz-_", at + 2);
    const std::string option = result.out.substr(at, end - at);
    if (option.size() > 2) {
      ++options;
      EXPECT_TRUE(contains(man, option)) << option << " is in --help but not in the man page";
    }
  }
  EXPECT_GT(options, 10);
}

TEST(Launcher, AProgramThatCannotRunIsReported) {
  auto result = run({tool("LOCKSTEP_RUN"), "--nproc-per-node", "2", "no-such-program-x"});
  EXPECT_EQ(result.code(), 127);
  EXPECT_TRUE(contains(result.err, "cannot run 'no-such-program-x': not found in PATH"))
      << result.err;
}

}  // namespace
