// The launcher families: which variables describe a job to lockstep, for each kind of launcher
// (internal). One table, read by job_config.cpp (read_job_config takes the first complete family)
// and by launch_env.cpp (job_variables: what a launcher clears before it sets its own).
#pragma once

#include <array>
#include <string_view>

namespace lockstep::detail {

// Names of one quantity: the first present one is taken (empty: the family has none).
using Names = std::array<std::string_view, 2>;

struct FamilyNames {
  std::string_view source;  // as JobConfig::source and messages name the family
  Names rank, size;         // required
  Names local_rank, local_size, node, nnodes;
  // Further variables that must be present for the family to be complete.
  std::array<std::string_view, 2> required;
  // Joined as "NAME=value;..." (those present): the job identity (lockstep-run: LOCKSTEP_JOB_ID
  // alone, read_job_config spells it).
  std::array<std::string_view, 4> identity;
  bool every_quantity_required;  // lockstep-run: every name above must be present
  bool rank_is_node_major;       // RANK == node * LOCAL_WORLD_SIZE + LOCAL_RANK is promised
};

// In order of precedence. torchrun's are lockstep-run's without lockstep's own.
inline constexpr std::array<FamilyNames, 5> kFamilies{{
    {"lockstep-run",
     {"RANK"},
     {"WORLD_SIZE"},
     {"LOCAL_RANK"},
     {"LOCAL_WORLD_SIZE"},
     {"GROUP_RANK"},
     {"LOCKSTEP_NNODES"},
     {"LOCKSTEP_JOB_ID"},
     {},
     true,
     true},
    {"torchrun",
     {"RANK"},
     {"WORLD_SIZE"},
     {"LOCAL_RANK"},
     {"LOCAL_WORLD_SIZE"},
     {"GROUP_RANK"},
     {"GROUP_WORLD_SIZE"},
     {},
     {"TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"},
     false,
     true},
    {"openmpi",
     {"OMPI_COMM_WORLD_RANK"},
     {"OMPI_COMM_WORLD_SIZE"},
     {"OMPI_COMM_WORLD_LOCAL_RANK"},
     {"OMPI_COMM_WORLD_LOCAL_SIZE"},
     {},
     {},
     {},
     {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"},
     false,
     false},
    {"mpich",
     {"PMI_RANK"},
     {"PMI_SIZE"},
     {"MPI_LOCALRANKID"},
     {"MPI_LOCALNRANKS"},
     {},
     {},
     {},
     {"PMI_KVSNAME", "PMI_JOBID", "PMI_PORT"},
     false,
     false},
    // Outside an srun step (in the batch script itself) SLURM_PROCID is 0 but no step exists:
    // SLURM_STEP_ID is required. Its local size comes from kSlurmTaskLists (below).
    {"slurm",
     {"SLURM_PROCID"},
     {"SLURM_NTASKS", "SLURM_NPROCS"},
     {"SLURM_LOCALID"},
     {},
     {"SLURM_NODEID"},
     {"SLURM_NNODES", "SLURM_JOB_NUM_NODES"},
     {"SLURM_STEP_ID"},
     {"SLURM_JOB_ID", "SLURM_STEP_ID"},
     false,
     false},
}};

// Slurm's processes per node: task lists such as "2(x3),1" (the step's, else the job's), else one
// count for every node.
inline constexpr std::array<std::string_view, 2> kSlurmTaskLists{"SLURM_STEP_TASKS_PER_NODE",
                                                                 "SLURM_TASKS_PER_NODE"};
inline constexpr std::string_view kSlurmTasksPerNode = "SLURM_NTASKS_PER_NODE";

}  // namespace lockstep::detail
