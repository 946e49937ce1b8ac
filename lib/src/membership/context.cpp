#include "membership/context.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "base/fault_points.hpp"
#include "base/little_endian.hpp"
#include "base/log.hpp"
#include "base/proc.hpp"
#include "engine/whereabouts.hpp"
#include "lockstep/error.hpp"
#include "membership/busy_guard.hpp"
#include "membership/exchange_regions.hpp"  // gathers_fit, gather_refusal

#ifndef LOCKSTEP_DEFAULT_WAIT_POLICY
#define LOCKSTEP_DEFAULT_WAIT_POLICY adaptive
#endif

namespace lockstep::detail {
namespace {

// Forks this process has gone through (as a child); lets wait() refuse a handle that a child
// inherited without a system call on the fast path.
std::atomic<std::uint32_t> fork_epoch{0};

void on_fork_child() {
  fork_epoch.fetch_add(1, std::memory_order_relaxed);
}

std::once_flag fork_hook_once;

// The job's processes on this machine, for the waiter's load samples: the node's, or, when the
// nodes meet on a loopback address (nodes simulated on one machine, as the tests and the
// cross-node bench run them), the whole job's: they are not foreign load.
int processes_on_this_machine(const JobConfig& config) {
  const std::string& addr = config.master_addr;
  const bool loopback =
      addr.rfind("127.", 0) == 0 || addr == "localhost" || addr == "::1" || addr == "[::1]";
  return config.num_nodes > 1 && loopback ? config.world_size : config.local_size;
}

struct Registry {
  std::mutex mutex;
  std::shared_ptr<Context> context;

  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  // At exit the process leaves its job, even where a State outlives this (a local of a function
  // that called std::exit, a static destroyed later): the segment must not be left behind.
  // (A forked child's inherited context only forgets the segment: see Context::leave.)
  ~Registry() {
    if (context && !context->leave()) {
      // A thread still waits in the barrier: what it uses must outlive it, to the process's end.
      // (Placed in storage that is never destroyed: no allocation can fail here.)
      alignas(std::shared_ptr<Context>) static unsigned char kept[sizeof(std::shared_ptr<Context>)];
      new (kept) std::shared_ptr<Context>(std::move(context));
    }
  }
};

Registry& registry() {
  static Registry instance;  // destroyed at exit: the process leaves the job then
  return instance;
}

// A timeout beyond a century is no deadline (and would overflow the clock's nanoseconds).
std::optional<std::chrono::milliseconds> bounded(std::optional<std::chrono::milliseconds> timeout) {
  if (timeout && *timeout >= std::chrono::hours(24 * 365 * 100)) {
    return std::nullopt;
  }
  return timeout;
}

}  // namespace

std::shared_ptr<Context> Context::instance(const SourceLocation& site) {
  std::call_once(fork_hook_once, [] { ::pthread_atfork(nullptr, nullptr, on_fork_child); });
  Registry& reg = registry();
  std::lock_guard lock(reg.mutex);
  if (reg.context && reg.context->owner() == ::getpid()) {
    return reg.context;
  }
  // First use, or a forked child holding its parent's context: join from this environment.
  auto config = read_job_config(process_environment(), WaitPolicy::LOCKSTEP_DEFAULT_WAIT_POLICY);
  reg.context = std::make_shared<Context>(std::move(config), site);
  return reg.context;
}

Context::Context(JobConfig config, const SourceLocation& site)
    : config_(std::move(config)),
      owner_(::getpid()),
      fork_epoch_(fork_epoch.load(std::memory_order_relaxed)) {
  const auto start = std::chrono::steady_clock::now();
  if (config_.log_level >= LogLevel::debug) {
    log_line(config_.rank, "joining the job (" + config_.source + ")");
  }
  try {
    join(site);
  } catch (const std::exception& error) {
    if (config_.log_level >= LogLevel::debug) {
      log_line(config_.rank, std::string("could not join: ") + error.what());
    }
    throw;
  }
  if (config_.log_level >= LogLevel::info) {
    describe(std::chrono::steady_clock::now() - start);
  }
}

void Context::describe(std::chrono::steady_clock::duration joining) const {
  const JobConfig& job = config_;
  std::string text = "process " + std::to_string(job.rank) + " of " +
                     std::to_string(job.world_size) + ", local " +
                     std::to_string(local_index_ >= 0 ? local_index_ : job.local_rank) + " of " +
                     std::to_string(job.local_size) + ", node " + std::to_string(job.node_index) +
                     " of " + std::to_string(job.num_nodes) + "; from " + job.source;
  if (!job.source_variables.empty()) {
    text += " (" + job.source_variables + ")";
  }
  text += segment_ ? "; segment /dev/shm/" + segment_->name() : "; a job of one (no segment)";
  text += std::string("; wait policy ") + wait_policy_name(job.wait_policy);
  if (segment_ && segment_->num_slots() > 1) {
    text +=
        watch_ ? "; peers watched (pidfds)" : "; peers polled every 100 ms (pidfds unavailable)";
  }
  if (job.num_nodes > 1) {
    text += backend_ ? std::string("; backend ") + backend_->name() + " (this process leads node " +
                           std::to_string(job.node_index) + ")"
                     : "; backend " +
                           (job.backend.empty() ? std::string("(the first built)") : job.backend) +
                           " (through this node's main process)";
  }
  text += "; joined in " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(joining).count()) +
          " ms";
  log_line(job.rank, text);
}

void Context::join(const SourceLocation& site) {
  arm_fault_points(config_.rank);
  const bool hierarchical = config_.num_nodes > 1;
  if (hierarchical) {
    check_backend_built(config_);
  }
  if (config_.world_size == 1) {
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + config_.join_timeout;
  (void)set_stall_warning(config_.stall_warning);  // the join's waits, then every barrier's
  segment_ = NodeSegment::join(config_);
  local_index_ = segment_->local_index();
  watch_ = PeerWatch::start(*segment_);  // every slot is claimed: the peers' pids are there
  waiter_.emplace(config_.wait_policy, WaitShape{config_.local_size, usable_cpus(), hierarchical,
                                                 processes_on_this_machine(config_)});
  // The barrier comes later across nodes (after the leader's backend has joined, through the
  // same waiter): until then no peer is counted asleep.
  waiter_->watch_peers([this] { return barrier_ ? barrier_->peers_asleep() : 0; });
  waiter_->share_samples(&segment_->header().load_sample.value);
  if (!hierarchical) {
    barrier_.emplace(*segment_, *waiter_, CrossNodeStep{}, false, watch_.get());
    barrier_->check_strictly(config_.strict_check);
    CallRecorder& log = barrier_->recorder();  // the join, in the log: no episode
    log.begin(log.word(CallKind::join, site), kNoEpisode);
    log.end(false);
    return;
  }
  // Across nodes: the leader joins the other leaders; then the whole job meets once, so that a
  // State exists only when every process of every node has joined (and a leader's failure to
  // join reaches its node's processes).
  if (local_index_ == 0) {
    try {
      const NodeSegment* segment = segment_.get();
      backend_ = join_leaders(LeaderConfig{config_, segment_->ranks(), &*waiter_, deadline,
                                           [segment] { return Whereabouts(*segment).now(); }});
    } catch (const Error& error) {
      segment_->record_failure(failure_of(error, "lockstep: joining the job"));
      throw;
    }
  }
  CrossNodeStep cross;
  if (Leaders* backend = backend_.get()) {
    cross.meet = [backend](std::optional<std::chrono::steady_clock::time_point> deadline,
                           const char* what) { backend->barrier(deadline, what); };
    cross.abort = [backend](const Failure& failure) { backend->abort(failure); };
  }
  barrier_.emplace(*segment_, *waiter_, std::move(cross), true, watch_.get());
  barrier_->check_strictly(config_.strict_check);
  // The others wait a little longer than the leader, whose error says more than theirs would.
  barrier_->arrive_and_wait(local_index_ == 0 ? deadline : deadline + std::chrono::seconds(5),
                            "lockstep: joining the job", CallAt(CallKind::join, site));
}

Context::~Context() {
  leave();
}

bool Context::leave() noexcept {
  if (left_.exchange(true, std::memory_order_seq_cst) && !segment_ && !barrier_) {
    return true;  // left before
  }
  if (config_.log_level >= LogLevel::debug && ::getpid() == owner_) {
    log_line(config_.rank, "leaving the job");
  }
  if (::getpid() == owner_ && occupancy_.occupied()) {
    // Another thread waits in the barrier while the process exits: leave the job (the peers see
    // this process gone), but keep everything that thread uses mapped and alive.
    if (segment_) {
      segment_->leave_mapped();
    }
    if (windows_) {
      windows_->keep_mapped();
    }
    window_views_.keep_mapped();
    if (watch_) {
      watch_->stop();  // the exit ends the waiting thread's wait; nothing is left to watch for
    }
    return false;
  }
  // The GPU barrier's destructor stops its watchdog and makes no CUDA call (at exit the driver
  // may be gone): its events and registration go with the process. A forked child's copy
  // refers to its parent's thread and CUDA objects: it is forgotten, untouched.
  published_stream_barrier_.store(nullptr, std::memory_order_release);
  if (stream_barrier_ && ::getpid() != owner_) {
    stream_barrier_->abandon();
    // Never destroyed, and kept where a leak checker sees it reachable.
    static auto* kept = new std::vector<std::unique_ptr<StreamBarrier>>();  // NOLINT
    kept->push_back(std::move(stream_barrier_));
  }
  stream_barrier_.reset();
  barrier_.reset();
  watch_.reset();  // stops its thread (a forked child's copy forgets it)
  if (::getpid() == owner_) {
    backend_.reset();
  } else {
    (void)backend_.release();  // NOLINT: a forked child must not close its parent's connections
  }
  if (segment_ && ::getpid() != owner_) {
    segment_->abandon();  // a forked child's copy: the parent still belongs to the job
  }
  segment_.reset();
  if (windows_ && ::getpid() != owner_) {
    windows_->abandon();  // a forked child's copy: the files are the parent's
  }
  windows_.reset();  // released as the process leaves, not only as it exits
  return true;
}

namespace {

// A thread that waited in the barrier while its process exited: it must neither return into
// code that the exit is tearing down nor throw (an uncaught exception in a thread aborts the
// process, which would replace its exit status). It sleeps until the process ends.
[[noreturn]] void park_until_exit() {
  for (;;) {
    ::pause();
  }
}

}  // namespace

void Context::check_usable(const char* what) {
  // Relaxed: both are process-local flags; the mutex below orders the deferred error itself.
  if (fork_epoch.load(std::memory_order_relaxed) != fork_epoch_) {
    throw Error(std::string(what) + ": this State was created by pid " + std::to_string(owner_) +
                " before fork(); construct a new lockstep::State in the child");
  }
  if (has_deferred_.load(std::memory_order_relaxed)) {
    std::lock_guard lock(deferred_mutex_);
    if (deferred_) {
      std::exception_ptr error = deferred_;
      deferred_ = nullptr;
      has_deferred_.store(false, std::memory_order_relaxed);
      std::rethrow_exception(error);
    }
  }
  if (left_.load(std::memory_order_relaxed)) {
    throw_left(what);
  }
}

void Context::throw_left(const char* what) const {
  throw Error(std::string(what) + (left_on_purpose_.load(std::memory_order_relaxed)
                                       ? ": this process has left the job (State::leave, "
                                         "destroy_process_group)"
                                       : ": this process has left the job (it is exiting)"));
}

void Context::leave_on_purpose(const char* what) {
  if (::getpid() != owner_) {
    throw Error(std::string(what) +
                ": this process inherited its State before fork(); the "
                "process that joined leaves the job, not its copy");
  }
  if (occupancy_.occupied()) {
    throw Error(std::string(what) +
                ": another thread of this process waits in a lockstep barrier; leave after it");
  }
  left_on_purpose_.store(true, std::memory_order_relaxed);
  (void)leave();  // a thread that began to wait meanwhile sees left_ (see BusyGuard)
}

void Context::wait(std::optional<std::chrono::milliseconds> timeout, const char* what,
                   CallKind kind, const SourceLocation& site) {
  check_usable(what);
  if (!barrier_) {
    return;  // a job of one
  }
  BusyGuard busy(occupancy_, what);
  if (left_.load(std::memory_order_seq_cst)) {
    throw_left(what);  // the process began to exit meanwhile (see leave)
  }
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (timeout = bounded(timeout); timeout) {
    deadline = std::chrono::steady_clock::now() + *timeout;
  }
  if (backend_) [[unlikely]] {  // a leader across nodes (one node: nothing more to read)
    settle_streams(deadline, what);
  }
  arrive(deadline, what, CallAt(kind, site));
}

void Context::settle_streams(std::optional<std::chrono::steady_clock::time_point> deadline,
                             const char* what) {
  if (stream_barrier_ && backend_) {
    stream_barrier_->settle(deadline, what);
  }
}

bool Context::try_wait(const char* what, const SourceLocation& site) {
  check_usable(what);
  if (!barrier_) {
    return true;  // a job of one
  }
  BusyGuard busy(occupancy_, what);
  if (left_.load(std::memory_order_seq_cst)) {
    throw_left(what);
  }
  try {
    return barrier_->try_arrive_and_wait(std::chrono::steady_clock::now() + kTryWait, what,
                                         CallAt(CallKind::wait, site));
  } catch (...) {
    arrival_failed(what);
  }
}

void Context::arrive(std::optional<std::chrono::steady_clock::time_point> deadline,
                     const char* what, CallAt call) {
  try {
    barrier_->arrive_and_wait(deadline, what, call);
  } catch (...) {
    arrival_failed(what);
  }
}

void Context::arrival_failed(const char* what) {
  if (left_.load(std::memory_order_seq_cst)) {
    park_until_exit();
  }
  barrier_->recorder().end_as(CallEnd::failed);  // unless it ended (a timeout, an interrupt)
  if (config_.log_level >= LogLevel::info) {
    try {
      for (const std::string& line : barrier_->flight_record()) {
        log_line(config_.rank, line);
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory for a diagnostic
    }
  }
  if (config_.log_level >= LogLevel::debug) {
    try {
      throw;
    } catch (const std::exception& error) {
      log_line(config_.rank, std::string(what) + " failed: " + error.what());
    } catch (...) {  // NOLINT(bugprone-empty-catch): only the log line is given up
    }
  }
  throw;
}

void Context::check_intact(const char* what) {
  check_usable(what);
  if (barrier_) {
    barrier_->check_intact(what);
  }
}

void Context::wait_stream(CUstream_st* stream, std::optional<std::chrono::milliseconds> timeout,
                          const char* what, const SourceLocation& site) {
  check_usable(what);
  BusyGuard busy(occupancy_, what);
  if (left_.load(std::memory_order_seq_cst)) {
    throw_left(what);
  }
  if (barrier_) {
    barrier_->check_intact(what);  // a lost peer, a released stream barrier: the job is broken
  }
  if (!stream_barrier_) {
    StreamRelay relay;  // the leader's link across nodes, for flags mode's relay thread
    if (Leaders* leaders = backend_.get()) {
      relay.meet = [leaders](std::optional<std::chrono::steady_clock::time_point> deadline,
                             const char* meet_what) { leaders->barrier(deadline, meet_what); };
      relay.try_abort = [leaders](const Failure& failure) { return leaders->try_abort(failure); };
      relay.cancel = [leaders] { leaders->cancel(); };
    }
    stream_barrier_ = make_stream_barrier(segment_.get(), config_, std::move(relay));
    // Release: a thread that asks stream_released() sees the barrier made.
    published_stream_barrier_.store(stream_barrier_.get(), std::memory_order_release);
  }
  // Flags mode never meets on the host (but once, to set up: then the meet records the call):
  // its call is recorded here, around the enqueue, with no episode (the streams count their
  // own), so that the others' messages and lockstep-run --status say where this process made it.
  CallRecorder* own =
      barrier_ && !stream_barrier_->meets_on_host() ? &barrier_->recorder() : nullptr;
  if (own != nullptr) {
    own->begin_unmet(own->word(CallKind::stream, site));
  }
  try {
    stream_barrier_->wait(
        stream, bounded(timeout),
        [&](std::optional<std::chrono::steady_clock::time_point> deadline) {
          if (own != nullptr) {
            own->end(false);
            own = nullptr;
          }
          if (barrier_) {
            barrier_->arrive_and_wait(deadline, what, CallAt(CallKind::stream, site));
          }
        },
        [&](std::uint32_t mark) {
          if (own != nullptr) {
            own->end(false);
            own = nullptr;
          }
          return agree_marks(mark, what, site);
        },
        what);
  } catch (...) {
    if (own != nullptr) {
      own->end_as(CallEnd::failed);
    }
    throw;
  }
  if (own != nullptr) {
    own->end(false);
  }
}

bool Context::check_trigger(const char* what, const SourceLocation& site) {
  // Taken (cleared) before the gather: a mark set meanwhile counts at the next check. When no
  // process had one, this process had none to lose; when one had, every mark is cleared anyway.
  const bool mine = trigger_.exchange(false, std::memory_order_relaxed);
  const std::byte mark{static_cast<unsigned char>(mine ? 1 : 0)};
  const auto marks = gather(std::span(&mark, 1), what, site);
  return std::any_of(marks.begin(), marks.end(), [](const std::vector<std::byte>& one) {
    return !one.empty() && one[0] != std::byte{0};
  });
}

std::vector<std::uint32_t> Context::agree_marks(std::uint32_t mark, const char* what,
                                                const SourceLocation& site) {
  if (!barrier_) {
    return {mark};  // a job of one
  }
  if (!gathers_fit(segment_->num_slots())) {
    throw Error(std::string(what) + ": " + gather_refusal(segment_->num_slots()));
  }
  std::array<std::byte, 4> mine{};
  put_le(mine.data(), mark, mine.size());
  const auto got = gather_held(mine, what, barrier_->recorder().word(CallKind::stream, site));
  // Not 4 bytes: a peer whose call was no stream barrier's set-up (0: the calls' check has said
  // so first, unless it met a plain wait, which does not check).
  std::vector<std::uint32_t> marks(got.size(), 0);
  for (std::size_t rank = 0; rank < got.size(); ++rank) {
    if (got[rank].size() == 4) {
      marks[rank] = static_cast<std::uint32_t>(get_le(got[rank].data(), 4));
    }
  }
  return marks;
}

bool Context::stream_released() const noexcept {
  // Acquire: pairs with wait_stream's release.
  const StreamBarrier* barrier = published_stream_barrier_.load(std::memory_order_acquire);
  return barrier != nullptr && barrier->released();
}

const volatile std::uint32_t* Context::stream_release_word() const noexcept {
  // Acquire: pairs with wait_stream's release.
  const StreamBarrier* barrier = published_stream_barrier_.load(std::memory_order_acquire);
  return barrier != nullptr ? barrier->release_word() : nullptr;
}

void Context::defer(std::exception_ptr error) noexcept {
  std::lock_guard lock(deferred_mutex_);
  if (!deferred_) {
    deferred_ = std::move(error);
  }
  has_deferred_.store(true, std::memory_order_relaxed);
}

}  // namespace lockstep::detail
