#include "ucx/rendezvous.hpp"

#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "lockstep/error.hpp"
#include "proc.hpp"
#include "ucx/wire.hpp"

namespace lockstep::detail::rendezvous {
namespace {

using namespace std::chrono_literals;

constexpr auto kRetryDelay = 100ms;      // between attempts to reach node 0
constexpr std::size_t kMaxDropped = 16;  // reasons kept for node 0's messages

// "127.0.0.1:41234": a peer as a message names it.
std::string describe(const sockaddr_storage& address, socklen_t length) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  (void)::getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof host, port,
                      sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
  return std::string(host) + ":" + port;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<std::chrono::milliseconds::rep>(left.count(), 0, 1'000'000));
}

// Waits until `fd` is ready for `events` or `deadline` passes; false then.
bool await(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, remaining_ms(deadline));
    if (ready > 0) {
      return true;
    }
    if (ready == 0 || errno != EINTR) {
      return false;
    }
  }
}

// Writes all of `bytes` to the non-blocking socket `fd` by `deadline`.
bool write_all(int fd, std::span<const std::byte> bytes, Clock::time_point deadline) {
  while (!bytes.empty()) {
    const ssize_t written = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (written > 0) {
      bytes = bytes.subspan(static_cast<std::size_t>(written));
    } else if (written < 0 && errno == EINTR) {
      continue;
    } else if (written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!await(fd, POLLOUT, deadline)) {
        return false;
      }
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<std::byte> frame(std::span<const std::byte> message) {
  std::vector<std::byte> out(4 + message.size());
  const auto length = static_cast<std::uint32_t>(message.size());
  for (int i = 0; i < 4; ++i) {
    out[static_cast<std::size_t>(i)] = static_cast<std::byte>(length >> (8 * i));
  }
  std::copy(message.begin(), message.end(), out.begin() + 4);
  return out;
}

std::size_t FrameReader::feed(std::span<const std::byte> input) {
  std::size_t used = 0;
  while (have_ < 4 && used < input.size()) {
    prefix_[have_++] = input[used++];
    if (have_ == 4) {
      length_ = 0;
      for (int i = 3; i >= 0; --i) {
        length_ =
            (length_ << 8) | std::to_integer<std::size_t>(prefix_[static_cast<std::size_t>(i)]);
      }
      if (length_ == 0 || length_ > kMaxFrame) {
        throw wire::WireError("a frame of " + std::to_string(length_) + " bytes (1 to " +
                              std::to_string(kMaxFrame) + " allowed)");
      }
    }
  }
  if (have_ == 4) {
    // Grows with what arrives, never by what the prefix claims.
    const std::size_t take = std::min(input.size() - used, length_ - body_.size());
    body_.insert(body_.end(), input.begin() + static_cast<std::ptrdiff_t>(used),
                 input.begin() + static_cast<std::ptrdiff_t>(used + take));
    used += take;
  }
  return used;
}

Server::Server(const sockaddr_storage& address, socklen_t length, const std::string& where) {
  fd_ = ::socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    throw_errno("lockstep: node 0 listening on " + where, "socket");
  }
  // Node 0 may close its connections first, which leaves them in TIME_WAIT on the port: the next
  // job must be able to listen there at once.
  const int one = 1;
  (void)::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      ::listen(fd_, 128) != 0) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    if (error == EADDRINUSE) {
      throw ConfigError("lockstep: node 0 cannot listen on " + where +
                        ": the port is in use (another job? Under torchrun, MASTER_PORT is "
                        "torchrun's own: give lockstep another with LOCKSTEP_MASTER_PORT)");
    }
    throw ConfigError("lockstep: node 0 cannot listen on " + where + " (" + error_text(error) +
                      "): MASTER_ADDR must be an address of node 0 that the other nodes reach");
  }
}

Server::~Server() {
  for (auto& [id, peer] : peers_) {
    ::close(peer.fd);
  }
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

void Server::drop(int id, const std::string& why) {
  auto found = peers_.find(id);
  if (found == peers_.end()) {
    return;
  }
  if (dropped_.size() < kMaxDropped) {
    dropped_.push_back(found->second.from + ": " + why);
  }
  ::close(found->second.fd);
  peers_.erase(found);
}

void Server::step(std::chrono::milliseconds limit, const OnHello& on_hello,
                  const std::function<void(int)>& on_lost) {
  std::vector<pollfd> fds{{fd_, POLLIN, 0}};
  std::vector<int> ids{-1};
  for (const auto& [id, peer] : peers_) {
    fds.push_back({peer.fd, POLLIN, 0});
    ids.push_back(id);
  }
  if (::poll(fds.data(), fds.size(), static_cast<int>(limit.count())) < 0 && errno != EINTR) {
    throw_errno("lockstep: node 0's rendezvous", "poll");
  }
  const auto now = Clock::now();
  for (std::size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents != 0) {
      read_peer(ids[i], on_hello, on_lost);
    }
  }
  drop_idle(now);
  if ((fds[0].revents & POLLIN) != 0) {
    accept_new(now);
  }
}

void Server::read_peer(int id, const OnHello& on_hello, const std::function<void(int)>& on_lost) {
  Peer& peer = peers_.at(id);
  std::array<std::byte, 65536> buffer{};
  for (;;) {
    const ssize_t got = ::recv(peer.fd, buffer.data(), buffer.size(), 0);
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    }
    if (got <= 0) {
      if (peer.kept) {
        ::close(peer.fd);
        peers_.erase(id);
        on_lost(id);
      } else {
        drop(id, "closed before it sent a hello");
      }
      return;
    }
    if (peer.kept) {
      continue;  // a joined node has nothing more to say: whatever it sends is ignored
    }
    std::span<const std::byte> input(buffer.data(), static_cast<std::size_t>(got));
    try {
      (void)peer.reader.feed(input);
    } catch (const wire::WireError& error) {
      drop(id, std::string("malformed: ") + error.what());
      return;
    }
    if (!peer.reader.complete()) {
      continue;
    }
    Verdict verdict = on_hello(id, peer.reader.message(), peer.from);
    if (verdict.keep) {
      peer.kept = true;
      peer.reader = FrameReader{};
      continue;
    }
    // A refusal is small: one try, without waiting (a peer that does not read loses it).
    const auto bytes = frame(verdict.reply);
    (void)::send(peer.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(peer.fd);
    peers_.erase(id);
    return;
  }
}

// Idle connections: a hello is sent at once after connecting.
void Server::drop_idle(Clock::time_point now) {
  std::vector<int> idle;
  for (const auto& [id, peer] : peers_) {
    if (!peer.kept && now - peer.since > kHelloBound) {
      idle.push_back(id);
    }
  }
  for (int id : idle) {
    drop(id, "sent no hello within 10 s");
  }
}

void Server::accept_new(Clock::time_point now) {
  for (;;) {
    sockaddr_storage from{};
    socklen_t from_length = sizeof from;
    const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&from), &from_length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      return;  // none left (or a connection that went away meanwhile)
    }
    Peer peer;
    peer.fd = fd;
    peer.from = describe(from, from_length);
    peer.since = now;
    peers_.emplace(next_id_++, std::move(peer));
    // Too many waiting for their hello: the oldest goes (a joining leader sends its hello at
    // once, and connects again if it was dropped).
    std::size_t pending = 0;
    int oldest = -1;
    for (const auto& [id, waiting] : peers_) {
      if (!waiting.kept) {
        ++pending;
        oldest = oldest < 0 ? id : oldest;
      }
    }
    if (pending > kMaxPending) {
      drop(oldest, "one connection too many waiting for its hello");
    }
  }
}

bool Server::send(int id, std::span<const std::byte> message, Clock::time_point deadline) {
  auto found = peers_.find(id);
  return found != peers_.end() && write_all(found->second.fd, frame(message), deadline);
}

std::optional<std::vector<std::byte>> exchange(const sockaddr_storage& address, socklen_t length,
                                               std::span<const std::byte> hello,
                                               Clock::time_point deadline,
                                               std::string& last_error) {
  const auto bytes = frame(hello);
  while (Clock::now() < deadline) {
    const auto retry_at = Clock::now() + kRetryDelay;
    const int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      throw_errno("lockstep: connecting to node 0", "socket");
    }
    bool connected = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0;
    if (!connected && errno == EINPROGRESS && await(fd, POLLOUT, deadline)) {
      int error = 0;
      socklen_t size = sizeof error;
      (void)::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
      connected = error == 0;
      errno = error;
    }
    if (!connected) {
      last_error = errno != 0 ? error_text(errno) : "no answer";
    } else if (!write_all(fd, bytes, deadline)) {
      last_error = "sending the hello failed";
    } else {
      FrameReader reader;
      std::array<std::byte, 65536> buffer{};
      while (!reader.complete() && await(fd, POLLIN, deadline)) {
        const ssize_t got = ::recv(fd, buffer.data(), buffer.size(), 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) {
          continue;
        }
        if (got <= 0) {
          last_error = "node 0 closed the connection without an answer";
          break;
        }
        try {
          (void)reader.feed({buffer.data(), static_cast<std::size_t>(got)});
        } catch (...) {
          ::close(fd);
          throw;
        }
      }
      if (reader.complete()) {
        ::close(fd);
        return std::vector<std::byte>(reader.message().begin(), reader.message().end());
      }
      if (Clock::now() >= deadline) {
        last_error = "node 0 accepted the connection but had not answered";
      }
    }
    ::close(fd);
    std::this_thread::sleep_until(std::min(retry_at, deadline));
  }
  return std::nullopt;
}

}  // namespace lockstep::detail::rendezvous
