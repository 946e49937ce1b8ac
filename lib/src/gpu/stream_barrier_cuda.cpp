// The stream barriers over the CUDA driver (see stream_barrier.hpp): flags mode's stream
// operations, events mode, and a job of one.
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "engine/segment.hpp"
#include "gpu/cuda_driver.hpp"
#include "gpu/flag_barrier.hpp"
#include "gpu/stream_barrier.hpp"
#include "job/job_config.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

static_assert(sizeof(CUipcEventHandle) == kIpcHandle, "GpuSlot holds CUDA's handles");

constexpr std::uint32_t kEventsReady = 1;  // GpuSlot::ready: this process set events mode up
// cuStreamBatchMemOp takes fewer than 256 operations a call (its documented limit).
constexpr std::size_t kMaxBatch = 255;

bool is_capturing(const cuda::Driver& cuda, CUstream_st* stream, const char* what) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuda::check(cuda, cuda.stream_is_capturing(stream, &status), what, "cuStreamIsCapturing");
  return status != CU_STREAM_CAPTURE_STATUS_NONE;  // active, or invalidated and not yet ended
}

// Flags mode's streams: CUDA's stream memory operations on the registered GPU area.
class CudaStreamOps final : public StreamOps {
 public:
  CudaStreamOps() : cuda_(cuda::driver("lockstep: wait_for_everyone(stream)")) {}
  // The registration stays to the process's end (at exit the driver may already be gone).

  void map(void* area, std::size_t bytes, const char* what) override {
    const cuda::RelaxedCapture relaxed(cuda_);  // cuMemHostRegister: see RelaxedCapture
    const CUdevice device = cuda::current_device(cuda_, what);
    int supported = 0;
    cuda::check(cuda_,
                cuda_.device_get_attribute(
                    &supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, device),
                what, "cuDeviceGetAttribute");
    if (supported == 0) {
      throw ConfigError(std::string(what) + ": device " + std::to_string(device) +
                        " has no 64-bit stream memory operations (which flags mode needs): set "
                        "LOCKSTEP_GPU_BARRIER=events");
    }
    int flush = 0;
    if (cuda_.device_get_attribute(&flush, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, device) ==
            CUDA_SUCCESS &&
        flush != 0) {
      // Peers' writes into this GPU's memory that reached it before a flag are seen after it.
      wait_flags_ |= CU_STREAM_WAIT_VALUE_FLUSH;
    }
    cuda::check(cuda_,
                cuda_.mem_host_register(area, bytes,
                                        CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
                what, "cuMemHostRegister (the node segment's GPU area)");
    CUdeviceptr base = 0;
    cuda::check(cuda_, cuda_.mem_host_get_device_pointer(&base, area, 0), what,
                "cuMemHostGetDevicePointer");
    host_base_ = static_cast<unsigned char*>(area);
    device_base_ = base;
    device_ = device;
    cuda::check(cuda_, cuda_.ctx_get_current(&context_), what, "cuCtxGetCurrent");
  }

  bool capturing(CUstream_st* stream, const char* what) override {
    return is_capturing(cuda_, stream, what);
  }

  void enter_thread() noexcept override {
    // First the relaxed capture mode, for this thread alone and before any other CUDA call: in
    // the default (global) mode a CUDA call here that is unsafe during a capture (NCCL's, a
    // query) would invalidate a graph that the user's thread is capturing meanwhile
    // (cudaStreamCaptureModeGlobal's rule), though nothing here touches the captured stream. The
    // watchdog makes no CUDA call.
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    (void)cuda_.thread_exchange_stream_capture_mode(&mode);
    // The relay's backend (NCCL's) calls CUDA from this thread: the same context as the caller's.
    (void)cuda_.ctx_set_current(context_);
  }

  std::uint64_t stream_id(CUstream_st* stream, const char* what) override {
    unsigned long long id = 0;  // NOLINT(google-runtime-int): CUDA's type
    cuda::check(cuda_, cuda_.stream_get_id(stream, &id), what, "cuStreamGetId");
    if (id != checked_id_) {
      // A stream not seen last time: the area is mapped for the first call's context alone.
      CUcontext context = nullptr;
      cuda::check(cuda_, cuda_.stream_get_ctx(stream, &context), what, "cuStreamGetCtx");
      if (context != context_) {
        throw Error(std::string(what) +
                    ": the stream belongs to another CUDA context than this process's first "
                    "GPU barrier (device " +
                    std::to_string(device_) +
                    "); a process's stream barriers use one device: run one process per GPU, "
                    "or pass streams of device " +
                    std::to_string(device_));
      }
      checked_id_ = id;
    }
    return id;
  }

  void enqueue(CUstream_st* stream, std::span<const MemOp> ops, const char* what) override {
    params_.resize(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      CUstreamBatchMemOpParams& param = params_[i];
      std::memset(&param, 0, sizeof param);
      const MemOp& op = ops[i];
      if (op.kind == MemOp::Kind::write) {
        param.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
        param.writeValue.address = device_address_of(op.word);
        param.writeValue.value64 = op.value;
        param.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;  // after a fence
      } else {
        param.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
        param.waitValue.address = device_address_of(op.word);
        param.waitValue.value64 = op.value;
        param.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ | wait_flags_;
      }
    }
    for (std::size_t first = 0; first < params_.size(); first += kMaxBatch) {
      const auto count = static_cast<unsigned int>(std::min(kMaxBatch, params_.size() - first));
      cuda::check(cuda_, cuda_.stream_batch_mem_op(stream, count, params_.data() + first, 0), what,
                  "cuStreamBatchMemOp");
    }
  }

  [[nodiscard]] const volatile std::uint32_t* device_address(
      const std::atomic<std::uint32_t>* word) const noexcept override {
    // NOLINTNEXTLINE(performance-no-int-to-ptr): a device address, never dereferenced here
    return reinterpret_cast<const volatile std::uint32_t*>(device_address_of(word));
  }

 private:
  template <class T>
  CUdeviceptr device_address_of(const T* word) const noexcept {
    return device_base_ +
           static_cast<CUdeviceptr>(reinterpret_cast<const unsigned char*>(word) - host_base_);
  }

  const cuda::Driver& cuda_;
  CUcontext context_ = nullptr;  // the context the area was mapped in (map's caller's)
  CUdevice device_ = -1;
  unsigned long long checked_id_ = ~0ULL;  // NOLINT(google-runtime-int): the last stream checked
  unsigned char* host_base_ = nullptr;
  CUdeviceptr device_base_ = 0;
  unsigned int wait_flags_ = 0;
  std::vector<CUstreamBatchMemOpParams> params_;
};

class IpcEventBarrier final : public StreamBarrier {
 public:
  IpcEventBarrier(NodeSegment& segment, bool cross_node)
      : cuda_(cuda::driver("lockstep: wait_for_everyone(stream)")),
        segment_(segment),
        cross_node_(cross_node) {}
  // The events are left to the process's end: at exit the driver may already be gone.

  void wait(CUstream_st* stream, std::optional<std::chrono::milliseconds> timeout, const Meet& meet,
            const Agree& agree, const char* what) override {
    if (is_capturing(cuda_, stream, what)) {
      throw Error(capture_refusal(what));
    }
    if (!set_up_) {
      set_up(agree, what);
    }
    if (const CUdevice current = cuda::current_device(cuda_, what); current != device_) {
      throw Error(std::string(what) + ": the current device is " + std::to_string(current) +
                  ", but this process's GPU barrier lives on device " + std::to_string(device_) +
                  " (its first call's): call cudaSetDevice(" + std::to_string(device_) + ") first");
    }
    const auto slot = static_cast<std::size_t>(episode_ % kGpuRing);
    cuda::check(cuda_, cuda_.event_record(mine_[slot], stream), what, "cuEventRecord");
    if (cross_node_) {
      // Other nodes cannot wait on this node's events: finish this stream's work first.
      const cuda::RelaxedCapture relaxed(cuda_);  // a synchronization: see RelaxedCapture
      cuda::check(cuda_, cuda_.event_synchronize(mine_[slot]), what, "cuEventSynchronize");
    }
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (timeout) {
      deadline = std::chrono::steady_clock::now() + *timeout;
    }
    meet(deadline);
    for (const auto& events : peers_) {
      cuda::check(cuda_, cuda_.stream_wait_event(stream, events[slot], 0), what,
                  "cuStreamWaitEvent");
    }
    ++episode_;
  }

 private:
  void set_up(const Agree& agree, const char* what) {
    const cuda::RelaxedCapture relaxed(cuda_);  // the events' creation: see RelaxedCapture
    device_ = cuda::current_device(cuda_, what);
    GpuSlot& own = segment_.gpu_slot(segment_.my_slot());
    for (std::size_t i = 0; i < mine_.size(); ++i) {
      cuda::check(cuda_,
                  cuda_.event_create(&mine_[i], CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING),
                  what, "cuEventCreate(CU_EVENT_INTERPROCESS)");
      CUipcEventHandle handle{};
      cuda::check(cuda_, cuda_.ipc_get_event_handle(&handle, mine_[i]), what,
                  "cuIpcGetEventHandle");
      std::memcpy(own.events[i], &handle, sizeof handle);
    }
    own.device = device_;
    own.ready.store(kEventsReady, std::memory_order_release);  // the slot's record
    // Every process has published its handles (the gather's arrivals order them before the
    // reads below), and every machine's mode is known to all.
    check_marks(agree(kEventsReady), kEventsReady, what);
    for (int slot = 0; slot < segment_.num_slots(); ++slot) {
      if (slot == segment_.my_slot()) {
        continue;
      }
      const GpuSlot& peer = segment_.gpu_slot(slot);
      std::array<CUevent, kGpuRing> events{};
      for (std::size_t i = 0; i < events.size(); ++i) {
        CUipcEventHandle handle{};
        std::memcpy(&handle, peer.events[i], sizeof handle);
        cuda::check(cuda_, cuda_.ipc_open_event_handle(&events[i], handle), what,
                    "cuIpcOpenEventHandle");
      }
      peers_.push_back(events);
    }
    set_up_ = true;
  }

  const cuda::Driver& cuda_;
  NodeSegment& segment_;
  bool cross_node_;
  bool set_up_ = false;
  CUdevice device_ = -1;
  std::uint64_t episode_ = 0;
  std::array<CUevent, kGpuRing> mine_{};
  std::vector<std::array<CUevent, kGpuRing>> peers_;
};

// A job of one: the stream is ordered with itself; only check that CUDA works.
class SoleProcessBarrier final : public StreamBarrier {
 public:
  void wait(CUstream_st* /*stream*/, std::optional<std::chrono::milliseconds> /*timeout*/,
            const Meet& /*meet*/, const Agree& /*agree*/, const char* what) override {
    (void)cuda::current_device(cuda::driver(what), what);
  }
};

}  // namespace

std::unique_ptr<StreamBarrier> make_cuda_stream_barrier(NodeSegment* segment,
                                                        const JobConfig& config,
                                                        StreamRelay relay) {
  if (segment == nullptr) {
    return std::make_unique<SoleProcessBarrier>();
  }
  if (config.gpu_barrier == "flags") {
    check_flags_mode(config);
    return std::make_unique<FlagBarrier>(*segment, std::make_unique<CudaStreamOps>(),
                                         config.num_nodes > 1, std::move(relay));
  }
  return std::make_unique<IpcEventBarrier>(*segment, config.num_nodes > 1);
}

}  // namespace lockstep::detail
