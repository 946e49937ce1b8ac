// The node segment: creating, opening and joining it (segment.hpp). The segment as a file is
// segment_file.cpp, its names and leftovers segment_names.cpp, its members watched
// segment_watch.cpp.
#include "engine/segment.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>

#include "base/fault_points.hpp"
#include "base/proc.hpp"
#include "engine/segment_file.hpp"
#include "engine/spill.hpp"
#include "lockstep/error.hpp"
#include "lockstep/version.hpp"
#include "waiting/futex.hpp"
#include "waiting/waiter.hpp"

namespace bip = boost::interprocess;

namespace lockstep::detail {
namespace {

using Clock = std::chrono::steady_clock;

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

void check_identity(const SegmentHeader& header, const NodeMember& member,
                    const std::string& name) {
  std::string_view theirs(header.identity,
                          std::min<std::size_t>(header.identity_length, kMaxIdentity));
  if (theirs != member.identity) {
    throw ConfigError("lockstep: shared-memory segment " + shm_path(name) + " belongs to job '" +
                      std::string(theirs) + "', not to '" + member.identity +
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
[[noreturn]] void throw_other_launch(const NodeMember& member, const std::string& who) {
  throw ConfigError("lockstep: a job with identity '" + member.identity +
                    "' started by another launch is already running on this node (" + who +
                    "): two launches were given the same --job-id (LOCKSTEP_JOB_ID); give each "
                    "its own (without one, lockstep-run picks a unique one)");
}

// Two launches given one job id: the second one's processes are refused while the first's
// segment is there (the sweep just removed it if its processes are gone). Each launch has a name
// of its own, so they could not meet anyway; this says why the second cannot form.
void refuse_other_launches(const NodeMember& member, const std::string& mine) {
  // (Only this user's files are listed: another user's says nothing about this user's launches.)
  for (const auto& name : segments_of(member.identity, member.node_index)) {
    if (name == mine) {
      continue;
    }
    const auto ranks = joined_ranks(name);
    throw_other_launch(
        member, (ranks && !ranks->empty() ? "ranks " + comma_list(*ranks) + ", " : std::string()) +
                    "segment " + shm_path(name));
  }
}

// Throws ConfigError when a live job's segment cannot take this process: another shape, or full.
void check_joinable(SegmentHeader& header, const NodeMember& member, const std::string& name) {
  const auto local_size = static_cast<std::uint32_t>(member.local_size);
  const auto world_size = static_cast<std::uint32_t>(member.world_size);
  if (header.num_slots != local_size || header.world_size != world_size) {
    throw ConfigError("lockstep: the processes of node " + std::to_string(member.node_index) +
                      " disagree on the job's shape: segment " + shm_path(name) +
                      " was set up for " + shape(header.num_slots, header.world_size) +
                      ", this process (rank " + std::to_string(member.rank) + ") expects " +
                      shape(local_size, world_size));
  }
  if (header.launch != member.launch) {
    throw_other_launch(member, "pids " + comma_list(pids_of(header)));
  }
  if (header.joined.value.load() >= header.num_slots) {
    throw ConfigError("lockstep: a job with identity '" + member.identity +
                      "' is already running on this node (pids " + comma_list(pids_of(header)) +
                      "): give this job its own LOCKSTEP_JOB_ID or MASTER_PORT");
  }
}

}  // namespace

std::unique_ptr<NodeSegment> NodeSegment::join(const NodeMember& member) {
  const auto deadline = Clock::now() + member.join_timeout;
  if (member.identity.size() > kMaxIdentity) {
    throw ConfigError("lockstep: the job identity is longer than " + std::to_string(kMaxIdentity) +
                      " characters: " + member.identity.substr(0, 64) + "...");
  }
  // Jobs that were killed (their launcher too) leave segments that nobody would reclaim: the
  // first State of every process removes this user's abandoned ones (bounded, best effort).
  (void)sweep_abandoned_segments();
  std::unique_ptr<NodeSegment> segment(new NodeSegment);
  segment->name_ = segment_name(member.identity, member.node_index, member.launch);
  refuse_other_launches(member, segment->name_);
  while (!segment->attach(member, deadline)) {
    check_interrupt("lockstep: joining the job (attaching " + shm_path(segment->name_) + ")");
    if (Clock::now() > deadline) {
      throw TimeoutError("lockstep: could not attach shared-memory segment " +
                             shm_path(segment->name_) + " before the join timeout",
                         {});
    }
  }
  try {
    try {
      segment->await_peers(member, deadline);
    } catch (const InterruptedError&) {
      // The caller may join again (Python does, after a signal handler that returns): its slot
      // is given back rather than left, which would end the job for every peer.
      if (segment->withdraw_join()) {
        throw;
      }
      // Every process had joined meanwhile: the join is complete, and goes on.
    }
    segment->elect(member);
    fault_point("join.joined");
  } catch (...) {
    segment.reset();  // leaves: the peers see this slot as gone
    throw;
  }
  return segment;
}

bool NodeSegment::attach(const NodeMember& member, Clock::time_point deadline) {
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
    header = lay_out(*shm, fd, member, region);
  } else {
    header = open_laid_out(*shm, st, member, region);
    if (header == nullptr) {
      return false;  // it was removed (torn, or an ended job's): start again
    }
  }
  my_slot_ = claim_slot(*header, member);
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

SegmentHeader* NodeSegment::lay_out(bip::shared_memory_object& shm, int fd,
                                    const NodeMember& member,
                                    std::optional<bip::mapped_region>& region) const {
  const auto local_size = static_cast<std::uint32_t>(member.local_size);
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
  header->world_size = static_cast<std::uint32_t>(member.world_size);
  header->identity_length = static_cast<std::uint32_t>(member.identity.size());
  std::memcpy(header->identity, member.identity.data(), member.identity.size());
  header->launch = member.launch;
  header->pid_namespace = pid_namespace();
  new (header + 1) Slot[local_size]{};
  new (reinterpret_cast<Slot*>(header + 1) + local_size) GpuSlot[local_size]{};
  auto* area = reinterpret_cast<unsigned char*>(header) + gpu_area_offset(local_size);
  new (new (area) GpuAreaHeader{} + 1) GpuFlag[local_size]{};
  header->magic = kSegmentMagic;  // last: a reader that sees it sees a whole layout
  return header;
}

SegmentHeader* NodeSegment::open_laid_out(bip::shared_memory_object& shm, const struct stat& st,
                                          const NodeMember& member,
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
    remove_spills(name_);
    return nullptr;
  }
  // Reserved in full by its creator before it was laid out: mapping it cannot fault.
  region.emplace(shm, bip::read_write);
  auto* header = static_cast<SegmentHeader*>(region->get_address());
  check_identity(*header, member, name_);
  if (job_ended(*header)) {
    region.reset();
    bip::shared_memory_object::remove(name_.c_str());
    remove_spills(name_);
    return nullptr;
  }
  check_joinable(*header, member, name_);
  return header;
}

int NodeSegment::claim_slot(SegmentHeader& header, const NodeMember& member) {
  Slot* slots = slots_of(&header);
  int mine = member.local_rank;
  if (mine >= 0) {
    if (status_of(slots[mine]) != SlotStatus::empty) {
      throw ConfigError("lockstep: local process " + std::to_string(mine) + " of job '" +
                        member.identity + "' has already joined (pid " +
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
  slot.rank.store(member.rank);
  slot.start_time.store(process_start_time(pid).value_or(0));
  slot.local_rank.store(member.local_rank);
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

void NodeSegment::await_peers(const NodeMember& member, Clock::time_point deadline) {
  // Rendezvous: every process of the node must claim its slot before anyone proceeds. Joining
  // waits for processes that are still starting (milliseconds to seconds): it blocks at once.
  JoinSite site(*this);
  Waiter waiter(WaitPolicy::block, WaitShape{num_slots_, 1});
  switch (waiter.wait(site, deadline, kPollInterval)) {
    case Waiter::End::done:
      return;
    case Waiter::End::timed_out:
      throw_join_timeout(member, header_->joined.value.load(std::memory_order_acquire));
    case Waiter::End::interrupted:
      break;
  }
  throw InterruptedError(
      "lockstep: joining the job (waiting for the node's processes): interrupted by a signal");
}

void NodeSegment::throw_join_timeout(const NodeMember& member, std::uint32_t joined) const {
  std::vector<int> missing;  // local indices
  for (int i = 0; i < num_slots_; ++i) {
    if (status_of(slots_[i]) == SlotStatus::empty) {
      missing.push_back(i);
    }
  }
  // Their process indices, where the job places ranks by node (the launcher's, torchrun's
  // layout: rank = node * local size + local rank); else unknown, and missing() is empty.
  std::vector<int> missing_ranks;
  const int first = member.rank - member.local_rank;
  if (member.local_rank >= 0 && member.world_size == member.num_nodes * member.local_size &&
      first == member.node_index * member.local_size) {
    for (int slot : missing) {
      missing_ranks.push_back(first + slot);
    }
  }
  const std::string who = member.local_rank >= 0
                              ? "local processes " + comma_list(missing) + " of node " +
                                    std::to_string(member.node_index) + " never joined"
                              : std::to_string(missing.size()) + " of the node's " +
                                    std::to_string(num_slots_) + " processes never joined";
  throw TimeoutError("lockstep: joining the job timed out after " +
                         seconds_text(std::chrono::duration<double>(member.join_timeout).count()) +
                         " s (LOCKSTEP_JOIN_TIMEOUT): " + who + " (" + std::to_string(joined) +
                         " of " + std::to_string(num_slots_) + " have)",
                     std::move(missing_ranks));
}

void NodeSegment::elect(const NodeMember& member) {
  // The local index: the given local rank, or this process's rank order among the node's.
  const int my_rank = slots_[my_slot_].rank.load();
  int below = 0;
  for (int i = 0; i < num_slots_; ++i) {
    const int rank = slots_[i].rank.load();
    if (i != my_slot_ && rank == my_rank) {
      throw ConfigError("lockstep: two processes of node " + std::to_string(member.node_index) +
                        " (pids " + std::to_string(slots_[i].pid.load()) + " and " +
                        std::to_string(::getpid()) + ") both have rank " + std::to_string(my_rank));
    }
    below += rank < my_rank ? 1 : 0;
  }
  local_index_ = member.local_rank >= 0 ? member.local_rank : below;
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

}  // namespace lockstep::detail
