// Spills: the bytes of one exchange (State::gather_object, State::broadcast) that do not fit the
// node segment's area, in a file of /dev/shm of their own (internal).
//
// A spill is named from its node segment: "<segment>-x<slot>" holds a process's own bytes (its
// entry of a gather), "<segment>-xall" the node's copy of what every process reads (a broadcast;
// the job's entries of a gather across machines). Its writer creates it owner-only (0600, never
// following a link), writes it whole before it arrives at the exchange's first episode, and
// unlinks it when the exchange is over, however it ends; the node's processes read it by name
// between. A writer that dies first leaves it to the node's last process out, which removes the
// segment's spills with the segment (remove_spills), or to the sweep, which removes a spill whose
// segment is gone.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::detail {

// "<segment>-x<slot>", or "<segment>-xall" for kNodeSpill.
inline constexpr int kNodeSpill = -1;
[[nodiscard]] std::string spill_name(const std::string& segment, int slot);
// Whether `name` (in /dev/shm) is a spill, and then its segment's name.
[[nodiscard]] bool is_spill(std::string_view name, std::string* segment = nullptr);

// The writer's spill: created and written whole by the constructor, unlinked by the destructor.
// SystemError naming the spill and the call when /dev/shm refuses it (full, read-only, a file of
// another user at the name).
class Spill {
 public:
  Spill(std::string name, std::span<const std::byte> data, const char* what);
  ~Spill();
  Spill(const Spill&) = delete;
  Spill& operator=(const Spill&) = delete;

 private:
  std::string name_;
};

// Spill `name`, which this user's process wrote owner-only, mapped for reading while the view
// lives (its writer keeps it until every reader is done). Error when it is absent, not `size`
// bytes, or not such a file (a link, a FIFO, another user's); SystemError when it cannot be
// mapped.
class SpillView {
 public:
  SpillView(const std::string& name, std::uint64_t size, const char* what);
  ~SpillView();
  SpillView(const SpillView&) = delete;
  SpillView& operator=(const SpillView&) = delete;
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return bytes_; }

 private:
  std::span<const std::byte> bytes_;
};

// The `size` bytes of spill `name` (SpillView's checks), copied once into new memory.
[[nodiscard]] std::vector<std::byte> read_spill(const std::string& name, std::uint64_t size,
                                                const char* what);

// Faults in the whole pages of [memory, memory + size) at once (MADV_POPULATE_WRITE), before a
// copy of that many bytes into new memory: one system call instead of a fault a page, which took
// about a third of a gather's time at N = 4, 1 MiB each (perf, 2 vCPUs). Best effort.
void prefault(void* memory, std::size_t size) noexcept;
// `bytes` copied into new memory, its pages faulted in first (prefault).
[[nodiscard]] std::vector<std::byte> prefaulted_copy(std::span<const std::byte> bytes);

// A reader in place's windows (Context::GatherSink::in_place, Python's gather_object): kWindows
// files of /dev/shm, "<segment>-x<slot>w<k>", each kept mapped between gathers by its writer and
// its readers, written in turn, so that a gather's bytes go to memory already the process's and
// are read where they lie. In turn, because rewriting memory that the other processes have just
// read waits for their caches to give up each line (2 vCPUs, 1 MiB: 0.39 ms with one window, 0.06
// ms with three). Each holds at most kWindowMost bytes; larger bytes go to a spill. Created
// owner-only (0600, never following a link), their pages reserved (fallocate: a full /dev/shm
// is an error here, not a SIGBUS on the copy), unlinked by the destructor; a writer that dies
// leaves them to its segment's last process out or the sweep, as its spills.
inline constexpr int kWindows = 3;
inline constexpr std::size_t kWindowMost = std::size_t{4} << 20;
[[nodiscard]] std::string window_name(const std::string& segment, int slot, int window);

class Windows {
 public:
  Windows(std::string segment, int slot) : segment_(std::move(segment)), slot_(slot) {}
  ~Windows();
  Windows(const Windows&) = delete;
  Windows& operator=(const Windows&) = delete;
  // `data` (at most kWindowMost bytes) copied into the next window in turn, grown to hold it;
  // that window and its capacity. SystemError naming the window when /dev/shm refuses it.
  struct Placed {
    int window;
    std::uint64_t capacity;
  };
  Placed put(std::span<const std::byte> data, const char* what);
  // What the destructor then does: `abandon` (a forked child's copy) unmaps and leaves the files
  // to the process that made them; `keep_mapped` (another thread may still write: the process
  // exits) unlinks them and leaves the mappings.
  void abandon() noexcept { unlink_ = false; }
  void keep_mapped() noexcept { unmap_ = false; }

 private:
  struct Window {
    std::byte* mapped = nullptr;
    std::uint64_t capacity = 0;
  };
  std::string segment_;
  int slot_;
  int next_ = 0;
  bool unlink_ = true;
  bool unmap_ = true;
  std::array<Window, kWindows> windows_{};
};

// Other processes' windows, each mapped when first read (and again when it grew) and kept until
// this object goes.
class WindowViews {
 public:
  WindowViews() = default;
  ~WindowViews();
  WindowViews(const WindowViews&) = delete;
  WindowViews& operator=(const WindowViews&) = delete;
  // The first `size` bytes of window `window` of slot `slot`'s writer, of capacity `capacity`.
  // Error when the file is absent, smaller, or not such a file (a link, a FIFO, another user's);
  // SystemError when it cannot be mapped.
  std::span<const std::byte> view(const std::string& segment, int slot, int window,
                                  std::uint64_t capacity, std::uint64_t size, const char* what);
  // The destructor leaves the mappings (another thread may still read: the process exits).
  void keep_mapped() noexcept { unmap_ = false; }

 private:
  struct Mapping {
    int slot;
    int window;
    const std::byte* mapped;
    std::uint64_t capacity;
  };
  std::vector<Mapping> mappings_;
  bool unmap_ = true;
};

// Removes every spill of `segment` (its processes have all gone, or the segment is replaced).
// Best effort, never throws.
void remove_spills(const std::string& segment) noexcept;
// Removes the spills whose names begin with `prefix` (this user's) and whose segment is gone
// (their writers died, and so did their segment's last process); returns their names. For the
// sweep (engine/segment.hpp). Best effort, never throws.
std::vector<std::string> remove_orphan_spills(const std::string& prefix) noexcept;

}  // namespace lockstep::detail
