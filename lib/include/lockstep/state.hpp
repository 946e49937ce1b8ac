// lockstep::State: who this process is in the job, and the job-wide barrier.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>
#include "lockstep/error.hpp"
#include "lockstep/export.hpp"
#include "lockstep/source_location.hpp"
#include "lockstep/wait_policy.hpp"

struct CUstream_st;  // CUDA's stream: cudaStream_t is CUstream_st*, so no CUDA header is needed

namespace lockstep {

// The cross-node backends this build of lockstep has ("ucx", ...), in order of preference; empty
// when it can run single-node jobs only. LOCKSTEP_BACKEND / lockstep-run --backend choose one.
[[nodiscard]] LOCKSTEP_API std::vector<std::string> available_backends();

// One process's contiguous share of `size` items split between `num_processes` processes, as
// Accelerate's split_between_processes splits them: [begin, end), the first size % num_processes
// processes taking one more; `padding` is how many copies of the last item make the share as
// long as the longest (ceil(size / num_processes)) when padding is asked for. Pure: the same on
// every process, no communication. ConfigError for num_processes < 1 or an index outside it.
struct Share {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t padding = 0;
  [[nodiscard]] std::size_t size() const noexcept { return end - begin; }
  bool operator==(const Share&) const = default;
};
[[nodiscard]] LOCKSTEP_API Share split_range(std::size_t size, int num_processes,
                                             int process_index);

namespace detail {
class Context;

// Runs `f` only where `chosen` is true; elsewhere returns nothing (void) or an empty optional.
template <class F>
class OnProcess {
 public:
  OnProcess(bool chosen, F f) : chosen_(chosen), f_(std::move(f)) {}

  template <class... Args>
  auto operator()(Args&&... args) {
    using R = std::invoke_result_t<F&, Args&&...>;
    if constexpr (std::is_void_v<R>) {
      if (chosen_) {
        std::invoke(f_, std::forward<Args>(args)...);
      }
    } else {
      using Value = std::remove_cvref_t<R>;
      if (!chosen_) {
        return std::optional<Value>{};
      }
      return std::optional<Value>{std::invoke(f_, std::forward<Args>(args)...)};
    }
  }

 private:
  bool chosen_;
  F f_;
};
}  // namespace detail

class State;

// Guard returned by State::main_process_first() and local_main_process_first(). The chosen
// process runs the guarded block first; every other process waits in the guard's constructor
// until the chosen process has destroyed its guard. Not copyable; movable.
//
// As in Accelerate, each side is one wait of the whole job (the local form's too: each node's
// main process goes first, and its release meets every process's wait), so guards nest, of
// either kind, to any depth, and every process runs each body in turn: with
// main_process_first() around local_main_process_first(), the main process's inner release meets
// the others' outer wait, and its outer release their inner wait.
//
// A barrier failure in the destructor (a peer lost) cannot be thrown from a destructor: it is
// kept and rethrown by the next call on any State of this process. A guard destroyed while an
// exception unwinds does not release the others (they learn of the failure when this process
// leaves the job). end() ends the block early and throws instead.
class LOCKSTEP_API FirstGuard {
 public:
  FirstGuard(FirstGuard&& other) noexcept;
  FirstGuard& operator=(FirstGuard&&) = delete;
  FirstGuard(const FirstGuard&) = delete;
  FirstGuard& operator=(const FirstGuard&) = delete;
  ~FirstGuard();

  // Ends the guarded block now: the chosen process releases the others, throwing what that wait
  // throws; the destructor then does nothing. After an InterruptedError the others are still
  // held: call end() again. The release is recorded where the guard was made, or at `where`.
  void end();
  void end(SourceLocation where);

 private:
  friend class State;
  FirstGuard(std::shared_ptr<detail::Context> context, bool first, bool local,
             SourceLocation where);
  void release();
  void keep(SourceLocation where);  // where_*, copied

  std::shared_ptr<detail::Context> context_;
  bool first_;
  bool local_;
  int uncaught_at_entry_;
  // Where the guard was made (or end()'s `where`), copied: the release is recorded there (a
  // destructor has no site), after the caller's strings may be gone.
  bool where_known_ = false;
  std::string where_file_;
  std::string where_function_;
  unsigned where_line_ = 0;
};

// Handle to this process's membership in the job, as Accelerate's PartialState.
//
// Constructing a State joins the job the environment describes (lockstep-run, torchrun, Open MPI,
// MPICH/Hydra or Slurm variables; with none of them the process is a job of one). The first State
// of a process joins; it blocks until every process of the node has joined, and throws
// ConfigError for a malformed environment, TimeoutError when peers do not join within
// LOCKSTEP_JOIN_TIMEOUT seconds (default 300), PeerLostError when a peer dies while joining.
// Every later State in the process is a handle to the same membership. The process leaves the
// job at exit; the last process of a node to leave removes the node's shared-memory segment.
//
// Call sites: every call that meets the others (the State that joins, wait_for_everyone in each
// form, broadcast, main_process_first's guards) records where it was made (a defaulted
// SourceLocation) in this process's slot of the node's segment. The messages of a wait
// that lasts (the stall notice) or fails (TimeoutError, PeerLostError) then say where each
// process is, and lockstep-run --status shows it while the job runs.
//
// Thread-safety: the queries are safe from any thread. wait_for_everyone() and the guards belong
// to one thread at a time per process: a second thread that calls while one is waiting gets an
// Error.
class LOCKSTEP_API State {
 public:
  explicit State(SourceLocation where = SourceLocation::current());
  State(const State&) = default;
  State& operator=(const State&) = default;
  // Moving copies the handle: the moved-from State stays a valid handle to the same membership.
  // NOLINTNEXTLINE(performance-move-constructor-init,*-rvalue-reference-*): a copy on purpose
  State(State&& other) noexcept : context_(other.context_) {}
  State& operator=(State&& other) noexcept {  // NOLINT(*-rvalue-reference-*)
    context_ = other.context_;
    return *this;
  }
  ~State();

  // Global index of this process, in [0, num_processes()).
  [[nodiscard]] int process_index() const noexcept;
  // Index of this process among the processes of its node, in [0, num_local_processes()).
  [[nodiscard]] int local_process_index() const noexcept;
  [[nodiscard]] int num_processes() const noexcept;
  [[nodiscard]] int num_local_processes() const noexcept;
  [[nodiscard]] int node_index() const noexcept;
  [[nodiscard]] int num_nodes() const noexcept;
  [[nodiscard]] bool is_main_process() const noexcept { return process_index() == 0; }
  [[nodiscard]] bool is_local_main_process() const noexcept { return local_process_index() == 0; }
  [[nodiscard]] bool is_last_process() const noexcept {
    return process_index() == num_processes() - 1;
  }
  // Whether the job has more than one process (Accelerate's use_distributed).
  [[nodiscard]] bool use_distributed() const noexcept { return num_processes() > 1; }
  // Leaves the job now, before the process exits (torch's destroy_process_group): the other
  // processes' waits that need this one fail with PeerLostError naming it, and every later call
  // of this process throws Error. Error when another thread of this process waits in a barrier.
  // A no-op in a job of one.
  void leave();
  // The wait policy this process uses, from LOCKSTEP_WAIT_POLICY or the build's default.
  [[nodiscard]] WaitPolicy wait_policy() const noexcept;
  // Where the identity came from: "lockstep-run", "torchrun", "openmpi", "mpich", "slurm", "none".
  [[nodiscard]] std::string environment_source() const;

  // Returns once every process of the job has called wait_for_everyone(); a no-op in a job of
  // one. Throws PeerLostError when a process that has not arrived dies or leaves the job (noticed
  // within about 0.1 s on its node; across nodes, as soon as its node's main process learns of
  // it). After a PeerLostError the job is broken: every later call (and main_process_first())
  // throws it again at once.
  // Memory ordering: everything a process wrote before its call happens-before everything any
  // process does after its call returns (for memory shared between the processes).
  void wait_for_everyone(SourceLocation where = SourceLocation::current());
  // As above, but throws TimeoutError naming the processes that had not arrived when `timeout`
  // passes (a process that timed out and withdrew counts as not arrived). A timeout of 0 fails
  // at once unless every other process is already waiting; a negative one is refused with
  // ConfigError (as the C API refuses it); one beyond a century means no timeout.
  // On one node, a timed-out process's arrival is withdrawn: the barrier stays intact and a later
  // call waits for the same episode again. Across nodes a timeout breaks the job: the node that
  // timed out tells the others, and every process of every node gets the error (this episode
  // and every later call); none of them completes the episode once its node has learned of it.
  void wait_for_everyone(std::chrono::milliseconds timeout,
                         SourceLocation where = SourceLocation::current());
  // Arrives and waits at most about a millisecond: true once every process has arrived (as
  // wait_for_everyone() returns), false if they had not, with this process's arrival withdrawn:
  // nothing happened, and the next call (this one or wait_for_everyone()) arrives anew. Across
  // machines false at once, without arriving (an arrival there cannot be taken back). Throws
  // what wait_for_everyone() throws; never interrupted by lockstep_set_interrupt_fd's
  // descriptor. For callers that must prepare before a wait that may sleep: the Python package
  // tries this first and arms its Ctrl-C handling, which costs more than a short wait, only
  // when it returns false.
  bool try_wait_for_everyone(SourceLocation where = SourceLocation::current());

  // Main computes, everyone uses (Accelerate's broadcast_object_list, for bytes): returns, on
  // every process, the `data` the main process (process 0) passed; the others' `data` is
  // ignored. Any size that memory allows: up to 32 KiB through the node segment, more through
  // a file of /dev/shm that the writer removes when every process has read it (where /dev/shm
  // cannot hold it: Error on every process, saying why). Every process must call it, as
  // wait_for_everyone(), which it implies: two episodes of the barrier, whatever the outcome,
  // and what wait_for_everyone() throws. Across machines the bytes travel through the backend,
  // in pieces. Not interrupted by lockstep_set_interrupt_fd's descriptor (it could not be
  // retried).
  std::vector<std::byte> broadcast(std::span<const std::byte> data,
                                   SourceLocation where = SourceLocation::current());
  std::string broadcast(std::string_view text, SourceLocation where = SourceLocation::current());
  // Everyone's results, everywhere (Accelerate's gather_object, for bytes): returns, on every
  // process, every process's `data`, by process index. Predictions, metrics, file lists: any
  // size that memory allows (a process's bytes past its share of the node segment's 32 KiB are
  // read by the others where they lie, in its memory, with process_vm_readv; where that is not
  // permitted, and across machines, through a file of /dev/shm of its own, removed when every
  // process has read it; where /dev/shm cannot hold them: Error on every process, naming the
  // process and why). Every
  // process must call it, as wait_for_everyone(), which it implies: two episodes of the barrier
  // (three across machines), whatever the outcome. Not interrupted by lockstep_set_interrupt_fd's
  // descriptor.
  std::vector<std::vector<std::byte>> gather_object(
      std::span<const std::byte> data, SourceLocation where = SourceLocation::current());
  std::vector<std::string> gather_object(std::string_view text,
                                         SourceLocation where = SourceLocation::current());
  // broadcast() and gather_object() into memory of the caller's, each process's bytes copied
  // once, straight there: `room` is called once, between the exchange's episodes, with the size
  // of the main process's bytes (broadcast_into) or of every process's, by process index
  // (gather_object_into), and returns where they go (room for that size, or for their sum, one
  // process's after another's in process order; null for 0 bytes). What `room` throws is thrown
  // on this process once every process has read (the others pass), as the exchange's other
  // errors are.
  void broadcast_into(std::span<const std::byte> data,
                      const std::function<std::byte*(std::size_t)>& room,
                      SourceLocation where = SourceLocation::current());
  void gather_object_into(std::span<const std::byte> data,
                          const std::function<std::byte*(std::span<const std::size_t>)>& room,
                          SourceLocation where = SourceLocation::current());
  // broadcast() and gather_object() read where the bytes lie, without a copy of this process's
  // own: `each` is called between the exchange's episodes with the main process's bytes
  // (broadcast_in_place), or once for every process index with that process's bytes, in no
  // particular order (gather_object_in_place); the bytes are valid during the call only (a
  // mapping of the writer's file, the node segment, the caller's `data`). For a reader that
  // decodes them anyway (Python's gather_object unpickles each process's bytes in place): a
  // process's bytes that the others would copy 512 KiB of together (at least 64 KiB each: from
  // 512 KiB at N = 2, 256 KiB at N = 3, 171 KiB at N = 4) go to one of its three windows (files of
  // /dev/shm of at most 4 MiB, kept mapped by it and its readers until it leaves the job, used in
  // turn: at most 12 MiB a process) or, larger, to a file removed when every process has read
  // it, instead of being copied by each reader from its memory. What `each` throws is thrown on
  // this process once every process has read (the others pass).
  void broadcast_in_place(std::span<const std::byte> data,
                          const std::function<void(std::span<const std::byte>)>& each,
                          SourceLocation where = SourceLocation::current());
  void gather_object_in_place(std::span<const std::byte> data,
                              const std::function<void(int, std::span<const std::byte>)>& each,
                              SourceLocation where = SourceLocation::current());
  // Stop everyone when one says so (Accelerate's set_trigger and check_trigger): set_trigger()
  // marks this process (any thread, any time); check_trigger(), which every process must call
  // at the same point, returns true on every process when any process set its mark since its
  // last check, and then clears every mark. A gather of one byte each (see gather_object).
  void set_trigger() noexcept;
  bool check_trigger(SourceLocation where = SourceLocation::current());
  // Stream-ordered: work enqueued on `stream` after this call, in any process, starts only after
  // the work every process enqueued on its own stream before its call has finished. The calling
  // thread does not wait for the GPU (in events mode across nodes each process first waits for
  // its own stream). `stream` must belong to the current device (cudaSetDevice first), and every
  // process must call this form at the same point. Events mode (the default): each call records
  // an interprocess event and meets the others on the host; a process that dies after its call
  // but before its stream reached the event leaves the others' streams waiting on an event whose
  // process is gone. Flags mode (LOCKSTEP_GPU_BARRIER=flags): the call only enqueues; each
  // stream writes a flag in host memory and waits for its peers' flags (across nodes, for its
  // node's word, which the node's main process's relay thread raises once the node's streams
  // have arrived and the nodes have met), and a watchdog thread in each process (started by the
  // first call) releases every waiting stream within about 20 ms when a process dies or leaves
  // (on any node); the streams then run on without the lost process's work, and every later
  // lockstep call in every process throws PeerLostError naming it (gpu_barrier_released() says
  // so without throwing).
  // Throws ConfigError when lockstep was built without CUDA or finds no driver, Error on a CUDA
  // failure, and what wait_for_everyone() throws.
  void wait_for_everyone(CUstream_st* stream, SourceLocation where = SourceLocation::current());
  // As above. Flags mode: when this process's stream has not passed this barrier `timeout`
  // after it reached it (not after the call: its own backlog before the barrier never counts
  // against its own timeout; across nodes the other nodes are bounded by the node's main
  // process's call, from when its node's streams have all arrived), every stream is released and
  // every later call in every process throws TimeoutError naming the processes whose streams had
  // not arrived. The other processes' timed calls count from their own streams' arrival: where
  // they are timed, this stream's backlog beyond their timeout fails the job through them, as
  // NCCL's watchdog would. Events mode: the host meet times out as
  // wait_for_everyone(timeout) does. Negative: ConfigError; beyond a century: no timeout.
  void wait_for_everyone(CUstream_st* stream, std::chrono::milliseconds timeout,
                         SourceLocation where = SourceLocation::current());
  // Whether a failure (a lost process, a stream barrier's timeout) released this node's GPU
  // streams: their barriers passed without the missing work. Never blocks or throws; any thread.
  [[nodiscard]] bool gpu_barrier_released() const noexcept;
  // The device address of a 32-bit word that turns nonzero when gpu_barrier_released() does,
  // for kernels that want to stop early; null before the first stream barrier, and in events
  // mode.
  [[nodiscard]] const volatile std::uint32_t* gpu_release_word() const noexcept;

  // The CUDA device this process should use: its local process index modulo the devices CUDA
  // shows it (CUDA_VISIBLE_DEVICES applies); -1 without a device or CUDA support. Call
  // cudaSetDevice(state.device()) before using the GPU.
  [[nodiscard]] int device() const;

  // Wrappers that call `f` (with the wrapper's arguments) on the chosen process only. When `f`
  // returns R, the wrapper returns std::optional<R> (empty where `f` did not run). An index at or
  // beyond num_processes() chooses no process, as in Accelerate.
  template <class F>
  [[nodiscard]] auto on_main_process(F&& f) const {
    return detail::OnProcess<std::decay_t<F>>(is_main_process(), std::forward<F>(f));
  }
  template <class F>
  [[nodiscard]] auto on_local_main_process(F&& f) const {
    return detail::OnProcess<std::decay_t<F>>(is_local_main_process(), std::forward<F>(f));
  }
  template <class F>
  [[nodiscard]] auto on_last_process(F&& f) const {
    return detail::OnProcess<std::decay_t<F>>(is_last_process(), std::forward<F>(f));
  }
  template <class F>
  [[nodiscard]] auto on_process(int process_index, F&& f) const {
    check_index("on_process", process_index);
    return detail::OnProcess<std::decay_t<F>>(this->process_index() == process_index,
                                              std::forward<F>(f));
  }
  template <class F>
  [[nodiscard]] auto on_local_process(int local_process_index, F&& f) const {
    check_index("on_local_process", local_process_index);
    return detail::OnProcess<std::decay_t<F>>(this->local_process_index() == local_process_index,
                                              std::forward<F>(f));
  }

  // This process's contiguous share of `items` (any contiguous range: a std::vector, an array, a
  // std::span), as a span into it; see split_range for the rule.
  template <std::ranges::contiguous_range R>
  [[nodiscard]] auto split_between_processes(R&& items) const {
    auto all = std::span(std::ranges::data(items), std::ranges::size(items));
    const Share share = split_range(all.size(), num_processes(), process_index());
    return all.subspan(share.begin, share.size());
  }
  // As above, copied, and with `apply_padding` as long as the longest share (the last item
  // repeated), so that every process gets the same number of items. Any random-access range.
  template <std::ranges::random_access_range R>
  [[nodiscard]] auto split_between_processes(R&& items, bool apply_padding) const {
    using Value = std::ranges::range_value_t<R>;
    const auto size = static_cast<std::size_t>(std::ranges::size(items));
    Share share = split_range(size, num_processes(), process_index());
    auto first = std::ranges::begin(items);
    std::vector<Value> out(first + static_cast<std::ptrdiff_t>(share.begin),
                           first + static_cast<std::ptrdiff_t>(share.end));
    if (apply_padding && size > 0) {
      const Value last =
          out.empty() ? Value(*(first + static_cast<std::ptrdiff_t>(size - 1))) : out.back();
      out.insert(out.end(), share.padding, last);
    }
    return out;
  }

  // Writes `args` (each as `std::cout << arg`, then a newline) once per machine, on its local
  // main process, and flushes; nothing elsewhere (as Accelerate's print). For messages from
  // the other processes, use std::cout as usual; for once per job, on_main_process.
  template <class... Args>
  void print(const Args&... args) const {
    if (is_local_main_process()) {
      (std::cout << ... << args) << std::endl;
    }
  }

  // The main (local main) process runs the guarded block first; the others enter it after the
  // main process's guard is destroyed. See FirstGuard.
  [[nodiscard]] FirstGuard main_process_first(SourceLocation where = SourceLocation::current());
  [[nodiscard]] FirstGuard local_main_process_first(
      SourceLocation where = SourceLocation::current());

 private:
  static void check_index(const char* what, int index);

  std::shared_ptr<detail::Context> context_;
};

}  // namespace lockstep
