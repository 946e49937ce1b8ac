#include "proc.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string_view>

#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

struct StatFields {
  char state;
  std::uint64_t start_time;
};

std::optional<StatFields> read_stat(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return std::nullopt;
  }
  char buffer[1024];
  ssize_t length = ::read(fd, buffer, sizeof buffer - 1);
  ::close(fd);
  if (length <= 0) {
    return std::nullopt;
  }
  std::string_view text(buffer, static_cast<std::size_t>(length));
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  auto close = text.rfind(')');
  if (close == std::string_view::npos || close + 2 >= text.size()) {
    return std::nullopt;
  }
  text.remove_prefix(close + 2);
  StatFields fields{text.front(), 0};
  // After ')' come field 3 (state) ... field 22 (starttime): skip 19 separators.
  int field = 3;
  std::size_t pos = 0;
  while (field < 22) {
    pos = text.find(' ', pos);
    if (pos == std::string_view::npos) {
      return std::nullopt;
    }
    ++pos;
    ++field;
  }
  std::uint64_t value = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    value = value * 10 + static_cast<std::uint64_t>(text[pos] - '0');
    ++pos;
  }
  fields.start_time = value;
  return fields;
}

}  // namespace

std::optional<std::uint64_t> process_start_time(pid_t pid) {
  auto fields = read_stat(pid);
  if (!fields) {
    return std::nullopt;
  }
  return fields->start_time;
}

Liveness process_liveness(pid_t pid, std::uint64_t start_time) {
  auto fields = read_stat(pid);
  if (!fields) {
    // No /proc entry: gone, unless /proc itself is unreadable (then ask the kernel).
    if (::kill(pid, 0) == 0 || errno == EPERM) {
      return ::access("/proc/self/stat", R_OK) == 0 ? Liveness::dead : Liveness::alive;
    }
    return Liveness::dead;
  }
  if (fields->state == 'Z' || fields->state == 'X' || fields->start_time != start_time) {
    return Liveness::dead;
  }
  return Liveness::alive;
}

std::string error_text(int error_number) {
  char buffer[256];
  // GNU strerror_r returns the message, which may or may not live in `buffer`.
  return ::strerror_r(error_number, buffer, sizeof buffer);
}

void throw_errno(const std::string& what, const char* call) {
  int saved = errno;
  throw SystemError(what + ": " + call + " failed: " + error_text(saved), saved);
}

}  // namespace lockstep::detail
