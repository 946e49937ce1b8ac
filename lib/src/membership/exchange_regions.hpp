// How a gather shares the node segment's broadcast area among the node's processes (internal):
// each owns a region, which holds its entry's head and, where they fit, its bytes.
#pragma once

#include <cstddef>
#include <string>

#include "engine/layout.hpp"  // kMaxBroadcast

namespace lockstep::detail {

// A gather's entry, in its process's region, and a record (as a node's part and the job's outcome
// carry them between machines): the process's rank (4 bytes), how it is held (4), its size (8),
// then that many bytes when inline (a record is always inline).
inline constexpr std::size_t kEntryHead = 16;

// An entry whose bytes stay in their writer's memory, where the others read them
// (process_vm_readv): after the head, the writer's pid (4 bytes), 4 unused, its pid namespace
// (8) and the bytes' address (8). A reader that cannot read them so (another pid namespace, not
// permitted: a Yama ptrace scope, a seccomp filter) says so in its slot (Slot::unread_gather),
// and every process then reads such entries from spills, in two more episodes.
inline constexpr std::size_t kInMemory = kEntryHead + 24;

// An entry whose bytes are in one of its writer's windows (engine/spill.hpp's Windows: a reader
// in place's, where they fit): after the head, which window (4 bytes), 4 unused, and its
// capacity (8).
inline constexpr std::size_t kWindowed = kEntryHead + 16;

// Whether a gather whose sink reads in place (Context::GatherSink::in_place: Python's
// gather_object, which unpickles each process's bytes where they lie) spills a process's `size`
// bytes on a machine of `processes`, which every reader maps, instead of holding them in memory,
// which each reader copies into memory of its own first: when its readers would copy 512 KiB or
// more together, and at least 64 KiB each. Python's gather_object on 2 vCPUs (1 MiB at N = 4 2.9x
// faster spilled, 300 KB 2.4x; at N = 2 100 KB 1.4x slower, 300 KB 1.12x, 600 KB 1.03x, 1 MiB
// about even).
constexpr bool spilled_in_place(std::size_t size, int processes) {
  constexpr std::size_t kEach = std::size_t{64} << 10;
  constexpr std::size_t kTogether = std::size_t{512} << 10;
  return processes >= 2 && size >= kEach &&
         size >= kTogether / static_cast<std::size_t>(processes - 1);
}

// The bytes of the broadcast area each of a node's `processes` owns in a gather (a multiple of
// 8); every region lies within the area.
constexpr std::size_t region_size(int processes) {
  return processes <= 0 ? 0 : kMaxBroadcast / static_cast<std::size_t>(processes) / 8 * 8;
}

// Whether a machine of `processes` can gather: each region must hold an entry's head.
constexpr bool gathers_fit(int processes) {
  return processes >= 1 && region_size(processes) >= kEntryHead;
}
// The most processes a machine may have for a gather.
inline constexpr int kMaxGatherProcesses = static_cast<int>(kMaxBroadcast / kEntryHead);
static_assert(gathers_fit(kMaxGatherProcesses) && !gathers_fit(kMaxGatherProcesses + 1));

// Why a machine of `processes` cannot gather (empty: it can), for `what`'s error.
inline std::string gather_refusal(int processes) {
  if (gathers_fit(processes)) {
    return {};
  }
  return "this machine has " + std::to_string(processes) +
         " processes of the job, and a gather takes at most " +
         std::to_string(kMaxGatherProcesses) +
         " on a machine (each needs its place in the node segment's area)";
}

}  // namespace lockstep::detail
