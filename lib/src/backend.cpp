#include "backend.hpp"

#include "lockstep/error.hpp"

#ifdef LOCKSTEP_HAVE_UCX
#include "ucx/ucx_backend.hpp"
#endif
#ifdef LOCKSTEP_HAVE_NCCL_BACKEND
#include "nccl/nccl_backend.hpp"
#endif

namespace lockstep::detail {

std::vector<std::string> built_backends() {
  std::vector<std::string> names;
#ifdef LOCKSTEP_HAVE_UCX
  names.emplace_back("ucx");
#endif
#ifdef LOCKSTEP_HAVE_NCCL_BACKEND
  names.emplace_back("nccl");
#endif
  return names;
}

void check_backend_built(const JobConfig& job) {
  auto built = built_backends();
  if (built.empty()) {
    throw ConfigError("lockstep: this job spans " + std::to_string(job.num_nodes) +
                      " nodes, but this build of lockstep has no cross-node backend (rebuild "
                      "with UCX: install libucx-dev and configure with -Ducx=enabled)");
  }
  if (!job.backend.empty() && std::find(built.begin(), built.end(), job.backend) == built.end()) {
    std::string list;
    for (const auto& name : built) {
      list += (list.empty() ? "" : ", ") + name;
    }
    throw ConfigError("lockstep: LOCKSTEP_BACKEND=" + job.backend +
                      ": this build of lockstep has no such backend (it has: " + list + ")");
  }
}

std::unique_ptr<Backend> make_backend(const LeaderConfig& config) {
  check_backend_built(config.job);
  const std::string name =
      config.job.backend.empty() ? built_backends().front() : config.job.backend;
#ifdef LOCKSTEP_HAVE_UCX
  if (name == "ucx") {
    return make_ucx_backend(config);
  }
#endif
#ifdef LOCKSTEP_HAVE_NCCL_BACKEND
  if (name == "nccl") {
    return make_nccl_backend(config);
  }
#endif
  throw ConfigError("lockstep: no backend named '" + name + "'");
}

}  // namespace lockstep::detail
