// What GPUs this process sees (internal): for State::device(), the launcher's --nproc-per-node
// gpu and --cpu-bind gpu, and the NCCL backend. Opens the CUDA driver (gpu/cuda_driver.hpp) on
// first use, and nothing else of lockstep's GPU code.
#pragma once

#include <string>

namespace lockstep::detail {

// The device a local process should use: its local index modulo the devices CUDA shows it
// (CUDA_VISIBLE_DEVICES applies); -1 when there is none, or this build has no CUDA support.
int visible_device(int local_index) noexcept;
// How many CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 with `why` saying
// why when none (no driver, no device, a build without CUDA).
int visible_device_count(std::string& why);
// The PCI bus id of visible device `device` ("0000:3b:00.0", lower case, as sysfs names it);
// empty with `why` when it cannot be told.
std::string device_pci_bus_id(int device, std::string& why);

}  // namespace lockstep::detail
