#include "gpu/flag_barrier.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

#include "base/fault_points.hpp"
#include "base/proc.hpp"
#include "engine/segment.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

constexpr std::uint32_t kFlagsReady = 3;  // GpuSlot::ready: this process set flags mode up
// How often the watchdog looks at what no descriptor tells it: a peer that left, a loss recorded
// by another process, this process's deadlines. A dead peer wakes it at once (pidfd). The issue's
// bound for releasing every stream after a death is 0.5 s; 20 ms costs 50 wake-ups a second.
constexpr int kWatchMs = 20;
// How often it looks, while a timed call waits for this process's own stream to reach the
// barrier, for the moment its deadline starts (which it may then see up to this much late).
constexpr int kStartMs = 1;
// Without pidfds (a kernel before 5.3, gVisor, the pids of another namespace): a full liveness
// check (a /proc read per peer) this often, as the CPU barrier's waiters poll (kPollInterval).
constexpr auto kFullCheck = kPollInterval;
// While streams are not yet drained after a release, they are raised again this often; once
// drained, looked at this often (a call racing the failure may enqueue one more episode).
constexpr int kReleaseMs = 1;
constexpr int kDrainedMs = 10;
// What a release adds to the highest episode enqueued: far past any episode a stream may wait
// for, and still after every flag in the cyclic order (a release never lowers a flag).
constexpr std::uint64_t kReleaseLead = 1ULL << 62;

bool still_runs(pid_t pid, std::uint64_t start_time) noexcept {
  try {
    return process_liveness(pid, start_time) == Liveness::alive;
  } catch (...) {
    return false;  // an unreadable /proc: the full check decides
  }
}

int open_pidfd(pid_t pid) noexcept {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

}  // namespace

FlagBarrier::FlagBarrier(NodeSegment& segment, std::unique_ptr<StreamOps> ops, bool across_nodes,
                         StreamRelay relay)
    : segment_(segment),
      stream_ops_(std::move(ops)),
      across_nodes_(across_nodes),
      relay_(segment, *stream_ops_, std::move(relay), [this] { release_streams(); }) {}

FlagBarrier::~FlagBarrier() {
  relay_.stop();
  stop_watchdog();
}

void FlagBarrier::stop_watchdog() noexcept {
  watchdog_.stop();
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
  // Acquire: pairs with the watchdog's store, for a caller that then reads the failure.
  return segment_.gpu_area_header().released.load(std::memory_order_acquire) != 0;
}

const volatile std::uint32_t* FlagBarrier::release_word() const noexcept {
  return set_up_ ? stream_ops_->device_address(&segment_.gpu_area_header().released) : nullptr;
}

void FlagBarrier::wait(CUstream_st* stream, std::optional<std::chrono::milliseconds> timeout,
                       const Meet& meet, const char* what) {
  if (stream_ops_->capturing(stream, what)) {
    throw Error(capture_refusal(what));
  }
  if (!set_up_) {
    set_up(meet, what);
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
    {
      std::lock_guard lock(deadlines_mutex_);
      deadlines_.push_back({episode, *timeout, Clock::time_point::max()});
    }
    // The watchdog looks more often until this process's stream arrives (deadline_poll_ms).
    watchdog_.wake();
  }
  try {
    stream_ops_->enqueue(stream, new_stream ? std::span(ops_) : std::span(ops_).subspan(1), what);
  } catch (...) {
    if (timeout) {
      std::lock_guard lock(deadlines_mutex_);
      deadlines_.pop_back();
    }
    throw;
  }
  episode_ = episode;
  last_stream_ = stream_id;
  // seq_cst, with the watchdogs' loss mark (seq_cst) and their reads of `enqueued`: either a
  // watchdog that releases sees this episode, or this process sees the mark and releases.
  segment_.gpu_slot(me).enqueued.store(episode, std::memory_order_seq_cst);
  if (segment_.header().lost.value.load(std::memory_order_seq_cst) != 0) {
    release_streams();
  }
  if (relay_.running()) {
    relay_.post(timeout);
  }
}

void FlagBarrier::settle(std::optional<Clock::time_point> deadline, const char* what) {
  if (relay_.running()) {
    relay_.settle(deadline, what);
  }
}

void FlagBarrier::set_up(const Meet& meet, const char* what) {
  if (refused_) {
    std::rethrow_exception(refused_);  // the set-up failed: every later call fails as it did
  }
  // A device that cannot run flags mode (no stream memory operations, no host registration)
  // still comes to the set-up meet, marked refused, so that its peers fail there too, naming it,
  // instead of waiting for it without a deadline; it throws its own reason after the meet.
  GpuSlot& own = segment_.gpu_slot(segment_.my_slot());
  try {
    stream_ops_->map(segment_.gpu_area(), segment_.gpu_area_bytes(), what);
    // Release: a peer that reads the mark after the meet below sees this process set up.
    own.ready.store(kFlagsReady, std::memory_order_release);
  } catch (const Error&) {
    refused_ = std::current_exception();
    own.ready.store(kFlagsRefused, std::memory_order_release);
  }
  meet(std::nullopt);  // once: every process has mapped the area (or refused); never again
  if (refused_) {
    std::rethrow_exception(refused_);
  }
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    if (slot == segment_.my_slot()) {
      continue;
    }
    // Acquire: pairs with the peer's release above.
    if (std::uint32_t ready = segment_.gpu_slot(slot).ready.load(std::memory_order_acquire);
        ready != kFlagsReady) {
      refused_ = std::make_exception_ptr(Error(
          peer_form_error(what, segment_.slot(slot).rank.load(std::memory_order_relaxed), ready)));
      std::rethrow_exception(refused_);
    }
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
  watchdog_.start(
      "lockstep-gpu", [this] { watch(); }, what);
  if (relay_.given()) {
    try {
      relay_.start(what);
    } catch (...) {
      stop_watchdog();
      throw;
    }
  }
  set_up_ = true;
}

void FlagBarrier::watch() noexcept {
  const int me = segment_.my_slot();
  // Members, not locals: a forked child keeps this object (abandon) but not this thread's stack,
  // and a leak checker there must still find what they hold.
  std::vector<pollfd>& fds = watch_fds_;
  std::vector<bool>& gone = gone_;
  fds.assign(1, pollfd{watchdog_.wake_fd(), POLLIN, 0});
  watch_pids_.clear();
  // A pidfd names whichever process had the pid when it was opened: a peer that had already
  // died, its pid reused, would be watched through a stranger. Checked once by start time.
  bool stale_pidfd = false;
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    // Relaxed: written before the slot's owner joined, which this process saw complete.
    const pid_t pid = segment_.slot(slot).pid.load(std::memory_order_relaxed);
    if (slot != me) {
      if (UniqueFd fd(open_pidfd(pid)); fd) {
        fds.push_back({fd.get(), POLLIN, 0});
        watch_pids_.push_back(std::move(fd));
        stale_pidfd =
            stale_pidfd ||
            !still_runs(pid, segment_.slot(slot).start_time.load(std::memory_order_relaxed));
      }
    }
  }
  const bool every_peer_has_a_pidfd = static_cast<int>(fds.size()) == segment_.num_slots();
  gone.assign(static_cast<std::size_t>(segment_.num_slots()), false);
  bool failed = false;
  auto last_full_check = Clock::now();
  while (!watchdog_.stopping()) {
    const int wait_ms = !failed ? deadline_poll_ms() : (drained(gone) ? kDrainedMs : kReleaseMs);
    bool fired = std::exchange(stale_pidfd, false);
    if (::poll(fds.data(), fds.size(), wait_ms) > 0) {
      if (fds[0].revents != 0) {
        watchdog_.drain();  // a timed call's nudge (or the stop): read, so poll sleeps again
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].fd >= 0 && fds[i].revents != 0) {
          fired = true;  // that peer ended: check_peer below says how
          watch_pids_[i - 1].reset();
          fds[i].fd = -1;  // poll ignores it from now on
        }
      }
    }
    if (watchdog_.stopping()) {
      break;
    }
    const auto now = Clock::now();
    const bool full = fired || (!every_peer_has_a_pidfd && now - last_full_check >= kFullCheck);
    if (full) {
      last_full_check = now;
    }
    if (!failed) {
      failed = broken(gone, full);
      if (failed) {
        release_streams();
      }
    } else {
      if (full) {
        (void)broken(gone, true);  // keeps `gone` current: drained() waits for the living only
      }
      if (!drained(gone)) {
        release_streams();
      }
    }
  }
  watch_pids_.clear();
}

bool FlagBarrier::broken(std::vector<bool>& gone, bool full_check) noexcept {
  try {
    // Acquire: the mark's writer recorded the slot (and any failure record) before it.
    if (std::uint32_t word = segment_.header().lost.value.load(std::memory_order_acquire);
        word != 0) {
      if (const int slot = lost_slot(word);
          lost_how(word) != LostHow::elsewhere && slot >= 0 && slot < segment_.num_slots()) {
        gone[static_cast<std::size_t>(slot)] = true;
      }
      if (!full_check) {
        return true;
      }
    }
    // Relaxed: the count only says whether to look at the slots (check_peer reads each one's
    // status with acquire).
    const bool someone_left = segment_.header().left.value.load(std::memory_order_relaxed) != 0;
    if (someone_left || full_check) {
      bool found = false;
      // Every peer found gone (not only the first): drained() waits for the living alone.
      while (auto lost = segment_.find_lost(
                 [&gone](int slot) { return gone[static_cast<std::size_t>(slot)]; })) {
        gone[static_cast<std::size_t>(lost->slot)] = true;
        segment_.mark_lost(*lost);
        found = true;
      }
      if (found) {
        return true;
      }
    }
    return segment_.header().lost.value.load(std::memory_order_acquire) != 0 || check_deadline();
  } catch (...) {
    return false;  // a failed /proc read: looked at again next time
  }
}

int FlagBarrier::deadline_poll_ms() noexcept {
  std::lock_guard lock(deadlines_mutex_);
  if (deadlines_.empty()) {
    return kWatchMs;
  }
  if (deadlines_.back().at == Clock::time_point::max()) {
    return kStartMs;  // a deadline starts when this process's stream arrives: looked for often
  }
  auto earliest = Clock::time_point::max();
  for (const Deadline& deadline : deadlines_) {
    earliest = std::min(earliest, deadline.at);
  }
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(earliest - Clock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 1, kWatchMs));
}

bool FlagBarrier::check_deadline() noexcept {
  const int me = segment_.my_slot();
  std::unique_lock lock(deadlines_mutex_);
  // Acquire: the stream wrote them; nothing else is read through them.
  const std::uint64_t passed = segment_.gpu_flag(me).passed.load(std::memory_order_acquire);
  const std::uint64_t arrived = segment_.gpu_flag(me).arrived.load(std::memory_order_acquire);
  while (!deadlines_.empty() && !cyclic_before(passed, deadlines_.front().episode)) {
    deadlines_.pop_front();
  }
  const auto now = Clock::now();
  const Deadline* expired = nullptr;
  for (Deadline& deadline : deadlines_) {
    if (deadline.at == Clock::time_point::max()) {
      if (cyclic_before(arrived, deadline.episode)) {
        break;  // nor have the later ones: this process's flags grow in episode order
      }
      deadline.at = now + deadline.timeout;  // its clock starts: the peers are measured from here
    }
    if (now >= deadline.at && expired == nullptr) {
      expired = &deadline;
    }
  }
  if (expired == nullptr) {
    return false;
  }
  const Deadline late = *expired;
  lock.unlock();
  Failure failure;
  failure.kind = FailureKind::timeout;
  failure.missing = late_streams(segment_, late.episode);
  if (failure.missing.empty()) {
    if (across_nodes_) {
      // Every stream of this node has arrived: what is late is another node, which the
      // leader's relay bounds (its meet's deadline). Not looked at again.
      std::lock_guard relock(deadlines_mutex_);
      std::erase_if(deadlines_,
                    [&late](const Deadline& deadline) { return deadline.episode == late.episode; });
    }
    return false;  // on one node: every stream arrived a moment ago, and this one passes next
  }
  failure.message = streams_of(failure.missing) + " had not reached its stream barrier " +
                    std::to_string(late.episode) + " within " +
                    std::to_string(late.timeout.count()) + " ms of process " +
                    std::to_string(segment_.slot(me).rank.load(std::memory_order_relaxed)) +
                    "'s stream reaching it; every stream of the node was released";
  segment_.record_failure(failure);
  return true;
}

void FlagBarrier::release_streams() noexcept {
  // seq_cst: ordered with the callers' `enqueued` stores (see wait).
  segment_.gpu_area_header().released.store(1, std::memory_order_seq_cst);
  std::uint64_t top = 0;
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    const std::uint64_t enqueued = segment_.gpu_slot(slot).enqueued.load(std::memory_order_seq_cst);
    if (cyclic_before(top, enqueued)) {
      top = enqueued;
    }
  }
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    raise_to(segment_.gpu_flag(slot).arrived, top + kReleaseLead);
    fault_point("gpu.releasing");
  }
  if (across_nodes_) {
    raise_to(segment_.gpu_area_header().node_met, top + kReleaseLead);
  }
}

bool FlagBarrier::drained(const std::vector<bool>& gone) const noexcept {
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    // Acquire: written by the slot's owner and its stream; only compared.
    if (!gone[static_cast<std::size_t>(slot)] &&
        segment_.gpu_flag(slot).passed.load(std::memory_order_acquire) !=
            segment_.gpu_slot(slot).enqueued.load(std::memory_order_acquire)) {
      return false;
    }
  }
  return true;
}

}  // namespace lockstep::detail
