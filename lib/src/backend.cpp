#include "backend.hpp"

#include "lockstep/error.hpp"

#ifdef LOCKSTEP_HAVE_UCX
#include "ucx/ucx_backend.hpp"
#endif
#ifdef LOCKSTEP_HAVE_NCCL_BACKEND
#include "nccl/nccl_backend.hpp"
#endif

namespace lockstep::detail {

void throw_failure(const Failure& failure, const std::string& context) {
  std::string message = context + failure.message;
  switch (failure.kind) {
    case FailureKind::timeout:
      throw TimeoutError(message, failure.missing);
    case FailureKind::peer_lost:
      throw PeerLostError(message, failure.rank);
    case FailureKind::config:
      throw ConfigError(message);
    case FailureKind::error:
      break;
  }
  throw Error(message);
}

Failure failure_of(const std::exception& error, const char* what) {
  Failure failure;
  failure.message = error.what();
  const std::string prefix = std::string(what) + ": ";
  if (failure.message.starts_with(prefix)) {
    failure.message.erase(0, prefix.size());
  }
  if (const auto* timeout = dynamic_cast<const TimeoutError*>(&error)) {
    failure.kind = FailureKind::timeout;
    failure.missing = timeout->missing();
  } else if (const auto* lost = dynamic_cast<const PeerLostError*>(&error)) {
    failure.kind = FailureKind::peer_lost;
    failure.rank = lost->process_index();
  } else if (dynamic_cast<const ConfigError*>(&error) != nullptr) {
    failure.kind = FailureKind::config;
  }
  return failure;
}

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
