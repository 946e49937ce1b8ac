#include "base/fault_points.hpp"

#include <unistd.h>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <string>

#include "base/text.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace fault_detail {

std::atomic<bool> armed{false};

namespace {
std::string point;  // written before `armed` is set
long remaining = 0;
std::mutex mutex;
}  // namespace

void reached(const char* name) noexcept {
  std::lock_guard lock(mutex);
  if (point == name && --remaining == 0) {
    ::kill(::getpid(), SIGKILL);
  }
}

bool reached_failing(const char* name) noexcept {
  std::lock_guard lock(mutex);
  return point == name && --remaining == 0;
}

}  // namespace fault_detail

void arm_fault_points(int rank) {
  const char* value = std::getenv("LOCKSTEP_FAULT_POINT");  // NOLINT(concurrency-mt-unsafe)
  if (value == nullptr || *value == '\0') {
    return;
  }
  std::string spec = value;
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
  fault_detail::point = spec;
  fault_detail::remaining = count;
  fault_detail::armed.store(true, std::memory_order_relaxed);
}

}  // namespace lockstep::detail
