#include "gpu/flag_barrier.hpp"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "base/log.hpp"
#include "engine/segment.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

constexpr std::uint32_t kFlagsReady = 3;  // GpuSlot::ready: this process set flags mode up
// How long a process that leaves waits for its own stream to pass what it enqueued.
constexpr auto kLeaveBound = std::chrono::seconds(10);
constexpr auto kLeaveLook = std::chrono::milliseconds(1);

}  // namespace

FlagBarrier::FlagBarrier(NodeSegment& segment, std::unique_ptr<StreamOps> ops, bool across_nodes,
                         StreamRelay relay)
    : segment_(segment),
      stream_ops_(std::move(ops)),
      watchdog_(segment, across_nodes),
      across_nodes_(across_nodes),
      relay_(segment, *stream_ops_, std::move(relay), [this] { watchdog_.release_streams(); }) {}

FlagBarrier::~FlagBarrier() {
  let_own_stream_pass();
  relay_.stop();
  watchdog_.stop();
}

// A process that leaves counts as lost for the streams: every watchdog of the node then releases
// every stream. One that returned from its last stream call at once (as every call returns)
// would let a living peer's stream pass that barrier before a slow peer's stream reached it. So
// its own stream passes what it enqueued first, which it does only once every peer's stream has
// reached that barrier; the watchdog and the relay go on meanwhile (a peer that dies releases
// it). Host memory only, no CUDA call: at exit the driver may be gone, and then, or where a
// peer's stream never comes, it leaves after kLeaveBound, as before, and says so.
void FlagBarrier::let_own_stream_pass() const noexcept {
  if (!set_up_) {
    return;
  }
  const int me = segment_.my_slot();
  const auto until = Clock::now() + kLeaveBound;
  while (!segment_.stream_drained(me)) {
    if (Clock::now() >= until) {
      try {
        log_line(segment_.slot(me).rank.load(std::memory_order_relaxed),
                 "leaving while this process's GPU stream has not passed its last stream "
                 "barrier after " +
                     std::to_string(kLeaveBound.count()) +
                     " s: the other processes' streams are released");
      } catch (...) {
        // Out of memory for a diagnostic: it leaves without it.
      }
      return;
    }
    std::this_thread::sleep_for(kLeaveLook);
  }
}

void FlagBarrier::abandon() noexcept {
  // A forked child: the watchdog is a thread of the parent, and the stream operations may hold
  // the parent's threads or CUDA objects. Neither may be joined, destroyed or used here.
  // Kept where a leak checker sees them reachable (a forked child exits with them).
  static auto* ops = new std::vector<std::unique_ptr<StreamOps>>();  // NOLINT: never freed
  watchdog_.forget();
  relay_.forget();
  ops->push_back(std::move(stream_ops_));
}

bool FlagBarrier::released() const noexcept {
  return streams_released(segment_);
}

const volatile std::uint32_t* FlagBarrier::release_word() const noexcept {
  return set_up_ ? stream_ops_->device_address(&segment_.gpu_area_header().released) : nullptr;
}

void FlagBarrier::wait(CUstream_st* stream, std::optional<std::chrono::milliseconds> timeout,
                       const Meet& /*meet*/, const Agree& agree, const char* what) {
  if (stream_ops_->capturing(stream, what)) {
    throw Error(capture_refusal(what));
  }
  if (!set_up_) {
    set_up(agree, what);
  }
  const int me = segment_.my_slot();
  const std::uint64_t stream_id = stream_ops_->stream_id(stream, what);
  const bool new_stream = episode_ != 0 && stream_id != last_stream_;
  const std::uint64_t episode = episode_ + 1;
  ops_.front().value = episode_;  // the order after the previous stream (see the class)
  for (MemOp& op : std::span(ops_).subspan(1)) {
    op.value = episode;
  }
  if (timeout) {
    watchdog_.add_deadline(episode, *timeout);
  }
  try {
    stream_ops_->enqueue(stream, new_stream ? std::span(ops_) : std::span(ops_).subspan(1), what);
  } catch (...) {
    if (timeout) {
      watchdog_.drop_last_deadline();
    }
    throw;
  }
  episode_ = episode;
  last_stream_ = stream_id;
  // seq_cst, with the watchdogs' loss mark (seq_cst) and their reads of `enqueued`: either a
  // watchdog that releases sees this episode, or this process sees the mark and releases.
  segment_.gpu_slot(me).enqueued.store(episode, std::memory_order_seq_cst);
  if (segment_.header().lost.value.load(std::memory_order_seq_cst) != 0) {
    watchdog_.release_streams();
  }
  if (relay_.running()) {
    relay_.post(timeout);
  }
}

void FlagBarrier::settle(std::optional<Clock::time_point> deadline, const char* what) {
  relay_.settle(deadline, what);  // nothing to wait for where no relay runs
}

void FlagBarrier::set_up(const Agree& agree, const char* what) {
  if (refused_) {
    std::rethrow_exception(refused_);  // the set-up failed: every later call fails as it did
  }
  // A device that cannot run flags mode (no stream memory operations, no host registration)
  // still comes to the set-up meet, marked refused, so that every process of every machine fails
  // there too, naming it, instead of waiting for it without a deadline; it throws its own reason
  // after the meet. The meet gathers the marks across machines: a machine's processes alone
  // knowing, the other machines' streams would wait for a relay that never starts.
  GpuSlot& own = segment_.gpu_slot(segment_.my_slot());
  std::uint32_t mark = kFlagsReady;
  try {
    stream_ops_->map(segment_.gpu_area(), segment_.gpu_area_bytes(), what);
  } catch (const Error&) {
    refused_ = std::current_exception();
    mark = kFlagsRefused;
  }
  // The slot's record; the set-up gather carries the mark to every process, once, never again.
  own.ready.store(mark, std::memory_order_release);
  const std::vector<std::uint32_t> marks = agree(mark);
  if (refused_) {
    std::rethrow_exception(refused_);
  }
  try {
    check_marks(marks, kFlagsReady, what);
  } catch (const Error&) {
    refused_ = std::current_exception();  // every later call fails as this one
    throw;
  }
  // Every episode's operations, the same but for the episode number (wait fills it in).
  const int me = segment_.my_slot();
  GpuFlag& flag = segment_.gpu_flag(me);
  ops_.clear();
  ops_.push_back({MemOp::Kind::wait_at, &flag.passed, 0});
  ops_.push_back({MemOp::Kind::write, &flag.arrived, 0});
  if (across_nodes_) {
    ops_.push_back({MemOp::Kind::wait_at, &segment_.gpu_area_header().node_met, 0});
  } else {
    for (int slot = 0; slot < segment_.num_slots(); ++slot) {
      if (slot != me) {
        ops_.push_back({MemOp::Kind::wait_at, &segment_.gpu_flag(slot).arrived, 0});
      }
    }
  }
  ops_.push_back({MemOp::Kind::write, &flag.passed, 0});
  watchdog_.start(what);
  if (relay_.given()) {
    try {
      relay_.start(what);
    } catch (...) {
      watchdog_.stop();
      throw;
    }
  }
  set_up_ = true;
}

}  // namespace lockstep::detail
