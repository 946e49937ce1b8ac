// The fake CUDA driver's shared parts (tests/fake_cuda): its stream engine, its objects, its
// state. Internal to the fake.
#pragma once

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace lockstep::fake_cuda {

// Runs operations in order on its own thread. An operation returns false while it cannot complete
// (a wait); the thread polls it: spins, yields, then sleeps 20 us between polls.
class Queue {
 public:
  using Op = std::function<bool()>;
  Queue() : thread_([this] { run(); }) { thread_.detach(); }  // lives to the process's end

  void push(Op op) {
    {
      std::lock_guard lock(mutex_);
      ops_.push_back(std::move(op));
    }
    changed_.notify_all();
  }

 private:
  void run() {
    for (;;) {
      Op op;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [this] { return !ops_.empty(); });
        op = std::move(ops_.front());
        ops_.pop_front();
      }
      for (int tries = 0; !op(); ++tries) {
        if (tries < 100) {
          continue;
        }
        if (tries < 200) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Op> ops_;
  std::thread thread_;
};

inline int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read before threads
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;  // NOLINT(cert-err34-c)
}

}  // namespace lockstep::fake_cuda

// The driver's opaque types, defined here.
struct CUctx_st {
  int device;
};
struct CUgraph_st {};
struct CUstream_st {
  std::uint64_t id = 0;
  CUctx_st* context = nullptr;
  lockstep::fake_cuda::Queue* queue = nullptr;
  std::atomic<std::uint64_t> pushed{0};  // operations given to the queue
  std::atomic<std::uint64_t> done{0};    // and completed
  // Capture (guarded by the driver's mutex).
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id capture_thread;
};
// An event: its latest record and the latest record its stream has reached.
struct EventWords {
  std::atomic<std::uint64_t> recorded;
  std::atomic<std::uint64_t> completed;
};
struct CUevent_st {
  EventWords* words;
};

namespace lockstep::fake_cuda {

struct Driver {
  std::mutex mutex;
  int devices = env_int("LOCKSTEP_FAKE_CUDA_DEVICES", 1);
  bool memops = env_int("LOCKSTEP_FAKE_CUDA_NO_MEMOPS", 0) == 0;
  bool one_queue = env_int("CUDA_DEVICE_MAX_CONNECTIONS", 8) == 1;
  bool initialized = false;
  std::vector<CUctx_st> contexts;
  std::uint64_t streams = 0;
  Queue* shared_queue = nullptr;
  std::vector<CUstream_st*> capturing;  // streams with a capture begun and not ended
  // Every stream and event made, to the process's end (as CUDA keeps them until destroyed).
  std::vector<CUstream_st*> made_streams;
  std::vector<CUevent_st*> made_events;
  int events_fd = -1;
  EventWords* events = nullptr;
  std::size_t events_used = 0;
  std::map<std::pair<int, int>, EventWords*> opened;  // (pid, fd): another process's events
  // Threads other than the first to call the driver whose first call was made in the global
  // capture mode (the library's own threads must be relaxed first: StreamOps::enter_thread).
  std::atomic<int> foreign_global{0};
};

Driver& driver();
// Notes a call of this thread (Driver::foreign_global).
void note_call();
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the captures disturbed invalidated, where this thread's
// capture mode prohibits a potentially unsafe call now; else CUDA_SUCCESS.
CUresult check_unsafe();
// Gives `op` to the stream's queue, or, while it captures, to the graph (never run).
CUresult enqueue(CUstream stream, Queue::Op op);

// Events (fake_cuda_events.cpp).
CUresult event_create(CUevent* event, unsigned int flags);
CUresult event_record(CUevent event, CUstream stream);
CUresult event_synchronize(CUevent event);
CUresult stream_wait_event(CUstream stream, CUevent event, unsigned int flags);
CUresult ipc_get_event_handle(CUipcEventHandle* handle, CUevent event);
CUresult ipc_open_event_handle(CUevent* event, CUipcEventHandle handle);

}  // namespace lockstep::fake_cuda
