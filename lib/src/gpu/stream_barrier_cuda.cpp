// The stream-ordered barrier over CUDA IPC events (see stream_barrier.hpp).
#include <cuda_runtime_api.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/stream_barrier.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

static_assert(sizeof(cudaIpcEventHandle_t) == kIpcHandle, "GpuSlot holds CUDA's handles");

void check(cudaError_t status, const char* what, const char* call) {
  if (status != cudaSuccess) {
    throw Error(std::string(what) + ": " + call + " failed: " + cudaGetErrorName(status) + " (" +
                cudaGetErrorString(status) + ")");
  }
}

class IpcEventBarrier final : public StreamBarrier {
 public:
  IpcEventBarrier(NodeSegment& segment, bool cross_node)
      : segment_(segment), cross_node_(cross_node) {}
  // The events are left to the process's end: at exit the CUDA runtime may already be gone.

  void wait(CUstream_st* stream, const std::function<void()>& meet, const char* what) override {
    if (!set_up_) {
      set_up(meet, what);
    }
    int current = -1;
    check(cudaGetDevice(&current), what, "cudaGetDevice");
    if (current != device_) {
      throw Error(std::string(what) + ": the current device is " + std::to_string(current) +
                  ", but this process's GPU barrier lives on device " + std::to_string(device_) +
                  " (its first call's): call cudaSetDevice(" + std::to_string(device_) +
                  ") first");
    }
    const auto slot = static_cast<std::size_t>(episode_ % kGpuRing);
    check(cudaEventRecord(mine_[slot], stream), what, "cudaEventRecord");
    if (cross_node_) {
      // Other nodes cannot wait on this node's events: finish this stream's work first.
      check(cudaEventSynchronize(mine_[slot]), what, "cudaEventSynchronize");
    }
    meet();
    for (const auto& events : peers_) {
      check(cudaStreamWaitEvent(stream, events[slot], 0), what, "cudaStreamWaitEvent");
    }
    ++episode_;
  }

 private:
  void set_up(const std::function<void()>& meet, const char* what) {
    check(cudaGetDevice(&device_), what, "cudaGetDevice (is there a GPU?)");
    GpuSlot& own = segment_.gpu_slot(segment_.my_slot());
    for (std::size_t i = 0; i < mine_.size(); ++i) {
      check(cudaEventCreateWithFlags(&mine_[i], cudaEventInterprocess | cudaEventDisableTiming),
            what, "cudaEventCreateWithFlags(cudaEventInterprocess)");
      cudaIpcEventHandle_t handle{};
      check(cudaIpcGetEventHandle(&handle, mine_[i]), what, "cudaIpcGetEventHandle");
      std::memcpy(own.events[i], &handle, sizeof handle);
    }
    own.device = device_;
    own.ready.store(1, std::memory_order_release);
    meet();  // every process has published its handles
    for (int slot = 0; slot < segment_.num_slots(); ++slot) {
      if (slot == segment_.my_slot()) {
        continue;
      }
      GpuSlot& peer = segment_.gpu_slot(slot);
      if (peer.ready.load(std::memory_order_acquire) != 1) {
        throw Error(std::string(what) + ": process " +
                    std::to_string(segment_.slot(slot).rank.load(std::memory_order_relaxed)) +
                    " met this call with wait_for_everyone() without a stream: every process "
                    "must call the same form at the same point");
      }
      std::array<cudaEvent_t, kGpuRing> events{};
      for (std::size_t i = 0; i < events.size(); ++i) {
        cudaIpcEventHandle_t handle{};
        std::memcpy(&handle, peer.events[i], sizeof handle);
        check(cudaIpcOpenEventHandle(&events[i], handle), what, "cudaIpcOpenEventHandle");
      }
      peers_.push_back(events);
    }
    set_up_ = true;
  }

  NodeSegment& segment_;
  bool cross_node_;
  bool set_up_ = false;
  int device_ = -1;
  std::uint64_t episode_ = 0;
  std::array<cudaEvent_t, kGpuRing> mine_{};
  std::vector<std::array<cudaEvent_t, kGpuRing>> peers_;
};

// A job of one: the stream is ordered with itself; only check that CUDA works.
class SoleProcessBarrier final : public StreamBarrier {
 public:
  void wait(CUstream_st* /*stream*/, const std::function<void()>& /*meet*/,
            const char* what) override {
    int device = -1;
    check(cudaGetDevice(&device), what, "cudaGetDevice (is there a GPU?)");
  }
};

}  // namespace

std::unique_ptr<StreamBarrier> make_stream_barrier(NodeSegment* segment, const JobConfig& config) {
  if (segment == nullptr) {
    return std::make_unique<SoleProcessBarrier>();
  }
  return std::make_unique<IpcEventBarrier>(*segment, config.num_nodes > 1);
}

int visible_device(int local_index) noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
    return -1;  // no driver, or no device (CUDA says why only as an error code)
  }
  return local_index % count;
}

}  // namespace lockstep::detail
