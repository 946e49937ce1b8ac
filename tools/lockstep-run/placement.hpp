// --cpu-bind: which CPUs each local rank gets (cores, NUMA nodes, the GPU's NUMA node).
#pragma once

#include <optional>

#include "options.hpp"

namespace lockstep::run {

// --cpu-bind: each local rank's CPUs; the exit status (2) when the mode cannot apply.
std::optional<int> resolve_cpu_bind(Options& options);

}  // namespace lockstep::run
