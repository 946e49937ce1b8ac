#include "membership/backend.hpp"

#include <algorithm>

#include "base/little_endian.hpp"
#include "base/text.hpp"
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

void Leaders::barrier(std::optional<Clock::time_point> deadline, const char* what) {
  std::lock_guard lock(mutex_);
  if (broken_) {
    throw_failure(*broken_, std::string(what) + ": the job cannot go on: ");
  }
  try {
    backend_->barrier(deadline, what);
  } catch (const std::exception& error) {
    broken_ = failure_of(error, what);
    throw;
  }
}

std::vector<std::byte> Leaders::share(std::span<const std::byte> data, bool from_node0,
                                      std::optional<Clock::time_point> deadline, const char* what) {
  std::lock_guard lock(mutex_);
  if (broken_) {
    throw_failure(*broken_, std::string(what) + ": the job cannot go on: ");
  }
  return share_locked(data, from_node0, deadline, what);
}

std::vector<std::vector<std::byte>> Leaders::gather(std::span<const std::byte> part,
                                                    std::optional<Clock::time_point> deadline,
                                                    const char* what) {
  std::lock_guard lock(mutex_);
  if (broken_) {
    throw_failure(*broken_, std::string(what) + ": the job cannot go on: ");
  }
  try {
    if (part.size() > Bootstrap::kMaxPart) {
      throw Error(std::string(what) + ": a machine's part of a gather is at most " +
                  std::to_string(Bootstrap::kMaxPart) + " bytes, not " +
                  std::to_string(part.size()));
    }
    return backend_->gather(part, deadline, what);
  } catch (const std::exception& error) {
    broken_ = failure_of(error, what);
    throw;
  }
}

std::vector<std::byte> Leaders::share_locked(std::span<const std::byte> data, bool from_node0,
                                             std::optional<Clock::time_point> deadline,
                                             const char* what) {
  constexpr std::size_t kChunk = Bootstrap::kMaxBlob;
  constexpr std::size_t kLength = 8;
  try {
    if (from_node0) {
      if (data.size() > kMaxShare) {
        throw Error(std::string(what) + ": at most " + std::to_string(kMaxShare) +
                    " bytes travel between machines, not " + std::to_string(data.size()));
      }
      std::vector<std::byte> framed(kLength + data.size());
      put_le(framed.data(), data.size(), kLength);
      std::copy(data.begin(), data.end(), framed.begin() + kLength);
      for (std::size_t at = 0; at < framed.size(); at += kChunk) {
        const std::size_t n = std::min(kChunk, framed.size() - at);
        (void)backend_->broadcast(std::span(framed).subspan(at, n), deadline, what);
      }
      return {data.begin(), data.end()};
    }
    std::vector<std::byte> framed = backend_->broadcast({}, deadline, what);
    const std::uint64_t length = get_le(framed.data(), std::min(kLength, framed.size()));
    if (framed.size() < kLength || length > kMaxShare) {
      throw Error(std::string(what) + ": node 0 sent a broadcast that is not lockstep's (" +
                  std::to_string(framed.size()) + " bytes, length " + std::to_string(length) + ")");
    }
    // Every piece, the first included, must fit the length it announced: exactly that many
    // bytes are returned (a first piece longer than its length returned them all until
    // 2026-12-03).
    const auto not_adding_up = [&](std::size_t received, bool empty) {
      return Error(std::string(what) + ": node 0's broadcast came in pieces that do not add up (" +
                   (empty ? "an empty piece after " : "") + std::to_string(received) +
                   " bytes of " + std::to_string(length) + ")");
    };
    if (framed.size() > kLength + length) {
      throw not_adding_up(framed.size() - kLength, false);
    }
    while (framed.size() < kLength + length) {
      std::vector<std::byte> more = backend_->broadcast({}, deadline, what);
      if (more.empty() || framed.size() + more.size() > kLength + length) {
        throw not_adding_up(framed.size() - kLength + more.size(), more.empty());
      }
      framed.insert(framed.end(), more.begin(), more.end());
    }
    return {framed.begin() + kLength, framed.end()};
  } catch (const std::exception& error) {
    broken_ = failure_of(error, what);
    throw;
  }
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
  const BackendType& type =
      config.job.backend.empty() ? *built_backend_types().front() : find_built(config.job.backend);
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
