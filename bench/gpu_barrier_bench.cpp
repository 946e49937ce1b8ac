// GPU barrier latency, N processes sharing the machine's GPUs (tools/gpu-check runs it, with
// and without MPS).
//
//   BM_StreamBarrierFlags/ranks:N   a 4-byte cudaMemsetAsync, then wait_for_everyone(stream) in
//                                   flags mode (the default: no host rendezvous)
//   BM_StreamBarrierEvents/ranks:N  the same with LOCKSTEP_GPU_BARRIER=events (IPC events and a
//                                   host meet per call)
//   BM_SyncHostBarrier/ranks:N      a 4-byte cudaMemsetAsync, cudaStreamSynchronize, then
//                                   wait_for_everyone(): what a barrier costs when the CPU must
//                                   wait for the GPU to drain
//   BM_NcclAllReduce/ranks:1        a 4-byte cudaMemsetAsync, then a one-element ncclAllReduce on
//                                   the stream (NCCL needs a GPU per rank: one rank on a one-GPU
//                                   machine)
//   BM_StreamOnly/ranks:1           the cudaMemsetAsync alone: the floor
//
// Time per episode: rank 0's wall time for the episodes, the final cudaStreamSynchronize
// included, over their number. Counter host_us: rank 0's mean time inside the barrier call
// itself (what the CPU spends enqueuing), over 256 calls made with an empty queue (later calls
// can block once CUDA's queue is full, which is the GPU's time, not the call's). Without a GPU
// every family reports an error (and the binary exits non-zero); CI only builds it.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <lockstep/lockstep.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "harness.hpp"

namespace {

using lockstep::bench::fork_ranks;
using lockstep::bench::Report;
using lockstep::bench::set_job_environment;
using lockstep::bench::wall_seconds;

void cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(status));
  }
}

enum class Kind { stream_flags, stream_events, sync_host_barrier, nccl, stream_only };

struct NcclCalls {
  decltype(&ncclCommInitAll) init_all = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
};

NcclCalls load_nccl() {
  const char* path = std::getenv("LOCKSTEP_NCCL_LIBRARY");  // NOLINT(concurrency-mt-unsafe)
  void* library = ::dlopen(path != nullptr ? path : "libnccl.so.2", RTLD_NOW);
  if (library == nullptr) {
    throw std::runtime_error(std::string("cannot load NCCL: ") +
                             ::dlerror());  // NOLINT(concurrency-mt-unsafe)
  }
  NcclCalls calls;
  calls.init_all = reinterpret_cast<decltype(calls.init_all)>(::dlsym(library, "ncclCommInitAll"));
  calls.all_reduce =
      reinterpret_cast<decltype(calls.all_reduce)>(::dlsym(library, "ncclAllReduce"));
  if (calls.init_all == nullptr || calls.all_reduce == nullptr) {
    throw std::runtime_error("NCCL lacks ncclCommInitAll or ncclAllReduce");
  }
  return calls;
}

void BM_Gpu(benchmark::State& state, Kind kind) {
  const int ranks = static_cast<int>(state.range(0));
  const std::int64_t episodes = state.max_iterations;
  Report* report = lockstep::bench::shared_report();
  static int runs = 0;
  const std::string id = "gpu-bench-" + std::to_string(::getpid()) + "-" + std::to_string(runs++);
  const bool ok = fork_ranks(ranks, [&](int rank) {
    set_job_environment(id, rank, ranks);
    ::setenv("LOCKSTEP_GPU_BARRIER", kind == Kind::stream_events ? "events" : "flags",
             1);  // NOLINT(concurrency-mt-unsafe): a child
    lockstep::State job;
    int device = job.device();
    if (device < 0) {
      throw std::runtime_error("no CUDA device");
    }
    cuda(cudaSetDevice(device), "cudaSetDevice");
    cudaStream_t stream = nullptr;
    cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    int* buffer = nullptr;
    cuda(cudaMalloc(reinterpret_cast<void**>(&buffer), sizeof(int)), "cudaMalloc");
    NcclCalls nccl;
    ncclComm_t comm = nullptr;
    if (kind == Kind::nccl) {
      nccl = load_nccl();
      if (nccl.init_all(&comm, 1, &device) != ncclSuccess) {
        throw std::runtime_error("ncclCommInitAll failed");
      }
    }
    double host_seconds = 0;
    auto episode = [&] {
      cuda(cudaMemsetAsync(buffer, 0, sizeof(int), stream), "cudaMemsetAsync");
      switch (kind) {
        case Kind::stream_flags:
        case Kind::stream_events: {
          const double start = wall_seconds();
          job.wait_for_everyone(stream);
          host_seconds += wall_seconds() - start;
          break;
        }
        case Kind::sync_host_barrier:
          cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          job.wait_for_everyone();
          break;
        case Kind::nccl:
          if (nccl.all_reduce(buffer, buffer, 1, ncclInt32, ncclSum, comm, stream) != ncclSuccess) {
            throw std::runtime_error("ncclAllReduce failed");
          }
          break;
        case Kind::stream_only:
          break;
      }
    };
    for (int i = 0; i < 100; ++i) {
      episode();
    }
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    job.wait_for_everyone();
    host_seconds = 0;
    constexpr int kHostCalls = 256;
    for (int i = 0; i < kHostCalls; ++i) {
      episode();
    }
    if (rank == 0) {
      report->cpu[0] = host_seconds / kHostCalls;
    }
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    job.wait_for_everyone();
    double start = wall_seconds();
    for (std::int64_t i = 0; i < episodes; ++i) {
      episode();
    }
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (rank == 0) {
      report->elapsed = wall_seconds() - start;
    }
    job.wait_for_everyone();
  });
  if (!ok) {
    lockstep::bench::fail_run(state, "a rank failed (is there a GPU?)");
  } else {
    const double per_episode = report->elapsed / static_cast<double>(episodes);
    for (auto _ : state) {
      state.SetIterationTime(per_episode);
    }
    if (kind == Kind::stream_flags || kind == Kind::stream_events) {
      state.counters["host_us"] = report->cpu[0] * 1e6;
    }
  }
  ::munmap(report, sizeof(Report));
}

// Processes sharing one GPU cost a GPU context switch per dependency (about 0.1 ms on an H200):
// fewer episodes there keep a run short.
void arguments(benchmark::internal::Benchmark* bench, std::initializer_list<int> ranks) {
  bench->ArgName("ranks");
  for (int n : ranks) {
    bench->Arg(n);
  }
  bench->Iterations(*ranks.begin() == 1 ? 20000 : 2000)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_Gpu, stream_flags, Kind::stream_flags)
    ->Name("BM_StreamBarrierFlags")
    ->Apply([](auto* b) {
      arguments(b, {2, 4, 8});
    });
BENCHMARK_CAPTURE(BM_Gpu, stream_events, Kind::stream_events)
    ->Name("BM_StreamBarrierEvents")
    ->Apply([](auto* b) {
      arguments(b, {2, 4, 8});
    });
BENCHMARK_CAPTURE(BM_Gpu, sync_host_barrier, Kind::sync_host_barrier)
    ->Name("BM_SyncHostBarrier")
    ->Apply([](auto* b) {
      arguments(b, {2, 4, 8});
    });
BENCHMARK_CAPTURE(BM_Gpu, nccl, Kind::nccl)->Name("BM_NcclAllReduce")->Apply([](auto* b) {
  arguments(b, {1});
});
BENCHMARK_CAPTURE(BM_Gpu, stream_only, Kind::stream_only)
    ->Name("BM_StreamOnly")
    ->Apply([](auto* b) { arguments(b, {1}); });

}  // namespace

int main(int argc, char** argv) {
  return lockstep::bench::run_main(argc, argv);
}
