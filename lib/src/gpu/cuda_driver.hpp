// The CUDA driver, opened at run time (internal; only lib/src/gpu and the NCCL backend use it).
//
// libcuda.so.1 is opened on first use and never closed; every entry point is looked up once with
// cuGetProcAddress at the CUDA 12.0 ABI (a driver of CUDA 12 or later). Nothing links CUDA: a
// build with the GPU code starts on a machine without a driver, and a program that never asks
// for a GPU never loads one.
#pragma once

#include <cuda.h>  // the driver's types only

#include <string>

namespace lockstep::detail::cuda {

struct Driver {
  CUresult (*init)(unsigned int);
  CUresult (*get_error_name)(CUresult, const char**);
  CUresult (*get_error_string)(CUresult, const char**);
  CUresult (*device_get_count)(int*);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*device_get_attribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*device_get_pci_bus_id)(char*, int, CUdevice);
  CUresult (*device_primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*ctx_get_device)(CUdevice*);
  CUresult (*stream_create)(CUstream*, unsigned int);
  CUresult (*stream_query)(CUstream);
  CUresult (*stream_get_ctx)(CUstream, CUcontext*);
  CUresult (*stream_get_id)(CUstream, unsigned long long*);  // NOLINT(google-runtime-int): CUDA's
  CUresult (*stream_is_capturing)(CUstream, CUstreamCaptureStatus*);
  CUresult (*thread_exchange_stream_capture_mode)(CUstreamCaptureMode*);
  CUresult (*stream_batch_mem_op)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);
  CUresult (*stream_wait_event)(CUstream, CUevent, unsigned int);
  CUresult (*mem_alloc)(CUdeviceptr*, size_t);
  CUresult (*mem_host_register)(void*, size_t, unsigned int);
  CUresult (*mem_host_get_device_pointer)(CUdeviceptr*, void*, unsigned int);
  CUresult (*event_create)(CUevent*, unsigned int);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*event_synchronize)(CUevent);
  CUresult (*ipc_get_event_handle)(CUipcEventHandle*, CUevent);
  CUresult (*ipc_open_event_handle)(CUevent*, CUipcEventHandle);
};

// The driver, opened and initialized (cuInit) on the first call; null, with `why` saying why
// (no libcuda.so.1, a driver older than CUDA 12, cuInit failed: no device), when there is none.
// Thread-safe; the answer never changes within a process.
const Driver* driver(std::string& why) noexcept;
// The same, or ConfigError "<what>: no CUDA driver: <why>".
const Driver& driver(const char* what);

// "CUDA_ERROR_INVALID_VALUE (invalid argument)": a result as CUDA names it.
std::string describe(const Driver& cuda, CUresult result);
// Throws Error "<what>: <call> failed: <describe>" unless `result` is CUDA_SUCCESS.
void check(const Driver& cuda, CUresult result, const char* what, const char* call);

// The calling thread in CUDA's relaxed stream-capture mode while this lives, then in its own
// again. For the library's calls on a user's thread that CUDA counts as potentially unsafe during
// a capture (cuMemHostRegister, cuMemAlloc, a synchronization, a query): in the default global
// mode, while any thread of the process captures a graph in that mode, such a call fails
// (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and invalidates that graph, though it touches none of
// its streams. (The relay's thread is relaxed for good: StreamOps::enter_thread.)
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const Driver& cuda) noexcept : cuda_(cuda) {
    (void)cuda_.thread_exchange_stream_capture_mode(&mode_);
  }
  ~RelaxedCapture() { (void)cuda_.thread_exchange_stream_capture_mode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  const Driver& cuda_;
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;  // the thread's, while this lives
};

// The device of the calling thread's current context (the runtime's cudaSetDevice makes one
// current); Error naming `what` when the thread has none.
CUdevice current_device(const Driver& cuda, const char* what);

}  // namespace lockstep::detail::cuda
