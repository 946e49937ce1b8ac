// The node barrier: a centralized, monotonic counter in the node segment (internal).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "shm/segment.hpp"
#include "shm/wait.hpp"

namespace lockstep::detail {

// Each process counts its own episodes. Arriving is one fetch_add on the shared `arrivals`
// counter, and episode e is complete once the counter reaches (e + 1) * n: waiters spin on the
// counter itself, so the completing arrival publishes the episode by arriving. Only when a
// waiter sleeps does the completer also change `generation` (the futex word) and wake it.
// Nothing is ever reset, so there is no reset race, and a timed-out process can withdraw its
// arrival with a CAS as long as the episode is not complete.
//
// A node barrier for the hierarchical (multi-node) case keeps this shape: the node leader waits
// for the others' arrivals, meets the other leaders through the backend, then completes.
class NodeBarrier {
 public:
  NodeBarrier(NodeSegment& segment, WaitPlan plan) noexcept : segment_(segment), plan_(plan) {}

  // Arrives and waits until all the node's processes have arrived at this episode.
  // Throws TimeoutError (arrival withdrawn) when `deadline` passes first, PeerLostError when a
  // process that has not arrived dies or leaves. `what` names the caller in messages.
  // Memory ordering: every write before any process's arrival happens-before every read after
  // any process's return.
  void arrive_and_wait(std::optional<std::chrono::steady_clock::time_point> deadline,
                       const char* what);

  [[nodiscard]] std::uint64_t episode() const noexcept { return episode_; }

 private:
  enum class Outcome { complete, timed_out };
  Outcome wait(std::optional<std::chrono::steady_clock::time_point> deadline, const char* what);
  [[nodiscard]] bool complete() const noexcept;
  // Whether `slot` has arrived at the current episode (or arrived and withdrew on a timeout).
  [[nodiscard]] bool came(int slot) const noexcept;
  // Whether a peer that has not arrived was last seen on this process's CPU.
  [[nodiscard]] bool late_peer_here() const noexcept;
  // Called by the arrival that completed episode_ + 1: wakes the processes asleep on it.
  void wake_sleepers() noexcept;
  [[noreturn]] void throw_lost(const LostPeer& peer, const char* what);
  // Throws PeerLostError if a peer that has not arrived is gone; returns true if the episode
  // turned out complete meanwhile.
  [[nodiscard]] bool check_peers(const char* what);

  NodeSegment& segment_;
  WaitPlan plan_;
  std::uint64_t episode_ = 0;  // episodes this process has completed
};

}  // namespace lockstep::detail
