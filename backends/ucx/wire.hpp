// The UCX backend's messages, and their encoding (internal).
//
// Every message is one UCX active message whose data starts with a fixed prefix (magic, protocol
// version, kind) followed by the kind's fields. Decoding checks every length against the bytes
// received and against fixed limits, so that nothing a stray or broken peer sends can make a
// leader read out of bounds, allocate without bound or take a foreign message for its own job's.
// Integers are little-endian on the wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "base/bytes.hpp"
#include "base/proc.hpp"

namespace lockstep::detail::wire {

inline constexpr std::uint32_t kMagic = 0x3153'4b4c;  // "LKS1"
inline constexpr std::uint16_t kVersion = 4;

// Limits on what a message may carry (decoding refuses more).
inline constexpr std::size_t kMaxText = 4096;         // identities, reasons, messages
inline constexpr std::size_t kMaxRanks = 1u << 20;    // processes of one node, or missing ones
inline constexpr std::size_t kMaxAddress = 1u << 16;  // a UCX worker address
inline constexpr std::size_t kMaxNodes = 1u << 16;
inline constexpr std::size_t kMaxBlob = 4096;
// A chunk of a leader's part of an exchange (its bytes are the active message's data).
inline constexpr std::size_t kChunk = std::size_t{1} << 20;
inline constexpr std::uint64_t kMaxTotal = std::uint64_t{1} << 46;  // a part's bytes, in all

enum class Kind : std::uint16_t {
  hello = 1,
  welcome = 2,
  refuse = 3,
  arrive = 4,
  abort = 5,
  blob = 6,
  chunk = 8  // (7, a gather's part in pieces, is no longer sent)
};

// A node's main process's ProcessMark (base/proc.hpp) on the wire: boot, namespace, pid, start
// time. With it a leader beside that process can tell that it died, where UCX says only that
// their connection failed.
inline constexpr std::size_t kProcessMarkBytes = 36;

// A leader asks node 0's leader to join (over the client-server connection).
struct Hello {
  std::string identity;
  std::uint32_t num_nodes = 0;
  std::uint32_t world_size = 0;
  std::uint32_t node = 0;
  std::vector<std::int32_t> ranks;
  std::vector<std::byte> address;  // the sender's UCX worker address
  ProcessMark process;             // the sender's
};

struct NodeEntry {
  std::uint32_t node = 0;
  std::vector<std::int32_t> ranks;
  std::vector<std::byte> address;
  ProcessMark process;  // the node's main process
};

// Node 0's answer once every node has joined: the job's token and every leader's address.
struct Welcome {
  std::uint64_t token = 0;
  std::vector<NodeEntry> nodes;  // by node index
};

// Node 0's answer to a hello it will not take.
struct Refuse {
  std::string reason;
};

// Dissemination barrier: `from` has reached `round` of `episode` and knows that the nodes set in
// `known` have arrived.
struct Arrive {
  std::uint64_t token = 0;
  std::uint32_t from = 0;
  std::uint64_t episode = 0;
  std::uint32_t round = 0;
  std::vector<std::uint64_t> known;  // bitmap over node indices
};

// `from` gave up on the job; the receivers fail their barriers with this.
struct Abort {
  std::uint64_t token = 0;
  std::uint32_t from = 0;
  std::uint32_t kind = 0;  // FailureKind
  std::int32_t rank = -1;
  std::vector<std::int32_t> missing;
  std::string message;
};

// Node 0's broadcast number `sequence`.
struct Blob {
  std::uint64_t token = 0;
  std::uint32_t from = 0;
  std::uint64_t sequence = 0;
  std::vector<std::byte> data;
};

// The head of one chunk of leader `from`'s part of exchange number `sequence` (Backend::exchange):
// the `length` bytes at `offset` of the part's `total`. The bytes themselves are the active
// message's data, which UCX may deliver by its rendezvous protocol into the receiver's buffer;
// the head travels as the message's header, and is checked before anything is received.
struct Chunk {
  std::uint64_t token = 0;
  std::uint32_t from = 0;
  std::uint64_t sequence = 0;
  std::uint64_t total = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

using Message = std::variant<Hello, Welcome, Refuse, Arrive, Abort, Blob, Chunk>;

// What decode() throws for a message that is truncated, too long, over a limit, of another
// protocol version or of no known kind. what() says which.
using WireError = BytesError;

std::vector<std::byte> encode(const Message& message);
Message decode(std::span<const std::byte> bytes);

}  // namespace lockstep::detail::wire
