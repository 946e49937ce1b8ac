// Built without CUDA's headers: the device queries (devices.hpp) say so.
#include <string>

#include "gpu/devices.hpp"

namespace lockstep::detail {

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
