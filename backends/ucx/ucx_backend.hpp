// The UCX backend: node leaders meet through UCP active messages (internal).
#pragma once

#include <memory>

#include "backend.hpp"

namespace lockstep::detail {

// Joins the other leaders: node 0's leader listens on config.job.master_addr:master_port (UCX's
// client-server connection), the others connect to it, retrying until `config.deadline`, and
// present the job's identity; node 0 answers with every leader's UCX worker address and a random
// job token, and each leader then connects to every other directly.
std::unique_ptr<Backend> make_ucx_backend(const LeaderConfig& config);

}  // namespace lockstep::detail
