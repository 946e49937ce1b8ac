#include "ucx/wire.hpp"

#include <array>
#include <cstring>

#include "base/little_endian.hpp"

namespace lockstep::detail::wire {
namespace {

class Writer {
 public:
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void i32(std::int32_t v) { put(static_cast<std::uint32_t>(v), 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void bytes(std::span<const std::byte> data) {
    u32(static_cast<std::uint32_t>(data.size()));
    out_.insert(out_.end(), data.begin(), data.end());
  }
  void text(const std::string& s) { bytes(std::as_bytes(std::span(s.data(), s.size()))); }
  void ranks(const std::vector<std::int32_t>& values) {
    u32(static_cast<std::uint32_t>(values.size()));
    for (auto v : values) {
      i32(v);
    }
  }
  void process(const ProcessMark& mark) {
    u64(mark.boot[0]);
    u64(mark.boot[1]);
    u64(mark.pid_namespace);
    u32(mark.pid);
    u64(mark.start_time);
  }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  void put(std::uint64_t v, std::size_t size) {
    std::array<std::byte, 8> bytes{};
    put_le(bytes.data(), v, size);
    out_.insert(out_.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size));
  }
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  std::uint16_t u16() { return static_cast<std::uint16_t>(get(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(get(4)); }
  std::int32_t i32() { return static_cast<std::int32_t>(u32()); }
  std::uint64_t u64() { return get(8); }
  // A count of items of `item_size` bytes each, checked against `limit` and the bytes left.
  std::size_t count(std::size_t limit, std::size_t item_size, const char* what) {
    std::size_t n = u32();
    if (n > limit) {
      throw WireError(std::string(what) + ": " + std::to_string(n) + " is over the limit of " +
                      std::to_string(limit));
    }
    if (n * item_size > in_.size() - at_) {
      throw WireError(std::string(what) + ": " + std::to_string(n) + " items do not fit in the " +
                      std::to_string(in_.size() - at_) + " bytes left");
    }
    return n;
  }
  std::vector<std::byte> bytes(std::size_t limit, const char* what) {
    std::size_t n = count(limit, 1, what);
    std::vector<std::byte> out(in_.begin() + static_cast<std::ptrdiff_t>(at_),
                               in_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += n;
    return out;
  }
  std::string text(const char* what) {
    auto raw = bytes(kMaxText, what);
    return {reinterpret_cast<const char*>(raw.data()), raw.size()};
  }
  std::vector<std::int32_t> ranks(const char* what) {
    std::size_t n = count(kMaxRanks, 4, what);
    std::vector<std::int32_t> out(n);
    for (auto& v : out) {
      v = i32();
    }
    return out;
  }
  ProcessMark process() {
    ProcessMark mark;
    mark.boot = {u64(), u64()};
    mark.pid_namespace = u64();
    mark.pid = u32();
    mark.start_time = u64();
    return mark;
  }
  void finish() const {
    if (at_ != in_.size()) {
      throw WireError(std::to_string(in_.size() - at_) + " bytes after the end of the message");
    }
  }

 private:
  std::uint64_t get(std::size_t size) {
    if (in_.size() - at_ < size) {
      throw WireError("truncated message (" + std::to_string(in_.size()) + " bytes)");
    }
    const std::uint64_t v = get_le(in_.data() + at_, size);
    at_ += size;
    return v;
  }
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
};

Blob read_blob(Reader& r) {
  Blob m;
  m.token = r.u64();
  m.from = r.u32();
  m.sequence = r.u64();
  m.data = r.bytes(kMaxBlob, "blob");
  return m;
}

Chunk read_chunk(Reader& r) {
  Chunk m;
  m.token = r.u64();
  m.from = r.u32();
  m.sequence = r.u64();
  m.total = r.u64();
  m.offset = r.u64();
  m.length = r.u64();
  return m;
}

template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;

}  // namespace

std::vector<std::byte> encode(const Message& message) {
  Writer w;
  w.u32(kMagic);
  w.u16(kVersion);
  std::visit(Overload{
                 [&](const Hello& m) {
                   w.u16(static_cast<std::uint16_t>(Kind::hello));
                   w.text(m.identity);
                   w.u32(m.num_nodes);
                   w.u32(m.world_size);
                   w.u32(m.node);
                   w.ranks(m.ranks);
                   w.bytes(m.address);
                   w.process(m.process);
                 },
                 [&](const Welcome& m) {
                   w.u16(static_cast<std::uint16_t>(Kind::welcome));
                   w.u64(m.token);
                   w.u32(static_cast<std::uint32_t>(m.nodes.size()));
                   for (const auto& node : m.nodes) {
                     w.u32(node.node);
                     w.ranks(node.ranks);
                     w.bytes(node.address);
                     w.process(node.process);
                   }
                 },
                 [&](const Refuse& m) {
                   w.u16(static_cast<std::uint16_t>(Kind::refuse));
                   w.text(m.reason);
                 },
                 [&](const Arrive& m) {
                   w.u16(static_cast<std::uint16_t>(Kind::arrive));
                   w.u64(m.token);
                   w.u32(m.from);
                   w.u64(m.episode);
                   w.u32(m.round);
                   w.u32(static_cast<std::uint32_t>(m.known.size()));
                   for (auto word : m.known) {
                     w.u64(word);
                   }
                 },
                 [&](const Abort& m) {
                   w.u16(static_cast<std::uint16_t>(Kind::abort));
                   w.u64(m.token);
                   w.u32(m.from);
                   w.u32(m.kind);
                   w.i32(m.rank);
                   w.ranks(m.missing);
                   w.text(m.message);
                 },
                 [&](const Blob& m) {
                   w.u16(static_cast<std::uint16_t>(Kind::blob));
                   w.u64(m.token);
                   w.u32(m.from);
                   w.u64(m.sequence);
                   w.bytes(m.data);
                 },
                 [&](const Chunk& m) {
                   w.u16(static_cast<std::uint16_t>(Kind::chunk));
                   w.u64(m.token);
                   w.u32(m.from);
                   w.u64(m.sequence);
                   w.u64(m.total);
                   w.u64(m.offset);
                   w.u64(m.length);
                 },
             },
             message);
  return w.take();
}

Message decode(std::span<const std::byte> bytes) {
  Reader r(bytes);
  if (r.u32() != kMagic) {
    throw WireError("not a lockstep message (bad magic)");
  }
  if (auto version = r.u16(); version != kVersion) {
    throw WireError("protocol version " + std::to_string(version) + ", this lockstep speaks " +
                    std::to_string(kVersion));
  }
  Message out;
  switch (static_cast<Kind>(r.u16())) {
    case Kind::hello: {
      Hello m;
      m.identity = r.text("identity");
      m.num_nodes = r.u32();
      m.world_size = r.u32();
      m.node = r.u32();
      m.ranks = r.ranks("ranks");
      m.address = r.bytes(kMaxAddress, "address");
      m.process = r.process();
      out = std::move(m);
      break;
    }
    case Kind::welcome: {
      Welcome m;
      m.token = r.u64();
      // Each at least 3 words and a process mark.
      std::size_t n = r.count(kMaxNodes, 12 + kProcessMarkBytes, "nodes");
      m.nodes.resize(n);
      for (auto& node : m.nodes) {
        node.node = r.u32();
        node.ranks = r.ranks("ranks");
        node.address = r.bytes(kMaxAddress, "address");
        node.process = r.process();
      }
      out = std::move(m);
      break;
    }
    case Kind::refuse:
      out = Refuse{r.text("reason")};
      break;
    case Kind::arrive: {
      Arrive m;
      m.token = r.u64();
      m.from = r.u32();
      m.episode = r.u64();
      m.round = r.u32();
      m.known.resize(r.count(kMaxNodes / 64, 8, "known"));
      for (auto& word : m.known) {
        word = r.u64();
      }
      out = std::move(m);
      break;
    }
    case Kind::abort: {
      Abort m;
      m.token = r.u64();
      m.from = r.u32();
      m.kind = r.u32();
      m.rank = r.i32();
      m.missing = r.ranks("missing");
      m.message = r.text("message");
      out = std::move(m);
      break;
    }
    case Kind::blob:
      out = read_blob(r);
      break;
    case Kind::chunk:
      out = read_chunk(r);
      break;
    default:
      throw WireError("unknown message kind");
  }
  r.finish();
  return out;
}

}  // namespace lockstep::detail::wire
