// Reading the job's description from the environment (internal).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/log.hpp"
#include "lockstep/wait_policy.hpp"

namespace lockstep::detail {

// Looks up one environment variable; empty when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// The real environment of this process.
EnvLookup process_environment();

// The most processes one node's segment takes (a segment of 4096 slots is 2.3 MiB); a job that
// puts more on a node is refused with ConfigError rather than laid out.
inline constexpr int kMaxLocalProcesses = 4096;

// What joining its node's segment takes of a process and its job (engine/segment.hpp's
// NodeSegment::join), and no more.
struct NodeMember {
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;  // -1: not given; the node's processes elect it when they join
  int local_size = 1;
  int node_index = 0;
  int num_nodes = 1;
  std::string identity;  // unique per job (and per attempt); names the node's segment
  // LOCKSTEP_LAUNCH_ID (lockstep-run sets a random one per launch; 0: none): the node's
  // processes must share it, so that two launches given one job id never meet.
  std::uint64_t launch = 0;
  std::chrono::milliseconds join_timeout{300'000};
};

// Who this process is in its job. Validated: every index lies inside its size.
struct JobConfig : NodeMember {
  std::string source = "none";  // which set of variables described the job
  WaitPolicy wait_policy = WaitPolicy::adaptive;
  // LOCKSTEP_STALL_WARNING (seconds; 0: never): a wait or a join that lasts this long says what
  // it waits for, then again after twice as long each time.
  std::chrono::milliseconds stall_warning{60'000};
  // LOCKSTEP_CHECK: "kinds" (the default: processes that meet in an episode from different
  // calls, as a wait_for_everyone with a main_process_first, are an error, checked by the
  // calls other than wait_for_everyone) or "strict" (and from different places of one call,
  // checked by every call).
  bool strict_check = false;
  // Cross-node jobs only (num_nodes > 1): where node 0's main process listens for the others
  // (LOCKSTEP_MASTER_ADDR, else MASTER_ADDR; LOCKSTEP_MASTER_PORT, else the port beside
  // MASTER_PORT: launch_env.hpp's rendezvous_port_for), which variable gave that port (for
  // errors), and the backend that connects the nodes (LOCKSTEP_BACKEND, one of
  // known_backends(); empty: the first one built).
  std::string master_addr;
  int rendezvous_port = 0;
  std::string rendezvous_port_source;  // "LOCKSTEP_MASTER_PORT=N" or "MASTER_PORT=N + 1"
  std::string backend;
  // LOCKSTEP_LINK_TIMEOUT (seconds, 1 to 3600): how long a node's link to node 0 may go
  // unanswered before the job fails naming the node the network no longer reaches.
  std::chrono::milliseconds link_timeout{5'000};
  // LOCKSTEP_GPU_BARRIER: "events" (the default) or "flags" (see gpu/stream_barrier.hpp); 0.2's
  // "memops" is read as "flags". Flags becomes the default once tools/gpu-check has passed on a
  // GPU.
  std::string gpu_barrier = "events";
  // LOCKSTEP_LOG (or LOCKSTEP_DEBUG=1): what the process says about itself (base/log.hpp).
  LogLevel log_level = LogLevel::off;
  // The variables the job's shape was read from, "NAME=value ..." (for the log).
  std::string source_variables;
};

// Every backend lockstep has, built into this copy or not, and the ones built, in order of
// preference (by name: backends/meson.build generates both lists into this room; the backends
// themselves are in membership/backend.hpp's registry).
std::vector<std::string> known_backends();
std::vector<std::string> built_backends();
// The backend `config`'s job connects its nodes with: LOCKSTEP_BACKEND, else the first one built
// (empty when none is).
std::string backend_in_use(const JobConfig& config);

// Reads the first complete set of variables (lockstep-run, torchrun, Open MPI, MPICH/Hydra,
// Slurm). Throws ConfigError naming the variable and its value when one is malformed or the set
// is inconsistent, or when only part of a set is present and no other set is complete.
JobConfig read_job_config(const EnvLookup& env, WaitPolicy default_policy);

}  // namespace lockstep::detail
