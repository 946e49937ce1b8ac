// The UCX backend's exchanges (the class: ucx_backend.hpp): node 0's small broadcast (the
// bootstrap's, NCCL's id), and the allgather and share of any size, whose parts go to every
// leader in chunks (send_chunk, PartInbox).
#include <string>
#include <vector>

#include "lockstep/error.hpp"
#include "ucx/ucx_backend.hpp"

namespace lockstep::detail::ucx {

std::vector<std::byte> UcxBackend::broadcast(std::span<const std::byte> blob,
                                             std::optional<Clock::time_point> deadline,
                                             const char* what) {
  // The number of this broadcast; counted once it is delivered, so that a blob that arrives
  // while this leader waits for it is still taken (handle_member drops only older ones).
  const std::uint64_t sequence = blob_sequence_;
  if (me_ == 0) {
    if (blob.size() > kMaxBlob) {  // refused before it is numbered: the next one is not skipped
      throw Error(std::string(what) + ": a broadcast carries at most " + std::to_string(kMaxBlob) +
                  " bytes, not " + std::to_string(blob.size()));
    }
    ++blob_sequence_;
    wire::Blob message{token_, 0, sequence, {blob.begin(), blob.end()}};
    for (int node = 1; node < num_nodes_; ++node) {
      send(members_[static_cast<std::size_t>(node)]->ep, message);
    }
    flush(deadline, what);
    return {blob.begin(), blob.end()};
  }
  wait_until([&] { return blobs_.count(sequence) != 0; }, deadline, what,
             [&] {
               Failure failure{FailureKind::timeout, -1, ranks_of_nodes({0}),
                               "timed out waiting for node 0's broadcast"};
               abort(failure);
               fail(failure, what);
             },
             [&] { return "node 0's broadcast (" + ranks_text(ranks_of_nodes({0})) + ")"; });
  auto data = std::move(blobs_[sequence]);
  blobs_.erase(sequence);
  ++blob_sequence_;
  return data;
}

std::vector<std::vector<std::byte>> UcxBackend::allgather(std::span<const std::byte> part,
                                                          std::optional<Clock::time_point> deadline,
                                                          const char* what) {
  std::vector<std::vector<std::byte>> parts = exchange(part, false, deadline, what);
  parts[static_cast<std::size_t>(me_)].assign(part.begin(), part.end());
  return parts;
}

std::vector<std::byte> UcxBackend::share(std::span<const std::byte> data,
                                         std::optional<Clock::time_point> deadline,
                                         const char* what) {
  if (me_ == 0) {
    (void)exchange(data, true, deadline, what);
    return {data.begin(), data.end()};
  }
  return std::move(exchange({}, true, deadline, what).front());
}

std::vector<std::vector<std::byte>> UcxBackend::exchange(std::span<const std::byte> part,
                                                         bool share,
                                                         std::optional<Clock::time_point> deadline,
                                                         const char* what) {
  if (aborted_) {
    fail(*aborted_, what);
  }
  PartInbox& inbox = *part_inbox_;
  if (!share || me_ == 0) {
    // A copy that lives as long as UCX sends from it, however this call ends.
    const auto kept = std::make_shared<const std::vector<std::byte>>(part.begin(), part.end());
    for (int node = 0; node < num_nodes_; ++node) {
      for (std::uint64_t index = 0; node != me_ && index < PartInbox::chunks(part.size());
           ++index) {
        send_chunk(
            members_[static_cast<std::size_t>(node)]->ep,
            wire::Chunk{token_, static_cast<std::uint32_t>(me_), inbox.current(), part.size(),
                        index * wire::kChunk, PartInbox::chunk_length(part.size(), index)},
            kept);
      }
    }
  }
  wait_until([&] { return inbox.missing(share).empty() || inbox.failed(); }, deadline, what,
             [&] {
               Failure failure{
                   FailureKind::timeout, -1, ranks_of_nodes(inbox.missing(share)),
                   "timed out waiting for the parts of " + nodes_text(inbox.missing(share))};
               abort(failure);
               fail(failure, what);
             },
             [&] { return "the parts of " + nodes_text(inbox.missing(share)); });
  if (inbox.failed()) {
    check_members(what);  // a leader that is gone says so
    Failure failure{FailureKind::error, -1, ranks_of_nodes(inbox.missing(share)),
                    "the parts of " + nodes_text(inbox.missing(share)) + " did not arrive whole"};
    abort(failure);
    fail(failure, what);
  }
  flush(deadline, what);  // this leader's part has left too
  return inbox.finish();
}

}  // namespace lockstep::detail::ucx
