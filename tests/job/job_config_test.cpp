#include "job/job_config.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>

#include "job/launch_env.hpp"
#include "lockstep/error.hpp"
#include "lockstep/state.hpp"

namespace lockstep::detail {
namespace {

using Vars = std::map<std::string, std::string>;

JobConfig read(const Vars& vars) {
  return read_job_config(
      [&](const std::string& name) -> std::optional<std::string> {
        auto it = vars.find(name);
        if (it == vars.end()) {
          return std::nullopt;
        }
        return it->second;
      },
      WaitPolicy::adaptive);
}

// The ConfigError message for `vars`; fails the test when none is thrown.
std::string config_error(const Vars& vars) {
  try {
    read(vars);
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

Vars torchrun(int rank, int world, int local_rank, int local_world, int group) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
          {"GROUP_RANK", std::to_string(group)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

TEST(Environment, NoVariablesIsAJobOfOne) {
  auto config = read({});
  EXPECT_EQ(config.source, "none");
  EXPECT_EQ(config.rank, 0);
  EXPECT_EQ(config.world_size, 1);
  EXPECT_EQ(config.local_size, 1);
  EXPECT_EQ(config.num_nodes, 1);
}

TEST(Environment, LauncherVariablesWin) {
  auto vars = torchrun(2, 4, 2, 4, 0);
  vars["LOCKSTEP_JOB_ID"] = "abc";
  vars["LOCKSTEP_NNODES"] = "1";
  vars["OMPI_COMM_WORLD_RANK"] = "1";
  vars["OMPI_COMM_WORLD_SIZE"] = "2";
  auto config = read(vars);
  EXPECT_EQ(config.source, "lockstep-run");
  EXPECT_EQ(config.rank, 2);
  EXPECT_EQ(config.local_rank, 2);
  EXPECT_EQ(config.world_size, 4);
  EXPECT_EQ(config.identity, "job=abc");
}

TEST(Environment, TorchrunBeforeOpenMpi) {
  auto vars = torchrun(1, 8, 1, 4, 0);
  vars["OMPI_COMM_WORLD_RANK"] = "3";
  vars["OMPI_COMM_WORLD_SIZE"] = "4";
  auto config = read(vars);
  EXPECT_EQ(config.source, "torchrun");
  EXPECT_EQ(config.rank, 1);
  EXPECT_EQ(config.num_nodes, 2);
  EXPECT_EQ(config.node_index, 0);
  EXPECT_EQ(config.local_size, 4);
  EXPECT_NE(config.identity.find("MASTER_PORT=29500"), std::string::npos);
}

TEST(Environment, TorchrunSecondNode) {
  auto config = read(torchrun(5, 8, 1, 4, 1));
  EXPECT_EQ(config.node_index, 1);
  EXPECT_EQ(config.num_nodes, 2);
  EXPECT_EQ(config.local_rank, 1);
}

TEST(Environment, TorchrunWithoutLocalRankElects) {
  auto config = read({{"RANK", "3"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(config.local_rank, -1);
  EXPECT_EQ(config.local_size, 4);
  EXPECT_EQ(config.num_nodes, 1);
}

TEST(Environment, OpenMpi) {
  auto config = read({{"OMPI_COMM_WORLD_RANK", "3"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                      {"PMIX_NAMESPACE", "prterun-x-1@1"}});
  EXPECT_EQ(config.source, "openmpi");
  EXPECT_EQ(config.rank, 3);
  EXPECT_EQ(config.local_rank, 3);
  EXPECT_NE(config.identity.find("prterun-x-1@1"), std::string::npos);
}

TEST(Environment, Mpich) {
  auto config = read(
      {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  EXPECT_EQ(config.source, "mpich");
  EXPECT_EQ(config.rank, 1);
  EXPECT_EQ(config.local_rank, 1);
}

TEST(Environment, SlurmTaskList) {
  auto config = read({{"SLURM_PROCID", "5"},
                      {"SLURM_NTASKS", "7"},
                      {"SLURM_LOCALID", "0"},
                      {"SLURM_NODEID", "2"},
                      {"SLURM_NNODES", "3"},
                      {"SLURM_STEP_ID", "0"},
                      {"SLURM_JOB_ID", "77"},
                      {"SLURM_TASKS_PER_NODE", "3(x2),1"},
                      {"MASTER_ADDR", "node0"},
                      {"MASTER_PORT", "29500"}});
  EXPECT_EQ(config.source, "slurm");
  EXPECT_EQ(config.node_index, 2);
  EXPECT_EQ(config.num_nodes, 3);
  EXPECT_EQ(config.local_size, 1);
  EXPECT_EQ(config.local_rank, 0);
}

TEST(Environment, SlurmBatchScriptIsNotAStep) {
  // In the batch script itself SLURM_PROCID is set but no step (SLURM_STEP_ID) exists.
  auto message = config_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}});
  EXPECT_NE(message.find("SLURM_STEP_ID"), std::string::npos) << message;
}

TEST(Environment, MalformedRank) {
  auto vars = torchrun(0, 4, 0, 4, 0);
  vars["RANK"] = "abc";
  auto message = config_error(vars);
  EXPECT_NE(message.find("RANK=\"abc\""), std::string::npos) << message;
  EXPECT_NE(message.find("not an integer"), std::string::npos) << message;
}

TEST(Environment, RankNotBelowWorldSize) {
  auto message = config_error(torchrun(4, 4, 0, 4, 0));
  EXPECT_NE(message.find("RANK=\"4\""), std::string::npos) << message;
  EXPECT_NE(message.find("WORLD_SIZE=4"), std::string::npos) << message;
}

TEST(Environment, NegativeSize) {
  auto message = config_error({{"RANK", "0"}, {"WORLD_SIZE", "-2"}});
  EXPECT_NE(message.find("WORLD_SIZE=\"-2\""), std::string::npos) << message;
}

TEST(Environment, ZeroSize) {
  auto message = config_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}});
  EXPECT_NE(message.find("WORLD_SIZE=\"0\""), std::string::npos) << message;
}

TEST(Environment, LocalRankOutsideLocalSize) {
  auto message = config_error(torchrun(1, 4, 4, 4, 0));
  EXPECT_NE(message.find("LOCAL_RANK=\"4\""), std::string::npos) << message;
}

TEST(Environment, LocalSizeLargerThanWorld) {
  auto message = config_error(torchrun(1, 4, 1, 8, 0));
  EXPECT_NE(message.find("LOCAL_WORLD_SIZE=\"8\""), std::string::npos) << message;
}

TEST(Environment, LocalSizeNotDividingWorld) {
  auto message = config_error({{"RANK", "1"}, {"WORLD_SIZE", "5"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_NE(message.find("LOCAL_WORLD_SIZE=\"2\""), std::string::npos) << message;
}

TEST(Environment, GroupRankOutsideNodes) {
  auto message = config_error(torchrun(1, 4, 1, 2, 2));
  EXPECT_NE(message.find("GROUP_RANK"), std::string::npos) << message;
}

TEST(Environment, InconsistentRankAndNodePlacement) {
  auto message = config_error(torchrun(0, 4, 1, 2, 1));  // node 1, local 1 should be rank 3
  EXPECT_NE(message.find("disagrees"), std::string::npos) << message;
}

TEST(Environment, TrailingGarbageAndSpaces) {
  for (const char* bad : {"1x", " 1", "1 ", "", "+1", "0x1", "99999999999"}) {
    auto message = config_error({{"RANK", bad}, {"WORLD_SIZE", "4"}});
    EXPECT_NE(message.find("RANK=\"" + std::string(bad) + "\""), std::string::npos) << message;
  }
}

TEST(Environment, PartialSetIsAnError) {
  auto message = config_error({{"RANK", "1"}});
  EXPECT_NE(message.find("WORLD_SIZE"), std::string::npos) << message;
  message = config_error({{"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_NE(message.find("OMPI_COMM_WORLD_RANK"), std::string::npos) << message;
}

TEST(Environment, MalformedSlurmTaskList) {
  auto message = config_error({{"SLURM_PROCID", "0"},
                               {"SLURM_NTASKS", "4"},
                               {"SLURM_STEP_ID", "0"},
                               {"SLURM_NODEID", "0"},
                               {"SLURM_NNODES", "2"},
                               {"SLURM_TASKS_PER_NODE", "2(x"}});
  EXPECT_NE(message.find("SLURM_TASKS_PER_NODE=\"2(x\""), std::string::npos) << message;
}

TEST(Environment, MultiNodeJobNeedsTheMasterAddress) {
  auto vars = torchrun(2, 4, 0, 2, 1);
  vars["GROUP_WORLD_SIZE"] = "2";
  vars.erase("MASTER_ADDR");
  auto message = config_error(vars);
  EXPECT_NE(message.find("spans 2 nodes"), std::string::npos) << message;
  EXPECT_NE(message.find("MASTER_ADDR"), std::string::npos) << message;
  vars["MASTER_ADDR"] = "10.0.0.1";
  vars.erase("MASTER_PORT");
  message = config_error(vars);
  EXPECT_NE(message.find("MASTER_PORT"), std::string::npos) << message;
  for (const char* port : {"0", "65536", "29500x", "-1"}) {
    vars["MASTER_PORT"] = port;
    message = config_error(vars);
    EXPECT_NE(message.find("MASTER_PORT=\"" + std::string(port) + "\""), std::string::npos)
        << message;
  }
}

TEST(Environment, MultiNodeMasterAddressAndBackend) {
  auto vars = torchrun(2, 4, 0, 2, 1);
  vars["GROUP_WORLD_SIZE"] = "2";
  vars["MASTER_ADDR"] = "10.0.0.1";
  vars["MASTER_PORT"] = "29500";
  auto config = read(vars);
  EXPECT_EQ(config.master_addr, "10.0.0.1");
  // lockstep's port is the one after MASTER_PORT: torch's store holds MASTER_PORT itself.
  EXPECT_EQ(config.rendezvous_port, 29501);
  EXPECT_EQ(config.rendezvous_port_source, "MASTER_PORT=29500 + 1");
  EXPECT_EQ(config.backend, "");
  vars["MASTER_PORT"] = "65535";  // no port after it: the one before
  config = read(vars);
  EXPECT_EQ(config.rendezvous_port, 65534);
  EXPECT_EQ(config.rendezvous_port_source, "MASTER_PORT=65535 - 1");
  // lockstep's own variables win, the port taken as it is.
  vars["LOCKSTEP_MASTER_ADDR"] = "10.0.0.2";
  vars["LOCKSTEP_MASTER_PORT"] = "29600";
  vars["LOCKSTEP_BACKEND"] = "ucx";
  config = read(vars);
  EXPECT_EQ(config.master_addr, "10.0.0.2");
  EXPECT_EQ(config.rendezvous_port, 29600);
  EXPECT_EQ(config.rendezvous_port_source, "LOCKSTEP_MASTER_PORT=29600");
  EXPECT_EQ(config.backend, "ucx");
  // A bad LOCKSTEP_MASTER_PORT is named, even beside a good MASTER_PORT.
  vars["LOCKSTEP_MASTER_PORT"] = "70000";
  auto refused = config_error(vars);
  EXPECT_NE(refused.find("LOCKSTEP_MASTER_PORT=\"70000\""), std::string::npos) << refused;
  vars["LOCKSTEP_MASTER_PORT"] = "29600";
  vars["LOCKSTEP_BACKEND"] = "mpi";
  auto message = config_error(vars);
  EXPECT_NE(message.find("LOCKSTEP_BACKEND=\"mpi\""), std::string::npos) << message;
}

// Binds 127.0.0.1:port and keeps it bound while the result lives (-1: could not).
int hold_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    return fd;
  }
  if (fd >= 0) {
    ::close(fd);
  }
  return -1;
}

TEST(LaunchEnv, AFreePortLeavesLockstepsPortBesideItFree) {
  // --standalone and the tests give the job MASTER_PORT = free_port(); lockstep listens on the
  // port after it, which must be free too. Both lie outside the kernel's ephemeral ports, which
  // any process that connects or binds to port 0 may take before the job listens.
  int first = 32768;
  int last = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> first >> last;
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    for (const int each : {port, rendezvous_port_for(port)}) {
      EXPECT_TRUE(each < first || each > last)
          << each << " is an ephemeral port (" << first << "-" << last << ")";
    }
    const int master = hold_loopback(port);
    const int own = hold_loopback(rendezvous_port_for(port));
    EXPECT_GE(master, 0) << "MASTER_PORT " << port << " was not free";
    EXPECT_GE(own, 0) << "lockstep's port " << rendezvous_port_for(port) << " was not free";
    for (int fd : {master, own}) {
      if (fd >= 0) {
        ::close(fd);
      }
    }
  }
  static_assert(rendezvous_port_for(29500) == 29501 && rendezvous_port_for(65535) == 65534);
}

// Found by fuzz/fuzz_env: with LOCAL_WORLD_SIZE absent (derived from GROUP_WORLD_SIZE), the
// message for a rank that disagrees with its node read the absent variable's value.
TEST(Environment, RankDisagreeingWithADerivedLocalSize) {
  auto message = config_error({{"RANK", "5"},
                               {"WORLD_SIZE", "8"},
                               {"LOCAL_RANK", "1"},
                               {"GROUP_RANK", "0"},
                               {"GROUP_WORLD_SIZE", "2"},
                               {"MASTER_ADDR", "10.0.0.1"},
                               {"MASTER_PORT", "29500"}});
  EXPECT_NE(message.find("RANK=\"5\" disagrees with GROUP_RANK=0, LOCAL_RANK=1"), std::string::npos)
      << message;
  EXPECT_NE(message.find("4 processes per node (WORLD_SIZE / 2 nodes)"), std::string::npos)
      << message;
}

TEST(Environment, GpuBarrierMode) {
  EXPECT_EQ(read({}).gpu_barrier, "events");
  EXPECT_EQ(read({{"LOCKSTEP_GPU_BARRIER", "flags"}}).gpu_barrier, "flags");
  EXPECT_EQ(read({{"LOCKSTEP_GPU_BARRIER", "memops"}}).gpu_barrier, "flags");
  auto message = config_error({{"LOCKSTEP_GPU_BARRIER", "fast"}});
  EXPECT_NE(message.find("LOCKSTEP_GPU_BARRIER=\"fast\""), std::string::npos) << message;
}

TEST(Environment, WaitPolicyVariable) {
  EXPECT_EQ(read({{"LOCKSTEP_WAIT_POLICY", "spin"}}).wait_policy, WaitPolicy::spin);
  EXPECT_EQ(read({{"LOCKSTEP_WAIT_POLICY", "block"}}).wait_policy, WaitPolicy::block);
  auto message = config_error({{"LOCKSTEP_WAIT_POLICY", "fast"}});
  EXPECT_NE(message.find("LOCKSTEP_WAIT_POLICY=\"fast\""), std::string::npos) << message;
}

TEST(Environment, JoinTimeoutVariable) {
  EXPECT_EQ(read({{"LOCKSTEP_JOIN_TIMEOUT", "2.5"}}).join_timeout.count(), 2500);
  EXPECT_EQ(read({{"LOCKSTEP_JOIN_TIMEOUT", "30"}}).join_timeout.count(), 30000);
  EXPECT_EQ(read({{"LOCKSTEP_JOIN_TIMEOUT", "0.001"}}).join_timeout.count(), 1);
  // Issue 12: " 5", "0x10" and "1e-9" were accepted (the last as 0 ms).
  for (const char* bad : {"0", "-1", "soon", "", "nan", " 5", "5 ", "0x10", "1e-9", "1e3", "+5",
                          ".5", "5.", "1.2.3", "inf", "0.0001", "10000001"}) {
    auto message = config_error({{"LOCKSTEP_JOIN_TIMEOUT", bad}});
    EXPECT_NE(message.find("LOCKSTEP_JOIN_TIMEOUT=\"" + std::string(bad) + "\""), std::string::npos)
        << message;
  }
}

// LOCKSTEP_STALL_WARNING: seconds as LOCKSTEP_JOIN_TIMEOUT's, and 0 turns it off; 60 s unset.
TEST(Environment, StallWarningVariable) {
  EXPECT_EQ(read({}).stall_warning.count(), 60000);
  EXPECT_EQ(read({{"LOCKSTEP_STALL_WARNING", "0"}}).stall_warning.count(), 0);
  EXPECT_EQ(read({{"LOCKSTEP_STALL_WARNING", "2.5"}}).stall_warning.count(), 2500);
  for (const char* bad : {"-1", "off", "", " 5", "1e3", "0.0001", "10000001"}) {
    auto message = config_error({{"LOCKSTEP_STALL_WARNING", bad}});
    EXPECT_NE(message.find("LOCKSTEP_STALL_WARNING=\"" + std::string(bad) + "\""),
              std::string::npos)
        << message;
  }
}

// LOCKSTEP_LINK_TIMEOUT (issue 45): seconds, from 1 to 3600; 5 s unset.
TEST(Environment, LinkTimeoutVariable) {
  EXPECT_EQ(read({}).link_timeout.count(), 5000);
  EXPECT_EQ(read({{"LOCKSTEP_LINK_TIMEOUT", "2.5"}}).link_timeout.count(), 2500);
  EXPECT_EQ(read({{"LOCKSTEP_LINK_TIMEOUT", "3600"}}).link_timeout.count(), 3600000);
  for (const char* bad : {"0", "0.5", "3601", "-1", "off", "", "1e3"}) {
    auto message = config_error({{"LOCKSTEP_LINK_TIMEOUT", bad}});
    EXPECT_NE(message.find("LOCKSTEP_LINK_TIMEOUT=\"" + std::string(bad) + "\""), std::string::npos)
        << message;
  }
  EXPECT_NE(config_error({{"LOCKSTEP_LINK_TIMEOUT", "0.5"}}).find("is not from 1 to 3600 seconds"),
            std::string::npos);
}

TEST(Environment, TooManyProcessesOnANodeAreRefused) {
  // Issue 12: WORLD_SIZE=1000000 laid out a 512 MB segment (SIGBUS on a small /dev/shm).
  auto message = config_error(torchrun(0, 1000000, 0, 1000000, 0));
  EXPECT_NE(message.find("at most 4096 per node"), std::string::npos) << message;
  EXPECT_NE(message.find("LOCAL_WORLD_SIZE=\"1000000\""), std::string::npos) << message;
  EXPECT_EQ(read(torchrun(0, 4096, 0, 4096, 0)).local_size, 4096);
}

TEST(Environment, EmptyJobIdIsAnError) {
  auto message = config_error({{"LOCKSTEP_JOB_ID", ""}});
  EXPECT_NE(message.find("LOCKSTEP_JOB_ID"), std::string::npos) << message;
}

TEST(Environment, JobIdOverridesIdentity) {
  auto vars = torchrun(0, 2, 0, 2, 0);
  vars["LOCKSTEP_JOB_ID"] = "mine";
  EXPECT_EQ(read(vars).identity, "job=mine");
}

// What a launcher writes (job_environment) reads back as the job it describes.
TEST(Environment, WhatALauncherWritesReadsBack) {
  std::vector<LaunchSpec> specs;
  LaunchSpec one;
  one.rank = 2;
  one.world_size = 4;
  one.local_rank = 2;
  one.local_size = 4;
  one.job_id = "abc@127.0.0.1:29500";
  specs.push_back(one);
  LaunchSpec nodes;
  nodes.rank = 5;
  nodes.world_size = 8;
  nodes.local_rank = 1;
  nodes.local_size = 4;
  nodes.node_index = 1;
  nodes.num_nodes = 2;
  nodes.job_id = "run7@10.0.0.1:29400";
  nodes.master_addr = "10.0.0.1";
  nodes.master_port = 29400;
  nodes.launch_id = "1f";
  nodes.backend = "ucx";
  nodes.wait_policy = "block";
  specs.push_back(nodes);
  for (const auto& spec : specs) {
    Vars vars;
    for (const auto& [name, value] : job_environment(spec)) {
      vars[name] = value;
    }
    const JobConfig config = read(vars);
    EXPECT_EQ(config.source, "lockstep-run");
    EXPECT_EQ(config.rank, spec.rank);
    EXPECT_EQ(config.world_size, spec.world_size);
    EXPECT_EQ(config.local_rank, spec.local_rank);
    EXPECT_EQ(config.local_size, spec.local_size);
    EXPECT_EQ(config.node_index, spec.node_index);
    EXPECT_EQ(config.num_nodes, spec.num_nodes);
    EXPECT_EQ(config.identity, job_identity(spec.job_id));
    EXPECT_EQ(config.launch, spec.launch_id.empty() ? 0 : std::stoull(spec.launch_id, nullptr, 16));
    EXPECT_EQ(config.backend, spec.backend);
    if (spec.num_nodes > 1) {
      EXPECT_EQ(config.master_addr, spec.master_addr);
      EXPECT_EQ(config.rendezvous_port, lockstep::detail::rendezvous_port_for(spec.master_port));
    }
    if (!spec.wait_policy.empty()) {
      EXPECT_EQ(config.wait_policy, *lockstep::wait_policy_named(spec.wait_policy));
    }
    for (const auto& [name, value] : job_environment(spec)) {
      EXPECT_NE(std::find(job_variables().begin(), job_variables().end(), name),
                job_variables().end())
          << name << " is written but not among the job variables a launcher clears";
    }
  }
}

// LOCKSTEP_LOG=off|info|debug, LOCKSTEP_DEBUG=0|1 (info); anything else names the variable.
TEST(Environment, LogLevels) {
  Vars vars = {{"RANK", "1"}, {"WORLD_SIZE", "2"}};
  EXPECT_EQ(read(vars).log_level, LogLevel::off);
  EXPECT_EQ(read(vars).source_variables, "RANK=1 WORLD_SIZE=2");
  vars["LOCKSTEP_DEBUG"] = "1";
  EXPECT_EQ(read(vars).log_level, LogLevel::info);
  vars["LOCKSTEP_DEBUG"] = "0";
  EXPECT_EQ(read(vars).log_level, LogLevel::off);
  vars["LOCKSTEP_DEBUG"] = "yes";
  EXPECT_NE(config_error(vars).find("LOCKSTEP_DEBUG=\"yes\" is not 0 or 1"), std::string::npos);
  vars["LOCKSTEP_LOG"] = "debug";  // LOCKSTEP_LOG wins over LOCKSTEP_DEBUG
  EXPECT_EQ(read(vars).log_level, LogLevel::debug);
  vars["LOCKSTEP_LOG"] = "info";
  EXPECT_EQ(read(vars).log_level, LogLevel::info);
  vars["LOCKSTEP_LOG"] = "off";
  EXPECT_EQ(read(vars).log_level, LogLevel::off);
  vars["LOCKSTEP_LOG"] = "verbose";
  EXPECT_NE(config_error(vars).find("LOCKSTEP_LOG=\"verbose\" is not one of off, info, debug"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::detail
