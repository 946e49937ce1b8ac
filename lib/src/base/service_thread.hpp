// A thread of lockstep's own beside the user's (internal): the peer watch, the GPU watchdog and
// relay, the places desk each run on one.
//
// It starts with every signal blocked (a Ctrl-C must reach the threads that wait, not this one)
// and named, so that a debugger or `top -H` says whose it is. Its body sleeps in poll() on its
// wake descriptor (an eventfd) beside its own: stop() sets stopping() and makes the descriptor
// readable, then joins the thread; wake() makes it readable alone, for a body that has more to
// look at. A forked child has none of its parent's threads: its copy of the object forgets the
// thread (never joined) and closes its own copy of the descriptor.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "base/unique_fd.hpp"

namespace lockstep::detail {

class ServiceThread {
 public:
  ServiceThread() = default;
  ServiceThread(const ServiceThread&) = delete;
  ServiceThread& operator=(const ServiceThread&) = delete;
  ~ServiceThread();  // stop(), or forget() in a forked child

  // Runs `body` on a new thread named `name` (15 characters at most, as Linux keeps). Throws
  // SystemError naming `what` where the descriptor or the thread cannot be had; then nothing
  // runs.
  void start(const char* name, std::function<void()> body, const std::string& what);

  [[nodiscard]] bool running() const noexcept { return thread_.joinable(); }
  // For the body's poll: readable after wake() or stop(). The body reads it (drain()) to sleep
  // again.
  [[nodiscard]] int wake_fd() const noexcept { return wake_.get(); }
  void drain() const noexcept;
  // Whether stop() was called (seq_cst: a body that reads false after a wake() of stop's sleeps
  // on a descriptor that is readable).
  [[nodiscard]] bool stopping() const noexcept { return stopping_.load(std::memory_order_seq_cst); }

  // In a forked child these three leave the parent's thread alone: wake() and request_stop() do
  // nothing, stop() forgets the thread.
  void wake() const noexcept;
  // Sets stopping() and wakes the body; stop() also joins it. request_stop() alone suits a body
  // that sleeps elsewhere too (a condition variable): its owner wakes it there, then calls stop().
  void request_stop() noexcept;
  void stop() noexcept;
  // In a forked child: the thread is the parent's. Forgets it (kept where a leak checker sees it
  // reachable) and closes the child's copy of the descriptor.
  void forget() noexcept;

 private:
  [[nodiscard]] bool in_forked_child() const noexcept;

  std::thread thread_;
  UniqueFd wake_;
  std::atomic<bool> stopping_{false};
  pid_t owner_ = 0;  // the process that started the thread
};

}  // namespace lockstep::detail
