// The node segment: joining, leaving and watching the node's processes (internal).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/failure_record.hpp"
#include "base/text.hpp"
#include "engine/layout.hpp"
#include "job/job_config.hpp"  // NodeMember

namespace lockstep::detail {

// How often a waiter (joining, or in a barrier) looks at its peers' pids and the lost flag: a
// dead peer is noticed within this (the issue asks for about a second).
inline constexpr std::chrono::milliseconds kPollInterval{100};

// The POSIX shared-memory name (without the leading '/') of a job's segment on a node:
// "lockstep-u<uid>-<hash of identity>-<launch>-n<node>" ("...-<hash>-n<node>" without a launch
// id). The uid keeps users apart; the hash keeps jobs apart; the launch id (lockstep-run's 64
// random bits, in its processes' environment only) makes the name unguessable, so that another
// user cannot take it first. The full identity is stored in the segment and checked on attach.
std::string segment_name(const std::string& identity, int node_index, std::uint64_t launch = 0);
// What every segment name of `identity` begins with, whatever its launch.
std::string segment_prefix(const std::string& identity);
// The names in /dev/shm of `identity`'s segments for node `node_index`, of every launch: this
// user's owner-only regular files only (user_segments' rule).
std::vector<std::string> segments_of(const std::string& identity, int node_index);

// Removes the segment `name` if no process that joined it still runs (a job that was killed):
// never one being joined or left this moment (its lock is held), one whose processes live in
// another pid namespace, or (unless `other_versions`) one laid out by another lockstep version;
// with `other_versions`, such a one only when no process maps it. Returns true when it removed
// the segment.
bool remove_abandoned_segment(const std::string& name, bool other_versions = false);

// The ranks of the processes that have joined segment `name` (and may have left it since), read
// with pread (no mapping, no lock: a hint); empty when there is no such segment of this user and
// this layout.
std::optional<std::vector<int>> joined_ranks(const std::string& name);

// The names of this user's lockstep segments in /dev/shm (at most 256, in directory order): the
// owner-only regular files of this user whose names carry its prefix, however many other names
// (another user's, links, FIFOs) carry it too.
std::vector<std::string> user_segments();

// remove_abandoned_segment() for each of this user's lockstep segments in /dev/shm (at most 256
// looked at); returns the names removed. Every lockstep-run and every process's first State
// sweep, so that killed jobs (a launcher killed with SIGKILL) leave nothing behind for long.
std::vector<std::string> sweep_abandoned_segments(bool other_versions = false);

// A peer found gone: which slot, and a sentence on how.
struct LostPeer {
  int slot;
  LostHow how;
};

// This process's membership in its node's segment.
//
// join() creates or attaches the segment (owner-only, 0600), replaces a stale one (left by a job
// whose processes died), claims a slot, and blocks until every node-local process has claimed
// one. The destructor leaves: it marks the slot left, wakes waiters, and the last process out
// unlinks the segment.
class NodeSegment {
 public:
  static std::unique_ptr<NodeSegment> join(const NodeMember& member);
  ~NodeSegment();
  NodeSegment(const NodeSegment&) = delete;
  NodeSegment& operator=(const NodeSegment&) = delete;

  [[nodiscard]] SegmentHeader& header() const noexcept { return *header_; }
  [[nodiscard]] Slot& slot(int index) const noexcept { return slots_[index]; }
  [[nodiscard]] GpuSlot& gpu_slot(int index) const noexcept { return gpu_slots_[index]; }
  [[nodiscard]] int num_slots() const noexcept { return num_slots_; }
  // State::broadcast's area (layout.hpp).
  [[nodiscard]] BroadcastArea& broadcast_area() const noexcept {
    return *reinterpret_cast<BroadcastArea*>(reinterpret_cast<unsigned char*>(header_) +
                                             broadcast_area_offset(header_->num_slots));
  }
  // Slot `index`'s call log (layout.hpp, engine/call_log.hpp).
  [[nodiscard]] CallLog& call_log(int index) const noexcept { return call_logs()[index]; }
  // Every slot's, in slot order.
  [[nodiscard]] std::span<CallLog> call_logs() const noexcept {
    return {reinterpret_cast<CallLog*>(reinterpret_cast<unsigned char*>(header_) +
                                       call_log_offset(header_->num_slots)),
            static_cast<std::size_t>(num_slots_)};
  }
  // The GPU area (layout.hpp): page-aligned, gpu_area_size(num_slots()) bytes.
  [[nodiscard]] void* gpu_area() const noexcept { return gpu_area_; }
  [[nodiscard]] std::size_t gpu_area_bytes() const noexcept {
    return gpu_area_size(static_cast<std::uint32_t>(num_slots_));
  }
  [[nodiscard]] GpuAreaHeader& gpu_area_header() const noexcept {
    return *static_cast<GpuAreaHeader*>(gpu_area_);
  }
  [[nodiscard]] GpuFlag& gpu_flag(int index) const noexcept {
    return reinterpret_cast<GpuFlag*>(&gpu_area_header() + 1)[index];
  }
  // Whether slot `index`'s stream has passed every stream barrier its process enqueued (flags
  // mode). Acquire: written by the slot's owner (enqueued) and its stream (passed); only compared.
  [[nodiscard]] bool stream_drained(int index) const noexcept {
    return gpu_flag(index).passed.load(std::memory_order_acquire) ==
           gpu_slot(index).enqueued.load(std::memory_order_acquire);
  }
  [[nodiscard]] int my_slot() const noexcept { return my_slot_; }
  // This process's node-local index: the given LOCAL_RANK, or its rank's order on the node.
  [[nodiscard]] int local_index() const noexcept { return local_index_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  // The slot of the node's leader (local index 0), and the ranks of the node's processes.
  [[nodiscard]] int leader_slot() const noexcept { return leader_slot_; }
  [[nodiscard]] std::vector<int> ranks() const;

  // The first peer (other than this process) that is neither `arrived` nor alive, if any.
  // `arrived(slot)` says which peers have no more obligations in the current wait.
  template <class Arrived>
  [[nodiscard]] std::optional<LostPeer> find_lost(Arrived arrived) const;
  // "process 3 (pid 4121)": a slot as a user knows it.
  [[nodiscard]] std::string describe(int slot) const;
  // One stall line (waiting/wait_controls.hpp's set_stall_warning) on stderr: "<what> has waited
  // <s> s for <those slots> on <this machine><where>; still waiting" (`slots` empty: for
  // `instead`).
  void report_stall(const char* what, std::chrono::nanoseconds waited,
                    const std::vector<int>& slots, const std::string& instead,
                    const std::string& where = {}) const noexcept;
  // Marks the job on this node broken by `peer` (the first mark wins), and wakes every waiter
  // to see it. Returns the peer that the segment records.
  LostPeer mark_lost(LostPeer peer) noexcept;
  // Wakes every waiter of the node (the barrier's and the join's), after a change they must see:
  // changes the barrier's futex word, then wakes both words.
  void wake_waiters() noexcept;
  // The peer recorded by mark_lost, if any.
  [[nodiscard]] std::optional<LostPeer> recorded_lost() const noexcept;
  // The leader's record of why it gave up on a cross-node barrier: the node's other processes
  // throw it (marks this slot lost `elsewhere`, unless a loss is already recorded).
  void record_failure(const Failure& failure) noexcept;
  // What record_failure stored; only after recorded_lost() returned LostHow::elsewhere.
  [[nodiscard]] Failure recorded_failure() const;
  // Called in a forked child: forget the segment without leaving (the parent still owns it).
  void abandon() noexcept;
  // Leaves the job (as the destructor does) but keeps the segment mapped: for a process that
  // exits while another of its threads still waits in the barrier. Idempotent.
  void leave_mapped() noexcept;

 private:
  using Clock = std::chrono::steady_clock;
  NodeSegment() = default;
  // join()'s steps. attach: opens or creates the segment under its lock (replacing an ended
  // job's, laying out a new one) and claims a slot; false when it must start again.
  bool attach(const NodeMember& member, Clock::time_point deadline);
  SegmentHeader* lay_out(boost::interprocess::shared_memory_object& shm, int fd,
                         const NodeMember& member,
                         std::optional<boost::interprocess::mapped_region>& region) const;
  // The laid-out segment, checked as this job's and joinable; null when it was removed.
  SegmentHeader* open_laid_out(boost::interprocess::shared_memory_object& shm,
                               const struct stat& st, const NodeMember& member,
                               std::optional<boost::interprocess::mapped_region>& region) const;
  static int claim_slot(SegmentHeader& header, const NodeMember& member);
  // Waits until every process of the node has claimed its slot.
  void await_peers(const NodeMember& member, Clock::time_point deadline);
  class JoinSite;  // the rendezvous as a Waiter's site (segment.cpp)
  // The join's check: PeerLostError for a peer lost before the node joined; true when every
  // process joined after all.
  bool check_joining(std::uint32_t local_size);
  [[noreturn]] void throw_join_timeout(const NodeMember& member, std::uint32_t joined) const;
  // The local index and the node's leader.
  void elect(const NodeMember& member);
  void leave() noexcept;
  // After an interrupted join, which the caller may make again: under the segment's lock, while
  // the node's processes have not all joined, this slot is given back (empty, as if this process
  // had not come yet: its peers go on waiting for it, and a second join claims a slot again)
  // and the segment is removed if nobody else is in it; true. False when every process has
  // joined meanwhile (the join is complete and goes on) or the lock is not had within a bound.
  bool withdraw_join() noexcept;
  // With the segment's lock held: removes the segment's name when no other process of the node
  // is alive in it (leaving, withdrawing a join). Never throws.
  void remove_if_alone() noexcept;
  [[nodiscard]] std::optional<LostPeer> check_peer(int slot) const;

  std::string name_;
  std::optional<boost::interprocess::shared_memory_object> shm_;
  std::optional<boost::interprocess::mapped_region> region_;
  int fd_ = -1;  // shm_'s descriptor, for flock
  SegmentHeader* header_ = nullptr;
  Slot* slots_ = nullptr;
  GpuSlot* gpu_slots_ = nullptr;
  void* gpu_area_ = nullptr;
  int num_slots_ = 0;
  int my_slot_ = -1;
  int local_index_ = -1;
  int leader_slot_ = 0;
  bool left_ = false;
};

template <class Arrived>
std::optional<LostPeer> NodeSegment::find_lost(Arrived arrived) const {
  for (int slot = 0; slot < num_slots_; ++slot) {
    if (slot != my_slot_ && !arrived(slot)) {
      if (auto lost = check_peer(slot)) {
        return lost;
      }
    }
  }
  return std::nullopt;
}

}  // namespace lockstep::detail
