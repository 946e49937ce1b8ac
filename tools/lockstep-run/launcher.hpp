// The launcher: starts this node's ranks, supervises them (signals, failures, the grace
// period) and reports how the job ended.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "options.hpp"
#include "output.hpp"

namespace lockstep::run {

using Clock = std::chrono::steady_clock;

// When the launcher names the processes that have not joined the job yet (once).
constexpr auto kJoinNotice = std::chrono::seconds(5);

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream streams[2];
};

class Launcher {
 public:
  explicit Launcher(Options options) : options_(std::move(options)) {}
  int run();
  // After the ranks: waits up to the grace period for their process groups to empty, then
  // SIGKILLs what is left.
  void finish_groups();
  // --dry-run: prints each rank's command and environment; starts nothing.
  int dry_run();

 private:
  // Fixes the job's identity and this launch's, and what the ranks' environment adds.
  void prepare();
  // The variables rank `local_rank` of this node gets.
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> environment_of(
      int local_rank) const;
  void start(int local_rank, const sigset_t& old_mask);
  // Relays the ranks' output and the signals to them, reaps them, until all have ended.
  void supervise(int signals);
  void forward_signals(int signals);
  void reap();
  void pump(Stream& stream, int rank, bool flush_all) const;
  // Decides where `child`'s streams go (the console, a log file, both, neither); creates the
  // pipes into `pipes` and returns true when the launcher relays them.
  bool route_streams(Child& child, int local_rank, lockstep::detail::UniqueFd (&pipes)[2][2]);
  // A failed process's last lines, from the streams that went to a file only.
  void report_tail(Child& child);
  [[nodiscard]] std::string log_path(int rank, int stream) const;
  void open_log_dir();
  // After kJoinNotice: one line naming this node's running processes that have not joined yet
  // (when some have: a job that uses lockstep, stuck at start-up).
  void report_joining();
  void stop_all(int sig);
  // Stops the job: `sig` to every rank now, SIGKILL after the grace period; the launcher will
  // exit with `exit_code`.
  void stop_job(int sig, int exit_code);
  [[nodiscard]] bool any_running() const;

  Options options_;
  std::string identity_;
  std::string launch_id_;  // LOCKSTEP_LAUNCH_ID: this launch, apart from any other with its job id
  std::vector<Child> children_;
  std::optional<Clock::time_point> kill_at_;
  std::optional<Clock::time_point> join_notice_at_;
  std::optional<int> exit_code_;
  bool set_omp_threads_ = false;  // OMP_NUM_THREADS=1 for each rank (see prepare)
  // Another job's variables in the launcher's environment (a launch inside mpirun, srun or a
  // shell that ran a job): each rank starts without them, so that it joins this job alone.
  std::vector<std::string> cleared_;
  std::string log_dir_;  // this run's log folder (--log-dir), or empty
};

// lockstep-run --cleanup.
int clean_up();

}  // namespace lockstep::run
