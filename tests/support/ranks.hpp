// Runs a body in N forked processes as one lockstep job, and reports how each ended.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "job/launch_env.hpp"  // free_port

// Whether this build has AddressSanitizer or ThreadSanitizer, whichever compiler: GCC defines
// __SANITIZE_ADDRESS__ and __SANITIZE_THREAD__, clang answers __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define LOCKSTEP_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOCKSTEP_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define LOCKSTEP_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOCKSTEP_TEST_TSAN 1
#endif
#endif

namespace lockstep::testing {

// The bound the GPU watchdog must meet (issue 20): every survivor's stream released within
// 0.5 s of a death, in seconds. Sanitizers slow everything several times; their builds get 4x.
#if defined(LOCKSTEP_TEST_ASAN) || defined(LOCKSTEP_TEST_TSAN)
inline constexpr double kStreamReleaseBound = 2.0;
#else
inline constexpr double kStreamReleaseBound = 0.5;
#endif

// Throws (in a child rank) when `condition` is false; the rank then exits 1 naming the line.
#define RANK_CHECK(condition)                                                         \
  do {                                                                                \
    if (!(condition)) {                                                               \
      throw std::logic_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                             ": check failed: " #condition);                          \
    }                                                                                 \
  } while (0)

struct Job {
  int processes = 2;
  std::string id;  // LOCKSTEP_JOB_ID; a fresh unique one when empty
  // Extra variables for every rank (an empty value unsets the variable).
  std::map<std::string, std::string> env;
  // Set no job variables at all (a plain process).
  bool plain = false;
  std::chrono::seconds limit{60};

  static Job of(int processes, std::string id = {}) {
    Job job;
    job.processes = processes;
    job.id = std::move(id);
    return job;
  }
  static Job plain_process() {
    Job job;
    job.processes = 1;
    job.plain = true;
    return job;
  }
};

// How one rank ended: a wait status, or did not end within the job's limit (then killed).
struct RankEnd {
  int rank = 0;
  pid_t pid = 0;
  int status = 0;
  bool timed_out = false;
  [[nodiscard]] bool ok() const;
  [[nodiscard]] bool killed_by(int sig) const;
  [[nodiscard]] int exit_code() const;  // -1 unless it exited
  [[nodiscard]] std::string describe() const;
};

// Forks `job.processes` children with lockstep-run's variables for `job`, runs `body(rank)` in
// each and exits: 0 when it returns, 1 (printing the message) when it throws. Returns when all
// have ended; kills all and marks them timed out after `job.limit`.
std::vector<RankEnd> run_ranks(const Job& job, const std::function<void(int)>& body);

// Starts the ranks and returns at once; finish with wait_ranks.
struct Running {
  std::vector<pid_t> pids;
  std::chrono::steady_clock::time_point deadline;
};
Running start_ranks(const Job& job, const std::function<void(int)>& body);
std::vector<RankEnd> wait_ranks(const Running& running);

// "" when every rank ended with status 0 (rank `killed`, if given, by SIGKILL instead), else
// one line per rank that did not.
std::string failures(const std::vector<RankEnd>& ends, int killed = -1);

// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick).
using lockstep::detail::free_port;  // lib/src/job/launch_env.hpp

// A unique job id for this test process.
std::string unique_job_id(const std::string& hint);

// Memory shared by the test and every rank it forks (MAP_SHARED | MAP_ANONYMOUS), zeroed.
template <class T>
T* shared_array(std::size_t count);
void* shared_bytes(std::size_t size);
template <class T>
T* shared_array(std::size_t count) {
  return static_cast<T*>(shared_bytes(sizeof(T) * count));
}

// Whether something (a file, a segment, a folder) exists at `path`.
bool path_exists(const std::string& path);

// Whether `text` contains `part`.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// In a rank: constructing a State must throw `E` whose message contains `part`.
template <class E, class Make>
void expect_join_error(Make make, const std::string& part) {
  try {
    make();
  } catch (const E& error) {
    if (!contains(error.what(), part)) {
      throw std::logic_error(std::string("wrong message: ") + error.what() + " (wanted: " + part +
                             ")");
    }
    return;
  }
  throw std::logic_error("joining succeeded; wanted an error containing: " + part);
}

// The path of node 0's segment of the job with LOCKSTEP_JOB_ID `id` (as run_ranks sets it).
std::string segment_path(const std::string& id);

// In a forked child: puts it in a mount namespace of its own with a full 1 MiB tmpfs on /dev/shm
// (one file fills it). False where that is not allowed (not root, no CAP_SYS_ADMIN): skip then.
bool mount_full_dev_shm();

// Names in /dev/shm that start with `prefix`.
std::vector<std::string> shm_entries(const std::string& prefix);
// This user's exchange spills in /dev/shm (lib/src/engine/spill.hpp: "lockstep-u<uid>-...-x<n>").
std::vector<std::string> spill_files();

// The state letter in the /proc stat file at `stat_path` ("/proc/PID/stat", or a thread's
// "/proc/self/task/TID/stat"): the field after the command's closing parenthesis ('R', 'S', 'Z',
// ...), or '\0' when the file cannot be read (the task is gone).
char task_state(const std::string& stat_path);
// Whether process `pid` has ended: gone, or a zombie that nobody has reaped yet.
bool ended(pid_t pid);

}  // namespace lockstep::testing
