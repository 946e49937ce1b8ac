// A fake CUDA driver, libcuda.so.1 for the tests (tests/gpu/fake_driver_test.cpp): the entry
// points lockstep's stream barriers reach through cuGetProcAddress (lib/src/gpu/cuda_driver.cpp),
// and a few more the tests use (cuLaunchHostFunc, cuStreamSynchronize, stream capture), run on
// the CPU. So the library's CUDA code itself (flags mode's stream memory operations, events mode's
// interprocess events, the capture checks, the device checks) runs on every build, not only where
// a GPU is lent. Nothing here is a GPU's timing: only its order and its failures.
//   - LOCKSTEP_FAKE_CUDA_DEVICES devices (default 1; 0: cuInit fails as without a GPU), each with
//     a primary context (current per thread, as CUDA's); LOCKSTEP_FAKE_CUDA_NO_MEMOPS=1: without
//     64-bit stream memory operations. Host memory is device memory (a pointer is its address).
//   - A stream is a queue of operations run in order by a thread, which polls a wait until it is
//     met. With CUDA_DEVICE_MAX_CONNECTIONS=1 every stream of a process shares one such queue
//     (one hardware queue: a waiting operation holds every stream's work behind it).
//   - Events are words in a memfd per process; an interprocess handle names the process, the
//     descriptor and the event, and is opened through /proc/<pid>/fd.
//   - Stream capture follows CUDA's rules for the capture modes: a potentially unsafe call
//     (cuStreamQuery, cuStreamSynchronize, cuEventSynchronize, cuMemAlloc, cuMemHostRegister) from
//     a thread whose mode prohibits it fails and invalidates the captures it would disturb.
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fake_cuda.hpp"

namespace lockstep::fake_cuda {

Driver& driver() {
  static auto* d = new Driver;  // NOLINT(cppcoreguidelines-owning-memory): never destroyed
  return *d;
}

namespace {

thread_local CUctx_st* current = nullptr;
thread_local CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

// CUDA's rule for a potentially unsafe call: refused (and the captures it would disturb
// invalidated) where this thread's mode prohibits it. Under the driver's mutex.
bool unsafe_call_refused(Driver& d) {
  bool refused = false;
  for (CUstream_st* stream : d.capturing) {
    const bool mine = stream->capture_thread == std::this_thread::get_id();
    const bool prohibits = thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL
                               ? (mine ? stream->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED
                                       : stream->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
                           : thread_mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                               ? mine && stream->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED
                               : false;
    if (prohibits) {
      stream->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      refused = true;
    }
  }
  return refused;
}

}  // namespace

void note_call() {
  thread_local bool noted = false;
  if (noted) {
    return;
  }
  noted = true;
  static std::atomic<bool> first{true};
  if (!first.exchange(false) && thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
    driver().foreign_global.fetch_add(1);
  }
}

CUresult check_unsafe() {
  std::lock_guard lock(driver().mutex);
  return unsafe_call_refused(driver()) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// Gives `op` to the stream's queue, or, while it captures, to the graph (never run).
CUresult enqueue(CUstream stream, Queue::Op op) {
  if (stream == nullptr) {
    return CUDA_ERROR_INVALID_HANDLE;  // the tests use created streams only
  }
  {
    Driver& d = driver();
    std::lock_guard lock(d.mutex);
    if (stream->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
      return CUDA_SUCCESS;
    }
  }
  stream->pushed.fetch_add(1);
  stream->queue->push([stream, op = std::move(op)] {
    if (!op()) {
      return false;
    }
    stream->done.fetch_add(1, std::memory_order_release);
    return true;
  });
  return CUDA_SUCCESS;
}

namespace {

bool idle(CUstream stream) {
  return stream->done.load(std::memory_order_acquire) == stream->pushed.load();
}

CUresult init(unsigned int /*flags*/) {
  Driver& d = driver();
  std::lock_guard lock(d.mutex);
  if (d.devices <= 0) {
    return CUDA_ERROR_NO_DEVICE;
  }
  if (!d.initialized) {
    d.contexts.resize(static_cast<std::size_t>(d.devices));
    for (int i = 0; i < d.devices; ++i) {
      d.contexts[static_cast<std::size_t>(i)].device = i;
    }
    d.initialized = true;
  }
  return CUDA_SUCCESS;
}

bool initialized() {
  std::lock_guard lock(driver().mutex);
  return driver().initialized;
}

CUresult get_error_name(CUresult result, const char** name) {
  static constexpr std::pair<CUresult, const char*> kNames[] = {
      {CUDA_SUCCESS, "CUDA_SUCCESS"},
      {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
      {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
      {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
      {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
      {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
      {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
      {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
      {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY"},
      {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE"},
      {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
      {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
      {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
  };
  for (const auto& [code, text] : kNames) {
    if (code == result) {
      *name = text;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult get_error_string(CUresult result, const char** text) {
  if (get_error_name(result, text) != CUDA_SUCCESS) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *text = result == CUDA_SUCCESS ? "no error" : "an error of the fake CUDA driver";
  return CUDA_SUCCESS;
}

CUresult device_get_count(int* count) {
  *count = initialized() ? driver().devices : 0;
  return initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult device_get(CUdevice* device, int ordinal) {
  if (!initialized()) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  if (ordinal < 0 || ordinal >= driver().devices) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult device_get_attribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (device < 0 || device >= driver().devices) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *value =
      attribute == CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS && driver().memops ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult device_get_pci_bus_id(char* id, int length, CUdevice device) {
  if (device < 0 || device >= driver().devices || length < 13) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  (void)std::snprintf(id, static_cast<std::size_t>(length), "0000:%02x:00.0", device + 1);
  return CUDA_SUCCESS;
}

CUresult device_primary_ctx_retain(CUcontext* context, CUdevice device) {
  if (!initialized()) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  if (device < 0 || device >= driver().devices) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *context = &driver().contexts[static_cast<std::size_t>(device)];
  return CUDA_SUCCESS;
}

CUresult ctx_get_current(CUcontext* context) {
  *context = current;
  return initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult ctx_set_current(CUcontext context) {
  current = context;
  return CUDA_SUCCESS;
}

CUresult ctx_get_device(CUdevice* device) {
  if (current == nullptr) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  *device = current->device;
  return CUDA_SUCCESS;
}

CUresult stream_create(CUstream* stream, unsigned int /*flags*/) {
  if (current == nullptr) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  Driver& d = driver();
  std::lock_guard lock(d.mutex);
  // NOLINTNEXTLINE(cppcoreguidelines-owning-memory): streams live to the process's end
  auto* created = new CUstream_st;
  created->id = ++d.streams;
  created->context = current;
  if (d.one_queue) {
    if (d.shared_queue == nullptr) {
      d.shared_queue = new Queue;  // NOLINT(cppcoreguidelines-owning-memory): as the streams
    }
    created->queue = d.shared_queue;
  } else {
    created->queue = new Queue;  // NOLINT(cppcoreguidelines-owning-memory): as the streams
  }
  d.made_streams.push_back(created);
  *stream = created;
  return CUDA_SUCCESS;
}

CUresult stream_query(CUstream stream) {
  if (CUresult refused = check_unsafe(); refused != CUDA_SUCCESS) {
    return refused;
  }
  return idle(stream) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult stream_synchronize(CUstream stream) {
  if (CUresult refused = check_unsafe(); refused != CUDA_SUCCESS) {
    return refused;
  }
  while (!idle(stream)) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return CUDA_SUCCESS;
}

CUresult stream_get_ctx(CUstream stream, CUcontext* context) {
  *context = stream->context;
  return CUDA_SUCCESS;
}

// NOLINTNEXTLINE(google-runtime-int): CUDA's type
CUresult stream_get_id(CUstream stream, unsigned long long* id) {
  *id = stream->id;
  return CUDA_SUCCESS;
}

CUresult stream_is_capturing(CUstream stream, CUstreamCaptureStatus* status) {
  std::lock_guard lock(driver().mutex);
  *status = stream->capture;
  return CUDA_SUCCESS;
}

CUresult stream_begin_capture(CUstream stream, CUstreamCaptureMode mode) {
  Driver& d = driver();
  std::lock_guard lock(d.mutex);
  if (stream->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    return CUDA_ERROR_ILLEGAL_STATE;
  }
  stream->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  stream->capture_mode = mode;
  stream->capture_thread = std::this_thread::get_id();
  d.capturing.push_back(stream);
  return CUDA_SUCCESS;
}

CUresult stream_end_capture(CUstream stream, CUgraph* graph) {
  Driver& d = driver();
  std::lock_guard lock(d.mutex);
  if (stream->capture == CU_STREAM_CAPTURE_STATUS_NONE) {
    return CUDA_ERROR_ILLEGAL_STATE;
  }
  const bool invalidated = stream->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  stream->capture = CU_STREAM_CAPTURE_STATUS_NONE;
  std::erase(d.capturing, stream);
  static CUgraph_st one_graph;
  *graph = invalidated ? nullptr : &one_graph;
  return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

CUresult thread_exchange_stream_capture_mode(CUstreamCaptureMode* mode) {
  std::swap(thread_mode, *mode);
  return CUDA_SUCCESS;
}

// A 64-bit word at a device address (host memory here).
std::atomic<std::uint64_t>* word_at(CUdeviceptr address) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the fake's device addresses are host addresses
  return reinterpret_cast<std::atomic<std::uint64_t>*>(address);
}

CUresult stream_batch_mem_op(CUstream stream, unsigned int count, CUstreamBatchMemOpParams* params,
                             unsigned int /*flags*/) {
  if (!driver().memops) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (count == 0 || count > 255) {  // CUDA's documented limit: fewer than 256
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (unsigned int i = 0; i < count; ++i) {
    const CUstreamBatchMemOpParams& param = params[i];
    if (param.operation == CU_STREAM_MEM_OP_WRITE_VALUE_64) {
      std::atomic<std::uint64_t>* word = word_at(param.writeValue.address);
      const std::uint64_t value = param.writeValue.value64;
      (void)enqueue(stream, [word, value] {
        std::atomic_thread_fence(std::memory_order_seq_cst);  // the default: after a fence
        word->store(value, std::memory_order_release);
        return true;
      });
    } else if (param.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64 &&
               (param.waitValue.flags & 0x3U) == CU_STREAM_WAIT_VALUE_GEQ) {
      std::atomic<std::uint64_t>* word = word_at(param.waitValue.address);
      const std::uint64_t value = param.waitValue.value64;
      (void)enqueue(stream, [word, value] {
        // CU_STREAM_WAIT_VALUE_GEQ: (int64_t)(*word - value) >= 0, a cyclic comparison
        return static_cast<std::int64_t>(word->load(std::memory_order_acquire) - value) >= 0;
      });
    } else {
      return CUDA_ERROR_NOT_SUPPORTED;  // what lockstep does not use
    }
  }
  return CUDA_SUCCESS;
}

CUresult launch_host_func(CUstream stream, CUhostFn function, void* data) {
  return enqueue(stream, [function, data] {
    function(data);
    return true;
  });
}

CUresult mem_alloc(CUdeviceptr* pointer, size_t bytes) {
  if (CUresult refused = check_unsafe(); refused != CUDA_SUCCESS) {
    return refused;
  }
  *pointer = reinterpret_cast<CUdeviceptr>(std::calloc(1, bytes));  // NOLINT: never freed
  return *pointer != 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult mem_host_register(void* pointer, size_t bytes, unsigned int /*flags*/) {
  if (CUresult refused = check_unsafe(); refused != CUDA_SUCCESS) {
    return refused;
  }
  return pointer != nullptr && bytes > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult mem_host_get_device_pointer(CUdeviceptr* device, void* host, unsigned int /*flags*/) {
  *device = reinterpret_cast<CUdeviceptr>(host);
  return CUDA_SUCCESS;
}

// An entry point that notes its caller first (note_call).
template <auto F>
struct Noted;
template <class... A, CUresult (*F)(A...)>
struct Noted<F> {
  static CUresult call(A... args) {
    note_call();
    return F(args...);
  }
};
template <auto F>
void* entry() {
  return reinterpret_cast<void*>(&Noted<F>::call);
}

const std::map<std::string_view, void*>& entries() {
  // NOLINTNEXTLINE(cppcoreguidelines-owning-memory): never destroyed
  static const auto* table = new std::map<std::string_view, void*>{
      {"cuInit", entry<init>()},
      {"cuGetErrorName", entry<get_error_name>()},
      {"cuGetErrorString", entry<get_error_string>()},
      {"cuDeviceGetCount", entry<device_get_count>()},
      {"cuDeviceGet", entry<device_get>()},
      {"cuDeviceGetAttribute", entry<device_get_attribute>()},
      {"cuDeviceGetPCIBusId", entry<device_get_pci_bus_id>()},
      {"cuDevicePrimaryCtxRetain", entry<device_primary_ctx_retain>()},
      {"cuCtxGetCurrent", entry<ctx_get_current>()},
      {"cuCtxSetCurrent", entry<ctx_set_current>()},
      {"cuCtxGetDevice", entry<ctx_get_device>()},
      {"cuStreamCreate", entry<stream_create>()},
      {"cuStreamQuery", entry<stream_query>()},
      {"cuStreamSynchronize", entry<stream_synchronize>()},
      {"cuStreamGetCtx", entry<stream_get_ctx>()},
      {"cuStreamGetId", entry<stream_get_id>()},
      {"cuStreamIsCapturing", entry<stream_is_capturing>()},
      {"cuStreamBeginCapture", entry<stream_begin_capture>()},
      {"cuStreamEndCapture", entry<stream_end_capture>()},
      // Not noted: a thread's mode is what its other calls are noted in.
      {"cuThreadExchangeStreamCaptureMode",
       reinterpret_cast<void*>(thread_exchange_stream_capture_mode)},
      {"cuStreamBatchMemOp", entry<stream_batch_mem_op>()},
      {"cuStreamWaitEvent", entry<stream_wait_event>()},
      {"cuLaunchHostFunc", entry<launch_host_func>()},
      {"cuMemAlloc", entry<mem_alloc>()},
      {"cuMemHostRegister", entry<mem_host_register>()},
      {"cuMemHostGetDevicePointer", entry<mem_host_get_device_pointer>()},
      {"cuEventCreate", entry<event_create>()},
      {"cuEventRecord", entry<event_record>()},
      {"cuEventSynchronize", entry<event_synchronize>()},
      {"cuIpcGetEventHandle", entry<ipc_get_event_handle>()},
      {"cuIpcOpenEventHandle", entry<ipc_open_event_handle>()},
  };
  return *table;
}

}  // namespace
}  // namespace lockstep::fake_cuda

// What the tests look for to know that the fake, not a real driver, was loaded.
extern "C" __attribute__((visibility("default"))) const int lockstep_fake_cuda = 1;

// Threads other than the first to call the driver whose first call was in the global capture
// mode (the library's own threads must put themselves in the relaxed mode first).
extern "C" __attribute__((visibility("default"))) int lockstep_fake_cuda_foreign_global() {
  return lockstep::fake_cuda::driver().foreign_global.load();
}

extern "C" {

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(
    const char* symbol, void** pfn, int /*cudaVersion*/, cuuint64_t /*flags*/,
    CUdriverProcAddressQueryResult* symbolStatus) {
  const auto& table = lockstep::fake_cuda::entries();
  const auto found = table.find(symbol);
  *pfn = found == table.end() ? nullptr : found->second;
  if (symbolStatus != nullptr) {
    *symbolStatus =
        *pfn != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  return *pfn != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // extern "C"
