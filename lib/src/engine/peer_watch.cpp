#include "engine/peer_watch.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/proc.hpp"
#include "waiting/futex.hpp"
#include "waiting/wait_controls.hpp"

namespace lockstep::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::int64_t ticks(Clock::time_point when) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count();
}

}  // namespace

std::unique_ptr<PeerWatch> PeerWatch::start(NodeSegment& segment) noexcept {
  if (segment.num_slots() < 2) {
    return nullptr;
  }
  std::vector<UniqueFd> pidfds;
  bool gone = false;  // a peer exited before it could be watched
  try {
    pidfds.reserve(static_cast<std::size_t>(segment.num_slots()) - 1);
  } catch (...) {
    return nullptr;
  }
  for (int slot = 0; slot < segment.num_slots(); ++slot) {
    if (slot == segment.my_slot()) {
      continue;
    }
    // Relaxed: the slot's fields were published by its status, which the rendezvous read.
    const Slot& peer = segment.slot(slot);
    const auto pid = static_cast<pid_t>(peer.pid.load(std::memory_order_relaxed));
    UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!fd) {
      if (errno == ESRCH) {
        gone = true;  // exited already: the waits poll, and find it
        continue;
      }
      return nullptr;  // no pidfds here (ENOSYS, EPERM): the waits poll
    }
    // The descriptor names the process that had the pid when it was opened; if the slot's
    // process (pid and start time) runs after that, it is the one.
    try {
      if (process_liveness(pid, peer.start_time.load(std::memory_order_relaxed)) !=
          Liveness::alive) {
        gone = true;
      }
    } catch (...) {
      gone = true;
    }
    pidfds.push_back(std::move(fd));  // reserved: cannot throw
  }
  std::unique_ptr<PeerWatch> watch(new (std::nothrow) PeerWatch(segment, std::move(pidfds)));
  if (!watch) {
    return nullptr;
  }
  if (gone) {
    watch->alarm_.store(true, std::memory_order_seq_cst);
    return watch;  // no thread: the waits poll from the start
  }
  try {
    watch->thread_.start(
        "lockstep-watch", [raw = watch.get()] { raw->run(); },
        "lockstep: watching the node's processes");
  } catch (...) {
    watch->alarm_.store(true, std::memory_order_seq_cst);  // no thread: the waits poll
  }
  return watch;
}

PeerWatch::PeerWatch(NodeSegment& segment, std::vector<UniqueFd> pidfds) noexcept
    : segment_(segment), pidfds_(std::move(pidfds)) {}

void PeerWatch::stop() noexcept {
  thread_.stop();
}

PeerWatch::~PeerWatch() {
  stop();
}

void PeerWatch::wake_me_at(Clock::time_point when) noexcept {
  // Relaxed: the thread reads it a few times per stall interval; a late read costs one period.
  wake_at_.store(when == Clock::time_point::max() ? 0 : std::max<std::int64_t>(1, ticks(when)),
                 std::memory_order_relaxed);
}

void PeerWatch::raise(bool exited) noexcept {
  exited_.store(exited, std::memory_order_relaxed);
  alarm_.store(true, std::memory_order_seq_cst);  // before the word changes: see alarmed()
  segment_.wake_waiters();
}

void PeerWatch::run() noexcept {
  std::vector<pollfd> entries;
  try {
    entries.push_back(pollfd{thread_.wake_fd(), POLLIN, 0});
    for (const UniqueFd& fd : pidfds_) {
      entries.push_back(pollfd{fd.get(), POLLIN, 0});
    }
  } catch (...) {
    raise();  // cannot watch: the waits poll
    return;
  }
  std::int64_t woke_for = 0;  // the due time last woken for: again only at the next look
  for (;;) {
    // A look every 1/16 of the stall interval (10 ms to 1 s), and at the due time of a sleeper
    // seen asleep: a stall line comes at most one look late, usually on time. With no stall
    // warning the thread sleeps until an exit.
    const auto stall = std::chrono::duration_cast<std::chrono::milliseconds>(stall_warning());
    std::int64_t period =
        stall.count() > 0 ? std::clamp<std::int64_t>(stall.count() / 16, 10, 1000) : -1;
    if (const std::int64_t due = wake_at_.load(std::memory_order_relaxed);
        due != 0 && due != woke_for) {
      const std::int64_t until_ms =
          std::max<std::int64_t>(0, (due - ticks(Clock::now())) / 1'000'000 + 1);
      period = period < 0 ? until_ms : std::min(period, until_ms);
    }
    const int ready = ::poll(entries.data(), entries.size(), static_cast<int>(period));
    if (ready < 0) {
      if (errno == EINTR) {
        continue;
      }
      raise();
      return;
    }
    if (entries[0].revents != 0) {
      return;  // stopped: the process leaves the job
    }
    for (std::size_t i = 1; i < entries.size(); ++i) {
      if (entries[i].revents != 0) {
        raise(true);  // a peer exited: every wait of this process polls from now on
        return;
      }
    }
    const std::int64_t due = wake_at_.load(std::memory_order_relaxed);
    if (due != 0 && ticks(Clock::now()) >= due) {
      // The sleeper says its stall line and sleeps again (it clears or moves the time); a wake
      // that finds it not yet asleep is repeated at the next look.
      futex_wake_all(segment_.header().episode.generation);
      woke_for = due;
    }
  }
}

}  // namespace lockstep::detail
