// Built without CUDA's headers: the stream-ordered barrier and the device queries say so.
#include "gpu/devices.hpp"
#include "gpu/stream_barrier.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {

std::unique_ptr<StreamBarrier> make_cuda_stream_barrier(NodeSegment* /*segment*/,
                                                        const JobConfig& /*config*/) {
  throw ConfigError(
      "lockstep: wait_for_everyone(stream): this build of lockstep has no CUDA support "
      "(reconfigure with -Dcuda=enabled where CUDA's headers are installed)");
}

int visible_device(int /*local_index*/) noexcept {
  return -1;
}

int visible_device_count(std::string& why) {
  why = "this build of lockstep has no CUDA support";
  return 0;
}

std::string device_pci_bus_id(int /*device*/, std::string& why) {
  why = "this build of lockstep has no CUDA support";
  return "";
}

}  // namespace lockstep::detail
