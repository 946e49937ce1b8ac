// lockstep-run's flags: what they are (Options), how they are read (CLI11, torchrun's spellings
// and habits) and resolved into a job (sizes, logs, placement), and what is refused.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace lockstep::run {

struct Options {
  std::string nproc_text = "1";  // --nproc-per-node as given: N, auto, gpu or cpu
  std::string nnodes_text = "1";
  int nproc_per_node = 1;  // resolved by check_options
  int nnodes = 1;
  int node_rank = 0;
  bool dry_run = false;
  bool status = false;  // --status: show this user's jobs here, run nothing
  bool json = false;    // --status's form for scripts
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string job_id;
  bool tag_output = false;
  double grace_period = 5.0;
  std::string wait_policy;
  std::string backend;
  // Per-process logs (torchrun's flags): the folder, and per local rank which streams go to
  // files only (redirects) or to files and the console (tee): 0 none, 1 stdout, 2 stderr, 3 both.
  std::string log_dir;
  std::string redirects_text;
  std::string tee_text;
  std::string local_ranks_filter_text;  // local ranks whose output the console shows
  std::vector<int> redirects;           // by local rank (resolved by check_options)
  std::vector<int> tee;
  std::vector<bool> shown;
  // --cpu-bind: none, core, numa or gpu; the CPUs of each local rank (empty: not bound).
  std::string cpu_bind = "none";
  std::vector<std::vector<int>> cpus;
  // torchrun's habits: a .py program runs with python3 -u; -m runs a module; --no-python never
  // adds python3; --standalone picks a free port unless --master-port is given.
  bool module = false;
  bool no_python = false;
  bool standalone = false;
  // The program is Python that lockstep-run runs unbuffered (-u: a .py program, or -m), whose
  // print() writes a line in pieces: with several processes its output is relayed line by line.
  bool python_unbuffered = false;
  // torchrun's flags that scripts pass with values lockstep-run already has (as_torchrun_would):
  // --max-restarts 0, --monitor-interval, --start-method, and a --rdzv-endpoint that stands for
  // --master-addr and --master-port under the static or c10d rendezvous.
  std::string max_restarts_text;
  std::string monitor_interval_text;
  std::string start_method;
  std::string rdzv_backend;
  std::string rdzv_endpoint;
  std::vector<std::string> command;
};

// `text` cut at each `separator`, every piece kept (empty ones too).
std::vector<std::string> split(const std::string& text, char separator);

// A whole number in [low, high] from `text`; none when it is not one.
std::optional<int> number_in(const std::string& text, int low, int high);

// LOCKSTEP_JOB_ID as the launcher gives it: the job id, node 0's address and port (a random
// job id, when none is given, is 24 characters).
std::string launched_job_id(const Options& options);

// torchrun's flags that lockstep-run does not have, and what to do instead.
std::optional<std::string> torchrun_flag(const std::string& arg);

// Reads the command line into `options`, as torchrun names the flags where it has them, and
// with torchrun's habits (see Options): an exit status when lockstep-run ends here (--help,
// --version, a flag refused or contradicted, no program; having said why), else none. Sets
// `cleanup` for --cleanup (with no program). CLI11 is compiled in options.cpp alone.
std::optional<int> read_command_line(int argc, char** argv, Options& options, bool& cleanup);

}  // namespace lockstep::run
