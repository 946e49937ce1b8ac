#include "node_worker_cuda.hpp"

#include <iostream>
#include <random>
#include <vector>

#include "fake_cuda_client.hpp"

namespace lockstep::testing {

int cuda_stream_rounds(lockstep::State& state, std::atomic<std::uint64_t>* work, int rounds) {
  using lockstep::fake_cuda::launch;
  const int me = state.process_index();
  const int n = state.num_processes();
  CUstream stream = lockstep::fake_cuda::stream_on(0);
  std::mt19937 random(static_cast<unsigned>(me) * 7919U + 3U);
  std::atomic<int> early{0};
  struct Work {
    std::atomic<std::uint64_t>* word;
    std::uint64_t round;
    unsigned delay_us;
    void operator()() const {
      if (delay_us > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      }
      word->store(round, std::memory_order_release);
    }
  };
  struct Check {
    std::atomic<std::uint64_t>* work;
    int n;
    std::uint64_t round;
    std::atomic<int>* early;
    void operator()() const {
      for (int p = 0; p < n; ++p) {
        if (work[p].load(std::memory_order_acquire) < round) {
          early->fetch_add(1);
        }
      }
    }
  };
  std::vector<Work> works(static_cast<std::size_t>(rounds));
  std::vector<Check> checks(static_cast<std::size_t>(rounds));
  for (int r = 0; r < rounds; ++r) {
    const auto i = static_cast<std::size_t>(r);
    works[i] = {&work[me], i + 1, static_cast<unsigned>(random() % 8 == 0 ? random() % 500 : 0)};
    checks[i] = {work, n, i + 1, &early};
    launch(stream, &works[i]);
    state.wait_for_everyone(stream);
    launch(stream, &checks[i]);
  }
  const bool drained = lockstep::fake_cuda::finish(stream, std::chrono::seconds(30));
  state.wait_for_everyone();
  const int foreign = lockstep::fake_cuda::Fake::get().foreign_global();
  std::cout << "RESULT cuda-streams " << rounds << " early " << early.load() << " foreign-global "
            << foreign << (drained ? "" : " NOT DRAINED") << std::endl;
  return early.load() == 0 && foreign == 0 && drained ? 0 : 1;
}

}  // namespace lockstep::testing
