// The job environment, written: what a launcher gives each process it starts, and what a job
// leaves on a machine (internal; the reading side is job_config.hpp's read_job_config).
//
// lockstep-run, the tests and the bench start processes through job_environment(), so the
// variables and the identity's spelling live here once; read_job_config(job_environment(spec))
// gives back the spec (tests/job/job_config_test.cpp checks the round trip). What a job leaves
// behind is the engine's to clear (engine/leftovers.hpp).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::detail {

// One process of a job started by lockstep-run (its variables: torchrun's, plus lockstep's).
struct LaunchSpec {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node_index = 0;
  int num_nodes = 1;
  std::string job_id;  // LOCKSTEP_JOB_ID
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launch_id;    // LOCKSTEP_LAUNCH_ID (empty: none)
  std::string backend;      // LOCKSTEP_BACKEND (empty: unset)
  std::string wait_policy;  // LOCKSTEP_WAIT_POLICY (empty: unset)
};

// The variables, in the order a launcher sets them.
std::vector<std::pair<std::string, std::string>> job_environment(const LaunchSpec& spec);

// Every variable that describes a job to lockstep (any launcher family's): what a launcher
// clears before it sets its own.
const std::vector<std::string>& job_variables();

// Where lockstep's rendezvous listens on node 0, given MASTER_PORT: the next port up
// (MASTER_PORT + 1; MASTER_PORT - 1 for 65535), so that torch.distributed's store, which holds
// MASTER_PORT itself, and lockstep never fight over one port in a job that uses both.
// LOCKSTEP_MASTER_PORT, when set, names lockstep's port instead (job_config.cpp).
constexpr int rendezvous_port_for(int master_port) {
  return master_port < 65535 ? master_port + 1 : master_port - 1;
}

// A MASTER_PORT for a job on this machine (0 if none could be found): a TCP port on 127.0.0.1
// that nobody listens on this moment, and whose rendezvous_port_for() is free too. For
// lockstep-run --standalone, the tests' and the bench's simulated nodes.
int free_port();

// The identity of the job whose LOCKSTEP_JOB_ID is `job_id` (it names the job's segments).
std::string job_identity(const std::string& job_id);
// The longest identity a job may have (a node segment records it whole: engine/layout.hpp).
inline constexpr std::size_t kMaxIdentity = 480;

}  // namespace lockstep::detail
