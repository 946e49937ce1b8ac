// The segments' names and what a job leaves behind: the names of a job's segments, the removal
// of abandoned ones and the sweep (segment.hpp).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "base/proc.hpp"
#include "base/text.hpp"
#include "base/unique_fd.hpp"
#include "engine/segment.hpp"
#include "engine/segment_file.hpp"
#include "engine/spill.hpp"

namespace bip = boost::interprocess;

namespace lockstep::detail {

namespace {

// "lockstep-u<euid>-": what every name this user's lockstep puts in /dev/shm begins with.
std::string user_prefix() {
  return "lockstep-u" + std::to_string(::geteuid()) + "-";
}

// Whether `entry` of the open directory `dir` is a file this user's lockstep could have made (an
// owner-only regular file of this user), looked at without following a link: /dev/shm is
// everyone's, and names with this user's prefix may be anyone's.
bool ours_in(DIR* dir, const dirent& entry) {
  struct stat st {};
  return ::fstatat(::dirfd(dir), entry.d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && made_by_us(st);
}

}  // namespace

std::string segment_prefix(const std::string& identity) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a, 64-bit
  for (unsigned char c : identity) {
    hash = (hash ^ c) * 0x100000001b3ULL;
  }
  char hex[17];
  (void)std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return user_prefix() + hex + "-";
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
  const std::string suffix = 'n' + std::to_string(node_index);  // a char: see comma_list
  std::vector<std::string> names;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* entry = ::readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): private DIR
      const std::string_view name = entry->d_name;
      // "<prefix>n<node>" or "<prefix><16 hex digits>-n<node>".
      if (name.starts_with(prefix) && name.ends_with(suffix) &&
          (name.size() == prefix.size() + suffix.size() ||
           name.size() == prefix.size() + 17 + suffix.size()) &&
          ours_in(dir, *entry)) {
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
  const bool removed = bip::shared_memory_object::remove(name.c_str());
  if (removed) {
    remove_spills(name);
  }
  return removed;
}

std::optional<std::vector<int>> joined_ranks(const std::string& name) {
  // O_NONBLOCK: a FIFO that another user put at the name must not block the launcher.
  const UniqueFd owned(
      ::open(shm_path(name).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!owned) {
    return std::nullopt;
  }
  const int fd = owned.get();
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
  return ranks;
}

std::vector<std::string> user_segments() {
  const std::string mine = user_prefix();
  std::vector<std::string> names;
  if (DIR* dir = ::opendir("/dev/shm")) {
    // Bounded: a sweep or a status looks at no more than this many of the user's segments (only
    // the user's own count: names that others put there cannot hide them).
    constexpr std::size_t kMaxLooked = 256;
    while (const dirent* entry = ::readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): private DIR
      if (std::strncmp(entry->d_name, mine.c_str(), mine.size()) == 0 && !is_spill(entry->d_name) &&
          ours_in(dir, *entry)) {
        names.emplace_back(entry->d_name);
        if (names.size() == kMaxLooked) {
          break;
        }
      }
    }
    ::closedir(dir);
  }
  return names;
}

std::vector<std::string> sweep_abandoned_segments(bool other_versions) {
  std::vector<std::string> removed;
  for (const auto& name : user_segments()) {
    try {
      if (remove_abandoned_segment(name, other_versions)) {
        removed.push_back(name);
      }
    } catch (const std::exception&) {
      // (flock failing, out of memory) a sweep is best effort: this one stays for the next
    }
  }
  for (auto& name : remove_orphan_spills(user_prefix())) {
    removed.push_back(std::move(name));
  }
  return removed;
}

}  // namespace lockstep::detail
