// The stream barriers' CUDA code (lib/src/gpu/stream_barrier_cuda.cpp, cuda_driver.cpp,
// devices_cuda.cpp) run against a fake CUDA driver (tests/fake_cuda/fake_cuda.cpp, found as
// libcuda.so.1 through LD_LIBRARY_PATH, which meson sets): flags mode's stream memory operations
// and events mode's interprocess events ordering work across processes, a killed peer, stream
// capture, one hardware queue, a device without stream memory operations, several devices. The
// fake runs a stream's operations in order on a thread; it says nothing of a GPU's timing.
#include <cuda.h>  // the driver's types
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <lockstep/lockstep.hpp>
#include <string>
#include <thread>

#include "fake_cuda_client.hpp"
#include "ranks.hpp"

namespace {

using lockstep::fake_cuda::finish;
using lockstep::fake_cuda::launch;
using lockstep::fake_cuda::stream_on;
using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::kStreamReleaseBound;
using lockstep::testing::run_ranks;
using lockstep::testing::shared_array;
using Clock = std::chrono::steady_clock;

double now_seconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// What the ranks' streams share: the work each has done (episode numbers), and violations.
struct Shared {
  std::atomic<std::uint64_t> work[16];
  std::atomic<int> early;  // checks on a stream that found a peer's work of the episode missing
};

bool order_work(lockstep::State& state, Shared* shared, int episodes,
                const std::vector<CUstream>& streams) {
  return lockstep::fake_cuda::order_work(state, shared->work, &shared->early, episodes, streams);
}

class Modes : public ::testing::TestWithParam<const char*> {};

// More processes than this machine's cores, random delays on the streams: no check on a stream
// after the barrier may find a peer's work of the episode missing.
TEST_P(Modes, OrderWorkAcrossProcesses) {
  constexpr int kN = 4;
  constexpr int kEpisodes = 300;
  auto* shared = shared_array<Shared>(1);
  Job job = Job::of(kN);
  job.env["LOCKSTEP_GPU_BARRIER"] = GetParam();
  auto ends = run_ranks(job, [&](int /*rank*/) {
    lockstep::State state;
    RANK_CHECK(order_work(state, shared, kEpisodes, {stream_on(0)}));
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_EQ(shared->early.load(), 0);
}

// Each process's calls alternate between two streams, and with CUDA_DEVICE_MAX_CONNECTIONS=1
// both streams share one queue, so that a stream's wait holds the other's work behind it (as
// one hardware queue does): the episodes still complete, in order.
TEST_P(Modes, TwoStreamsOnOneHardwareQueue) {
  constexpr int kN = 3;
  constexpr int kEpisodes = 200;
  auto* shared = shared_array<Shared>(1);
  Job job = Job::of(kN);
  job.env["LOCKSTEP_GPU_BARRIER"] = GetParam();
  job.env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1";
  auto ends = run_ranks(job, [&](int /*rank*/) {
    lockstep::State state;
    CUstream first = stream_on(0);
    CUstream second = nullptr;
    CU(lockstep::fake_cuda::Fake::get().stream_create(&second, 0));
    RANK_CHECK(order_work(state, shared, kEpisodes, {first, second}));
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
  EXPECT_EQ(shared->early.load(), 0);
}

// A stream being captured into a graph is refused, with the capture left valid; and a capture
// on another thread of the process (CUDA's global mode, the default) survives the process's
// stream barriers on its own stream: the library makes no call there that CUDA's capture rules
// prohibit.
TEST_P(Modes, CapturesAreRefusedAndLeftIntact) {
  constexpr int kN = 2;
  Job job = Job::of(kN);
  job.env["LOCKSTEP_GPU_BARRIER"] = GetParam();
  auto ends = run_ranks(job, [&](int /*rank*/) {
    lockstep::State state;
    const lockstep::fake_cuda::Fake& cu = lockstep::fake_cuda::Fake::get();
    CUstream stream = stream_on(0);
    CU(cu.begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    try {
      state.wait_for_everyone(stream);
      throw std::logic_error("a capturing stream was not refused");
    } catch (const lockstep::Error& error) {
      RANK_CHECK(lockstep::testing::contains(error.what(), "captur"));
    }
    CUgraph graph = nullptr;
    CU(cu.end_capture(stream, &graph));  // still valid: the refusal disturbed nothing
    std::atomic<bool> begun{false};
    std::atomic<bool> barriers_done{false};
    CUresult captured = CUDA_ERROR_UNKNOWN;
    CUcontext context = nullptr;
    CU(cu.primary_ctx_retain(&context, 0));
    std::thread capturer([&] {
      CU(cu.ctx_set_current(context));
      CUstream other = nullptr;
      CU(cu.stream_create(&other, 0));
      CU(cu.begin_capture(other, CU_STREAM_CAPTURE_MODE_GLOBAL));
      begun = true;
      while (!barriers_done) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      CUgraph other_graph = nullptr;
      captured = cu.end_capture(other, &other_graph);
    });
    while (!begun) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    try {
      for (int i = 0; i < 50; ++i) {
        state.wait_for_everyone(stream);
      }
    } catch (...) {
      barriers_done = true;
      capturer.join();
      throw;
    }
    barriers_done = true;
    capturer.join();
    RANK_CHECK(captured == CUDA_SUCCESS);  // the capture on the other thread is valid
    RANK_CHECK(finish(stream, std::chrono::seconds(30)));
    state.wait_for_everyone();
  });
  EXPECT_EQ(failures(ends), "");
}

INSTANTIATE_TEST_SUITE_P(FakeDriver, Modes, ::testing::Values("flags", "events"),
                         [](const auto& info) { return std::string(info.param); });

// Flags mode: rank 1 is killed (SIGKILL) while the others' streams wait for it in a stream
// barrier. Their streams finish within the watchdog's bound, and their next call throws
// PeerLostError naming rank 1.
TEST(FakeDriver, AKilledPeerNeverLeavesAStreamHung) {
  constexpr int kN = 4;
  auto* called = shared_array<std::atomic<int>>(1);
  auto* killed_at = shared_array<std::atomic<double>>(1);
  auto* passed_at = shared_array<std::atomic<double>>(kN);
  Job job = Job::of(kN);
  job.env["LOCKSTEP_GPU_BARRIER"] = "flags";
  auto ends = run_ranks(job, [&](int rank) {
    lockstep::State state;
    CUstream stream = stream_on(0);
    for (int i = 0; i < 20; ++i) {
      state.wait_for_everyone(stream);
    }
    RANK_CHECK(finish(stream, std::chrono::seconds(30)));
    state.wait_for_everyone();
    if (rank == 1) {
      while (called->load() < kN - 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // their streams are waiting
      killed_at->store(now_seconds());
      ::raise(SIGKILL);
    }
    state.wait_for_everyone(stream);
    auto record = [&passed_at, rank] { passed_at[rank].store(now_seconds()); };
    launch(stream, &record);
    called->fetch_add(1);
    RANK_CHECK(finish(stream, std::chrono::seconds(10)));  // not hung
    const double after = passed_at[rank].load() - killed_at->load();
    if (after > kStreamReleaseBound) {
      throw std::logic_error("the stream was released " + std::to_string(after) +
                             " s after the death");
    }
    RANK_CHECK(state.gpu_barrier_released());
    try {
      state.wait_for_everyone(stream);
      throw std::logic_error("a call after the death returned");
    } catch (const lockstep::PeerLostError& error) {
      RANK_CHECK(error.process_index() == 1);
    }
  });
  EXPECT_EQ(failures(ends, 1), "");
}

// Flags mode where one process's device has no 64-bit stream memory operations: every process's
// first stream call fails with one clear error (the refuser's own names its device, the others'
// name it), and the job goes on on the host.
TEST(FakeDriver, ADeviceWithoutStreamMemoryOperationsFailsEveryProcess) {
  constexpr int kN = 3;
  Job job = Job::of(kN);
  job.env["LOCKSTEP_GPU_BARRIER"] = "flags";
  auto ends = run_ranks(job, [&](int rank) {
    if (rank == 2) {
      ::setenv("LOCKSTEP_FAKE_CUDA_NO_MEMOPS", "1", 1);  // before the driver loads
    }
    lockstep::State state;
    CUstream stream = stream_on(0);
    try {
      state.wait_for_everyone(stream);
      throw std::logic_error("the stream call returned");
    } catch (const lockstep::Error& error) {
      const std::string text = error.what();
      RANK_CHECK(rank == 2 ? lockstep::testing::contains(text, "no 64-bit stream memory")
                           : lockstep::testing::contains(text, "process 2"));
    }
    state.wait_for_everyone();  // the host barrier still works
  });
  EXPECT_EQ(failures(ends), "");
}

// State::device(): the process's local index modulo the devices CUDA reports.
TEST(FakeDriver, DeviceIsTheLocalIndexModuloTheDevices) {
  constexpr int kN = 3;
  Job job = Job::of(kN);
  job.env["LOCKSTEP_FAKE_CUDA_DEVICES"] = "2";
  auto ends = run_ranks(job, [&](int rank) {
    lockstep::State state;
    RANK_CHECK(state.device() == rank % 2);
  });
  EXPECT_EQ(failures(ends), "");
}

}  // namespace
