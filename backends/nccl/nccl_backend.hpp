// The NCCL backend: the node leaders' barrier as a one-element all-reduce on the GPU (internal).
#pragma once

#include <memory>

#include "backend.hpp"

namespace lockstep::detail {

// Joins the other leaders through the UCX backend (which carries NCCL's unique id from node 0
// and reports dead leaders), opens libnccl.so.2 (LOCKSTEP_NCCL_LIBRARY, else the loader's path,
// else the CUDA toolkit's), makes visible_device(0) current and creates a communicator of one
// rank per node. Every NCCL call that can wait is polled against the deadline and the UCX
// backend's failure reports; on either, the communicator is aborted (ncclCommAbort), never waited
// on.
std::unique_ptr<Backend> make_nccl_backend(const LeaderConfig& config);

}  // namespace lockstep::detail
