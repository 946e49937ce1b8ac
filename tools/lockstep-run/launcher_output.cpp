// The launcher's relay of the ranks' output (output.hpp): where each stream goes, the pump that
// tags and copies it, the log files, and a failed process's last lines.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

#include "base/proc.hpp"
#include "launcher.hpp"
#include "output.hpp"

namespace lockstep::run {

bool Launcher::route_streams(Child& child, int local_rank,
                             lockstep::detail::UniqueFd (&pipes)[2][2]) {
  // Each stream: to the console unless redirected or filtered out; to a file when redirected or
  // teed. The launcher relays it when it tags, writes a file or hides it, and when several
  // Python processes that it runs unbuffered share the console: print() writes a line in
  // pieces (each argument, then the newline), which the terminal would interleave with the
  // others' (7 of 20 lines cut, measured); relayed, each line is written whole.
  bool relay = options_.tag_output || (options_.python_unbuffered && options_.nproc_per_node > 1);
  for (int i = 0; i < 2; ++i) {
    const int bit = i == 0 ? 1 : 2;
    Stream& stream = child.streams[i];
    const auto at = static_cast<std::size_t>(local_rank);
    const bool redirected = !options_.redirects.empty() && (options_.redirects[at] & bit) != 0;
    const bool teed = !options_.tee.empty() && (options_.tee[at] & bit) != 0;
    stream.console = !redirected && (options_.shown.empty() || options_.shown[at]);
    if (!log_dir_.empty() && (redirected || teed)) {
      stream.file.reset(
          ::open(log_path(child.rank, i).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!stream.file) {
        lockstep::detail::throw_errno("lockstep-run: " + log_path(child.rank, i), "open");
      }
    }
    relay = relay || stream.file || !stream.console;
  }
  if (relay) {
    for (auto& ends : pipes) {
      int p[2] = {-1, -1};
      if (::pipe2(p, O_CLOEXEC) != 0) {
        lockstep::detail::throw_errno("lockstep-run: starting rank " + std::to_string(child.rank),
                                      "pipe2");
      }
      ends[0].reset(p[0]);
      ends[1].reset(p[1]);
      (void)::fcntl(p[0], F_SETFL, O_NONBLOCK);
    }
  }
  return relay;
}

namespace {

// Reads what the rank has written so far into stream.pending (the read ends are non-blocking);
// false when its pipe has ended (then closed).
bool drain(Stream& stream) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(stream.fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return true;  // nothing more now
    }
    if (n <= 0) {
      stream.fd.reset();
      return false;
    }
    if (stream.pending.empty()) {
      stream.held_since = std::chrono::steady_clock::now();
    }
    stream.pending.append(buffer, static_cast<std::size_t>(n));
    if (static_cast<std::size_t>(n) < sizeof buffer) {
      return true;
    }
  }
}

// What one pump relays: `out` for the console (each line tagged), `raw` for the log file
// (exactly what the rank wrote).
struct Relayed {
  std::string out;
  std::string raw;
};

// Takes from stream.pending what is relayed now: each line with its newline; a line redrawn in
// place (a progress bar: text, then '\r'), which the next piece overwrites, tag included; and a
// line without end in sight, or paused in, as it is. `flush_all`: the rest too (the rank ended).
Relayed take_lines(Stream& stream, const std::string& tag, bool flush_all) {
  Relayed relayed;
  auto take = [&](const std::string& piece) {
    relayed.out += (stream.mid_line ? "" : tag) + piece;
    relayed.raw += piece;
    stream.mid_line = piece.back() != '\n' && piece.back() != '\r';
    if (piece.back() == '\n') {
      stream.recent.push_back(piece);
      if (stream.recent.size() > kTailLines) {
        stream.recent.pop_front();
      }
    }
  };
  std::size_t start = 0;
  for (std::size_t end = stream.pending.find_first_of("\r\n"); end != std::string::npos;
       start = end + 1, end = stream.pending.find_first_of("\r\n", start)) {
    if (stream.pending[end] == '\r' && end + 1 < stream.pending.size() &&
        stream.pending[end + 1] == '\n') {
      ++end;  // "\r\n" ends one line
    }
    take(stream.pending.substr(start, end + 1 - start));
  }
  if (start > 0) {
    stream.pending.erase(0, start);
    stream.held_since = std::chrono::steady_clock::now();  // what is left began now, at the latest
  }
  if (flush_all && !stream.pending.empty()) {
    // The last line, without its newline: the console (and the tail) get it ended, the file
    // exactly what the rank wrote.
    take(stream.pending + "\n");
    relayed.raw.pop_back();
    stream.pending.clear();
  } else if (stream.pending.size() > kMaxHeldLine ||
             (!stream.pending.empty() &&
              std::chrono::steady_clock::now() - stream.held_since >= kMaxHeldTime)) {
    take(stream.pending);
    stream.pending.clear();
  }
  return relayed;
}

}  // namespace

void Launcher::pump(Stream& stream, int rank, bool flush_all) const {
  flush_all = !drain(stream) || flush_all;
  const std::string tag = options_.tag_output ? "[rank " + std::to_string(rank) + "] " : "";
  const auto [out, raw] = take_lines(stream, tag, flush_all);
  if (stream.console && !out.empty()) {
    to_console(stream.out, out);
  }
  if (stream.file) {
    if (const int error = write_all(stream.file.get(), raw); error != 0) {
      // Said once: the file is given up, and its output goes on to the terminal.
      say("cannot write " + log_path(rank, stream.out == STDOUT_FILENO ? 0 : 1) + ": " +
          lockstep::detail::error_text(error) + "; rank " + std::to_string(rank) + "'s " +
          (stream.out == STDOUT_FILENO ? "stdout" : "stderr") + " goes on to the terminal " +
          (stream.console ? "only" : "instead") + " from here");
      stream.file.reset();
      if (!stream.console) {
        stream.console = true;
        to_console(stream.out, out);
      }
    }
  }
}

void Launcher::report_tail(Child& child) {
  static const char* const names[] = {"stdout", "stderr"};
  for (int i = 0; i < 2; ++i) {
    Stream& stream = child.streams[i];
    if (stream.fd) {
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
    to_console(STDERR_FILENO, text);
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

}  // namespace lockstep::run
