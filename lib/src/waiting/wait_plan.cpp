#include "waiting/wait_plan.hpp"

#include <algorithm>

namespace lockstep::detail {

using std::chrono::nanoseconds;
using namespace wait_tuning;

WaitOptions plan_wait(WaitPolicy policy, const WaitShape& shape, bool loaded,
                      nanoseconds learned_spin) noexcept {
  switch (policy) {
    case WaitPolicy::spin:
      return WaitOptions{nanoseconds::max(), nanoseconds{0}, false};
    case WaitPolicy::block:
      return WaitOptions{nanoseconds{0}, nanoseconds{0}, true};
    case WaitPolicy::adaptive:
      break;
  }
  const bool own_cpu = shape.processes <= shape.cpus;
  if (shape.across_nodes) {
    // Yield between polls from the start (as MPI does), so that on a crowded node the process
    // waited for gets the CPU; with a CPU per process, only as long as a node's spin and yield
    // (bench/barrier_bench's BM_LockstepCrossNode, 2x2 nodes on 2 vCPUs: 2 ms of
    // yielding cost 30-40% more per episode than 220 us).
    const nanoseconds yield = own_cpu ? nanoseconds(kYieldAcrossNodes) : nanoseconds(kYieldIdle);
    return WaitOptions{nanoseconds{0}, loaded ? nanoseconds{0} : yield, true};
  }
  if (loaded && own_cpu) {
    return WaitOptions{nanoseconds(kSpinLoaded), nanoseconds{0}, true};
  }
  if (own_cpu) {
    return WaitOptions{std::clamp(learned_spin, nanoseconds(kSpinMin), nanoseconds(kSpinMaxIdle)),
                       kYieldIdle, true};
  }
  return WaitOptions{nanoseconds{0}, loaded ? nanoseconds{0} : kYieldIdle, true};
}

}  // namespace lockstep::detail
