// The flags-mode stream barrier and its watchdog (internal; no CUDA here: the streams are driven
// through StreamOps, by the CUDA driver or, in tests, by a fake GPU).
#pragma once

#include <poll.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "base/service_thread.hpp"
#include "base/unique_fd.hpp"
#include "gpu/flag_relay.hpp"
#include "gpu/flag_watchdog.hpp"
#include "gpu/stream_barrier.hpp"

namespace lockstep::detail {

// One stream memory operation on a word of the node segment's GPU area.
struct MemOp {
  enum class Kind {
    write,    // stores `value` after the stream's earlier work and a system-wide fence
    wait_at,  // blocks the stream until the word, compared cyclically, is at least `value`
  };
  Kind kind;
  std::atomic<std::uint64_t>* word;
  std::uint64_t value;
};

// "a is before b" in the cyclic order that the streams' waits use (CU_STREAM_WAIT_VALUE_GEQ on
// 64 bits: (int64_t)(word - value) >= 0 passes).
inline constexpr bool cyclic_before(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::int64_t>(a - b) < 0;
}

// How a process's streams are driven.
class StreamOps {
 public:
  StreamOps() = default;
  virtual ~StreamOps() = default;
  StreamOps(const StreamOps&) = delete;
  StreamOps& operator=(const StreamOps&) = delete;

  // Once, before the first enqueue: makes [area, area + bytes) (page-aligned) reachable by this
  // process's streams. Throws Error (naming `what`) when it cannot.
  virtual void map(void* area, std::size_t bytes, const char* what) = 0;
  // Enqueues `ops` on `stream`, in order, after the stream's earlier work; returns without
  // waiting for any of them. Throws Error when the stream refuses them.
  virtual void enqueue(CUstream_st* stream, std::span<const MemOp> ops, const char* what) = 0;
  // Whether `stream` is being captured into a CUDA graph (a barrier there is refused: each replay
  // would repeat one episode's values). Throws Error when the stream cannot be asked.
  [[nodiscard]] virtual bool capturing(CUstream_st* stream, const char* what) = 0;
  // What tells `stream` apart from every other stream of the process while the process lives
  // (CUDA's stream id: a handle's address may be reused). Throws Error when the stream belongs to
  // another device than the area was mapped for (one device per process).
  [[nodiscard]] virtual std::uint64_t stream_id(CUstream_st* stream, const char* what) = 0;
  // The address a kernel uses for `word` of the area; null when there is none.
  [[nodiscard]] virtual const volatile std::uint32_t* device_address(
      const std::atomic<std::uint32_t>* word) const noexcept = 0;
  // Called first on the relay thread (across nodes, the leader's): makes the thread's CUDA calls
  // (the backend's) run where the process's first stream barrier's did, in the relaxed
  // capture mode (a capture on another thread is never disturbed by them).
  virtual void enter_thread() noexcept {}
};

// Episode e of a process (counted from 1): its stream writes e to its own GpuFlag::arrived,
// waits until every peer's `arrived` is at least e, then writes e to its `passed`. The call
// enqueues these and returns. A stream can run at most one episode ahead of a peer's stream
// (it waits for the peer's write of the same episode), and flags only grow, so a wait never
// sees a value of another episode that would let it pass early.
//
// Flags grow whatever streams a process uses: a call on another stream than the previous call's
// first makes its stream wait until the process's `passed` is at least e - 1 (the previous
// stream passed its episode), so the new stream's writes of e follow the old one's of e - 1. A
// call on the same stream as the previous one pays nothing for this (a stream is ordered).
//
// The watchdog (a thread per process, started by the first call) releases every stream when
// the job is broken: a peer died (pidfd) or left, a loss was recorded in the segment (by another
// watchdog, a CPU waiter or the node's leader), or this process's timed call was not passed by
// its stream within its timeout of the moment its own stream reached the barrier (it then records
// a TimeoutError naming the processes whose streams had not arrived; this process's own backlog
// never counts). Releasing: GpuAreaHeader::released := 1, then every process's
// `arrived` is raised (with CAS, never lowered cyclically) to the highest episode any process
// has enqueued plus 2^62. A live stream may still write its own smaller episode over that
// afterwards, so the watchdog raises again every millisecond until every live process's stream
// has passed every episode it enqueued, and keeps watching after that (a call racing the
// failure may enqueue one more). Every watchdog of the node does this; any one suffices.
//
// Every later call in every process throws the recorded failure (PeerLostError naming the peer,
// or TimeoutError), through the node barrier's check (Context::wait_stream).
//
// Across nodes a stream does not wait for its peers' flags but for its node's
// GpuAreaHeader::node_met: it writes e to `arrived`, waits until `node_met` is at least e, then
// writes e to `passed`. The node leader's relay thread (started by its first call) takes its
// episodes in order: it polls until every stream of its node has arrived at e (spinning briefly,
// then sleeping 20 us, and 200 us once a wait has lasted 2 ms), meets the other nodes' leaders
// on the host (StreamRelay::meet), then raises `node_met` to e. No CPU waits for a GPU: the
// callers return at once, and the relay polls memory. A failure of the meet (a node lost, its
// timeout) is recorded in the segment, which every watchdog of the node sees and releases the
// streams (a release raises `node_met` too); a loss on this node is told to the other nodes
// (StreamRelay::try_abort), whose relays then fail their meets and release their streams. A
// timed call's deadline bounds the other nodes from when its node's streams have all arrived (the
// leader's call's timeout; the node's own processes are each measured by their own watchdog).
// The leader's host barriers come after its stream episodes in every node's order (settle).
//
// Memory ordering: a stream's `arrived` write follows a system-wide fence after its earlier
// work, so a peer's stream that passed its wait on that write sees that work.
class FlagBarrier final : public StreamBarrier {
 public:
  // `across_nodes`: the job spans nodes; `relay`: given on the node's leader there.
  FlagBarrier(NodeSegment& segment, std::unique_ptr<StreamOps> ops, bool across_nodes = false,
              StreamRelay relay = {});
  // Waits (bounded) for this process's stream to pass what it enqueued, then stops the relay and
  // the watchdog; the area stays registered to the process's end.
  ~FlagBarrier() override;
  [[nodiscard]] bool meets_on_host() const noexcept override { return false; }
  FlagBarrier(const FlagBarrier&) = delete;
  FlagBarrier& operator=(const FlagBarrier&) = delete;

  void wait(CUstream_st* stream, std::optional<std::chrono::milliseconds> timeout, const Meet& meet,
            const Agree& agree, const char* what) override;
  [[nodiscard]] bool released() const noexcept override;
  [[nodiscard]] const volatile std::uint32_t* release_word() const noexcept override;
  void abandon() noexcept override;
  void settle(std::optional<std::chrono::steady_clock::time_point> deadline,
              const char* what) override;

 private:
  using Clock = std::chrono::steady_clock;
  void set_up(const Agree& agree, const char* what);
  void let_own_stream_pass() const noexcept;
  NodeSegment& segment_;
  std::unique_ptr<StreamOps> stream_ops_;
  bool set_up_ = false;
  // Why the set-up failed here or on a peer (every later call throws it again); null: it did not.
  std::exception_ptr refused_;
  std::uint64_t episode_ = 0;
  std::uint64_t last_stream_ = 0;  // StreamOps::stream_id of the previous call's stream
  // An episode's operations (made by set_up; wait sets the episode). The first one orders a new
  // stream after the previous call's (see above); a call on the previous stream skips it.
  std::vector<MemOp> ops_;
  FlagWatchdog watchdog_;  // declared before the relay, which releases through it
  // Across nodes (see the class).
  bool across_nodes_;
  FlagRelay relay_;  // the leader's thread across nodes; not given elsewhere
};

}  // namespace lockstep::detail
