// The node segment's members, watched: leaving, a peer found lost, the stall line, the failure
// record (segment.hpp).
#include <sys/stat.h>

#include <boost/interprocess/shared_memory_object.hpp>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "base/fault_points.hpp"
#include "base/proc.hpp"
#include "engine/segment.hpp"
#include "engine/segment_file.hpp"
#include "engine/spill.hpp"
#include "lockstep/error.hpp"
#include "waiting/futex.hpp"
#include "waiting/wait_controls.hpp"  // say_stalled

namespace bip = boost::interprocess;

namespace lockstep::detail {
namespace {

// How long a leaving process waits for the segment's lock.
constexpr auto kLeaveLockBound = std::chrono::seconds(1);

}  // namespace

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
  if (lock) {
    remove_if_alone();
  }
}

void NodeSegment::remove_if_alone() noexcept {
  struct stat st {};
  if (!any_peer_alive(slots_, num_slots_, my_slot_) && still_named(fd_, name_, st)) {
    try {
      bip::shared_memory_object::remove(name_.c_str());
      remove_spills(name_);
    } catch (...) {
      // Leaving must not throw; the launcher or the next job's sweep removes what is left.
    }
  }
}

bool NodeSegment::withdraw_join() noexcept {
  if (header_ == nullptr || left_) {
    return false;
  }
  std::optional<FileLock> lock;
  try {
    lock.emplace(fd_, Clock::now() + kLeaveLockBound, name_);
  } catch (...) {
    return false;  // leaves instead (the destructor): its peers then fail their join
  }
  // Claims are made under the lock: no peer has seen every process joined unless all were.
  if (header_->joined.value.load() >= static_cast<std::uint32_t>(num_slots_)) {
    return false;
  }
  Slot& slot = slots_[my_slot_];
  slot.status.store(static_cast<std::uint32_t>(SlotStatus::empty));  // first: see status_of
  slot.pid.store(0);
  header_->joined.value.fetch_sub(1);
  left_ = true;  // nothing more to say: the destructor only unmaps
  remove_if_alone();
  return true;
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
                               const std::vector<int>& slots, const std::string& instead,
                               const std::string& where) const noexcept {
  try {
    std::string whom = instead;
    if (!slots.empty()) {
      char host[256] = "this machine";
      (void)::gethostname(host, sizeof host - 1);
      whom.clear();
      for (std::size_t i = 0; i < slots.size(); ++i) {
        if (i != 0) {
          whom += ", ";  // not "..." + std::string: see comma_list
        }
        whom += describe(slots[i]);
      }
      whom += " on " + std::string(host);
    }
    whom += where;
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
