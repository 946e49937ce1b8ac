// The cross-node backend interface (internal).
//
// A job that spans nodes is hierarchical: the processes of each node meet in the node segment,
// and only each node's main process (its leader, local index 0) talks to the other nodes,
// through a Backend. Backends live in backends/<name>/ and are compiled in when their library is
// found (meson -D<name>=auto|enabled|disabled); a single-node job creates none.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "env.hpp"
#include "failure.hpp"
#include "wait.hpp"

namespace lockstep::detail {

using Clock = std::chrono::steady_clock;

// One node of the job, as its leader described it when it joined.
struct NodeInfo {
  int node = 0;
  std::vector<int> ranks;  // the node's processes (ascending); ranks[0] leads it
};

// What a leader brings to the backend's join.
struct LeaderConfig {
  JobConfig job;
  std::vector<int> ranks;      // this node's processes
  Waiter* waiter;              // how this process waits (outlives the backend)
  Clock::time_point deadline;  // for joining
};

class Backend {
 public:
  Backend() = default;
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  [[nodiscard]] virtual const char* name() const noexcept = 0;
  // Every node of the job, by node index (known once the backend is made).
  [[nodiscard]] virtual const std::vector<NodeInfo>& nodes() const noexcept = 0;

  // Waits until every leader has called barrier() as often as this one. Throws TimeoutError
  // naming the processes of the nodes not heard from when `deadline` passes, PeerLostError when
  // a leader is gone, Error when a leader aborted. After a throw the backend is broken: the
  // episode cannot be taken back, so every later call throws the same error.
  virtual void barrier(std::optional<Clock::time_point> deadline, const char* what) = 0;

  // Node 0's leader passes `blob`; every leader returns it (for the bootstrap of another
  // communicator, such as NCCL's unique id). At most kMaxBlob bytes.
  virtual std::vector<std::byte> broadcast(std::span<const std::byte> blob,
                                           std::optional<Clock::time_point> deadline,
                                           const char* what) = 0;
  static constexpr std::size_t kMaxBlob = 4096;

  // Makes progress on the transport and throws (as barrier() would) if a leader is gone or
  // aborted. For backends layered on another (NCCL bootstraps over UCX).
  virtual void poll(const char* /*what*/) {}
  // Throws if another leader's abort has been received (no progress, no system call): a
  // layered backend asks this before it takes an operation as complete (once a node has
  // received the job's abort, none of its processes completes the episode).
  virtual void check_aborted(const char* /*what*/) {}

  // Tells the other leaders that this node cannot go on: their barriers throw `failure`.
  // Best effort, never throws; the backend is broken afterwards.
  virtual void abort(const Failure& failure) noexcept = 0;
};

// The backends this build of lockstep has, in order of preference.
std::vector<std::string> built_backends();

// Throws ConfigError unless this build has a backend for `job` (the one LOCKSTEP_BACKEND names, or
// any). Every process of a multi-node job checks this, not only the leaders.
void check_backend_built(const JobConfig& job);

// Makes the backend `config.job.backend` names (the first built when empty) and joins the other
// leaders through it. ConfigError when none is built or the named one is not.
std::unique_ptr<Backend> make_backend(const LeaderConfig& config);

}  // namespace lockstep::detail
