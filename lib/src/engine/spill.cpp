#include "engine/spill.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "base/fault_points.hpp"
#include "base/proc.hpp"
#include "base/unique_fd.hpp"
#include "engine/segment_file.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

constexpr std::string_view kMark = "-x";

// Asks for transparent huge pages over the whole 2 MiB pages inside [memory, memory + size), where
// the system leaves them to madvise: a result of several MiB then faults in a few pages instead of
// a thousand. Measured with exchange_bench (2 vCPUs): a gather of 16 MiB per process 2.2x faster at
// N = 2 and 1.3x at N = 4, of 1 MiB at N = 4 about 8%. Nothing changes where THP is off. The advice
// stays with the pages' mapping, which the caller's allocator may reuse; it only lets the kernel
// use huge pages there.
void advise_huge_pages(void* memory, std::size_t size) noexcept {
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  const auto address = reinterpret_cast<std::uintptr_t>(memory);
  const std::uintptr_t begin = (address + kHuge - 1) / kHuge * kHuge;
  const std::uintptr_t end = (address + size) / kHuge * kHuge;
  if (end > begin) {
    (void)::madvise(static_cast<std::byte*>(memory) + (begin - address), end - begin,
                    MADV_HUGEPAGE);
  }
}

}  // namespace

void prefault(void* memory, std::size_t size) noexcept {
  // The whole pages inside [memory, memory + size): a page the allocator shares with other
  // memory is left alone (the advice writes nothing, but is kept to what the caller owns).
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t skip = (page - reinterpret_cast<std::uintptr_t>(memory) % page) % page;
  advise_huge_pages(memory, size);
  if (size > skip && (size - skip) / page > 0) {
    // Before Linux 5.14 (EINVAL) the copy faults the pages in one at a time, as without this.
    (void)::madvise(static_cast<std::byte*>(memory) + skip, (size - skip) / page * page,
                    MADV_POPULATE_WRITE);
  }
}

std::string spill_name(const std::string& segment, int slot) {
  return segment + std::string(kMark) + (slot == kNodeSpill ? "all" : std::to_string(slot));
}

bool is_spill(std::string_view name, std::string* segment) {
  const std::size_t mark = name.rfind(kMark);
  if (mark == std::string_view::npos || mark == 0) {
    return false;
  }
  const std::string_view tail = name.substr(mark + kMark.size());
  bool digits = !tail.empty() && tail.size() <= 10;
  for (const char c : tail) {
    digits = digits && c >= '0' && c <= '9';
  }
  if (tail != "all" && !digits) {
    return false;
  }
  if (segment != nullptr) {
    *segment = name.substr(0, mark);
  }
  return true;
}

Spill::Spill(std::string name, std::span<const std::byte> data, const char* what)
    : name_(std::move(name)) {
  const std::string path = shm_path(name_);
  const std::string context = std::string(what) + ": " + path + " (" + std::to_string(data.size()) +
                              " bytes, past the segment's area)";
  // A spill of this name is a dead writer's (this slot's, of an exchange that failed): ours to
  // replace. Another user's stays (/dev/shm is sticky), and O_EXCL then refuses to share it.
  (void)::unlink(path.c_str());
  const UniqueFd fd(
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) {
    throw_errno(context, "open");
  }
  try {
    if (fault_fails("spill.full")) {
      errno = ENOSPC;
      throw_errno(context, "pwrite");
    }
    std::size_t at = 0;
    while (at < data.size()) {
      const ssize_t wrote =
          ::pwrite(fd.get(), data.data() + at, data.size() - at, static_cast<off_t>(at));
      if (wrote < 0 && errno == EINTR) {
        continue;
      }
      if (wrote <= 0) {
        if (wrote == 0) {
          errno = ENOSPC;
        }
        throw_errno(context, "pwrite");
      }
      at += static_cast<std::size_t>(wrote);
    }
  } catch (...) {
    (void)::unlink(path.c_str());
    throw;
  }
}

Spill::~Spill() {
  (void)::unlink(shm_path(name_).c_str());
}

SpillView::SpillView(const std::string& name, std::uint64_t size, const char* what) {
  const std::string path = shm_path(name);
  // O_NONBLOCK: a FIFO put at the name must not block the reader.
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    throw_errno(std::string(what) + ": another process's bytes at " + path, "open");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !made_by_us(st) ||
      static_cast<std::uint64_t>(st.st_size) != size || size == 0) {
    throw Error(std::string(what) + ": " + path + " is not the " + std::to_string(size) +
                "-byte file that lockstep wrote there (a regular file of this user's, owner-only)");
  }
  // Mapped, so that each reader copies the bytes once, straight to where they go (a read into
  // new memory would zero it first: N = 4, 1 MiB each, 4.9 ms a gather against 2.3 through a
  // pipe ring).
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (mapped == MAP_FAILED) {
    throw_errno(std::string(what) + ": " + path, "mmap");
  }
  bytes_ = std::span(static_cast<const std::byte*>(mapped), size);
}

SpillView::~SpillView() {
  (void)::munmap(const_cast<std::byte*>(bytes_.data()), bytes_.size());
}

std::vector<std::byte> prefaulted_copy(std::span<const std::byte> bytes) {
  std::vector<std::byte> out;
  out.reserve(bytes.size());
  prefault(out.data(), bytes.size());
  out.assign(bytes.begin(), bytes.end());
  return out;
}

std::vector<std::byte> read_spill(const std::string& name, std::uint64_t size, const char* what) {
  const SpillView view(name, size, what);
  return prefaulted_copy(view.bytes());
}

namespace {

// The spills in /dev/shm whose names begin with `prefix` and whose segment `keep` takes.
template <class Keep>
std::vector<std::string> spills_where(const std::string& prefix, Keep keep) {
  std::vector<std::string> names;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* entry = ::readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): private DIR
      const std::string_view name = entry->d_name;
      std::string segment;
      if (name.starts_with(prefix) && is_spill(name, &segment) && keep(segment)) {
        names.emplace_back(name);
      }
    }
    ::closedir(dir);
  }
  return names;
}

}  // namespace

void remove_spills(const std::string& segment) noexcept {
  try {
    for (const std::string& name :
         spills_where(segment, [&](const std::string& of) { return of == segment; })) {
      (void)::unlink(shm_path(name).c_str());
    }
  } catch (...) {
    // Out of memory: the sweep removes them later.
  }
}

std::vector<std::string> remove_orphan_spills(const std::string& prefix) noexcept {
  std::vector<std::string> removed;
  try {
    const auto gone = [](const std::string& segment) {
      struct stat st {};
      return ::lstat(shm_path(segment).c_str(), &st) != 0 && errno == ENOENT;
    };
    for (std::string& name : spills_where(prefix, gone)) {
      struct stat st {};
      if (::lstat(shm_path(name).c_str(), &st) == 0 && made_by_us(st) &&
          ::unlink(shm_path(name).c_str()) == 0) {
        removed.push_back(std::move(name));
      }
    }
  } catch (...) {
    // Out of memory: the next sweep removes them.
  }
  return removed;
}

}  // namespace lockstep::detail
