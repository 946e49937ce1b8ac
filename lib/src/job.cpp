#include "job.hpp"

#include "shm/layout.hpp"  // kMaxIdentity (a constant: job.cpp needs nothing else of the library)

namespace lockstep::detail {

std::vector<std::pair<std::string, std::string>> job_environment(const LaunchSpec& spec) {
  std::vector<std::pair<std::string, std::string>> env = {
      {"RANK", std::to_string(spec.rank)},
      {"LOCAL_RANK", std::to_string(spec.local_rank)},
      {"WORLD_SIZE", std::to_string(spec.world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(spec.local_size)},
      {"GROUP_RANK", std::to_string(spec.node_index)},
      {"GROUP_WORLD_SIZE", std::to_string(spec.num_nodes)},
      {"ROLE_RANK", std::to_string(spec.rank)},
      {"ROLE_WORLD_SIZE", std::to_string(spec.world_size)},
      {"MASTER_ADDR", spec.master_addr},
      {"MASTER_PORT", std::to_string(spec.master_port)},
      {"LOCKSTEP_JOB_ID", spec.job_id},
      {"LOCKSTEP_NNODES", std::to_string(spec.num_nodes)},
  };
  if (!spec.launch_id.empty()) {
    env.emplace_back("LOCKSTEP_LAUNCH_ID", spec.launch_id);
  }
  if (!spec.backend.empty()) {
    env.emplace_back("LOCKSTEP_BACKEND", spec.backend);
  }
  if (!spec.wait_policy.empty()) {
    env.emplace_back("LOCKSTEP_WAIT_POLICY", spec.wait_policy);
  }
  return env;
}

const std::vector<std::string>& job_variables() {
  static const std::vector<std::string> names = {"RANK",
                                                 "LOCAL_RANK",
                                                 "WORLD_SIZE",
                                                 "LOCAL_WORLD_SIZE",
                                                 "GROUP_RANK",
                                                 "GROUP_WORLD_SIZE",
                                                 "ROLE_RANK",
                                                 "ROLE_WORLD_SIZE",
                                                 "MASTER_ADDR",
                                                 "MASTER_PORT",
                                                 "TORCHELASTIC_RUN_ID",
                                                 "TORCHELASTIC_RESTART_COUNT",
                                                 "LOCKSTEP_JOB_ID",
                                                 "LOCKSTEP_NNODES",
                                                 "LOCKSTEP_LAUNCH_ID",
                                                 "LOCKSTEP_BACKEND",
                                                 "LOCKSTEP_WAIT_POLICY",
                                                 "LOCKSTEP_MASTER_ADDR",
                                                 "LOCKSTEP_MASTER_PORT",
                                                 "OMPI_COMM_WORLD_RANK",
                                                 "OMPI_COMM_WORLD_SIZE",
                                                 "OMPI_COMM_WORLD_LOCAL_RANK",
                                                 "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                 "PMI_RANK",
                                                 "PMI_SIZE",
                                                 "MPI_LOCALRANKID",
                                                 "MPI_LOCALNRANKS",
                                                 "SLURM_PROCID",
                                                 "SLURM_NTASKS",
                                                 "SLURM_LOCALID",
                                                 "SLURM_NTASKS_PER_NODE",
                                                 "SLURM_NODEID",
                                                 "SLURM_NNODES",
                                                 "SLURM_JOB_ID",
                                                 "SLURM_STEP_ID",
                                                 "SLURM_NPROCS",
                                                 "SLURM_JOB_NUM_NODES",
                                                 "SLURM_STEP_TASKS_PER_NODE",
                                                 "SLURM_TASKS_PER_NODE"};
  return names;
}

std::string job_identity(const std::string& job_id) {
  return "job=" + job_id;
}

std::size_t max_job_identity() {
  return kMaxIdentity;
}

}  // namespace lockstep::detail
