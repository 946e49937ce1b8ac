// Shared (cross-process) futex calls on 32-bit words in MAP_SHARED memory (internal).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace lockstep::detail {

enum class FutexResult {
  woken,          // woken by futex_wake (or spuriously): re-check the word
  value_changed,  // the word no longer held `expected` when the call began
  timed_out,      // `timeout` passed
  interrupted,    // a signal handler ran
};

// Sleeps while `*word == expected`, at most `timeout` (nanoseconds::max(): without a timeout, until
// woken). Never FUTEX_PRIVATE_FLAG: the waker is another process. (std::atomic::wait uses private
// futexes and would never be woken.)
FutexResult futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                       std::chrono::nanoseconds timeout) noexcept;

// Wakes every process sleeping on `word`.
void futex_wake_all(const std::atomic<std::uint32_t>& word) noexcept;

}  // namespace lockstep::detail
