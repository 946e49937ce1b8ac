// Asking for a cache line in the state a write needs, ahead of the write (internal).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace lockstep::detail {

// Whether claim_line() may be called on this CPU: on x86 PREFETCHW needs its CPUID bit
// (0x80000001 ECX bit 8: Intel's PRFCHW, AMD's 3DNowPrefetch, one instruction); on other
// architectures the prefetch for a write is always there. Reads CPUID: ask once, not per poll.
[[nodiscard]] inline bool can_claim_lines() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  unsigned int eax = 0;
  unsigned int ebx = 0;
  unsigned int ecx = 0;
  unsigned int edx = 0;
  return __get_cpuid(0x80000001U, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1U << 8U)) != 0;
#else
  return true;
#endif
}

// Asks this core's cache for the line at `address` in the exclusive state, as a write would,
// without writing: a hint, unordered, and nothing if the line is exclusive here already. Call it
// only where can_claim_lines().
//
// For a poll whose next step, once the value it waits for comes, is a read-modify-write of the
// same line (the node barrier at N = 2: a waiter that sees the episode complete arrives at the
// next one on the same counter). A plain load fetches the line shared, and the write after it
// needs a second trip to take it from the other cores; a claimed line arrives writable, so the
// episode costs one line transfer instead of two.
inline void claim_line(const void* address) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(address)));
#else
  __builtin_prefetch(address, 1, 3);
#endif
}

}  // namespace lockstep::detail
