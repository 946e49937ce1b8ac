// Fault injection for tests: a process kills itself (SIGKILL) at a named point (internal).
//
// LOCKSTEP_FAULT_POINT=NAME[@RANK][:N] makes the process of rank RANK (any, if omitted) die at
// the N-th time (1 if omitted) it reaches the point NAME; several, separated by commas, arm each.
// Only tests set it; unset, a point costs one load of a process-local flag. The points:
//   join.locked      joining: holding the segment's lock, before claiming a slot
//   join.claimed     joining: slot claimed, before the node's rendezvous
//   join.joined      joining: the rendezvous complete, before the State exists
//   barrier.arrived  arrival counted, before the arrival mark (the peers' diagnostics) is stored
//   barrier.waiting  waiting for the others
//   barrier.passed   the episode complete, before returning
//   leave.marked     leaving: slot marked left, before the last one out removes the segment
//   lead.local       a multi-node leader: its node arrived, before meeting the other leaders
//   lead.met         a multi-node leader: the other leaders met, before releasing its node
//   gpu.releasing    a GPU watchdog releasing the streams: after raising one process's flag
//   exchange.written a gather's or broadcast's writer (one machine): its entry written (inline,
//                    in its memory, or its spill: engine/spill.hpp), before it arrives at the
//                    exchange's first episode
// and the points where a process fails (fault_fails) rather than dies:
//   join.welcome-changed  a joining node's leader: node 0's welcome read, then found changed on
//                         the way (its first byte flipped: it does not decode)
//   spill.full            a spill's writer: /dev/shm takes none of its bytes (ENOSPC)
//   exchange.no-memory-read  a gather's reader on one machine: another process's memory cannot
//                         be read (process_vm_readv refused), so the gather goes on through spills
#pragma once

#include <atomic>

namespace lockstep::detail {

// Reads LOCKSTEP_FAULT_POINT for the process of `rank` (once per process; ConfigError when
// malformed).
void arm_fault_points(int rank);

namespace fault_detail {
extern std::atomic<bool> armed;
void reached(const char* name) noexcept;
bool reached_failing(const char* name) noexcept;
}  // namespace fault_detail

// Dies here if LOCKSTEP_FAULT_POINT names this point (see above).
inline void fault_point(const char* name) noexcept {
  // Relaxed: a process-local flag set once, before any point is reached.
  if (fault_detail::armed.load(std::memory_order_relaxed)) [[unlikely]] {
    fault_detail::reached(name);
  }
}

// True here if LOCKSTEP_FAULT_POINT names this point: the caller then fails as the point's line
// above says.
inline bool fault_fails(const char* name) noexcept {
  return fault_detail::armed.load(std::memory_order_relaxed) && fault_detail::reached_failing(name);
}

}  // namespace lockstep::detail
