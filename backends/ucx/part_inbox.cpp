#include "ucx/part_inbox.hpp"

#include <unistd.h>

#include <algorithm>
#include <new>

namespace lockstep::detail::ucx {

PartInbox::PartInbox(int me, int num_nodes, std::uint64_t token, std::uint64_t max_ahead,
                     std::uint64_t max_total)
    : me_(me),
      num_nodes_(num_nodes),
      token_(token),
      max_ahead_(max_ahead),
      max_total_(std::min(max_total, wire::kMaxTotal)) {}

std::uint64_t PartInbox::physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) {
    return wire::kMaxTotal;  // not known: memory refuses what it cannot hold
  }
  return std::min(wire::kMaxTotal,
                  static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page));
}

std::uint64_t PartInbox::chunks(std::uint64_t total) {
  return total == 0 ? 1 : (total - 1) / wire::kChunk + 1;
}

std::uint64_t PartInbox::chunk_length(std::uint64_t total, std::uint64_t index) {
  const std::uint64_t offset = index * wire::kChunk;
  return offset >= total ? 0 : std::min<std::uint64_t>(wire::kChunk, total - offset);
}

ChunkPlace PartInbox::place(const wire::Chunk& head, std::size_t length) {
  if (head.token != token_ || head.from >= static_cast<std::uint32_t>(num_nodes_) ||
      head.from == static_cast<std::uint32_t>(me_) || head.sequence < current_) {
    return {};  // another job's, forged, this node's own or an exchange that has ended: dropped
  }
  const std::string sender = "node " + std::to_string(head.from);
  const auto refuse = [](std::string why) {
    return ChunkPlace{ChunkPlace::Verdict::refuse, nullptr, std::move(why)};
  };
  if (head.sequence - current_ >= max_ahead_) {
    // A leader sends its part and then waits for everyone's: one further ahead is not lockstep's.
    return refuse(sender + " sent a chunk of exchange " + std::to_string(head.sequence) +
                  " while this machine was at exchange " + std::to_string(current_));
  }
  if (head.total > max_total_) {
    return refuse(sender + " announced a part of " + std::to_string(head.total) +
                  " bytes, more than this machine's memory (" + std::to_string(max_total_) +
                  " bytes)");
  }
  const std::uint64_t index = head.offset / wire::kChunk;
  if (head.offset % wire::kChunk != 0 || index >= chunks(head.total) ||
      head.length != chunk_length(head.total, index) || length != head.length) {
    return refuse(sender + " sent a chunk that is not one of its part's (" +
                  std::to_string(length) + " bytes at " + std::to_string(head.offset) + " of " +
                  std::to_string(head.total) + ")");
  }
  auto& of_exchange = parts_[head.sequence];
  auto found = of_exchange.find(static_cast<int>(head.from));
  if (found == of_exchange.end()) {
    Part part;
    part.total = head.total;
    try {
      part.bytes.resize(head.total);
      part.taken.resize(chunks(head.total));
    } catch (const std::bad_alloc&) {
      if (of_exchange.empty()) {
        parts_.erase(head.sequence);
      }
      return refuse("this machine cannot hold " + sender + "'s part of " +
                    std::to_string(head.total) + " bytes (out of memory)");
    }
    found = of_exchange.emplace(static_cast<int>(head.from), std::move(part)).first;
  }
  Part& part = found->second;
  if (part.total != head.total) {
    return refuse(sender + " announced its part as " + std::to_string(head.total) +
                  " bytes, and as " + std::to_string(part.total) + " before");
  }
  if (part.taken[index]) {
    return refuse(sender + " sent the chunk at " + std::to_string(head.offset) +
                  " of its part twice");
  }
  part.taken[index] = true;
  return {ChunkPlace::Verdict::take, part.bytes.data() + head.offset, {}};
}

void PartInbox::received(const wire::Chunk& head, bool ok) {
  Part& part = parts_[head.sequence][static_cast<int>(head.from)];
  ++part.arrived;
  part.failed = part.failed || !ok;
}

std::vector<int> PartInbox::missing(bool share) const {
  const auto found = parts_.find(current_);
  std::vector<int> nodes;
  for (int node = 0; node < (share ? 1 : num_nodes_); ++node) {
    if (node == me_) {
      continue;
    }
    const Part* part = nullptr;
    if (found != parts_.end()) {
      const auto it = found->second.find(node);
      part = it == found->second.end() ? nullptr : &it->second;
    }
    if (part == nullptr || !complete(*part)) {
      nodes.push_back(node);
    }
  }
  return nodes;
}

bool PartInbox::failed() const {
  const auto found = parts_.find(current_);
  if (found == parts_.end()) {
    return false;
  }
  for (const auto& [node, part] : found->second) {
    if (part.failed) {
      return true;
    }
  }
  return false;
}

std::vector<std::vector<std::byte>> PartInbox::finish() {
  std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(num_nodes_));
  const auto found = parts_.find(current_);
  if (found != parts_.end()) {
    for (auto& [node, part] : found->second) {
      out[static_cast<std::size_t>(node)] = std::move(part.bytes);
    }
    parts_.erase(found);
  }
  ++current_;
  return out;
}

}  // namespace lockstep::detail::ucx
