// The fake CUDA driver's stream engine (tests/fake_cuda/fake_cuda.cpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

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

}  // namespace lockstep::fake_cuda
