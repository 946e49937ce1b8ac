// The ranks' output as the launcher relays it (tagging, log files, filtering, a failure's last
// lines) and the launcher's own messages.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <deque>
#include <string>

#include "base/unique_fd.hpp"

namespace lockstep::run {

// How many of a failed process's last lines the launcher repeats when they went to a file only.
constexpr std::size_t kTailLines = 10;
// A line longer than this is relayed in pieces as it comes (tagged once), not held whole.
constexpr std::size_t kMaxHeldLine = std::size_t{64} * 1024;
// A line's start that waits this long for its end is relayed as it is (a prompt, "working...").
constexpr auto kMaxHeldTime = std::chrono::seconds(1);

// A child's stdout or stderr, when the launcher relays it (tagging, logs, filtering) rather than
// letting the child write to the launcher's own.
struct Stream {
  lockstep::detail::UniqueFd fd;  // the pipe's read end
  int out = STDOUT_FILENO;        // the console stream it goes to, when `console`
  bool console = true;
  lockstep::detail::UniqueFd file;  // its log file, if any
  std::string pending;
  std::chrono::steady_clock::time_point held_since;  // when `pending` began (when not empty)
  bool mid_line = false;           // the last piece relayed ended inside a line (see kMaxHeldLine)
  std::deque<std::string> recent;  // its last kTailLines lines (for a failure's report)
};

// Writes all of `text`; 0, or the errno of the write that failed.
int write_all(int fd, const std::string& text);

// The console: the launcher's stdout and stderr. Once start_console() has been called, what
// goes there (relayed output, the launcher's own lines) is queued and written by a thread of its
// own, so that a console nobody reads (a paused `| less`, a full pipe) never keeps the launcher
// from supervising the ranks: a failed rank still stops the job. Before it, and after
// finish_console(), writes are made at once. Start it after the last fork: a child forked while
// the thread holds a lock could not take it.
void start_console();
// Writes `text` to the console's `fd` (STDOUT_FILENO or STDERR_FILENO), after what went there
// before.
void to_console(int fd, std::string text);
// Bytes queued and not yet written.
std::size_t console_backlog();
// Writes what is queued (blocking, as any writer to that console) and stops the thread.
void finish_console();
// Above this backlog the launcher stops reading the ranks' pipes until it drains: the ranks then
// wait in their writes, as they would writing to the console themselves.
constexpr std::size_t kMaxConsoleBacklog = std::size_t{4} * 1024 * 1024;

// One line of the launcher's own on stderr: "lockstep-run: <text>".
void say(const std::string& text);

}  // namespace lockstep::run
