#include "gpu/cuda_driver.hpp"

#include <dlfcn.h>

#include <mutex>

#include "lockstep/error.hpp"

namespace lockstep::detail::cuda {
namespace {

// The ABI the entry points are asked for: CUDA 12.0's (cuStreamBatchMemOp's v2 and the rest).
constexpr int kCudaAbi = 12000;

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

struct Loaded {
  Driver driver{};
  std::string why;  // empty when the driver is usable
};

template <class F>
bool bind(GetProcAddress lookup, const char* name, F& function, std::string& why) {
  void* found = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (lookup(name, &found, kCudaAbi, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
      found == nullptr || status != CU_GET_PROC_ADDRESS_SUCCESS) {
    why =
        std::string("the CUDA driver has no ") + name + " (a driver of CUDA 12 or later is needed)";
    return false;
  }
  function = reinterpret_cast<F>(found);
  return true;
}

bool bind_all(GetProcAddress lookup, Driver& d, std::string& why) {
  return bind(lookup, "cuInit", d.init, why) &&
         bind(lookup, "cuGetErrorName", d.get_error_name, why) &&
         bind(lookup, "cuGetErrorString", d.get_error_string, why) &&
         bind(lookup, "cuDeviceGetCount", d.device_get_count, why) &&
         bind(lookup, "cuDeviceGet", d.device_get, why) &&
         bind(lookup, "cuDeviceGetAttribute", d.device_get_attribute, why) &&
         bind(lookup, "cuDeviceGetPCIBusId", d.device_get_pci_bus_id, why) &&
         bind(lookup, "cuDevicePrimaryCtxRetain", d.device_primary_ctx_retain, why) &&
         bind(lookup, "cuCtxGetCurrent", d.ctx_get_current, why) &&
         bind(lookup, "cuCtxSetCurrent", d.ctx_set_current, why) &&
         bind(lookup, "cuCtxGetDevice", d.ctx_get_device, why) &&
         bind(lookup, "cuStreamCreate", d.stream_create, why) &&
         bind(lookup, "cuStreamQuery", d.stream_query, why) &&
         bind(lookup, "cuStreamGetCtx", d.stream_get_ctx, why) &&
         bind(lookup, "cuStreamGetId", d.stream_get_id, why) &&
         bind(lookup, "cuStreamIsCapturing", d.stream_is_capturing, why) &&
         bind(lookup, "cuThreadExchangeStreamCaptureMode", d.thread_exchange_stream_capture_mode,
              why) &&
         bind(lookup, "cuStreamBatchMemOp", d.stream_batch_mem_op, why) &&
         bind(lookup, "cuStreamWaitEvent", d.stream_wait_event, why) &&
         bind(lookup, "cuMemAlloc", d.mem_alloc, why) &&
         bind(lookup, "cuMemHostRegister", d.mem_host_register, why) &&
         bind(lookup, "cuMemHostGetDevicePointer", d.mem_host_get_device_pointer, why) &&
         bind(lookup, "cuEventCreate", d.event_create, why) &&
         bind(lookup, "cuEventRecord", d.event_record, why) &&
         bind(lookup, "cuEventSynchronize", d.event_synchronize, why) &&
         bind(lookup, "cuIpcGetEventHandle", d.ipc_get_event_handle, why) &&
         bind(lookup, "cuIpcOpenEventHandle", d.ipc_open_event_handle, why);
}

Loaded load() {
  Loaded loaded;
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace (the user's runtime opens
  // the same library and shares this instance).
  void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = ::dlerror();  // NOLINT(concurrency-mt-unsafe): under the call_once
    loaded.why = std::string("cannot open libcuda.so.1 (") + (error != nullptr ? error : "?") +
                 "): no NVIDIA driver on this machine";
    return loaded;
  }
  auto lookup = reinterpret_cast<GetProcAddress>(::dlsym(library, "cuGetProcAddress_v2"));
  if (lookup == nullptr) {
    loaded.why = "libcuda.so.1 has no cuGetProcAddress_v2 (a driver of CUDA 12 or later is needed)";
    return loaded;
  }
  if (!bind_all(lookup, loaded.driver, loaded.why)) {
    return loaded;
  }
  if (CUresult result = loaded.driver.init(0); result != CUDA_SUCCESS) {
    loaded.why = "cuInit failed: " + describe(loaded.driver, result);
  }
  return loaded;
}

}  // namespace

const Driver* driver(std::string& why) noexcept {
  static std::once_flag once;
  static Loaded* loaded = nullptr;  // never destroyed: the driver outlives every static
  try {
    std::call_once(once,
                   [] { loaded = new Loaded(load()); });  // NOLINT(cppcoreguidelines-owning-memory)
  } catch (const std::bad_alloc&) {
    why = "out of memory";
    return nullptr;
  }
  if (!loaded->why.empty()) {
    why = loaded->why;
    return nullptr;
  }
  return &loaded->driver;
}

const Driver& driver(const char* what) {
  std::string why;
  const Driver* found = driver(why);
  if (found == nullptr) {
    throw ConfigError(std::string(what) + ": no CUDA driver: " + why);
  }
  return *found;
}

std::string describe(const Driver& cuda, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuda.get_error_name(result, &name) != CUDA_SUCCESS || name == nullptr) {
    return "CUresult " + std::to_string(static_cast<int>(result));
  }
  if (cuda.get_error_string(result, &text) != CUDA_SUCCESS || text == nullptr) {
    return name;
  }
  return std::string(name) + " (" + text + ")";
}

void check(const Driver& cuda, CUresult result, const char* what, const char* call) {
  if (result != CUDA_SUCCESS) {
    throw Error(std::string(what) + ": " + call + " failed: " + describe(cuda, result));
  }
}

CUdevice current_device(const Driver& cuda, const char* what) {
  CUcontext context = nullptr;
  check(cuda, cuda.ctx_get_current(&context), what, "cuCtxGetCurrent");
  if (context == nullptr) {
    throw Error(std::string(what) +
                ": this thread has no current CUDA context: call cudaSetDevice() (or make a "
                "context current) before the first GPU barrier");
  }
  CUdevice device = 0;
  check(cuda, cuda.ctx_get_device(&device), what, "cuCtxGetDevice");
  return device;
}

}  // namespace lockstep::detail::cuda
