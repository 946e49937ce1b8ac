// --cpu-bind (placement.hpp).
#include "placement.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "base/proc.hpp"  // affinity
#include "base/text.hpp"
#include "gpu/devices.hpp"
#include "output.hpp"

namespace lockstep::run {

namespace {

// A sysfs CPU list ("0-3,8-11") as CPU numbers; empty when unreadable.
std::vector<int> read_cpulist(const std::string& path) {
  std::ifstream file(path);
  std::string text;
  std::getline(file, text);
  std::vector<int> cpus;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto dash = item.find('-');
    auto first = lockstep::detail::parse_integer(item.substr(0, dash));
    auto last =
        dash == std::string::npos ? first : lockstep::detail::parse_integer(item.substr(dash + 1));
    for (long long cpu = first.value_or(0); first && last && cpu <= *last; ++cpu) {
      cpus.push_back(static_cast<int>(cpu));
    }
  }
  return cpus;
}

// `cpus` that this process may run on.
std::vector<int> allowed(const std::vector<int>& cpus) {
  const auto mask = lockstep::detail::affinity();
  std::vector<int> out;
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < lockstep::detail::kMaxCpus && mask[static_cast<std::size_t>(cpu)]) {
      out.push_back(cpu);
    }
  }
  return out;
}

// The NUMA nodes' CPU lists (that this process may use), by node number.
std::vector<std::vector<int>> numa_nodes() {
  std::vector<std::vector<int>> nodes;
  for (int node = 0; node < 1024; ++node) {
    const std::string path = "/sys/devices/system/node/node" + std::to_string(node) + "/cpulist";
    if (::access(path.c_str(), R_OK) != 0) {
      break;
    }
    nodes.push_back(allowed(read_cpulist(path)));
  }
  return nodes;
}

}  // namespace

// --cpu-bind: each local rank's CPUs; the exit status (2) when the mode cannot apply.
std::optional<int> resolve_cpu_bind(Options& options) {
  const int n = options.nproc_per_node;
  const std::string& mode = options.cpu_bind;
  options.cpus.clear();
  if (mode == "none") {
    return std::nullopt;
  }
  std::vector<int> all(CPU_SETSIZE);
  std::iota(all.begin(), all.end(), 0);
  all = allowed(all);
  if (mode == "core") {
    for (int r = 0; r < n; ++r) {
      options.cpus.push_back({all[static_cast<std::size_t>(r) % all.size()]});
    }
    return std::nullopt;
  }
  if (mode != "numa" && mode != "gpu") {
    say("--cpu-bind " + mode + ": not one of none, core, numa, gpu");
    return 2;
  }
  auto nodes = numa_nodes();
  if (nodes.empty()) {
    say("--cpu-bind " + mode + ": this machine shows no NUMA nodes (/sys/devices/system/node)");
    return 2;
  }
  for (int r = 0; r < n; ++r) {
    std::size_t node = static_cast<std::size_t>(r) % nodes.size();
    if (mode == "gpu") {
      std::string why;
      const int gpus = lockstep::detail::visible_device_count(why);
      const std::string bus = gpus > 0 ? lockstep::detail::device_pci_bus_id(r % gpus, why) : "";
      if (bus.empty()) {
        say("--cpu-bind gpu: cannot tell local rank " + std::to_string(r) + "'s GPU (" + why +
            "); use core or numa");
        return 2;
      }
      const std::string path = "/sys/bus/pci/devices/" + bus + "/numa_node";
      std::ifstream file(path);
      int number = -1;
      file >> number;
      if (!file || number < 0 || static_cast<std::size_t>(number) >= nodes.size()) {
        std::string why_not = "--cpu-bind gpu: the GPU at " + bus;
        why_not += " names no NUMA node (" + path + "); use core or numa";
        say(why_not);
        return 2;
      }
      node = static_cast<std::size_t>(number);
    }
    if (nodes[node].empty()) {
      say("--cpu-bind " + mode + ": NUMA node " + std::to_string(node) +
          " has none of the CPUs this process may use");
      return 2;
    }
    options.cpus.push_back(nodes[node]);
  }
  return std::nullopt;
}

}  // namespace lockstep::run
