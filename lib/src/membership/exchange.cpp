// Context's exchanges (internal): State::broadcast (the main process's bytes to every process)
// and State::gather_object (every process's bytes to every process), through the node segment's
// broadcast area and, across machines, the leaders' backend.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/little_endian.hpp"
#include "lockstep/error.hpp"
#include "membership/busy_guard.hpp"
#include "membership/context.hpp"

namespace lockstep::detail {
namespace {

// A broadcast as it travels between machines: the status (4 bytes), the size (8), the data.
constexpr std::size_t kBroadcastHead = 12;

std::vector<std::byte> encode_broadcast(const BroadcastArea& area) {
  const std::size_t n = area.status == 0 ? area.size : 0;
  std::vector<std::byte> out(kBroadcastHead + n);
  put_le(out.data(), area.status, 4);
  put_le(out.data() + 4, area.size, 8);
  std::memcpy(out.data() + kBroadcastHead, area.data, n);
  return out;
}

void decode_broadcast(const std::vector<std::byte>& in, BroadcastArea& area, const char* what) {
  const auto refuse = [&] {
    throw Error(std::string(what) + ": node 0's broadcast is not lockstep's (" +
                std::to_string(in.size()) + " bytes)");
  };
  if (in.size() < kBroadcastHead) {
    refuse();
  }
  const auto status = static_cast<std::uint32_t>(get_le(in.data(), 4));
  const std::uint64_t size = get_le(in.data() + 4, 8);
  const std::size_t n = in.size() - kBroadcastHead;
  if (status > 2 || (status == 0 && (size != n || n > kMaxBroadcast))) {
    refuse();
  }
  area.status = status;
  area.size = size;
  std::memcpy(area.data, in.data() + kBroadcastHead, status == 0 ? n : 0);
}

// A gather's entry, in its process's region of the broadcast area and between machines: the
// process's rank (4 bytes), the most bytes a process of its machine may give (4), the size it
// gave (8), then that many bytes, left out when over the most.
constexpr std::size_t kEntryHead = 16;
// What every process of a node reads after a gather: why it failed (4 bytes: a GatherOutcome),
// the rank (4), size (8) and most (8) that say why, then (when it did not fail) the job's entries.
constexpr std::size_t kOutcomeHead = 24;
enum class GatherOutcome : std::uint32_t {
  gathered = 0,
  over_its_most = 1,
  over_in_all = 2,
  garbled = 3
};

// The bytes of the broadcast area each of a node's `processes` owns in a gather.
std::size_t region_size(int processes) {
  return kMaxBroadcast / static_cast<std::size_t>(processes) / 8 * 8;
}

struct Entry {
  int rank = -1;
  std::uint64_t most = 0;
  std::uint64_t size = 0;
  std::span<const std::byte> data;  // empty when left out
  std::size_t length = 0;           // of the whole entry
};

void put_entry(std::byte* at, int rank, std::span<const std::byte> data, std::size_t most) {
  put_le(at, static_cast<std::uint32_t>(rank), 4);
  put_le(at + 4, most, 4);
  put_le(at + 8, data.size(), 8);
  if (data.size() <= most && !data.empty()) {  // an empty span's data() may be null
    std::memcpy(at + kEntryHead, data.data(), data.size());
  }
}

// The entry that `bytes` begin with; nullopt when they do not hold a whole one.
std::optional<Entry> read_entry(std::span<const std::byte> bytes) {
  if (bytes.size() < kEntryHead) {
    return std::nullopt;
  }
  Entry entry;
  entry.rank = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(bytes.data(), 4)));
  entry.most = get_le(bytes.data() + 4, 4);
  entry.size = get_le(bytes.data() + 8, 8);
  const std::uint64_t carried = entry.size <= entry.most ? entry.size : 0;
  if (carried > bytes.size() - kEntryHead) {
    return std::nullopt;
  }
  entry.data = bytes.subspan(kEntryHead, carried);
  entry.length = kEntryHead + carried;
  return entry;
}

// What a node's processes read: the outcome, and the entries of `parts` (each a run of whole
// entries: a node's regions, or the machines' parts) unless one is over its most or, when the
// outcome is for the broadcast area (`for_area`: across machines), they are over it in all.
std::vector<std::byte> gather_outcome(const std::vector<std::span<const std::byte>>& parts,
                                      bool for_area) {
  std::vector<std::byte> out(kOutcomeHead);
  const auto fail = [&](GatherOutcome why, int rank, std::uint64_t size, std::uint64_t most) {
    out.assign(kOutcomeHead, std::byte{0});
    put_le(out.data(), static_cast<std::uint32_t>(why), 4);
    put_le(out.data() + 4, static_cast<std::uint32_t>(rank), 4);
    put_le(out.data() + 8, size, 8);
    put_le(out.data() + 16, most, 8);
    return out;
  };
  for (std::span<const std::byte> part : parts) {
    while (!part.empty()) {
      const std::optional<Entry> entry = read_entry(part);
      if (!entry) {
        return fail(GatherOutcome::garbled, -1, part.size(), 0);
      }
      if (entry->size > entry->most) {
        return fail(GatherOutcome::over_its_most, entry->rank, entry->size, entry->most);
      }
      out.insert(out.end(), part.begin(),
                 part.begin() + static_cast<std::ptrdiff_t>(entry->length));
      part = part.subspan(entry->length);
    }
  }
  if (for_area && out.size() > kMaxBroadcast) {
    return fail(GatherOutcome::over_in_all, -1, out.size() - kOutcomeHead,
                kMaxBroadcast - kOutcomeHead);
  }
  return out;
}

// Every process's bytes, by rank, from what gather_outcome made; throws its failure.
std::vector<std::vector<std::byte>> gathered(std::span<const std::byte> outcome, int world_size,
                                             const char* what) {
  const auto garbled = [&] {
    return Error("lockstep: " + std::string(what) + ": the gathered bytes are not lockstep's (" +
                 std::to_string(outcome.size()) + " bytes)");
  };
  if (outcome.size() < kOutcomeHead) {
    throw garbled();
  }
  const auto why = static_cast<GatherOutcome>(get_le(outcome.data(), 4));
  const auto rank =
      static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(outcome.data() + 4, 4)));
  const std::uint64_t size = get_le(outcome.data() + 8, 8);
  const std::uint64_t most = get_le(outcome.data() + 16, 8);
  const std::string larger = " (write larger data to a file and gather its name)";
  switch (why) {
    case GatherOutcome::gathered:
      break;
    case GatherOutcome::over_its_most:
      throw Error(
          "lockstep: " + std::string(what) + ": process " + std::to_string(rank) + " gave " +
          std::to_string(size) + " bytes; a gather carries at most " + std::to_string(most) +
          " bytes per process on its machine (" + std::to_string(kMaxBroadcast) +
          " bytes shared by the machine's processes, 16 of each process's for lockstep)" + larger);
    case GatherOutcome::over_in_all:
      throw Error("lockstep: " + std::string(what) + ": the processes gave " +
                  std::to_string(size) + " bytes in all, 16 of each process's for lockstep; a " +
                  "gather across machines carries at most " + std::to_string(most) + larger);
    default:
      throw garbled();
  }
  std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(world_size));
  std::vector<bool> seen(out.size());
  std::span<const std::byte> rest = outcome.subspan(kOutcomeHead);
  while (!rest.empty()) {
    const std::optional<Entry> entry = read_entry(rest);
    if (!entry || entry->rank < 0 || entry->rank >= world_size ||
        seen[static_cast<std::size_t>(entry->rank)]) {
      throw garbled();
    }
    seen[static_cast<std::size_t>(entry->rank)] = true;
    out[static_cast<std::size_t>(entry->rank)].assign(entry->data.begin(), entry->data.end());
    rest = rest.subspan(entry->length);
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end()) {
    throw garbled();
  }
  return out;
}

}  // namespace

std::vector<std::byte> Context::broadcast(std::span<const std::byte> data, const char* what,
                                          const CallSite& site) {
  check_usable(what);
  if (!barrier_) {  // a job of one
    if (data.size() > kMaxBroadcast) {
      throw_too_large(data.size(), what);
    }
    return {data.begin(), data.end()};
  }
  BusyGuard busy(busy_, what);
  if (left_.load(std::memory_order_seq_cst)) {
    throw_left(what);
  }
  // The writer of this node's area: the main process on a machine of its own; across machines
  // node 0's leader, which must be the main process (every launcher places it so), and every
  // other leader with what node 0's sent. Written before the first episode, read after it; the
  // second episode frees the area for the next broadcast.
  InterruptsHeldOff no_interrupts;
  settle_streams(std::nullopt, what);
  const std::uint32_t call = barrier_->recorder().word(CallKind::broadcast, site);
  BroadcastArea& area = segment_->broadcast_area();
  const bool main_leads_node0 = config_.node_index == 0 && local_index_ == 0;
  if (config_.rank == 0 && (config_.num_nodes == 1 || main_leads_node0)) {
    area.size = data.size();
    area.status = data.size() > kMaxBroadcast ? 1 : 0;
    if (area.status == 0 && !data.empty()) {  // an empty span's data() may be null
      std::memcpy(area.data, data.data(), data.size());
    }
  }
  if (backend_) {
    if (config_.node_index == 0) {
      if (config_.rank != 0) {
        area.status = 2;  // the main process is not here: say so everywhere
        area.size = 0;
      }
      (void)backend_->share(encode_broadcast(area), true, std::nullopt, what);
    } else {
      decode_broadcast(backend_->share({}, false, std::nullopt, what), area, what);
    }
  }
  arrive(std::nullopt, what, call);
  if (area.status == 1) {
    const std::uint64_t size = area.size;
    arrive(std::nullopt, what, call);  // everyone has read the refusal
    throw_too_large(size, what);
  }
  if (area.status == 2) {
    arrive(std::nullopt, what, call);
    throw ConfigError("lockstep: " + std::string(what) +
                      ": the main process (process 0) must lead machine 0 (be its local process "
                      "0) for a broadcast across machines; this job places it elsewhere");
  }
  std::vector<std::byte> out(area.size);
  if (!out.empty()) {  // an empty vector's data() may be null, which memcpy may not take
    std::memcpy(out.data(), area.data, out.size());
  }
  arrive(std::nullopt, what, call);
  return out;
}

void Context::throw_too_large(std::uint64_t size, const char* what) {
  throw Error("lockstep: " + std::string(what) + ": the main process gave " + std::to_string(size) +
              " bytes; a broadcast carries at most " + std::to_string(kMaxBroadcast) +
              " (write larger data to a file and broadcast its name)");
}

std::size_t Context::gather_most(int processes) {
  return region_size(processes) - kEntryHead;
}

std::vector<std::vector<std::byte>> Context::gather(std::span<const std::byte> data,
                                                    const char* what, const CallSite& site) {
  check_usable(what);
  if (!barrier_) {  // a job of one
    std::vector<std::byte> entry(kEntryHead + std::min(data.size(), gather_most(1)));
    put_entry(entry.data(), config_.rank, data, gather_most(1));
    return gathered(gather_outcome({entry}, false), 1, what);
  }
  BusyGuard busy(busy_, what);
  if (left_.load(std::memory_order_seq_cst)) {
    throw_left(what);
  }
  InterruptsHeldOff no_interrupts;
  settle_streams(std::nullopt, what);
  const std::uint32_t call = barrier_->recorder().word(CallKind::gather, site);
  // Each process writes its entry into its own region of the broadcast area, then meets the
  // others; across machines each leader sends its node's entries to node 0's, which sends back
  // the job's (or why the gather failed), and the leaders write that into the area before a
  // second episode. A last episode frees the area; every process throws the same failure.
  BroadcastArea& area = segment_->broadcast_area();
  auto* const base = reinterpret_cast<std::byte*>(area.data);
  const int slots = segment_->num_slots();
  const std::size_t region = region_size(slots);
  put_entry(base + static_cast<std::size_t>(local_index_) * region, config_.rank, data,
            gather_most(slots));
  arrive(std::nullopt, what, call);
  const auto node_entries = [&] {
    std::vector<std::byte> entries;
    for (int slot = 0; slot < slots; ++slot) {
      const std::span<const std::byte> at(base + static_cast<std::size_t>(slot) * region, region);
      const std::optional<Entry> entry = read_entry(at);
      const std::size_t length = entry ? entry->length : kEntryHead;  // a torn one: garbled
      entries.insert(entries.end(), at.begin(), at.begin() + static_cast<std::ptrdiff_t>(length));
    }
    return entries;
  };
  std::vector<std::byte> outcome;
  if (config_.num_nodes == 1) {
    const std::vector<std::byte> entries = node_entries();
    outcome = gather_outcome({entries}, false);
  } else {
    if (backend_) {
      const std::vector<std::vector<std::byte>> parts =
          backend_->gather(node_entries(), std::nullopt, what);
      if (config_.node_index == 0) {
        const std::vector<std::byte> job = gather_outcome({parts.begin(), parts.end()}, true);
        area.status = 0;
        area.size = job.size();
        std::memcpy(area.data, job.data(), job.size());
        (void)backend_->share(encode_broadcast(area), true, std::nullopt, what);
      } else {
        decode_broadcast(backend_->share({}, false, std::nullopt, what), area, what);
      }
    }
    arrive(std::nullopt, what, call);  // the leader has written the job's entries
    outcome.assign(base, base + area.size);
  }
  arrive(std::nullopt, what, call);  // every process has read the area: it is free again
  return gathered(outcome, config_.world_size, what);
}

bool Context::check_trigger(const char* what, const CallSite& site) {
  // Taken (cleared) before the gather: a mark set meanwhile counts at the next check. When no
  // process had one, this process had none to lose; when one had, every mark is cleared anyway.
  const bool mine = trigger_.exchange(false, std::memory_order_relaxed);
  const std::byte mark{static_cast<unsigned char>(mine ? 1 : 0)};
  const auto marks = gather(std::span(&mark, 1), what, site);
  return std::any_of(marks.begin(), marks.end(), [](const std::vector<std::byte>& one) {
    return !one.empty() && one[0] != std::byte{0};
  });
}

}  // namespace lockstep::detail
