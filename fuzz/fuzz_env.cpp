// libFuzzer target: the environment parser (lib/src/job/job_config). The input is a list of
// "NAME=VALUE" lines; NAME is any text, though a first byte below 0x20 picks one of the
// variables lockstep reads (so that the fuzzer finds them quickly). Parsing must either throw
// ConfigError or return a job whose numbers are consistent.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "job/job_config.hpp"
#include "lockstep/error.hpp"

namespace {

const char* const kNames[] = {"RANK",
                              "WORLD_SIZE",
                              "LOCAL_RANK",
                              "LOCAL_WORLD_SIZE",
                              "GROUP_RANK",
                              "GROUP_WORLD_SIZE",
                              "LOCKSTEP_NNODES",
                              "LOCKSTEP_JOB_ID",
                              "MASTER_ADDR",
                              "MASTER_PORT",
                              "LOCKSTEP_MASTER_ADDR",
                              "LOCKSTEP_MASTER_PORT",
                              "TORCHELASTIC_RUN_ID",
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
                              "SLURM_NODEID",
                              "SLURM_NNODES",
                              "SLURM_STEP_ID",
                              "SLURM_JOB_ID",
                              "SLURM_TASKS_PER_NODE",
                              "SLURM_STEP_TASKS_PER_NODE",
                              "SLURM_NTASKS_PER_NODE",
                              "LOCKSTEP_WAIT_POLICY",
                              "LOCKSTEP_JOIN_TIMEOUT",
                              "LOCKSTEP_BACKEND",
                              "LOCKSTEP_GPU_BARRIER"};

void require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz_env: accepted an inconsistent job: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::map<std::string, std::string> vars;
  std::string text(reinterpret_cast<const char*>(data), size);
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? text.size() : end + 1;
    auto equals = line.find('=');
    if (equals == std::string::npos) {
      continue;
    }
    std::string name = line.substr(0, equals);
    if (!name.empty() && static_cast<unsigned char>(name[0]) < 0x20) {
      name = kNames[static_cast<unsigned char>(name[0]) % std::size(kNames)];
    }
    vars[name] = line.substr(equals + 1);
  }
  auto lookup = [&](const std::string& name) -> std::optional<std::string> {
    auto found = vars.find(name);
    if (found == vars.end()) {
      return std::nullopt;
    }
    return found->second;
  };
  try {
    auto job = lockstep::detail::read_job_config(lookup, lockstep::WaitPolicy::adaptive);
    require(job.world_size >= 1, "world size below 1");
    require(job.rank >= 0 && job.rank < job.world_size, "rank outside the job");
    require(job.local_size >= 1 && job.local_size <= job.world_size, "local size");
    require(job.local_rank < job.local_size, "local rank outside the node");
    require(job.num_nodes >= 1 && job.node_index >= 0 && job.node_index < job.num_nodes,
            "node index");
    require(job.num_nodes == 1 || (job.rendezvous_port >= 1 && job.rendezvous_port <= 65535 &&
                                   !job.master_addr.empty()),
            "a multi-node job without node 0's address");
    require(!job.identity.empty(), "an empty identity");
    require(job.join_timeout.count() > 0, "join timeout");
  } catch (const lockstep::ConfigError&) {
    // refused, with a message
  }
  return 0;
}
