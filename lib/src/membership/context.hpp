// The process-wide membership that every State handle shares (internal).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "base/function_ref.hpp"
#include "engine/node_barrier.hpp"
#include "engine/segment.hpp"
#include "engine/spill.hpp"
#include "gpu/stream_barrier.hpp"
#include "job/job_config.hpp"
#include "membership/backend.hpp"
#include "membership/busy_guard.hpp"

namespace lockstep::detail {

class Context {
 public:
  // The process's context, joining the job on first use (`site`: where, for the call log).
  // Thread-safe.
  static std::shared_ptr<Context> instance(const SourceLocation& site = {});

  explicit Context(JobConfig config, const SourceLocation& site = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  [[nodiscard]] const JobConfig& config() const noexcept { return config_; }
  [[nodiscard]] int local_index() const noexcept { return local_index_; }
  // What this process's waits did so far (Waiter::stats), for diagnostics and the bench; not
  // while another thread of the process waits.
  [[nodiscard]] Waiter::Stats wait_stats() const noexcept {
    return waiter_ ? waiter_->stats() : Waiter::Stats{};
  }
  // The process that joined (a forked child inherits the context but not the membership).
  [[nodiscard]] pid_t owner() const noexcept { return owner_; }

  // The job-wide barrier; `what` names the caller in messages, `kind` and `site` say what and
  // where the call is in this process's call log (engine/call_log.hpp). Flattened: the node
  // barrier's arrival, the Waiter and the futex call are inlined here (they live in other rooms'
  // files: with the library's link-time optimization, option `lto`), so that a process woken from
  // its sleep returns once, from this function, to State::wait_for_everyone's caller (it jumps
  // here). Each return after a sleep's context switch is mispredicted (the kernel refills the
  // return stack), and with one frame fewer here block / pthread_barrier_t went from 1.06-1.07x
  // to 1.04x beside 1+burst2@2 at N = 4 on 2 vCPUs (bench/sleep-ab). What is rare
  // (a multi-node leader's part, timeouts, lost peers, the errors) stays out of line
  // (gnu::noinline in NodeBarrier and here), so that this function stays a few kilobytes.
  [[gnu::flatten]] void wait(std::optional<std::chrono::milliseconds> timeout, const char* what,
                             CallKind kind, const SourceLocation& site);
  // State::try_wait_for_everyone: arrives and waits at most kTryWait, never interrupted; true once
  // the episode is complete, false (the arrival withdrawn) if it was not, or at once across nodes.
  static constexpr std::chrono::milliseconds kTryWait{1};
  bool try_wait(const char* what, const SourceLocation& site);
  // State::broadcast: the main process's `data` (any size), on every process; two episodes of
  // the barrier, on every process, whatever the outcome.
  std::vector<std::byte> broadcast(std::span<const std::byte> data, const char* what,
                                   const SourceLocation& site);
  // State::gather_object: every process's `data` (any size), by rank, on every process; two
  // episodes of the barrier on one machine, three across machines, on every process, whatever
  // the outcome.
  std::vector<std::vector<std::byte>> gather(std::span<const std::byte> data, const char* what,
                                             const SourceLocation& site);
  // What gather_into does with the gathered bytes, between the gather's episodes: `sized` once,
  // with every process's size by rank, then `put` once for each rank, with its bytes (valid
  // during the call only: a spill's mapping). What they throw is thrown once every process has
  // read, in step.
  // `place` instead of `put`, for bytes read from another process's memory: where that rank's
  // bytes go (room for its size). `in_place`: the sink reads what `put` gives where it lies, so
  // this process's own bytes, large ones (spilled_in_place), go to its spill, which the others map
  // and read there too, rather than stay in its memory for the others to copy (exchange.cpp).
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): an aggregate, its FunctionRefs given
  struct GatherSink {
    FunctionRef<void(const std::vector<std::uint64_t>&)> sized;
    FunctionRef<void(int, std::span<const std::byte>)> put;
    FunctionRef<std::byte*(int)> place;
    bool in_place = false;
  };
  // gather(), each process's bytes copied once, straight to where `sink` puts them (the C API's
  // one buffer).
  void gather_into(std::span<const std::byte> data, const GatherSink& sink, const char* what,
                   const SourceLocation& site);
  // broadcast(), the bytes given to `put` once (valid during the call only), between its
  // episodes.
  void broadcast_into(std::span<const std::byte> data,
                      FunctionRef<void(std::span<const std::byte>)> put, const char* what,
                      const SourceLocation& site);
  // State::set_trigger and check_trigger (a gather of this process's mark, which it clears).
  void set_trigger() noexcept { trigger_.store(true, std::memory_order_relaxed); }
  bool check_trigger(const char* what, const SourceLocation& site);
  // The stream-ordered barrier (see gpu/stream_barrier.hpp); `timeout`: State's rule.
  void wait_stream(CUstream_st* stream, std::optional<std::chrono::milliseconds> timeout,
                   const char* what, const SourceLocation& site);
  // Whether a failure released this node's GPU streams (StreamBarrier::released); any thread.
  [[nodiscard]] bool stream_released() const noexcept;
  // StreamBarrier::release_word(), or null before the first stream barrier.
  [[nodiscard]] const volatile std::uint32_t* stream_release_word() const noexcept;
  // Throws what wait() would throw before it arrives: this handle is unusable here, or the job
  // is broken (a peer lost, a cross-node failure).
  void check_intact(const char* what);
  // Keeps an error that a destructor could not throw; the next wait() rethrows it.
  void defer(std::exception_ptr error) noexcept;
  // Leaves the job (at process exit), whatever handles still exist; later waits throw. Returns
  // false when another thread of this process waits in a barrier now: the job is left, but
  // what that thread uses stays (the caller must then never destroy this context), and the
  // thread parks until the process ends rather than return or throw into an exiting process.
  bool leave() noexcept;
  // Leaves the job on purpose (State::leave): Error, having left nothing, when another thread
  // of this process waits in a barrier now.
  void leave_on_purpose(const char* what);

 private:
  // Joins the job (the constructor's work), and says what was joined (LOCKSTEP_LOG).
  void join(const SourceLocation& site);
  void describe(std::chrono::steady_clock::duration joining) const;
  // One arrival at the barrier, and what a failed one does (the log, parking while exiting).
  void arrive(std::optional<std::chrono::steady_clock::time_point> deadline, const char* what,
              CallAt call);
  // What a failed arrival does before its error goes on (called in the handler: rethrows it).
  [[noreturn, gnu::noinline]] void arrival_failed(const char* what);
  // Throws if this process may not wait now (a forked copy, a deferred error, after leaving).
  void check_usable(const char* what);
  // A leader across nodes, before its backend meets the other nodes for a host barrier or a
  // broadcast: its stream episodes meet them first (StreamBarrier::settle).
  [[gnu::noinline]] void settle_streams(
      std::optional<std::chrono::steady_clock::time_point> deadline, const char* what);
  [[noreturn, gnu::noinline]] void throw_left(const char* what) const;
  // The stream barrier's set-up meet (StreamBarrier::Agree): every process's `mark`, by rank,
  // gathered across the job, recorded as the stream call at `site`.
  std::vector<std::uint32_t> agree_marks(std::uint32_t mark, const char* what,
                                         const SourceLocation& site);
  // gather_into's work once this process holds the context (its BusyGuard, not left, a job of
  // more than one): every episode recorded as `call` (the stream barrier's set-up gathers its
  // processes' marks as a stream call).
  void gather_held(std::span<const std::byte> data, const GatherSink& sink, const char* what,
                   std::uint32_t call);
  // The same, every rank's bytes by rank (as gather()).
  std::vector<std::vector<std::byte>> gather_held(std::span<const std::byte> data, const char* what,
                                                  std::uint32_t call);
  // gather_into's steps after the first episode (exchange.cpp): on one machine, and across
  // machines.
  void gather_here(std::span<const std::byte> data, std::optional<Spill>& spill,
                   const GatherSink& sink, const char* what, std::uint32_t call);
  void gather_across(const GatherSink& sink, const char* what, std::uint32_t call);
  // A gather on one machine whose processes could not all read each other's memory: the rest
  // through spills (exchange.cpp), two more episodes.
  void spill_in_memory(std::span<const std::byte> data, std::optional<Spill>& spill,
                       const std::vector<int>& missing, const GatherSink& sink, const char* what,
                       std::uint32_t call);

  JobConfig config_;
  int local_index_ = 0;
  pid_t owner_;               // the process that joined; a forked child must not leave for it
  std::uint32_t fork_epoch_;  // forks seen when joining
  std::unique_ptr<NodeSegment> segment_;
  std::unique_ptr<PeerWatch> watch_;  // the node's other processes' exits (before the barrier)
  std::optional<Waiter> waiter_;      // every wait of this process: the barrier's, the backend's
  std::unique_ptr<Leaders> backend_;  // the node's leader in a multi-node job
  std::optional<NodeBarrier> barrier_;
  std::unique_ptr<StreamBarrier> stream_barrier_;  // made by the first wait_stream()
  std::atomic<StreamBarrier*> published_stream_barrier_{nullptr};  // for other threads' queries
  Occupancy occupancy_;            // one thread at a time waits in a barrier (see BusyGuard)
  std::atomic<bool> left_{false};  // the process left the job (it exits, or left on purpose)
  std::atomic<bool> left_on_purpose_{false};
  std::atomic<bool> has_deferred_{false};
  std::atomic<bool> trigger_{false};  // set_trigger's mark
  std::uint64_t gathers_ = 0;         // gathers on one machine so far (Slot::unread_gather)
  std::optional<Windows> windows_;    // a reader in place's (engine/spill.hpp), from its first
  WindowViews window_views_;          // the other processes' windows this process has read
  std::mutex deferred_mutex_;
  std::exception_ptr deferred_;
};

}  // namespace lockstep::detail
