// Built without CUDA's headers: the stream-ordered barrier says so.
#include "gpu/stream_barrier.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {

std::unique_ptr<StreamBarrier> make_cuda_stream_barrier(NodeSegment* /*segment*/,
                                                        const JobConfig& /*config*/,
                                                        StreamRelay /*relay*/) {
  throw ConfigError(
      "lockstep: wait_for_everyone(stream): this build of lockstep has no CUDA support "
      "(reconfigure with -Dcuda=enabled where CUDA's headers are installed)");
}

}  // namespace lockstep::detail
