// What every call that meets the other processes holds while it waits (internal to membership):
// the process's occupancy (one thread at a time), and for the exchanges (broadcast, gather) the
// interrupts held off.
#pragma once

#include <pthread.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "waiting/wait_controls.hpp"

namespace lockstep::detail {

// One thread of this process at a time in the calls that meet the other processes: a second
// thread's call, while one waits, is an Error; and Context::leave learns whether a thread waits
// (a Dekker pair with the caller's read of left_: at least one of them sees the other).
//
// The thread that made the last kOwnAfter calls in a row (the owner) enters with plain stores
// (its record marked inside, then the owner read again): the barrier's path has no locked
// instruction of its own. Any other thread enters under the mutex, and first revokes that
// owner: it clears the owner, then membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) runs a full
// barrier on every thread of the process, so the owner's mark, if it was made, is seen, or the
// owner's second read sees the owner gone and backs out (an asymmetric Dekker pair). leave()
// does the same against left_. Where membarrier is refused (an old kernel, a filter), the
// owner's entry takes a full fence instead, and the other side takes one too.
//
// Threads that take turns enter under the mutex each time, with no membarrier: a thread owns the
// plain entry only after kOwnAfter calls in a row, so at most one membarrier is paid per such
// run of one thread's calls (about 2 us, with one other thread running).
class Occupancy {
 public:
  // What an entry holds: the record it marked (a plain entry), or none (under the mutex).
  struct Record;
  class Entry;

  // asymmetric: false forces the fenced entry (tests; a process where membarrier is refused).
  explicit Occupancy(bool asymmetric = true);
  Occupancy(const Occupancy&) = delete;
  Occupancy& operator=(const Occupancy&) = delete;
  ~Occupancy();

  // Enters for this thread; an Error naming `what` if another thread is inside.
  Entry enter(const char* what);
  // Whether a thread is inside, for a caller that has just set left_ (seq_cst): a thread that
  // enters afterwards reads left_ set. Takes the mutex: never from a forked copy.
  bool occupied() noexcept;
  // Whether the owner's entries take no fence (membarrier registered).
  bool asymmetric() const noexcept { return asymmetric_; }
  // Whether `thread` enters with plain stores now (tests).
  bool owned_by(pthread_t thread) const noexcept;
  // The plain entry's two steps, public for tests: the owner's record, read first; then its
  // mark and the owner read again, which backs out (false) if another thread revoked it between.
  Record* owner() const noexcept { return owner_.load(std::memory_order_acquire); }
  bool enter_owned(Record* record) noexcept;

 private:
  Record* enter_handed(const char* what);
  void leave_handed() noexcept;
  bool full_barrier() const noexcept;
  enum class Revoked { yes, inside, unknown };  // unknown: membarrier failed (never seen)
  Revoked revoke_owner(Record* owner) noexcept;
  Record* record_of(pthread_t thread);

  static constexpr int kOwnAfter = 4;

  std::atomic<Record*> owner_{nullptr};  // the thread that enters with plain stores, or none
  bool asymmetric_;
  std::mutex mutex_;            // the entries that are not the owner's, and leave's question
  bool handed_inside_ = false;  // a thread entered under the mutex and is inside
  pthread_t last_ = {};         // the thread that entered under the mutex last
  int run_ = 0;                 // its entries in a row
  std::vector<std::unique_ptr<Record>> records_;  // one per thread that entered (by pthread_t)
};

struct alignas(64) Occupancy::Record {
  std::atomic<bool> inside{false};  // written by its thread only
  pthread_t thread;
  explicit Record(pthread_t t) : thread(t) {}
};

class Occupancy::Entry {
 public:
  Entry(Occupancy& occupancy, Record* record) : occupancy_(&occupancy), record_(record) {}
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  ~Entry() {
    if (record_ != nullptr) {
      record_->inside.store(false, std::memory_order_release);  // the next thread reads it
    } else {
      occupancy_->leave_handed();
    }
  }

 private:
  Occupancy* occupancy_;
  Record* record_;
};

inline bool Occupancy::owned_by(pthread_t thread) const noexcept {
  const Record* owner = owner_.load(std::memory_order_acquire);
  return owner != nullptr && pthread_equal(owner->thread, thread) != 0;
}

inline bool Occupancy::enter_owned(Record* record) noexcept {
  record->inside.store(true, std::memory_order_relaxed);
  if (asymmetric_) {
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the revoker's membarrier orders it
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  if (owner_.load(std::memory_order_relaxed) == record) {
    return true;
  }
  record->inside.store(false, std::memory_order_release);  // revoked meanwhile: back out
  return false;
}

inline Occupancy::Entry Occupancy::enter(const char* what) {
  Record* owner = this->owner();  // with its thread, written before
  // Not while already inside: a call from within a call (a callback) is refused, as another
  // thread's is.
  if (owner != nullptr && pthread_equal(owner->thread, pthread_self()) != 0 &&
      !owner->inside.load(std::memory_order_relaxed) && enter_owned(owner)) [[likely]] {
    return {*this, owner};
  }
  return {*this, enter_handed(what)};
}

// Marks the process busy while one thread waits in it (Occupancy::enter).
class BusyGuard {
 public:
  BusyGuard(Occupancy& occupancy, const char* what) : entry_(occupancy.enter(what)) {}

 private:
  Occupancy::Entry entry_;
};

// Not interruptible (lockstep_set_interrupt_fd) meanwhile: an interrupted exchange could be
// neither taken back nor retried (its episodes and the backend's messages are under way). One
// thread waits at a time (BusyGuard), so the process-wide setting is this call's meanwhile.
class InterruptsHeldOff {
 public:
  InterruptsHeldOff() = default;
  ~InterruptsHeldOff() { (void)set_interrupt_fd(saved_); }
  InterruptsHeldOff(const InterruptsHeldOff&) = delete;
  InterruptsHeldOff& operator=(const InterruptsHeldOff&) = delete;

 private:
  int saved_ = set_interrupt_fd(-1);
};

}  // namespace lockstep::detail
