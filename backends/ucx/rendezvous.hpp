// The leaders' rendezvous on MASTER_ADDR and the port beside MASTER_PORT (or
// LOCKSTEP_MASTER_PORT): lockstep's own small TCP exchange
// (internal).
//
// Node 0's leader listens; every other leader connects, proves that it holds the job's secret
// (auth.hpp), sends one hello and reads one answer (node 0's welcome, with every leader's UCX
// worker address, or a refusal). Then the leaders connect to each other by worker address. UCX's
// own connection manager never listens on the port: it cannot be hardened from outside (UCX 1.13
// aborts the process on one crafted packet), and nothing a peer sends reaches UCX (or the wire
// decoder) before the peer has proved the secret.
//
// Frames: a 4-byte little-endian length, then the body. The exchange: the node's nonce
// ("LSA1" + 32 bytes); node 0's nonce and proof ("LSA1" + 32 + 32); the node's proof (32); the
// hello (a wire message) and its seal (32); node 0's answer and its seal. Everything node 0 reads
// is bounded: before the node's proof, 64 bytes a frame (so 64 unauthenticated connections make
// node 0 hold at most 64 x 64 KiB of receive buffer and 4 KiB of frames); the connections it keeps
// waiting; 10 s to finish. A connection that breaks a bound or fails a check is closed.
#pragma once

#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/unique_fd.hpp"
#include "ucx/auth.hpp"

namespace lockstep::detail::rendezvous {

using Clock = std::chrono::steady_clock;

inline constexpr std::size_t kMaxFrame = 16u << 20;  // a hello of 2^20 processes fits
inline constexpr std::size_t kMaxPending = 64;       // connections yet to send their hello
inline constexpr auto kHelloBound = std::chrono::seconds(10);  // to send it, once connected
inline constexpr std::size_t kMaxUnauthenticatedFrame = 64;    // before the node's proof

// A message as a frame.
std::vector<std::byte> frame(std::span<const std::byte> message);

// Gathers one frame from a byte stream.
class FrameReader {
 public:
  explicit FrameReader(std::size_t limit = kMaxFrame) : limit_(limit) {}
  // Takes bytes from the front of `input`, up to the end of the frame; returns how many.
  // Throws wire::WireError for a length of 0 or over the limit.
  std::size_t feed(std::span<const std::byte> input);
  [[nodiscard]] bool complete() const noexcept { return have_ == 4 && body_.size() == length_; }
  [[nodiscard]] std::span<const std::byte> message() const noexcept { return body_; }

 private:
  std::size_t limit_;
  std::array<std::byte, 4> prefix_{};
  std::size_t have_ = 0;  // prefix bytes read
  std::size_t length_ = 0;
  std::vector<std::byte> body_;
};

// What node 0 does with a hello: keep the connection (the node joined; the welcome follows), or
// answer with `reply` (a refusal) and close it.
struct Verdict {
  bool keep = false;
  std::vector<std::byte> reply;  // a wire message, sent framed
};

// Node 0's side.
class Server {
 public:
  // Listens on `address`; throws ConfigError naming `where` when it cannot. Joining nodes must
  // prove `secret`.
  Server(const sockaddr_storage& address, socklen_t length, const std::string& where,
         std::string secret);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Waits up to `limit` for connections and bytes. Calls on_hello(id, message, from) for each
  // authenticated connection's hello (`from`: the peer's address), and on_lost(id) when a kept
  // connection closes; on_hello's verdict decides what happens to the connection.
  void step(std::chrono::milliseconds limit,
            const std::function<Verdict(int id, std::span<const std::byte> message,
                                        const std::string& from)>& on_hello,
            const std::function<void(int id)>& on_lost);
  // Sends `message`, sealed and framed, on kept connection `id` by `deadline`; false if it could
  // not.
  bool send(int id, std::span<const std::byte> message, Clock::time_point deadline);
  // Hands kept connection `id` to the caller as a link (make_link with `timeout`), or -1 if it
  // is gone.
  UniqueFd take_link(int id, std::chrono::milliseconds timeout);
  // The connections that were closed for breaking a bound (malformed, idle, too many), with why.
  [[nodiscard]] const std::vector<std::string>& dropped() const noexcept { return dropped_; }

 private:
  enum class Stage { nonce, proof, hello, kept };
  struct Peer {
    UniqueFd fd;
    std::string from;
    FrameReader reader{kMaxUnauthenticatedFrame};
    Clock::time_point since;
    Stage stage = Stage::nonce;
    auth::Nonce client{};
    auth::Nonce server{};
    [[nodiscard]] bool kept() const noexcept { return stage == Stage::kept; }
  };
  using OnHello = std::function<Verdict(int, std::span<const std::byte>, const std::string&)>;
  void drop(int id, const std::string& why);
  // Reads what connection `id` sent (step's three parts, in order).
  void read_peer(int id, const OnHello& on_hello, const std::function<void(int)>& on_lost);
  // One complete frame of a connection not yet kept; false when the connection was closed.
  bool take_frame(int id, Peer& peer, const OnHello& on_hello);
  [[nodiscard]] auth::Session session(const Peer& peer) const;
  void drop_idle(Clock::time_point now);
  void accept_new(Clock::time_point now);

  UniqueFd fd_;
  std::string secret_;
  int next_id_ = 0;
  std::map<int, Peer> peers_;
  std::vector<std::string> dropped_;
};

// Links: after the join, each node keeps its rendezvous connection to node 0 open for the job's
// life, and the kernel watches it (keepalive probes every kLinkProbe, TCP_USER_TIMEOUT the
// job's link timeout, LOCKSTEP_LINK_TIMEOUT: 5 s by default): a node that the network no longer
// reaches is noticed within that time, whatever the processes do (a busy or stopped process's
// kernel still answers), where UCX's own connections would retransmit for a quarter of an hour.
// After the join's last step (ucx_join.cpp: the node's "took the welcome", node 0's "wire up"),
// nothing is sent on a link but the leaders' desks' questions and answers (places.hpp).
inline constexpr auto kLinkProbe = std::chrono::seconds(1);
// Waits until `fd` is ready for `events` or `deadline` passes; false then (or when poll fails).
// Throws InterruptedError naming `what` when the interrupt descriptor says so (asked every
// 100 ms at most).
bool await(int fd, short events, Clock::time_point deadline,
           const std::string& what = "lockstep: joining the job (connecting to node 0)");
// Sends all of `bytes` on the socket `fd` by `deadline` (never blocking past it); false if the
// connection fails or stays full. `interruptible`: waits as await does (the join's); else
// without looking at the interrupt descriptor (a thread of its own: places.hpp).
bool send_all(int fd, std::span<const std::byte> bytes, Clock::time_point deadline,
              bool interruptible);
// Sets a connection's keepalive and user timeout (`timeout`, at least kLinkProbe); SystemError
// if the kernel refuses.
void make_link(int fd, std::chrono::milliseconds timeout);
// What became of a link: fine (nothing to say); ended (the other side closed it, in order: its
// process exited, which the backend learns from UCX too); or broken (an error: `*error` says
// which, ETIMEDOUT when the network stopped answering).
enum class LinkState { fine, ended, broken };
LinkState look_at_link(int fd, int* error);

// What a joining node throws when node 0 cannot prove the secret, or refuses this node's proof:
// the message says which (the caller adds where node 0 is).
class AuthError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The secret a node proves, and where it came from (for messages).
struct Credentials {
  std::string secret;
  std::string source;
};

// A joining leader's side: connects to node 0 (again every 100 ms while nobody listens there,
// or the connection breaks before an answer), proves the secret, checks node 0's proof, sends
// `hello` and returns node 0's answer (its seal checked). Empty when `deadline` passes first;
// then `last_error` says what happened last. ConfigError, at once, when what answers cannot
// prove the secret or refuses this node's proof. With `link`, the connection stays open as the
// node's link to node 0 (see make_link, with `link_timeout`) and *link is its descriptor.
std::optional<std::vector<std::byte>> exchange(
    const sockaddr_storage& address, socklen_t length, std::span<const std::byte> hello,
    const Credentials& credentials, Clock::time_point deadline, std::string& last_error,
    UniqueFd* link = nullptr, std::chrono::milliseconds link_timeout = std::chrono::seconds(5));

}  // namespace lockstep::detail::rendezvous
