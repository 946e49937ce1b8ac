// How a process waits in a barrier, and the policies' names as LOCKSTEP_WAIT_POLICY, lockstep-run
// --wait-policy and lockstep_wait_policy() spell them (the one place that spells them).
#pragma once

#include <optional>
#include <string_view>

namespace lockstep {

// How a process waits in a barrier for the others to arrive.
//   adaptive: spin briefly (sized by processes per CPU and by the waits seen), then yield, then
//             sleep on a futex; on a machine busy with other work, never yield (sleep instead).
//   spin:     never sleep (lowest latency when every process has its own core; burns a core).
//   block:    sleep on a futex at once (lowest CPU use; about 10-15 us per wake-up).
enum class WaitPolicy { adaptive, spin, block };

inline constexpr WaitPolicy kWaitPolicies[] = {WaitPolicy::adaptive, WaitPolicy::spin,
                                               WaitPolicy::block};

// "adaptive", "spin" or "block".
constexpr const char* wait_policy_name(WaitPolicy policy) noexcept {
  switch (policy) {
    case WaitPolicy::spin:
      return "spin";
    case WaitPolicy::block:
      return "block";
    case WaitPolicy::adaptive:
      break;
  }
  return "adaptive";
}

// The policy that `name` spells; empty for any other text.
constexpr std::optional<WaitPolicy> wait_policy_named(std::string_view name) noexcept {
  for (WaitPolicy policy : kWaitPolicies) {
    if (name == wait_policy_name(policy)) {
      return policy;
    }
  }
  return std::nullopt;
}

}  // namespace lockstep
