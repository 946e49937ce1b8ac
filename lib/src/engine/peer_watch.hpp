// The peer watch: a thread per process that sleeps until one of the node's other processes
// exits, so that the node barrier's sleepers need no timeout (internal).
//
// A process asleep in the node barrier must notice a peer that dies without arriving. Polling
// for it (a futex wait with a timeout, then a look at the peers' pids) costs every sleep: on a
// loaded machine a timed FUTEX_WAIT made episodes 12-15% slower than an untimed one, and an
// untimed futex_waitv on the peers' words 6-64% (docs/performance-history.md, "What a sleep
// costs"). Instead each process holds a pidfd of every other process of its node, and a thread
// polls them. When one becomes readable (its process exited, or became a zombie), the thread raises
// this process's alarm and wakes the node's sleepers (NodeSegment::wake_waiters); from then on
// this process's waits poll again, as they always did. Until then the thread also wakes an
// untimed sleeper of this process whose stall line is due (see wake_me_at), a few times per
// stall interval at most.
//
// Where it cannot watch (no pidfd_open: Linux before 5.3, a seccomp filter; a peer that already
// exited), start() returns nothing or an alarmed watch, and the waits poll.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/service_thread.hpp"
#include "base/unique_fd.hpp"
#include "engine/segment.hpp"

namespace lockstep::detail {

class PeerWatch {
 public:
  // Watches `segment`'s other processes (every slot is claimed: after the node's rendezvous).
  // Nothing when the node has one process, or pidfds are not to be had. Never throws.
  static std::unique_ptr<PeerWatch> start(NodeSegment& segment) noexcept;

  // Stops and joins the thread (once; its process leaves, or exits while another of its threads
  // waits); in a forked child, which has no such thread, forgets it (never joined).
  void stop() noexcept;
  ~PeerWatch();  // stop()
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Whether a watched process has exited (or the watch failed): waits must poll from now on.
  // seq_cst: read by a sleeper after it read the futex word (see NodeBarrier::sleep), raised
  // before the thread changes the word.
  [[nodiscard]] bool alarmed() const noexcept { return alarm_.load(std::memory_order_seq_cst); }
  // Whether the thread saw a watched process exit (not an alarm raised from the start, where the
  // waits poll anyway): a wait that sees it looks for the lost peer at once. Relaxed: a hint.
  [[nodiscard]] bool saw_an_exit() const noexcept {
    return exited_.load(std::memory_order_relaxed);
  }

  // This process sleeps without a timeout and wants to be woken at `when` (its stall line is
  // due); WaitClock::time_point::max(): never. clear_wake() when the sleep is over.
  void wake_me_at(std::chrono::steady_clock::time_point when) noexcept;
  void clear_wake() noexcept { wake_at_.store(0, std::memory_order_relaxed); }

 private:
  PeerWatch(NodeSegment& segment, std::vector<UniqueFd> pidfds) noexcept;
  void run() noexcept;
  // Raises the alarm (`exited`: a watched process exited, not a failure of the watch) and wakes
  // the node's sleepers.
  void raise(bool exited = false) noexcept;

  NodeSegment& segment_;
  std::vector<UniqueFd> pidfds_;  // the node's other processes
  std::atomic<bool> alarm_{false};
  std::atomic<bool> exited_{false};       // see saw_an_exit
  std::atomic<std::int64_t> wake_at_{0};  // steady clock ns; 0: no sleeper to wake
  ServiceThread thread_;                  // last: it stops before the rest goes
};

}  // namespace lockstep::detail
