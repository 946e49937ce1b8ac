// A test's own calls into the fake CUDA driver (tests/fake_cuda), which it finds as libcuda.so.1
// through LD_LIBRARY_PATH, looked up as lockstep looks up its own (one instance per process).
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <lockstep/lockstep.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace lockstep::fake_cuda {

// The fake driver's entry points that a test calls itself, looked up as the library looks up its
// own (one instance of libcuda.so.1 per process).
struct Fake {
  CUresult (*init)(unsigned int);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*stream_create)(CUstream*, unsigned int);
  CUresult (*stream_query)(CUstream);
  CUresult (*stream_synchronize)(CUstream);
  CUresult (*launch_host_func)(CUstream, CUhostFn, void*);
  CUresult (*begin_capture)(CUstream, CUstreamCaptureMode);
  CUresult (*end_capture)(CUstream, CUgraph*);
  // Threads other than the first to call the driver whose first call was in the global capture
  // mode (the library's own threads put themselves in the relaxed mode first).
  int (*foreign_global)();

  static const Fake& get() {
    static const Fake fake = load();
    return fake;
  }

 private:
  template <class F>
  static void bind(void* library, const char* name, F& function) {
    using Lookup =
        CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
    auto lookup = reinterpret_cast<Lookup>(::dlsym(library, "cuGetProcAddress_v2"));
    void* found = nullptr;
    if (lookup == nullptr || lookup(name, &found, 12000, 0, nullptr) != CUDA_SUCCESS) {
      throw std::runtime_error(std::string("the fake CUDA driver has no ") + name);
    }
    function = reinterpret_cast<F>(found);
  }
  static Fake load() {
    void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr || ::dlsym(library, "lockstep_fake_cuda") == nullptr) {
      throw std::runtime_error("libcuda.so.1 is not the fake (LD_LIBRARY_PATH must lead to it)");
    }
    Fake f{};
    bind(library, "cuInit", f.init);
    bind(library, "cuDevicePrimaryCtxRetain", f.primary_ctx_retain);
    bind(library, "cuCtxSetCurrent", f.ctx_set_current);
    bind(library, "cuStreamCreate", f.stream_create);
    bind(library, "cuStreamQuery", f.stream_query);
    bind(library, "cuStreamSynchronize", f.stream_synchronize);
    bind(library, "cuLaunchHostFunc", f.launch_host_func);
    bind(library, "cuStreamBeginCapture", f.begin_capture);
    bind(library, "cuStreamEndCapture", f.end_capture);
    f.foreign_global =
        reinterpret_cast<int (*)()>(::dlsym(library, "lockstep_fake_cuda_foreign_global"));
    return f;
  }
};

inline void check(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error(std::string(call) + " failed: " + std::to_string(result));
  }
}
#define CU(call) ::lockstep::fake_cuda::check(call, #call)

// A stream on `device`, whose primary context this thread makes current (what cudaSetDevice and
// cudaStreamCreate do).
inline CUstream stream_on(int device) {
  const Fake& cu = Fake::get();
  CU(cu.init(0));
  CUcontext context = nullptr;
  CU(cu.primary_ctx_retain(&context, device));
  CU(cu.ctx_set_current(context));
  CUstream stream = nullptr;
  CU(cu.stream_create(&stream, 0));
  return stream;
}

// Runs `work` on `stream` (a host function: the fake's kernel).
template <class F>
void launch(CUstream stream, F* work) {
  auto trampoline = [](void* data) { (*static_cast<F*>(data))(); };
  CU(Fake::get().launch_host_func(stream, trampoline, work));
}

// Waits for `stream` to finish its work, at most `limit`: false if it has not.
inline bool finish(CUstream stream, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const CUresult status = Fake::get().stream_query(stream);
    if (status != CUDA_ERROR_NOT_READY) {
      return status == CUDA_SUCCESS;  // finished, or the query was refused (a capture's rule)
    }
    if (std::chrono::steady_clock::now() > end) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Episodes of: this process's work on its stream (one in `slow_one_in` up to `delay_us` late), the
// stream barrier, then a check on the stream that every process's work of the episode is done
// (`work[p]`: the last episode process p's stream finished; `early` counts the checks that found
// one missing). `streams`: used in turn (a call on another stream keeps episode order).
// `before_drain` runs after the last episode's calls, before the streams are waited for. Returns
// whether every stream finished within 30 s (the work lives until then, or until the process ends).
inline bool order_work(lockstep::State& state, std::atomic<std::uint64_t>* work,
                       std::atomic<int>* early, int episodes, const std::vector<CUstream>& streams,
                       unsigned slow_one_in = 4, unsigned delay_us = 300,
                       const std::function<void()>& before_drain = {}) {
  const int me = state.process_index();
  const int n = state.num_processes();
  std::mt19937 random(static_cast<unsigned>(me) * 7919U + 1U);
  struct Work {
    std::atomic<std::uint64_t>* word;
    std::uint64_t episode;
    unsigned delay_us;
    void operator()() const {
      if (delay_us > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      }
      word->store(episode, std::memory_order_release);
    }
  };
  struct Check {
    std::atomic<std::uint64_t>* work;
    int n;
    std::uint64_t episode;
    std::atomic<int>* early;
    void operator()() const {
      for (int p = 0; p < n; ++p) {
        if (work[p].load(std::memory_order_acquire) < episode) {
          early->fetch_add(1);
        }
      }
    }
  };
  std::vector<Work> works(static_cast<std::size_t>(episodes));
  std::vector<Check> checks(static_cast<std::size_t>(episodes));
  for (int e = 0; e < episodes; ++e) {
    const auto i = static_cast<std::size_t>(e);
    CUstream stream = streams[i % streams.size()];
    works[i] = {&work[me], i + 1,
                static_cast<unsigned>(random() % slow_one_in == 0 ? random() % delay_us : 0)};
    checks[i] = {work, n, i + 1, early};
    launch(stream, &works[i]);
    state.wait_for_everyone(stream);
    launch(stream, &checks[i]);
  }
  if (before_drain) {
    before_drain();
  }
  bool drained = true;
  for (CUstream stream : streams) {
    drained = finish(stream, std::chrono::seconds(30)) && drained;
  }
  if (!drained) {
    std::_Exit(3);  // the streams may still run this work, whose memory would go: end here
  }
  return drained;
}

}  // namespace lockstep::fake_cuda
