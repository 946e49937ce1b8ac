#include "shm/wait.hpp"

#include <sched.h>

namespace lockstep::detail {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

WaitPlan make_wait_plan(WaitPolicy policy, int processes, int cpus) {
  switch (policy) {
    case WaitPolicy::spin:
      return WaitPlan{nanoseconds::max(), nanoseconds{0}, false};
    case WaitPolicy::block:
      return WaitPlan{nanoseconds{0}, nanoseconds{0}, true};
    case WaitPolicy::adaptive:
      break;
  }
  if (processes <= cpus) {
    return WaitPlan{microseconds(20), microseconds(200), true};
  }
  return WaitPlan{nanoseconds(0), milliseconds(2), true};
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) {
    return 1;
  }
  int count = CPU_COUNT(&set);
  return count > 0 ? count : 1;
}

}  // namespace lockstep::detail
