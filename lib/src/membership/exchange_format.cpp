#include "membership/exchange_format.hpp"

#include <algorithm>
#include <string>

#include "base/bytes.hpp"

namespace lockstep::detail {
namespace {

template <std::size_t N>
std::array<std::byte, N> fixed(ByteWriter& w) {
  const auto bytes = w.take();
  std::array<std::byte, N> out{};
  std::copy_n(bytes.begin(), N, out.begin());
  return out;
}

void write_head(ByteWriter& w, const EntryHead& head) {
  w.i32(head.rank);
  w.u32(static_cast<std::uint32_t>(head.held));
  w.u64(head.size);
}

EntryHead read_head(ByteReader& r) {
  EntryHead head;
  head.rank = r.i32();
  head.held = static_cast<Held>(r.u32());
  head.size = r.u64();
  return head;
}

}  // namespace

std::array<std::byte, kEntryHead> encode_head(const EntryHead& head) {
  ByteWriter w;
  write_head(w, head);
  return fixed<kEntryHead>(w);
}

EntryHead decode_head(std::span<const std::byte, kEntryHead> bytes) {
  ByteReader r(bytes);
  return read_head(r);
}

std::array<std::byte, kInMemoryTail> encode_in_memory(const InMemory& where) {
  ByteWriter w;
  w.u32(where.pid);
  w.u32(0);
  w.u64(where.pid_namespace);
  w.u64(where.address);
  return fixed<kInMemoryTail>(w);
}

std::array<std::byte, kWindowedTail> encode_windowed(const Windowed& where) {
  ByteWriter w;
  w.u32(where.window);
  w.u32(0);
  w.u64(where.capacity);
  return fixed<kWindowedTail>(w);
}

Windowed decode_windowed(std::span<const std::byte, kWindowedTail> bytes) {
  ByteReader r(bytes);
  Windowed where;
  where.window = r.u32();
  (void)r.u32();
  where.capacity = r.u64();
  return where;
}

InMemory decode_in_memory(std::span<const std::byte, kInMemoryTail> bytes) {
  ByteReader r(bytes);
  InMemory where;
  where.pid = r.u32();
  (void)r.u32();
  where.pid_namespace = r.u64();
  where.address = r.u64();
  return where;
}

void append_record(std::vector<std::byte>& out, int rank, Held held,
                   std::span<const std::byte> bytes) {
  ByteWriter w(std::move(out));
  write_head(w, EntryHead{rank, held, bytes.size()});
  w.raw(bytes);
  out = w.take();
}

std::optional<std::vector<Record>> read_records(std::span<const std::byte> bytes) {
  std::vector<Record> records;
  ByteReader r(bytes);
  try {
    while (r.left() != 0) {
      const EntryHead head = read_head(r);
      if (head.held != Held::inline_bytes && head.held != Held::failed) {
        return std::nullopt;
      }
      records.push_back(Record{head.rank, head.held, r.raw(head.size, "a record")});
    }
  } catch (const BytesError&) {
    return std::nullopt;
  }
  return records;
}

std::vector<std::byte> encode_broadcast(Held held, std::span<const std::byte> bytes) {
  ByteWriter w;
  w.u32(static_cast<std::uint32_t>(held));
  w.u64(bytes.size());
  w.raw(bytes);
  return w.take();
}

std::optional<Broadcast> read_broadcast(std::span<const std::byte> sent) {
  ByteReader r(sent);
  try {
    const auto held = static_cast<Held>(r.u32());
    const std::uint64_t size = r.u64();
    if ((held != Held::inline_bytes && held != Held::failed && held != Held::main_elsewhere) ||
        size != r.left()) {
      return std::nullopt;
    }
    return Broadcast{held, r.raw(size, "a broadcast")};
  } catch (const BytesError&) {
    return std::nullopt;
  }
}

// A leader's outcome of a gather across machines (every leader makes the same of the same parts):
// the nodes' parts, each a run of records, one after the other; a part that is not is the failure
// of the job's every process.
std::vector<std::byte> join_parts(std::vector<std::vector<std::byte>>& parts, int world_size) {
  std::vector<std::byte> job;
  for (std::size_t node = 0; node < parts.size(); ++node) {
    if (!read_records(parts[node])) {
      job.clear();
      const std::string why = "node " + std::to_string(node) + "'s part of the gather (" +
                              std::to_string(parts[node].size()) + " bytes) is not lockstep's";
      for (int rank = 0; rank < world_size; ++rank) {
        append_record(job, rank, Held::failed, std::as_bytes(std::span(why.data(), why.size())));
      }
      return job;
    }
    job.insert(job.end(), parts[node].begin(), parts[node].end());
    std::vector<std::byte>().swap(parts[node]);  // one copy of the job's bytes at a time
  }
  return job;
}

}  // namespace lockstep::detail
