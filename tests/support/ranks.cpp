#include "ranks.hpp"

#include "job/launch_env.hpp"

#include "engine/segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace lockstep::testing {

bool RankEnd::ok() const {
  return !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool RankEnd::killed_by(int sig) const {
  return !timed_out && WIFSIGNALED(status) && WTERMSIG(status) == sig;
}

int RankEnd::exit_code() const {
  return !timed_out && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string RankEnd::describe() const {
  std::string who = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ")";
  if (timed_out) {
    return who + " did not finish in time and was killed";
  }
  if (WIFEXITED(status)) {
    return who + " exited with status " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    return who + " was killed by signal " + std::to_string(WTERMSIG(status));
  }
  return who + " ended with wait status " + std::to_string(status);
}

bool path_exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

char task_state(const std::string& stat_path) {
  std::ifstream file(stat_path);
  std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 ? stat[close + 2] : '\0';
}

bool ended(pid_t pid) {
  const char state = task_state("/proc/" + std::to_string(pid) + "/stat");
  return state == '\0' || state == 'Z';
}

std::string unique_job_id(const std::string& hint) {
  static std::atomic<int> counter{0};
  return "test-" + hint + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

void* shared_bytes(std::size_t size) {
  void* memory = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    throw std::runtime_error("mmap of shared test memory failed");
  }
  std::memset(memory, 0, size);
  return memory;
}

namespace {

[[noreturn]] void child(const Job& job, const std::string& id, int rank,
                        const std::function<void(int)>& body) {
  for (const auto& name : lockstep::detail::job_variables()) {
    ::unsetenv(name.c_str());
  }
  if (!job.plain) {
    lockstep::detail::LaunchSpec spec;
    spec.rank = rank;
    spec.local_rank = rank;
    spec.world_size = job.processes;
    spec.local_size = job.processes;
    spec.job_id = id;
    for (const auto& [name, value] : lockstep::detail::job_environment(spec)) {
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  for (const auto& [name, value] : job.env) {
    if (value.empty()) {
      ::unsetenv(name.c_str());
    } else {
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  int code = 0;
  try {
    body(rank);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
    code = 1;
  } catch (...) {
    std::fprintf(stderr, "rank %d: unknown exception\n", rank);
    code = 1;
  }
  std::fflush(nullptr);
  // exit, not _exit: the process leaves the job in its static destructors, as a program does.
  std::exit(code);  // NOLINT(concurrency-mt-unsafe)
}

// The node segments of the jobs this test process started. At its exit, those that ranks which
// crashed or were killed left behind are removed, as lockstep-run removes them: a test's own
// checks may need such a segment while it runs (a stale one, to be replaced), never after.
std::set<std::string>& started_segments() {
  static std::set<std::string> names;
  return names;
}
std::mutex started_mutex;
pid_t test_process = 0;

void remove_abandoned_segments() {
  if (::getpid() != test_process) {
    return;  // a rank exiting: the test process cleans up
  }
  std::lock_guard lock(started_mutex);
  for (const auto& name : started_segments()) {
    (void)lockstep::detail::remove_abandoned_segment(name);
  }
}

void remember_segment(const std::string& id) {
  std::lock_guard lock(started_mutex);
  if (test_process == 0) {
    test_process = ::getpid();
    (void)started_segments();  // constructed before the handler is registered
    std::atexit(remove_abandoned_segments);
  }
  started_segments().insert(lockstep::detail::segment_name(lockstep::detail::job_identity(id), 0));
}

}  // namespace

Running start_ranks(const Job& job, const std::function<void(int)>& body) {
  std::string id = job.id.empty() ? unique_job_id("job") : job.id;
  if (!job.plain) {
    remember_segment(id);
  }
  Running running;
  running.deadline = std::chrono::steady_clock::now() + job.limit;
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  for (int rank = 0; rank < job.processes; ++rank) {
    pid_t pid = ::fork();
    if (pid < 0) {
      throw std::runtime_error("fork failed");
    }
    if (pid == 0) {
      // A rank dies with the test process: one that meson's timeout (or a Ctrl-C) kills must not
      // leave ranks that spin on, loading the machine under the tests after it (once seen: a
      // hung UCX test's ranks polled for half an hour after their test was killed).
      (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) {
        ::_exit(1);  // the test process is gone already
      }
      ::setpgid(0, 0);
      child(job, id, rank, body);
    }
    // Each rank leads its own process group (set on both sides of the fork, so that neither
    // order races): a timed-out rank is killed with whatever it forked, which would otherwise
    // hold the test's output open until the harness gives up on it.
    ::setpgid(pid, pid);
    running.pids.push_back(pid);
  }
  return running;
}

std::vector<RankEnd> wait_ranks(const Running& running) {
  std::vector<RankEnd> ends(running.pids.size());
  std::size_t left = running.pids.size();
  for (std::size_t i = 0; i < ends.size(); ++i) {
    ends[i].rank = static_cast<int>(i);
    ends[i].pid = running.pids[i];
  }
  std::vector<bool> done(ends.size(), false);
  while (left > 0) {
    bool timed_out = std::chrono::steady_clock::now() > running.deadline;
    for (std::size_t i = 0; i < ends.size(); ++i) {
      if (done[i]) {
        continue;
      }
      if (timed_out) {
        ::kill(-running.pids[i], SIGKILL);
        ::kill(running.pids[i], SIGKILL);  // should it have left its group
      }
      int status = 0;
      pid_t got = ::waitpid(running.pids[i], &status, timed_out ? 0 : WNOHANG);
      if (got == running.pids[i]) {
        ends[i].status = status;
        ends[i].timed_out = timed_out;
        done[i] = true;
        --left;
      }
    }
    if (left > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  return ends;
}

std::vector<RankEnd> run_ranks(const Job& job, const std::function<void(int)>& body) {
  return wait_ranks(start_ranks(job, body));
}

std::string failures(const std::vector<RankEnd>& ends, int killed) {
  std::string out;
  for (const auto& end : ends) {
    if (end.rank == killed ? !end.killed_by(SIGKILL) : !end.ok()) {
      out += end.describe() + (end.rank == killed ? " (expected: killed by SIGKILL)" : "") + "\n";
    }
  }
  return out;
}

bool mount_full_dev_shm() {
  if (::unshare(CLONE_NEWNS) != 0 ||
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m,mode=1777") != 0) {
    return false;
  }
  const int fd = ::open("/dev/shm/filler", O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  static char block[4096];
  while (fd >= 0 && ::write(fd, block, sizeof block) > 0) {
  }
  ::close(fd);
  return true;
}

std::string segment_path(const std::string& id) {
  return "/dev/shm/" + lockstep::detail::segment_name(lockstep::detail::job_identity(id), 0);
}

std::vector<std::string> shm_entries(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) {
    return out;
  }
  while (dirent* entry = ::readdir(dir)) {
    std::string name = entry->d_name;
    if (name.rfind(prefix, 0) == 0) {
      out.push_back(name);
    }
  }
  ::closedir(dir);
  return out;
}

std::vector<std::string> spill_files() {
  // Of the jobs this test started (a test running beside it, a Python job's windows, has its own).
  std::vector<std::string> prefixes;
  {
    const std::lock_guard lock(started_mutex);
    for (const std::string& segment : started_segments()) {
      prefixes.push_back(segment.substr(0, segment.size() - 2));  // less "n0"
    }
  }
  std::vector<std::string> spills;
  for (std::string& name : shm_entries("lockstep-u" + std::to_string(::geteuid()) + "-")) {
    const bool ours = std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& prefix) {
      return name.starts_with(prefix);
    });
    if (ours && name.find("-x") != std::string::npos) {
      spills.push_back(std::move(name));
    }
  }
  return spills;
}

}  // namespace lockstep::testing
