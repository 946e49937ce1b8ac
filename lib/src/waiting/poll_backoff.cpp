#include "waiting/poll_backoff.hpp"

#include <sched.h>

#include <thread>

namespace lockstep::detail {

PollBackoff::PollBackoff(Plan plan) noexcept
    : plan_(plan), start_(std::chrono::steady_clock::now()) {}

void PollBackoff::pause() noexcept {
  if (pauses_ < plan_.yields) {
    ++pauses_;
    ::sched_yield();
    return;
  }
  const bool long_ago = std::chrono::steady_clock::now() - start_ >= plan_.long_after;
  std::this_thread::sleep_for(long_ago ? plan_.long_nap : plan_.nap);
}

}  // namespace lockstep::detail
