// The stream-ordered barrier: State::wait_for_everyone(cudaStream_t) (internal).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

struct CUstream_st;  // CUDA's stream (cudaStream_t and CUstream are CUstream_st*)

namespace lockstep::detail {

class NodeSegment;  // engine/segment.hpp
struct JobConfig;   // job/job_config.hpp
class StreamOps;

// Orders GPU work across the node's processes. Two modes (LOCKSTEP_GPU_BARRIER):
//
// flags (one node; gpu/flag_barrier.hpp): no host rendezvous and no CPU wait.
// Each process's stream writes its episode number to its own flag in host memory that every
// GPU maps, and waits for its peers' flags; a watchdog thread per process releases every stream
// when a peer dies or leaves, or a timed call's deadline passes, and the job then throws.
//
// events (the default; the only mode across nodes; gpu/stream_barrier_cuda.cpp): each call records
// an interprocess event on the stream, meets the others on the host barrier, then makes the stream
// wait on every peer's event of the same episode. Across nodes, where the other nodes' events
// cannot be waited on, each process first waits for its own stream (cuEventSynchronize), then
// meets the job on the host. Its hole: a peer that dies after the host meet but before its
// stream reached its event leaves the survivors' streams waiting on an event whose exporter is
// gone (CUDA does not say what then happens).
class StreamBarrier {
 public:
  // Runs the host barrier (all nodes) with an optional deadline.
  using Meet = std::function<void(std::optional<std::chrono::steady_clock::time_point>)>;

  StreamBarrier() = default;
  virtual ~StreamBarrier() = default;
  StreamBarrier(const StreamBarrier&) = delete;
  StreamBarrier& operator=(const StreamBarrier&) = delete;

  // One episode on `stream`; `timeout`: see State::wait_for_everyone(stream, timeout). `what`
  // names the call in errors.
  virtual void wait(CUstream_st* stream, std::optional<std::chrono::milliseconds> timeout,
                    const Meet& meet, const char* what) = 0;
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
};

// The barrier for this process (`segment` null in a job of one). Throws ConfigError when this
// build has no CUDA support (unless the stream operations are overridden).
std::unique_ptr<StreamBarrier> make_stream_barrier(NodeSegment* segment, const JobConfig& config);

// Tests: every later make_stream_barrier() of this process makes a flags-mode barrier whose
// streams are driven by `make` (a fake GPU) instead of CUDA. Null restores CUDA.
void override_stream_ops(std::function<std::unique_ptr<StreamOps>()> make);

// "<what>: process 3 met this call with ...": a peer that set up another form or mode (its
// GpuSlot::ready is `ready`).
std::string peer_form_error(const char* what, int rank, std::uint32_t ready);

// "<what>: the stream is being captured into a CUDA graph ...": why a stream barrier refuses a
// capturing stream (a graph would replay one episode's values and let streams pass early).
std::string capture_refusal(const char* what);

// The CUDA barrier of mode config.gpu_barrier (stream_barrier_cuda.cpp), or ConfigError in a
// build without CUDA (stream_barrier_none.cpp).
std::unique_ptr<StreamBarrier> make_cuda_stream_barrier(NodeSegment* segment,
                                                        const JobConfig& config);

}  // namespace lockstep::detail
