// The stream-ordered barrier over CUDA IPC events (see stream_barrier.hpp).
#include <cuda.h>  // the driver's types only: its calls are reached through the runtime
#include <cuda_runtime_api.h>

#include <array>
#include <cctype>
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

// Published in GpuSlot::ready.
constexpr std::uint32_t kEventsReady = 1;
constexpr std::uint32_t kMemopsReady = 2;

std::string peer_form_error(const char* what, int rank, std::uint32_t ready) {
  return std::string(what) + ": process " + std::to_string(rank) +
         (ready == 0 ? " met this call with wait_for_everyone() without a stream: every process "
                       "must call the same form at the same point"
                     : " uses another GPU barrier mode (LOCKSTEP_GPU_BARRIER must be the same "
                       "for every process)");
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
                  " (its first call's): call cudaSetDevice(" + std::to_string(device_) + ") first");
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
    own.ready.store(kEventsReady, std::memory_order_release);
    meet();  // every process has published its handles
    for (int slot = 0; slot < segment_.num_slots(); ++slot) {
      if (slot == segment_.my_slot()) {
        continue;
      }
      GpuSlot& peer = segment_.gpu_slot(slot);
      if (std::uint32_t ready = peer.ready.load(std::memory_order_acquire); ready != kEventsReady) {
        throw Error(
            peer_form_error(what, segment_.slot(slot).rank.load(std::memory_order_relaxed), ready));
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

// The driver's stream memory operations, without linking the driver.
class MemopsBarrier final : public StreamBarrier {
 public:
  explicit MemopsBarrier(NodeSegment& segment) : segment_(segment) {}

  void wait(CUstream_st* stream, const std::function<void()>& meet, const char* what) override {
    if (!set_up_) {
      set_up(meet, what);
    }
    ++episode_;
    // Written after the stream's earlier work, with a memory barrier (the default flags).
    check_driver(write_(stream, flag_, episode_, 0), what, "cuStreamWriteValue64");
    for (CUdeviceptr peer : peers_) {
      check_driver(wait_(stream, peer, episode_, CU_STREAM_WAIT_VALUE_GEQ), what,
                   "cuStreamWaitValue64");
    }
  }

 private:
  using WriteValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  using DeviceGetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);

  static void check_driver(CUresult result, const char* what, const char* call) {
    if (result != CUDA_SUCCESS) {
      throw Error(std::string(what) + ": " + call + " failed: CUresult " + std::to_string(result));
    }
  }

  template <class F>
  static F entry_point(const char* name, const char* what) {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion(name, &function, 12000, cudaEnableDefault, &found), what,
          "cudaGetDriverEntryPointByVersion");
    if (function == nullptr || found != cudaDriverEntryPointSuccess) {
      throw Error(std::string(what) + ": the CUDA driver has no " + name +
                  " (LOCKSTEP_GPU_BARRIER=memops needs stream memory operations)");
    }
    return reinterpret_cast<F>(function);
  }

  void set_up(const std::function<void()>& meet, const char* what) {
    int device = -1;
    check(cudaGetDevice(&device), what, "cudaGetDevice (is there a GPU?)");
    write_ = entry_point<WriteValue64>("cuStreamWriteValue64", what);
    wait_ = entry_point<WaitValue64>("cuStreamWaitValue64", what);
    auto attribute = entry_point<DeviceGetAttribute>("cuDeviceGetAttribute", what);
    int supported = 0;
    check_driver(attribute(&supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, device),
                 what, "cuDeviceGetAttribute");
    if (supported == 0) {
      throw Error(std::string(what) + ": device " + std::to_string(device) +
                  " has no 64-bit stream memory operations: unset LOCKSTEP_GPU_BARRIER");
    }
    void* flag = nullptr;
    check(cudaMalloc(&flag, sizeof(std::uint64_t)), what, "cudaMalloc");
    check(cudaMemset(flag, 0, sizeof(std::uint64_t)), what, "cudaMemset");
    flag_ = reinterpret_cast<CUdeviceptr>(flag);
    GpuSlot& own = segment_.gpu_slot(segment_.my_slot());
    cudaIpcMemHandle_t handle{};
    check(cudaIpcGetMemHandle(&handle, flag), what, "cudaIpcGetMemHandle");
    std::memcpy(own.flag, &handle, sizeof handle);
    own.device = device;
    own.ready.store(kMemopsReady, std::memory_order_release);
    meet();  // once, to exchange the handles; never again
    for (int slot = 0; slot < segment_.num_slots(); ++slot) {
      if (slot == segment_.my_slot()) {
        continue;
      }
      GpuSlot& peer = segment_.gpu_slot(slot);
      std::uint32_t ready = peer.ready.load(std::memory_order_acquire);
      if (ready != kMemopsReady) {
        throw Error(
            peer_form_error(what, segment_.slot(slot).rank.load(std::memory_order_relaxed), ready));
      }
      cudaIpcMemHandle_t peer_handle{};
      std::memcpy(&peer_handle, peer.flag, sizeof peer_handle);
      void* mapped = nullptr;
      check(cudaIpcOpenMemHandle(&mapped, peer_handle, cudaIpcMemLazyEnablePeerAccess), what,
            "cudaIpcOpenMemHandle (the GPUs must reach each other's memory)");
      peers_.push_back(reinterpret_cast<CUdeviceptr>(mapped));
    }
    set_up_ = true;
  }

  NodeSegment& segment_;
  bool set_up_ = false;
  std::uint64_t episode_ = 0;
  CUdeviceptr flag_ = 0;
  std::vector<CUdeviceptr> peers_;
  WriteValue64 write_ = nullptr;
  WaitValue64 wait_ = nullptr;
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
  if (config.gpu_barrier == "memops" && config.num_nodes == 1) {
    return std::make_unique<MemopsBarrier>(*segment);
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

int visible_device_count(std::string& why) {
  int count = 0;
  if (cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) {
    why = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    return 0;
  }
  if (count <= 0) {
    why = "CUDA reports no device";
  }
  return count;
}

std::string device_pci_bus_id(int device, std::string& why) {
  char id[64] = {};
  if (cudaError_t status = cudaDeviceGetPCIBusId(id, sizeof id, device); status != cudaSuccess) {
    why = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    return "";
  }
  std::string text(id);
  for (char& c : text) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return text;
}

}  // namespace lockstep::detail
