// libFuzzer target: what node 0 reads from a node that has proved the job's secret (the
// authenticated hello). Node 0's real rendezvous server listens on loopback; each
// input is the hello that a joining node sends through the real client after the whole
// challenge-response, sealed as it should be, so that the input reaches what only an
// authenticated node can reach: the wire decoder and node 0's checks of a hello
// (ucx::hello_refusal), with two nodes already in. Node 0 refuses or takes the hello and answers;
// the client must always get that answer (never a hang, a crash, or a broken exchange).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "ucx/auth.hpp"
#include "ucx/rendezvous.hpp"
#include "ucx/ucx_backend.hpp"
#include "ucx/wire.hpp"

namespace {

namespace rendezvous = lockstep::detail::rendezvous;
namespace wire = lockstep::detail::wire;
using lockstep::detail::JobConfig;
using lockstep::detail::NodeInfo;

const std::string kSecret = "the join fuzzer's secret, long enough";

// Node 0 of a job of 4 nodes, 8 processes, with node 1 (ranks 2, 3) joined.
JobConfig node_zero_job() {
  JobConfig job;
  job.identity = "lockstep-run:fuzz@127.0.0.1:1";
  job.world_size = 8;
  job.num_nodes = 4;
  return job;
}

// Node 0's side, on a thread of its own for the fuzzer's life.
struct NodeZero {
  sockaddr_storage address{};
  socklen_t length = sizeof(sockaddr_in);
  std::unique_ptr<rendezvous::Server> server;
  std::atomic<bool> stop{false};
  std::thread thread;

  NodeZero() {
    auto* in = reinterpret_cast<sockaddr_in*>(&address);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // A free port: bound to port 0 and read back (then released for the server).
    const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t size = sizeof(sockaddr_in);
    if (probe < 0 || ::bind(probe, reinterpret_cast<sockaddr*>(in), size) != 0 ||
        ::getsockname(probe, reinterpret_cast<sockaddr*>(in), &size) != 0) {
      std::abort();
    }
    ::close(probe);
    // libcrypto initialises itself on its first use, keeping state per thread: done here, on the
    // main thread, as in a job (where a node joins on the thread that makes the State), so that
    // LeakSanitizer sees none of it held by the server's thread.
    (void)lockstep::detail::auth::mac(std::as_bytes(std::span(kSecret.data(), kSecret.size())), {});
    server = std::make_unique<rendezvous::Server>(address, length, "the fuzzer's port", kSecret);
    thread = std::thread([this] { serve(); });
  }
  ~NodeZero() {
    stop = true;
    thread.join();
  }
  NodeZero(const NodeZero&) = delete;
  NodeZero& operator=(const NodeZero&) = delete;

  void serve() {
    const JobConfig job = node_zero_job();
    const std::vector<NodeInfo> joined{{0, {0, 1}}, {1, {2, 3}}};
    const auto on_hello = [&](int, std::span<const std::byte> bytes, const std::string&) {
      std::string reason;
      try {
        wire::Message message = wire::decode(bytes);
        if (const auto* hello = std::get_if<wire::Hello>(&message)) {
          reason = lockstep::detail::ucx::hello_refusal(*hello, job, joined);
        } else {
          reason = "not a hello";
        }
      } catch (const wire::WireError& error) {
        reason = error.what();
      }
      // Taken or not, the connection is answered and closed: the next input joins anew.
      return rendezvous::Verdict{false,
                                 wire::encode(wire::Refuse{reason.empty() ? "taken" : reason})};
    };
    while (!stop) {
      server->step(std::chrono::milliseconds(5), on_hello, [](int) {});
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;  // an empty frame is malformed before any hello: the rendezvous fuzzer's part
  }
  static NodeZero node_zero;
  const std::span<const std::byte> hello(reinterpret_cast<const std::byte*>(data), size);
  std::string last_error;
  std::optional<std::vector<std::byte>> answer;
  try {
    answer = rendezvous::exchange(
        node_zero.address, node_zero.length, hello, {kSecret, "the fuzzer"},
        std::chrono::steady_clock::now() + std::chrono::seconds(5), last_error);
  } catch (const std::exception&) {
    std::abort();  // both sides hold the secret: the exchange itself must go through
  }
  if (!answer) {
    std::abort();  // node 0 never answered an authenticated node
  }
  // Node 0's answer is a refusal it encoded: the decoder takes it.
  if (!std::holds_alternative<wire::Refuse>(wire::decode(*answer))) {
    std::abort();
  }
  return 0;
}
