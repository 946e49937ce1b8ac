// What every call that meets the other processes holds while it waits (internal to membership):
// the context's busy flag, and for the exchanges (broadcast, gather) the interrupts held off.
#pragma once

#include <atomic>
#include <string>

#include "lockstep/error.hpp"
#include "waiting/wait_controls.hpp"

namespace lockstep::detail {

// Marks the context busy while one thread waits in it; a second thread's call is an Error.
class BusyGuard {
 public:
  BusyGuard(std::atomic<bool>& busy, const char* what) : busy_(busy) {
    // seq_cst: with Context::leave, a Dekker pair (this sets busy, then reads left; leave sets
    // left, then reads busy): at least one of them sees the other.
    if (busy_.exchange(true, std::memory_order_seq_cst)) {
      throw Error(std::string(what) +
                  ": called from a second thread while another thread of this process waits in "
                  "a lockstep barrier");
    }
  }
  ~BusyGuard() { busy_.store(false, std::memory_order_release); }
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;

 private:
  std::atomic<bool>& busy_;
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
