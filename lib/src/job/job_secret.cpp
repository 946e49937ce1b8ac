#include "job/job_secret.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <optional>

#include "base/proc.hpp"
#include "base/unique_fd.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

// The user's key file and its folder; empty when neither XDG_CONFIG_HOME nor HOME is set. A
// relative XDG_CONFIG_HOME is ignored, as the XDG Base Directory spec says (it would make a key
// per working folder).
std::string key_file(const EnvLookup& env) {
  if (auto xdg = env("XDG_CONFIG_HOME"); xdg && xdg->starts_with('/')) {
    return *xdg + "/lockstep/secret";
  }
  if (auto home = env("HOME"); home && !home->empty()) {
    return *home + "/.config/lockstep/secret";
  }
  return "";
}

[[noreturn]] void refuse(const std::string& source, const std::string& why) {
  throw ConfigError("lockstep: the job's secret (" + source + ") " + why +
                    " (every node of a multi-node job must hold the same secret: "
                    "LOCKSTEP_SECRET, LOCKSTEP_SECRET_FILE, or ~/.config/lockstep/secret "
                    "shared as an ssh key is)");
}

// Reads a secret file: a regular file of this user, readable by nobody else. nullopt if it does
// not exist.
std::optional<std::string> read_secret_file(const std::string& path, const std::string& source) {
  UniqueFd owned(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  const int fd = owned.get();
  if (fd < 0) {
    if (errno == ENOENT) {
      return std::nullopt;
    }
    refuse(source,
           errno == ELOOP ? "is a symbolic link" : "cannot be opened: " + error_text(errno));
  }
  struct stat st {};
  // Built in place and returned by name: GCC 12 warns of a false overread (-Wstringop-overread)
  // when it inlines the move of a short string into an optional, as link-time optimization does.
  std::optional<std::string> result(std::in_place);
  std::string& text = *result;
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = "cannot be examined: " + error_text(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = "is not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    problem = "belongs to uid " + std::to_string(st.st_uid) + ", not to this user";
  } else if ((st.st_mode & 077) != 0) {
    problem = "may be read by others (chmod 600 it)";
  } else if (st.st_size > 4096) {
    problem = "is over 4096 bytes";
  } else {
    char buffer[4097];
    ssize_t got = 0;
    while ((got = ::read(fd, buffer, sizeof buffer)) > 0) {
      text.append(buffer, static_cast<std::size_t>(got));
    }
    if (got < 0) {
      problem = "cannot be read: " + error_text(errno);
    }
  }
  owned.reset();
  if (!problem.empty()) {
    refuse(source, problem);
  }
  // One line ending goes, a Unix or a Windows one: a file written with "\r\n" holds the same
  // secret as one written with "\n" (docs/threat-model.md).
  if (text.ends_with("\r\n")) {
    text.resize(text.size() - 2);
  } else if (text.ends_with('\n')) {
    text.pop_back();
  }
  if (text.size() < kMinSecret) {
    refuse(source, "holds " + std::to_string(text.size()) + " bytes, fewer than " +
                       std::to_string(kMinSecret));
  }
  return result;
}

// Creates the user's key file: written whole under a temporary name, then linked into place
// (link fails if another process, or another node sharing the home, got there first: its key
// is the one).
void create_key_file(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/'));
  const std::string parent = dir.substr(0, dir.rfind('/'));
  (void)::mkdir(parent.c_str(), 0700);  // ~/.config: usually there already
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    refuse(path, "cannot be created: mkdir " + dir + ": " + error_text(errno));
  }
  std::array<std::byte, 32> raw{};
  fill_random(raw, "lockstep: creating " + path);
  std::string hex;
  for (std::byte byte : raw) {
    const char* digits = "0123456789abcdef";
    hex += digits[std::to_integer<int>(byte) >> 4];
    hex += digits[std::to_integer<int>(byte) & 15];
  }
  hex += '\n';
  const std::string temporary = path + ".new-" + std::to_string(::getpid());
  UniqueFd fd(
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) {
    refuse(path, "cannot be created: " + error_text(errno));
  }
  const bool written =
      ::write(fd.get(), hex.data(), hex.size()) == static_cast<ssize_t>(hex.size()) &&
      ::fsync(fd.get()) == 0;
  fd.reset();  // errno stays the write's or fsync's
  if (!written || (::link(temporary.c_str(), path.c_str()) != 0 && errno != EEXIST)) {
    const int error = errno;
    ::unlink(temporary.c_str());
    refuse(path, "cannot be created: " + error_text(error));
  }
  ::unlink(temporary.c_str());
}

}  // namespace

JobSecret load_job_secret(const EnvLookup& env) {
  if (auto value = env("LOCKSTEP_SECRET"); value) {
    if (value->size() < kMinSecret) {
      refuse("LOCKSTEP_SECRET", "has " + std::to_string(value->size()) + " bytes, fewer than " +
                                    std::to_string(kMinSecret));
    }
    return {*value, "LOCKSTEP_SECRET"};
  }
  if (auto file = env("LOCKSTEP_SECRET_FILE"); file) {
    const std::string source = "LOCKSTEP_SECRET_FILE=" + *file;
    auto text = read_secret_file(*file, source);
    if (!text) {
      refuse(source, "does not exist");
    }
    return {*text, source};
  }
  const std::string path = key_file(env);
  if (path.empty()) {
    refuse("no LOCKSTEP_SECRET, LOCKSTEP_SECRET_FILE, HOME or XDG_CONFIG_HOME", "is not set");
  }
  auto text = read_secret_file(path, path);
  if (!text) {
    create_key_file(path);
    text = read_secret_file(path, path);
    if (!text) {
      refuse(path, "vanished just after it was created");
    }
  }
  return {*text, path};
}

std::string describe_secret_source(const EnvLookup& env) {
  if (env("LOCKSTEP_SECRET")) {
    return "LOCKSTEP_SECRET";
  }
  if (auto file = env("LOCKSTEP_SECRET_FILE"); file) {
    return "LOCKSTEP_SECRET_FILE=" + *file;
  }
  const std::string path = key_file(env);
  if (path.empty()) {
    return "none (set LOCKSTEP_SECRET or HOME)";
  }
  struct stat st {};
  return path + (::lstat(path.c_str(), &st) == 0 ? "" : " (created on first use)");
}

}  // namespace lockstep::detail
