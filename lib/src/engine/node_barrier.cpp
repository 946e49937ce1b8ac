#include "engine/node_barrier.hpp"

#include <sched.h>

#include <array>
#include <vector>

#include "base/fault_points.hpp"
#include "base/proc.hpp"  // affinity, move_to_cpu
#include "base/text.hpp"  // comma_list
#include "engine/placement.hpp"
#include "lockstep/error.hpp"
#include "waiting/futex.hpp"

namespace lockstep::detail {

using Clock = std::chrono::steady_clock;

namespace {
// One wait in this many that may defer its entry is timed (two reads of the steady clock, ~25 ns
// each), and decides whether the next ones defer: those shorter than kShortWait (the two reads
// included) end as the peer's release comes between SMT siblings of one core (tens of ns);
// between separate cores it takes a cache-line transfer or two (0.1-0.3 us).
constexpr std::uint64_t kShortWaitSample = 256;
constexpr std::chrono::nanoseconds kShortWait{100};
}  // namespace

void NodeBarrier::check_intact(const char* what) {
  // Relaxed: the flag is only a fast refusal; recorded_lost re-reads it with acquire.
  if (segment_.header().lost.value.load(std::memory_order_relaxed) != 0) {
    throw_lost(*segment_.recorded_lost(), what);
  }
}

template <bool kTry>
bool NodeBarrier::arrive_and_wait_as(std::optional<Clock::time_point> deadline, const char* what,
                                     CallAt at) {
  SegmentHeader& header = segment_.header();
  check_intact(what);
  if (tokens_ == 1) {
    ++episode_;  // a job of one on one node
    return true;
  }
  if (kTry && hierarchical_) {
    return false;  // the leader's arrival cannot be taken back once it went to the others
  }
  if (segment_.num_slots() == 1) {
    recorder_.begin(recorder_.word(at), episode_);
    lead(0, deadline, what);  // the node's only process: nobody local to wait for
    recorder_.end(true);
    return true;
  }
  const std::uint64_t full = (episode_ + 1) * tokens_;
  // seq_cst (acq_rel and more): the release publishes this process's writes to every process
  // that later reads a count at or past `full` (all arrivals form one release sequence on the
  // counter); the single total order pairs the completer's arrival with a sleeper's increment
  // (see wake_sleepers).
  const std::uint64_t ticket = header.episode.arrivals.fetch_add(1, std::memory_order_seq_cst);
  // After the arrival, so that the site's look-up and the entry's stores delay no peer (see
  // begin_entry).
  const std::uint32_t call = recorder_.word(at);
  const bool completes = ticket + 1 == full;
  const bool deferrable = begin_entry(call, completes);
  fault_point("barrier.arrived");
  if (completes) {
    wake_sleepers();
    recorder_.end(false);
    passed(call, what);
    fault_point("barrier.passed");
    return true;
  }
  note_waiting(deadline);
  if (hierarchical_) {
    if (leader_) {
      lead(ticket, deadline, what);
      recorder_.end(true);
      checked(call, what);
      return true;
    }
    if (ticket + 2 == full) {
      wake_sleepers();  // the last local arrival: the leader may be asleep waiting for it
    }
  }
  fault_point("barrier.waiting");
  const std::uint64_t slow_waits = waiter_.stats().timed_waits;
  const Outcome outcome = wait_and_begin(full, deadline, what, !kTry, deferrable);
  if (outcome == Outcome::complete) {
    // A wait that ended in its quick spins ended within the coarse clock's tick of its arrival.
    recorder_.end(waiter_.stats().timed_waits != slow_waits);
    passed(call, what);
    fault_point("barrier.passed");
    return true;
  }
  return give_up_or_pass<kTry>(outcome, full, what, call);
}

[[gnu::always_inline]] inline bool NodeBarrier::begin_entry(std::uint32_t call,
                                                            bool completes) noexcept {
  const bool deferrable = !completes && !hierarchical_ && !checks(call);
  deferred_ = deferrable && short_waits_;
  if (deferred_) {
    deferred_call_ = call;
  } else {
    recorder_.begin(call, episode_, completes);
  }
  return deferrable;
}

[[gnu::always_inline]] inline NodeBarrier::Outcome NodeBarrier::wait_and_begin(
    std::uint64_t target, std::optional<Clock::time_point> deadline, const char* what,
    bool interruptible, bool deferrable) {
  const bool timed = deferrable && ++deferrable_waits_ % kShortWaitSample == 0;
  const Clock::time_point start = timed ? Clock::now() : Clock::time_point{};
  const Outcome outcome = wait(target, deadline, what, interruptible);
  if (timed) [[unlikely]] {
    short_waits_ = Clock::now() - start < kShortWait;
  }
  begin_deferred();
  return outcome;
}

[[gnu::always_inline]] inline void NodeBarrier::note_waiting(
    std::optional<Clock::time_point> deadline) noexcept {
  if (deadline) {
    // For throw_timeout, and only where this process waits: the completing arrival needs no
    // clock read. (A peer that withdraws in the moment between the arrival and this read is
    // named as missing; it had given up.)
    arrived_at_ = Clock::now().time_since_epoch().count();
  }
  // Relaxed: read only by peers' diagnostics (timeouts, lost peers), never for correctness.
  // Stored after the arrival so that a process that dies in between is never taken as arrived.
  Slot& me = segment_.slot(segment_.my_slot());
  me.arrived.store(episode_ + 1, std::memory_order_relaxed);
  if (waiter_.asks_where_peers_are()) {
    // Relaxed: a scheduling hint for the peers, never needed for correctness.
    me.cpu.store(::sched_getcpu(), std::memory_order_relaxed);
  }
}

template <bool kTry>
bool NodeBarrier::give_up_or_pass(Outcome outcome, std::uint64_t full, const char* what,
                                  std::uint32_t call) {
  // Timed out or interrupted: take the arrival back unless the episode completed meanwhile, or,
  // across nodes, the leader may already have counted it.
  if (withdraw(hierarchical_ ? full - 1 : full)) {
    if constexpr (kTry) {
      recorder_.end_as(CallEnd::tried);
      return false;
    } else {
      recorder_.end_as(outcome == Outcome::interrupted ? CallEnd::interrupted : CallEnd::timed_out);
      throw_gave_up(outcome, what);
    }
  }
  if (!reached(full)) {
    (void)wait(full, std::nullopt, what, false);  // committed: the leader's outcome decides
  }
  recorder_.end(true);
  passed(call, what);  // complete after all
  return true;
}

void NodeBarrier::arrive_and_wait(std::optional<Clock::time_point> deadline, const char* what,
                                  CallAt call) {
  (void)arrive_and_wait_as<false>(deadline, what, call);
}

bool NodeBarrier::try_arrive_and_wait(Clock::time_point deadline, const char* what, CallAt call) {
  return arrive_and_wait_as<true>(deadline, what, call);
}

void NodeBarrier::lead(std::uint64_t ticket, std::optional<Clock::time_point> deadline,
                       const char* what) {
  const std::uint64_t full = (episode_ + 1) * tokens_;
  if (segment_.num_slots() > 1 && ticket + 2 < full) {
    const Outcome outcome = wait(full - 1, deadline, what);
    if (outcome != Outcome::complete && withdraw(full - 1)) {
      throw_gave_up(outcome, what);  // the node's own processes are late: retrying is possible
    }
  }
  fault_point("lead.local");
  try {
    cross_.meet(deadline, what);
  } catch (const InterruptedError&) {
    // This node's arrival may already have reached the others: the job cannot go on, and every
    // process of every node is told who gave up.
    const int rank = segment_.slot(segment_.my_slot()).rank.load(std::memory_order_relaxed);
    const Failure failure{FailureKind::peer_lost,
                          rank,
                          {},
                          "process " + std::to_string(rank) +
                              " was interrupted by a signal while it waited for the other nodes"};
    segment_.record_failure(failure);
    cross_.abort(failure);
    throw;
  } catch (const Error& error) {
    // The other nodes' processes may already be through: this node's are told why not.
    segment_.record_failure(failure_of(error, what));
    throw;
  }
  fault_point("lead.met");
  if (segment_.num_slots() > 1) {
    // seq_cst, as an arrival: the release publishes everything the other nodes' leaders made
    // visible to this one (the backend's messages) to every process of the node.
    segment_.header().episode.arrivals.fetch_add(1, std::memory_order_seq_cst);
    wake_sleepers();
  }
  ++episode_;
}

void NodeBarrier::throw_gave_up(Outcome outcome, const char* what) {
  if (outcome == Outcome::interrupted) {
    throw InterruptedError(std::string(what) + ": interrupted by a signal");
  }
  throw_timeout(what);
}

bool NodeBarrier::withdraw(std::uint64_t limit) noexcept {
  auto& arrivals = segment_.header().episode.arrivals;
  std::uint64_t seen = arrivals.load(std::memory_order_relaxed);
  while (seen < limit) {
    // acq_rel on success keeps the withdrawal in the counter's single modification order.
    if (arrivals.compare_exchange_weak(seen, seen - 1, std::memory_order_acq_rel,
                                       std::memory_order_relaxed)) {
      // Withdrawn, not arrived: the liveness checks watch this process again, and the missing
      // lists of peers that arrive later name it. Release: a peer that reads the mark (acquire)
      // reads the time with it.
      Slot& me = segment_.slot(segment_.my_slot());
      me.withdrawn_at.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
      me.arrived.store((episode_ + 1) | kWithdrawn, std::memory_order_release);
      return true;
    }
  }
  return false;
}

void NodeBarrier::throw_timeout(const char* what) {
  std::vector<int> missing;
  std::vector<int> late;
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    if (slot == segment_.my_slot()) {
      continue;
    }
    // A peer that withdrew its arrival before this process arrived had not arrived; one that
    // withdrew later waited with this one (both time out now). Acquire: see withdraw().
    const Slot& peer = segment_.slot(slot);
    const std::uint64_t mark = peer.arrived.load(std::memory_order_acquire);
    const bool here =
        mark == episode_ + 1 || (mark == ((episode_ + 1) | kWithdrawn) &&
                                 peer.withdrawn_at.load(std::memory_order_relaxed) >= arrived_at_);
    if (!here) {
      missing.push_back(peer.rank.load(std::memory_order_relaxed));
      late.push_back(slot);
    }
  }
  std::string message =
      std::string(what) + ": timed out: " + (missing.size() == 1 ? "process " : "processes ") +
      comma_list(missing) + " of " + std::to_string(segment_.header().world_size) +
      " had not arrived" + whereabouts(late);
  throw TimeoutError(message, std::move(missing));
}

bool NodeBarrier::came(int slot) const noexcept {
  // Relaxed: the mark is a diagnostic and a hint, never needed for correctness.
  return (segment_.slot(slot).arrived.load(std::memory_order_relaxed) & ~kWithdrawn) ==
         episode_ + 1;
}

bool NodeBarrier::late_peer_here() const noexcept {
  const int here = ::sched_getcpu();
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    if (slot != segment_.my_slot() && !came(slot)) {
      // Relaxed: a hint (see Slot::cpu).
      int cpu = segment_.slot(slot).cpu.load(std::memory_order_relaxed);
      if (cpu == here || cpu < 0) {
        return true;
      }
    }
  }
  return false;
}

void NodeBarrier::spread() noexcept {
  const int here = ::sched_getcpu();
  if (here < 0 || here >= kMaxCpus) {
    return;
  }
  std::array<std::uint16_t, kMaxCpus> on{};
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    // Relaxed: a hint (see Slot::cpu); this process's own is where it runs now.
    const int cpu =
        slot == segment_.my_slot() ? here : segment_.slot(slot).cpu.load(std::memory_order_relaxed);
    if (cpu == here && slot > segment_.my_slot()) {
      return;  // a higher slot on this CPU moves first
    }
    if (cpu >= 0 && cpu < kMaxCpus) {
      ++on[static_cast<std::size_t>(cpu)];
    }
  }
  const int target = emptier_cpu(on, here, affinity());
  if (target >= 0 && move_to_cpu(target)) {
    segment_.slot(segment_.my_slot()).cpu.store(target, std::memory_order_relaxed);
    ++moves_;
  }
}

bool NodeBarrier::reached(std::uint64_t target) const noexcept {
  // Acquire: reading a count at or past the episode's end synchronizes with every arrival of
  // the episode.
  return segment_.header().episode.arrivals.load(std::memory_order_acquire) >= target;
}

void NodeBarrier::wake_sleepers() noexcept {
  SegmentHeader& header = segment_.header();
  // seq_cst, after the completing seq_cst arrival: either this sees a sleeper's increment, or
  // that sleeper's seq_cst re-read of the counter (after its increment) sees the episode
  // complete and does not sleep. With nobody asleep, completing an episode is the arrival
  // alone: one atomic read-modify-write.
  if (header.sleepers.value.load(std::memory_order_seq_cst) != 0) {
    // Any new value wakes a futex_wait on the old one; the sleeper then reads the counter. An
    // increment, as every change to the word (see NodeSegment::wake_waiters).
    header.episode.generation.fetch_add(1, std::memory_order_release);
    futex_wake_all(header.episode.generation);
  }
}

// The node barrier as a place to wait: done when the count reaches `target`.
class NodeBarrier::Site : public WaitSite {
 public:
  Site(NodeBarrier& barrier, std::uint64_t target, const char* what) noexcept
      : barrier_(barrier), target_(target), what_(what) {}
  [[nodiscard]] bool done() const noexcept {
    if (barrier_.claims_line_) {
      claim_line(&barrier_.segment_.header().episode.arrivals);
    }
    return barrier_.reached(target_);
  }
  void block(std::chrono::nanoseconds limit) noexcept {
    barrier_.sleep(target_, limit, stall_, !heard_);
  }
  [[nodiscard]] bool check() { return barrier_.check_peers(target_, what_); }
  [[nodiscard]] bool late_peer_here() const noexcept { return barrier_.late_peer_here(); }
  void staying() noexcept { barrier_.begin_deferred(); }
  void spread() noexcept { barrier_.spread(); }
  // A lost peer wakes this site's sleepers (the watch), so they need no periodic check.
  [[nodiscard]] bool watched() const noexcept { return barrier_.watched(); }
  // Once true, true for the rest of the wait (the alarm stays raised).
  [[nodiscard]] bool alarmed() const noexcept {
    heard_ = heard_ || barrier_.alarmed();
    return heard_;
  }
  void wake_me_at(std::chrono::steady_clock::time_point when) noexcept { stall_ = when; }
  void stalled(std::chrono::nanoseconds waited) const noexcept {
    barrier_.report_stall(what_, waited);
  }

 private:
  NodeBarrier& barrier_;
  std::uint64_t target_;
  const char* what_;
  std::chrono::steady_clock::time_point stall_ = std::chrono::steady_clock::time_point::max();
  mutable bool heard_ = false;  // the waiter was told of the alarm (alarmed() returned true)
};

NodeBarrier::Outcome NodeBarrier::wait(std::uint64_t target,
                                       std::optional<Clock::time_point> deadline, const char* what,
                                       bool interruptible) {
  Site site(*this, target, what);
  switch (waiter_.wait(site, deadline, kPollInterval, interruptible)) {
    case Waiter::End::done:
      return Outcome::complete;
    case Waiter::End::timed_out:
      return Outcome::timed_out;
    case Waiter::End::interrupted:
      break;
  }
  return Outcome::interrupted;
}

bool NodeBarrier::quiet() const noexcept {
  const SegmentHeader& header = segment_.header();
  // seq_cst: after the futex word's read, as NodeSegment::wake_waiters orders its writes.
  return watched() && header.lost.value.load(std::memory_order_seq_cst) == 0 &&
         header.left.value.load(std::memory_order_seq_cst) == 0;
}

void NodeBarrier::sleep(std::uint64_t target, std::chrono::nanoseconds limit,
                        std::chrono::steady_clock::time_point stall, bool unheard) noexcept {
  SegmentHeader& header = segment_.header();
  Slot& me = segment_.slot(segment_.my_slot());
  // Read the futex word before announcing the sleep: a completer that sees the announcement
  // changes the word, so the futex call below cannot miss it. The same for whatever else must
  // end an untimed sleep (quiet(): a peer left, lost or exited): its writer changes the word
  // after it (NodeSegment::wake_waiters).
  const std::uint32_t seen = header.episode.generation.load(std::memory_order_acquire);
  // Relaxed: a hint for the peers' load samples (peers_asleep), never needed for correctness.
  me.asleep_until.store(target, std::memory_order_relaxed);
  header.sleepers.value.fetch_add(1, std::memory_order_seq_cst);
  // An alarm the waiter has not heard of may have woken the node's sleepers just before the word
  // was read (after the waiter last asked): then nothing wakes this sleep but its limit, up to
  // kPollInterval for a timed wait (a lost peer noticed 0.1 s late, seen from Python under load).
  // The word's read (acquire) orders the alarm's marks before this look.
  if (header.episode.arrivals.load(std::memory_order_seq_cst) < target && !(unheard && alarmed())) {
    const bool untimed = limit == std::chrono::nanoseconds::max() && quiet();
    if (untimed) {
      watch_->wake_me_at(stall);
    } else {
      limit = std::min<std::chrono::nanoseconds>(limit, kPollInterval);
    }
    futex_wait(header.episode.generation, seen, limit);
    if (untimed) {
      watch_->clear_wake();
    }
  }
  // Relaxed: the count only decides whether a completer calls futex_wake; a stale high value
  // costs one needless wake.
  header.sleepers.value.fetch_sub(1, std::memory_order_relaxed);
  me.asleep_until.store(0, std::memory_order_relaxed);  // relaxed: the same hint
}

int NodeBarrier::peers_asleep() const noexcept {
  // Relaxed throughout: a hint, read a few times per millisecond at most.
  const std::uint64_t count = segment_.header().episode.arrivals.load(std::memory_order_relaxed);
  int asleep = 0;
  for (int slot = 0; slot < segment_.num_slots(); ++slot) {
    if (slot != segment_.my_slot() &&
        segment_.slot(slot).asleep_until.load(std::memory_order_relaxed) > count) {
      ++asleep;
    }
  }
  return asleep;
}

void NodeBarrier::report_stall(const char* what, std::chrono::nanoseconds waited) const noexcept {
  try {
    std::vector<int> late;
    for (int slot = 0; slot < segment_.num_slots(); ++slot) {
      if (slot != segment_.my_slot() && !came(slot)) {
        late.push_back(slot);
      }
    }
    segment_.report_stall(what, waited, late,
                          leader_ ? "the other machines (this machine's processes have all arrived)"
                                  : "this machine's main process to come back from the other "
                                    "machines (this machine's processes have all arrived)",
                          whereabouts(late));
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory for a diagnostic
  }
}

void NodeBarrier::check_met(std::uint64_t episode, const char* what) {
  if (const auto same_call = Whereabouts(segment_).met_apart_in(episode, strict_)) {
    throw_met_apart(episode, *same_call, what);
  }
}

void NodeBarrier::throw_met_apart(std::uint64_t episode, bool same_call, const char* what) {
  const std::string message = Whereabouts(segment_).met_apart(episode, same_call);
  // The job cannot go on: a process that passed this episode without checking it (a plain
  // wait) gets the error at its next call.
  const int rank = segment_.slot(segment_.my_slot()).rank.load(std::memory_order_relaxed);
  const Failure failure{FailureKind::error, rank, {}, message};
  segment_.record_failure(failure);
  if (cross_.abort) {
    cross_.abort(failure);  // the other nodes cannot go on either
  }
  throw Error(std::string(what) + ": " + message);
}

bool NodeBarrier::check_peers(std::uint64_t target, const char* what) {
  auto lost = segment_.recorded_lost();
  if (!lost) {
    lost = segment_.find_lost([&](int slot) {
      // Across nodes the leader owes the release even after it arrived.
      return segment_.slot(slot).arrived.load(std::memory_order_relaxed) == episode_ + 1 &&
             !(hierarchical_ && slot == segment_.leader_slot());
    });
  }
  if (!lost) {
    return false;
  }
  // The last arrival may have completed the episode, and its process left or died, after this
  // process last looked: a peer is lost only if the episode is still incomplete.
  if (reached(target)) {
    return true;
  }
  throw_lost(segment_.mark_lost(*lost), what);
}

void NodeBarrier::throw_lost(const LostPeer& peer, const char* what) {
  if (peer.how == LostHow::elsewhere) {
    if (peer.slot == segment_.my_slot()) {
      // This process is the leader that gave up: its own record, as the backend threw it.
      throw_failure(segment_.recorded_failure(), std::string(what) + ": the job cannot go on: ");
    }
    // The leader on a cross-node failure, or any process whose GPU barrier timed out.
    const bool leader = peer.slot == segment_.leader_slot();
    throw_failure(segment_.recorded_failure(), std::string(what) +
                                                   (leader ? ": the node's main process, " : ": ") +
                                                   segment_.describe(peer.slot) + ", gave up: ");
  }
  std::uint64_t arrived = segment_.header().episode.arrivals.load(std::memory_order_relaxed);
  std::uint64_t waiting = arrived > episode_ * tokens_ ? arrived - episode_ * tokens_ : 0;
  const std::string message = Whereabouts(segment_).lost(episode_, peer, waiting);
  const int rank = segment_.slot(peer.slot).rank.load(std::memory_order_relaxed);
  if (cross_.abort) {
    // The other nodes cannot go on without this one.
    cross_.abort(Failure{FailureKind::peer_lost, rank, {}, message});
  }
  throw PeerLostError(std::string(what) + ": " + message, rank);
}

}  // namespace lockstep::detail
