#include "membership/backend.hpp"

#include <algorithm>

#include "base/little_endian.hpp"
#include "base/text.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

const BackendType& find_built(const std::string& name) {
  for (const BackendType* type : built_backend_types()) {
    if (name == type->name) {
      return *type;
    }
  }
  throw ConfigError("lockstep: no backend named '" + name + "'");
}

}  // namespace

void Leaders::barrier(std::optional<Clock::time_point> deadline, const char* what) {
  std::lock_guard lock(mutex_);
  if (broken_) {
    throw_failure(*broken_, std::string(what) + ": the job cannot go on: ");
  }
  try {
    backend_->barrier(deadline, what);
  } catch (const std::exception& error) {
    broken_ = failure_of(error, what);
    throw;
  }
}

std::vector<std::byte> Leaders::share(std::span<const std::byte> data, bool from_node0,
                                      std::optional<Clock::time_point> deadline, const char* what) {
  std::lock_guard lock(mutex_);
  if (broken_) {
    throw_failure(*broken_, std::string(what) + ": the job cannot go on: ");
  }
  return share_locked(data, from_node0, deadline, what);
}

std::vector<std::vector<std::byte>> Leaders::gather(std::span<const std::byte> part,
                                                    std::optional<Clock::time_point> deadline,
                                                    const char* what) {
  std::lock_guard lock(mutex_);
  if (broken_) {
    throw_failure(*broken_, std::string(what) + ": the job cannot go on: ");
  }
  try {
    if (part.size() > Bootstrap::kMaxPart) {
      throw Error(std::string(what) + ": a machine's part of a gather is at most " +
                  std::to_string(Bootstrap::kMaxPart) + " bytes, not " +
                  std::to_string(part.size()));
    }
    return backend_->gather(part, deadline, what);
  } catch (const std::exception& error) {
    broken_ = failure_of(error, what);
    throw;
  }
}

std::vector<std::byte> Leaders::share_locked(std::span<const std::byte> data, bool from_node0,
                                             std::optional<Clock::time_point> deadline,
                                             const char* what) {
  constexpr std::size_t kChunk = Bootstrap::kMaxBlob;
  constexpr std::size_t kLength = 8;
  try {
    if (from_node0) {
      if (data.size() > kMaxShare) {
        throw Error(std::string(what) + ": at most " + std::to_string(kMaxShare) +
                    " bytes travel between machines, not " + std::to_string(data.size()));
      }
      std::vector<std::byte> framed(kLength + data.size());
      put_le(framed.data(), data.size(), kLength);
      std::copy(data.begin(), data.end(), framed.begin() + kLength);
      for (std::size_t at = 0; at < framed.size(); at += kChunk) {
        const std::size_t n = std::min(kChunk, framed.size() - at);
        (void)backend_->broadcast(std::span(framed).subspan(at, n), deadline, what);
      }
      return {data.begin(), data.end()};
    }
    std::vector<std::byte> framed = backend_->broadcast({}, deadline, what);
    const std::uint64_t length = get_le(framed.data(), std::min(kLength, framed.size()));
    if (framed.size() < kLength || length > kMaxShare) {
      throw Error(std::string(what) + ": node 0 sent a broadcast that is not lockstep's (" +
                  std::to_string(framed.size()) + " bytes, length " + std::to_string(length) + ")");
    }
    // Every piece, the first included, must fit the length it announced: exactly that many
    // bytes are returned (a first piece longer than its length returned them all until
    // 2026-12-03).
    const auto not_adding_up = [&](std::size_t received, bool empty) {
      return Error(std::string(what) + ": node 0's broadcast came in pieces that do not add up (" +
                   (empty ? "an empty piece after " : "") + std::to_string(received) +
                   " bytes of " + std::to_string(length) + ")");
    };
    if (framed.size() > kLength + length) {
      throw not_adding_up(framed.size() - kLength, false);
    }
    while (framed.size() < kLength + length) {
      std::vector<std::byte> more = backend_->broadcast({}, deadline, what);
      if (more.empty() || framed.size() + more.size() > kLength + length) {
        throw not_adding_up(framed.size() - kLength + more.size(), more.empty());
      }
      framed.insert(framed.end(), more.begin(), more.end());
    }
    return {framed.begin() + kLength, framed.end()};
  } catch (const std::exception& error) {
    broken_ = failure_of(error, what);
    throw;
  }
}

namespace {

constexpr std::size_t kLengthWord = 8;

Error pieces_do_not_add_up(const char* what, const std::string& which, std::uint64_t received,
                           std::uint64_t length) {
  return Error{std::string(what) + ": " + which + " came in pieces that do not add up (" +
               std::to_string(received) + " bytes of " + std::to_string(length) + ")"};
}

}  // namespace

std::vector<std::byte> Leaders::share_all(std::span<const std::byte> data, bool from_node0,
                                          std::optional<Clock::time_point> deadline,
                                          const char* what) {
  std::lock_guard lock(mutex_);
  if (broken_) {
    throw_failure(*broken_, std::string(what) + ": the job cannot go on: ");
  }
  return share_all_locked(data, from_node0, deadline, what);
}

std::vector<std::byte> Leaders::share_all_locked(std::span<const std::byte> data, bool from_node0,
                                                 std::optional<Clock::time_point> deadline,
                                                 const char* what) {
  try {
    if (from_node0) {
      const std::size_t first = std::min(data.size(), kMaxShare - kLengthWord);
      std::vector<std::byte> led(kLengthWord + first);
      put_le(led.data(), data.size(), kLengthWord);
      std::copy_n(data.begin(), first, led.begin() + kLengthWord);
      (void)share_locked(led, true, deadline, what);
      for (std::size_t at = first; at < data.size(); at += kMaxShare) {
        backend_->barrier(deadline, what);
        (void)share_locked(data.subspan(at, std::min(kMaxShare, data.size() - at)), true, deadline,
                           what);
      }
      return {data.begin(), data.end()};
    }
    std::vector<std::byte> out = share_locked({}, false, deadline, what);
    if (out.size() < kLengthWord) {
      throw pieces_do_not_add_up(what, "node 0's share", out.size(), kLengthWord);
    }
    const std::uint64_t length = get_le(out.data(), kLengthWord);
    out.erase(out.begin(), out.begin() + kLengthWord);
    while (out.size() < length) {
      backend_->barrier(deadline, what);
      const std::vector<std::byte> piece = share_locked({}, false, deadline, what);
      if (piece.empty() || piece.size() > length - out.size()) {
        throw pieces_do_not_add_up(what, "node 0's share", out.size() + piece.size(), length);
      }
      out.insert(out.end(), piece.begin(), piece.end());
    }
    if (out.size() != length) {
      throw pieces_do_not_add_up(what, "node 0's share", out.size(), length);
    }
    return out;
  } catch (const std::exception& error) {
    broken_ = failure_of(error, what);
    throw;
  }
}

std::uint64_t Leaders::first_parts(std::vector<std::vector<std::byte>>& parts,
                                   std::vector<std::uint64_t>& lengths, const char* what) const {
  // Rounds more at most: 2^26 of kMaxPart bytes (4 TiB), past any machine's memory.
  constexpr std::uint64_t kMaxRounds = std::uint64_t{1} << 26;
  std::uint64_t rounds = 0;
  for (std::size_t node = 0; node < parts.size(); ++node) {
    std::vector<std::byte>& part = parts[node];
    const std::uint64_t length = part.size() < kLengthWord ? 0 : get_le(part.data(), kLengthWord);
    if (part.size() < kLengthWord || part.size() - kLengthWord > length) {
      throw pieces_do_not_add_up(what, "node " + std::to_string(node) + "'s part", part.size(),
                                 length);
    }
    part.erase(part.begin(), part.begin() + kLengthWord);
    lengths.push_back(length);
    const std::uint64_t more =
        (length - part.size() + Bootstrap::kMaxPart - 1) / Bootstrap::kMaxPart;
    if (more > kMaxRounds) {
      throw pieces_do_not_add_up(what, "node " + std::to_string(node) + "'s part", part.size(),
                                 length);
    }
    rounds = std::max(rounds, more);
  }
  return rounds;
}

std::vector<std::byte> Leaders::gather_all(
    std::span<const std::byte> part,
    FunctionRef<std::vector<std::byte>(std::vector<std::vector<std::byte>>&)> combine,
    std::optional<Clock::time_point> deadline, const char* what) {
  std::lock_guard lock(mutex_);
  if (broken_) {
    throw_failure(*broken_, std::string(what) + ": the job cannot go on: ");
  }
  try {
    std::size_t at = std::min(part.size(), Bootstrap::kMaxPart - kLengthWord);
    std::vector<std::byte> first(kLengthWord + at);
    put_le(first.data(), part.size(), kLengthWord);
    std::copy_n(part.begin(), at, first.begin() + kLengthWord);
    std::vector<std::vector<std::byte>> parts = backend_->gather(first, deadline, what);
    const bool node0 = !parts.empty();  // the others' gathers return nothing
    std::vector<std::uint64_t> lengths;
    std::uint64_t rounds = 0;
    std::vector<std::byte> word(kLengthWord);
    if (node0) {
      rounds = first_parts(parts, lengths, what);
      if (rounds == 0) {
        std::vector<std::byte> outcome = combine(parts);
        outcome.insert(outcome.begin(), word.begin(), word.end());  // no rounds more
        (void)share_all_locked(outcome, true, deadline, what);
        return {outcome.begin() + kLengthWord, outcome.end()};
      }
      put_le(word.data(), rounds, kLengthWord);
      (void)share_all_locked(word, true, deadline, what);
    } else {
      std::vector<std::byte> reply = share_all_locked({}, false, deadline, what);
      if (reply.size() < kLengthWord) {
        throw pieces_do_not_add_up(what, "node 0's answer", reply.size(), kLengthWord);
      }
      rounds = get_le(reply.data(), kLengthWord);
      if (rounds == 0) {
        return {reply.begin() + kLengthWord, reply.end()};
      }
    }
    for (std::uint64_t round = 0; round < rounds; ++round) {
      backend_->barrier(deadline, what);  // no leader more than a round ahead of node 0
      const std::size_t n = std::min(Bootstrap::kMaxPart, part.size() - at);
      std::vector<std::vector<std::byte>> more =
          backend_->gather(part.subspan(at, n), deadline, what);
      at += n;
      for (std::size_t node = 0; node0 && node < parts.size(); ++node) {
        if (more.size() != parts.size() || more[node].size() > lengths[node] - parts[node].size()) {
          throw pieces_do_not_add_up(what, "node " + std::to_string(node) + "'s part",
                                     parts[node].size() + more[node].size(), lengths[node]);
        }
        parts[node].insert(parts[node].end(), more[node].begin(), more[node].end());
      }
    }
    if (!node0) {
      return share_all_locked({}, false, deadline, what);
    }
    for (std::size_t node = 0; node < parts.size(); ++node) {
      if (parts[node].size() != lengths[node]) {
        throw pieces_do_not_add_up(what, "node " + std::to_string(node) + "'s part",
                                   parts[node].size(), lengths[node]);
      }
    }
    const std::vector<std::byte> outcome = combine(parts);
    return share_all_locked(outcome, true, deadline, what);
  } catch (const std::exception& error) {
    if (!broken_) {
      broken_ = failure_of(error, what);
    }
    throw;
  }
}

void Leaders::abort(const Failure& failure) noexcept {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    backend_->cancel();  // the relay's meet ends within a slice; the job is over anyway
    lock.lock();
  }
  abort_locked(failure);
}

bool Leaders::try_abort(const Failure& failure) noexcept {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    return false;
  }
  abort_locked(failure);
  return true;
}

void Leaders::abort_locked(const Failure& failure) noexcept {
  if (!broken_) {
    broken_ = failure;
  }
  backend_->abort(failure);
}

void Backend::check_cancelled(const char* what) const {
  if (cancelled_.load(std::memory_order_relaxed)) {
    throw Error(std::string(what) +
                ": this process stopped waiting for the other nodes (it leaves the job, or its "
                "node cannot go on)");
  }
}

void check_backend_built(const JobConfig& job) {
  auto built = built_backends();
  if (built.empty()) {
    throw ConfigError("lockstep: this job spans " + std::to_string(job.num_nodes) +
                      " nodes, but this build of lockstep has no cross-node backend (rebuild "
                      "with UCX: install libucx-dev and configure with -Ducx=enabled)");
  }
  if (!job.backend.empty() && std::find(built.begin(), built.end(), job.backend) == built.end()) {
    throw ConfigError("lockstep: LOCKSTEP_BACKEND=" + job.backend +
                      ": this build of lockstep has no such backend (it has: " + comma_list(built) +
                      ")");
  }
}

std::unique_ptr<Leaders> join_leaders(const LeaderConfig& config) {
  check_backend_built(config.job);
  const BackendType& type =
      config.job.backend.empty() ? *built_backend_types().front() : find_built(config.job.backend);
  std::unique_ptr<Bootstrap> bootstrap;
  if (type.needs_bootstrap) {
    bootstrap = make_bootstrap(config);
  }
  return std::make_unique<Leaders>(type.make(config, std::move(bootstrap)));
}

std::unique_ptr<Bootstrap> make_bootstrap(const LeaderConfig& config) {
  for (const BackendType* type : built_backend_types()) {
    if (type->make_bootstrap != nullptr) {
      return type->make_bootstrap(config);
    }
  }
  throw ConfigError("lockstep: no backend of this build can bootstrap another");
}

}  // namespace lockstep::detail
