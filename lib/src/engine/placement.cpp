#include "engine/placement.hpp"

namespace lockstep::detail {

int emptier_cpu(std::span<const std::uint16_t> on, int here,
                const std::bitset<kMaxCpus>& usable) noexcept {
  const auto count = [&](int cpu) {
    return static_cast<std::size_t>(cpu) < on.size() ? int{on[static_cast<std::size_t>(cpu)]} : 0;
  };
  int best = -1;
  for (int cpu = 0; cpu < kMaxCpus; ++cpu) {
    if (usable[static_cast<std::size_t>(cpu)] && cpu != here &&
        (best < 0 || count(cpu) < count(best))) {
      best = cpu;
    }
  }
  return best >= 0 && count(best) + 2 <= count(here) ? best : -1;
}

}  // namespace lockstep::detail
