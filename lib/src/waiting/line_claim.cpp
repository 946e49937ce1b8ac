#include "waiting/line_claim.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace lockstep::detail {

bool can_claim_lines() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  unsigned int eax = 0;
  unsigned int ebx = 0;
  unsigned int ecx = 0;
  unsigned int edx = 0;
  // CPUID 0x80000001, ECX bit 8: PRFCHW (Intel), 3DNowPrefetch (AMD), the same instruction.
  return __get_cpuid(0x80000001U, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1U << 8U)) != 0;
#else
  return true;
#endif
}

}  // namespace lockstep::detail
