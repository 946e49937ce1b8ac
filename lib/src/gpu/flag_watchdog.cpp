#include "gpu/flag_watchdog.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

#include "base/fault_points.hpp"
#include "base/proc.hpp"
#include "engine/segment.hpp"
#include "gpu/flag_barrier.hpp"  // cyclic_before
#include "gpu/flag_relay.hpp"    // raise_to, late_streams, streams_of

namespace lockstep::detail {
namespace {

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

void FlagWatchdog::start(const char* what) {
  thread_.start(
      "lockstep-gpu", [this] { watch(); }, what);
}

void FlagWatchdog::add_deadline(std::uint64_t episode, std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(deadlines_mutex_);
    deadlines_.push_back({episode, timeout, Clock::time_point::max()});
  }
  // The watchdog looks more often until this process's stream arrives (deadline_poll_ms).
  thread_.wake();
}

void FlagWatchdog::drop_last_deadline() noexcept {
  std::lock_guard lock(deadlines_mutex_);
  deadlines_.pop_back();
}

bool FlagWatchdog::open_peer_pidfds() noexcept {
  const int me = segment_.my_slot();
  fds_.assign(1, pollfd{thread_.wake_fd(), POLLIN, 0});
  pids_.clear();
  // A pidfd names whichever process had the pid when it was opened: a peer that had already
  // died, its pid reused, would be watched through a stranger. Checked once by start time.
  bool stale_pidfd = false;
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    // Relaxed: written before the slot's owner joined, which this process saw complete.
    const pid_t pid = segment_.slot(slot).pid.load(std::memory_order_relaxed);
    if (slot != me) {
      if (UniqueFd fd(open_pidfd(pid)); fd) {
        fds_.push_back({fd.get(), POLLIN, 0});
        pids_.push_back(std::move(fd));
        stale_pidfd =
            stale_pidfd ||
            !still_runs(pid, segment_.slot(slot).start_time.load(std::memory_order_relaxed));
      }
    }
  }
  return stale_pidfd;
}

void FlagWatchdog::watch() noexcept {
  // Members, not locals: a forked child keeps this object (abandon) but not this thread's stack,
  // and a leak checker there must still find what they hold.
  std::vector<pollfd>& fds = fds_;
  std::vector<bool>& gone = gone_;
  bool stale_pidfd = open_peer_pidfds();
  const bool every_peer_has_a_pidfd = static_cast<int>(fds.size()) == segment_.num_slots();
  gone.assign(static_cast<std::size_t>(segment_.num_slots()), false);
  bool failed = false;
  auto last_full_check = Clock::now();
  while (!thread_.stopping()) {
    const int wait_ms = !failed ? deadline_poll_ms() : (drained(gone) ? kDrainedMs : kReleaseMs);
    bool fired = std::exchange(stale_pidfd, false);
    if (::poll(fds.data(), fds.size(), wait_ms) > 0) {
      if (fds[0].revents != 0) {
        thread_.drain();  // a timed call's nudge (or the stop): read, so poll sleeps again
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].fd >= 0 && fds[i].revents != 0) {
          fired = true;  // that peer ended: check_peer below says how
          pids_[i - 1].reset();
          fds[i].fd = -1;  // poll ignores it from now on
        }
      }
    }
    if (thread_.stopping()) {
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
  pids_.clear();
}

bool FlagWatchdog::broken(std::vector<bool>& gone, bool full_check) noexcept {
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

int FlagWatchdog::deadline_poll_ms() noexcept {
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

bool FlagWatchdog::check_deadline() noexcept {
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

void FlagWatchdog::release_streams() noexcept {
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

bool FlagWatchdog::drained(const std::vector<bool>& gone) const noexcept {
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    if (!gone[static_cast<std::size_t>(slot)] && !segment_.stream_drained(slot)) {
      return false;
    }
  }
  return true;
}

}  // namespace lockstep::detail
