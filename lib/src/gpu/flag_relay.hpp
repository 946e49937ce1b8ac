// Flags mode across machines: the node leader's relay thread (internal; see FlagBarrier).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/service_thread.hpp"
#include "gpu/stream_barrier.hpp"

namespace lockstep::detail {

class NodeSegment;

// Raises `word` to `target` unless it is already there or past it in the cyclic order (never
// lowers it). Release: a relay that reads a raised flag (acquire) sees what came before.
void raise_to(std::atomic<std::uint64_t>& word, std::uint64_t target) noexcept;
// Whether a watchdog released the node's streams (GpuAreaHeader::released). Acquire: pairs with
// its store, for a caller that then reads the failure.
[[nodiscard]] bool streams_released(const NodeSegment& segment) noexcept;
// The ranks of the node's processes whose streams had not arrived at `episode`.
[[nodiscard]] std::vector<int> late_streams(const NodeSegment& segment, std::uint64_t episode);
// "the GPU streams of process 3", "the GPU streams of processes 3, 5".
[[nodiscard]] std::string streams_of(const std::vector<int>& ranks);

// The relay thread ("lockstep-relay", the node leader's, across nodes): takes the episodes its
// process posted, in order; for each, polls until every stream of the node has arrived, meets the
// other nodes' leaders through the link (StreamRelay::meet), then raises the node's `node_met`.
// A failed meet is recorded in the segment and the streams are released (`release`); a loss on
// this node is told to the other nodes (StreamRelay::try_abort), once.
class FlagRelay {
 public:
  FlagRelay(NodeSegment& segment, StreamOps& ops, StreamRelay link, std::function<void()> release);
  ~FlagRelay();  // stops the thread
  FlagRelay(const FlagRelay&) = delete;
  FlagRelay& operator=(const FlagRelay&) = delete;

  [[nodiscard]] bool given() const noexcept { return link_.given(); }
  [[nodiscard]] bool running() const noexcept { return thread_.running(); }
  // Starts the thread (given() only). Throws Error (naming `what`) when it cannot.
  void start(const char* what);
  // An episode this process enqueued, with its call's timeout (the other nodes' bound).
  void post(std::optional<std::chrono::milliseconds> timeout);
  // Waits until every posted episode has met the other nodes (or the relay ended): the leader's
  // host barriers come after its stream episodes in every node's order. Throws TimeoutError
  // past `deadline`, InterruptedError on a signal.
  void settle(std::optional<std::chrono::steady_clock::time_point> deadline, const char* what);
  // Stops the thread, cancelling a meet in progress (the process leaves).
  void stop() noexcept;
  // A forked child: the thread is the parent's.
  void forget() noexcept { thread_.forget(); }

 private:
  using Clock = std::chrono::steady_clock;
  void run() noexcept;
  // Waits for the next posted episode: its timeout, or nothing once the relay stops.
  std::optional<std::optional<std::chrono::milliseconds>> next_posted() noexcept;
  // Meets the other nodes' relays; false when the relay ends (stopping, or the meeting failed:
  // recorded, the streams released, the other nodes told).
  bool meet_other_nodes(std::optional<std::chrono::milliseconds> timeout) noexcept;
  // Polls until every stream of the node has arrived at `episode`: false if the job broke (or
  // the relay was stopped) first.
  bool node_arrived(std::uint64_t episode) noexcept;
  // Tells the other nodes why this node cannot go on, once: the loss recorded in the segment.
  void tell_other_nodes() noexcept;

  NodeSegment& segment_;
  StreamOps& ops_;
  StreamRelay link_;
  std::function<void()> release_;
  ServiceThread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  // Under mutex_: the timeouts of the episodes posted and not yet met, oldest first.
  std::deque<std::optional<std::chrono::milliseconds>> posted_;
  std::uint64_t met_ = 0;             // the last episode met (mutex_)
  bool ended_ = false;                // it stopped or the job broke: nothing more is met (mutex_)
  std::atomic<bool> meeting_{false};  // in StreamRelay::meet now
  bool told_ = false;                 // the thread's: tell_other_nodes ran
};

}  // namespace lockstep::detail
