#include "base/fault_points.hpp"

#include <unistd.h>
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/text.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace fault_detail {

std::atomic<bool> armed{false};

namespace {
// The points armed for this process, with how many more reaches each takes (written before
// `armed` is set).
std::vector<std::pair<std::string, long>> points;
std::mutex mutex;

bool reached_armed(const char* name) noexcept {
  std::lock_guard lock(mutex);
  for (auto& [point, remaining] : points) {
    if (point == name && --remaining == 0) {
      return true;
    }
  }
  return false;
}
}  // namespace

void reached(const char* name) noexcept {
  if (reached_armed(name)) {
    ::kill(::getpid(), SIGKILL);
  }
}

bool reached_failing(const char* name) noexcept {
  return reached_armed(name);
}

}  // namespace fault_detail

namespace {

// One NAME[@RANK][:N] of LOCKSTEP_FAULT_POINT: armed when it is this rank's.
void arm_one(std::string spec, const char* value, int rank) {
  long count = 1;
  if (auto colon = spec.find(':'); colon != std::string::npos) {
    auto parsed = parse_integer(spec.substr(colon + 1));
    if (!parsed || *parsed < 1) {
      throw ConfigError("lockstep: LOCKSTEP_FAULT_POINT=\"" + std::string(value) +
                        "\": the count after ':' must be a positive integer");
    }
    count = static_cast<long>(*parsed);
    spec.resize(colon);
  }
  if (auto at = spec.find('@'); at != std::string::npos) {
    auto parsed = parse_integer(spec.substr(at + 1));
    if (!parsed || *parsed < 0) {
      throw ConfigError("lockstep: LOCKSTEP_FAULT_POINT=\"" + std::string(value) +
                        "\": the rank after '@' must be a process index");
    }
    spec.resize(at);
    if (*parsed != rank) {
      return;  // another process's fault
    }
  }
  std::lock_guard lock(fault_detail::mutex);
  fault_detail::points.emplace_back(spec, count);
  fault_detail::armed.store(true, std::memory_order_relaxed);
}

}  // namespace

void arm_fault_points(int rank) {
  const char* value = std::getenv("LOCKSTEP_FAULT_POINT");  // NOLINT(concurrency-mt-unsafe)
  if (value == nullptr || *value == '\0') {
    return;
  }
  const std::string specs = value;
  std::size_t begin = 0;
  while (begin <= specs.size()) {
    const std::size_t end = std::min(specs.find(',', begin), specs.size());
    arm_one(specs.substr(begin, end - begin), value, rank);
    begin = end + 1;
  }
}

}  // namespace lockstep::detail
