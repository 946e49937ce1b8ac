#include "gpu/flag_relay.hpp"

#include <string>
#include <utility>

#include "base/fault_points.hpp"
#include "base/text.hpp"
#include "engine/layout.hpp"  // lost_how
#include "engine/segment.hpp"
#include "gpu/flag_barrier.hpp"  // StreamOps, cyclic_before
#include "lockstep/error.hpp"
#include "waiting/poll_backoff.hpp"
#include "waiting/wait_controls.hpp"

namespace lockstep::detail {
namespace {

// How long the idle relay sleeps between looks at a loss no post tells it of, and the slice of
// settle's wait.
constexpr int kIdleMs = 20;
// The relay's polls of its node's streams: yields first, then naps, longer once a wait lasts
// (a stream behind long work: 5,000 looks a second rather than 50,000).
constexpr int kRelayYields = 64;
constexpr auto kRelayNap = std::chrono::microseconds(20);
constexpr auto kRelayLongNap = std::chrono::microseconds(200);
constexpr auto kRelayLongAfter = std::chrono::milliseconds(2);
constexpr const char* kRelayWhat = "lockstep: wait_for_everyone(stream)";

}  // namespace

void raise_to(std::atomic<std::uint64_t>& word, std::uint64_t target) noexcept {
  std::uint64_t seen = word.load(std::memory_order_relaxed);
  while (cyclic_before(seen, target) &&
         !word.compare_exchange_weak(seen, target, std::memory_order_release,
                                     std::memory_order_relaxed)) {
  }
}

bool streams_released(const NodeSegment& segment) noexcept {
  return segment.gpu_area_header().released.load(std::memory_order_acquire) != 0;
}

std::vector<int> late_streams(const NodeSegment& segment, std::uint64_t episode) {
  std::vector<int> ranks;
  for (int slot = 0; slot < segment.num_slots(); ++slot) {
    // Acquire: the stream wrote it; only compared.
    if (cyclic_before(segment.gpu_flag(slot).arrived.load(std::memory_order_acquire), episode)) {
      ranks.push_back(segment.slot(slot).rank.load(std::memory_order_relaxed));
    }
  }
  return ranks;
}

std::string streams_of(const std::vector<int>& ranks) {
  return (ranks.size() > 1 ? "the GPU streams of processes " : "the GPU streams of process ") +
         comma_list(ranks);
}

FlagRelay::FlagRelay(NodeSegment& segment, StreamOps& ops, StreamRelay link,
                     std::function<void()> release)
    : segment_(segment), ops_(ops), link_(std::move(link)), release_(std::move(release)) {}

FlagRelay::~FlagRelay() {
  stop();
}

void FlagRelay::start(const char* what) {
  thread_.start(
      "lockstep-relay", [this] { run(); }, what);
}

void FlagRelay::post(std::optional<std::chrono::milliseconds> timeout) {
  {
    std::lock_guard lock(mutex_);
    posted_.push_back(timeout);
  }
  changed_.notify_one();
}

void FlagRelay::stop() noexcept {
  if (!thread_.running()) {
    return;
  }
  // seq_cst, with the relay's `meeting_` store and its read of the stop: either it sees the
  // stop before it meets, or this sees it meeting and cancels the meet.
  thread_.request_stop();
  if (meeting_.load(std::memory_order_seq_cst)) {
    link_.cancel();  // the process leaves: the other nodes see its leader gone
  }
  {
    std::lock_guard lock(mutex_);  // the relay reads the stop under it before it sleeps
  }
  changed_.notify_all();
  thread_.stop();
}

void FlagRelay::settle(std::optional<Clock::time_point> deadline, const char* what) {
  if (!thread_.running()) {
    return;
  }
  std::unique_lock lock(mutex_);
  while (!posted_.empty() && !ended_) {
    auto slice = std::chrono::milliseconds(kIdleMs);
    if (deadline) {
      const auto now = Clock::now();
      if (now >= *deadline) {
        const std::uint64_t episode = met_ + 1;
        lock.unlock();
        std::vector<int> missing = late_streams(segment_, episode);
        throw TimeoutError(
            std::string(what) + ": every node meets its GPU streams' barrier " +
                std::to_string(episode) +
                " before this one, and this node's had not met the "
                "others there when the timeout passed (" +
                (missing.empty() ? std::string("every stream of this node had reached it")
                                 : streams_of(missing) + " had not reached it") +
                "); nothing arrived at this barrier",
            missing);
      }
      slice = std::min(slice, std::chrono::ceil<std::chrono::milliseconds>(*deadline - now));
    }
    changed_.wait_for(lock, slice);
    if (interrupt_pending()) {
      lock.unlock();
      check_interrupt(what);
    }
  }
}

std::optional<std::optional<std::chrono::milliseconds>> FlagRelay::next_posted() noexcept {
  std::unique_lock lock(mutex_);
  while (posted_.empty() && !thread_.stopping()) {
    changed_.wait_for(lock, std::chrono::milliseconds(kIdleMs));
    // Idle, a death on this node (or a failure from elsewhere): the other nodes' relays would
    // wait for this one for ever. Not a process that left: it left after its last call, and
    // the other nodes may still be finishing the barrier it passed, which a loss told now would
    // fail there (their leaders take an abort over a completion read with it). A node that
    // comes to a stream barrier this one never posts hears of it as of a host barrier's: when
    // this node's leader leaves, or at its own timeout.
    // Acquire: the mark's writer recorded the loss before it.
    if (const std::uint32_t lost = segment_.header().lost.value.load(std::memory_order_acquire);
        posted_.empty() && lost != 0 && lost_how(lost) != LostHow::left) {
      lock.unlock();
      tell_other_nodes();
      lock.lock();
    }
  }
  if (thread_.stopping()) {
    return std::nullopt;
  }
  return posted_.front();
}

bool FlagRelay::meet_other_nodes(std::optional<std::chrono::milliseconds> timeout) noexcept {
  std::optional<Clock::time_point> deadline;
  if (timeout) {
    deadline = Clock::now() + *timeout;  // the other nodes, from this node's last arrival
  }
  meeting_.store(true, std::memory_order_seq_cst);  // see stop
  try {
    if (thread_.stopping()) {
      return false;
    }
    link_.meet(deadline, kRelayWhat);
  } catch (const std::exception& error) {
    meeting_.store(false, std::memory_order_seq_cst);
    if (!thread_.stopping()) {
      // Every process of the node throws it; every watchdog releases the streams (this one
      // at once). A loss already recorded here (a local death) stays the node's, and is told.
      segment_.record_failure(failure_of(error, kRelayWhat));
      release_();
      tell_other_nodes();
    }
    return false;
  }
  meeting_.store(false, std::memory_order_seq_cst);
  return true;
}

void FlagRelay::run() noexcept {
  ops_.enter_thread();
  ignore_interrupts_on_this_thread();  // a Ctrl-C is the caller's; the relay ends by stop
  std::uint64_t episode = 0;
  for (;;) {
    const auto timeout = next_posted();
    if (!timeout) {
      break;
    }
    ++episode;
    if (!node_arrived(episode)) {
      tell_other_nodes();
      break;
    }
    fault_point("gpu.relay.arrived");
    if (!meet_other_nodes(*timeout)) {
      break;
    }
    fault_point("gpu.relay.met");
    raise_to(segment_.gpu_area_header().node_met, episode);
    {
      std::lock_guard lock(mutex_);
      posted_.pop_front();
      met_ = episode;
    }
    changed_.notify_all();
  }
  {
    std::lock_guard lock(mutex_);
    ended_ = true;
  }
  changed_.notify_all();
}

bool FlagRelay::node_arrived(std::uint64_t episode) noexcept {
  // Streams raise their flags with no futex to wake on: a few yields for streams that are
  // almost there, then naps that grow once the wait is long.
  PollBackoff backoff(PollBackoff::Plan{kRelayYields, kRelayNap, kRelayLongNap, kRelayLongAfter});
  for (;; backoff.pause()) {
    // seq_cst, as the watchdogs' mark and `released`: a released flag is not an arrival.
    const auto broken = [this] {
      return segment_.header().lost.value.load(std::memory_order_seq_cst) != 0 ||
             streams_released(segment_);
    };
    if (thread_.stopping() || broken()) {
      return false;
    }
    bool all = true;
    for (int slot = 0; slot < segment_.num_slots() && all; ++slot) {
      // Acquire: pairs with a release's raise (after its `released` mark), so that a raised flag
      // is seen with the mark.
      all =
          !cyclic_before(segment_.gpu_flag(slot).arrived.load(std::memory_order_acquire), episode);
    }
    if (all) {
      return !broken();
    }
  }
}

void FlagRelay::tell_other_nodes() noexcept {
  if (told_) {
    return;
  }
  try {
    const std::optional<LostPeer> lost = segment_.recorded_lost();
    if (!lost) {
      return;  // stopped, not broken
    }
    Failure failure;
    if (lost->how == LostHow::elsewhere) {
      failure = segment_.recorded_failure();
    } else {
      const int rank = segment_.slot(lost->slot).rank.load(std::memory_order_relaxed);
      failure = Failure{FailureKind::peer_lost,
                        rank,
                        {},
                        segment_.describe(lost->slot) + " " + describe(lost->how) +
                            " while the GPU streams waited"};
    }
    told_ = link_.try_abort(failure);
  } catch (...) {
    // Out of memory for the message: the other nodes see this leader gone when it exits.
  }
}

}  // namespace lockstep::detail
