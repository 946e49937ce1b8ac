// Starting and supervising this node's ranks (launcher.hpp).
#include "launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/proc.hpp"
#include "base/text.hpp"
#include "engine/leftovers.hpp"
#include "job/job_config.hpp"
#include "job/job_secret.hpp"
#include "job/launch_env.hpp"
#include "program.hpp"

namespace lockstep::run {

namespace {

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

}  // namespace

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
  const auto ours = environment_of(0);
  for (const std::string& name : lockstep::detail::job_variables()) {
    const bool set_here = std::any_of(
        ours.begin(), ours.end(), [&name](const auto& variable) { return variable.first == name; });
    // The user's choices for this job's processes, which --backend and --wait-policy also set.
    const bool a_choice = name == "LOCKSTEP_BACKEND" || name == "LOCKSTEP_WAIT_POLICY";
    // NOLINTNEXTLINE(concurrency-mt-unsafe): one thread
    if (!set_here && !a_choice && std::getenv(name.c_str()) != nullptr) {
      cleared_.push_back(name);
    }
  }
  // Started by an MPI launcher with several processes on this machine: each is a lockstep-run
  // that starts a job of its own, which is seldom what was meant.
  for (const char* local_size : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const char* value = std::getenv(local_size);  // NOLINT(concurrency-mt-unsafe): one thread
    if (value != nullptr && std::string_view(value) != "1" && std::string_view(value) != "0") {
      say(std::string("warning: lockstep-run itself runs under an MPI launcher (") + local_size +
          "=" + value + "): each of its processes on this machine starts a job of " +
          std::to_string(options_.nproc_per_node) +
          " processes of its own; start one lockstep-run per machine (mpirun -npernode 1, or "
          "srun --ntasks-per-node 1), or run the program under mpirun alone");
      break;
    }
  }
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

int Launcher::dry_run() {
  prepare();
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    std::string line =
        "rank " + std::to_string(options_.node_rank * options_.nproc_per_node + local);
    if (!options_.cpus.empty()) {
      std::string list;
      for (int cpu : options_.cpus[static_cast<std::size_t>(local)]) {
        // In two steps, as base/text.cpp's comma_list: "..." + std::string&& draws a false
        // alarm from GCC 12 at -O3.
        list += list.empty() ? "" : ",";
        list += std::to_string(cpu);
      }
      line += " on CPUs " + list;
    }
    line += ":";
    for (const auto& [name, value] : environment_of(local)) {
      line += " " + name + "=" + shell_quoted(value);
    }
    for (const auto& word : options_.command) {
      line += ' ';
      line += shell_quoted(word);
    }
    (void)std::printf("%s\n", line.c_str());
  }
  if (!cleared_.empty()) {
    std::string names;
    for (const auto& name : cleared_) {
      names += " " + name;
    }
    (void)std::printf("cleared from each rank's environment (another job's):%s\n", names.c_str());
  }
  if (options_.nnodes > 1) {
    // The nodes prove this secret to each other when they join (nothing is created here).
    (void)std::printf(
        "secret: %s\n",
        lockstep::detail::describe_secret_source(lockstep::detail::process_environment()).c_str());
  }
  return 0;
}

void Launcher::start(int local_rank, const sigset_t& old_mask) {
  Child& child = children_[static_cast<std::size_t>(local_rank)];
  child.rank = options_.node_rank * options_.nproc_per_node + local_rank;
  lockstep::detail::UniqueFd pipes[2][2];
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
    // O_CLOEXEC: the program gets it as its stdin only (dup2 clears the flag there).
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) {
      ::dup2(null, STDIN_FILENO);
    }
    if (relay) {
      ::dup2(pipes[0][1].get(), STDOUT_FILENO);
      ::dup2(pipes[1][1].get(), STDERR_FILENO);
    }
    for (const auto& name : cleared_) {
      ::unsetenv(name.c_str());  // NOLINT(concurrency-mt-unsafe): one thread
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
      pipes[i][1].reset();  // the child's end
      child.streams[i].fd = std::move(pipes[i][0]);
      child.streams[i].out = i == 0 ? STDOUT_FILENO : STDERR_FILENO;
    }
  }
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
  std::vector<Child*> ended;  // every child that has ended by now
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      break;
    }
    for (Child& child : children_) {
      if (child.pid == pid && child.running) {
        child.running = false;
        child.status = status;
        ended.push_back(&child);
      }
    }
  }
  // The failure to report (a child that fails while the job is being stopped is not a new one).
  // A rank that dies is reapable before any other can learn of it, so a rank that failed because
  // of it (PeerLostError: a C++ rank aborts, a Python one exits) is reaped in the same pass or a
  // later one; within a pass waitpid's order is the children's, not their deaths'. So the cause
  // is told from its consequences by kind: killed by a signal of its own (SIGKILL, SIGSEGV, ...)
  // first, then a non-zero exit, then an abort or a SIGTERM.
  auto rank_of = [](int status) {
    if (WIFSIGNALED(status)) {
      return WTERMSIG(status) == SIGABRT || WTERMSIG(status) == SIGTERM ? 2 : 0;
    }
    return 1;
  };
  Child* failed = nullptr;
  for (Child* child : ended) {
    if (child->status != 0 && !exit_code_ &&
        (failed == nullptr || rank_of(child->status) < rank_of(failed->status))) {
      failed = child;
    }
  }
  if (failed != nullptr) {
    say("rank " + std::to_string(failed->rank) + " (pid " + std::to_string(failed->pid) + ") " +
        describe_status(failed->status) + "; stopping the other ranks");
    report_tail(*failed);
    stop_job(SIGTERM, exit_code_for(failed->status));
  }
  for (Child* child : ended) {
    // The child's own group may hold its children still: stop them too.
    ::kill(-child->pid, child->status != 0 ? SIGKILL : SIGTERM);
  }
}

int Launcher::run() {
  if (auto why = cannot_execute(options_.command[0])) {
    say("cannot run '" + options_.command[0] + "': " + *why);
    return 127;
  }
  if (auto mpi = linked_mpi(options_.command[0])) {
    say(options_.command[0] + " is an MPI program (it links " + *mpi +
        "): under lockstep-run each of its processes would be an MPI job of its own; start it "
        "with mpirun (mpirun -n " +
        std::to_string(options_.nproc_per_node * options_.nnodes) + " " + options_.command[0] +
        "), and lockstep reads mpirun's variables");
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
  start_console();  // after the last fork (output.hpp)
  supervise(signals);
  finish_groups();
  finish_console();
  // A rank killed before leaving cannot remove the node's segment: remove it for them.
  (void)lockstep::detail::remove_abandoned_job(identity_, options_.node_rank, launch_id_);
  return exit_code_.value_or(0);
}

void Launcher::supervise(int signals) {
  auto streams_open = [&] {
    for (const Child& child : children_) {
      for (const Stream& stream : child.streams) {
        if (stream.fd) {
          return true;
        }
      }
    }
    return false;
  };
  while (any_running() || streams_open()) {
    std::vector<pollfd> fds{{signals, POLLIN, 0}};
    std::vector<std::pair<Child*, Stream*>> owners{{nullptr, nullptr}};
    // A console that nobody reads: the ranks' pipes wait (they fill, and the ranks block in their
    // writes) until it drains; signals and the ranks' ends are seen meanwhile.
    const bool console_full = console_backlog() > kMaxConsoleBacklog;
    for (Child& child : children_) {
      for (Stream& stream : child.streams) {
        if (stream.fd) {
          fds.push_back({stream.fd.get(), static_cast<short>(console_full ? 0 : POLLIN), 0});
          owners.emplace_back(&child, &stream);
        }
      }
    }
    int timeout_ms = console_full ? 20 : -1;
    std::optional<Clock::time_point> held_until;  // when a held line's start is due (pump)
    for (const Child& child : children_) {
      for (const Stream& stream : child.streams) {
        if (stream.fd && !stream.pending.empty()) {
          const auto due = stream.held_since + kMaxHeldTime;
          held_until = held_until ? std::min(*held_until, due) : due;
        }
      }
    }
    for (const auto& at : {kill_at_, join_notice_at_, held_until}) {
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
      if (fds[i].revents != 0 || (held_until && !owners[i].second->pending.empty() &&
                                  Clock::now() >= owners[i].second->held_since + kMaxHeldTime)) {
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
      say("grace period of " + lockstep::detail::seconds_text(options_.grace_period) +
          " s over; killing the remaining ranks");
      stop_all(SIGKILL);
      kill_at_.reset();
    }
  }
  for (Child& child : children_) {
    for (Stream& stream : child.streams) {
      if (stream.fd) {
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
      say("grace period of " + lockstep::detail::seconds_text(options_.grace_period) +
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

}  // namespace lockstep::run
