#include "base/proc.hpp"

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pwd.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <string_view>
#include <thread>
#include <vector>

#include "base/fault_points.hpp"
#include "base/unique_fd.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

struct StatFields {
  char state;
  std::uint64_t start_time;
};

std::optional<StatFields> read_stat(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    return std::nullopt;
  }
  char buffer[1024];
  const ssize_t length = ::read(fd.get(), buffer, sizeof buffer - 1);
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

std::optional<pid_t> process_mapping(const std::string& path, ino_t inode) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) {
    return std::nullopt;
  }
  const pid_t self = ::getpid();
  // ' ' + std::string&&, not " " + ...: see comma_list (base/text.cpp).
  const std::string inode_text = ' ' + std::to_string(inode) + ' ';
  std::optional<pid_t> found;
  while (!found) {
    const dirent* entry = ::readdir(proc);  // NOLINT(concurrency-mt-unsafe): a private DIR
    if (entry == nullptr) {
      break;
    }
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self) {
      continue;
    }
    std::ifstream maps("/proc/" + std::string(entry->d_name) + "/maps");
    std::string line;
    while (std::getline(maps, line)) {
      // "start-end perms offset dev inode   path"
      if (line.size() > path.size() &&
          line.compare(line.size() - path.size(), path.size(), path) == 0 &&
          line.find(inode_text) != std::string::npos) {
        found = static_cast<pid_t>(pid);
        break;
      }
    }
  }
  ::closedir(proc);
  return found;
}

std::optional<pid_t> flock_holder(ino_t inode) {
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    // "1: FLOCK  ADVISORY  WRITE 4121 00:1a:2345 0 EOF"; waiters' lines carry "->".
    char kind[16] = {};
    int pid = 0;
    unsigned major = 0;
    unsigned minor = 0;
    unsigned long long number = 0;
    if (line.find("->") == std::string::npos &&
        std::sscanf(line.c_str(), "%*d: %15s %*s %*s %d %x:%x:%llu", kind, &pid, &major, &minor,
                    &number) == 5 &&
        std::strcmp(kind, "FLOCK") == 0 && number == inode) {
      return pid;
    }
  }
  return std::nullopt;
}

std::uint64_t pid_namespace() {
  // A process's own pid namespace never changes (unshare and setns move only its children).
  static const std::uint64_t inode = [] {
    struct stat st {};
    return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
  }();
  return inode;
}

std::array<std::uint64_t, 2> boot_id() {
  static const std::array<std::uint64_t, 2> id = [] {
    std::array<std::uint64_t, 2> words{};
    std::ifstream file("/proc/sys/kernel/random/boot_id");
    std::string text;
    if (!std::getline(file, text)) {
      return words;
    }
    int digits = 0;
    for (char c : text) {
      const int value = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (value < 0) {
        continue;  // the dashes
      }
      if (digits == 32) {
        return std::array<std::uint64_t, 2>{};  // not a boot id
      }
      auto& word = words[static_cast<std::size_t>(digits / 16)];
      word = word << 4 | static_cast<std::uint64_t>(value);
      ++digits;
    }
    return digits == 32 ? words : std::array<std::uint64_t, 2>{};
  }();
  return id;
}

ProcessMark this_process_mark() {
  const pid_t pid = ::getpid();
  return ProcessMark{boot_id(), pid_namespace(), static_cast<std::uint32_t>(pid),
                     process_start_time(pid).value_or(0)};
}

Fate fate_of(const ProcessMark& mark, std::chrono::milliseconds grace) {
  const std::array<std::uint64_t, 2> unknown{};
  if (mark.pid == 0 || mark.boot == unknown || mark.boot != boot_id() || mark.pid_namespace == 0 ||
      mark.pid_namespace != pid_namespace()) {
    return Fate::unknown;
  }
  const auto until = std::chrono::steady_clock::now() + grace;
  const auto pid = static_cast<pid_t>(mark.pid);
  while (process_liveness(pid, mark.start_time) == Liveness::alive) {
    if (std::chrono::steady_clock::now() >= until) {
      return Fate::alive;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return Fate::dead;
}

bool ReadOnlyImages::contains(const void* address) noexcept {
  if (address == nullptr) {
    return false;
  }
  struct Walk {
    ReadOnlyImages& images;
    bool first = true;
    bool stale = false;
    bool failed = false;  // out of memory (nothing may unwind through the loader, which locks)
  } walk{*this};
  (void)::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t size, void* data) noexcept {
        auto& w = *static_cast<Walk*>(data);
        if (w.first) {
          w.first = false;
          // The loader's counts of loads and unloads, where this glibc gives them.
          const bool counted = size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs;
          w.stale = !w.images.read_ || !counted || info->dlpi_adds != w.images.adds_ ||
                    info->dlpi_subs != w.images.subs_;
          if (!w.stale) {
            return 1;  // the segments read before still hold
          }
          w.images.segments_.clear();
          w.images.adds_ = counted ? info->dlpi_adds : 0;
          w.images.subs_ = counted ? info->dlpi_subs : 0;
          w.images.read_ = counted;
        }
        for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          if (segment.p_type == PT_LOAD && (segment.p_flags & PF_W) == 0) {
            const std::uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
            try {
              w.images.segments_.push_back(Segment{begin, begin + segment.p_memsz});
            } catch (const std::bad_alloc&) {
              w.failed = true;
              return 1;
            }
          }
        }
        return 0;
      },
      &walk);
  if (walk.failed) {
    read_ = false;  // read again next time; meanwhile nothing is taken as read-only
    segments_.clear();
    return false;
  }
  if (walk.stale) {
    std::sort(segments_.begin(), segments_.end(),
              [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
  }
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  const auto after =
      std::upper_bound(segments_.begin(), segments_.end(), at,
                       [](std::uintptr_t a, const Segment& s) { return a < s.begin; });
  return after != segments_.begin() && at < std::prev(after)->end;
}

bool in_read_only_image(const void* address) noexcept {
  ReadOnlyImages images;
  return images.contains(address);
}

std::bitset<kMaxCpus> affinity() noexcept {
  static_assert(kMaxCpus == CPU_SETSIZE);
  cpu_set_t set;
  CPU_ZERO(&set);
  std::bitset<kMaxCpus> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < kMaxCpus; ++cpu) {
      cpus[static_cast<std::size_t>(cpu)] = CPU_ISSET(cpu, &set);
    }
  }
  return cpus;
}

int usable_cpus() noexcept {
  const auto count = static_cast<int>(affinity().count());
  return count > 0 ? count : 1;
}

bool move_to_cpu(int cpu) noexcept {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (cpu < 0 || cpu >= kMaxCpus || ::sched_getaffinity(0, sizeof mask, &mask) != 0 ||
      !CPU_ISSET(cpu, &mask)) {
    return false;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (::sched_setaffinity(0, sizeof one, &one) != 0) {
    return false;
  }
  // Back to the mask, which holds `cpu`: the thread stays there until the kernel moves it. This
  // fails only if the thread's cpuset changed in between; then the mask the cpuset allows.
  if (::sched_setaffinity(0, sizeof mask, &mask) != 0) {
    CPU_ZERO(&mask);
    for (int each = 0; each < kMaxCpus; ++each) {
      CPU_SET(each, &mask);
    }
    (void)::sched_setaffinity(0, sizeof mask, &mask);  // the kernel keeps the cpuset's part
    return false;
  }
  return true;
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

std::string user_of(uid_t uid) {
  std::string text = "uid " + std::to_string(uid);
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &found) == 0 && found != nullptr &&
      found->pw_name != nullptr) {
    text += std::string(" (") + found->pw_name + ")";
  }
  return text;
}

void fill_random(std::span<std::byte> bytes, const std::string& what) {
  while (!bytes.empty()) {
    const ssize_t got = ::getrandom(bytes.data(), bytes.size(), 0);
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got < 0) {
      throw_errno(what, "getrandom");
    }
    bytes = bytes.subspan(static_cast<std::size_t>(got));
  }
}

// Reads `size` bytes at `address` of process `pid` into `to` (process_vm_readv: one copy, no
// file between); false when it cannot (not permitted, the process gone, a fault point).
bool read_other_memory(pid_t pid, std::uint64_t address, std::byte* to,
                       std::uint64_t size) noexcept {
  if (fault_fails("exchange.no-memory-read")) {
    return false;
  }
  std::uint64_t done = 0;
  while (done < size) {
    iovec local{to + done, size - done};
    // NOLINTNEXTLINE(performance-no-int-to-ptr): another process's address, never dereferenced
    iovec remote{reinterpret_cast<void*>(address + done), size - done};
    const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return false;
    }
    done += static_cast<std::uint64_t>(n);
  }
  return true;
}

}  // namespace lockstep::detail
