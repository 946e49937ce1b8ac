// Device queries through the CUDA driver (see devices.hpp).
#include <cctype>

#include "gpu/cuda_driver.hpp"
#include "gpu/devices.hpp"

namespace lockstep::detail {

int visible_device(int local_index) noexcept {
  std::string why;
  const int count = visible_device_count(why);
  return count > 0 ? local_index % count : -1;
}

int visible_device_count(std::string& why) {
  const cuda::Driver* cuda = cuda::driver(why);
  if (cuda == nullptr) {
    return 0;
  }
  int count = 0;
  if (CUresult result = cuda->device_get_count(&count); result != CUDA_SUCCESS) {
    why = "cuDeviceGetCount failed: " + cuda::describe(*cuda, result);
    return 0;
  }
  if (count <= 0) {
    why = "CUDA reports no device";
  }
  return count;
}

std::string device_pci_bus_id(int device, std::string& why) {
  const cuda::Driver* cuda = cuda::driver(why);
  if (cuda == nullptr) {
    return "";
  }
  CUdevice handle = 0;
  char id[64] = {};
  CUresult result = cuda->device_get(&handle, device);
  if (result == CUDA_SUCCESS) {
    result = cuda->device_get_pci_bus_id(id, sizeof id, handle);
  }
  if (result != CUDA_SUCCESS) {
    why = cuda::describe(*cuda, result);
    return "";
  }
  std::string text(id);
  for (char& c : text) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return text;
}

}  // namespace lockstep::detail
