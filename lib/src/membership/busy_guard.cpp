// The occupancy's entries under the mutex, the revocation of the owner's plain entry, and
// leave's question (busy_guard.hpp).
#include "membership/busy_guard.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>

#include "base/proc.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

long membarrier(int command) {
  return ::syscall(SYS_membarrier, command, 0U, 0);
}

// Registered once per process; false where the kernel (before 4.14) or a filter refuses it.
bool register_membarrier() {
  static const bool registered = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  return registered;
}

[[noreturn]] void throw_second_thread(const char* what) {
  throw Error(std::string(what) +
              ": called from a second thread while another thread of this process waits in "
              "a lockstep barrier");
}

}  // namespace

Occupancy::Occupancy(bool asymmetric) : asymmetric_(asymmetric && register_membarrier()) {}

Occupancy::~Occupancy() = default;

// A full barrier on every thread of the process (membarrier), or on this one where the owner's
// entry takes one itself. false: membarrier failed after it was registered (never seen).
bool Occupancy::full_barrier() const noexcept {
  if (!asymmetric_) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return true;
  }
  return membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
}

Occupancy::Revoked Occupancy::revoke_owner(Record* owner) noexcept {
  owner_.store(nullptr, std::memory_order_relaxed);
  // Then the owner's mark, if made before, is seen; if made after, its re-read sees no owner.
  if (!full_barrier()) {
    owner_.store(owner, std::memory_order_release);
    return Revoked::unknown;
  }
  if (owner->inside.load(std::memory_order_acquire)) {
    owner_.store(owner, std::memory_order_release);  // inside: it stays the owner
    return Revoked::inside;
  }
  return Revoked::yes;
}

Occupancy::Record* Occupancy::record_of(pthread_t thread) {
  for (const std::unique_ptr<Record>& record : records_) {
    // A thread that exited and a later one given its pthread_t share a record: never both alive.
    if (pthread_equal(record->thread, thread) != 0) {
      return record.get();
    }
  }
  return records_.emplace_back(std::make_unique<Record>(thread)).get();
}

Occupancy::Record* Occupancy::enter_handed(const char* what) {
  const pthread_t self = pthread_self();
  const std::lock_guard lock(mutex_);
  if (Record* owner = owner_.load(std::memory_order_relaxed); owner != nullptr) {
    switch (revoke_owner(owner)) {
      case Revoked::yes:
        break;
      case Revoked::inside:
        throw_second_thread(what);
      case Revoked::unknown:
        throw_errno(std::string(what) + ": taking this process's barrier calls to another thread",
                    "membarrier");
    }
  }
  if (handed_inside_) {
    throw_second_thread(what);
  }
  run_ = run_ > 0 && pthread_equal(last_, self) != 0 ? run_ + 1 : 1;
  last_ = self;
  if (run_ >= kOwnAfter) {  // this thread's calls in a row: its next enter with plain stores
    Record* record = record_of(self);
    record->inside.store(true, std::memory_order_relaxed);
    owner_.store(record, std::memory_order_release);  // with its thread, for the others' reads
    return record;
  }
  handed_inside_ = true;
  return nullptr;
}

void Occupancy::leave_handed() noexcept {
  const std::lock_guard lock(mutex_);
  handed_inside_ = false;
}

bool Occupancy::occupied() noexcept {
  const std::lock_guard lock(mutex_);
  if (handed_inside_) {
    return true;
  }
  Record* owner = owner_.load(std::memory_order_relaxed);
  // The caller set left_: then the owner's mark, if made before, is seen; if after, the owner
  // reads left_ set once it has entered.
  return owner != nullptr && (!full_barrier() || owner->inside.load(std::memory_order_acquire));
}

}  // namespace lockstep::detail
