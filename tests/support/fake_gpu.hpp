// A fake GPU for the flags-mode stream barrier (lib/src/gpu/flag_barrier.hpp): each "stream" is
// a thread that runs the barrier's memory operations on the same host words a GPU would (the node
// segment's GPU area), in order, with random delays. Shared by the fake-GPU suite and the
// multi-node worker (tests/backends/node_worker.cpp), whose simulated nodes use it.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <thread>

#include "gpu/flag_barrier.hpp"

namespace lockstep::testing {

using lockstep::detail::cyclic_before;
using lockstep::detail::MemOp;

// One fake stream: a thread that runs its operations in order. An operation returns false while
// it cannot complete (a wait); the thread then polls it (spin, yield, then 20 us sleeps).
class FakeStream {
 public:
  using Op = std::function<bool()>;
  // `delay_one_in`: one operation in that many is preceded by a random sleep of up to 200 us.
  explicit FakeStream(unsigned seed, int delay_one_in = 200)
      : random_(seed), delay_one_in_(delay_one_in), thread_([this] { run(); }) {}
  ~FakeStream() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  FakeStream(const FakeStream&) = delete;
  FakeStream& operator=(const FakeStream&) = delete;

  CUstream_st* handle() { return reinterpret_cast<CUstream_st*>(this); }

  void push(Op op) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(op));
    }
    changed_.notify_all();
  }
  void launch(std::function<void()> work) {
    push([work = std::move(work)] {
      work();
      return true;
    });
  }
  // cudaStreamSynchronize with a limit: false if the stream still has work after `limit`.
  bool synchronize(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, limit, [this] { return queue_.empty() && !busy_; });
  }
  // Whether the stream is blocked in a wait now.
  [[nodiscard]] bool waiting() const { return waiting_.load(); }
  // cudaStreamBeginCapture / cudaStreamEndCapture: whether work is being captured into a graph.
  std::atomic<bool> capturing{false};

 private:
  void run() {
    for (;;) {
      Op op;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) {
          return;
        }
        op = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      if (random_() % static_cast<unsigned>(delay_one_in_) == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(random_() % 200));
      }
      for (int tries = 0; !op(); ++tries) {
        waiting_.store(true);
        if (tries < 50) {
          continue;
        }
        if (tries < 100) {
          ::sched_yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        std::lock_guard lock(mutex_);
        if (stop_) {
          return;
        }
      }
      waiting_.store(false);
      {
        std::lock_guard lock(mutex_);
        busy_ = false;
      }
      changed_.notify_all();
    }
  }

  std::mt19937 random_;
  int delay_one_in_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Op> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::atomic<bool> waiting_{false};
  std::thread thread_;
};

// The barrier's stream operations on a fake stream, exactly as CUDA's would run them.
class FakeStreamOps final : public lockstep::detail::StreamOps {
 public:
  // `refuse`: a device that cannot run flags mode (map throws, as CUDA's does on a device without
  // stream memory operations).
  explicit FakeStreamOps(bool refuse = false) : refuse_(refuse) {}
  void map(void* /*area*/, std::size_t /*bytes*/, const char* what) override {
    if (refuse_) {
      throw lockstep::ConfigError(std::string(what) +
                                  ": device 0 has no 64-bit stream memory operations (fake)");
    }
  }
  void enqueue(CUstream_st* stream, std::span<const MemOp> ops, const char* /*what*/) override {
    auto* fake = reinterpret_cast<FakeStream*>(stream);
    for (const MemOp& op : ops) {
      if (op.kind == MemOp::Kind::write) {
        fake->push([op] {
          // CU_STREAM_WRITE_VALUE_DEFAULT: a system-wide fence, then the write.
          std::atomic_thread_fence(std::memory_order_seq_cst);
          op.word->store(op.value, std::memory_order_release);
          return true;
        });
      } else {
        fake->push(
            [op] { return !cyclic_before(op.word->load(std::memory_order_acquire), op.value); });
      }
    }
  }
  bool capturing(CUstream_st* stream, const char* /*what*/) override {
    return reinterpret_cast<FakeStream*>(stream)->capturing.load();
  }
  std::uint64_t stream_id(CUstream_st* stream, const char* /*what*/) override {
    return reinterpret_cast<std::uintptr_t>(stream);
  }
  [[nodiscard]] const volatile std::uint32_t* device_address(
      const std::atomic<std::uint32_t>* word) const noexcept override {
    return reinterpret_cast<const volatile std::uint32_t*>(word);
  }

 private:
  bool refuse_;
};

// `refuse`: this process's fake device cannot run flags mode.
inline void use_fake_gpu(bool refuse = false) {
  lockstep::detail::override_stream_ops(
      [refuse] { return std::make_unique<FakeStreamOps>(refuse); });
}

}  // namespace lockstep::testing
