// lockstep-run: starts N processes of a program as one lockstep job, as torchrun does. The
// flags are options.hpp's, the ranks' placement placement.hpp's, the streams of their output
// output.hpp's, and starting and supervising them launcher.hpp's (launcher.cpp, and
// launcher_output.cpp for relaying their output).
#include <exception>
#include <utility>

#include "launcher.hpp"
#include "options.hpp"
#include "output.hpp"
#include "status.hpp"

using namespace lockstep::run;  // NOLINT(google-build-using-namespace): this program's own

int main(int argc, char** argv) {
  Options options;
  bool cleanup = false;
  if (auto status = read_command_line(argc, argv, options, cleanup)) {
    return *status;
  }
  if (cleanup) {
    return clean_up();
  }
  if (options.status) {
    return show_status(options.json);
  }
  if (options.dry_run) {
    return Launcher(std::move(options)).dry_run();
  }
  try {
    return Launcher(std::move(options)).run();
  } catch (const std::exception& error) {
    say(error.what());
    finish_console();
    return 1;
  }
}
