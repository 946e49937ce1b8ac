#include "node_worker_cuda.hpp"

#include <iostream>

#include "fake_cuda_client.hpp"

namespace lockstep::testing {

int cuda_stream_rounds(lockstep::State& state, std::atomic<std::uint64_t>* work, int rounds) {
  const auto& cu = lockstep::fake_cuda::Fake::get();
  std::atomic<int> early{0};
  CUstream stream = lockstep::fake_cuda::stream_on(0);
  // This thread captures a graph on another stream, in CUDA's default (global) mode, all the
  // while: no call of the library's, here or on the relay's thread, may invalidate it.
  CUstream captured = nullptr;
  CU(cu.stream_create(&captured, 0));
  CU(cu.begin_capture(captured, CU_STREAM_CAPTURE_MODE_GLOBAL));
  bool capture_valid = false;
  const bool drained =
      lockstep::fake_cuda::order_work(state, work, &early, rounds, {stream}, 8, 500, [&] {
        CUgraph graph = nullptr;
        capture_valid = cu.end_capture(captured, &graph) == CUDA_SUCCESS;
      });
  state.wait_for_everyone();
  const int foreign = cu.foreign_global();
  std::cout << "RESULT cuda-streams " << rounds << " early " << early.load() << " foreign-global "
            << foreign << (capture_valid ? "" : " CAPTURE INVALIDATED")
            << (drained ? "" : " NOT DRAINED") << std::endl;
  return early.load() == 0 && foreign == 0 && capture_valid && drained ? 0 : 1;
}

}  // namespace lockstep::testing
