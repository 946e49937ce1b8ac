#include "node_worker_cuda.hpp"

#include <iostream>

#include "fake_cuda_client.hpp"

namespace lockstep::testing {

int cuda_stream_rounds(lockstep::State& state, std::atomic<std::uint64_t>* work, int rounds) {
  std::atomic<int> early{0};
  const bool drained = lockstep::fake_cuda::order_work(state, work, &early, rounds,
                                                       {lockstep::fake_cuda::stream_on(0)}, 8, 500);
  state.wait_for_everyone();
  const int foreign = lockstep::fake_cuda::Fake::get().foreign_global();
  std::cout << "RESULT cuda-streams " << rounds << " early " << early.load() << " foreign-global "
            << foreign << (drained ? "" : " NOT DRAINED") << std::endl;
  return early.load() == 0 && foreign == 0 && drained ? 0 : 1;
}

}  // namespace lockstep::testing
