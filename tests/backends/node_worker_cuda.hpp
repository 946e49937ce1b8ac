// node_worker's scenario through the CUDA driver (tests/backends/node_worker_cuda.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <lockstep/lockstep.hpp>

namespace lockstep::testing {

// Flags mode across nodes through lockstep's CUDA code and the fake CUDA driver
// (tests/fake_cuda, found through LD_LIBRARY_PATH): `rounds` stream barriers on one stream, each
// round's work on the stream first (now and then late), then a check on the stream that every
// process of every node did it; meanwhile the calling thread captures a graph on another stream
// (global mode). Prints "RESULT cuda-streams <rounds> early <checks that found work missing>
// foreign-global <threads of the library's that called the driver in the global capture mode>",
// then " CAPTURE INVALIDATED" if the graph was; 0 when all went well.
int cuda_stream_rounds(lockstep::State& state, std::atomic<std::uint64_t>* work, int rounds);

}  // namespace lockstep::testing
