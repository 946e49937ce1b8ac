// lockstep-run: starts N processes of a program as one lockstep job, as torchrun does.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/proc.hpp"
#include "base/text.hpp"  // parse_integer
#include "engine/leftovers.hpp"
#include "gpu/devices.hpp"  // visible_device_count
#include "job/job_config.hpp"
#include "job/job_secret.hpp"
#include "job/launch_env.hpp"
#include "lockstep/state.hpp"
#include "lockstep/version.hpp"
#include "waiting/waiter.hpp"  // usable_cpus

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string nproc_text = "1";  // --nproc-per-node as given: N, auto, gpu or cpu
  std::string nnodes_text = "1";
  int nproc_per_node = 1;  // resolved by check_options
  int nnodes = 1;
  int node_rank = 0;
  bool dry_run = false;
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
  std::vector<std::string> command;
};

// How many of a failed process's last lines the launcher repeats when they went to a file only.
constexpr std::size_t kTailLines = 10;
// A line longer than this is relayed in pieces as it comes (tagged once), not held whole.
constexpr std::size_t kMaxHeldLine = std::size_t{64} * 1024;
// When the launcher names the processes that have not joined the job yet (once).
constexpr auto kJoinNotice = std::chrono::seconds(5);

// A child's stdout or stderr, when the launcher relays it (tagging, logs, filtering) rather than
// letting the child write to the launcher's own.
struct Stream {
  int fd = -1;
  int out = STDOUT_FILENO;  // the console stream it goes to, when `console`
  bool console = true;
  int file = -1;  // its log file, or -1
  std::string pending;
  bool mid_line = false;           // the last piece relayed ended inside a line (see kMaxHeldLine)
  std::deque<std::string> recent;  // its last kTailLines lines (for a failure's report)
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream streams[2];
};

// Writes all of `text`; 0, or the errno of the write that failed.
int write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return n < 0 ? errno : EIO;
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

void say(const std::string& text) {
  std::string line = "lockstep-run: " + text + "\n";
  write_all(STDERR_FILENO, line);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) {
    return "exited with status " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = ::sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) +
           (name ? " (SIG" + std::string(name) + ")" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_for(int status) {
  if (WIFEXITED(status)) {
    return WEXITSTATUS(status);
  }
  if (WIFSIGNALED(status)) {
    return 128 + WTERMSIG(status);
  }
  return 1;
}

// LOCKSTEP_JOB_ID as the launcher gives it: the job id, node 0's address and port (a random
// job id, when none is given, is 24 characters).
std::string launched_job_id(const Options& options) {
  return (options.job_id.empty() ? std::string(24, 'x') : options.job_id) + "@" +
         options.master_addr + ":" + std::to_string(options.master_port);
}

// LOCKSTEP_LAUNCH_ID: 64 random bits in hexadecimal, never 0.
std::string random_launch_id() {
  std::uint64_t value = 0;
  if (::getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
    value = (static_cast<std::uint64_t>(::getpid()) << 32) ^
            static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
  }
  char text[17];
  (void)std::snprintf(text, sizeof text, "%llx", static_cast<unsigned long long>(value | 1));
  return text;
}

// lockstep-run --cleanup.
int clean_up() {
  auto removed = lockstep::detail::remove_abandoned_jobs(true);
  for (const auto& path : removed) {
    (void)std::printf("lockstep-run: removed %s\n", path.c_str());
  }
  (void)std::printf("lockstep-run: %zu abandoned segment%s removed\n", removed.size(),
                    removed.size() == 1 ? "" : "s");
  return 0;
}

std::string random_job_id() {
  unsigned char bytes[12];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno != EINTR) {
      break;
    }
    got += n > 0 ? static_cast<std::size_t>(n) : 0;
  }
  if (got < sizeof bytes) {
    // No entropy source: pid and time still tell jobs on one machine apart.
    return std::to_string(::getpid()) + "-" +
           std::to_string(Clock::now().time_since_epoch().count());
  }
  std::string out;
  char hex[3];
  for (unsigned char byte : bytes) {
    (void)std::snprintf(hex, sizeof hex, "%02x", byte);
    out += hex;
  }
  return out;
}

// `text` cut at each `separator`, every piece kept (empty ones too).
std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> pieces;
  std::size_t start = 0;
  for (std::size_t end = text.find(separator); end != std::string::npos;
       start = end + 1, end = text.find(separator, start)) {
    pieces.push_back(text.substr(start, end - start));
  }
  pieces.push_back(text.substr(start));
  return pieces;
}

// Whether `program` can be executed as execvp would find it; the reason when not.
std::optional<std::string> cannot_execute(const std::string& program) {
  auto check = [](const std::string& path) -> std::optional<std::string> {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      return lockstep::detail::error_text(errno);
    }
    if (S_ISDIR(st.st_mode)) {
      return std::string("is a directory");
    }
    if (::access(path.c_str(), X_OK) != 0) {
      return lockstep::detail::error_text(errno);
    }
    return std::nullopt;
  };
  if (program.find('/') != std::string::npos) {
    return check(program);
  }
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe)
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  for (const std::string& dir : split(dirs, ':')) {
    if (!check((dir.empty() ? "." : dir) + "/" + program)) {
      return std::nullopt;
    }
  }

  return std::string("not found in PATH");
}

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
  bool route_streams(Child& child, int local_rank, int (&pipes)[2][2]);
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
  std::string log_dir_;           // this run's log folder (--log-dir), or empty
};

void Launcher::prepare() {
  // One node: a random identity, so two jobs never meet. Several: every node's launcher must
  // name the same job, so the default is a fixed one (the address and port still tell jobs
  // apart; --job-id tells apart two jobs that reuse them).
  if (options_.job_id.empty()) {
    options_.job_id = options_.nnodes > 1 ? "lockstep-run" : random_job_id();
  }
  identity_ = launched_job_id(options_);
  launch_id_ = random_launch_id();
  // As torchrun: several processes each with an OpenMP pool as large as the machine would
  // oversubscribe it (the most common slowdown on a workstation), so each gets one thread unless
  // the user chose.
  set_omp_threads_ =
      options_.nproc_per_node > 1 &&
      std::getenv("OMP_NUM_THREADS") == nullptr;  // NOLINT(concurrency-mt-unsafe): one thread
}

std::vector<std::pair<std::string, std::string>> Launcher::environment_of(int local_rank) const {
  lockstep::detail::LaunchSpec spec;
  spec.rank = options_.node_rank * options_.nproc_per_node + local_rank;
  spec.world_size = options_.nnodes * options_.nproc_per_node;
  spec.local_rank = local_rank;
  spec.local_size = options_.nproc_per_node;
  spec.node_index = options_.node_rank;
  spec.num_nodes = options_.nnodes;
  spec.job_id = identity_;
  spec.master_addr = options_.master_addr;
  spec.master_port = options_.master_port;
  spec.launch_id = launch_id_;
  spec.backend = options_.backend;
  spec.wait_policy = options_.wait_policy;
  auto env = lockstep::detail::job_environment(spec);
  if (set_omp_threads_) {
    env.emplace_back("OMP_NUM_THREADS", "1");
  }
  return env;
}

std::vector<std::string> wait_policy_names() {
  std::vector<std::string> names;
  for (lockstep::WaitPolicy policy : lockstep::kWaitPolicies) {
    names.emplace_back(lockstep::wait_policy_name(policy));
  }
  return names;
}

// A word as a shell reads it back: as it is when it is plain, else in single quotes; a word with
// a control character (a newline) in bash's $'...', so that every process stays on one line.
std::string shell_quoted(const std::string& word) {
  if (!word.empty() &&
      word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                             "@%+=:,./_-") == std::string::npos) {
    return word;
  }
  const bool control = std::any_of(word.begin(), word.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == '\x7f';
  });
  if (control) {
    std::string out = "$'";
    for (char c : word) {
      const auto byte = static_cast<unsigned char>(c);
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (byte < 0x20 || byte == 0x7f) {
        char hex[8];
        (void)std::snprintf(hex, sizeof hex, "\\x%02x", byte);
        out += hex;
      } else {
        out += c == '\'' || c == '\\' ? std::string("\\") + c : std::string(1, c);
      }
    }
    return out + "'";
  }
  std::string out = "'";
  for (char c : word) {
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return out + "'";
}

int Launcher::dry_run() {
  prepare();
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    std::string line =
        "rank " + std::to_string(options_.node_rank * options_.nproc_per_node + local);
    if (!options_.cpus.empty()) {
      std::string list;
      for (int cpu : options_.cpus[static_cast<std::size_t>(local)]) {
        list += (list.empty() ? "" : ",") + std::to_string(cpu);
      }
      line += " on CPUs " + list;
    }
    line += ":";
    for (const auto& [name, value] : environment_of(local)) {
      line += " " + name + "=" + shell_quoted(value);
    }
    for (const auto& word : options_.command) {
      line += " " + shell_quoted(word);
    }
    (void)std::printf("%s\n", line.c_str());
  }
  if (options_.nnodes > 1) {
    // The nodes prove this secret to each other when they join (nothing is created here).
    (void)std::printf(
        "secret: %s\n",
        lockstep::detail::describe_secret_source(lockstep::detail::process_environment()).c_str());
  }
  return 0;
}

bool Launcher::route_streams(Child& child, int local_rank, int (&pipes)[2][2]) {
  // Each stream: to the console unless redirected or filtered out; to a file when redirected or
  // teed. The launcher relays it when it tags, writes a file or hides it.
  bool relay = options_.tag_output;
  for (int i = 0; i < 2; ++i) {
    const int bit = i == 0 ? 1 : 2;
    Stream& stream = child.streams[i];
    const auto at = static_cast<std::size_t>(local_rank);
    const bool redirected = !options_.redirects.empty() && (options_.redirects[at] & bit) != 0;
    const bool teed = !options_.tee.empty() && (options_.tee[at] & bit) != 0;
    stream.console = !redirected && (options_.shown.empty() || options_.shown[at]);
    if (!log_dir_.empty() && (redirected || teed)) {
      stream.file =
          ::open(log_path(child.rank, i).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (stream.file < 0) {
        lockstep::detail::throw_errno("lockstep-run: " + log_path(child.rank, i), "open");
      }
    }
    relay = relay || stream.file >= 0 || !stream.console;
  }
  if (relay) {
    for (auto& p : pipes) {
      if (::pipe2(p, O_CLOEXEC) != 0) {
        lockstep::detail::throw_errno("lockstep-run: starting rank " + std::to_string(child.rank),
                                      "pipe2");
      }
      (void)::fcntl(p[0], F_SETFL, O_NONBLOCK);
    }
  }
  return relay;
}

void Launcher::start(int local_rank, const sigset_t& old_mask) {
  Child& child = children_[static_cast<std::size_t>(local_rank)];
  child.rank = options_.node_rank * options_.nproc_per_node + local_rank;
  int pipes[2][2] = {{-1, -1}, {-1, -1}};
  const bool relay = route_streams(child, local_rank, pipes);
  const auto env = environment_of(local_rank);
  const pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    lockstep::detail::throw_errno("lockstep-run: starting rank " + std::to_string(child.rank),
                                  "fork");
  }
  if (pid == 0) {
    // Child: its own process group, so that the launcher alone decides which signals reach it
    // (and can stop everything it starts); stdin from /dev/null, since a background process
    // group that reads the terminal would be stopped.
    ::setpgid(0, 0);
    // If the launcher itself is killed, nobody would stop the ranks: they get SIGTERM then.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) {
      ::_exit(128 + SIGTERM);  // the launcher died before the line above
    }
    ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) {
      ::dup2(null, STDIN_FILENO);
    }
    if (relay) {
      ::dup2(pipes[0][1], STDOUT_FILENO);
      ::dup2(pipes[1][1], STDERR_FILENO);
    }
    for (const auto& [name, value] : env) {
      ::setenv(name.c_str(), value.c_str(), 1);  // NOLINT(concurrency-mt-unsafe): one thread
    }
    if (!options_.cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int cpu : options_.cpus[static_cast<std::size_t>(local_rank)]) {
        CPU_SET(cpu, &set);
      }
      (void)::sched_setaffinity(0, sizeof set, &set);
    }
    std::vector<char*> argv;
    for (auto& arg : options_.command) {
      argv.push_back(arg.data());
    }
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::string message = "lockstep-run: rank " + std::to_string(child.rank) + ": cannot run '" +
                          options_.command[0] + "': " + lockstep::detail::error_text(errno) + "\n";
    write_all(STDERR_FILENO, message);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that no signal can find the child outside its group
  child.pid = pid;
  child.running = true;
  if (relay) {
    for (int i = 0; i < 2; ++i) {
      ::close(pipes[i][1]);
      child.streams[i].fd = pipes[i][0];
      child.streams[i].out = i == 0 ? STDOUT_FILENO : STDERR_FILENO;
    }
  }
}

void Launcher::pump(Stream& stream, int rank, bool flush_all) const {
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(stream.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;  // nothing more now (the read ends are non-blocking)
    }
    if (n <= 0) {
      ::close(stream.fd);
      stream.fd = -1;
      flush_all = true;
      break;
    }
    stream.pending.append(buffer, static_cast<std::size_t>(n));
    if (static_cast<std::size_t>(n) < sizeof buffer) {
      break;
    }
  }
  const std::string tag = options_.tag_output ? "[rank " + std::to_string(rank) + "] " : "";
  std::string out;
  std::string raw;
  auto take = [&](const std::string& piece) {  // a line with its newline, or a long line's piece
    out += (stream.mid_line ? "" : tag) + piece;
    raw += piece;
    stream.mid_line = piece.back() != '\n';
    if (!stream.mid_line) {
      stream.recent.push_back(piece);
      if (stream.recent.size() > kTailLines) {
        stream.recent.pop_front();
      }
    }
  };
  std::size_t start = 0;
  for (std::size_t nl = stream.pending.find('\n'); nl != std::string::npos;
       start = nl + 1, nl = stream.pending.find('\n', start)) {
    take(stream.pending.substr(start, nl + 1 - start));
  }
  stream.pending.erase(0, start);
  if (flush_all && !stream.pending.empty()) {
    take(stream.pending + "\n");
    stream.pending.clear();
  } else if (stream.pending.size() > kMaxHeldLine) {
    take(stream.pending);  // a line without end in sight: relayed as it comes
    stream.pending.clear();
  }
  if (stream.console) {
    write_all(stream.out, out);
  }
  if (stream.file >= 0) {
    if (const int error = write_all(stream.file, raw); error != 0) {
      // Said once: the file is given up, and its output goes on to the terminal.
      say("cannot write " + log_path(rank, stream.out == STDOUT_FILENO ? 0 : 1) + ": " +
          lockstep::detail::error_text(error) + "; rank " + std::to_string(rank) + "'s " +
          (stream.out == STDOUT_FILENO ? "stdout" : "stderr") + " goes on to the terminal " +
          (stream.console ? "only" : "instead") + " from here");
      ::close(stream.file);
      stream.file = -1;
      if (!stream.console) {
        stream.console = true;
        write_all(stream.out, out);
      }
    }
  }
}

void Launcher::report_tail(Child& child) {
  static const char* const names[] = {"stdout", "stderr"};
  for (int i = 0; i < 2; ++i) {
    Stream& stream = child.streams[i];
    if (stream.fd >= 0) {
      pump(stream, child.rank, false);  // what it wrote before it ended
    }
    if (stream.console || stream.recent.empty()) {
      continue;  // the user saw it already, or there is nothing to show
    }
    std::string text = "lockstep-run: the last lines of rank " + std::to_string(child.rank) +
                       "'s " + names[i] +
                       (log_dir_.empty() ? "" : " (" + log_path(child.rank, i) + ")") + ":\n";
    for (const auto& line : stream.recent) {
      text += "  " + line;
    }
    write_all(STDERR_FILENO, text);
  }
}

std::string Launcher::log_path(int rank, int stream) const {
  return log_dir_ + "/rank" + std::to_string(rank) + (stream == 0 ? ".stdout" : ".stderr");
}

// --log-dir: a folder of its own for this run (owner-only), named by the time and the launch.
void Launcher::open_log_dir() {
  if (options_.log_dir.empty()) {
    return;
  }
  if (::mkdir(options_.log_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    lockstep::detail::throw_errno("lockstep-run: --log-dir " + options_.log_dir, "mkdir");
  }
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  (void)::gmtime_r(&now, &utc);
  char stamp[32];
  (void)std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  log_dir_ = options_.log_dir + "/run-" + stamp + "-" + launch_id_.substr(0, 8);
  if (::mkdir(log_dir_.c_str(), 0700) != 0) {
    lockstep::detail::throw_errno("lockstep-run: --log-dir " + log_dir_, "mkdir");
  }
  say("logs of each process in " + log_dir_ + "/rank<N>.stdout and .stderr");
}

void Launcher::stop_all(int sig) {
  for (const Child& child : children_) {
    if (child.running) {
      ::kill(-child.pid, sig);
    }
  }
}

void Launcher::stop_job(int sig, int exit_code) {
  exit_code_ = exit_code;
  stop_all(sig);
  kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(options_.grace_period));
}

bool Launcher::any_running() const {
  for (const Child& child : children_) {
    if (child.running) {
      return true;
    }
  }
  return false;
}

void Launcher::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      return;
    }
    for (Child& child : children_) {
      if (child.pid != pid || !child.running) {
        continue;
      }
      child.running = false;
      child.status = status;
      // A child that exits while the job is being stopped is not a new failure.
      if (status != 0 && !exit_code_) {
        say("rank " + std::to_string(child.rank) + " (pid " + std::to_string(pid) + ") " +
            describe_status(status) + "; stopping the other ranks");
        report_tail(child);
        stop_job(SIGTERM, exit_code_for(status));
      }
      // The child's own group may hold its children still: stop them too.
      ::kill(-pid, status != 0 ? SIGKILL : SIGTERM);
    }
  }
}

int Launcher::run() {
  if (auto why = cannot_execute(options_.command[0])) {
    say("cannot run '" + options_.command[0] + "': " + *why);
    return 127;
  }
  prepare();
  open_log_dir();
  if (set_omp_threads_) {
    say("setting OMP_NUM_THREADS=1 for each of the " + std::to_string(options_.nproc_per_node) +
        " processes, so that their OpenMP pools do not oversubscribe the CPUs; set "
        "OMP_NUM_THREADS to choose otherwise");
  }
  // Segments of jobs killed with their launcher (nobody else would remove them).
  (void)lockstep::detail::remove_abandoned_jobs(false);

  sigset_t mask;
  sigset_t old_mask;
  sigemptyset(&mask);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    sigaddset(&mask, sig);
  }
  ::pthread_sigmask(SIG_BLOCK, &mask, &old_mask);
  int signals = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signals < 0) {
    lockstep::detail::throw_errno("lockstep-run", "signalfd");
  }

  children_.resize(static_cast<std::size_t>(options_.nproc_per_node));
  join_notice_at_ = Clock::now() + kJoinNotice;
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    start(local, old_mask);
  }
  supervise(signals);
  finish_groups();
  // A rank killed before leaving cannot remove the node's segment: remove it for them.
  (void)lockstep::detail::remove_abandoned_job(identity_, options_.node_rank, launch_id_);
  return exit_code_.value_or(0);
}

void Launcher::supervise(int signals) {
  auto streams_open = [&] {
    for (const Child& child : children_) {
      for (const Stream& stream : child.streams) {
        if (stream.fd >= 0) {
          return true;
        }
      }
    }
    return false;
  };
  while (any_running() || streams_open()) {
    std::vector<pollfd> fds{{signals, POLLIN, 0}};
    std::vector<std::pair<Child*, Stream*>> owners{{nullptr, nullptr}};
    for (Child& child : children_) {
      for (Stream& stream : child.streams) {
        if (stream.fd >= 0) {
          fds.push_back({stream.fd, POLLIN, 0});
          owners.emplace_back(&child, &stream);
        }
      }
    }
    int timeout_ms = -1;
    for (const auto& at : {kill_at_, join_notice_at_}) {
      if (at) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*at - Clock::now());
        const int ms = static_cast<int>(std::max<long long>(0, left.count()));
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      }
    }
    if (!any_running() && timeout_ms < 0) {
      timeout_ms = 1000;  // children gone, grandchildren may hold the pipes: do not wait for ever
    }
    int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      lockstep::detail::throw_errno("lockstep-run", "poll");
    }
    if (ready == 0 && !any_running()) {
      break;
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) {
        pump(*owners[i].second, owners[i].first->rank, false);
      }
    }
    if ((fds[0].revents & POLLIN) != 0) {
      forward_signals(signals);
    }
    reap();
    if (join_notice_at_ && Clock::now() >= *join_notice_at_) {
      join_notice_at_.reset();
      report_joining();
    }
    if (kill_at_ && Clock::now() >= *kill_at_ && any_running()) {
      say("grace period of " + CLI::detail::to_string(options_.grace_period) +
          " s over; killing the remaining ranks");
      stop_all(SIGKILL);
      kill_at_.reset();
    }
  }
  for (Child& child : children_) {
    for (Stream& stream : child.streams) {
      if (stream.fd >= 0) {
        pump(stream, child.rank, true);
      }
    }
  }
}

void Launcher::finish_groups() {
  // Each rank's process group got SIGTERM when its rank ended (reap); what ignores it (a child of
  // a rank that exited 0, say) gets SIGKILL after the grace period, as a failed job's ranks do.
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(options_.grace_period));
  for (;;) {
    std::vector<pid_t> lingering;
    for (const Child& child : children_) {
      if (child.pid > 0 && ::kill(-child.pid, 0) == 0) {
        lingering.push_back(child.pid);
      }
    }
    if (lingering.empty()) {
      return;
    }
    if (Clock::now() >= until) {
      say("grace period of " + CLI::detail::to_string(options_.grace_period) +
          " s over; killing what the ranks left running (their process groups)");
      for (pid_t group : lingering) {
        ::kill(-group, SIGKILL);
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Launcher::report_joining() {
  if (exit_code_) {
    return;  // the job is being stopped
  }
  auto joined = lockstep::detail::joined_job_ranks(identity_, options_.node_rank, launch_id_);
  if (!joined) {
    return;  // no process has reached lockstep yet (or the program does not use it)
  }
  std::string missing;
  int count = 0;
  for (const Child& child : children_) {
    if (child.running && std::find(joined->begin(), joined->end(), child.rank) == joined->end()) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(child.rank);
      ++count;
    }
  }
  if (count > 0) {
    say("after " + std::to_string(kJoinNotice.count()) + " s, rank" + (count == 1 ? " " : "s ") +
        missing + " of this node " + (count == 1 ? "has" : "have") +
        " not joined the job yet (still starting, or stuck before its first lockstep::State); "
        "the others wait for " +
        (count == 1 ? "it" : "them") + " up to LOCKSTEP_JOIN_TIMEOUT (default 300 s)");
  }
}

void Launcher::forward_signals(int signals) {
  signalfd_siginfo info{};
  while (::read(signals, &info, sizeof info) == sizeof info) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) {
      continue;
    }
    if (!exit_code_) {
      say("received SIG" + std::string(::sigabbrev_np(sig)) + "; forwarding it to " +
          std::to_string(options_.nproc_per_node) + " rank(s)");
      stop_job(sig, 128 + sig);
    } else {
      stop_all(SIGKILL);  // a second signal: the user insists
    }
  }
}

}  // namespace

// The launcher's flags, as torchrun names them where it has them (with torchrun's underscore
// spellings too).
void add_flags(CLI::App& app, Options& options, bool& cleanup) {
  app.footer("Usage: lockstep-run [OPTIONS] [--] PROGRAM [ARGS...]");
  app.add_option("--nproc-per-node,--nproc_per_node", options.nproc_text,
                 "Processes to start on this node: a number (1-4096), gpu (one per CUDA device "
                 "visible; CUDA_VISIBLE_DEVICES applies), cpu (one per usable CPU) or auto (gpu "
                 "where there is a GPU, else cpu)")
      ->capture_default_str();
  app.add_option("--nnodes", options.nnodes_text, "Nodes in the job (1-65536)")
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", options.node_rank,
                 "Index of this node in the job (0 to --nnodes - 1)")
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", options.master_addr,
                 "Address of node 0 (part of the job's identity)")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", options.master_port,
                 "Port on node 0 (part of the job's identity)")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_option("--job-id,--job_id,--rdzv-id,--rdzv_id", options.job_id,
                 "Job identity (default: random on one node, so two jobs never meet; "
                 "'lockstep-run' across nodes, where every node must give the same)");
  app.add_flag("--tag-output,--tag_output", options.tag_output,
               "Prefix every line a process prints with \"[rank N] \"");
  app.add_option("--grace-period,--grace_period", options.grace_period,
                 "Seconds between SIGTERM and SIGKILL when stopping the job")
      ->check(CLI::Validator(
          [](std::string& text) {
            // NaN passes every range check (each comparison is false): refused first.
            double value = 0;
            return CLI::detail::lexical_cast(text, value) && std::isfinite(value)
                       ? std::string()
                       : "--grace-period " + text + ": not a number of seconds from 0 to 3600";
          },
          "SECONDS"))
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--wait-policy,--wait_policy", options.wait_policy,
                 "Barrier wait policy for the processes (sets LOCKSTEP_WAIT_POLICY)")
      ->check(CLI::IsMember(wait_policy_names()));
  app.add_option("--backend", options.backend,
                 "Cross-node backend for a multi-node job (sets LOCKSTEP_BACKEND; default: "
                 "the first built)")
      ->check(CLI::IsMember(lockstep::detail::known_backends()));
  app.add_flag("--standalone", options.standalone,
               "One node, on a free port of 127.0.0.1 (unless --master-port is given)");
  app.add_flag("-m,--module", options.module,
               "The program is a Python module: run python3 -u -m MODULE [ARGS...]");
  app.add_flag("--no-python,--no_python", options.no_python,
               "Run the program as it is, even a .py file (by default a program whose name ends "
               "in .py runs as python3 -u PROGRAM, as under torchrun)");
  app.add_option("--log-dir,--log_dir", options.log_dir,
                 "Write each process's output to DIR/run-<time>-<id>/rank<N>.stdout and "
                 ".stderr (owner-only); with neither --redirects nor --tee, as --tee 3");
  app.add_option("-r,--redirects", options.redirects_text,
                 "Streams that go to the log files only: 0 none, 1 stdout, 2 stderr, 3 both, or "
                 "per local rank as 0:1,1:3 (needs --log-dir)");
  app.add_option("-t,--tee", options.tee_text,
                 "Streams that go to the log files and the console, as --redirects");
  app.add_option("--local-ranks-filter,--local_ranks_filter", options.local_ranks_filter_text,
                 "Local ranks whose output the console shows, as 0,2 (all by default; the log "
                 "files get everything)");
  app.add_option("--cpu-bind,--cpu_bind", options.cpu_bind,
                 "Bind each process to CPUs: none; core (local rank r on the r-th CPU it may "
                 "use); numa (on the CPUs of NUMA node r mod nodes); gpu (on the CPUs of its "
                 "GPU's NUMA node)")
      ->capture_default_str();
  app.add_flag("--dry-run,--dry_run", options.dry_run,
               "Print each process's command and environment, one line per process, and exit "
               "without starting anything");
  app.add_flag("--cleanup", cleanup,
               "Remove this user's lockstep shared-memory segments whose processes are all gone "
               "(also those of other lockstep versions that no process maps), list them, and "
               "exit; no program is run");
  app.set_version_flag("--version", std::string("lockstep-run ") + LOCKSTEP_VERSION_STRING);
}

// torchrun's flags that lockstep-run does not have, and what to do instead.
std::optional<std::string> torchrun_flag(const std::string& arg) {
  std::string flag = arg.substr(0, arg.find('='));
  std::replace(flag.begin(), flag.end(), '_', '-');
  if (flag == "--max-restarts" || flag == "--monitor-interval") {
    return "lockstep-run does not restart failed processes (torchrun's elastic restarts): a "
           "failed process stops the job, and its status is the launcher's; rerun the job, or "
           "launch with torchrun itself (lockstep reads torchrun's variables)";
  }
  if (flag.starts_with("--rdzv-")) {
    return "lockstep-run has no rendezvous backend: give every node the same --nnodes, "
           "--master-addr, --master-port and --job-id, and each its own --node-rank";
  }
  if (flag == "--logs-specs") {
    return "lockstep-run's logs are --log-dir, --redirects, --tee and --local-ranks-filter";
  }
  if (flag == "--run-path") {
    return "lockstep-run starts a process per rank: give the script as the program (a .py file "
           "runs with python3 -u), or -m MODULE";
  }
  if (flag == "--start-method" || flag == "--role" || flag == "--local-addr" ||
      flag == "--max-nodes" || flag == "--min-nodes") {
    return "this torchrun option has no counterpart in lockstep-run (see lockstep-run --help)";
  }
  return std::nullopt;
}

// torchrun's habits (see Options): the program as Python runs it, and --standalone's port. An
// exit status when the flags contradict each other.
std::optional<int> as_torchrun_would(const CLI::App& app, Options& options) {
  if (options.module && options.no_python) {
    say("-m runs a Python module and --no-python runs no Python: give one of them");
    return 2;
  }
  if (options.standalone && options.nnodes_text != "1") {
    say("--standalone is a job of one node: leave out --nnodes " + options.nnodes_text);
    return 2;
  }
  if (options.command.empty()) {
    return std::nullopt;  // check_options says what is missing
  }
  if (options.module) {
    options.command.insert(options.command.begin(), {"python3", "-u", "-m"});
  } else if (!options.no_python && options.command.front().ends_with(".py")) {
    options.command.insert(options.command.begin(), {"python3", "-u"});
  }
  if (options.standalone && app.count("--master-port") == 0) {
    const int port = lockstep::detail::free_port();
    if (port == 0) {
      say("--standalone: no free port on 127.0.0.1");
      return 1;
    }
    options.master_port = port;
  }
  return std::nullopt;
}

// A whole number in [low, high] from `text`; the message when it is not one.
std::optional<int> number_in(const std::string& text, int low, int high) {
  auto value = lockstep::detail::parse_integer(text);
  if (!value || *value < low || *value > high) {
    return std::nullopt;
  }
  return static_cast<int>(*value);
}

// --nproc-per-node and --nnodes, as given, into numbers; the exit status (2) when they are not.
std::optional<int> resolve_sizes(Options& options) {
  const std::string& text = options.nproc_text;
  if (text == "gpu" || text == "auto") {
    std::string why;
    const int gpus = lockstep::detail::visible_device_count(why);
    if (gpus > 0) {
      options.nproc_per_node = gpus;
    } else if (text == "gpu") {
      say("--nproc-per-node gpu: no CUDA device is visible (" + why +
          "); give a number of processes, or cpu");
      return 2;
    } else {
      options.nproc_per_node = lockstep::detail::usable_cpus();
    }
  } else if (text == "cpu") {
    options.nproc_per_node = lockstep::detail::usable_cpus();
  } else if (auto n = number_in(text, 1, 4096)) {
    options.nproc_per_node = *n;
  } else {
    say("--nproc-per-node " + text +
        ": not a number of processes from 1 to 4096, nor auto, gpu or cpu");
    return 2;
  }
  options.nproc_per_node = std::min(options.nproc_per_node, 4096);
  if (options.nnodes_text.find(':') != std::string::npos) {
    say("--nnodes " + options.nnodes_text +
        ": elastic sizes (MIN:MAX) are not supported; a lockstep job has a fixed number of "
        "nodes: give one number");
    return 2;
  }
  if (auto n = number_in(options.nnodes_text, 1, 65536)) {
    options.nnodes = *n;
  } else {
    say("--nnodes " + options.nnodes_text + ": not a number of nodes from 1 to 65536");
    return 2;
  }
  return std::nullopt;
}

// torchrun's stream specification: "3" for every local rank, or "0:1,1:3" per local rank (the
// others 0). Empty when malformed, having said why.
std::optional<std::vector<int>> stream_spec(const std::string& flag, const std::string& text,
                                            int nproc) {
  std::vector<int> out(static_cast<std::size_t>(nproc), 0);
  if (auto all = number_in(text, 0, 3)) {
    std::fill(out.begin(), out.end(), *all);
    return out;
  }
  for (const std::string& item : split(text, ',')) {
    const std::size_t colon = item.find(':');
    auto rank =
        colon == std::string::npos ? std::nullopt : number_in(item.substr(0, colon), 0, nproc - 1);
    auto value =
        colon == std::string::npos ? std::nullopt : number_in(item.substr(colon + 1), 0, 3);
    if (!rank || !value) {
      std::string why = flag;
      why += " " + text;
      why += ": not 0-3 (0 none, 1 stdout, 2 stderr, 3 both) nor LOCAL_RANK:0-3,... with local ";
      why += "ranks 0 to " + std::to_string(nproc - 1);
      say(why);
      return std::nullopt;
    }
    out[static_cast<std::size_t>(*rank)] = *value;
  }
  return out;
}

// A sysfs CPU list ("0-3,8-11") as CPU numbers; empty when unreadable.
std::vector<int> read_cpulist(const std::string& path) {
  std::ifstream file(path);
  std::string text;
  std::getline(file, text);
  std::vector<int> cpus;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto dash = item.find('-');
    auto first = lockstep::detail::parse_integer(item.substr(0, dash));
    auto last =
        dash == std::string::npos ? first : lockstep::detail::parse_integer(item.substr(dash + 1));
    for (long long cpu = first.value_or(0); first && last && cpu <= *last; ++cpu) {
      cpus.push_back(static_cast<int>(cpu));
    }
  }
  return cpus;
}

// `cpus` that this process may run on.
std::vector<int> allowed(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  (void)::sched_getaffinity(0, sizeof set, &set);
  std::vector<int> out;
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &set)) {
      out.push_back(cpu);
    }
  }
  return out;
}

// The NUMA nodes' CPU lists (that this process may use), by node number.
std::vector<std::vector<int>> numa_nodes() {
  std::vector<std::vector<int>> nodes;
  for (int node = 0; node < 1024; ++node) {
    const std::string path = "/sys/devices/system/node/node" + std::to_string(node) + "/cpulist";
    if (::access(path.c_str(), R_OK) != 0) {
      break;
    }
    nodes.push_back(allowed(read_cpulist(path)));
  }
  return nodes;
}

// --cpu-bind: each local rank's CPUs; the exit status (2) when the mode cannot apply.
std::optional<int> resolve_cpu_bind(Options& options) {
  const int n = options.nproc_per_node;
  const std::string& mode = options.cpu_bind;
  options.cpus.clear();
  if (mode == "none") {
    return std::nullopt;
  }
  std::vector<int> all(CPU_SETSIZE);
  std::iota(all.begin(), all.end(), 0);
  all = allowed(all);
  if (mode == "core") {
    for (int r = 0; r < n; ++r) {
      options.cpus.push_back({all[static_cast<std::size_t>(r) % all.size()]});
    }
    return std::nullopt;
  }
  if (mode != "numa" && mode != "gpu") {
    say("--cpu-bind " + mode + ": not one of none, core, numa, gpu");
    return 2;
  }
  auto nodes = numa_nodes();
  if (nodes.empty()) {
    say("--cpu-bind " + mode + ": this machine shows no NUMA nodes (/sys/devices/system/node)");
    return 2;
  }
  for (int r = 0; r < n; ++r) {
    std::size_t node = static_cast<std::size_t>(r) % nodes.size();
    if (mode == "gpu") {
      std::string why;
      const int gpus = lockstep::detail::visible_device_count(why);
      const std::string bus = gpus > 0 ? lockstep::detail::device_pci_bus_id(r % gpus, why) : "";
      if (bus.empty()) {
        say("--cpu-bind gpu: cannot tell local rank " + std::to_string(r) + "'s GPU (" + why +
            "); use core or numa");
        return 2;
      }
      const std::string path = "/sys/bus/pci/devices/" + bus + "/numa_node";
      std::ifstream file(path);
      int number = -1;
      file >> number;
      if (!file || number < 0 || static_cast<std::size_t>(number) >= nodes.size()) {
        std::string why_not = "--cpu-bind gpu: the GPU at " + bus;
        why_not += " names no NUMA node (" + path + "); use core or numa";
        say(why_not);
        return 2;
      }
      node = static_cast<std::size_t>(number);
    }
    if (nodes[node].empty()) {
      say("--cpu-bind " + mode + ": NUMA node " + std::to_string(node) +
          " has none of the CPUs this process may use");
      return 2;
    }
    options.cpus.push_back(nodes[node]);
  }
  return std::nullopt;
}

// --log-dir, --redirects, --tee and --local-ranks-filter, resolved per local rank.
std::optional<int> resolve_logs(Options& options) {
  const int n = options.nproc_per_node;
  if (options.log_dir.empty() && (!options.redirects_text.empty() || !options.tee_text.empty())) {
    say(std::string(options.redirects_text.empty() ? "--tee" : "--redirects") +
        " needs --log-dir DIR (where the files go)");
    return 2;
  }
  if (!options.redirects_text.empty()) {
    auto spec = stream_spec("--redirects", options.redirects_text, n);
    if (!spec) {
      return 2;
    }
    options.redirects = *spec;
  }
  if (!options.tee_text.empty()) {
    auto spec = stream_spec("--tee", options.tee_text, n);
    if (!spec) {
      return 2;
    }
    options.tee = *spec;
  }
  if (!options.log_dir.empty() && options.redirects_text.empty() && options.tee_text.empty()) {
    options.tee.assign(static_cast<std::size_t>(n), 3);
  }
  if (!options.local_ranks_filter_text.empty()) {
    options.shown.assign(static_cast<std::size_t>(n), false);
    for (const std::string& item : split(options.local_ranks_filter_text, ',')) {
      auto rank = number_in(item, 0, n - 1);
      if (!rank) {
        say("--local-ranks-filter " + options.local_ranks_filter_text +
            ": not a list of local ranks from 0 to " + std::to_string(n - 1) + " such as 0,2");
        return 2;
      }
      options.shown[static_cast<std::size_t>(*rank)] = true;
    }
  }
  return std::nullopt;
}

// Refuses options that parse but do not make a job: the exit status (2), having said why.
std::optional<int> check_options(const CLI::App& app, Options& options) {
  if (options.command.empty()) {
    say("no program given (usage: lockstep-run [OPTIONS] [--] PROGRAM [ARGS...])");
    return 2;
  }
  if (app.count("--job-id") > 0 && options.job_id.empty()) {
    say("--job-id must not be empty");
    return 2;
  }
  // The identity ("job=<id>@<addr>:<port>") must fit the segment's record of it.
  if (std::size_t identity = lockstep::detail::job_identity(launched_job_id(options)).size();
      identity > lockstep::detail::kMaxIdentity) {
    say("--job-id is " + std::to_string(options.job_id.size()) +
        " characters long: with --master-addr and --master-port the job's identity is " +
        std::to_string(identity) + " characters, and at most " +
        std::to_string(lockstep::detail::kMaxIdentity) + " fit");
    return 2;
  }
  if (options.master_addr.empty()) {
    say("--master-addr must not be empty");
    return 2;
  }
  if (auto refused = resolve_sizes(options)) {
    return refused;
  }
  if (auto refused = resolve_logs(options)) {
    return refused;
  }
  if (auto refused = resolve_cpu_bind(options)) {
    return refused;
  }
  if (options.node_rank < 0) {
    say("--node-rank " + std::to_string(options.node_rank) + " must be 0 or more (and below " +
        "--nnodes " + std::to_string(options.nnodes) + ")");
    return 2;
  }
  if (options.node_rank >= options.nnodes) {
    say("--node-rank " + std::to_string(options.node_rank) + " must be below --nnodes " +
        std::to_string(options.nnodes));
    return 2;
  }
  if (options.nnodes > 1 && lockstep::detail::built_backends().empty()) {
    say("--nnodes " + std::to_string(options.nnodes) +
        ": a multi-node job needs a cross-node backend, and this build of lockstep has none "
        "(rebuild with UCX: install libucx-dev and configure with -Ducx=enabled)");
    return 2;
  }
  if (!options.backend.empty()) {
    auto built = lockstep::detail::built_backends();
    if (std::find(built.begin(), built.end(), options.backend) == built.end()) {
      say("--backend " + options.backend + ": this build of lockstep has no such backend");
      return 2;
    }
  }
  return std::nullopt;
}

int main(int argc, char** argv) {
  Options options;
  CLI::App app{
      "lockstep-run: start a program as a lockstep job of N processes on this machine.\n"
      "Each process gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
      "GROUP_RANK, MASTER_ADDR, MASTER_PORT) and a job identity of its own (LOCKSTEP_JOB_ID).\n"
      "A job of several nodes runs one lockstep-run per node, each with the same --nnodes,\n"
      "--master-addr, --master-port and --job-id, and its own --node-rank.\n"
      "When a process fails, the others are stopped (SIGTERM, then SIGKILL after the grace\n"
      "period) and lockstep-run exits with the failed process's status.",
      "lockstep-run"};
  bool cleanup = false;
  add_flags(app, options, cleanup);
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ParseError& error) {
    // CLI11's own words, as one line of ours.
    std::string what = error.what();
    if (auto torchrun = torchrun_flag(
            what.substr(what.find("--") == std::string::npos ? 0 : what.find("--")))) {
      say(*torchrun);
    } else {
      say(what + " (see lockstep-run --help)");
    }
    return 2;
  }
  options.command = app.remaining();
  if (cleanup) {
    if (!options.command.empty()) {
      say("--cleanup runs no program: remove '" + options.command.front() + "'");
      return 2;
    }
    return clean_up();
  }
  if (!options.command.empty() && options.command.front() == "--") {
    options.command.erase(options.command.begin());
  } else if (!options.command.empty() && options.command.front().size() > 1 &&
             options.command.front()[0] == '-') {
    const std::string& flag = options.command.front();
    if (auto torchrun = torchrun_flag(flag)) {
      say(flag + ": " + *torchrun);
    } else {
      say("unknown option '" + flag + "' (see lockstep-run --help)");
    }
    return 2;
  }
  if (auto refused = as_torchrun_would(app, options)) {
    return *refused;
  }
  if (auto refused = check_options(app, options)) {
    return *refused;
  }
  if (options.dry_run) {
    return Launcher(std::move(options)).dry_run();
  }
  try {
    return Launcher(std::move(options)).run();
  } catch (const std::exception& error) {
    say(error.what());
    return 1;
  }
}
