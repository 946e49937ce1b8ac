// The parts of the leaders' exchanges as their chunks arrive (internal to backends/ucx): each
// chunk's head (wire::Chunk) is checked here before a byte of it is received, and names the one
// place its bytes may go. A function of what it is given alone (no UCX), so that a test and the
// wire's fuzzer reach every check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ucx/wire.hpp"

namespace lockstep::detail::ucx {

// Where a chunk's bytes go: nowhere (a foreign, old or repeated exchange's: dropped), nowhere
// because the sender broke the protocol (`why`, the job's failure), or `at`.
struct ChunkPlace {
  enum class Verdict { drop, refuse, take } verdict = Verdict::drop;
  std::byte* at = nullptr;  // take: the chunk's `length` bytes go here
  std::string why;          // refuse
};

class PartInbox {
 public:
  // This leader is node `me` of `num_nodes`, in the job whose token is `token`; a leader may be
  // at most `max_ahead` exchanges ahead of this one, and a part at most `max_total` bytes (this
  // machine's memory: physical_memory()).
  PartInbox(int me, int num_nodes, std::uint64_t token, std::uint64_t max_ahead,
            std::uint64_t max_total);

  // This machine's memory in bytes (at most wire::kMaxTotal).
  static std::uint64_t physical_memory();

  // How many chunks a part of `total` bytes travels in (one for an empty part), and the length
  // of chunk `index`.
  static std::uint64_t chunks(std::uint64_t total);
  static std::uint64_t chunk_length(std::uint64_t total, std::uint64_t index);

  // The exchange this leader makes next.
  [[nodiscard]] std::uint64_t current() const noexcept { return current_; }
  // A chunk's head, with the `length` bytes that came with it (or will, by rendezvous): where
  // they go. A taken chunk is this inbox's until received() says it is in place.
  ChunkPlace place(const wire::Chunk& head, std::size_t length);
  // The chunk `head` names (taken) is in place, or failed to arrive.
  void received(const wire::Chunk& head, bool ok);
  // The nodes (other than this one; only node 0 for a share) whose part of the current exchange
  // is not all in place yet.
  [[nodiscard]] std::vector<int> missing(bool share = false) const;
  // Whether a chunk of the current exchange failed to arrive (the sender's link broke).
  [[nodiscard]] bool failed() const;
  // Ends the current exchange, every other node's part in place: the parts by node index (this
  // node's empty, for the caller to fill).
  std::vector<std::vector<std::byte>> finish();

 private:
  struct Part {
    std::uint64_t total = 0;
    std::vector<std::byte> bytes;
    std::vector<bool> taken;  // by chunk
    std::uint64_t arrived = 0;
    bool failed = false;
  };
  [[nodiscard]] bool complete(const Part& part) const {
    return !part.failed && part.arrived == part.taken.size();
  }

  int me_;
  int num_nodes_;
  std::uint64_t token_;
  std::uint64_t max_ahead_;
  std::uint64_t max_total_;
  std::uint64_t current_ = 0;
  std::map<std::uint64_t, std::map<int, Part>> parts_;  // by exchange, then node
};

}  // namespace lockstep::detail::ucx
