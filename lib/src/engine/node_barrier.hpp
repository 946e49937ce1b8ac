// The node barrier: a centralized, monotonic counter in the node segment (internal).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "base/failure_record.hpp"
#include "engine/call_log.hpp"
#include "engine/peer_watch.hpp"
#include "engine/segment.hpp"
#include "engine/whereabouts.hpp"
#include "waiting/line_claim.hpp"
#include "waiting/waiter.hpp"

namespace lockstep::detail {

// The node leader's step across nodes in a multi-node job (see NodeBarrier::lead): the node
// engine knows no backend, only these two calls, which the context makes from its backend.
struct CrossNodeStep {
  // Meets the other nodes' leaders; throws (and the job is broken for good) as Backend::barrier.
  std::function<void(std::optional<std::chrono::steady_clock::time_point>, const char*)> meet;
  // Tells the other nodes' leaders that this node cannot go on; never throws.
  std::function<void(const Failure&)> abort;
};

// Each process counts its own episodes. Arriving is one fetch_add on the shared `arrivals`
// counter, and episode e is complete once the counter reaches (e + 1) * n: waiters spin on the
// counter itself, so the completing arrival publishes the episode by arriving. Only when a
// waiter sleeps does the completer also change `generation` (the futex word) and wake it.
// Nothing is ever reset, so there is no reset race, and a timed-out process can withdraw its
// arrival with a CAS as long as the episode is not complete.
//
// Hierarchical (multi-node) jobs keep this shape with one more arrival per episode, the
// release: episode e completes at (e + 1) * (n + 1). The node's leader arrives, waits for the
// count to reach (e + 1) * (n + 1) - 1 (every local process is in), meets the other nodes'
// leaders through the backend, then adds the release, which completes the episode for everyone.
// A local process may withdraw on a timeout only while the count is below that mark, so once the
// leader has gone to the other nodes, no arrival it counted on can be taken back.
class NodeBarrier {
 public:
  // `waiter`: how this process waits (it outlives the barrier).
  // `cross`: the leader's step across nodes, for the node's leader in a multi-node job (else
  // empty). `hierarchical`: whether the job spans nodes (true on every process of such a job).
  // `watch`: this process's watch of its peers (it outlives the barrier), if it has one: then a
  // wait without a deadline sleeps without a timeout until the watch raises its alarm.
  NodeBarrier(NodeSegment& segment, Waiter& waiter, CrossNodeStep cross, bool hierarchical,
              PeerWatch* watch = nullptr) noexcept
      : segment_(segment),
        waiter_(waiter),
        cross_(std::move(cross)),
        watch_(watch),
        hierarchical_(hierarchical),
        leader_(segment.my_slot() == segment.leader_slot()),
        tokens_(static_cast<std::uint64_t>(segment.num_slots()) + (hierarchical ? 1 : 0)),
        claims_line_(!hierarchical && segment.num_slots() == 2 && can_claim_lines()),
        recorder_(segment.call_log(segment.my_slot())) {}

  // Arrives and waits until all the node's processes have arrived at this episode.
  // Throws TimeoutError (arrival withdrawn) when `deadline` passes first, PeerLostError when a
  // process that has not arrived dies or leaves. `what` names the caller in messages.
  // Memory ordering: every write before any process's arrival happens-before every read after
  // any process's return.
  // `call`: what and where the call is (CallAt), recorded in this process's call log after the
  // arrival, for the peers' messages and lockstep-run --status; a site's word is made then too.
  void arrive_and_wait(std::optional<std::chrono::steady_clock::time_point> deadline,
                       const char* what, CallAt call = {});

  // One node only: arrives and waits until `deadline`, never interrupted (the interrupt
  // descriptor is not read); true once the episode is complete (as arrive_and_wait), false if it
  // was not by then, with this process's arrival withdrawn: nothing happened. In a hierarchical
  // job false at once, without arriving (the leader's arrival there cannot be taken back).
  // Throws PeerLostError as arrive_and_wait does.
  bool try_arrive_and_wait(std::chrono::steady_clock::time_point deadline, const char* what,
                           CallAt call = {});

  // This process's call log: the words of its calls, and the end of one that failed.
  [[nodiscard]] CallRecorder& recorder() noexcept { return recorder_; }
  // Every process of the node's flight record (its last calls), a line each: for the log of a
  // failed call (LOCKSTEP_LOG).
  [[nodiscard]] std::vector<std::string> flight_record() const {
    return Whereabouts(segment_).flight_record();
  }
  // LOCKSTEP_CHECK=strict: every episode checks that its processes came from one place of one
  // call (else only the calls other than a plain wait check that they met the same call).
  void check_strictly(bool strict) noexcept { strict_ = strict; }
  // Whether a plain wait's entry is deferred (begin_deferred): as its timed waits decide (one in
  // kShortWaitSample); set here by tests.
  [[nodiscard]] bool defers_entries() const noexcept { return short_waits_; }
  void defer_entries(bool defer) noexcept { short_waits_ = defer; }

  [[nodiscard]] std::uint64_t episode() const noexcept { return episode_; }
  // Throws what arrive_and_wait would throw at once: the job on this node is broken (a peer
  // lost, or the leader gave up on a cross-node barrier).
  void check_intact(const char* what);

  // How many of the node's other processes sleep in a barrier wait now (a hint for the waiter's
  // load samples: an episode that is complete counts its sleepers as woken).
  [[nodiscard]] int peers_asleep() const noexcept;

  // Evens out where the node's processes run (WaitSite::spread: more of them than CPUs, an idle
  // machine, once per load sample at most): where this process's CPU holds at least two more of
  // them than another CPU it may run on, and it is the highest slot there (so that one process
  // of a crowded CPU moves at a time), it moves there (move_to_cpu: its affinity mask stays as
  // it was). Each process more on a CPU costs every episode one more context switch, and the
  // kernel leaves a crowd where it is: its balancer keeps a task that ran in the last 0.5 ms on
  // its CPU, and a waiter that yields runs every few microseconds. Counts the moves (moves()).
  void spread() noexcept;
  [[nodiscard]] std::uint64_t moves() const noexcept { return moves_; }

 private:
  enum class Outcome { complete, timed_out, interrupted };
  class Site;
  // arrive_and_wait (kTry false: returns true or throws) and try_arrive_and_wait (kTry true).
  template <bool kTry>
  bool arrive_and_wait_as(std::optional<std::chrono::steady_clock::time_point> deadline,
                          const char* what, CallAt at);
  // After the arrival: begins this call's entry (`call`), or, for a waiter whose recent waits
  // were short, defers it (see begin_deferred): a completer's peers are on their way out, and a
  // waiter writes its entry while the release travels. The completer reads no clock: its time
  // is the episode's end, which the waiters record (CallRecorder::begin). Returns whether the
  // entry could be deferred (a plain wait's on one node, unchecked).
  bool begin_entry(std::uint32_t call, bool completes) noexcept;
  // wait(), then the deferred entry's writing; the wait is timed where `deferrable` and its turn
  // has come (one in kShortWaitSample), and its length decides whether the next ones defer.
  Outcome wait_and_begin(std::uint64_t target,
                         std::optional<std::chrono::steady_clock::time_point> deadline,
                         const char* what, bool interruptible, bool deferrable);
  // After an arrival that waits: says so in this process's slot, for the peers' diagnostics and
  // scheduling hints (and keeps when, for throw_timeout, where a deadline is set).
  void note_waiting(std::optional<std::chrono::steady_clock::time_point> deadline) noexcept;
  // After a wait for episode `full` that ended without it (`outcome`): gives up (kTry: returns
  // false; else throws) or, when the arrival cannot be taken back, passes after all.
  template <bool kTry>
  bool give_up_or_pass(Outcome outcome, std::uint64_t full, const char* what, std::uint32_t call);
  // Waits until the arrival count reaches `target` (a committed wait, not `interruptible`, ends
  // only there or by throwing).
  Outcome wait(std::uint64_t target, std::optional<std::chrono::steady_clock::time_point> deadline,
               const char* what, bool interruptible = true);
  [[nodiscard]] bool reached(std::uint64_t target) const noexcept;
  // Takes this process's arrival back while the count is below `limit`; false if it is not.
  [[gnu::noinline]] bool withdraw(std::uint64_t limit) noexcept;
  [[noreturn, gnu::noinline]] void throw_timeout(const char* what);
  // Throws TimeoutError or InterruptedError for a wait that ended so (after its withdrawal).
  [[noreturn, gnu::noinline]] void throw_gave_up(Outcome outcome, const char* what);
  // The leader's part of a hierarchical episode, after its own arrival (`ticket`).
  [[gnu::noinline]] void lead(std::uint64_t ticket,
                              std::optional<std::chrono::steady_clock::time_point> deadline,
                              const char* what);
  // Whether `slot` has arrived at the current episode (or arrived and withdrew on a timeout).
  [[nodiscard]] bool came(int slot) const noexcept;
  // Whether a peer that has not arrived was last seen on this process's CPU.
  [[nodiscard]] bool late_peer_here() const noexcept;
  // Sleeps on the futex until the count may have reached `target`, at most `limit`
  // (nanoseconds::max(): until woken, if the watch is quiet, and then to be woken at `stall`;
  // else kPollInterval). `unheard`: the waiter has not yet been told of an alarm (alarmed()),
  // so one raised now returns at once instead of sleeping.
  void sleep(std::uint64_t target, std::chrono::nanoseconds limit,
             std::chrono::steady_clock::time_point stall, bool unheard) noexcept;
  // Whether this process's watch would wake a sleeper that a lost peer leaves waiting: there is
  // one, and it has not raised its alarm.
  [[nodiscard]] bool watched() const noexcept { return watch_ != nullptr && !watch_->alarmed(); }
  // Whether a wait should look for a lost peer at once (WaitSite::alarmed): this process's watch
  // saw a peer exit, or a peer left or was recorded lost. Relaxed: a hint; check_peers decides.
  [[nodiscard]] bool alarmed() const noexcept {
    const SegmentHeader& header = segment_.header();
    return (watch_ != nullptr && watch_->saw_an_exit()) ||
           header.lost.value.load(std::memory_order_relaxed) != 0 ||
           header.left.value.load(std::memory_order_relaxed) != 0;
  }
  // Whether a sleeper may sleep until woken: watched(), and nobody has left or been lost (read
  // after the futex word: see NodeSegment::wake_waiters).
  [[nodiscard]] bool quiet() const noexcept;
  // Called by the arrival that completed episode_ + 1: wakes the processes asleep on it.
  void wake_sleepers() noexcept;
  [[noreturn, gnu::noinline]] void throw_lost(const LostPeer& peer, const char* what);
  // Throws PeerLostError if a peer that has not arrived is gone; returns true if the count
  // reached `target` meanwhile.
  [[nodiscard]] bool check_peers(std::uint64_t target, const char* what);
  // The stall line of a wait that lasts (the site's stalled(): who has not arrived, and where
  // everyone is).
  void report_stall(const char* what, std::chrono::nanoseconds waited) const noexcept;
  // Where the node's processes are, for a message about this episode (Whereabouts::around).
  [[nodiscard]] std::string whereabouts(const std::vector<int>& late, int lost = -1) const {
    return Whereabouts(segment_).around(episode_, late, lost);
  }
  // After episode_ completed: ++episode_, and, where this call checks (see check_strictly), the
  // check that the processes met from one call.
  void passed(std::uint32_t call, const char* what) {
    ++episode_;
    checked(call, what);
  }
  void checked(std::uint32_t call, const char* what) {
    if (checks(call)) [[unlikely]] {
      check_met(episode_ - 1, what);
    }
  }
  // Whether this call's episode is checked (check_met): every one with strict_, else the calls
  // other than a plain wait.
  [[nodiscard]] bool checks(std::uint32_t call) const noexcept {
    return strict_ || call_kind(call) > CallKind::wait;
  }
  // A waiter's entry, deferred (deferred_, where its recent waits were short: short_waits_):
  // written once its first polls found the episode open (the wait's Site::staying, before it
  // spins on, yields or sleeps), or else after its wait. On SMT siblings of one core the peer's
  // release comes within tens of ns, and the entry's stores and clock read before the first poll
  // delayed it: they cost an idle episode at N = 2 13-17% against a build that records nothing;
  // after the wait, within 2%. Between separate cores the release takes a cache-line transfer,
  // and the entry is written while it travels, at no cost seen; after the wait, where the
  // process's next arrival waits for it, it cost 6.4%. A plain wait's only: an episode that is
  // checked reads every process's entry (checks), and a hierarchical one goes to the leader's
  // step.
  void begin_deferred() noexcept {
    if (deferred_) {
      deferred_ = false;
      recorder_.begin(deferred_call_, episode_);
    }
  }
  // Throws Error, the job broken on the node, when the processes' calls of `episode` (each
  // wrote its own just after its arrival, or a plain wait that ended at once just after its
  // wait: waited for 0.1 s at most) are of different calls, or with strict_, at different places
  // of one.
  [[gnu::noinline]] void check_met(std::uint64_t episode, const char* what);
  // check_met's error, naming each process's call and place in `episode`.
  [[noreturn]] void throw_met_apart(std::uint64_t episode, bool same_call, const char* what);

  NodeSegment& segment_;
  Waiter& waiter_;
  CrossNodeStep cross_;
  PeerWatch* watch_;
  bool hierarchical_;
  bool leader_;
  std::uint64_t tokens_;  // arrivals per episode: the node's processes (+ the release)
  // Whether a waiter's polls claim the counter's line (claim_line): two processes, one node.
  // There the one who waits is the one whose arrival completes the next episode, and a claimed
  // line comes writable: an episode costs one line transfer, not a read's and then a write's.
  // With more, each poll would take the line from the other waiters' polls and from arrivals.
  bool claims_line_;
  std::uint64_t episode_ = 0;  // episodes this process has completed
  CallRecorder recorder_;
  bool strict_ = false;
  bool deferred_ = false;               // this call's entry is not written yet (begin_deferred)
  std::uint32_t deferred_call_ = 0;     // its word
  bool short_waits_ = false;            // the last timed wait was short: entries are deferred
  std::uint64_t deferrable_waits_ = 0;  // waits whose entry could be deferred (one in 256 timed)
  std::uint64_t moves_ = 0;             // spread()'s moves to another CPU
  // When this process arrived at its current timed wait (steady clock, ns): a peer that withdrew
  // before then had not arrived as far as this wait's timeout is concerned.
  std::int64_t arrived_at_ = 0;
};

}  // namespace lockstep::detail
