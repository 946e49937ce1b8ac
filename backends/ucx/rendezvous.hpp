// The leaders' rendezvous on MASTER_ADDR:MASTER_PORT: lockstep's own small TCP exchange
// (internal).
//
// Node 0's leader listens; every other leader connects, sends one hello and reads one answer
// (node 0's welcome, with every leader's UCX worker address, or a refusal). Then the leaders
// connect to each other by worker address. UCX's own connection manager never listens on the
// port: it cannot be hardened from outside (UCX 1.13 aborts the process on one crafted packet).
//
// Each side sends one frame: a 4-byte little-endian length, then one wire message (wire.hpp).
// Everything node 0 reads is bounded: a frame's length, the connections it keeps waiting for a
// hello and how long it waits for one; a connection that breaks any bound is closed.
#pragma once

#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace lockstep::detail::rendezvous {

using Clock = std::chrono::steady_clock;

inline constexpr std::size_t kMaxFrame = 16u << 20;  // a hello of 2^20 processes fits
inline constexpr std::size_t kMaxPending = 64;       // connections yet to send their hello
inline constexpr auto kHelloBound = std::chrono::seconds(10);  // to send it, once connected

// A message as a frame.
std::vector<std::byte> frame(std::span<const std::byte> message);

// Gathers one frame from a byte stream.
class FrameReader {
 public:
  // Takes bytes from the front of `input`, up to the end of the frame; returns how many.
  // Throws wire::WireError for a length of 0 or over kMaxFrame.
  std::size_t feed(std::span<const std::byte> input);
  [[nodiscard]] bool complete() const noexcept { return have_ == 4 && body_.size() == length_; }
  [[nodiscard]] std::span<const std::byte> message() const noexcept { return body_; }

 private:
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
  // Listens on `address`; throws ConfigError naming `where` when it cannot.
  Server(const sockaddr_storage& address, socklen_t length, const std::string& where);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Waits up to `limit` for connections and bytes. Calls on_hello(id, message, from) for each
  // connection's first complete frame (`from`: the peer's address), and on_lost(id) when a
  // kept connection closes; on_hello's verdict decides what happens to the connection.
  void step(std::chrono::milliseconds limit,
            const std::function<Verdict(int id, std::span<const std::byte> message,
                                        const std::string& from)>& on_hello,
            const std::function<void(int id)>& on_lost);
  // Sends `message`, framed, on kept connection `id` by `deadline`; false if it could not.
  bool send(int id, std::span<const std::byte> message, Clock::time_point deadline);
  // The connections that were closed for breaking a bound (malformed, idle, too many), with why.
  [[nodiscard]] const std::vector<std::string>& dropped() const noexcept { return dropped_; }

 private:
  struct Peer {
    int fd = -1;
    std::string from;
    FrameReader reader;
    Clock::time_point since;
    bool kept = false;
  };
  using OnHello = std::function<Verdict(int, std::span<const std::byte>, const std::string&)>;
  void drop(int id, const std::string& why);
  // Reads what connection `id` sent (step's three parts, in order).
  void read_peer(int id, const OnHello& on_hello, const std::function<void(int)>& on_lost);
  void drop_idle(Clock::time_point now);
  void accept_new(Clock::time_point now);

  int fd_ = -1;
  int next_id_ = 0;
  std::map<int, Peer> peers_;
  std::vector<std::string> dropped_;
};

// A joining leader's side: connects to node 0 (again every 100 ms while nobody listens there,
// or the connection breaks before an answer), sends `hello` and returns node 0's answer.
// Empty when `deadline` passes first; then `last_error` says what happened last.
std::optional<std::vector<std::byte>> exchange(const sockaddr_storage& address, socklen_t length,
                                               std::span<const std::byte> hello,
                                               Clock::time_point deadline, std::string& last_error);

}  // namespace lockstep::detail::rendezvous
