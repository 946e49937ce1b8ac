// The node segment's layout in shared memory (internal).
//
// One segment per job and node, named from the job's identity. It holds a header, written once
// by the first process to lock it, and one slot per node-local process. Everything that more than
// one process writes after set-up lives on a cache line of its own.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "job/launch_env.hpp"  // kMaxIdentity

namespace lockstep::detail {

inline constexpr std::size_t kCacheLine = 64;
inline constexpr std::uint64_t kSegmentMagic = 0x7065'7473'6b63'6f6cULL;  // "lockstep"
// Bump whenever the layout below or a field's meaning changes: processes of two layouts must
// never share a segment.
inline constexpr std::uint32_t kLayoutVersion = 17;
inline constexpr std::size_t kMaxFailureMissing = 64;
inline constexpr std::size_t kMaxFailureMessage = 768;

static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shared words must be lock-free");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared words must be lock-free");
static_assert(std::atomic<std::int32_t>::is_always_lock_free, "shared words must be lock-free");

template <class T>
struct alignas(kCacheLine) Line {
  std::atomic<T> value;
};

inline constexpr std::uint64_t kWithdrawn = 1ULL << 63;

// How a peer was lost, kept in SegmentHeader::lost beside its slot. `elsewhere`: the slot is the
// node's leader, which gave up on a cross-node barrier for the reason in SegmentHeader::failure.
enum class LostHow : std::uint32_t { died = 1, left = 2, elsewhere = 3 };
inline constexpr std::uint32_t lost_word(int slot, LostHow how) {
  return static_cast<std::uint32_t>(slot + 1) | (static_cast<std::uint32_t>(how) << 24);
}
inline constexpr int lost_slot(std::uint32_t word) {
  return static_cast<int>(word & 0xffffff) - 1;
}
inline constexpr LostHow lost_how(std::uint32_t word) {
  return static_cast<LostHow>(word >> 24);
}
inline constexpr const char* describe(LostHow how) {
  switch (how) {
    case LostHow::died:
      return "died";
    case LostHow::left:
      return "left the job";
    case LostHow::elsewhere:
      break;
  }
  return "gave up on the job";
}

enum class SlotStatus : std::uint32_t { empty = 0, joined = 1, left = 2 };

// One node-local process. Set-up fields are written under the segment's lock; `arrived` is
// written by the slot's owner alone and read by the others only on slow paths.
struct alignas(kCacheLine) Slot {
  std::atomic<std::int32_t> pid;
  std::atomic<std::int32_t> rank;
  std::atomic<std::uint32_t> status;  // SlotStatus
  std::atomic<std::uint64_t> start_time;
  std::atomic<std::int32_t> local_rank;  // as given (LOCAL_RANK), or -1: elected by rank order
  // The number (1, 2, ...) of the last gather on one machine in which the owner could not read
  // another process's bytes in place (membership/exchange.cpp: then they go through spills).
  // Written by the owner alone, between a gather's episodes; read by the others after them.
  // Layout 15.
  std::atomic<std::uint64_t> unread_gather;
  // The episode number + 1 of the barrier this process has arrived at (0: none yet), with
  // kWithdrawn set when it gave up on that episode (timed out) and took its arrival back.
  alignas(kCacheLine) std::atomic<std::uint64_t> arrived;
  // The CPU the owner ran on when it last arrived and waited (-1: unknown). On a loaded machine
  // a waiter whose late peer was last seen on its CPU sleeps at once rather than spin; with more
  // processes than CPUs on an idle one, a waiter whose late peers were all seen elsewhere polls
  // a moment before each yield (Waiter::asks_where_peers_are).
  std::atomic<std::int32_t> cpu;
  // While the owner sleeps in a barrier wait: the arrival count it waits for (else 0). A hint
  // for the peers' load samples (lib/src/waiting/waiter.hpp), never needed for correctness.
  std::atomic<std::uint64_t> asleep_until;
  // When the owner last withdrew an arrival (steady clock, ns), stored before `arrived` is
  // (release): peers that time out too tell a process that gave up before they arrived (not
  // arrived) from one that waited with them and gave up at the same moment (arrived).
  std::atomic<std::int64_t> withdrawn_at;
};

struct SegmentHeader {
  // Written once, under the lock, before `magic`; read only after `magic` under the lock.
  std::uint64_t magic;
  std::uint32_t layout_version;
  std::uint32_t num_slots;
  std::uint32_t world_size;
  std::uint32_t identity_length;
  char identity[kMaxIdentity];
  // The launch that created the segment (LOCKSTEP_LAUNCH_ID, set by lockstep-run; 0 without
  // one): processes of two launches never share a segment, even with one job identity.
  std::uint64_t launch;
  // The creator's pid namespace (/proc/self/ns/pid): the slots' pids mean something only there,
  // so only processes of that namespace judge whether the segment's processes are dead.
  std::uint64_t pid_namespace;

  Line<std::uint32_t> joined;  // slots claimed; futex word of the join rendezvous
  Line<std::uint32_t> left;    // slots whose process left the job
  Line<std::uint32_t> lost;    // 0, or lost_word() of the first peer found dead or gone mid-wait
  // The barrier's hot line. `arrivals` is the monotonic count of arrivals: episode e is complete
  // once it reaches (e + 1) * num_slots; waiters spin on it. `generation` is the futex word of
  // sleeping waiters, incremented (never stored: a sleeper must never see an old value come back)
  // when an episode completes while someone sleeps, and when a waiter must look (a peer left,
  // was lost or exited: NodeSegment::wake_waiters). Layout 11: in 10 the completer stored the
  // episode's number, and some sleepers sleep without a timeout now. One cache line on purpose: the
  // arrival that completes an episode publishes it by arriving, and a waiter's next arrival finds
  // the line already fetched, so consecutive episodes cost one line transfer instead of two
  // (bench/barrier_bench, N=2: see README's Performance section).
  struct alignas(kCacheLine) Episode {
    std::atomic<std::uint64_t> arrivals;
    std::atomic<std::uint32_t> generation;
  } episode;
  Line<std::uint32_t> sleepers;  // waiters in (or entering) futex_wait on `generation`
  // The node's latest load sample (lib/src/waiting: Waiter::share_samples), a hint: the steady
  // clock in microseconds (48 bits) when it was taken, shifted left 16, or'ed with the foreign
  // tasks it counted (15 bits) and, above them, whether only the job's sleepers may explain them.
  // Layout 12: in 11 every process read /proc/loadavg for its own samples. Layout 17: in 16 the
  // low 16 bits were the count alone.
  Line<std::uint64_t> load_sample;
  // Multi-node jobs: why the node's leader gave up on a cross-node barrier. Written once, by the
  // leader alone, before it sets `lost` to lost_word(its slot, LostHow::elsewhere) (acq_rel);
  // read only after reading that word (acquire).
  struct alignas(kCacheLine) Failure {
    // 0, then 1 once a writer claimed the record (CAS): the leader's cross-node failure and a GPU
    // watchdog's timeout may both try to write it; only the first does.
    std::atomic<std::uint32_t> claim;
    std::uint32_t kind;  // FailureKind
    std::int32_t rank;
    std::uint32_t num_missing;
    std::uint32_t message_length;
    std::int32_t missing[kMaxFailureMissing];
    char message[kMaxFailureMessage];
  } failure;
};

// One node-local process's GPU barrier (lib/src/gpu): written by its owner alone when it sets the
// barrier up (before its arrival at the set-up episode), read by the others after that episode.
inline constexpr int kGpuRing = 4;             // interprocess events per process, used in turn
inline constexpr std::size_t kIpcHandle = 64;  // sizeof(CUipcEventHandle)
struct alignas(kCacheLine) GpuSlot {
  std::atomic<std::uint32_t> ready;  // 1 (events), 3 (flags) or 4 (refused) once set up: a
                                     // record; the set-up's gather tells the peers
  std::int32_t device;
  unsigned char events[kGpuRing][kIpcHandle];  // CUipcEventHandle, events mode
  // Flags mode: the episodes the owner has enqueued on its streams (written by the owner after
  // each enqueue; read by the peers' watchdogs, which release the streams until every live
  // process's stream has passed them all).
  alignas(kCacheLine) std::atomic<std::uint64_t> enqueued;
};

// The flags mode's area (lib/src/gpu/flag_barrier.hpp): host memory at a page-aligned offset of
// the segment, which every process registers with CUDA so that its streams write and wait on it
// while any CPU can read and release it. Streams write their own process's GpuFlag; the CPU
// writes only to release (a watchdog) and the header's `released`, which kernels may read.
inline constexpr std::size_t kGpuAreaAlign = 65536;  // the largest page of CUDA's hosts (arm64)
struct alignas(kCacheLine) GpuAreaHeader {
  std::atomic<std::uint32_t> released;  // nonzero once a failure released the streams
  // Across nodes: the last episode the node's leader met the other nodes at (its relay writes it;
  // the node's streams wait on it). Layout 13: in 12 flags mode ran on one node only.
  std::atomic<std::uint64_t> node_met;
};
struct alignas(kCacheLine) GpuFlag {
  std::atomic<std::uint64_t> arrived;  // the last episode the owner's stream reached
  std::atomic<std::uint64_t> passed;   // the last episode whose waits the owner's stream passed
};

// The exchanges' area (membership/exchange.cpp): a broadcast's bytes, or each process's entry of
// a gather in a region of its own, and across machines the job's gathered records, where they
// fit; a spill (engine/spill.hpp) holds what does not. Written before the writer's arrival at an
// exchange's first episode, read after that episode, free again after its last (the barrier
// orders it: no atomics here). Layout 15: in 14 an exchange carried at most this area.
inline constexpr std::size_t kMaxBroadcast = 32768;
struct alignas(kCacheLine) BroadcastArea {
  std::uint64_t size;    // the bytes held (in `data`, or in the node's spill)
  std::uint32_t status;  // how they are held (exchange.cpp's Held)
  unsigned char data[kMaxBroadcast];
};

// Each process's calls (lib/src/engine/call_log.hpp): where it waits, and where it waited last,
// for the messages of a wait that lasts or fails and for `lockstep-run --status`. Written by its
// owner alone; read by anyone, as diagnostics only. Layout 14: 13 had no record of calls.
inline constexpr int kCallRing = 16;            // the last calls kept, the current one included
inline constexpr std::uint32_t kMaxSites = 63;  // distinct call sites named per process
inline constexpr std::size_t kSiteText = 120;
// One call: `sequence` is 2 * (its number) + 1 while the owner writes the entry, 2 * (its number
// + 1) once it is whole (a reader that reads the same even value before and after the fields
// has them whole, and of the call it looked for).
struct CallEntry {
  std::atomic<std::uint64_t> sequence;
  std::atomic<std::uint64_t> episode;  // the barrier's episode (kNoEpisode: none, as a join)
  std::atomic<std::uint32_t> call;     // call_word(): the kind, the site and how it ended
  std::atomic<std::int64_t> began;     // steady clock, ns, as of the last tick (coarse), or
                                       // kEpisodeEnd (call_log.hpp): the episode's end
  std::atomic<std::int64_t> ended;     // 0 while the call lasts
};
inline constexpr std::uint64_t kNoEpisode = ~0ULL;
// A call site: its line, then its file and function, each ending in '\0', truncated to fit
// (the file keeps its end). Written once, before the owner's `sites` counts it (release).
struct SiteText {
  std::uint32_t line;
  char text[kSiteText + 4];
};
// In the segment, zeroed by the kernel; a test's own log is value-initialized.
struct alignas(kCacheLine) CallLog {  // NOLINT(cppcoreguidelines-pro-type-member-init)
  std::atomic<std::uint64_t> calls;   // calls begun; the latest is ring[(calls - 1) % kCallRing]
  std::atomic<std::uint32_t> sites;   // site[0, sites) are written
  alignas(kCacheLine) CallEntry ring[kCallRing];
  SiteText site[kMaxSites];
};

static_assert(std::is_standard_layout_v<Slot>, "Slot lives in shared memory");
static_assert(std::is_standard_layout_v<CallLog>, "CallLog lives in shared memory");
static_assert(std::is_standard_layout_v<GpuSlot>, "GpuSlot lives in shared memory");
static_assert(std::is_standard_layout_v<GpuFlag>, "GpuFlag lives in shared memory");
static_assert(std::is_standard_layout_v<GpuAreaHeader>, "GpuAreaHeader lives in shared memory");
static_assert(std::is_standard_layout_v<SegmentHeader>, "SegmentHeader lives in shared memory");
static_assert(std::is_standard_layout_v<BroadcastArea>, "BroadcastArea lives in shared memory");
static_assert(sizeof(Slot) == 2 * kCacheLine, "a slot is its set-up line plus its arrival line");
static_assert(sizeof(SegmentHeader) % kCacheLine == 0, "slots must start on a cache line");
// The layout of version 17, pinned: a change to any field's place or size fails here, and whoever
// updates these numbers must bump kLayoutVersion with them (processes of two layouts must never
// share a segment).
static_assert(kLayoutVersion == 17, "update the pinned layout below with the version");
static_assert(sizeof(SegmentHeader) == 2048 && sizeof(Slot) == 128 && sizeof(GpuSlot) == 384 &&
                  sizeof(GpuAreaHeader) == 64 && sizeof(GpuFlag) == 64 &&
                  sizeof(BroadcastArea) == 32832 && offsetof(BroadcastArea, data) == 12 &&
                  sizeof(CallEntry) == 40 && sizeof(SiteText) == 128 && sizeof(CallLog) == 8768,
              "layout 15: sizes");
static_assert(offsetof(CallLog, calls) == 0 && offsetof(CallLog, sites) == 8 &&
                  offsetof(CallLog, ring) == 64 && offsetof(CallLog, site) == 704 &&
                  offsetof(CallEntry, episode) == 8 && offsetof(CallEntry, call) == 16 &&
                  offsetof(CallEntry, began) == 24 && offsetof(CallEntry, ended) == 32,
              "layout 15: the call log's fields");
static_assert(offsetof(SegmentHeader, identity) == 24 && offsetof(SegmentHeader, launch) == 504 &&
                  offsetof(SegmentHeader, pid_namespace) == 512 &&
                  offsetof(SegmentHeader, joined) == 576 && offsetof(SegmentHeader, left) == 640 &&
                  offsetof(SegmentHeader, lost) == 704 && offsetof(SegmentHeader, episode) == 768 &&
                  offsetof(SegmentHeader, sleepers) == 832 &&
                  offsetof(SegmentHeader, load_sample) == 896 &&
                  offsetof(SegmentHeader, failure) == 960,
              "layout 15: the header's fields");
static_assert(offsetof(Slot, pid) == 0 && offsetof(Slot, rank) == 4 &&
                  offsetof(Slot, status) == 8 && offsetof(Slot, start_time) == 16 &&
                  offsetof(Slot, local_rank) == 24 && offsetof(Slot, unread_gather) == 32 &&
                  offsetof(Slot, arrived) == 64 && offsetof(Slot, cpu) == 72 &&
                  offsetof(Slot, asleep_until) == 80 && offsetof(Slot, withdrawn_at) == 88,
              "layout 15: a slot's fields");
static_assert(offsetof(GpuSlot, ready) == 0 && offsetof(GpuSlot, device) == 4 &&
                  offsetof(GpuSlot, events) == 8 && offsetof(GpuSlot, enqueued) == 320 &&
                  offsetof(GpuFlag, arrived) == 0 && offsetof(GpuFlag, passed) == 8 &&
                  offsetof(GpuAreaHeader, released) == 0 && offsetof(GpuAreaHeader, node_met) == 8,
              "layout 15: a GPU slot's fields and the GPU area's header");
// Every layout version keeps these where version 1 had them: a process reads them (with pread,
// before mapping) to tell another version's segment from a torn one.
static_assert(offsetof(SegmentHeader, magic) == 0 && offsetof(SegmentHeader, layout_version) == 8 &&
                  offsetof(SegmentHeader, num_slots) == 12,
              "the header's first fields are the same in every layout version");

inline constexpr std::size_t align_up(std::size_t bytes, std::size_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}
// The header, then the slots, then one GpuSlot per slot; then, at a page boundary, the GPU area:
// its header and one GpuFlag per slot, padded to a page; then the broadcast area; then, at a
// cache line, one CallLog per slot.
inline constexpr std::size_t gpu_area_offset(std::uint32_t num_slots) {
  return align_up(sizeof(SegmentHeader) + num_slots * (sizeof(Slot) + sizeof(GpuSlot)),
                  kGpuAreaAlign);
}
inline constexpr std::size_t gpu_area_size(std::uint32_t num_slots) {
  return align_up(sizeof(GpuAreaHeader) + num_slots * sizeof(GpuFlag), kGpuAreaAlign);
}
inline constexpr std::size_t broadcast_area_offset(std::uint32_t num_slots) {
  return gpu_area_offset(num_slots) + gpu_area_size(num_slots);
}
inline constexpr std::size_t call_log_offset(std::uint32_t num_slots) {
  return align_up(broadcast_area_offset(num_slots) + sizeof(BroadcastArea), kCacheLine);
}
inline constexpr std::size_t segment_size(std::uint32_t num_slots) {
  return call_log_offset(num_slots) + num_slots * sizeof(CallLog);
}

}  // namespace lockstep::detail
