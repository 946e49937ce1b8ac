// Choosing the stream barrier (see stream_barrier.hpp).
#include "gpu/stream_barrier.hpp"

#include <mutex>
#include <string>

#include "gpu/flag_barrier.hpp"
#include "job/job_config.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

std::mutex override_mutex;
std::function<std::unique_ptr<StreamOps>()> overridden;  // NOLINT: tests only

// "<what>: process 3 met this call with ...": a peer whose set-up mark is `ready`.
std::string peer_form_error(const char* what, int rank, std::uint32_t ready) {
  return std::string(what) + ": process " + std::to_string(rank) +
         (ready == 0 ? " met this call with wait_for_everyone() without a stream: every process "
                       "must call the same form at the same point"
          : ready == kFlagsRefused
              ? " could not set up LOCKSTEP_GPU_BARRIER=flags on its device (its own error says "
                "why), and every process of the job must use one mode: set "
                "LOCKSTEP_GPU_BARRIER=events, which any device runs"
              : " uses another GPU barrier mode (LOCKSTEP_GPU_BARRIER must be the same "
                "for every process)");
}

}  // namespace

void override_stream_ops(std::function<std::unique_ptr<StreamOps>()> make) {
  std::lock_guard lock(override_mutex);
  overridden = std::move(make);
}

std::unique_ptr<StreamBarrier> make_stream_barrier(NodeSegment* segment, const JobConfig& config,
                                                   StreamRelay relay) {
  {
    std::lock_guard lock(override_mutex);
    if (overridden && segment != nullptr) {
      check_flags_mode(config);
      return std::make_unique<FlagBarrier>(*segment, overridden(), config.num_nodes > 1,
                                           std::move(relay));
    }
  }
  return make_cuda_stream_barrier(segment, config, std::move(relay));
}

void check_flags_mode(const JobConfig& config) {
  if (config.num_nodes <= 1) {
    return;
  }
  if (backend_in_use(config) == "nccl") {
    throw ConfigError(
        "lockstep: LOCKSTEP_GPU_BARRIER=flags is refused across machines under the NCCL "
        "backend: the streams would wait on the GPU for the machines' meet, which NCCL runs as a "
        "kernel queued behind them (with CUDA_DEVICE_MAX_CONNECTIONS=1 the job hangs); use "
        "LOCKSTEP_BACKEND=ucx (its meet runs on the host) or LOCKSTEP_GPU_BARRIER=events");
  }
}

void check_marks(const std::vector<std::uint32_t>& marks, std::uint32_t mine, const char* what) {
  for (std::size_t rank = 0; rank < marks.size(); ++rank) {
    if (marks[rank] != mine) {
      throw Error(peer_form_error(what, static_cast<int>(rank), marks[rank]));
    }
  }
}

std::string capture_refusal(const char* what) {
  return std::string(what) +
         ": the stream is being captured into a CUDA graph; a stream barrier cannot be captured "
         "(each replay of the graph would repeat one episode and let the streams pass without "
         "their peers): call it before cudaStreamBeginCapture or after cudaStreamEndCapture";
}

}  // namespace lockstep::detail
