// The stream-ordered barrier: State::wait_for_everyone(cudaStream_t) (internal).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct CUstream_st;  // CUDA's stream (cudaStream_t and CUstream are CUstream_st*)

namespace lockstep::detail {

class NodeSegment;  // engine/segment.hpp
struct JobConfig;   // job/job_config.hpp
struct Failure;     // base/failure_record.hpp
class StreamOps;

// Orders GPU work across the job's processes. Two modes (LOCKSTEP_GPU_BARRIER):
//
// flags (gpu/flag_barrier.hpp): no host rendezvous and no CPU wait. Each process's stream writes
// its episode number to its own flag in host memory that every GPU maps. On one node it waits
// for its peers' flags; across nodes it waits for its node's `node_met` word, which the node
// leader's relay thread writes once every stream of the node has arrived and the leaders have
// met on the host. A watchdog thread per process releases every stream when a peer dies or
// leaves, a node fails, or a timed call's deadline passes, and the job then throws.
//
// events (the default; gpu/stream_barrier_cuda.cpp): each call records an interprocess event on
// the stream, meets the others on the host barrier, then makes the stream wait on every peer's
// event of the same episode. Across nodes, where the other nodes' events cannot be waited on,
// each process first waits for its own stream (cuEventSynchronize), then meets the job on the
// host. Its hole: a peer that dies after the host meet but before its stream reached its event
// leaves the survivors' streams waiting on an event whose exporter is gone (CUDA does not say
// what then happens).
class StreamBarrier {
 public:
  // Runs the host barrier (all nodes) with an optional deadline.
  using Meet = std::function<void(std::optional<std::chrono::steady_clock::time_point>)>;
  // The set-up's meet (all nodes, untimed): gathers every process's mark (kFlagsReady, ...),
  // by rank, so that every process of every machine sees the mode each chose, or that a device
  // refused it (then every process fails alike, none waits for a machine that will not come).
  using Agree = std::function<std::vector<std::uint32_t>(std::uint32_t)>;

  StreamBarrier() = default;
  virtual ~StreamBarrier() = default;
  StreamBarrier(const StreamBarrier&) = delete;
  StreamBarrier& operator=(const StreamBarrier&) = delete;

  // One episode on `stream`; `timeout`: see State::wait_for_everyone(stream, timeout). `what`
  // names the call in errors.
  virtual void wait(CUstream_st* stream, std::optional<std::chrono::milliseconds> timeout,
                    const Meet& meet, const Agree& agree, const char* what) = 0;
  // Whether wait() meets the others on the host (through `meet`, which records the call in the
  // process's call log); flags mode never does, and its caller records the call itself.
  [[nodiscard]] virtual bool meets_on_host() const noexcept { return true; }
  // Whether a failure released this node's streams (their waits passed without the peers'
  // work): never blocks, never throws.
  [[nodiscard]] virtual bool released() const noexcept { return false; }
  // The device address of a 32-bit word that turns nonzero when released() does (for kernels
  // that poll it), or null in a mode without one.
  [[nodiscard]] virtual const volatile std::uint32_t* release_word() const noexcept {
    return nullptr;
  }
  // Called in a forked child: forget everything without touching it (threads, CUDA objects).
  virtual void abandon() noexcept {}
  // A node leader's host barrier (and broadcast) across nodes calls this first: it returns once
  // the stream episodes this process called before have met the other nodes, so that every node's
  // leader meets them in one order, the stream episodes first. Throws TimeoutError when
  // `deadline` passes first (nothing arrived: the caller may retry), InterruptedError on an
  // interrupt. A no-op but in flags mode across nodes.
  virtual void settle(std::optional<std::chrono::steady_clock::time_point> /*deadline*/,
                      const char* /*what*/) {}
};

// What the node's leader, in a job across nodes, gives its flags-mode barrier: its link to the
// other nodes' leaders (the context's backend), used from the barrier's relay thread. Empty
// (null functions) on every other process.
struct StreamRelay {
  // Meets the other nodes' leaders (Backend::barrier; the caller serializes it with the
  // process's own uses, see StreamBarrier::settle).
  std::function<void(std::optional<std::chrono::steady_clock::time_point>, const char*)> meet;
  // Tells the other nodes' leaders that this node cannot go on; never throws. False when the
  // backend is busy in another thread's call (that call's own checks then tell them).
  std::function<bool(const Failure&)> try_abort;
  // Makes a meet that waits now end soon with Error (the process leaves); any thread.
  std::function<void()> cancel;
  [[nodiscard]] bool given() const noexcept { return static_cast<bool>(meet); }
};

// The barrier for this process (`segment` null in a job of one; `relay`: given to the node's
// leader across nodes). Throws ConfigError when this build has no CUDA support (unless the stream
// operations are overridden).
std::unique_ptr<StreamBarrier> make_stream_barrier(NodeSegment* segment, const JobConfig& config,
                                                   StreamRelay relay);

// Tests: every later make_stream_barrier() of this process makes a flags-mode barrier whose
// streams are driven by `make` (a fake GPU) instead of CUDA. Null restores CUDA.
void override_stream_ops(std::function<std::unique_ptr<StreamOps>()> make);

// GpuSlot::ready of a process whose device cannot run flags mode (its set-up failed; it still
// meets its peers so that they fail with it).
inline constexpr std::uint32_t kFlagsRefused = 4;

// After the set-up's meet (StreamBarrier::Agree): throws Error "<what>: process 3 met this call
// with ..." naming the first process whose mark is not `mine` (another form of the call, another
// mode, or a device that refused flags mode).
void check_marks(const std::vector<std::uint32_t>& marks, std::uint32_t mine, const char* what);

// "<what>: the stream is being captured into a CUDA graph ...": why a stream barrier refuses a
// capturing stream (a graph would replay one episode's values and let streams pass early).
std::string capture_refusal(const char* what);

// Throws ConfigError when flags mode cannot run for `config`'s job: across machines under the NCCL
// backend, where the node's streams would wait in a stream memory operation for the leaders'
// meet, which NCCL runs as a kernel queued on the same GPU behind them (an order CUDA's scheduler
// cannot see: with CUDA_DEVICE_MAX_CONNECTIONS=1 it hangs for certain). Every process decides it
// alike from the job's configuration, before anything is set up, so none waits for a peer that
// refused.
void check_flags_mode(const JobConfig& config);

// The CUDA barrier of mode config.gpu_barrier (stream_barrier_cuda.cpp), or ConfigError in a
// build without CUDA (stream_barrier_none.cpp).
std::unique_ptr<StreamBarrier> make_cuda_stream_barrier(NodeSegment* segment,
                                                        const JobConfig& config, StreamRelay relay);

}  // namespace lockstep::detail
