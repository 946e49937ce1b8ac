// Flags mode's watchdog: the thread in each process that releases every stream when the job is
// broken (internal; see FlagBarrier).
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "base/service_thread.hpp"
#include "base/unique_fd.hpp"

namespace lockstep::detail {

class NodeSegment;

// The watchdog ("lockstep-gpu", one per process, started by the first stream call): releases
// every stream of the node when a peer died (pidfd) or left, a loss was recorded in the segment
// (by another watchdog, a CPU waiter or the node's leader), or this process's timed call was not
// passed by its stream within its timeout of the moment its own stream reached the barrier (it
// then records a TimeoutError naming the processes whose streams had not arrived). Releasing:
// GpuAreaHeader::released := 1, then every process's `arrived` (and across nodes `node_met`) is
// raised to the highest episode any process has enqueued plus 2^62, again every millisecond
// until every living process's stream has passed everything it enqueued.
class FlagWatchdog {
 public:
  FlagWatchdog(NodeSegment& segment, bool across_nodes) noexcept
      : segment_(segment), across_nodes_(across_nodes) {}
  ~FlagWatchdog() { stop(); }
  FlagWatchdog(const FlagWatchdog&) = delete;
  FlagWatchdog& operator=(const FlagWatchdog&) = delete;

  // Starts the thread. Throws Error (naming `what`) when it cannot.
  void start(const char* what);
  void stop() noexcept { thread_.stop(); }
  // A forked child: the thread is the parent's.
  void forget() noexcept { thread_.forget(); }
  // A timed call of `episode`: its deadline starts when this process's stream arrives there.
  // The watchdog is woken to look for that moment often.
  void add_deadline(std::uint64_t episode, std::chrono::milliseconds timeout);
  // The last add_deadline taken back (its call failed to enqueue).
  void drop_last_deadline() noexcept;
  // Releases every stream of the node (any thread; see the class).
  void release_streams() noexcept;

 private:
  using Clock = std::chrono::steady_clock;
  struct Deadline {
    std::uint64_t episode;
    std::chrono::milliseconds timeout;
    // timeout after the watchdog saw this process's stream arrive at the episode; max() before.
    Clock::time_point at;
  };
  void watch() noexcept;
  // Opens a pidfd for every peer (fds_ after the wake descriptor, pids_): whether one may name
  // a stranger (its peer had died and the pid was reused).
  bool open_peer_pidfds() noexcept;
  // One look at the job; true once it is broken (and the streams must be released).
  bool broken(std::vector<bool>& gone, bool full_check) noexcept;
  bool check_deadline() noexcept;
  // How long the watchdog may sleep before check_deadline must look again.
  [[nodiscard]] int deadline_poll_ms() noexcept;
  [[nodiscard]] bool drained(const std::vector<bool>& gone) const noexcept;

  NodeSegment& segment_;
  bool across_nodes_;
  std::mutex deadlines_mutex_;
  std::deque<Deadline> deadlines_;  // this process's timed calls not yet passed, oldest first
  // The thread's own state (see watch()).
  std::vector<pollfd> fds_;     // its wake descriptor, then the pidfds
  std::vector<UniqueFd> pids_;  // the pidfds fds_[1...] polls (closed: -1 there)
  std::vector<bool> gone_;
  ServiceThread thread_;  // woken by a timed call, and to stop
};

}  // namespace lockstep::detail
