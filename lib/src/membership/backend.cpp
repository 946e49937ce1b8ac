#include "membership/backend.hpp"

#include <algorithm>

#include "base/text.hpp"
#include "engine/whereabouts.hpp"  // other_nodes_text
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

const BackendType& find_built(const std::string& name) {
  for (const BackendType* type : built_backend_types()) {
    if (name == type->name) {
      return *type;
    }
  }
  throw ConfigError("lockstep: no backend named '" + name + "'");
}

}  // namespace

std::string places_text(const LeaderLinks& links, const std::vector<int>& nodes) {
  if (nodes.empty()) {
    return {};
  }
  const std::optional<NodePlaces> places = links.places(nodes);
  return places ? other_nodes_text(nodes, places->told, places->waited) : std::string();
}

std::vector<int> nodes_but(const LeaderLinks& links, int me) {
  std::vector<int> nodes;
  for (const NodeInfo& info : links.nodes()) {
    if (info.node != me) {
      nodes.push_back(info.node);
    }
  }
  return nodes;
}

template <class Call>
auto Leaders::latched(const char* what, Call call) {
  std::lock_guard lock(mutex_);
  if (broken_) {
    throw_failure(*broken_, std::string(what) + ": the job cannot go on: ");
  }
  try {
    return call();
  } catch (const std::exception& error) {
    broken_ = failure_of(error, what);
    throw;
  }
}

void Leaders::barrier(std::optional<Clock::time_point> deadline, const char* what) {
  latched(what, [&] { backend_->barrier(deadline, what); });
}

std::vector<std::vector<std::byte>> Leaders::allgather(std::span<const std::byte> part,
                                                       std::optional<Clock::time_point> deadline,
                                                       const char* what) {
  return latched(what, [&] {
    std::vector<std::vector<std::byte>> parts = backend_->allgather(part, deadline, what);
    if (parts.size() != backend_->nodes().size()) {
      throw Error(std::string(what) + ": the " + backend_->name() + " backend returned " +
                  std::to_string(parts.size()) + " parts for " +
                  std::to_string(backend_->nodes().size()) + " machines");
    }
    return parts;
  });
}

std::vector<std::byte> Leaders::share(std::span<const std::byte> data,
                                      std::optional<Clock::time_point> deadline, const char* what) {
  return latched(what, [&] { return backend_->share(data, deadline, what); });
}

void Leaders::abort(const Failure& failure) noexcept {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    backend_->cancel();  // the relay's meet ends within a slice; the job is over anyway
    lock.lock();
  }
  abort_locked(failure);
}

bool Leaders::try_abort(const Failure& failure) noexcept {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    return false;
  }
  abort_locked(failure);
  return true;
}

void Leaders::abort_locked(const Failure& failure) noexcept {
  if (!broken_) {
    broken_ = failure;
  }
  backend_->abort(failure);
}

void Backend::check_cancelled(const char* what) const {
  if (cancelled_.load(std::memory_order_relaxed)) {
    throw Error(std::string(what) +
                ": this process stopped waiting for the other nodes (it leaves the job, or its "
                "node cannot go on)");
  }
}

void check_backend_built(const JobConfig& job) {
  auto built = built_backends();
  if (built.empty()) {
    throw ConfigError("lockstep: this job spans " + std::to_string(job.num_nodes) +
                      " nodes, but this build of lockstep has no cross-node backend (rebuild "
                      "with UCX: install libucx-dev and configure with -Ducx=enabled)");
  }
  if (!job.backend.empty() && std::find(built.begin(), built.end(), job.backend) == built.end()) {
    throw ConfigError("lockstep: LOCKSTEP_BACKEND=" + job.backend +
                      ": this build of lockstep has no such backend (it has: " + comma_list(built) +
                      ")");
  }
}

std::unique_ptr<Leaders> join_leaders(const LeaderConfig& config) {
  check_backend_built(config.job);
  const BackendType& type = find_built(backend_in_use(config.job));
  std::unique_ptr<Bootstrap> bootstrap;
  if (type.needs_bootstrap) {
    bootstrap = make_bootstrap(config);
  }
  return std::make_unique<Leaders>(type.make(config, std::move(bootstrap)));
}

std::unique_ptr<Bootstrap> make_bootstrap(const LeaderConfig& config) {
  for (const BackendType* type : built_backend_types()) {
    if (type->make_bootstrap != nullptr) {
      return type->make_bootstrap(config);
    }
  }
  throw ConfigError("lockstep: no backend of this build can bootstrap another");
}

}  // namespace lockstep::detail
