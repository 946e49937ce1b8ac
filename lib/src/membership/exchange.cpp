// Context's exchanges (internal): State::broadcast (the main process's bytes to every process)
// and State::gather_object (every process's bytes to every process), of any size: through the
// node segment's broadcast area where they fit, through spills (engine/spill.hpp) where they do
// not, and across machines through the leaders' backend (Leaders::share, Leaders::allgather).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "base/fault_points.hpp"
#include "base/proc.hpp"  // pid_namespace, read_other_memory
#include "engine/call_log.hpp"
#include "engine/spill.hpp"
#include "lockstep/error.hpp"
#include "membership/busy_guard.hpp"
#include "membership/context.hpp"
#include "membership/exchange_format.hpp"
#include "membership/exchange_regions.hpp"

namespace lockstep::detail {
namespace {

std::span<const std::byte> as_bytes(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

// The failure of process `rank`, which could not give its bytes for the reason in `why`.
Error could_not_give(const char* what, int rank, std::span<const std::byte> why) {
  return Error{"lockstep: " + std::string(what) + ": process " + std::to_string(rank) +
               " could not give its bytes: " +
               std::string(reinterpret_cast<const char*>(why.data()), why.size())};
}

// Every process's bytes, by rank, from the job's records, to `sink`; throws a process's failure
// (the first by rank), or Error when the records are not every rank's once.
void deliver_records(std::span<const std::byte> records, int world_size,
                     const Context::GatherSink& sink, const char* what) {
  const auto garbled = [&] {
    return Error("lockstep: " + std::string(what) + ": the gathered bytes are not lockstep's (" +
                 std::to_string(records.size()) + " bytes)");
  };
  const std::optional<std::vector<Record>> all = read_records(records);
  if (!all) {
    throw garbled();
  }
  std::vector<const Record*> of(static_cast<std::size_t>(world_size), nullptr);
  for (const Record& record : *all) {
    if (record.rank < 0 || record.rank >= world_size ||
        of[static_cast<std::size_t>(record.rank)] != nullptr) {
      throw garbled();
    }
    of[static_cast<std::size_t>(record.rank)] = &record;
  }
  std::vector<std::uint64_t> sizes;
  for (const Record* record : of) {
    if (record == nullptr) {
      throw garbled();
    }
    if (record->held == Held::failed) {
      throw could_not_give(what, record->rank, record->bytes);
    }
    sizes.push_back(record->bytes.size());
  }
  sink.sized(sizes);
  for (const Record* record : of) {
    sink.put(record->rank, record->bytes);
  }
}

// What `exchange` returns: the leader's exchange with the other machines, recorded in its log as
// a call of the exchange's (`call`, no episode), so that lockstep-run --status and the other
// machines' messages say it waits in the gather or broadcast, not that it runs its own code.
template <class Exchange>
auto across_machines(CallRecorder& log, std::uint32_t call, Exchange exchange) {
  log.begin(call, kNoEpisode);
  try {
    auto out = exchange();
    log.end(true);
    return out;
  } catch (...) {
    log.end_as(CallEnd::failed);
    throw;
  }
}

// The node's copy of what every process of the node reads (a broadcast, the job's records of a
// gather across machines): in the area where it fits, else in the node's spill, else (the spill
// refused) the reason, which every process of the node throws. The spill is kept until `spill`
// goes, after the node's processes have read it.
void hold_node_copy(NodeSegment& segment, std::span<const std::byte> bytes, Held held,
                    std::optional<Spill>& spill, const char* what) {
  BroadcastArea& area = segment.broadcast_area();
  std::span<const std::byte> inline_bytes = bytes;
  std::string why;
  if (held == Held::inline_bytes && bytes.size() > kMaxBroadcast) {
    try {
      spill.emplace(spill_name(segment.name(), kNodeSpill), bytes, what);
      area.status = static_cast<std::uint32_t>(Held::spilled);
      area.size = bytes.size();
      return;
    } catch (const std::exception& error) {
      why = error.what();
      held = Held::failed;
      inline_bytes = as_bytes(why);
    }
  }
  inline_bytes = inline_bytes.first(std::min(inline_bytes.size(), kMaxBroadcast));
  area.status = static_cast<std::uint32_t>(held);
  area.size = inline_bytes.size();
  if (!inline_bytes.empty()) {  // an empty span's data() may be null, which memcpy may not take
    std::memcpy(area.data, inline_bytes.data(), inline_bytes.size());
  }
}

// What hold_node_copy held, given to `put` (valid during the call only), as every process of the
// node reads it after the episode that follows it; throws what it held instead (a failure, a
// main process elsewhere).
void with_node_copy(const NodeSegment& segment, FunctionRef<void(std::span<const std::byte>)> put,
                    const char* what) {
  const BroadcastArea& area = segment.broadcast_area();
  const auto* data = reinterpret_cast<const std::byte*>(area.data);
  const std::size_t inline_size = std::min<std::uint64_t>(area.size, kMaxBroadcast);
  switch (static_cast<Held>(area.status)) {
    case Held::inline_bytes:
      put(std::span(data, inline_size));
      return;
    case Held::spilled: {
      const SpillView view(spill_name(segment.name(), kNodeSpill), area.size, what);
      put(view.bytes());
      return;
    }
    case Held::main_elsewhere:
      throw ConfigError("lockstep: " + std::string(what) +
                        ": the main process (process 0) must lead machine 0 (be its local process "
                        "0) for a broadcast across machines; this job places it elsewhere");
    case Held::in_memory:  // a gather's entries, never the node's copy
    case Held::windowed:
      throw Error("lockstep: " + std::string(what) + ": the node's copy is not lockstep's");
    case Held::failed:
      break;
  }
  throw Error("lockstep: " + std::string(what) + ": " +
              std::string(reinterpret_cast<const char*>(data), inline_size));
}

// Region `local` is the process's of that local index, and so is its spill's name. Bytes that
// do not fit the region stay in this process's memory where `in_memory` allows it, else go to
// its spill; with `windows` (a reader in place's, for its large bytes: spilled_in_place) to its
// next window where they fit, else its spill, and where /dev/shm refuses them, to its memory
// where `in_memory` allows it.
void put_entry(NodeSegment& segment, int local, int rank, std::span<const std::byte> data,
               bool in_memory, std::optional<Spill>& spill, const char* what,
               Windows* windows = nullptr) {
  BroadcastArea& area = segment.broadcast_area();
  const std::size_t region = region_size(segment.num_slots());
  std::byte* const at =
      reinterpret_cast<std::byte*>(area.data) + static_cast<std::size_t>(local) * region;
  const auto put_head = [at, rank](Held held, std::uint64_t size) {
    const auto head = encode_head(EntryHead{rank, held, size});
    std::copy(head.begin(), head.end(), at);
  };
  if (kEntryHead + data.size() <= region) {
    put_head(Held::inline_bytes, data.size());
    std::copy(data.begin(), data.end(), at + kEntryHead);
    return;
  }
  const auto hold_in_memory = [&] {
    put_head(Held::in_memory, data.size());
    const auto where =
        encode_in_memory(InMemory{static_cast<std::uint32_t>(::getpid()), pid_namespace(),
                                  reinterpret_cast<std::uintptr_t>(data.data())});
    std::copy(where.begin(), where.end(), at + kEntryHead);
  };
  in_memory = in_memory && kInMemory <= region;
  if (windows != nullptr && data.size() <= kWindowMost && kWindowed <= region) {
    try {
      const Windows::Placed placed = windows->put(data, what);
      put_head(Held::windowed, data.size());
      const auto where =
          encode_windowed(Windowed{static_cast<std::uint32_t>(placed.window), placed.capacity});
      std::copy(where.begin(), where.end(), at + kEntryHead);
      return;
    } catch (const std::exception&) {
      // /dev/shm refused the window: a spill, else this process's memory, as for larger bytes.
    }
  }
  if (in_memory && windows == nullptr) {
    hold_in_memory();
    return;
  }
  try {
    spill.emplace(spill_name(segment.name(), local), data, what);
    put_head(Held::spilled, data.size());
  } catch (const std::exception& error) {
    if (in_memory) {
      hold_in_memory();
      return;
    }
    const std::string why = error.what();
    const std::size_t n = std::min(why.size(), region - kEntryHead);
    put_head(Held::failed, n);
    std::memcpy(at + kEntryHead, why.data(), n);
  }
}

// Entry `local` of the node's regions, as its writer put it (inline bytes: what the region holds
// of them).
struct Entry {
  int rank;
  Held held;
  std::uint64_t size;
  std::span<const std::byte> bytes;  // inline ones (and failures' reasons)
  const std::byte* at;               // the entry's head
  int local;                         // its region's (and its spill's) local index
};
Entry entry_at(const NodeSegment& segment, int local) {
  const std::size_t region = region_size(segment.num_slots());
  const auto* at = reinterpret_cast<const std::byte*>(segment.broadcast_area().data) +
                   static_cast<std::size_t>(local) * region;
  const EntryHead head = decode_head(std::span<const std::byte, kEntryHead>(at, kEntryHead));
  Entry entry{head.rank, head.held, head.size, {}, at, local};
  const bool elsewhere =
      entry.held == Held::spilled || entry.held == Held::in_memory || entry.held == Held::windowed;
  entry.bytes = std::span(at + kEntryHead,
                          elsewhere ? 0 : std::min<std::uint64_t>(entry.size, region - kEntryHead));
  return entry;
}

// The node's entries of a gather, as records (spilled ones read from their spills).
std::vector<std::byte> node_records(const NodeSegment& segment, const char* what) {
  std::vector<std::byte> records;
  for (int local = 0; local < segment.num_slots(); ++local) {
    const Entry entry = entry_at(segment, local);
    if (entry.held == Held::in_memory || entry.held == Held::windowed) {  // one machine's alone
      throw Error("lockstep: " + std::string(what) + ": the node's entries are not lockstep's");
    }
    if (entry.held == Held::spilled) {
      append_record(records, entry.rank, Held::inline_bytes,
                    read_spill(spill_name(segment.name(), local), entry.size, what));
    } else {
      append_record(records, entry.rank,
                    entry.held == Held::failed ? Held::failed : Held::inline_bytes, entry.bytes);
    }
  }
  return records;
}

// The node's entries of a gather on one machine, by rank; Error unless they are every rank's once.
// Throws the failure of the first process (by rank) whose entry is its failure.
std::vector<Entry> entries_by_rank(const NodeSegment& segment, const char* what) {
  const int processes = segment.num_slots();
  std::vector<std::optional<Entry>> of(static_cast<std::size_t>(processes));
  for (int local = 0; local < processes; ++local) {
    const Entry entry = entry_at(segment, local);
    if (entry.rank < 0 || entry.rank >= processes || of[static_cast<std::size_t>(entry.rank)]) {
      throw Error("lockstep: " + std::string(what) + ": the node's entries are not lockstep's");
    }
    of[static_cast<std::size_t>(entry.rank)] = entry;
  }
  std::vector<Entry> entries;
  entries.reserve(of.size());
  for (const std::optional<Entry>& entry : of) {
    if (entry->held == Held::failed) {
      throw could_not_give(what, entry->rank, entry->bytes);
    }
    entries.push_back(*entry);
  }
  return entries;
}

// A gather on one machine: every process's bytes, by rank, to `sink`, each read once (this
// process's own from `mine`; another's in its memory straight into place); throws a process's
// failure (the first by rank), or Error when the entries are not every rank's once. Puts in
// `missing` the ranks whose bytes, in their writer's memory, this process could not read (then
// from spills); returns whether any entry was held in memory.
bool node_gather_into(const NodeSegment& segment, int me, std::span<const std::byte> mine,
                      const Context::GatherSink& sink, std::vector<int>& missing,
                      WindowViews& windows, const char* what) {
  const std::vector<Entry> entries = entries_by_rank(segment, what);
  std::vector<std::uint64_t> sizes;
  sizes.reserve(entries.size());
  for (const Entry& entry : entries) {
    sizes.push_back(entry.size);
  }
  sink.sized(sizes);
  const std::uint64_t my_namespace = pid_namespace();
  bool in_memory = false;
  for (const Entry& entry : entries) {
    const int rank = entry.rank;
    if (rank == me) {
      sink.put(rank, mine);
    } else if (entry.held == Held::in_memory) {
      in_memory = true;
      const InMemory where = decode_in_memory(
          std::span<const std::byte, kInMemoryTail>(entry.at + kEntryHead, kInMemoryTail));
      if (where.pid_namespace != my_namespace ||
          !read_other_memory(static_cast<pid_t>(where.pid), where.address, sink.place(rank),
                             entry.size)) {
        missing.push_back(rank);
      }
    } else if (entry.held == Held::spilled) {
      const SpillView view(spill_name(segment.name(), entry.local), entry.size, what);
      sink.put(rank, view.bytes());
    } else if (entry.held == Held::windowed) {
      const Windowed where = decode_windowed(
          std::span<const std::byte, kWindowedTail>(entry.at + kEntryHead, kWindowedTail));
      sink.put(rank, windows.view(segment.name(), entry.local, static_cast<int>(where.window),
                                  where.capacity, entry.size, what));
    } else {
      sink.put(rank, entry.bytes);
    }
  }
  return in_memory;
}

// The ranks in `missing` (node_gather_into's), now that their writers have spilled them; throws
// on every process when a writer could not (its entry rewritten as its failure).
void gather_missing(const NodeSegment& segment, const std::vector<int>& missing,
                    const Context::GatherSink& sink, const char* what) {
  const std::vector<Entry> entries = entries_by_rank(segment, what);
  for (const int rank : missing) {
    const Entry& entry = entries[static_cast<std::size_t>(rank)];
    if (entry.held != Held::spilled) {
      throw Error("lockstep: " + std::string(what) + ": the node's entries are not lockstep's");
    }
    const SpillView view(spill_name(segment.name(), entry.local), entry.size, what);
    sink.put(rank, view.bytes());
  }
}

// Where a gather's vectors come from: each reserved and its pages faulted in at once before it
// is filled (a copy into new memory faults a page at a time otherwise).
struct VectorSink {
  std::vector<std::vector<std::byte>> out;
  std::vector<std::uint64_t> sizes;
  void sized(const std::vector<std::uint64_t>& of) {
    sizes = of;
    out.resize(sizes.size());
    for (std::size_t rank = 0; rank < sizes.size(); ++rank) {
      out[rank].reserve(sizes[rank]);
      prefault(out[rank].data(), sizes[rank]);
    }
  }
  void put(int rank, std::span<const std::byte> bytes) {
    out[static_cast<std::size_t>(rank)].assign(bytes.begin(), bytes.end());
  }
  std::byte* place(int rank) {
    std::vector<std::byte>& one = out[static_cast<std::size_t>(rank)];
    one.resize(sizes[static_cast<std::size_t>(rank)]);  // zeroes pages faulted in by sized()
    return one.data();
  }
};

// What `gather` gives `sink`, into vectors: every rank's bytes, by rank.
template <class Gather>
std::vector<std::vector<std::byte>> into_vectors(Gather gather) {
  VectorSink vectors;
  gather(Context::GatherSink{
      [&](const std::vector<std::uint64_t>& sizes) { vectors.sized(sizes); },
      [&](int rank, std::span<const std::byte> bytes) { vectors.put(rank, bytes); },
      [&](int rank) { return vectors.place(rank); }});
  return std::move(vectors.out);
}

}  // namespace

std::vector<std::byte> Context::broadcast(std::span<const std::byte> data, const char* what,
                                          const SourceLocation& site) {
  std::vector<std::byte> out;
  broadcast_into(
      data, [&](std::span<const std::byte> bytes) { out = prefaulted_copy(bytes); }, what, site);
  return out;
}

void Context::broadcast_into(std::span<const std::byte> data,
                             FunctionRef<void(std::span<const std::byte>)> put, const char* what,
                             const SourceLocation& site) {
  check_usable(what);
  if (!barrier_) {  // a job of one
    put(data);
    return;
  }
  BusyGuard busy(occupancy_, what);
  if (left_.load(std::memory_order_seq_cst)) {
    throw_left(what);
  }
  // The node's copy is written by the main process on a machine of its own; across machines by
  // node 0's leader, which must be the main process (every launcher places it so), and every
  // other leader with what node 0's shared. Written before the first episode, read after it; the
  // second episode frees the area (and the spill) for the next exchange.
  InterruptsHeldOff no_interrupts;
  settle_streams(std::nullopt, what);
  const std::uint32_t call = barrier_->recorder().word(CallKind::broadcast, site);
  std::optional<Spill> spill;  // unlinked after the second episode, however this call ends
  if (config_.num_nodes == 1) {
    if (config_.rank == 0) {
      hold_node_copy(*segment_, data, Held::inline_bytes, spill, what);
      fault_point("exchange.written");
    }
  } else if (backend_) {
    const bool from_here = config_.node_index == 0;
    std::vector<std::byte> sent;
    if (from_here) {
      sent = config_.rank == 0 ? encode_broadcast(Held::inline_bytes, data)
                               : encode_broadcast(Held::main_elsewhere, {});
    }
    sent = across_machines(barrier_->recorder(), call,
                           [&] { return backend_->share(sent, std::nullopt, what); });
    if (const auto broadcast = read_broadcast(sent); !broadcast) {
      const std::string why =
          "node 0's broadcast is not lockstep's (" + std::to_string(sent.size()) + " bytes)";
      hold_node_copy(*segment_, as_bytes(why), Held::failed, spill, what);
    } else {
      hold_node_copy(*segment_, broadcast->bytes, broadcast->held, spill, what);
    }
  }
  arrive(std::nullopt, what, call);
  std::exception_ptr failed;
  try {
    with_node_copy(*segment_, put, what);
  } catch (...) {
    failed = std::current_exception();  // thrown once every process has read (in step)
  }
  arrive(std::nullopt, what, call);
  if (failed) {
    std::rethrow_exception(failed);
  }
}

std::vector<std::vector<std::byte>> Context::gather(std::span<const std::byte> data,
                                                    const char* what, const SourceLocation& site) {
  return into_vectors([&](const GatherSink& sink) { gather_into(data, sink, what, site); });
}

std::vector<std::vector<std::byte>> Context::gather_held(std::span<const std::byte> data,
                                                         const char* what, std::uint32_t call) {
  return into_vectors([&](const GatherSink& sink) { gather_held(data, sink, what, call); });
}

void Context::gather_into(std::span<const std::byte> data, const GatherSink& sink, const char* what,
                          const SourceLocation& site) {
  check_usable(what);
  if (!barrier_) {  // a job of one
    sink.sized({data.size()});
    sink.put(0, data);
    return;
  }
  // Refused alike by every process of the machine, before any arrives: the job goes on.
  if (!gathers_fit(segment_->num_slots())) {
    throw Error(std::string(what) + ": " + gather_refusal(segment_->num_slots()));
  }
  BusyGuard busy(occupancy_, what);
  if (left_.load(std::memory_order_seq_cst)) {
    throw_left(what);
  }
  settle_streams(std::nullopt, what);
  gather_held(data, sink, what, barrier_->recorder().word(CallKind::gather, site));
}

void Context::gather_held(std::span<const std::byte> data, const GatherSink& sink, const char* what,
                          std::uint32_t call) {
  InterruptsHeldOff no_interrupts;
  // Each process writes its entry (inline, in its memory on one machine, or its spill) and meets
  // the others. On one machine every process then reads every entry; across machines each
  // leader sends its node's records to node 0's, which shares the job's, and the leaders hold
  // them for their node before a second episode. A last episode frees the area and the spills;
  // a failure is thrown by every process after it, in step.
  std::optional<Spill> spill;  // this process's entry, when it does not fit its region
  const bool one_machine = config_.num_nodes == 1;
  Windows* windows = nullptr;  // a reader in place's, for its large bytes, on one machine
  if (one_machine && sink.in_place && spilled_in_place(data.size(), segment_->num_slots())) {
    if (!windows_) {
      windows_.emplace(segment_->name(), local_index_);
    }
    windows = &*windows_;
  }
  put_entry(*segment_, local_index_, config_.rank, data, one_machine, spill, what, windows);
  fault_point("exchange.written");
  arrive(std::nullopt, what, call);
  if (one_machine) {
    gather_here(data, spill, sink, what, call);
  } else {
    gather_across(sink, what, call);
  }
}

void Context::gather_here(std::span<const std::byte> data, std::optional<Spill>& spill,
                          const GatherSink& sink, const char* what, std::uint32_t call) {
  std::exception_ptr failed;
  std::vector<int> missing;
  bool in_memory = true;  // unknown after a failure: the slots are looked at
  try {
    in_memory = node_gather_into(*segment_, config_.rank, data, sink, missing, window_views_, what);
  } catch (...) {
    failed = std::current_exception();
  }
  // Counted by every process alike (every gather is every process's): no word to reset, which
  // the next exchange's writers, out of this one first, could race.
  const std::uint64_t number = ++gathers_;
  if (!missing.empty()) {
    // Relaxed: the next episode's arrival publishes it.
    segment_->slot(segment_->my_slot()).unread_gather.store(number, std::memory_order_relaxed);
  }
  arrive(std::nullopt, what, call);  // every process has read: the area and spills are free
  bool unread = false;
  // Where no entry was held in memory (every process read the same entries: all small, say) no
  // process can have missed one, and the slots are not looked at.
  for (int slot = 0; in_memory && slot < segment_->num_slots(); ++slot) {
    // Relaxed: written before the episode that this process has just seen complete.
    unread = unread || segment_->slot(slot).unread_gather.load(std::memory_order_relaxed) == number;
  }
  if (unread) {
    spill_in_memory(data, spill, missing, sink, what, call);
  }
  if (failed) {
    std::rethrow_exception(failed);
  }
}

void Context::gather_across(const GatherSink& sink, const char* what, std::uint32_t call) {
  std::optional<Spill> node_spill;  // a leader's copy of the job's records, when it does not fit
  std::vector<std::byte> job;
  const int world = config_.world_size;
  if (backend_) {
    std::vector<std::byte> records;
    try {
      records = node_records(*segment_, what);
    } catch (const std::exception& error) {  // the node's processes fail, not the job's
      records.clear();
      for (const int rank : segment_->ranks()) {
        append_record(records, rank, Held::failed, as_bytes(error.what()));
      }
    }
    std::vector<std::vector<std::byte>> parts = across_machines(barrier_->recorder(), call, [&] {
      return backend_->allgather(records, std::nullopt, what);
    });
    job = join_parts(parts, world);
    hold_node_copy(*segment_, job, Held::inline_bytes, node_spill, what);
  }
  arrive(std::nullopt, what, call);  // the leader holds the job's records
  std::exception_ptr failed;
  try {
    if (backend_) {
      deliver_records(job, world, sink, what);
    } else {
      with_node_copy(
          *segment_,
          [&](std::span<const std::byte> records) { deliver_records(records, world, sink, what); },
          what);
    }
  } catch (...) {
    failed = std::current_exception();
  }
  arrive(std::nullopt, what, call);  // every process has read: the area and spills are free
  if (failed) {
    std::rethrow_exception(failed);
  }
}

void Context::spill_in_memory(std::span<const std::byte> data, std::optional<Spill>& spill,
                              const std::vector<int>& missing, const GatherSink& sink,
                              const char* what, std::uint32_t call) {
  // A process could not read another's memory: each entry held there is spilled (its writer
  // rewrites its own entry, which nobody reads between these episodes), and the processes that
  // missed one read it from the spill. Two more episodes, on every process.
  const std::size_t region = region_size(segment_->num_slots());
  auto* const at = reinterpret_cast<std::byte*>(segment_->broadcast_area().data) +
                   static_cast<std::size_t>(local_index_) * region;
  if (decode_head(std::span<const std::byte, kEntryHead>(at, kEntryHead)).held == Held::in_memory) {
    put_entry(*segment_, local_index_, config_.rank, data, false, spill, what);
  }
  arrive(std::nullopt, what, call);
  std::exception_ptr failed;
  try {
    gather_missing(*segment_, missing, sink, what);
  } catch (...) {
    failed = std::current_exception();
  }
  arrive(std::nullopt, what, call);  // the spills are free
  if (failed) {
    std::rethrow_exception(failed);
  }
}

}  // namespace lockstep::detail
