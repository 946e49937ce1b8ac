#include "ucx/wire.hpp"

#include <array>
#include <cstring>

namespace lockstep::detail::wire {
namespace {

// The format's compound fields, on base's writer and reader.
void put_ranks(ByteWriter& w, const std::vector<std::int32_t>& values) {
  w.u32(static_cast<std::uint32_t>(values.size()));
  for (auto v : values) {
    w.i32(v);
  }
}

void put_process(ByteWriter& w, const ProcessMark& mark) {
  w.u64(mark.boot[0]);
  w.u64(mark.boot[1]);
  w.u64(mark.pid_namespace);
  w.u32(mark.pid);
  w.u64(mark.start_time);
}

std::vector<std::int32_t> read_ranks(ByteReader& r, const char* what) {
  std::vector<std::int32_t> out(r.count(kMaxRanks, 4, what));
  for (auto& v : out) {
    v = r.i32();
  }
  return out;
}

std::vector<std::byte> read_bytes(ByteReader& r, std::size_t limit, const char* what) {
  const auto bytes = r.sized(limit, what);
  return {bytes.begin(), bytes.end()};
}

ProcessMark read_process(ByteReader& r) {
  ProcessMark mark;
  mark.boot = {r.u64(), r.u64()};
  mark.pid_namespace = r.u64();
  mark.pid = r.u32();
  mark.start_time = r.u64();
  return mark;
}

// A node as a hello and each of a welcome's entries end: its index, ranks, address and process
// mark (Hello and Welcome's entries name them alike).
template <class Node>
void put_node(ByteWriter& w, const Node& node) {
  w.u32(node.node);
  put_ranks(w, node.ranks);
  w.sized(node.address);
  put_process(w, node.process);
}

template <class Node>
void read_node(ByteReader& r, Node& node) {
  node.node = r.u32();
  node.ranks = read_ranks(r, "ranks");
  node.address = read_bytes(r, kMaxAddress, "address");
  node.process = read_process(r);
}

// Each message after the magic and version: its kind, then its fields.
void put(ByteWriter& w, const Hello& m) {
  w.u16(static_cast<std::uint16_t>(Kind::hello));
  w.text(m.identity);
  w.u32(m.num_nodes);
  w.u32(m.world_size);
  put_node(w, m);
}

void put(ByteWriter& w, const Welcome& m) {
  w.u16(static_cast<std::uint16_t>(Kind::welcome));
  w.u64(m.token);
  w.u32(static_cast<std::uint32_t>(m.nodes.size()));
  for (const auto& node : m.nodes) {
    put_node(w, node);
  }
}

void put(ByteWriter& w, const Refuse& m) {
  w.u16(static_cast<std::uint16_t>(Kind::refuse));
  w.text(m.reason);
}

void put(ByteWriter& w, const Arrive& m) {
  w.u16(static_cast<std::uint16_t>(Kind::arrive));
  w.u64(m.token);
  w.u32(m.from);
  w.u64(m.episode);
  w.u32(m.round);
  w.u32(static_cast<std::uint32_t>(m.known.size()));
  for (auto word : m.known) {
    w.u64(word);
  }
}

void put(ByteWriter& w, const Abort& m) {
  w.u16(static_cast<std::uint16_t>(Kind::abort));
  w.u64(m.token);
  w.u32(m.from);
  w.u32(m.kind);
  w.i32(m.rank);
  put_ranks(w, m.missing);
  w.text(m.message);
}

void put(ByteWriter& w, const Blob& m) {
  w.u16(static_cast<std::uint16_t>(Kind::blob));
  w.u64(m.token);
  w.u32(m.from);
  w.u64(m.sequence);
  w.sized(m.data);
}

void put(ByteWriter& w, const Chunk& m) {
  w.u16(static_cast<std::uint16_t>(Kind::chunk));
  w.u64(m.token);
  w.u32(m.from);
  w.u64(m.sequence);
  w.u64(m.total);
  w.u64(m.offset);
  w.u64(m.length);
}

Hello read_hello(ByteReader& r) {
  Hello m;
  m.identity = r.text(kMaxText, "identity");
  m.num_nodes = r.u32();
  m.world_size = r.u32();
  read_node(r, m);
  return m;
}

Welcome read_welcome(ByteReader& r) {
  Welcome m;
  m.token = r.u64();
  // Each at least 3 words and a process mark.
  std::size_t n = r.count(kMaxNodes, 12 + kProcessMarkBytes, "nodes");
  m.nodes.resize(n);
  for (auto& node : m.nodes) {
    read_node(r, node);
  }
  return m;
}

Arrive read_arrive(ByteReader& r) {
  Arrive m;
  m.token = r.u64();
  m.from = r.u32();
  m.episode = r.u64();
  m.round = r.u32();
  m.known.resize(r.count(kMaxNodes / 64, 8, "known"));
  for (auto& word : m.known) {
    word = r.u64();
  }
  return m;
}

Abort read_abort(ByteReader& r) {
  Abort m;
  m.token = r.u64();
  m.from = r.u32();
  m.kind = r.u32();
  m.rank = r.i32();
  m.missing = read_ranks(r, "missing");
  m.message = r.text(kMaxText, "message");
  return m;
}

Blob read_blob(ByteReader& r) {
  Blob m;
  m.token = r.u64();
  m.from = r.u32();
  m.sequence = r.u64();
  m.data = read_bytes(r, kMaxBlob, "blob");
  return m;
}

Chunk read_chunk(ByteReader& r) {
  Chunk m;
  m.token = r.u64();
  m.from = r.u32();
  m.sequence = r.u64();
  m.total = r.u64();
  m.offset = r.u64();
  m.length = r.u64();
  return m;
}

// The message after the magic and version: its kind decides what follows.
Message read_message(ByteReader& r) {
  switch (static_cast<Kind>(r.u16())) {
    case Kind::hello:
      return read_hello(r);
    case Kind::welcome:
      return read_welcome(r);
    case Kind::refuse:
      return Refuse{r.text(kMaxText, "reason")};
    case Kind::arrive:
      return read_arrive(r);
    case Kind::abort:
      return read_abort(r);
    case Kind::blob:
      return read_blob(r);
    case Kind::chunk:
      return read_chunk(r);
  }
  throw WireError("unknown message kind");
}

}  // namespace

std::vector<std::byte> encode(const Message& message) {
  ByteWriter w;
  w.u32(kMagic);
  w.u16(kVersion);
  std::visit([&](const auto& m) { put(w, m); }, message);
  return w.take();
}

Message decode(std::span<const std::byte> bytes) {
  ByteReader r(bytes);
  if (r.u32() != kMagic) {
    throw WireError("not a lockstep message (bad magic)");
  }
  if (auto version = r.u16(); version != kVersion) {
    throw WireError("protocol version " + std::to_string(version) + ", this lockstep speaks " +
                    std::to_string(kVersion));
  }
  Message out = read_message(r);
  r.finish();
  return out;
}

}  // namespace lockstep::detail::wire
