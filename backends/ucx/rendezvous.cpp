#include "ucx/rendezvous.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "base/bytes.hpp"
#include "base/proc.hpp"
#include "lockstep/error.hpp"
#include "ucx/wire.hpp"
#include "waiting/wait_controls.hpp"

namespace lockstep::detail::rendezvous {
namespace {

using namespace std::chrono_literals;

constexpr auto kRetryDelay = 100ms;      // between attempts to reach node 0
constexpr std::size_t kMaxDropped = 16;  // reasons kept for node 0's messages
constexpr std::array<std::byte, 4> kAuthMagic{std::byte{'L'}, std::byte{'S'}, std::byte{'A'},
                                              std::byte{'1'}};
constexpr std::string_view kNodeZeroRole = "lockstep node 0";
constexpr std::string_view kNodeRole = "lockstep node";
constexpr std::string_view kHelloSeal = "hello";
constexpr std::string_view kAnswerSeal = "answer";

// Sends `message`, framed, in one try without waiting (it is small; a peer that does not read
// loses it); whether all of it went.
bool send_once(int fd, std::span<const std::byte> message) {
  const auto bytes = frame(message);
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(bytes.size());
}

// `message` followed by its seal.
std::vector<std::byte> sealed(const auth::Session& session, std::string_view label,
                              std::span<const std::byte> message) {
  std::vector<std::byte> out(message.begin(), message.end());
  const auth::Mac seal = session.seal(label, message);
  out.insert(out.end(), seal.begin(), seal.end());
  return out;
}

// The message of a sealed frame, if its seal is right.
std::optional<std::span<const std::byte>> unsealed(const auth::Session& session,
                                                   std::string_view label,
                                                   std::span<const std::byte> frame_body) {
  if (frame_body.size() < auth::kMac) {
    return std::nullopt;
  }
  const auto message = frame_body.first(frame_body.size() - auth::kMac);
  if (!auth::same(session.seal(label, message), frame_body.last(auth::kMac))) {
    return std::nullopt;
  }
  return message;
}

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

}  // namespace

bool await(int fd, short events, Clock::time_point deadline, const std::string& what) {
  constexpr int kInterruptLook = 100;  // ms
  for (;;) {
    check_interrupt(what);
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, std::min(remaining_ms(deadline), kInterruptLook));
    if (ready > 0) {
      return true;
    }
    if ((ready < 0 && errno != EINTR) || Clock::now() >= deadline) {
      return false;
    }
  }
}

bool send_all(int fd, std::span<const std::byte> bytes, Clock::time_point deadline,
              bool interruptible) {
  while (!bytes.empty()) {
    const ssize_t written = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (written > 0) {
      bytes = bytes.subspan(static_cast<std::size_t>(written));
    } else if (written < 0 && errno == EINTR) {
      continue;
    } else if (written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (interruptible) {
        if (!await(fd, POLLOUT, deadline)) {
          return false;
        }
        continue;
      }
      pollfd entry{fd, POLLOUT, 0};
      const int ready = ::poll(&entry, 1, remaining_ms(deadline));
      if ((ready < 0 && errno != EINTR) || (ready == 0 && Clock::now() >= deadline) ||
          (ready > 0 && (entry.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0)) {
        return false;
      }
    } else {
      return false;
    }
  }
  return true;
}

namespace {

// Writes all of `bytes` to the non-blocking socket `fd` by `deadline` (the join: a signal's
// interrupt ends the wait).
bool write_all(int fd, std::span<const std::byte> bytes, Clock::time_point deadline) {
  return send_all(fd, bytes, deadline, true);
}

}  // namespace

std::vector<std::byte> frame(std::span<const std::byte> message) {
  ByteWriter w;
  w.sized(message);
  return w.take();
}

std::size_t FrameReader::feed(std::span<const std::byte> input) {
  std::size_t used = 0;
  while (have_ < 4 && used < input.size()) {
    prefix_[have_++] = input[used++];
    if (have_ == 4) {
      length_ = ByteReader(prefix_).u32();
      if (length_ == 0 || length_ > limit_) {
        throw wire::WireError("a frame of " + std::to_string(length_) + " bytes (1 to " +
                              std::to_string(limit_) + " allowed)");
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

Server::Server(const sockaddr_storage& address, socklen_t length, const std::string& where,
               std::string secret)
    : secret_(std::move(secret)) {
  fd_.reset(::socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd_) {
    throw_errno("lockstep: node 0 listening on " + where, "socket");
  }
  // Node 0 may close its connections first, which leaves them in TIME_WAIT on the port: the next
  // job must be able to listen there at once.
  const int one = 1;
  (void)::setsockopt(fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      ::listen(fd_.get(), 128) != 0) {
    const int error = errno;
    fd_.reset();
    if (error == EADDRINUSE) {
      throw ConfigError("lockstep: node 0 cannot listen on " + where +
                        ": the port is in use (another job, or another service of this one: set "
                        "LOCKSTEP_MASTER_PORT to a free port for lockstep)");
    }
    throw ConfigError("lockstep: node 0 cannot listen on " + where + " (" + error_text(error) +
                      "): MASTER_ADDR must be an address of node 0 that the other nodes reach");
  }
}

Server::~Server() = default;

void Server::drop(int id, const std::string& why) {
  auto found = peers_.find(id);
  if (found == peers_.end()) {
    return;
  }
  if (dropped_.size() < kMaxDropped) {
    dropped_.push_back(found->second.from + ": " + why);
  }
  peers_.erase(found);  // closes its connection
}

void Server::step(std::chrono::milliseconds limit, const OnHello& on_hello,
                  const std::function<void(int)>& on_lost) {
  std::vector<pollfd> fds{{fd_.get(), POLLIN, 0}};
  std::vector<int> ids{-1};
  for (const auto& [id, peer] : peers_) {
    fds.push_back({peer.fd.get(), POLLIN, 0});
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
  std::array<std::byte, 65536> buffer{};
  for (;;) {
    Peer& peer = peers_.at(id);
    const ssize_t got = ::recv(peer.fd.get(), buffer.data(), buffer.size(), 0);
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    }
    if (got <= 0) {
      if (peer.kept()) {
        peers_.erase(id);  // closes its connection
        on_lost(id);
      } else {
        drop(id, peer.stage == Stage::nonce ? "closed before it sent a hello"
                 : peer.stage == Stage::proof
                     ? "closed after node 0's proof of the secret: it could not prove "
                       "that it holds the job's secret (the nodes' secrets differ?)"
                     : "closed before it finished the join");
      }
      return;
    }
    if (peer.kept()) {
      continue;  // a joined node has nothing more to say: whatever it sends is ignored
    }
    std::span<const std::byte> input(buffer.data(), static_cast<std::size_t>(got));
    while (!input.empty()) {
      Peer& current = peers_.at(id);
      if (current.kept()) {
        break;
      }
      try {
        input = input.subspan(current.reader.feed(input));
      } catch (const wire::WireError& error) {
        if (current.stage == Stage::nonce) {
          // Anyone may learn this much: what node 0 speaks (a node of lockstep 0.2 sends its
          // hello first, larger than an opening may be).
          (void)send_once(
              current.fd.get(),
              wire::encode(wire::Refuse{"node 0 expects lockstep's authenticated join first "
                                        "(lockstep 0.3 or later on every node)"}));
        }
        drop(id, std::string("malformed: ") + error.what());
        return;
      }
      if (current.reader.complete() && !take_frame(id, current, on_hello)) {
        return;
      }
    }
  }
}

auth::Session Server::session(const Peer& peer) const {
  return auth::Session{std::as_bytes(std::span(secret_.data(), secret_.size())), peer.client,
                       peer.server};
}

bool Server::take_frame(int id, Peer& peer, const OnHello& on_hello) {
  const std::vector<std::byte> body(peer.reader.message().begin(), peer.reader.message().end());
  // A refusal before the peer proved the secret: unsealed (it says nothing about the job).
  auto refuse = [&](const std::string& reason) {
    (void)send_once(peer.fd.get(), wire::encode(wire::Refuse{reason}));
    drop(id, reason);
    return false;
  };
  switch (peer.stage) {
    case Stage::nonce: {
      if (body.size() != kAuthMagic.size() + auth::kNonce ||
          !std::equal(kAuthMagic.begin(), kAuthMagic.end(), body.begin())) {
        return refuse(
            "it did not open lockstep's authenticated join (a node of lockstep 0.2 or "
            "older, or not lockstep)");
      }
      std::copy(body.begin() + kAuthMagic.size(), body.end(), peer.client.begin());
      peer.server = auth::fresh_nonce();
      const auth::Mac proof = session(peer).proof(kNodeZeroRole);
      std::vector<std::byte> answer(kAuthMagic.begin(), kAuthMagic.end());
      answer.insert(answer.end(), peer.server.begin(), peer.server.end());
      answer.insert(answer.end(), proof.begin(), proof.end());
      if (!send_once(peer.fd.get(), answer)) {
        drop(id, "could not take node 0's 72-byte challenge");
        return false;
      }
      peer.stage = Stage::proof;
      peer.reader = FrameReader{kMaxUnauthenticatedFrame};
      return true;
    }
    case Stage::proof:
      if (!auth::same(session(peer).proof(kNodeRole), body)) {
        return refuse(
            "it could not prove that it holds the job's secret (the nodes' secrets "
            "differ: LOCKSTEP_SECRET, LOCKSTEP_SECRET_FILE or ~/.config/lockstep/secret)");
      }
      peer.stage = Stage::hello;
      peer.reader = FrameReader{kMaxFrame};
      return true;
    case Stage::hello: {
      const auto message = unsealed(session(peer), kHelloSeal, body);
      if (!message) {
        drop(id, "its hello's seal is wrong (changed on the way?)");
        return false;
      }
      Verdict verdict = on_hello(id, *message, peer.from);
      if (verdict.keep) {
        Peer& kept = peers_.at(id);
        kept.stage = Stage::kept;
        kept.reader = FrameReader{};
        return true;
      }
      (void)send_once(peer.fd.get(), sealed(session(peer), kAnswerSeal, verdict.reply));
      peers_.erase(id);  // closes its connection
      return false;
    }
    case Stage::kept:
      break;
  }
  return true;
}

// Idle connections: a hello is sent at once after connecting.
void Server::drop_idle(Clock::time_point now) {
  std::vector<int> idle;
  for (const auto& [id, peer] : peers_) {
    if (!peer.kept() && now - peer.since > kHelloBound) {
      idle.push_back(id);
    }
  }
  for (int id : idle) {
    drop(id, "did not finish the join within 10 s");
  }
}

void Server::accept_new(Clock::time_point now) {
  for (;;) {
    sockaddr_storage from{};
    socklen_t from_length = sizeof from;
    UniqueFd fd(::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&from), &from_length,
                          SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      return;  // none left (or a connection that went away meanwhile)
    }
    Peer peer;
    peer.fd = std::move(fd);
    peer.from = describe(from, from_length);
    peer.since = now;
    peers_.emplace(next_id_++, std::move(peer));
    // Too many waiting for their hello: the oldest goes (a joining leader sends its hello at
    // once, and connects again if it was dropped).
    std::size_t pending = 0;
    int oldest = -1;
    for (const auto& [id, waiting] : peers_) {
      if (!waiting.kept()) {
        ++pending;
        oldest = oldest < 0 ? id : oldest;
      }
    }
    if (pending > kMaxPending) {
      drop(oldest, "one connection too many waiting for its hello");
    }
  }
}

UniqueFd Server::take_link(int id, std::chrono::milliseconds timeout) {
  auto found = peers_.find(id);
  if (found == peers_.end() || !found->second.kept()) {
    return {};
  }
  UniqueFd fd = std::move(found->second.fd);
  peers_.erase(found);
  make_link(fd.get(), timeout);
  return fd;
}

void make_link(int fd, std::chrono::milliseconds timeout) {
  const int on = 1;
  const int probe = static_cast<int>(kLinkProbe.count());
  const int probes = std::max(1, static_cast<int>(timeout / kLinkProbe));
  const auto user_timeout =
      static_cast<unsigned>(std::max(timeout, std::chrono::milliseconds(kLinkProbe)).count());
  if (::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &probe, sizeof probe) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &probe, sizeof probe) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout) != 0) {
    throw_errno("lockstep: the link between the nodes' main processes", "setsockopt");
  }
}

LinkState look_at_link(int fd, int* error) {
  pollfd entry{fd, POLLIN, 0};
  if (::poll(&entry, 1, 0) <= 0) {
    return LinkState::fine;
  }
  int pending = 0;
  socklen_t size = sizeof pending;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &pending, &size) == 0 && pending != 0) {
    *error = pending;
    return LinkState::broken;
  }
  std::byte byte{};
  const ssize_t got = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (got == 0) {
    return LinkState::ended;
  }
  if (got < 0 && errno != EAGAIN && errno != EINTR) {
    *error = errno;
    return LinkState::broken;
  }
  return LinkState::fine;  // nothing is sent on a link: a byte there is ignored
}

bool Server::send(int id, std::span<const std::byte> message, Clock::time_point deadline) {
  auto found = peers_.find(id);
  return found != peers_.end() &&
         write_all(found->second.fd.get(),
                   frame(sealed(session(found->second), kAnswerSeal, message)), deadline);
}

namespace {

// Reads one frame of at most `limit` bytes by `deadline`; empty (with `last_error`) when the
// connection closes or the deadline passes first.
std::optional<std::vector<std::byte>> read_frame(int fd, std::size_t limit,
                                                 Clock::time_point deadline,
                                                 std::string& last_error) {
  FrameReader reader(limit);
  std::byte byte{};
  // One byte at a time: what follows the frame (nothing, in this exchange) stays unread.
  while (!reader.complete()) {
    if (!await(fd, POLLIN, deadline)) {
      last_error = "node 0 accepted the connection but had not answered";
      return std::nullopt;
    }
    const ssize_t got = ::recv(fd, &byte, 1, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) {
      continue;
    }
    if (got <= 0) {
      last_error = "node 0 closed the connection without an answer";
      return std::nullopt;
    }
    (void)reader.feed({&byte, 1});
  }
  return std::vector<std::byte>(reader.message().begin(), reader.message().end());
}

// A refusal that node 0 sent without a seal (before it could trust this node): its reason.
std::optional<std::string> plain_refusal(std::span<const std::byte> message) {
  try {
    wire::Message decoded = wire::decode(message);
    if (const auto* refusal = std::get_if<wire::Refuse>(&decoded)) {
      return refusal->reason;
    }
  } catch (const wire::WireError&) {
  }
  return std::nullopt;
}

// One join over the connected socket `fd`: empty when it should be tried again.
std::optional<std::vector<std::byte>> join_over(int fd, std::span<const std::byte> hello,
                                                const Credentials& credentials,
                                                Clock::time_point deadline,
                                                std::string& last_error) {
  auth::Session session{
      std::as_bytes(std::span(credentials.secret.data(), credentials.secret.size())),
      auth::fresh_nonce(),
      {}};
  std::vector<std::byte> opening(kAuthMagic.begin(), kAuthMagic.end());
  opening.insert(opening.end(), session.client.begin(), session.client.end());
  if (!write_all(fd, frame(opening), deadline)) {
    last_error = "sending the join's nonce failed";
    return std::nullopt;
  }
  auto challenge = read_frame(fd, kMaxFrame, deadline, last_error);
  if (!challenge) {
    return std::nullopt;
  }
  if (challenge->size() != kAuthMagic.size() + auth::kNonce + auth::kMac ||
      !std::equal(kAuthMagic.begin(), kAuthMagic.end(), challenge->begin())) {
    if (auto reason = plain_refusal(*challenge)) {
      throw AuthError("it refused this node: " + *reason);
    }
    throw wire::WireError("its answer to the join's nonce is not lockstep 0.3's");
  }
  std::copy_n(challenge->begin() + kAuthMagic.size(), auth::kNonce, session.server.begin());
  if (!auth::same(session.proof(kNodeZeroRole), std::span(*challenge).last(auth::kMac))) {
    throw AuthError(
        "what answers there could not prove that it holds this job's secret (this "
        "node's secret comes from " +
        credentials.source +
        "): the nodes hold different secrets, or another program holds the port");
  }
  const auth::Mac proof = session.proof(kNodeRole);
  std::vector<std::byte> out = frame(proof);
  const auto hello_frame = frame(sealed(session, kHelloSeal, hello));
  out.insert(out.end(), hello_frame.begin(), hello_frame.end());
  if (!write_all(fd, out, deadline)) {
    last_error = "sending the hello failed";
    return std::nullopt;
  }
  auto answer = read_frame(fd, kMaxFrame, deadline, last_error);
  if (!answer) {
    return std::nullopt;
  }
  if (auto message = unsealed(session, kAnswerSeal, *answer)) {
    return std::vector<std::byte>(message->begin(), message->end());
  }
  if (auto reason = plain_refusal(*answer)) {
    throw AuthError("it refused this node: " + *reason + " (this node's secret comes from " +
                    credentials.source + ")");
  }
  throw AuthError("its answer carries a wrong seal (changed on the way?)");
}

}  // namespace

std::optional<std::vector<std::byte>> exchange(const sockaddr_storage& address, socklen_t length,
                                               std::span<const std::byte> hello,
                                               const Credentials& credentials,
                                               Clock::time_point deadline, std::string& last_error,
                                               UniqueFd* link,
                                               std::chrono::milliseconds link_timeout) {
  while (Clock::now() < deadline) {
    check_interrupt("lockstep: joining the job (connecting to node 0)");
    const auto retry_at = Clock::now() + kRetryDelay;
    UniqueFd owned(::socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!owned) {
      throw_errno("lockstep: connecting to node 0", "socket");
    }
    const int fd = owned.get();
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
    } else {
      std::optional<std::vector<std::byte>> answer =
          join_over(fd, hello, credentials, deadline, last_error);
      if (answer) {
        if (link != nullptr) {
          make_link(fd, link_timeout);
          *link = std::move(owned);
        }
        return answer;
      }
    }
    owned.reset();  // before the wait: a refused connection holds nothing
    std::this_thread::sleep_until(std::min(retry_at, deadline));
  }
  return std::nullopt;
}

}  // namespace lockstep::detail::rendezvous
