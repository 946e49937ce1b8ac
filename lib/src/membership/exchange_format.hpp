// The exchanges' bytes (internal): a gather's entry in its process's region of the node
// segment's area, the records a node's part and the job's outcome carry between machines, and a
// broadcast as it travels between machines. Written and read with base's byte kit; what comes
// from another machine is read by read_records and read_broadcast, which fuzz/fuzz_exchange.cpp
// runs on any bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "membership/exchange_regions.hpp"  // kEntryHead, kInMemory, kWindowed

namespace lockstep::detail {

// How an area, an entry or a record holds its bytes.
enum class Held : std::uint32_t {
  inline_bytes = 0,    // right after its head
  spilled = 1,         // in a spill (its writer's slot's, or the node's)
  failed = 2,          // nothing: the bytes after its head are why (a one-line message)
  main_elsewhere = 3,  // a broadcast across machines whose main process does not lead node 0
  in_memory = 4,       // a gather's entry on one machine: in its writer's memory (kInMemory)
  windowed = 5,        // a gather's entry on one machine: in one of its writer's windows
};

// An entry's or a record's head: the process's rank (4 bytes), how it is held (4), its size (8).
struct EntryHead {
  int rank = -1;
  Held held = Held::inline_bytes;
  std::uint64_t size = 0;
};
std::array<std::byte, kEntryHead> encode_head(const EntryHead& head);
EntryHead decode_head(std::span<const std::byte, kEntryHead> bytes);

// What follows an in_memory entry's head: its writer's pid (4 bytes), 4 unused, its pid
// namespace (8) and the bytes' address (8).
struct InMemory {
  std::uint32_t pid = 0;
  std::uint64_t pid_namespace = 0;
  std::uint64_t address = 0;
};
inline constexpr std::size_t kInMemoryTail = kInMemory - kEntryHead;
std::array<std::byte, kInMemoryTail> encode_in_memory(const InMemory& where);
InMemory decode_in_memory(std::span<const std::byte, kInMemoryTail> bytes);

// What follows a windowed entry's head: which of its writer's windows (4 bytes, below
// kWindows), 4 unused, and that window's capacity (8), which readers map.
struct Windowed {
  std::uint32_t window = 0;
  std::uint64_t capacity = 0;
};
inline constexpr std::size_t kWindowedTail = kWindowed - kEntryHead;
std::array<std::byte, kWindowedTail> encode_windowed(const Windowed& where);
Windowed decode_windowed(std::span<const std::byte, kWindowedTail> bytes);

// A record: a head (held: inline_bytes or failed) and its bytes (the data, or why it failed).
struct Record {
  int rank = -1;
  Held held = Held::inline_bytes;
  std::span<const std::byte> bytes;
};
void append_record(std::vector<std::byte>& out, int rank, Held held,
                   std::span<const std::byte> bytes);
// The records that `bytes` are a run of; nullopt when they are not (a torn or foreign part).
std::optional<std::vector<Record>> read_records(std::span<const std::byte> bytes);

// A leader's outcome of a gather across machines (every leader makes the same of the same parts):
// the nodes' parts, each a run of records, one after the other; a part that is not is the failure
// of the job's every process. Empties `parts` as it goes (one copy of the job's bytes at a time).
std::vector<std::byte> join_parts(std::vector<std::vector<std::byte>>& parts, int world_size);

// A broadcast between machines: how it is held (4 bytes: inline_bytes, failed or
// main_elsewhere), its size (8), then that many bytes (the data, or the message).
inline constexpr std::size_t kBroadcastHead = 12;
struct Broadcast {
  Held held = Held::inline_bytes;
  std::span<const std::byte> bytes;
};
std::vector<std::byte> encode_broadcast(Held held, std::span<const std::byte> bytes);
// nullopt when `sent` is not one (not lockstep's).
std::optional<Broadcast> read_broadcast(std::span<const std::byte> sent);

}  // namespace lockstep::detail
