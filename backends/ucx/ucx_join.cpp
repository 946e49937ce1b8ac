// The UCX backend's join: node 0 serves the rendezvous (rendezvous.hpp) and welcomes the other
// leaders; the others connect to it and read the welcome; then every leader connects to every
// other by UCX worker address.
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <random>

#include "base/bytes.hpp"
#include "base/fault_points.hpp"
#include "base/proc.hpp"
#include "base/text.hpp"
#include "job/job_secret.hpp"
#include "lockstep/error.hpp"
#include "ucx/ucx_backend.hpp"
#include "waiting/wait_controls.hpp"

namespace lockstep::detail::ucx {
namespace {

// What a UCX worker address can be: UCX 1.13's packed addresses hold a header and at least one
// transport's entry (hundreds of bytes on tcp and shared memory); none comes near 1 MiB.
constexpr std::size_t kMinWorkerAddress = 16;
constexpr std::size_t kMaxWorkerAddress = 1u << 20;

// The join's last step, on the links: each node says that it took node 0's welcome,
// and node 0, once every node has, says to wire up. No leader makes a UCX endpoint to another
// before then, so a node that fails before the mesh (a welcome it cannot take, Ctrl-C, its join
// timeout) destroys a worker that no peer is wiring up to: UCX 1.13 could abort the process (an
// assertion in ucp_worker_destroy) when a peer's wire-up raced that.
constexpr std::byte kTookWelcome{0x57};  // a node's "W": it took the welcome
constexpr std::byte kWireUp{0x47};       // node 0's "G": every node took it
// Node 0's "X", then the lost node's main process index (4 bytes, little-endian): a node could
// not join, and the job cannot form.
constexpr std::byte kGaveUp{0x58};

enum class Mark { got, closed, timed_out };

// Reads `out.size()` bytes from link `fd` by `deadline` (rendezvous::await: an interrupt is
// looked for, naming `what`). closed: the connection ended (*error 0) or broke (*error: errno)
// first.
Mark read_link(int fd, std::span<std::byte> out, Clock::time_point deadline,
               const std::string& what, int& error) {
  std::size_t have = 0;
  while (have < out.size()) {
    if (!rendezvous::await(fd, POLLIN, deadline, what)) {
      if (Clock::now() >= deadline) {
        return Mark::timed_out;
      }
      error = errno;
      return Mark::closed;
    }
    const ssize_t got = ::recv(fd, out.data() + have, out.size() - have, MSG_DONTWAIT);
    if (got > 0) {
      have += static_cast<std::size_t>(got);
    } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
      error = got == 0 ? 0 : errno;
      return Mark::closed;
    }
  }
  return Mark::got;
}

bool send_link(int fd, std::span<const std::byte> bytes) {
  return fd >= 0 && ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
                        static_cast<ssize_t>(bytes.size());
}

std::string closed_text(int error) {
  return error == 0 ? "its connection ended" : "its connection failed: " + error_text(error);
}

// Node 0's rendezvous address, with the variable its port came from.
std::string where(const JobConfig& job) {
  return job.master_addr + ":" + std::to_string(job.rendezvous_port) + " (" +
         job.rendezvous_port_source + ")";
}
// MASTER_ADDR and lockstep's port as a socket address (the first that resolves).
sockaddr_storage master_address(const JobConfig& job, socklen_t& length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(job.rendezvous_port);
  if (int rc = ::getaddrinfo(job.master_addr.c_str(), port.c_str(), &hints, &found); rc != 0) {
    throw ConfigError("lockstep: MASTER_ADDR=" + job.master_addr +
                      ": cannot resolve the address of node 0: " + ::gai_strerror(rc));
  }
  sockaddr_storage address{};
  length = found->ai_addrlen;
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  return address;
}

}  // namespace

std::string hello_refusal(const wire::Hello& hello, const JobConfig& job,
                          const std::vector<NodeInfo>& joined) {
  const int num_nodes = job.num_nodes;
  if (hello.identity != job.identity) {
    return "it belongs to another job ('" + hello.identity + "', not '" + job.identity +
           "'): give every node the same LOCKSTEP_JOB_ID (lockstep-run --job-id)";
  }
  if (hello.num_nodes != static_cast<std::uint32_t>(num_nodes) ||
      hello.world_size != static_cast<std::uint32_t>(job.world_size)) {
    return "it describes a job of " + std::to_string(hello.world_size) + " processes on " +
           std::to_string(hello.num_nodes) + " nodes, node 0 one of " +
           std::to_string(job.world_size) + " on " + std::to_string(num_nodes);
  }
  if (hello.node == 0 || hello.node >= static_cast<std::uint32_t>(num_nodes)) {
    return "node index " + std::to_string(hello.node) + " is not one of 1.." +
           std::to_string(num_nodes - 1);
  }
  if (std::any_of(joined.begin(), joined.end(), [&](const NodeInfo& node) {
        return node.node == static_cast<int>(hello.node);
      })) {
    return "node " + std::to_string(hello.node) + " has already joined";
  }
  // UCX asserts (and aborts) on a malformed worker address: check what can be checked. (Only an
  // authenticated node gets here; this guards against a broken one.)
  if (hello.address.size() < kMinWorkerAddress || hello.address.size() > kMaxWorkerAddress) {
    return "its UCX worker address has " + std::to_string(hello.address.size()) +
           " bytes (UCX's are " + std::to_string(kMinWorkerAddress) + " to " +
           std::to_string(kMaxWorkerAddress) + ")";
  }
  if (hello.ranks.empty()) {
    return "it lists no processes";
  }
  for (auto rank : hello.ranks) {
    if (rank < 0 || rank >= job.world_size) {
      return "process index " + std::to_string(rank) + " is outside the job";
    }
    for (const auto& node : joined) {
      if (std::find(node.ranks.begin(), node.ranks.end(), rank) != node.ranks.end()) {
        return "process " + std::to_string(rank) + " is already on node " +
               std::to_string(node.node);
      }
    }
  }
  return {};
}

void UcxBackend::serve() {
  const JobConfig& job = config_.job;
  std::random_device random;
  // Never 0, which no message carries by accident.
  take_token(((static_cast<std::uint64_t>(random()) << 32) ^ random()) | 1);

  socklen_t length = 0;
  const sockaddr_storage address = master_address(job, length);
  rendezvous::Server server(address, length, where(job),
                            load_job_secret(process_environment()).bytes);
  joiners_.assign(static_cast<std::size_t>(num_nodes_), -1);
  addresses_.assign(static_cast<std::size_t>(num_nodes_), {});
  addresses_[0] = address_;
  marks_.assign(static_cast<std::size_t>(num_nodes_), {});
  marks_[0] = this_process_mark();
  nodes_.push_back(NodeInfo{0, config_.ranks});
  const auto on_hello = [this](int id, std::span<const std::byte> bytes, const std::string& from) {
    return take_hello(id, bytes, from);
  };
  const auto on_lost = [this](int id) { forget_joiner(id); };
  while (nodes_.size() != static_cast<std::size_t>(num_nodes_)) {
    if (Clock::now() >= config_.deadline) {
      throw_serve_timeout(server.dropped());
    }
    check_interrupt("lockstep: joining the job (node 0, waiting for the other nodes)");
    server.step(std::min(kSleepSlice, std::chrono::ceil<std::chrono::milliseconds>(
                                          config_.deadline - Clock::now())),
                on_hello, on_lost);
    if (shape_refusal_) {
      throw ConfigError("lockstep: joining the job: node 0 refused " + *shape_refusal_);
    }
  }
  std::sort(nodes_.begin(), nodes_.end(),
            [](const NodeInfo& a, const NodeInfo& b) { return a.node < b.node; });
  wire::Welcome welcome;
  welcome.token = token_;
  for (const auto& node : nodes_) {
    welcome.nodes.push_back(wire::NodeEntry{static_cast<std::uint32_t>(node.node),
                                            {node.ranks.begin(), node.ranks.end()},
                                            addresses_[static_cast<std::size_t>(node.node)],
                                            marks_[static_cast<std::size_t>(node.node)]});
  }
  const auto bytes = wire::encode(welcome);
  links_ = std::vector<UniqueFd>(static_cast<std::size_t>(num_nodes_));
  for (int node = 1; node < num_nodes_; ++node) {
    // A node that cannot take the welcome fails its own join; the others find it gone.
    const int joiner = joiners_[static_cast<std::size_t>(node)];
    (void)server.send(joiner, bytes, std::max(config_.deadline, Clock::now() + kCloseBound));
    links_[static_cast<std::size_t>(node)] = server.take_link(joiner, config_.job.link_timeout);
  }
  await_welcome_taken();
  joined_ = true;
  open_desk();
  // The server goes: nobody else may join, and the port is free again.
}

rendezvous::Verdict UcxBackend::take_hello(int id, std::span<const std::byte> bytes,
                                           const std::string& from) {
  std::string reason;
  std::optional<wire::Hello> hello;
  try {
    wire::Message message = wire::decode(bytes);
    if (auto* decoded = std::get_if<wire::Hello>(&message)) {
      hello = std::move(*decoded);
    } else {
      reason = "it sent a lockstep message that is not a hello";
    }
  } catch (const wire::WireError& error) {
    reason = std::string("it sent no lockstep hello (") + error.what() + ")";
  }
  if (hello) {
    reason = hello_refusal(*hello, config_.job, nodes_);
  }
  if (reason.empty()) {
    joiners_[hello->node] = id;
    NodeInfo info{static_cast<int>(hello->node), {hello->ranks.begin(), hello->ranks.end()}};
    std::sort(info.ranks.begin(), info.ranks.end());
    nodes_.push_back(std::move(info));
    addresses_[hello->node] = hello->address;
    marks_[hello->node] = hello->process;
    refusals_.erase(static_cast<int>(hello->node));
    return rendezvous::Verdict{true, {}};
  }
  const std::string node = hello ? "node " + std::to_string(hello->node) : "a connection";
  if (hello && hello->node < static_cast<std::uint32_t>(num_nodes_)) {
    refusals_[static_cast<int>(hello->node)] =
        "connected from " + from + " and was refused: " + reason;
  }
  if (hello && hello->identity == config_.job.identity &&
      (hello->num_nodes != static_cast<std::uint32_t>(num_nodes_) ||
       hello->world_size != static_cast<std::uint32_t>(config_.job.world_size))) {
    // A node of this very job (it proved the secret and gave the identity) that disagrees on the
    // shape: the job can never form, and waiting out the join timeout would only hide why.
    shape_refusal_ = node + " (from " + from + ") " + reason +
                     ": start every node with the same --nnodes and --nproc-per-node";
  }
  (void)std::fprintf(stderr, "lockstep: node 0 refused a connection on %s from %s: %s: %s\n",
                     where(config_.job).c_str(), from.c_str(), node.c_str(), reason.c_str());
  return rendezvous::Verdict{false, wire::encode(wire::Refuse{node + ": " + reason})};
}

void UcxBackend::forget_joiner(int id) {
  // A node that died or hung up before everyone joined may come back: forget it.
  for (int node = 1; node < num_nodes_; ++node) {
    if (joiners_[static_cast<std::size_t>(node)] == id) {
      joiners_[static_cast<std::size_t>(node)] = -1;
      std::erase_if(nodes_, [&](const NodeInfo& info) { return info.node == node; });
    }
  }
}

void UcxBackend::await_welcome_taken() {
  for (int node = 1; node < num_nodes_; ++node) {
    const int link = links_[static_cast<std::size_t>(node)].get();
    int error = 0;
    std::byte mark{};
    Mark got = link < 0 ? Mark::closed
                        : read_link(link, {&mark, 1}, config_.deadline,
                                    "lockstep: joining the job (node 0, waiting for node " +
                                        std::to_string(node) + " to take its welcome)",
                                    error);
    if (got == Mark::got && mark != kTookWelcome) {
      got = Mark::closed;
      error = EPROTO;
    }
    if (got != Mark::got) {
      give_up_join(node, got == Mark::timed_out, error);
    }
  }
  for (int node = 1; node < num_nodes_; ++node) {
    if (!send_link(links_[static_cast<std::size_t>(node)].get(), {&kWireUp, 1})) {
      give_up_join(node, false, errno);
    }
  }
}

void UcxBackend::give_up_join(int node, bool timed_out, int error) {
  const int leader = nodes_[static_cast<std::size_t>(node)].ranks.front();
  // The other nodes wait for node 0's word: they learn which node could not join.
  ByteWriter w;
  w.u8(std::to_integer<std::uint8_t>(kGaveUp));
  w.u32(static_cast<std::uint32_t>(leader));
  const std::vector<std::byte> word = w.take();
  for (int other = 1; other < num_nodes_; ++other) {
    if (other != node) {
      (void)send_link(links_[static_cast<std::size_t>(other)].get(), word);
    }
  }
  const std::string whom =
      "node " + std::to_string(node) + "'s main process (process " + std::to_string(leader) + ")";
  if (timed_out) {
    throw TimeoutError("lockstep: joining the job timed out (LOCKSTEP_JOIN_TIMEOUT): " + whom +
                           " did not say that it took node 0's welcome",
                       nodes_[static_cast<std::size_t>(node)].ranks);
  }
  throw PeerLostError("lockstep: joining the job: " + whom + " left after node 0's welcome (" +
                          closed_text(error) + "): it could not join; see that node's error",
                      leader);
}

void UcxBackend::await_wire_up() {
  const std::string from = "node 0's main process at " + where(config_.job);
  int error = 0;
  std::byte mark{};
  Mark got = send_link(links_[0].get(), {&kTookWelcome, 1}) ? Mark::got : Mark::closed;
  if (got == Mark::got) {
    got = read_link(links_[0].get(), {&mark, 1}, config_.deadline,
                    "lockstep: joining the job (node " + std::to_string(me_) +
                        ", waiting for node 0's word that every node took its welcome)",
                    error);
  } else {
    error = errno;
  }
  if (got == Mark::got && mark == kWireUp) {
    return;
  }
  std::array<std::byte, 4> lost{};
  if (got == Mark::got && mark == kGaveUp &&
      read_link(links_[0].get(), lost, config_.deadline, "lockstep: joining the job", error) ==
          Mark::got) {
    const auto leader = ByteReader(lost).u32();
    const auto node = std::find_if(nodes_.begin(), nodes_.end(), [&](const NodeInfo& info) {
      return !info.ranks.empty() && info.ranks.front() == static_cast<int>(leader);
    });
    if (node != nodes_.end()) {
      throw PeerLostError("lockstep: joining the job: node " + std::to_string(node->node) +
                              "'s main process (process " + std::to_string(leader) +
                              ") could not join after node 0's welcome, and " + from +
                              " gave up the job; see that node's error",
                          static_cast<int>(leader));
    }
    got = Mark::closed;
    error = EPROTO;
  }
  if (got == Mark::timed_out) {
    throw TimeoutError("lockstep: joining the job timed out (LOCKSTEP_JOIN_TIMEOUT): node " +
                           std::to_string(me_) + " took the welcome of " + from +
                           ", which did not say that every other node took it",
                       {});
  }
  throw PeerLostError("lockstep: joining the job: " + from + " gave up after its welcome (" +
                          closed_text(got == Mark::got ? EPROTO : error) + ")",
                      nodes_.front().ranks.front());
}

void UcxBackend::throw_serve_timeout(const std::vector<std::string>& dropped) const {
  std::string why;
  for (int node = 1; node < num_nodes_; ++node) {
    if (joiners_[static_cast<std::size_t>(node)] < 0) {
      auto refused = refusals_.find(node);
      // In steps: "..." + std::string&& draws a false alarm from GCC 12 (see comma_list).
      why += why.empty() ? "node " : "; node ";
      why += std::to_string(node);
      why += ' ';
      why += refused != refusals_.end() ? refused->second : "never connected";
    }
  }
  if (!dropped.empty()) {
    // Connections that did not finish the join: a node holding another secret is among them.
    why += "; connections refused: ";
    for (std::size_t i = 0; i < dropped.size() && i < 4; ++i) {
      why += (i == 0 ? "" : "; ") + dropped[i];
    }
  }
  throw TimeoutError(
      "lockstep: joining the job timed out (LOCKSTEP_JOIN_TIMEOUT): node 0 "
      "listened on " +
          where(config_.job) + ", but " + why,
      {});
}

void UcxBackend::connect() {
  const JobConfig& job = config_.job;
  socklen_t server_length = 0;
  const sockaddr_storage server = master_address(job, server_length);

  wire::Hello hello;
  hello.identity = job.identity;
  hello.num_nodes = static_cast<std::uint32_t>(num_nodes_);
  hello.world_size = static_cast<std::uint32_t>(job.world_size);
  hello.node = static_cast<std::uint32_t>(me_);
  hello.ranks.assign(config_.ranks.begin(), config_.ranks.end());
  hello.address = address_;
  hello.process = this_process_mark();

  std::string last_error = "no answer";
  std::optional<wire::Message> answer;
  try {
    const JobSecret secret = load_job_secret(process_environment());
    links_ = std::vector<UniqueFd>(static_cast<std::size_t>(num_nodes_));
    auto bytes = rendezvous::exchange(server, server_length, wire::encode(hello),
                                      {secret.bytes, secret.source}, config_.deadline, last_error,
                                      &links_[0], config_.job.link_timeout);
    if (!bytes) {
      throw TimeoutError("lockstep: joining the job timed out (LOCKSTEP_JOIN_TIMEOUT): node " +
                             std::to_string(me_) + " could not join node 0's main process at " +
                             where(job) + " (last: " + last_error + ")",
                         {});
    }
    if (fault_fails("join.welcome-changed")) {
      bytes->front() ^= std::byte{0xff};  // a test's welcome changed on the way
    }
    answer = wire::decode(*bytes);
  } catch (const wire::WireError& error) {
    throw ConfigError(
        "lockstep: what answers at " + where(job) + " is not lockstep's node 0 (" + error.what() +
        "): is that port another program's? Set LOCKSTEP_MASTER_PORT to lockstep's own");
  } catch (const rendezvous::AuthError& error) {
    throw ConfigError("lockstep: node " + std::to_string(me_) + " joining node 0 at " + where(job) +
                      ": " + error.what());
  }
  if (const auto* refusal = std::get_if<wire::Refuse>(&*answer)) {
    throw ConfigError("lockstep: node 0's main process at " + where(job) + " refused node " +
                      std::to_string(me_) + ": " + refusal->reason);
  }
  if (std::get_if<wire::Welcome>(&*answer) == nullptr) {
    throw ConfigError("lockstep: node 0's main process at " + where(job) +
                      " answered with neither a welcome nor a refusal");
  }
  welcome_ = std::get<wire::Welcome>(std::move(*answer));

  check_welcome();
  take_token(welcome_->token);
  await_wire_up();
  joined_ = true;
  open_desk();
}

void UcxBackend::check_welcome() {
  const JobConfig& job = config_.job;
  const wire::Welcome& welcome = *welcome_;
  auto bad = [&](const std::string& why) {
    return Error("lockstep: node 0's main process at " + where(job) +
                 " sent a table of nodes that " + why);
  };
  if (welcome.nodes.size() != static_cast<std::size_t>(num_nodes_)) {
    throw bad("has " + std::to_string(welcome.nodes.size()) + " nodes, not " +
              std::to_string(num_nodes_));
  }
  std::vector<bool> seen(static_cast<std::size_t>(job.world_size), false);
  addresses_.assign(static_cast<std::size_t>(num_nodes_), {});
  marks_.assign(static_cast<std::size_t>(num_nodes_), {});
  for (std::size_t i = 0; i < welcome.nodes.size(); ++i) {
    const auto& entry = welcome.nodes[i];
    if (entry.node != i || entry.ranks.empty()) {
      throw bad("is out of order or lists an empty node");
    }
    NodeInfo info{static_cast<int>(i), {entry.ranks.begin(), entry.ranks.end()}};
    for (int rank : info.ranks) {
      if (rank < 0 || rank >= job.world_size || seen[static_cast<std::size_t>(rank)]) {
        throw bad("lists process " + std::to_string(rank) + " twice or outside the job");
      }
      seen[static_cast<std::size_t>(rank)] = true;
    }
    addresses_[i] = entry.address;
    marks_[i] = entry.process;
    nodes_.push_back(std::move(info));
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end()) {
    throw bad("leaves processes out");
  }
}

void UcxBackend::connect_mesh() {
  for (int node = 0; node < num_nodes_; ++node) {
    if (node == me_) {
      continue;
    }
    const auto& address = addresses_[static_cast<std::size_t>(node)];
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    members_[static_cast<std::size_t>(node)] = &add_endpoint(params, node);
  }
}

}  // namespace lockstep::detail::ucx
