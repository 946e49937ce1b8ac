#include "job/job_config.hpp"

#include "job/launch_env.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "base/proc.hpp"
#include "base/text.hpp"
#include "job/launcher_families.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

struct Var {
  std::string name;
  std::optional<std::string> value;
  [[nodiscard]] bool present() const { return value.has_value(); }
};

[[noreturn]] void bad(const Var& var, const std::string& why) {
  throw ConfigError("lockstep: environment variable " + var.name + "=\"" + *var.value + "\" " +
                    why);
}

int integer(const Var& var, int min) {
  auto value = parse_integer(*var.value);
  if (!value) {
    bad(var, "is not an integer");
  }
  if (*value < min) {
    bad(var, min == 0 ? "must not be negative" : "must be at least " + std::to_string(min));
  }
  if (*value > std::numeric_limits<int>::max() / 2) {
    bad(var, "is too large");
  }
  return static_cast<int>(*value);
}

// One family of variables: the required rank and size, the optional node-local and node-level
// ones, and the job identity.
struct Family {
  std::string source;
  Var rank, size, local_rank, local_size, node, nnodes;
  std::string identity;
  bool rank_is_node_major = false;  // RANK == node * LOCAL_WORLD_SIZE + LOCAL_RANK is promised
  std::vector<Var> required_extra;  // further variables that must be present for completeness

  [[nodiscard]] bool complete() const {
    if (!rank.present() || !size.present()) {
      return false;
    }
    for (const auto& var : required_extra) {
      if (!var.present()) {
        return false;
      }
    }
    return true;
  }
  [[nodiscard]] bool partial() const {
    return !complete() &&
           (rank.present() || size.present() || local_rank.present() || local_size.present());
  }
  [[nodiscard]] std::string missing() const {
    std::string out;
    for (const auto* var : {&rank, &size}) {
      if (!var->present()) {
        out += (out.empty() ? "" : ", ") + var->name;
      }
    }
    for (const auto& var : required_extra) {
      if (!var.present()) {
        out += (out.empty() ? "" : ", ") + var.name;
      }
    }
    return out;
  }
};

Var lookup(const EnvLookup& env, const std::string& name) {
  return Var{name, env(name)};
}

Var first_of(const EnvLookup& env, const Names& names) {
  for (std::string_view name : names) {
    if (name.empty()) {
      break;
    }
    auto var = lookup(env, std::string(name));
    if (var.present()) {
      return var;
    }
  }
  return Var{std::string(names[0]), std::nullopt};
}

// Slurm's "2(x3),1" task-count lists: the count for node `node`.
std::optional<int> slurm_tasks_on_node(const Var& var, int node) {
  std::string_view text = *var.value;
  int index = 0;
  while (!text.empty()) {
    auto comma = text.find(',');
    auto item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    long long repeat = 1;
    auto paren = item.find('(');
    if (paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item[paren + 1] != 'x' || item.back() != ')') {
        bad(var, "is not a Slurm task list such as \"2(x3),1\"");
      }
      auto parsed = parse_integer(item.substr(paren + 2, item.size() - paren - 3));
      if (!parsed || *parsed < 1) {
        bad(var, "is not a Slurm task list such as \"2(x3),1\"");
      }
      repeat = *parsed;
      item = item.substr(0, paren);
    }
    auto count = parse_integer(item);
    if (!count || *count < 1 || *count > std::numeric_limits<int>::max() / 2) {
      bad(var, "is not a Slurm task list such as \"2(x3),1\"");
    }
    if (node < index + repeat) {
      return static_cast<int>(*count);
    }
    index += static_cast<int>(repeat);
  }
  return std::nullopt;
}

std::string fallback_identity() {
  // Processes started by one parent (a shell script, mpirun's daemon) share it; its start time
  // tells a reused pid apart.
  pid_t parent = ::getppid();
  auto start = process_start_time(parent);
  return "parent=" + std::to_string(parent) + ":" + std::to_string(start.value_or(0));
}

// Where node 0's main process listens: LOCKSTEP_MASTER_ADDR, else MASTER_ADDR; and
// LOCKSTEP_MASTER_PORT, else the port beside MASTER_PORT (rendezvous_port_for: torch's store
// holds MASTER_PORT itself when a job uses both).
void read_master(const EnvLookup& env, JobConfig& config) {
  auto addr = first_of(env, Names{"LOCKSTEP_MASTER_ADDR", "MASTER_ADDR"});
  auto own_port = lookup(env, "LOCKSTEP_MASTER_PORT");
  auto port = own_port.present() ? own_port : lookup(env, "MASTER_PORT");
  const std::string shape = "this job spans " + std::to_string(config.num_nodes) + " nodes";
  if (!addr.present()) {
    throw ConfigError("lockstep: " + shape +
                      " and needs the address of node 0: set MASTER_ADDR (or "
                      "LOCKSTEP_MASTER_ADDR)");
  }
  if (addr.value->empty()) {
    bad(addr, "is empty");
  }
  if (!port.present()) {
    throw ConfigError("lockstep: " + shape +
                      " and needs a port on node 0: set MASTER_PORT (lockstep listens on the port "
                      "after it) or LOCKSTEP_MASTER_PORT (lockstep's port itself)");
  }
  const int number = integer(port, 1);
  if (number > 65535) {
    bad(port, "is not a port number (1-65535)");
  }
  config.master_addr = *addr.value;
  if (own_port.present()) {
    config.rendezvous_port = number;
    config.rendezvous_port_source = "LOCKSTEP_MASTER_PORT=" + std::to_string(number);
  } else {
    config.rendezvous_port = rendezvous_port_for(number);
    config.rendezvous_port_source =
        "MASTER_PORT=" + std::to_string(number) + (number < 65535 ? " + 1" : " - 1");
  }
}

// The shape variables a family gave (absent: not given), each checked against the sizes given
// with it.
struct Given {
  std::optional<int> local_size, local_rank, nnodes, node;
};

Given read_given(const Family& family, const JobConfig& config) {
  Given given;
  auto& [local_size, local_rank, nnodes, node] = given;
  if (family.local_size.present()) {
    local_size = integer(family.local_size, 1);
    if (*local_size > config.world_size) {
      bad(family.local_size, "is larger than " + family.size.name + "=" + *family.size.value);
    }
  }
  if (family.local_rank.present()) {
    local_rank = integer(family.local_rank, 0);
    if (local_size && *local_rank >= *local_size) {
      bad(family.local_rank,
          "is not below " + family.local_size.name + "=" + *family.local_size.value);
    }
    if (*local_rank >= config.world_size) {
      bad(family.local_rank, "is not below " + family.size.name + "=" + *family.size.value);
    }
  }
  if (family.nnodes.present()) {
    nnodes = integer(family.nnodes, 1);
    if (*nnodes > config.world_size) {
      bad(family.nnodes, "is larger than " + family.size.name + "=" + *family.size.value);
    }
  }
  if (family.node.present()) {
    node = integer(family.node, 0);
    if (nnodes && *node >= *nnodes) {
      bad(family.node, "is not below " + family.nnodes.name + "=" + *family.nnodes.value);
    }
  }
  return given;
}

// "NAME=value ..." of the family's variables that are present (for LOCKSTEP_LOG).
std::string variables_of(const Family& family) {
  std::string out;
  for (const Var* var : {&family.rank, &family.size, &family.local_rank, &family.local_size,
                         &family.node, &family.nnodes}) {
    if (var->present()) {
      out += (out.empty() ? "" : " ") + var->name + "=" + *var->value;
    }
  }
  return out;
}

// Derives what the family did not give (the node count, the processes per node, the node
// index); a job whose shape cannot be told is an error, never a guess.
void derive_shape(const Family& family, const JobConfig& config, Given& given) {
  auto& [local_size, local_rank, nnodes, node] = given;
  if (!nnodes) {
    if (!local_size || *local_size == config.world_size) {
      nnodes = 1;
    } else if (config.world_size % *local_size == 0) {
      nnodes = config.world_size / *local_size;
    } else {
      bad(family.local_size, "does not divide " + family.size.name + "=" + *family.size.value +
                                 ": cannot tell the number of nodes");
    }
  }
  if (!local_size) {
    if (config.world_size % *nnodes != 0) {
      bad(family.nnodes, "does not divide " + family.size.name + "=" + *family.size.value +
                             ": cannot tell the processes per node");
    }
    local_size = config.world_size / *nnodes;
  }
  if (local_rank && *local_rank >= *local_size) {
    bad(family.local_rank,
        "is not below the " + std::to_string(*local_size) + " processes of its node");
  }
  if (!node) {
    if (*nnodes == 1) {
      node = 0;
    } else if (config.world_size == *nnodes * *local_size) {
      node = config.rank / *local_size;  // block placement, as mpirun and torchrun place ranks
    } else {
      bad(family.rank, "cannot be placed on a node: set the node index variable");
    }
  }
}

// Checks that the whole shape (given and derived) holds together.
void check_shape(const Family& family, const JobConfig& config, const Given& given) {
  const auto& [local_size, local_rank, nnodes, node] = given;
  if (*node >= *nnodes) {
    bad(family.node.present() ? family.node : family.rank, "places the process on node " +
                                                               std::to_string(*node) + " of only " +
                                                               std::to_string(*nnodes));
  }
  if (*nnodes == 1 && *local_size != config.world_size) {
    bad(family.local_size.present() ? family.local_size : family.size,
        "disagrees with a single-node job of " + std::to_string(config.world_size) + " processes");
  }
  if (family.rank_is_node_major && local_rank && family.node.present() &&
      config.world_size == *nnodes * *local_size &&
      config.rank != *node * *local_size + *local_rank) {
    // (The local size may be derived rather than given: name what was given.)
    const std::string per_node = family.local_size.present()
                                     ? family.local_size.name + "=" + *family.local_size.value
                                     : std::to_string(*local_size) + " processes per node (" +
                                           family.size.name + " / " + std::to_string(*nnodes) +
                                           " nodes)";
    bad(family.rank, "disagrees with " + family.node.name + "=" + *family.node.value + ", " +
                         family.local_rank.name + "=" + *family.local_rank.value + " and " +
                         per_node);
  }
  if (*local_size > kMaxLocalProcesses) {
    bad(family.local_size.present() ? family.local_size : family.size,
        "puts " + std::to_string(*local_size) + " processes on one node; lockstep takes at most " +
            std::to_string(kMaxLocalProcesses) + " per node");
  }
}

JobConfig validate(const Family& family) {
  JobConfig config;
  config.source = family.source;
  config.world_size = integer(family.size, 1);
  config.rank = integer(family.rank, 0);
  if (config.rank >= config.world_size) {
    bad(family.rank, "is not below " + family.size.name + "=" + *family.size.value);
  }
  Given given = read_given(family, config);
  derive_shape(family, config, given);
  check_shape(family, config, given);
  const auto& [local_size, local_rank, nnodes, node] = given;
  config.local_rank = local_rank.value_or(-1);
  config.local_size = *local_size;
  config.num_nodes = *nnodes;
  config.node_index = *node;
  config.identity = family.identity;
  config.source_variables = variables_of(family);
  return config;
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());  // NOLINT(concurrency-mt-unsafe)
    if (value == nullptr) {
      return std::nullopt;
    }
    return std::string(value);
  };
}

namespace {

// Slurm gives no local size: it comes from the task lists, for this process's node.
void read_slurm_local_size(const EnvLookup& env, Family& slurm) {
  auto tasks = first_of(env, kSlurmTaskLists);
  auto per_node = lookup(env, std::string(kSlurmTasksPerNode));
  int node = slurm.node.present() ? integer(slurm.node, 0) : 0;
  if (tasks.present()) {
    if (auto count = slurm_tasks_on_node(tasks, node)) {
      slurm.local_size = Var{tasks.name, std::to_string(*count)};
    } else {
      bad(tasks, "lists no task count for SLURM_NODEID=" + std::to_string(node));
    }
  } else if (per_node.present()) {
    slurm.local_size = per_node;
  }
}

// One family's variables, as this process's environment has them (launcher_families.hpp names
// them).
Family family_of(const EnvLookup& env, const FamilyNames& names) {
  Family family;
  family.source = std::string(names.source);
  family.rank = first_of(env, names.rank);
  family.size = first_of(env, names.size);
  family.local_rank = first_of(env, names.local_rank);
  family.local_size = first_of(env, names.local_size);
  family.node = first_of(env, names.node);
  family.nnodes = first_of(env, names.nnodes);
  for (std::string_view name : names.required) {
    if (!name.empty()) {
      family.required_extra.push_back(lookup(env, std::string(name)));
    }
  }
  if (names.every_quantity_required) {
    for (const Var* var : {&family.local_rank, &family.local_size, &family.node, &family.nnodes}) {
      family.required_extra.push_back(*var);
    }
  }
  family.rank_is_node_major = names.rank_is_node_major;
  if (names.every_quantity_required) {
    // lockstep-run: the job id alone (read_job_config spells the identity from it).
    family.identity = family.required_extra.front().value.value_or("");
  } else {
    for (std::string_view name : names.identity) {
      if (auto value = name.empty() ? std::nullopt : env(std::string(name))) {
        family.identity += std::string(name) + "=" + *value + ";";
      }
    }
  }
  if (family.source == "slurm" && family.complete()) {
    read_slurm_local_size(env, family);
  }
  return family;
}

// The job the first complete family describes (a job of one when none is); ConfigError for a
// family that is there only in part.
JobConfig read_shape(const std::vector<Family>& families) {
  for (const auto& family : families) {
    if (family.complete()) {
      return validate(family);
    }
  }
  for (const auto& family : families) {
    // The launcher family is the torchrun family plus lockstep's own variables; report the
    // torchrun one, which names only what users set.
    if (family.source != "lockstep-run" && family.partial()) {
      throw ConfigError("lockstep: the " + family.source + " variables are incomplete: " +
                        family.missing() + " missing (a job needs both a rank and a size)");
    }
  }
  return JobConfig{};
}

// LOCKSTEP_JOIN_TIMEOUT, LOCKSTEP_STALL_WARNING: decimal seconds only ("30", "2.5"): no sign,
// spaces, exponent or hexadecimal; from a millisecond (or exactly 0, where `zero` means
// something) to 10^7 s.
std::chrono::milliseconds seconds_of(const Var& timeout, bool zero = false) {
  const std::string& text = *timeout.value;
  const auto dot = text.find('.');
  const auto digits = [](std::string_view part) {
    return !part.empty() && part.find_first_not_of("0123456789") == std::string_view::npos;
  };
  const std::string_view whole = std::string_view(text).substr(0, dot);
  if (!digits(whole) ||
      (dot != std::string::npos && !digits(std::string_view(text).substr(dot + 1)))) {
    bad(timeout, "is not a number of seconds (digits, optionally with a decimal point)");
  }
  const double seconds = std::strtod(text.c_str(), nullptr);
  if (seconds > 1e7) {
    bad(timeout, "is more than 10000000 seconds");
  }
  if (zero && seconds == 0) {
    return std::chrono::milliseconds(0);
  }
  if (seconds < 0.001) {
    bad(timeout,
        zero ? "is less than a millisecond (0 turns it off)" : "is less than a millisecond");
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

// LOCKSTEP_LOG, or the older LOCKSTEP_DEBUG where it is not set.
void read_log_level(const EnvLookup& env, JobConfig& config) {
  if (auto level = lookup(env, "LOCKSTEP_LOG"); level.present()) {
    if (*level.value == "off") {
      config.log_level = LogLevel::off;
    } else if (*level.value == "info") {
      config.log_level = LogLevel::info;
    } else if (*level.value == "debug") {
      config.log_level = LogLevel::debug;
    } else {
      bad(level, "is not one of off, info, debug");
    }
  } else if (auto debug = lookup(env, "LOCKSTEP_DEBUG"); debug.present()) {
    if (*debug.value != "0" && *debug.value != "1") {
      bad(debug, "is not 0 or 1 (LOCKSTEP_LOG=info|debug says more)");
    }
    config.log_level = *debug.value == "1" ? LogLevel::info : LogLevel::off;
  }
}

// lockstep's own variables, beside the job's shape.
void read_options(const EnvLookup& env, JobConfig& config) {
  if (auto policy = lookup(env, "LOCKSTEP_WAIT_POLICY"); policy.present()) {
    auto parsed = wait_policy_named(*policy.value);
    if (!parsed) {
      bad(policy, "is not one of adaptive, spin, block");
    }
    config.wait_policy = *parsed;
  }
  if (auto timeout = lookup(env, "LOCKSTEP_JOIN_TIMEOUT"); timeout.present()) {
    config.join_timeout = seconds_of(timeout);
  }
  if (auto stall = lookup(env, "LOCKSTEP_STALL_WARNING"); stall.present()) {
    config.stall_warning = seconds_of(stall, true);
  }
  if (auto check = lookup(env, "LOCKSTEP_CHECK"); check.present()) {
    if (*check.value != "kinds" && *check.value != "strict") {
      bad(check, "is not one of kinds, strict");
    }
    config.strict_check = *check.value == "strict";
  }
  if (auto link = lookup(env, "LOCKSTEP_LINK_TIMEOUT"); link.present()) {
    config.link_timeout = seconds_of(link);
    if (config.link_timeout < std::chrono::seconds(1) ||
        config.link_timeout > std::chrono::seconds(3600)) {
      bad(link,
          "is not from 1 to 3600 seconds (the kernel asks an unanswering machine once a "
          "second)");
    }
  }
  if (auto launch = lookup(env, "LOCKSTEP_LAUNCH_ID"); launch.present()) {
    const std::string& text = *launch.value;
    if (text.empty() || text.size() > 16 ||
        text.find_first_not_of("0123456789abcdef") != std::string::npos) {
      bad(launch, "is not 1 to 16 lower-case hexadecimal digits (lockstep-run sets it)");
    }
    config.launch = std::stoull(text, nullptr, 16);
  }
  if (auto backend = lookup(env, "LOCKSTEP_BACKEND"); backend.present()) {
    const auto known = known_backends();
    if (std::find(known.begin(), known.end(), *backend.value) == known.end()) {
      bad(backend, "is not one of " + comma_list(known));
    }
    config.backend = *backend.value;
  }
  read_log_level(env, config);
  if (auto mode = lookup(env, "LOCKSTEP_GPU_BARRIER"); mode.present()) {
    if (*mode.value != "flags" && *mode.value != "events" && *mode.value != "memops") {
      bad(mode, "is not one of flags, events (or 0.2's memops, now flags)");
    }
    config.gpu_barrier = *mode.value == "memops" ? "flags" : *mode.value;
  }
}

}  // namespace

JobConfig read_job_config(const EnvLookup& env, WaitPolicy default_policy) {
  auto job_id = lookup(env, "LOCKSTEP_JOB_ID");
  if (job_id.present() && job_id.value->empty()) {
    bad(job_id, "is empty");
  }
  std::vector<Family> families;
  families.reserve(kFamilies.size());
  for (const FamilyNames& names : kFamilies) {
    families.push_back(family_of(env, names));
  }
  JobConfig config = read_shape(families);
  if (config.identity.empty()) {
    config.identity = fallback_identity();
  }
  config.identity = config.source + ":" + config.identity;
  if (job_id.present()) {
    config.identity = job_identity(*job_id.value);  // the user's or launcher's identity wins
  }
  config.wait_policy = default_policy;
  read_options(env, config);
  if (config.num_nodes > 1) {
    read_master(env, config);
  }
  return config;
}

std::string backend_in_use(const JobConfig& config) {
  if (!config.backend.empty()) {
    return config.backend;
  }
  const std::vector<std::string> built = built_backends();
  return built.empty() ? std::string() : built.front();
}

}  // namespace lockstep::detail
