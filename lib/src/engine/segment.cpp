#include "engine/segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

#include "base/fault_points.hpp"
#include "base/proc.hpp"
#include "lockstep/error.hpp"
#include "lockstep/version.hpp"
#include "waiting/futex.hpp"
#include "waiting/waiter.hpp"

namespace bip = boost::interprocess;

namespace lockstep::detail {
namespace {

using Clock = std::chrono::steady_clock;

// How long a leaving process waits for the segment's lock.
constexpr auto kLeaveLockBound = std::chrono::seconds(1);

std::string shm_path(const std::string& name) {
  return "/dev/shm/" + name;
}

// Holds flock(LOCK_EX) on a descriptor. The kernel drops it if the process dies; a process
// that holds it while stopped (SIGSTOP) must not block the others beyond their deadline.
class FileLock {
 public:
  // Waits for the lock until `deadline`, then throws TimeoutError naming the holder.
  FileLock(int fd, Clock::time_point deadline, const std::string& name) : fd_(fd) {
    auto pause = std::chrono::microseconds(20);
    while (!try_lock()) {
      check_interrupt("lockstep: joining the job (locking " + shm_path(name) + ")");
      if (Clock::now() >= deadline) {
        struct stat st {};
        std::optional<pid_t> holder;
        if (::fstat(fd_, &st) == 0) {
          holder = flock_holder(st.st_ino);
        }
        throw TimeoutError(
            "lockstep: could not lock shared-memory segment " + shm_path(name) + " in time: " +
                (holder ? "process " + std::to_string(*holder) : std::string("another process")) +
                " holds its lock (is it stopped?)",
            {});
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(2));
    }
  }
  // Tries once; held() says whether it got the lock.
  FileLock(int fd, std::try_to_lock_t /*tag*/) : fd_(fd) { (void)try_lock(); }
  ~FileLock() {
    if (held_) {
      ::flock(fd_, LOCK_UN);
    }
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  [[nodiscard]] bool held() const noexcept { return held_; }

 private:
  bool try_lock() {
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        return false;
      }
      if (errno != EINTR) {
        throw_errno("lockstep: locking the node segment", "flock");
      }
    }
    held_ = true;
    return true;
  }

  int fd_;
  bool held_ = false;
};

// Makes tmpfs back all `size` bytes of the segment now: ftruncate reserves nothing, and the
// first touch of a page that /dev/shm has no room for would kill the process with SIGBUS.
void reserve(int fd, std::size_t size, const std::string& name) {
  int error = 0;
  do {
    error = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  } while (error == EINTR);
  if (error != 0) {
    throw SystemError("lockstep: shared-memory segment " + shm_path(name) + ": cannot reserve " +
                          std::to_string(size) + " bytes: " + error_text(error) +
                          (error == ENOSPC ? " (/dev/shm is full: see df -h /dev/shm)" : ""),
                      error);
  }
}

// The header fields every layout version keeps in place, read without mapping the file.
struct Prefix {
  std::uint64_t magic = 0;
  std::uint32_t layout_version = 0;
  std::uint32_t num_slots = 0;
};
enum class Peek { ours, torn, other_version };

Peek peek(int fd, std::size_t size, Prefix& prefix) {
  if (size < sizeof(SegmentHeader) ||
      ::pread(fd, &prefix, sizeof prefix, 0) != static_cast<ssize_t>(sizeof prefix) ||
      prefix.magic != kSegmentMagic) {
    return Peek::torn;  // its creator died while laying it out (it held the lock we hold)
  }
  if (prefix.layout_version != kLayoutVersion) {
    return Peek::other_version;
  }
  return size >= segment_size(prefix.num_slots) ? Peek::ours : Peek::torn;
}

// Whether `name` still names the file open on `fd` (another process may have replaced it).
bool still_named(int fd, const std::string& name, struct stat& by_fd) {
  struct stat by_name {};
  if (::fstat(fd, &by_fd) != 0 || ::stat(shm_path(name).c_str(), &by_name) != 0) {
    return false;
  }
  return by_fd.st_ino == by_name.st_ino && by_fd.st_dev == by_name.st_dev;
}

// Whether `st` is a file as lockstep makes its segments: regular, this user's, owner-only.
bool made_by_us(const struct stat& st) {
  return S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 0077) == 0;
}

void check_owner(const struct stat& st, const std::string& name) {
  if (!S_ISREG(st.st_mode)) {
    throw ConfigError("lockstep: " + shm_path(name) + " is not a regular file (" +
                      user_of(st.st_uid) +
                      " put something else at this job's segment name); refusing to use it");
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 0077) != 0) {
    char mode[8];
    (void)std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw ConfigError("lockstep: shared-memory segment " + shm_path(name) + " is owned by " +
                      user_of(st.st_uid) + " with mode " + mode + "; refusing to use it " +
                      "(lockstep creates its segments owner-only, 0600, for uid " +
                      std::to_string(::geteuid()) + ")");
  }
}

// Opens (creating if absent) the segment `name`; empty when it vanished between the two tries.
std::optional<bip::shared_memory_object> open_segment(const std::string& name) {
  bip::permissions owner_only;
  owner_only.set_permissions(0600);
  try {
    return bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write, owner_only);
  } catch (const bip::interprocess_exception& created) {
    if (created.get_native_error() != EEXIST) {
      throw SystemError("lockstep: creating shared-memory segment " + shm_path(name) + ": " +
                            error_text(created.get_native_error()),
                        created.get_native_error());
    }
  }
  try {
    return bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_write);
  } catch (const bip::interprocess_exception& opened) {
    int error = opened.get_native_error();
    if (error == ENOENT) {
      return std::nullopt;
    }
    if (error == EACCES) {
      throw ConfigError("lockstep: shared-memory segment " + shm_path(name) +
                        " exists but belongs to another user; refusing to use it");
    }
    throw SystemError(
        "lockstep: opening shared-memory segment " + shm_path(name) + ": " + error_text(error),
        error);
  }
}

SlotStatus status_of(const Slot& slot) {
  // Acquire: the status is stored last, so a reader that sees it also sees the slot's pid,
  // start time and rank.
  return static_cast<SlotStatus>(slot.status.load(std::memory_order_acquire));
}

// Whether the slot's process has joined and is (or is no longer) running. A zombie, or another
// process that now has the pid, is not running.
bool joined_and(const Slot& slot, Liveness liveness) {
  // Relaxed: ordered by status_of's acquire.
  return status_of(slot) == SlotStatus::joined &&
         process_liveness(slot.pid.load(std::memory_order_relaxed),
                          slot.start_time.load(std::memory_order_relaxed)) == liveness;
}

bool any_peer_alive(const Slot* slots, int num_slots, int except) {
  for (int i = 0; i < num_slots; ++i) {
    if (i != except && joined_and(slots[i], Liveness::alive)) {
      return true;
    }
  }
  return false;
}

Slot* slots_of(SegmentHeader* header) {
  return reinterpret_cast<Slot*>(header + 1);
}

// A segment that a process has left, or whose member died, belongs to a job that has ended (or
// failed): its survivors keep their mapping, new joiners get a fresh one.
bool job_ended(SegmentHeader& header) {
  if (header.left.value.load() > 0) {
    return true;
  }
  if (header.pid_namespace != pid_namespace()) {
    return false;  // its pids mean nothing here: it cannot be judged dead from this namespace
  }
  const Slot* slots = slots_of(&header);
  for (std::uint32_t i = 0; i < header.num_slots; ++i) {
    if (joined_and(slots[i], Liveness::dead)) {
      return true;
    }
  }
  return false;
}

void check_identity(const SegmentHeader& header, const JobConfig& config, const std::string& name) {
  std::string_view theirs(header.identity,
                          std::min<std::size_t>(header.identity_length, kMaxIdentity));
  if (theirs != config.identity) {
    throw ConfigError("lockstep: shared-memory segment " + shm_path(name) + " belongs to job '" +
                      std::string(theirs) + "', not to '" + config.identity +
                      "' (identity hash collision): set LOCKSTEP_JOB_ID");
  }
}

std::string shape(std::uint32_t local, std::uint32_t world) {
  return std::to_string(local) + " local process" + (local == 1 ? "" : "es") + " of " +
         std::to_string(world);
}

// The pids of the processes that claimed a slot.
std::vector<int> pids_of(const SegmentHeader& header) {
  std::vector<int> pids;
  const Slot* slots = slots_of(const_cast<SegmentHeader*>(&header));  // NOLINT: read only
  for (std::uint32_t i = 0; i < header.num_slots; ++i) {
    if (status_of(slots[i]) != SlotStatus::empty) {
      pids.push_back(slots[i].pid.load());
    }
  }
  return pids;
}

// Two launches given one job id: `who` names the first one's processes or segment.
[[noreturn]] void throw_other_launch(const JobConfig& config, const std::string& who) {
  throw ConfigError("lockstep: a job with identity '" + config.identity +
                    "' started by another launch is already running on this node (" + who +
                    "): two launches were given the same --job-id (LOCKSTEP_JOB_ID); give each "
                    "its own (without one, lockstep-run picks a unique one)");
}

// Two launches given one job id: the second one's processes are refused while the first's
// segment is there (the sweep just removed it if its processes are gone). Each launch has a name
// of its own, so they could not meet anyway; this says why the second cannot form.
void refuse_other_launches(const JobConfig& config, const std::string& mine) {
  for (const auto& name : segments_of(config.identity, config.node_index)) {
    struct stat st {};
    if (name == mine || ::lstat(shm_path(name).c_str(), &st) != 0 || !made_by_us(st)) {
      continue;  // another user's file says nothing about this user's launches
    }
    const auto ranks = joined_ranks(name);
    throw_other_launch(
        config, (ranks && !ranks->empty() ? "ranks " + comma_list(*ranks) + ", " : std::string()) +
                    "segment " + shm_path(name));
  }
}

// Throws ConfigError when a live job's segment cannot take this process: another shape, or full.
void check_joinable(SegmentHeader& header, const JobConfig& config, const std::string& name) {
  const auto local_size = static_cast<std::uint32_t>(config.local_size);
  const auto world_size = static_cast<std::uint32_t>(config.world_size);
  if (header.num_slots != local_size || header.world_size != world_size) {
    throw ConfigError("lockstep: the processes of node " + std::to_string(config.node_index) +
                      " disagree on the job's shape: segment " + shm_path(name) +
                      " was set up for " + shape(header.num_slots, header.world_size) +
                      ", this process (rank " + std::to_string(config.rank) + ") expects " +
                      shape(local_size, world_size));
  }
  if (header.launch != config.launch) {
    throw_other_launch(config, "pids " + comma_list(pids_of(header)));
  }
  if (header.joined.value.load() >= header.num_slots) {
    throw ConfigError("lockstep: a job with identity '" + config.identity +
                      "' is already running on this node (pids " + comma_list(pids_of(header)) +
                      "): give this job its own LOCKSTEP_JOB_ID or MASTER_PORT");
  }
}

}  // namespace

std::string segment_prefix(const std::string& identity) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a, 64-bit
  for (unsigned char c : identity) {
    hash = (hash ^ c) * 0x100000001b3ULL;
  }
  char hex[17];
  (void)std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return "lockstep-u" + std::to_string(::geteuid()) + "-" + hex + "-";
}

std::string segment_name(const std::string& identity, int node_index, std::uint64_t launch) {
  std::string name = segment_prefix(identity);
  if (launch != 0) {
    char hex[17];
    (void)std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(launch));
    name += std::string(hex) + "-";
  }
  return name + "n" + std::to_string(node_index);
}

std::vector<std::string> segments_of(const std::string& identity, int node_index) {
  const std::string prefix = segment_prefix(identity);
  const std::string suffix = "n" + std::to_string(node_index);
  std::vector<std::string> names;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* entry = ::readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): private DIR
      const std::string_view name = entry->d_name;
      // "<prefix>n<node>" or "<prefix><16 hex digits>-n<node>".
      if (name.starts_with(prefix) && name.ends_with(suffix) &&
          (name.size() == prefix.size() + suffix.size() ||
           name.size() == prefix.size() + 17 + suffix.size())) {
        names.emplace_back(name);
      }
    }
    ::closedir(dir);
  }
  return names;
}

bool remove_abandoned_segment(const std::string& name, bool other_versions) {
  std::optional<bip::shared_memory_object> shm;
  try {
    shm.emplace(bip::open_only, name.c_str(), bip::read_write);
  } catch (const bip::interprocess_exception&) {
    return false;  // absent, or not ours to open
  }
  const int fd = shm->get_mapping_handle().handle;
  FileLock lock(fd, std::try_to_lock);
  struct stat st {};
  if (!lock.held() || !still_named(fd, name, st) || !made_by_us(st)) {
    // In use this moment (a process joins or leaves), replaced, or not one lockstep made (it
    // makes them owner-only regular files): never removed.
    return false;
  }
  Prefix prefix;
  switch (peek(fd, static_cast<std::size_t>(st.st_size), prefix)) {
    case Peek::ours: {
      // Reserved in full by its creator before it was laid out: mapping it cannot fault.
      bip::mapped_region region(*shm, bip::read_write);
      auto* header = static_cast<SegmentHeader*>(region.get_address());
      if (header->pid_namespace != pid_namespace() ||
          any_peer_alive(slots_of(header), static_cast<int>(header->num_slots), -1)) {
        return false;
      }
      break;
    }
    case Peek::torn:
      break;  // its creator died holding the lock that this process holds now
    case Peek::other_version:
      // Another lockstep's layout: only nobody mapping it says that its job is over.
      if (!other_versions || process_mapping(shm_path(name), st.st_ino)) {
        return false;
      }
      break;
  }
  return bip::shared_memory_object::remove(name.c_str());
}

std::optional<std::vector<int>> joined_ranks(const std::string& name) {
  // O_NONBLOCK: a FIFO that another user put at the name must not block the launcher.
  const int fd = ::open(shm_path(name).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    return std::nullopt;
  }
  struct stat st {};
  Prefix prefix;
  std::optional<std::vector<int>> ranks;
  if (::fstat(fd, &st) == 0 && made_by_us(st) &&
      peek(fd, static_cast<std::size_t>(st.st_size), prefix) == Peek::ours) {
    ranks.emplace();
    for (std::uint32_t i = 0; i < prefix.num_slots; ++i) {
      alignas(Slot) std::array<unsigned char, sizeof(Slot)> bytes{};
      const auto at = static_cast<off_t>(sizeof(SegmentHeader) + i * sizeof(Slot));
      if (::pread(fd, bytes.data(), bytes.size(), at) != static_cast<ssize_t>(bytes.size())) {
        break;
      }
      std::uint32_t status = 0;
      std::int32_t rank = -1;
      std::memcpy(&status, bytes.data() + offsetof(Slot, status), sizeof status);
      std::memcpy(&rank, bytes.data() + offsetof(Slot, rank), sizeof rank);
      if (status != static_cast<std::uint32_t>(SlotStatus::empty)) {
        ranks->push_back(rank);
      }
    }
  }
  ::close(fd);
  return ranks;
}

std::vector<std::string> sweep_abandoned_segments(bool other_versions) {
  const std::string mine = "lockstep-u" + std::to_string(::geteuid()) + "-";
  std::vector<std::string> names;
  if (DIR* dir = ::opendir("/dev/shm")) {
    // Bounded: a sweep looks at no more than this many of the user's segments.
    constexpr std::size_t kMaxLooked = 256;
    while (const dirent* entry = ::readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): private DIR
      if (std::strncmp(entry->d_name, mine.c_str(), mine.size()) == 0) {
        names.emplace_back(entry->d_name);
        if (names.size() == kMaxLooked) {
          break;
        }
      }
    }
    ::closedir(dir);
  }
  std::vector<std::string> removed;
  for (const auto& name : names) {
    try {
      if (remove_abandoned_segment(name, other_versions)) {
        removed.push_back(name);
      }
    } catch (const std::exception&) {
      // (flock failing, out of memory) a sweep is best effort: this one stays for the next
    }
  }
  return removed;
}

std::unique_ptr<NodeSegment> NodeSegment::join(const JobConfig& config) {
  const auto deadline = Clock::now() + config.join_timeout;
  if (config.identity.size() > kMaxIdentity) {
    throw ConfigError("lockstep: the job identity is longer than " + std::to_string(kMaxIdentity) +
                      " characters: " + config.identity.substr(0, 64) + "...");
  }
  // Jobs that were killed (their launcher too) leave segments that nobody would reclaim: the
  // first State of every process removes this user's abandoned ones (bounded, best effort).
  (void)sweep_abandoned_segments();
  std::unique_ptr<NodeSegment> segment(new NodeSegment);
  segment->name_ = segment_name(config.identity, config.node_index, config.launch);
  refuse_other_launches(config, segment->name_);
  while (!segment->attach(config, deadline)) {
    check_interrupt("lockstep: joining the job (attaching " + shm_path(segment->name_) + ")");
    if (Clock::now() > deadline) {
      throw TimeoutError("lockstep: could not attach shared-memory segment " +
                             shm_path(segment->name_) + " before the join timeout",
                         {});
    }
  }
  try {
    segment->await_peers(config, deadline);
    segment->elect(config);
    fault_point("join.joined");
  } catch (...) {
    segment.reset();  // leaves: the peers see this slot as gone
    throw;
  }
  return segment;
}

bool NodeSegment::attach(const JobConfig& config, Clock::time_point deadline) {
  const std::string& name = name_;
  std::optional<bip::shared_memory_object> shm = open_segment(name);
  if (!shm) {
    return false;  // removed between create and open: try again
  }
  const int fd = shm->get_mapping_handle().handle;
  FileLock lock(fd, deadline, name);
  fault_point("join.locked");
  struct stat st {};
  if (!still_named(fd, name, st)) {
    return false;  // replaced or removed while we waited for the lock
  }
  check_owner(st, name);
  std::optional<bip::mapped_region> region;
  SegmentHeader* header = nullptr;
  if (st.st_size == 0) {
    // First to hold the lock. A creator that died before this point left an empty file, which
    // is laid out the same way.
    header = lay_out(*shm, fd, config, region);
  } else {
    header = open_laid_out(*shm, st, config, region);
    if (header == nullptr) {
      return false;  // it was removed (torn, or an ended job's): start again
    }
  }
  my_slot_ = claim_slot(*header, config);
  fault_point("join.claimed");
  fd_ = fd;
  header_ = header;
  slots_ = slots_of(header);
  num_slots_ = static_cast<int>(header->num_slots);
  gpu_slots_ = reinterpret_cast<GpuSlot*>(slots_ + num_slots_);
  gpu_area_ = reinterpret_cast<unsigned char*>(header) + gpu_area_offset(header->num_slots);
  shm_ = std::move(shm);
  region_ = std::move(region);
  return true;
}

SegmentHeader* NodeSegment::lay_out(bip::shared_memory_object& shm, int fd, const JobConfig& config,
                                    std::optional<bip::mapped_region>& region) const {
  const auto local_size = static_cast<std::uint32_t>(config.local_size);
  const std::size_t bytes = segment_size(local_size);
  try {
    shm.truncate(static_cast<bip::offset_t>(bytes));
    reserve(fd, bytes, name_);
  } catch (...) {
    bip::shared_memory_object::remove(name_.c_str());  // nothing is left behind
    throw;
  }
  region.emplace(shm, bip::read_write);
  auto* header = new (region->get_address()) SegmentHeader{};
  header->layout_version = kLayoutVersion;
  header->num_slots = local_size;
  header->world_size = static_cast<std::uint32_t>(config.world_size);
  header->identity_length = static_cast<std::uint32_t>(config.identity.size());
  std::memcpy(header->identity, config.identity.data(), config.identity.size());
  header->launch = config.launch;
  header->pid_namespace = pid_namespace();
  new (header + 1) Slot[local_size]{};
  new (reinterpret_cast<Slot*>(header + 1) + local_size) GpuSlot[local_size]{};
  auto* area = reinterpret_cast<unsigned char*>(header) + gpu_area_offset(local_size);
  new (new (area) GpuAreaHeader{} + 1) GpuFlag[local_size]{};
  header->magic = kSegmentMagic;  // last: a reader that sees it sees a whole layout
  return header;
}

SegmentHeader* NodeSegment::open_laid_out(bip::shared_memory_object& shm, const struct stat& st,
                                          const JobConfig& config,
                                          std::optional<bip::mapped_region>& region) const {
  Prefix prefix;
  const Peek kind =
      peek(shm.get_mapping_handle().handle, static_cast<std::size_t>(st.st_size), prefix);
  if (kind == Peek::other_version) {
    if (auto user = process_mapping(shm_path(name_), st.st_ino)) {
      throw ConfigError("lockstep: shared-memory segment " + shm_path(name_) + " is in use (pid " +
                        std::to_string(*user) +
                        ") by a process of another lockstep version: its layout version is " +
                        std::to_string(prefix.layout_version) + ", this process's (lockstep " +
                        LOCKSTEP_VERSION_STRING + ") is " + std::to_string(kLayoutVersion) +
                        ": every process of a job must use the same lockstep build");
    }
  }
  if (kind != Peek::ours) {
    bip::shared_memory_object::remove(name_.c_str());  // torn, or an ended job's
    return nullptr;
  }
  // Reserved in full by its creator before it was laid out: mapping it cannot fault.
  region.emplace(shm, bip::read_write);
  auto* header = static_cast<SegmentHeader*>(region->get_address());
  check_identity(*header, config, name_);
  if (job_ended(*header)) {
    region.reset();
    bip::shared_memory_object::remove(name_.c_str());
    return nullptr;
  }
  check_joinable(*header, config, name_);
  return header;
}

int NodeSegment::claim_slot(SegmentHeader& header, const JobConfig& config) {
  Slot* slots = slots_of(&header);
  int mine = config.local_rank;
  if (mine >= 0) {
    if (status_of(slots[mine]) != SlotStatus::empty) {
      throw ConfigError("lockstep: local process " + std::to_string(mine) + " of job '" +
                        config.identity + "' has already joined (pid " +
                        std::to_string(slots[mine].pid.load()) +
                        "): two processes were given the same local rank");
    }
  } else {
    // Local-main election: the ticket is the first free slot; the local index is decided by
    // rank once every process has joined.
    mine = 0;
    while (status_of(slots[mine]) != SlotStatus::empty) {
      ++mine;
    }
  }
  Slot& slot = slots[mine];
  const pid_t pid = ::getpid();
  slot.pid.store(pid);
  slot.rank.store(config.rank);
  slot.start_time.store(process_start_time(pid).value_or(0));
  slot.local_rank.store(config.local_rank);
  slot.arrived.store(0);
  slot.cpu.store(-1);
  slot.asleep_until.store(0);
  slot.withdrawn_at.store(0);
  slot.status.store(static_cast<std::uint32_t>(SlotStatus::joined));  // last: see status_of
  header.joined.value.fetch_add(1);
  futex_wake_all(header.joined.value);
  return mine;
}

// The node's rendezvous as a place to wait (waiting/waiter.hpp): done when every process of the
// node has claimed its slot; the check names a peer that died meanwhile.
class NodeSegment::JoinSite : public WaitSite {
 public:
  explicit JoinSite(NodeSegment& segment) noexcept
      : segment_(segment), local_size_(static_cast<std::uint32_t>(segment.num_slots_)) {}
  [[nodiscard]] bool done() const noexcept { return joined() >= local_size_; }
  void block(std::chrono::nanoseconds limit) noexcept {
    // futex_wait sleeps only while the count is still the one read here: a join after the read
    // changes it, and the call returns at once.
    const std::uint32_t seen = joined();
    if (seen < local_size_) {
      futex_wait(segment_.header_->joined.value, seen, limit);
    }
  }
  // Throws PeerLostError for a peer that died (or left) before the node had joined; true when
  // everyone joined after all.
  [[nodiscard]] bool check() { return segment_.check_joining(local_size_); }
  void stalled(std::chrono::nanoseconds waited) const noexcept {
    std::vector<int> missing;
    try {
      for (int slot = 0; slot < segment_.num_slots_; ++slot) {
        if (status_of(segment_.slots_[slot]) == SlotStatus::empty) {
          missing.push_back(slot);
        }
      }
    } catch (...) {
      return;
    }
    segment_.report_stall("joining the job", waited, {},
                          std::to_string(missing.size()) + " of the node's " +
                              std::to_string(segment_.num_slots_) + " processes to start (" +
                              std::to_string(joined()) + " have joined)");
  }

 private:
  [[nodiscard]] std::uint32_t joined() const noexcept {
    return segment_.header_->joined.value.load(std::memory_order_acquire);
  }
  NodeSegment& segment_;
  std::uint32_t local_size_;
};

bool NodeSegment::check_joining(std::uint32_t local_size) {
  auto lost = recorded_lost();
  if (!lost) {
    // A peer that left while joining gave up (its own join timed out a moment before ours, or
    // it saw a dead peer): only the dead count here, and the timeout names the processes that
    // never came.
    lost = find_lost([&](int slot) { return status_of(slots_[slot]) != SlotStatus::joined; });
  }
  if (!lost) {
    return false;
  }
  if (header_->joined.value.load(std::memory_order_acquire) >= local_size) {
    return true;  // everyone joined meanwhile; the peer finished joining, then left or died
  }
  lost = mark_lost(*lost);
  throw PeerLostError("lockstep: joining the job: " + describe(lost->slot) + " " +
                          lockstep::detail::describe(lost->how) +
                          " while the node's processes joined",
                      slots_[lost->slot].rank.load());
}

void NodeSegment::await_peers(const JobConfig& config, Clock::time_point deadline) {
  // Rendezvous: every process of the node must claim its slot before anyone proceeds. Joining
  // waits for processes that are still starting (milliseconds to seconds): it blocks at once.
  JoinSite site(*this);
  Waiter waiter(WaitPolicy::block, WaitShape{num_slots_, 1});
  switch (waiter.wait(site, deadline, kPollInterval)) {
    case Waiter::End::done:
      return;
    case Waiter::End::timed_out:
      throw_join_timeout(config, header_->joined.value.load(std::memory_order_acquire));
    case Waiter::End::interrupted:
      break;
  }
  throw InterruptedError(
      "lockstep: joining the job (waiting for the node's processes): interrupted by a signal");
}

void NodeSegment::throw_join_timeout(const JobConfig& config, std::uint32_t joined) const {
  std::vector<int> missing;  // local indices
  for (int i = 0; i < num_slots_; ++i) {
    if (status_of(slots_[i]) == SlotStatus::empty) {
      missing.push_back(i);
    }
  }
  // Their process indices, where the job places ranks by node (the launcher's, torchrun's
  // layout: rank = node * local size + local rank); else unknown, and missing() is empty.
  std::vector<int> missing_ranks;
  const int first = config.rank - config.local_rank;
  if (config.local_rank >= 0 && config.world_size == config.num_nodes * config.local_size &&
      first == config.node_index * config.local_size) {
    for (int slot : missing) {
      missing_ranks.push_back(first + slot);
    }
  }
  char waited[32];
  (void)std::snprintf(waited, sizeof waited, "%g",
                      std::chrono::duration<double>(config.join_timeout).count());
  const std::string who = config.local_rank >= 0
                              ? "local processes " + comma_list(missing) + " of node " +
                                    std::to_string(config.node_index) + " never joined"
                              : std::to_string(missing.size()) + " of the node's " +
                                    std::to_string(num_slots_) + " processes never joined";
  throw TimeoutError("lockstep: joining the job timed out after " + std::string(waited) +
                         " s (LOCKSTEP_JOIN_TIMEOUT): " + who + " (" + std::to_string(joined) +
                         " of " + std::to_string(num_slots_) + " have)",
                     std::move(missing_ranks));
}

void NodeSegment::elect(const JobConfig& config) {
  // The local index: the given local rank, or this process's rank order among the node's.
  const int my_rank = slots_[my_slot_].rank.load();
  int below = 0;
  for (int i = 0; i < num_slots_; ++i) {
    const int rank = slots_[i].rank.load();
    if (i != my_slot_ && rank == my_rank) {
      throw ConfigError("lockstep: two processes of node " + std::to_string(config.node_index) +
                        " (pids " + std::to_string(slots_[i].pid.load()) + " and " +
                        std::to_string(::getpid()) + ") both have rank " + std::to_string(my_rank));
    }
    below += rank < my_rank ? 1 : 0;
  }
  local_index_ = config.local_rank >= 0 ? config.local_rank : below;
  // The leader (local index 0): local rank 0 where local ranks were given, else the lowest rank.
  int leader = 0;
  for (int i = 0; i < num_slots_; ++i) {
    if (slots_[i].local_rank.load() == 0 ||
        (slots_[i].local_rank.load() < 0 && slots_[i].rank.load() < slots_[leader].rank.load())) {
      leader = i;
    }
  }
  leader_slot_ = leader;
}

NodeSegment::~NodeSegment() {
  leave();
}

void NodeSegment::abandon() noexcept {
  region_.reset();
  shm_.reset();
  header_ = nullptr;
  slots_ = nullptr;
  fd_ = -1;
}

void NodeSegment::leave() noexcept {
  leave_mapped();
  abandon();
}

void NodeSegment::leave_mapped() noexcept {
  if (header_ == nullptr || left_) {
    return;
  }
  left_ = true;
  // The lock orders leaving with joining; a process stopped while it holds it must not keep
  // this one from exiting: then it leaves without it, and a later sweep removes the segment.
  std::optional<FileLock> lock;
  try {
    lock.emplace(fd_, Clock::now() + kLeaveLockBound, name_);
  } catch (...) {
  }
  slots_[my_slot_].status.store(static_cast<std::uint32_t>(SlotStatus::left));
  header_->left.value.fetch_add(1);
  wake_waiters();
  fault_point("leave.marked");
  struct stat st {};
  if (lock && !any_peer_alive(slots_, num_slots_, my_slot_) && still_named(fd_, name_, st)) {
    try {
      bip::shared_memory_object::remove(name_.c_str());
    } catch (...) {
      // Leaving must not throw; the launcher or the next job's sweep removes what is left.
    }
  }
}

std::optional<LostPeer> NodeSegment::check_peer(int slot) const {
  const Slot& peer = slots_[slot];
  if (status_of(peer) == SlotStatus::left) {
    return LostPeer{slot, LostHow::left};
  }
  if (joined_and(peer, Liveness::dead)) {
    // It may have left (and then exited) between the two reads: its last word wins.
    return LostPeer{slot, status_of(peer) == SlotStatus::left ? LostHow::left : LostHow::died};
  }
  return std::nullopt;
}

void NodeSegment::report_stall(const char* what, std::chrono::nanoseconds waited,
                               const std::vector<int>& slots,
                               const std::string& instead) const noexcept {
  try {
    std::string whom = instead;
    if (!slots.empty()) {
      char host[256] = "this machine";
      (void)::gethostname(host, sizeof host - 1);
      whom.clear();
      for (std::size_t i = 0; i < slots.size(); ++i) {
        whom += (i == 0 ? "" : ", ") + describe(slots[i]);
      }
      whom += " on " + std::string(host);
    }
    say_stalled(slots_[my_slot_].rank.load(std::memory_order_relaxed), what, waited, whom);
  } catch (...) {
    // Out of memory for a diagnostic: the wait goes on without it.
  }
}

std::string NodeSegment::describe(int slot) const {
  const Slot& peer = slots_[slot];
  return "process " + std::to_string(peer.rank.load(std::memory_order_relaxed)) + " of " +
         std::to_string(header_->world_size) + " (pid " +
         std::to_string(peer.pid.load(std::memory_order_relaxed)) + ")";
}

LostPeer NodeSegment::mark_lost(LostPeer peer) noexcept {
  std::uint32_t seen = 0;
  // acq_rel: a waiter that reads the mark (acquire) sees the slot fields it names.
  if (!header_->lost.value.compare_exchange_strong(seen, lost_word(peer.slot, peer.how),
                                                   std::memory_order_acq_rel)) {
    peer = LostPeer{lost_slot(seen), lost_how(seen)};
  }
  wake_waiters();
  return peer;
}

void NodeSegment::wake_waiters() noexcept {
  // seq_cst, after what the waiters must see (a left or lost mark, a watch's alarm): a sleeper
  // reads the word (acquire) before it looks at those, so either it reads this new value and
  // then sees the mark, or its futex_wait finds the word changed, or this wake finds it asleep.
  // Every change to the word is an increment: a sleeper never sees an old value come back.
  header_->episode.generation.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(header_->episode.generation);
  futex_wake_all(header_->joined.value);
}

std::vector<int> NodeSegment::ranks() const {
  std::vector<int> ranks;
  ranks.reserve(static_cast<std::size_t>(num_slots_));
  for (int i = 0; i < num_slots_; ++i) {
    ranks.push_back(slots_[i].rank.load(std::memory_order_relaxed));
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

void NodeSegment::record_failure(const Failure& failure) noexcept {
  if (header_->lost.value.load(std::memory_order_acquire) != 0) {
    return;  // the node already knows why it cannot go on
  }
  auto& record = header_->failure;
  std::uint32_t unclaimed = 0;
  // acq_rel: the winner alone writes the record; a loser's view of it is not needed.
  if (!record.claim.compare_exchange_strong(unclaimed, 1, std::memory_order_acq_rel)) {
    return;  // another writer's failure is being recorded: it is the node's
  }
  record.kind = static_cast<std::uint32_t>(failure.kind);
  record.rank = failure.rank;
  record.num_missing =
      static_cast<std::uint32_t>(std::min(failure.missing.size(), kMaxFailureMissing));
  std::copy_n(failure.missing.begin(), record.num_missing, record.missing);
  record.message_length =
      static_cast<std::uint32_t>(std::min(failure.message.size(), kMaxFailureMessage));
  std::memcpy(record.message, failure.message.data(), record.message_length);
  mark_lost(LostPeer{my_slot_, LostHow::elsewhere});
}

Failure NodeSegment::recorded_failure() const {
  const auto& record = header_->failure;
  Failure failure;
  failure.kind = static_cast<FailureKind>(record.kind);
  failure.rank = record.rank;
  failure.missing.assign(
      record.missing,
      record.missing + std::min<std::size_t>(record.num_missing, kMaxFailureMissing));
  failure.message.assign(record.message,
                         std::min<std::size_t>(record.message_length, kMaxFailureMessage));
  return failure;
}

std::optional<LostPeer> NodeSegment::recorded_lost() const noexcept {
  std::uint32_t word = header_->lost.value.load(std::memory_order_acquire);
  if (word == 0) {
    return std::nullopt;
  }
  return LostPeer{lost_slot(word), lost_how(word)};
}

}  // namespace lockstep::detail
