// lockstep-run's flags (options.hpp).
#include "options.hpp"

#include <sys/stat.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/proc.hpp"
#include "base/text.hpp"
#include "gpu/devices.hpp"
#include "job/job_config.hpp"
#include "job/launch_env.hpp"
#include "lockstep/version.hpp"
#include "lockstep/wait_policy.hpp"
#include "output.hpp"
#include "placement.hpp"

namespace lockstep::run {

namespace {

std::vector<std::string> wait_policy_names() {
  std::vector<std::string> names;
  for (lockstep::WaitPolicy policy : lockstep::kWaitPolicies) {
    names.emplace_back(lockstep::wait_policy_name(policy));
  }
  return names;
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

}  // namespace

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

// A whole number in [low, high] from `text`; the message when it is not one.
std::optional<int> number_in(const std::string& text, int low, int high) {
  auto value = lockstep::detail::parse_integer(text);
  if (!value || *value < low || *value > high) {
    return std::nullopt;
  }
  return static_cast<int>(*value);
}

// LOCKSTEP_JOB_ID as the launcher gives it: the job id, node 0's address and port (a random
// job id, when none is given, is 24 characters).
std::string launched_job_id(const Options& options) {
  return (options.job_id.empty() ? std::string(24, 'x') : options.job_id) + "@" +
         options.master_addr + ":" + std::to_string(options.master_port);
}

// The job: its shape, its identity, and how its processes wait and are placed.
static void add_job_flags(CLI::App& app, Options& options) {
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
  app.add_flag("--standalone", options.standalone,
               "One node, on a free port of 127.0.0.1 (unless --master-port is given)");
  app.add_option("--backend", options.backend,
                 "Cross-node backend for a multi-node job (sets LOCKSTEP_BACKEND; default: "
                 "the first built)")
      ->check(CLI::IsMember(lockstep::detail::known_backends()));
  app.add_option("--wait-policy,--wait_policy", options.wait_policy,
                 "Barrier wait policy for the processes (sets LOCKSTEP_WAIT_POLICY)")
      ->check(CLI::IsMember(wait_policy_names()));
  app.add_option("--cpu-bind,--cpu_bind", options.cpu_bind,
                 "Bind each process to CPUs: none; core (local rank r on the r-th CPU it may "
                 "use); numa (on the CPUs of NUMA node r mod nodes); gpu (on the CPUs of its "
                 "GPU's NUMA node)")
      ->capture_default_str();
}

// The program each process runs, and how it is stopped.
static void add_program_flags(CLI::App& app, Options& options) {
  app.add_flag("-m,--module", options.module,
               "The program is a Python module: run python3 -u -m MODULE [ARGS...]");
  app.add_flag("--no-python,--no_python", options.no_python,
               "Run the program as it is, even a .py file (by default a program whose name ends "
               "in .py runs as python3 -u PROGRAM, as under torchrun)");
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
}

// Where the processes' output goes.
static void add_output_flags(CLI::App& app, Options& options) {
  app.add_flag("--tag-output,--tag_output", options.tag_output,
               "Prefix every line a process prints with \"[rank N] \"");
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
}

// torchrun's flags that lockstep-run takes for what they mean here.
static void add_torchrun_flags(CLI::App& app, Options& options) {
  app.add_option("--max-restarts,--max_restarts", options.max_restarts_text,
                 "torchrun's: only 0, what lockstep-run does (a failed process stops the job; "
                 "nothing is restarted)");
  app.add_option("--monitor-interval,--monitor_interval", options.monitor_interval_text,
                 "torchrun's: accepted (seconds, 0 or more) with no effect: lockstep-run learns "
                 "of a process's end at once");
  app.add_option("--start-method,--start_method", options.start_method,
                 "torchrun's: spawn, fork or forkserver, accepted: every process is a program "
                 "started afresh");
  app.add_option("--rdzv-backend,--rdzv_backend", options.rdzv_backend,
                 "torchrun's rendezvous: static or c10d, where --rdzv-endpoint stands for "
                 "--master-addr and --master-port (the nodes' count stays fixed: --nnodes N)");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", options.rdzv_endpoint,
                 "torchrun's HOST[:PORT] of node 0, as --master-addr HOST --master-port PORT "
                 "(29400 when no port is given, as torchrun's)");
}

// What lockstep-run does instead of running a job.
static void add_action_flags(CLI::App& app, Options& options, bool& cleanup) {
  app.add_flag("--dry-run,--dry_run", options.dry_run,
               "Print each process's command and environment, one line per process, and exit "
               "without starting anything");
  app.add_flag("--cleanup", cleanup,
               "Remove this user's lockstep shared-memory segments whose processes are all gone "
               "(also those of other lockstep versions that no process maps), list them, and "
               "exit; no program is run");
  app.add_flag("--status", options.status,
               "List this user's lockstep jobs on this machine (any launcher's: torchrun, mpirun, "
               "srun too) and where each process is: waiting since when at which call and "
               "place, running its own code since its last call, left or dead; read without "
               "joining or disturbing the jobs; no program is run");
  app.add_flag("--json", options.json, "With --status: one JSON document, for scripts");
  app.set_version_flag("--version", std::string("lockstep-run ") + LOCKSTEP_VERSION_STRING);
}

// The launcher's flags, as torchrun names them where it has them (with torchrun's underscore
// spellings too), in groups.
static void add_flags(CLI::App& app, Options& options, bool& cleanup) {
  add_job_flags(app, options);
  add_program_flags(app, options);
  add_output_flags(app, options);
  add_torchrun_flags(app, options);
  add_action_flags(app, options, cleanup);
}

// torchrun's elastic restarts, which lockstep-run does not have.
static const char* const kNoRestarts =
    "lockstep-run does not restart failed processes (torchrun's elastic restarts): a failed "
    "process stops the job, and its status is the launcher's; rerun the job, or launch with "
    "torchrun itself (lockstep reads torchrun's variables)";

// torchrun's flags that lockstep-run does not have, and what to do instead.
std::optional<std::string> torchrun_flag(const std::string& arg) {
  std::string flag = arg.substr(0, arg.find('='));
  std::replace(flag.begin(), flag.end(), '_', '-');
  if (flag == "--max-restarts") {
    return kNoRestarts;
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
  if (flag == "--role" || flag == "--local-addr" || flag == "--max-nodes" ||
      flag == "--min-nodes") {
    return "this torchrun option has no counterpart in lockstep-run (see lockstep-run --help)";
  }
  return std::nullopt;
}

// torchrun's flags that lockstep-run accepts for what they already mean here (see Options): an
// exit status when one asks for what lockstep-run does not do.
static std::optional<int> torchrun_values(const CLI::App& app, Options& options) {
  if (app.count("--max-restarts") > 0) {
    const auto restarts = number_in(options.max_restarts_text, 0, std::numeric_limits<int>::max());
    if (!restarts) {
      say("--max-restarts " + options.max_restarts_text + ": not a number of restarts");
      return 2;
    }
    if (*restarts > 0) {
      say("--max-restarts " + options.max_restarts_text + ": " + kNoRestarts);
      return 2;
    }
  }
  if (app.count("--monitor-interval") > 0) {
    double seconds = -1;
    if (!CLI::detail::lexical_cast(options.monitor_interval_text, seconds) ||
        !std::isfinite(seconds) || seconds < 0) {
      say("--monitor-interval " + options.monitor_interval_text +
          ": not a number of seconds, 0 or more");
      return 2;
    }
  }
  if (app.count("--start-method") > 0 && options.start_method != "spawn" &&
      options.start_method != "fork" && options.start_method != "forkserver") {
    say("--start-method " + options.start_method + ": not one of spawn, fork, forkserver");
    return 2;
  }
  if (app.count("--rdzv-backend") > 0 && options.rdzv_backend != "static" &&
      options.rdzv_backend != "c10d") {
    say("--rdzv-backend " + options.rdzv_backend +
        ": lockstep-run has no rendezvous backend but static and c10d's endpoint: give every "
        "node the same --nnodes, --master-addr, --master-port and --job-id, and each its own "
        "--node-rank");
    return 2;
  }
  if (app.count("--rdzv-endpoint") == 0) {
    return std::nullopt;
  }
  if (options.standalone || app.count("--master-addr") > 0 || app.count("--master-port") > 0) {
    say("--rdzv-endpoint " + options.rdzv_endpoint +
        " names node 0's address and port: leave out " +
        (options.standalone ? "--standalone" : "--master-addr and --master-port"));
    return 2;
  }
  // HOST, HOST:PORT, [IPV6] or [IPV6]:PORT.
  const std::string& endpoint = options.rdzv_endpoint;
  std::string host = endpoint;
  std::string port = "29400";
  if (endpoint.starts_with('[')) {
    const std::size_t close = endpoint.find(']');
    if (close == std::string::npos || (close + 1 < endpoint.size() && endpoint[close + 1] != ':')) {
      host.clear();
    } else {
      host = endpoint.substr(1, close - 1);
      if (close + 1 < endpoint.size()) {
        port = endpoint.substr(close + 2);
      }
    }
  } else if (const std::size_t colon = endpoint.rfind(':'); colon != std::string::npos) {
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      host.clear();  // an IPv6 address without brackets: its port cannot be told apart
    }
  }
  const auto port_number = number_in(port, 1, 65535);
  if (host.empty() || !port_number) {
    say("--rdzv-endpoint " + endpoint + ": not HOST[:PORT] with a port from 1 to 65535 (an " +
        "IPv6 address in brackets: [ADDRESS]:PORT)");
    return 2;
  }
  options.master_addr = host;
  options.master_port = *port_number;
  return std::nullopt;
}

// torchrun's habits (see Options): the program as Python runs it (PYTHON_EXEC's interpreter,
// else python3), and --standalone's port. An exit status when the flags contradict each other,
// or a Python script is not there.
static std::optional<int> as_torchrun_would(const CLI::App& app, Options& options) {
  if (options.module && options.no_python) {
    say("-m runs a Python module and --no-python runs no Python: give one of them");
    return 2;
  }
  if (options.standalone && options.nnodes_text != "1") {
    say("--standalone is a job of one node: leave out --nnodes " + options.nnodes_text);
    return 2;
  }
  if (auto refused = torchrun_values(app, options)) {
    return refused;
  }
  if (options.command.empty()) {
    return std::nullopt;  // check_options says what is missing
  }
  const bool script =
      !options.module && !options.no_python && options.command.front().ends_with(".py");
  std::string python = "python3";
  // NOLINTNEXTLINE(concurrency-mt-unsafe): one thread
  if (const char* exec = std::getenv("PYTHON_EXEC");
      exec != nullptr && (options.module || script)) {
    python = exec;
    if (python.empty()) {
      say("PYTHON_EXEC is set but empty: unset it (python3 from PATH runs the program) or name "
          "the interpreter");
      return 2;
    }
  }
  if (options.module) {
    options.command.insert(options.command.begin(), {python, "-u", "-m"});
    options.python_unbuffered = true;
  } else if (script) {
    // Said once here, rather than by Python on every process.
    struct stat info {};
    if (::stat(options.command.front().c_str(), &info) != 0) {
      say("cannot run '" + options.command.front() + "': " + lockstep::detail::error_text(errno) +
          " (the Python script that " + python + " -u would run on each process)");
      return 2;
    }
    options.command.insert(options.command.begin(), {python, "-u"});
    options.python_unbuffered = true;
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

// Refuses options that parse but do not make a job: the exit status (2), having said why.
static std::optional<int> check_options(const CLI::App& app, Options& options) {
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

std::optional<int> read_command_line(int argc, char** argv, Options& options, bool& cleanup) {
  CLI::App app{
      "lockstep-run: start a program as a lockstep job of N processes on this machine.\n"
      "Each process gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
      "GROUP_RANK, MASTER_ADDR, MASTER_PORT) and a job identity of its own (LOCKSTEP_JOB_ID).\n"
      "A job of several nodes runs one lockstep-run per node, each with the same --nnodes,\n"
      "--master-addr, --master-port and --job-id, and its own --node-rank.\n"
      "When a process fails, the others are stopped (SIGTERM, then SIGKILL after the grace\n"
      "period) and lockstep-run exits with the failed process's status.",
      "lockstep-run"};
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
  if (options.json && !options.status) {
    say("--json is --status's form: add --status");
    return 2;
  }
  if (options.status) {
    if (!options.command.empty()) {
      say("--status runs no program: remove '" + options.command.front() + "'");
      return 2;
    }
    return std::nullopt;
  }
  if (cleanup) {
    if (!options.command.empty()) {
      say("--cleanup runs no program: remove '" + options.command.front() + "'");
      return 2;
    }
    return std::nullopt;
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
    return refused;
  }
  return check_options(app, options);
}

}  // namespace lockstep::run
