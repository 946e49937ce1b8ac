// lockstep-run: starts N processes of a program as one lockstep job, as torchrun does. The
// flags are options.hpp's, the ranks' placement placement.hpp's, their output output.hpp's, and
// starting and supervising them launcher.hpp's.
#include <CLI/CLI.hpp>
#include <exception>
#include <string>
#include <utility>

#include "launcher.hpp"
#include "options.hpp"
#include "output.hpp"

using namespace lockstep::run;  // NOLINT(google-build-using-namespace): this program's own

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
