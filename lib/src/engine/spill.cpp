#include "engine/spill.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

// A new file at `path` (a spill, a window) for this process alone: one of this name is a dead
// writer's (this slot's, of an exchange that failed): ours to replace. Another user's stays
// (/dev/shm is sticky), and O_EXCL then refuses to share it. SystemError naming `context`.
UniqueFd create_ours(const std::string& path, int flags, const std::string& context) {
  (void)::unlink(path.c_str());
  UniqueFd fd(::open(path.c_str(), flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) {
    throw_errno(context, "open");
  }
  return fd;
}

// The first `size` bytes of the `noun` ("bytes", "window") that another of this user's processes
// wrote owner-only at `path`, mapped read-only: a file of exactly `size` bytes, or of `size` or
// more where `at_least`. Error when it is absent or not such a file (a link, a FIFO, another
// user's); SystemError when it cannot be mapped.
const std::byte* map_theirs(const std::string& path, std::uint64_t size, bool at_least,
                            const char* noun, const char* what) {
  // O_NONBLOCK: a FIFO put at the name must not block the reader.
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    throw_errno(std::string(what) + ": another process's " + noun + " at " + path, "open");
  }
  struct stat st {};
  const auto file_size = [&] { return static_cast<std::uint64_t>(st.st_size); };
  if (::fstat(fd.get(), &st) != 0 || !made_by_us(st) || size == 0 ||
      (at_least ? file_size() < size : file_size() != size)) {
    throw Error(std::string(what) + ": " + path + " is not the " + std::to_string(size) + "-byte" +
                (at_least ? " or larger" : "") +
                " file that lockstep wrote there (a regular file of this user's, owner-only)");
  }
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (mapped == MAP_FAILED) {
    throw_errno(std::string(what) + ": " + path, "mmap");
  }
  return static_cast<const std::byte*>(mapped);
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

std::string window_name(const std::string& segment, int slot, int window) {
  return spill_name(segment, slot) + "w" + std::to_string(window);
}

namespace {

bool digits(std::string_view text) {
  bool all = !text.empty() && text.size() <= 10;
  for (const char c : text) {
    all = all && c >= '0' && c <= '9';
  }
  return all;
}

}  // namespace

bool is_spill(std::string_view name, std::string* segment) {
  const std::size_t mark = name.rfind(kMark);
  if (mark == std::string_view::npos || mark == 0) {
    return false;
  }
  const std::string_view tail = name.substr(mark + kMark.size());
  const std::size_t w = tail.find('w');  // a window's: "<slot>w<window>"
  const bool window =
      w != std::string_view::npos && digits(tail.substr(0, w)) && digits(tail.substr(w + 1));
  if (tail != "all" && !digits(tail) && !window) {
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
  const UniqueFd fd = create_ours(path, O_WRONLY, context);
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

SpillView::SpillView(const std::string& name, std::uint64_t size, const char* what)
    // Mapped, so that each reader copies the bytes once, straight to where they go (a read into
    // new memory would zero it first: N = 4, 1 MiB each, 4.9 ms a gather against 2.3 through a
    // pipe ring).
    : bytes_(map_theirs(shm_path(name), size, false, "bytes", what), size) {}

SpillView::~SpillView() {
  (void)::munmap(const_cast<std::byte*>(bytes_.data()), bytes_.size());
}

Windows::~Windows() {
  for (int window = 0; window < kWindows; ++window) {
    const Window& one = windows_[static_cast<std::size_t>(window)];
    if (one.mapped != nullptr && unmap_) {
      (void)::munmap(one.mapped, one.capacity);
    }
    if (one.mapped != nullptr && unlink_) {
      (void)::unlink(shm_path(window_name(segment_, slot_, window)).c_str());
    }
  }
}

Windows::Placed Windows::put(std::span<const std::byte> data, const char* what) {
  const int index = next_;
  Window& window = windows_[static_cast<std::size_t>(index)];
  if (window.capacity < data.size() || window.mapped == nullptr) {
    // Grown to the next power of two from 1 MiB: a few sizes over a job's life.
    std::uint64_t capacity = std::uint64_t{1} << 20;
    while (capacity < data.size()) {
      capacity *= 2;
    }
    const std::string path = shm_path(window_name(segment_, slot_, index));
    const std::string context = std::string(what) + ": " + path + " (" + std::to_string(capacity) +
                                " bytes, this process's window)";
    // Created once; grown in the file this process made (a name replaced since is refused).
    const UniqueFd fd = window.mapped == nullptr
                            ? create_ours(path, O_RDWR, context)
                            : UniqueFd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) {
      throw_errno(context, "open");
    }
    if (fault_fails("spill.full")) {
      errno = ENOSPC;
      throw_errno(context, "fallocate");
    }
    if (const int error = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(capacity))) {
      errno = error;
      throw_errno(context, "fallocate");
    }
    void* mapped = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (mapped == MAP_FAILED) {
      throw_errno(context, "mmap");
    }
    if (window.mapped != nullptr) {
      (void)::munmap(window.mapped, window.capacity);
    }
    window.mapped = static_cast<std::byte*>(mapped);
    window.capacity = capacity;
  }
  if (!data.empty()) {
    std::memcpy(window.mapped, data.data(), data.size());
  }
  next_ = (next_ + 1) % kWindows;
  return {index, window.capacity};
}

WindowViews::~WindowViews() {
  if (!unmap_) {
    return;
  }
  for (const Mapping& mapping : mappings_) {
    (void)::munmap(const_cast<std::byte*>(mapping.mapped), mapping.capacity);
  }
}

std::span<const std::byte> WindowViews::view(const std::string& segment, int slot, int window,
                                             std::uint64_t capacity, std::uint64_t size,
                                             const char* what) {
  if (window < 0 || window >= kWindows || size > capacity) {
    throw Error(std::string(what) + ": the node's entries are not lockstep's (window " +
                std::to_string(window) + ", " + std::to_string(size) + " of " +
                std::to_string(capacity) + " bytes)");
  }
  auto known = std::find_if(mappings_.begin(), mappings_.end(), [&](const Mapping& mapping) {
    return mapping.slot == slot && mapping.window == window;
  });
  if (known != mappings_.end() && known->capacity == capacity) {
    return {known->mapped, size};
  }
  const std::byte* mapped =
      map_theirs(shm_path(window_name(segment, slot, window)), capacity, true, "window", what);
  if (known != mappings_.end()) {  // the window grew: its old mapping goes
    (void)::munmap(const_cast<std::byte*>(known->mapped), known->capacity);
    mappings_.erase(known);
  }
  mappings_.push_back({slot, window, mapped, capacity});
  return {mapped, size};
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
