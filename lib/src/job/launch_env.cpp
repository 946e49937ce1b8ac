#include "job/launch_env.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <random>
#include <utility>
#include <vector>

#include "base/unique_fd.hpp"
#include "job/launcher_families.hpp"

namespace lockstep::detail {

std::vector<std::pair<std::string, std::string>> job_environment(const LaunchSpec& spec) {
  // lockstep-run's family (launcher_families.hpp), torchrun's node count and role variables beside
  // it.
  const FamilyNames& launcher = kFamilies[0];
  const FamilyNames& torchrun = kFamilies[1];
  std::vector<std::pair<std::string, std::string>> env = {
      {std::string(launcher.rank[0]), std::to_string(spec.rank)},
      {std::string(launcher.local_rank[0]), std::to_string(spec.local_rank)},
      {std::string(launcher.size[0]), std::to_string(spec.world_size)},
      {std::string(launcher.local_size[0]), std::to_string(spec.local_size)},
      {std::string(launcher.node[0]), std::to_string(spec.node_index)},
      {std::string(torchrun.nnodes[0]), std::to_string(spec.num_nodes)},
      {"ROLE_RANK", std::to_string(spec.rank)},
      {"ROLE_WORLD_SIZE", std::to_string(spec.world_size)},
      {"MASTER_ADDR", spec.master_addr},
      {"MASTER_PORT", std::to_string(spec.master_port)},
      {std::string(launcher.required[0]), spec.job_id},
      {std::string(launcher.nnodes[0]), std::to_string(spec.num_nodes)},
      // What torchrun's agent sets beside them, which libraries test to tell that torchrun
      // started them (PyTorch Lightning's TorchElasticEnvironment, ...); nothing restarts.
      {"TORCHELASTIC_RUN_ID", spec.job_id},
      {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_MAX_RESTARTS", "0"},
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
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    auto add = [&out](std::string_view name) {
      if (!name.empty() && std::find(out.begin(), out.end(), name) == out.end()) {
        out.emplace_back(name);
      }
    };
    for (const FamilyNames& family : kFamilies) {
      for (const Names* names : {&family.rank, &family.size, &family.local_rank, &family.local_size,
                                 &family.node, &family.nnodes}) {
        std::for_each(names->begin(), names->end(), add);
      }
      std::for_each(family.required.begin(), family.required.end(), add);
      std::for_each(family.identity.begin(), family.identity.end(), add);
    }
    std::for_each(kSlurmTaskLists.begin(), kSlurmTaskLists.end(), add);
    add(kSlurmTasksPerNode);
    // What lockstep-run writes beyond the families (every optional variable given).
    LaunchSpec every;
    every.launch_id = "1";
    every.backend = "ucx";
    every.wait_policy = "block";
    for (const auto& [name, value] : job_environment(every)) {
      add(name);
    }
    add("LOCKSTEP_MASTER_ADDR");
    add("LOCKSTEP_MASTER_PORT");
    return out;
  }();
  return names;
}

std::string job_identity(const std::string& job_id) {
  return "job=" + job_id;
}

namespace {

// Binds 127.0.0.1:port (0: any) and returns the bound port, or 0; the socket is closed again.
int bind_loopback(int port) {
  const UniqueFd owned(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!owned) {
    return 0;
  }
  const int fd = owned.get();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  socklen_t length = sizeof addr;
  int bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
    bound = ntohs(addr.sin_port);
  }
  return bound;
}

// The kernel's ephemeral ports (net.ipv4.ip_local_port_range), from which it gives every bind
// to port 0 and every outgoing connection its port: [first, last].
std::pair<int, int> ephemeral_ports() {
  int first = 32768;  // the kernel's default
  int last = 60999;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int a = 0;
  int b = 0;
  if (range >> a >> b && a > 0 && a <= b && b <= 65535) {
    first = a;
    last = b;
  }
  return {first, last};
}

}  // namespace

int free_port() {
  // A port outside the ephemeral range: one the kernel gives out itself may be taken between
  // this look and the job's listen by any process that connects or binds to port 0 (seen in CI:
  // a test's rendezvous port taken by another job's UCX). Outside it, only a process that names
  // the port takes it. Drawn at random, so that jobs started together rarely draw the same.
  const auto [first, last] = ephemeral_ports();
  std::vector<int> outside;
  for (int port = std::max(first - 8192, 1024); port + 1 < first; ++port) {  // both below
    outside.push_back(port);
  }
  for (int port = last + 1; port <= 65535; ++port) {
    outside.push_back(port);
  }
  std::random_device seed;
  std::mt19937 draw(seed());
  constexpr int kTries = 64;
  for (int attempt = 0; attempt < kTries && !outside.empty(); ++attempt) {
    const int port = outside[draw() % outside.size()];
    if (bind_loopback(port) != 0 && bind_loopback(rendezvous_port_for(port)) != 0) {
      return port;
    }
  }
  // No free port outside (a range that covers them all): one the kernel gives.
  for (int attempt = 0; attempt < kTries; ++attempt) {
    const int port = bind_loopback(0);
    if (port == 0) {
      return 0;
    }
    if (bind_loopback(rendezvous_port_for(port)) != 0) {
      return port;
    }
  }
  return 0;
}

}  // namespace lockstep::detail
