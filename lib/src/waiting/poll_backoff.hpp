// Between the looks of a poll outside a Waiter's wait (internal): for a word that another
// process, or a GPU, is about to write, where a wait with sleeps and deadlines would be too much
// (the call word a peer writes just after its arrival; the flags a node's streams raise, which
// no futex announces). The waiting room owns every way a process gives up its CPU: these polls
// pause here.
#pragma once

#include <chrono>
#include <limits>

namespace lockstep::detail {

class PollBackoff {
 public:
  struct Plan {
    int yields = std::numeric_limits<int>::max();  // pauses that yield the CPU (the writer's?)
    std::chrono::nanoseconds nap{0};               // then a sleep of this
    std::chrono::nanoseconds long_nap{0};          // and of this once long_after has passed
    std::chrono::nanoseconds long_after{0};        // since the backoff began
  };

  // Yields at every pause (a writer a moment away).
  PollBackoff() noexcept : PollBackoff(Plan{}) {}
  explicit PollBackoff(Plan plan) noexcept;

  void pause() noexcept;

 private:
  Plan plan_;
  int pauses_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace lockstep::detail
