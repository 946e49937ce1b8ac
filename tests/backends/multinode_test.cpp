// Jobs of several nodes, simulated on this machine: each node is its own lockstep-run (its own
// node segment), and the nodes meet through the cross-node backend. Every test runs three ways:
// on 127.0.0.1 with UCX's TCP transport alone (the path a real network takes), on 127.0.0.1 with
// UCX's defaults, and with each node in a network namespace of its own ("netns": made by the
// test, as root, each joined to a bridge by a veth pair, so that a test can cut a node's link;
// skipped, saying why, where namespaces cannot be made). The test itself plays strangers from a
// namespace of their own there.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/segment.hpp"
#include "engine/status.hpp"
#include "job/job_secret.hpp"
#include "job/launch_env.hpp"
#include "membership/backend.hpp"
#include "ranks.hpp"
#include "ucx/rendezvous.hpp"
#include "ucx/wire.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::string tool(const char* variable) {
  const char* path = std::getenv(variable);  // NOLINT(concurrency-mt-unsafe)
  return path != nullptr ? path : "/nonexistent";
}

using lockstep::testing::free_port;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// One simulated node: a lockstep-run process and its output.
struct Node {
  pid_t pid = -1;
  fs::path log;
  int status = -1;
  bool ended = false;
  [[nodiscard]] std::string output() const { return read_file(log); }
  [[nodiscard]] int code() const {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

// Runs `script` with sh; true when it exits 0.
bool shell(const std::string& script) {
  return std::system(script.c_str()) == 0;  // NOLINT(concurrency-mt-unsafe, cert-env33-c)
}

// The namespaces of one netns test: node k's is "<prefix>k" (its veth "lseth", 10.77.0.k+1), the
// strangers' is "<prefix>out" (10.77.0.9), the bridge's "<prefix>hub". Their kernels give up a
// connect(2) that gets no answer after 2 SYN retries (7 s) instead of Linux's 6 (127 s): the
// mid-join cut waits that out in UCX (below), and CI once paid 136 s for it.
class Namespaces {
 public:
  static constexpr int kNodes = 4;
  explicit Namespaces(std::string prefix) : prefix_(std::move(prefix)) {}
  ~Namespaces() { remove(); }
  Namespaces(const Namespaces&) = delete;
  Namespaces& operator=(const Namespaces&) = delete;

  // Makes them; false (nothing left) when this machine cannot. First removes what a test
  // process that died before its TearDown left.
  bool make() {
    (void)shell(
        "for n in $(ip netns list | sed -n 's/^\\(lsmn[0-9]*\\)-.*/\\1/p' | sort -u); do "
        "pid=${n#lsmn}; [ -d /proc/$pid ] && continue; "
        "for m in $(ip netns list | awk '{print $1}' | grep \"^$n-\"); do ip netns del $m; done; "
        "done >/dev/null 2>&1");
    std::string script = "set -e; exec >/dev/null 2>&1; ip netns add " + hub() + "; ip -n " +
                         hub() + " link add br0 type bridge; ip -n " + hub() + " link set br0 up; ";
    for (int k = 0; k <= kNodes; ++k) {
      const std::string ns = k == kNodes ? name("out") : name(std::to_string(k));
      const std::string a = "lsa" + std::to_string(::getpid()) + "x" + std::to_string(k);
      const std::string b = "lsb" + std::to_string(::getpid()) + "x" + std::to_string(k);
      script += "ip netns add " + ns + "; ip link add " + a + " type veth peer name " + b +
                "; ip link set " + a + " netns " + ns + "; ip link set " + b + " netns " + hub() +
                "; ip -n " + ns + " link set " + a + " name lseth; ip -n " + ns +
                " addr add 10.77.0." + std::to_string(k == kNodes ? 9 : k + 1) +
                "/24 dev lseth; ip -n " + ns + " link set lseth up; ip -n " + ns +
                " link set lo up; ip -n " + hub() + " link set " + b + " master br0; ip -n " +
                hub() + " link set " + b + " up; ip netns exec " + ns +
                " sh -c 'echo 2 > /proc/sys/net/ipv4/tcp_syn_retries'; ";
    }
    made_ = true;
    if (!shell(script)) {
      remove();
      return false;
    }
    return true;
  }
  void remove() {
    if (!made_) {
      return;
    }
    made_ = false;
    std::string script =
        "exec >/dev/null 2>&1; ip netns del " + hub() + "; ip netns del " + name("out") + "; ";
    for (int k = 0; k < kNodes; ++k) {
      script += "ip netns del " + name(std::to_string(k)) + "; ";
    }
    (void)shell(script);
  }
  // Node k's namespace.
  [[nodiscard]] std::string node(int k) const { return name(std::to_string(k)); }
  [[nodiscard]] std::string outside() const { return name("out"); }
  // Cuts node k's link (its veth goes down).
  void cut(int k) const { EXPECT_TRUE(shell("ip -n " + node(k) + " link set lseth down")); }
  // Nodes a and b no longer reach each other while both still reach every other node (issue
  // 45): with `blackhole`, a route in each that drops what it sends the other; else a neighbour
  // entry in each that names a hardware address nobody has (the bridge delivers those frames
  // nowhere: the silent neighbour). heal() undoes it.
  void part(int a, int b, bool blackhole) const {
    for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
      const std::string ip = "10.77.0." + std::to_string(to + 1);
      EXPECT_TRUE(shell("ip -n " + node(from) +
                        (blackhole ? " route add blackhole " + ip + "/32"
                                   : " neigh replace " + ip +
                                         " lladdr 02:00:00:00:4c:53 dev lseth nud permanent")));
    }
  }
  void heal(int a, int b, bool blackhole) const {
    for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
      const std::string ip = "10.77.0." + std::to_string(to + 1);
      EXPECT_TRUE(shell(
          "ip -n " + node(from) +
          (blackhole ? " route del blackhole " + ip + "/32" : " neigh del " + ip + " dev lseth")));
    }
  }

 private:
  [[nodiscard]] std::string name(const std::string& what) const { return prefix_ + what; }
  [[nodiscard]] std::string hub() const { return name("hub"); }
  std::string prefix_;
  bool made_ = false;
};

// Moves the calling thread into network namespace `name` (made by `ip netns add`).
bool enter_namespace(const std::string& name) {
  const int fd = ::open(("/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  const bool entered = fd >= 0 && ::setns(fd, CLONE_NEWNET) == 0;
  if (fd >= 0) {
    ::close(fd);
  }
  return entered;
}

class MultiNode : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (lockstep::detail::built_backends().empty()) {
      GTEST_SKIP() << "this build of lockstep has no cross-node backend (UCX was not found: "
                      "install libucx-dev and configure with -Ducx=enabled)";
    }
    if (netns()) {
      if (::geteuid() != 0 || !shell("command -v ip >/dev/null")) {
        GTEST_SKIP() << "network namespaces need root and iproute2 (ip): not here";
      }
      namespaces_ = std::make_unique<Namespaces>("lsmn" + std::to_string(::getpid()) + "-" +
                                                 std::to_string(counter_) + "-");
      if (!namespaces_->make()) {
        namespaces_.reset();
        GTEST_SKIP() << "could not make network namespaces here (ip netns add, veth, bridge)";
      }
      host_ = "10.77.0.1";
      // The test plays strangers from a namespace of their own: this thread moves there (the
      // nodes' processes enter their own when they start).
      root_namespace_ = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
      ASSERT_TRUE(enter_namespace(namespaces_->outside()));
    }
    dir_ = fs::temp_directory_path() /
           ("lockstep-multinode-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(dir_);
    // The job's default secret (~/.config/lockstep/secret) is made in the test's folder, not
    // in the user's home: the nodes (and this process, which plays strangers) inherit it.
    ::setenv("XDG_CONFIG_HOME", (dir_ / "config").c_str(), 1);  // NOLINT(concurrency-mt-unsafe)
    shared_ = dir_ / "shared";
    std::ofstream(shared_).put('\0');
    port_ = free_port();
    job_ = lockstep::testing::unique_job_id("multinode");
  }
  void TearDown() override {
    for (auto& node : nodes_) {
      if (!node.ended) {
        ::kill(node.pid, SIGKILL);
        ::waitpid(node.pid, nullptr, 0);
      }
    }
    // A node killed for hanging leaves its processes (which ignore SIGTERM, see node_worker):
    // each names the test's folder on its command line.
    for (const auto& entry : fs::directory_iterator("/proc")) {
      const std::string pid = entry.path().filename().string();
      if (pid.find_first_not_of("0123456789") == std::string::npos &&
          read_file(entry.path() / "cmdline").find(dir_.string()) != std::string::npos) {
        ::kill(std::stoi(pid), SIGKILL);
      }
    }
    if (root_namespace_ >= 0) {
      EXPECT_EQ(::setns(root_namespace_, CLONE_NEWNET), 0);
      ::close(root_namespace_);
    }
    namespaces_.reset();
    if (!dir_.empty()) {
      fs::remove_all(dir_);
    }
    // No node segment of this job may be left behind.
    const auto identity =
        lockstep::detail::job_identity(job_ + "@" + host_ + ":" + std::to_string(port_));
    for (int node = 0; node < 4; ++node) {
      EXPECT_EQ(lockstep::detail::segments_of(identity, node), std::vector<std::string>{})
          << "left behind";
    }
  }

  // Starts node `rank` of `nnodes`, `per_node` processes running node_worker `args`.
  Node& start(int rank, int nnodes, int per_node, const std::vector<std::string>& args,
              const std::string& job = "", const std::string& backend = "",
              const std::string& fault = "") {
    Node node;
    node.log = dir_ / ("node" + std::to_string(rank) + "-" + std::to_string(nodes_.size()));
    std::vector<std::string> argv = {tool("LOCKSTEP_RUN"),
                                     "--nnodes",
                                     std::to_string(nnodes),
                                     "--node-rank",
                                     std::to_string(rank),
                                     "--nproc-per-node",
                                     std::to_string(per_node),
                                     "--master-addr",
                                     host_,
                                     "--master-port",
                                     std::to_string(port_),
                                     "--job-id",
                                     job.empty() ? job_ : job,
                                     "--grace-period",
                                     "20",
                                     "--backend",
                                     backend.empty() ? "ucx" : backend,
                                     "--tag-output",
                                     tool("LOCKSTEP_NODE_WORKER")};
    argv.insert(argv.end(), args.begin(), args.end());
    node.pid = ::fork();
    if (node.pid == 0) {
      int fd = ::open(node.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      // NOLINTNEXTLINE(concurrency-mt-unsafe): the child alone
      ::setenv("UCX_NET_DEVICES", netns() ? "lseth" : "lo", 1);
      if (netns()) {
        // ip netns exec: the namespace, and /sys as it shows its devices (UCX looks there).
        argv.insert(argv.begin(), {"ip", "netns", "exec", namespaces_->node(rank)});
      }
      // NOLINTNEXTLINE(concurrency-mt-unsafe): the child alone
      ::setenv("LOCKSTEP_JOIN_TIMEOUT", join_timeout_.c_str(), 1);
      if (!fault.empty()) {
        ::setenv("LOCKSTEP_FAULT_POINT", fault.c_str(), 1);  // NOLINT(concurrency-mt-unsafe)
      }
      for (const auto& [name, value] : node_env_) {
        ::setenv(name.c_str(), value.c_str(), 1);  // NOLINT(concurrency-mt-unsafe)
      }
      if (auto secret = node_secret_.find(rank); secret != node_secret_.end()) {
        ::setenv("LOCKSTEP_SECRET", secret->second.c_str(), 1);  // NOLINT(concurrency-mt-unsafe)
      }
      if (std::string(GetParam()) != "default") {
        ::setenv("UCX_TLS", "tcp", 1);  // NOLINT(concurrency-mt-unsafe)
      } else {
        ::unsetenv("UCX_TLS");  // NOLINT(concurrency-mt-unsafe)
      }
      std::vector<char*> raw;
      for (auto& arg : argv) {
        raw.push_back(arg.data());
      }
      raw.push_back(nullptr);
      ::execvp(raw[0], raw.data());
      ::_exit(126);
    }
    nodes_.push_back(node);
    return nodes_.back();
  }

  // A connection to node 0's port, tried again for up to 30 s (node 0 listens once its
  // processes have started); -1 (and a failure) if none.
  int connect_to_node0() {
    sockaddr_in addr = node0_address();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        return fd;
      }
      ::close(fd);
      if (std::chrono::steady_clock::now() > until) {
        ADD_FAILURE() << "node 0 did not listen on port "
                      << lockstep::detail::rendezvous_port_for(port_) << " within 30 s";
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Runs a job of `nnodes` nodes of `per_node` processes running node_worker `args`, every node
  // started at once, and expects every node to end with 0.
  void run_job(int nnodes, int per_node, const std::vector<std::string>& args) {
    for (int node = 0; node < nnodes; ++node) {
      start(node, nnodes, per_node, args);
    }
    wait_all();
    for (const auto& node : nodes_) {
      EXPECT_EQ(node.code(), 0) << all_output();
    }
  }

  // Waits for every node's launcher to end, at most `limit`; a hang is a failure.
  void wait_all(std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto until = Clock::now() + limit;
    for (auto& node : nodes_) {
      while (!node.ended) {
        pid_t done = ::waitpid(node.pid, &node.status, WNOHANG);
        if (done == node.pid) {
          node.ended = true;
        } else if (Clock::now() > until) {
          ADD_FAILURE() << "node " << node.log << " did not end within " << limit.count()
                        << " s (a hang):\n"
                        << node.output();
          ::kill(node.pid, SIGKILL);
          ::waitpid(node.pid, &node.status, 0);
          node.ended = true;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
    }
  }

  // Each process's RESULT line, by rank, from every node's output.
  [[nodiscard]] std::map<int, std::string> results() const {
    std::map<int, std::string> out;
    for (const auto& node : nodes_) {
      std::istringstream lines(node.output());
      for (std::string line; std::getline(lines, line);) {
        int rank = -1;
        char text[16] = {};
        if (std::sscanf(line.c_str(), "[rank %d] RESULT %15s", &rank, text) == 2 &&
            std::string(text) != "joined") {
          out[rank] = line.substr(line.find("RESULT ") + 7);
        }
      }
    }
    return out;
  }

  [[nodiscard]] std::string all_output() const {
    std::string out;
    for (const auto& node : nodes_) {
      out += "--- " + node.log.filename().string() + " (exit " + std::to_string(node.code()) +
             ")\n" + node.output();
    }
    return out;
  }

  [[nodiscard]] bool netns() const { return std::string(GetParam()) == "netns"; }
  // Node 0's rendezvous address: MASTER_ADDR, and the port after MASTER_PORT.
  [[nodiscard]] sockaddr_in node0_address() const {
    return address_at(lockstep::detail::rendezvous_port_for(port_));
  }
  [[nodiscard]] sockaddr_in address_at(int port) const {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    EXPECT_EQ(::inet_pton(AF_INET, host_.c_str(), &addr.sin_addr), 1);
    return addr;
  }
  // Where node k's connections come from, as node 0 names them.
  [[nodiscard]] std::string node_host(int k) const {
    return netns() ? "10.77.0." + std::to_string(k + 1) : "127.0.0.1";
  }

  static inline int counter_ = 0;
  std::string host_ = "127.0.0.1";  // node 0's address
  std::unique_ptr<Namespaces> namespaces_;
  int root_namespace_ = -1;  // this thread's own network namespace, while it is elsewhere
  fs::path dir_;
  fs::path shared_;
  int port_ = 0;
  std::string job_;
  std::map<int, std::string> node_secret_;       // LOCKSTEP_SECRET for a node, when set
  std::map<std::string, std::string> node_env_;  // more variables for every node started next
  std::string join_timeout_ = "30";              // LOCKSTEP_JOIN_TIMEOUT of the nodes started next
  std::vector<Node> nodes_;
};

TEST_P(MultiNode, TwoNodesAgreeOverManyRounds) {
  run_job(2, 2, {"rounds", shared_.string(), "3000"});
  // State::print: once per machine, as Accelerate's (issue 23: it printed once per job).
  for (int node = 0; node < 2; ++node) {
    const std::string line = "PRINTED once by node " + std::to_string(node) + "\n";
    const std::string& out = nodes_[node].output();
    std::size_t count = 0;
    for (auto at = out.find(line); at != std::string::npos; at = out.find(line, at + 1)) {
      ++count;
    }
    EXPECT_EQ(count, 1U) << "node " << node << ":\n" << out;
  }
  auto ends = results();
  ASSERT_EQ(ends.size(), 4U) << all_output();
  for (const auto& [rank, text] : ends) {
    EXPECT_EQ(text, "rounds 3000 early 0") << "rank " << rank;
  }
}

TEST_P(MultiNode, ThreeNodesAgreeOverManyRounds) {
  // Node 2 starts first and node 0 last: the others retry until node 0 listens.
  for (int node = 2; node >= 0; --node) {
    start(node, 3, 2, {"rounds", shared_.string(), "2000"});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  wait_all();
  for (const auto& node : nodes_) {
    EXPECT_EQ(node.code(), 0) << all_output();
  }
  auto ends = results();
  ASSERT_EQ(ends.size(), 6U) << all_output();
  for (const auto& [rank, text] : ends) {
    EXPECT_EQ(text, "rounds 2000 early 0") << "rank " << rank;
  }
}

TEST_P(MultiNode, TheNextJobCanUseThePortAtOnce) {
  // Node 0's closed connections linger in TIME_WAIT on the port: the next job must still listen.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::ofstream(shared_, std::ios::trunc).put('\0');
    nodes_.clear();
    for (int node = 0; node < 2; ++node) {
      start(node, 2, 1, {"rounds", shared_.string(), "50"});
    }
    wait_all();
    for (const auto& node : nodes_) {
      ASSERT_EQ(node.code(), 0) << "attempt " << attempt << "\n" << all_output();
    }
  }
}

// A listener on node 0's address that holds `port` (as torch.distributed's store holds
// MASTER_PORT in a job that uses both), closed at the end of the scope; -1 if it cannot listen.
class HeldPort {
 public:
  explicit HeldPort(const sockaddr_in& addr)
      : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    if (::bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(fd_, 16) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  ~HeldPort() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  [[nodiscard]] bool held() const { return fd_ >= 0; }

 private:
  int fd_;
};

TEST_P(MultiNode, AStoreOnMasterPortLeavesLockstepItsOwnPort) {
  // Issue 23: node 0 listened on MASTER_PORT itself, exactly where torch's store listens.
  if (netns()) {
    GTEST_SKIP() << "the store is played on loopback (node 0's address in the root namespace)";
  }
  HeldPort store(address_at(port_));
  ASSERT_TRUE(store.held()) << "could not listen on MASTER_PORT " << port_;
  run_job(2, 1, {"rounds", shared_.string(), "200"});
}

TEST_P(MultiNode, LockstepsPortHeldByAnotherIsNamedWithItsRule) {
  if (netns()) {
    GTEST_SKIP() << "the holder is played on loopback (node 0's address in the root namespace)";
  }
  HeldPort other(node0_address());
  ASSERT_TRUE(other.held()) << "could not listen on port " << port_ + 1;
  join_timeout_ = "5";
  for (int node = 0; node < 2; ++node) {
    start(node, 2, 1, {"rounds", shared_.string(), "10"});
  }
  wait_all();
  EXPECT_NE(nodes_[0].code(), 0) << all_output();
  const std::string want = "node 0 cannot listen on " + host_ + ":" + std::to_string(port_ + 1) +
                           " (MASTER_PORT=" + std::to_string(port_) + " + 1)";
  EXPECT_NE(nodes_[0].output().find(want), std::string::npos) << all_output();
  EXPECT_NE(nodes_[0].output().find("set LOCKSTEP_MASTER_PORT"), std::string::npos) << all_output();
}

TEST_P(MultiNode, BroadcastCarriesTheMainProcesssBytesToEveryNode) {
  // Issue 23: main computes, everyone uses, across machines (in chunks through the backend).
  run_job(3, 2, {"broadcast", shared_.string(), "40"});
  auto ends = results();
  ASSERT_EQ(ends.size(), 6U) << all_output();
  for (const auto& [rank, text] : ends) {
    EXPECT_EQ(text, "done") << "rank " << rank << "\n" << all_output();
  }
}

TEST_P(MultiNode, GatherCarriesEveryProcesssBytesToEveryNode) {
  // Issue 46: gather_object and the trigger across machines (node 0 gathers the leaders' parts).
  run_job(3, 2, {"gather", shared_.string(), "40"});
  auto ends = results();
  ASSERT_EQ(ends.size(), 6U) << all_output();
  for (const auto& [rank, text] : ends) {
    EXPECT_EQ(text, "done") << "rank " << rank << "\n" << all_output();
  }
}

TEST_P(MultiNode, FirstBlocksNestAcrossNodes) {
  // Issue 58: nested first blocks (TRL's per-machine cache inside the global one) on 2 machines
  // of 2 processes: every body on its first process first, no mismatch between the blocks' calls.
  run_job(2, 2, {"nested", shared_.string(), "0"});
  auto ends = results();
  ASSERT_EQ(ends.size(), 4U) << all_output();
  for (const auto& [rank, text] : ends) {
    EXPECT_EQ(text, "done") << "rank " << rank << "\n" << all_output();
  }
}

TEST_P(MultiNode, StatusCountsTheEpisodesOfAMachinesOnlyProcess) {
  // lockstep-run --status said "0 episodes passed" on machines of one process, which meet the
  // other machines without the segment's arrival counter.
  if (std::string(GetParam()) != "tcp") {
    GTEST_SKIP() << "the tcp variant covers it";
  }
  for (int node = 0; node < 2; ++node) {
    start(node, 2, 1, {"hold", shared_.string(), "7"});
  }
  const auto held = [&](int process) {
    return fs::exists(shared_.string() + ".held-" + std::to_string(process));
  };
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (!(held(0) && held(1)) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int seen = 0;
  for (const auto& job : lockstep::detail::job_statuses()) {
    if (job.identity.find(job_) != std::string::npos) {
      ++seen;
      EXPECT_EQ(job.num_slots, 1);
      EXPECT_EQ(job.episode, 8U) << job.path;  // the join's and the 7 waits
    }
  }
  EXPECT_EQ(seen, 2) << all_output();
  std::ofstream(shared_.string() + ".go").put('\n');
  wait_all();
  for (const auto& node : nodes_) {
    EXPECT_EQ(node.code(), 0) << all_output();
  }
}

TEST_P(MultiNode, StatusSaysALeaderWaitsInAnExchangeAcrossMachines) {
  // While a machine's main process waited for the other machines inside broadcast (node 0's
  // bytes), --status said it was running its own code: the exchange's wait was outside its
  // recorded call. Node 0 comes late to a broadcast, then node 1 to a gather: each time the
  // waiting machine's other process waits in the call, and so must its main process.
  if (std::string(GetParam()) != "tcp") {
    GTEST_SKIP() << "the tcp variant covers it";
  }
  for (int node = 0; node < 2; ++node) {
    start(node, 2, 2, {"exchanges-late", shared_.string(), "1000"});
  }
  // Samples where the machine's other process waits in the call, and among them those where its
  // main process does not: a moment at an exchange's end at most (it returns first), never the
  // second the other machine is late.
  std::map<std::string, int> looked;
  std::map<std::string, int> apart;
  const auto until = Clock::now() + std::chrono::milliseconds(2300);
  while (Clock::now() < until) {
    for (const auto& job : lockstep::detail::job_statuses()) {
      if (job.identity.find(job_) == std::string::npos || job.processes.size() != 2) {
        continue;
      }
      const auto& leader = job.processes[0];
      const auto& other = job.processes[1];
      if (other.state == "waiting" &&
          (other.call == "broadcast" || other.call == "gather_object")) {
        ++looked[other.call];
        if (leader.state != "waiting" || leader.call != other.call) {
          ++apart[other.call];
          std::cerr << "process " << leader.rank << " while process " << other.rank << " waits in "
                    << other.call << ": " << leader.state << ", " << leader.call << " "
                    << leader.ended << "\n";
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(looked["broadcast"], 5) << all_output();
  EXPECT_GT(looked["gather_object"], 5) << all_output();
  EXPECT_LE(apart["broadcast"], 2);
  EXPECT_LE(apart["gather_object"], 2);
  wait_all();
  for (const auto& node : nodes_) {
    EXPECT_EQ(node.code(), 0) << all_output();
  }
  for (const auto& [rank, text] : results()) {
    EXPECT_EQ(text, "done") << "rank " << rank;
  }
}

TEST_P(MultiNode, AStalledWaitAcrossNodesSaysWhoItWaitsFor) {
  // Issue 23: a leader waiting for the other machines was silent (the node barrier said its
  // line, the backend's wait none).
  node_env_["LOCKSTEP_STALL_WARNING"] = "0.3";
  run_job(2, 2, {"stall", shared_.string(), "1500"});
  const std::string& out = nodes_[0].output();
  // Node 0's leader, in the backend: the node that has not arrived, its processes, and where
  // they are, as node 1's leader answered (issue 44): both sleep in their own code.
  EXPECT_NE(out.find(" rank 0] wait_for_everyone has waited 0.3 s for node 1 (processes 2, 3) "
                     "on the other machines; on node 1, process 2 is not in a lockstep call: "),
            std::string::npos)
      << all_output();
  EXPECT_NE(out.find("; process 3 is not in a lockstep call: it returned from joining the job"),
            std::string::npos)
      << all_output();
  // Node 0's other process, in the node barrier: its main process is away.
  EXPECT_NE(out.find(" rank 1] wait_for_everyone has waited 0.3 s for this machine's main "
                     "process to come back from the other machines"),
            std::string::npos)
      << all_output();
  // Growing intervals: at 0.3 s and 0.9 s of the 1.5 s; not one line per poll.
  const std::string line = " rank 0] wait_for_everyone has waited ";
  std::size_t lines = 0;
  for (auto at = out.find(line); at != std::string::npos; at = out.find(line, at + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 2U) << out;
  EXPECT_LE(lines, 3U) << out;
}

TEST_P(MultiNode, ATimeoutNamesTheMissingNode) {
  for (int node = 0; node < 3; ++node) {
    start(node, 3, 2, {"timeout", shared_.string(), "1"});
  }
  wait_all();
  auto ends = results();
  ASSERT_EQ(ends.size(), 6U) << all_output();
  for (int rank : {0, 1, 4, 5}) {
    EXPECT_TRUE(ends[rank].starts_with("timeout missing=2,3, ")) << rank << ": " << ends[rank];
    EXPECT_NE(ends[rank].find("node 1 (processes 2, 3)"), std::string::npos) << ends[rank];
  }
  // The late node is told that the job gave up, and why, instead of waiting for ever.
  for (int rank : {2, 3}) {
    EXPECT_TRUE(ends[rank].starts_with("timeout missing=2,3, ")) << rank << ": " << ends[rank];
    EXPECT_NE(ends[rank].find("gave up"), std::string::npos) << ends[rank];
  }
  // Node 0 asked node 1 where its processes are (issue 44): both sleep in their own code, its
  // main process included. Node 2 asked node 0, which asked node 1 for it.
  for (int rank : {0, 1, 4, 5}) {
    EXPECT_NE(ends[rank].find("; on node 1, process 2 is not in a lockstep call: it returned from "
                              "wait_for_everyone at node_worker.cpp:"),
              std::string::npos)
        << rank << ": " << ends[rank];
    EXPECT_NE(ends[rank].find("; process 3 is not in a lockstep call: it returned from "
                              "wait_for_everyone at node_worker.cpp:"),
              std::string::npos)
        << rank << ": " << ends[rank];
  }
}

// Node 1's main process waits in its machine's barrier for its late process: node 0's timeout
// says where each of them is, as node 1's main process answered it while it waited.
TEST_P(MultiNode, NodeZerosTimeoutSaysWhereTheLateNodesProcessesAre) {
  for (int node = 0; node < 3; ++node) {
    start(node, 3, 2, {"late-one", shared_.string(), "1"});
  }
  wait_all();
  auto ends = results();
  ASSERT_EQ(ends.size(), 6U) << all_output();
  EXPECT_TRUE(ends[0].starts_with("timeout missing=2,3, ")) << ends[0];
  const auto at = [&](const std::string& text) { return ends[0].find(text) != std::string::npos; };
  EXPECT_TRUE(
      at("; on node 1, process 3 is not in a lockstep call: it returned from "
         "wait_for_everyone at node_worker.cpp:"))
      << ends[0];
  EXPECT_TRUE(at("; process 2 waits in wait_for_everyone at node_worker.cpp:")) << ends[0];
  // Node 1's processes end too, told why, once its late process comes.
  for (int rank : {2, 3}) {
    EXPECT_FALSE(ends[rank].starts_with("passed")) << rank << ": " << ends[rank];
  }
}

// Node 0's process 1 is late, and its main process waits for it in its machine's barrier: the
// other nodes' timeouts say where node 0's processes are, as node 0's desk answered them.
TEST_P(MultiNode, AnotherNodesTimeoutSaysWhereNodeZerosProcessesAre) {
  for (int node = 0; node < 3; ++node) {
    start(node, 3, 2, {"late-one", shared_.string(), "0"});
  }
  wait_all();
  auto ends = results();
  ASSERT_EQ(ends.size(), 6U) << all_output();
  for (int rank : {2, 3, 4, 5}) {
    const auto at = [&](const std::string& text) {
      return ends[rank].find(text) != std::string::npos;
    };
    EXPECT_TRUE(ends[rank].starts_with("timeout missing=0,1, ")) << rank << ": " << ends[rank];
    EXPECT_TRUE(
        at("; on node 0, process 1 is not in a lockstep call: it returned from "
           "wait_for_everyone at node_worker.cpp:"))
        << rank << ": " << ends[rank];
    EXPECT_TRUE(at("; process 0 waits in wait_for_everyone at node_worker.cpp:"))
        << rank << ": " << ends[rank];
  }
  for (int rank : {0, 1}) {
    EXPECT_FALSE(ends[rank].starts_with("passed")) << rank << ": " << ends[rank];
  }
}

TEST_P(MultiNode, AKilledLeaderFailsEveryNode) {
  for (int node = 0; node < 2; ++node) {
    start(node, 2, 2, {"kill", shared_.string(), "2"});  // node 1's leader
  }
  wait_all();
  auto ends = results();
  ASSERT_EQ(ends.size(), 3U) << all_output();
  for (int rank : {0, 1, 3}) {
    EXPECT_TRUE(ends[rank].starts_with("lost 2 ")) << rank << ": " << ends[rank];
  }
  // Node 0 runs on the same host: it says that the process died, not how UCX saw its connection
  // end ("Endpoint timeout"), and gives its pid.
  for (int rank : {0, 1}) {
    EXPECT_NE(ends[rank].find("node 1's main process (process 2) died (pid "), std::string::npos)
        << rank << ": " << ends[rank];
    EXPECT_EQ(ends[rank].find("connection failed"), std::string::npos)
        << rank << ": " << ends[rank];
  }
  EXPECT_NE(nodes_[0].code(), 0);
  EXPECT_NE(nodes_[1].code(), 0);
}

TEST_P(MultiNode, AProcessKilledMidGatherFailsTheJobAndLeavesNoSpill) {
  // Issue 58: the others have written their spills (1 MiB each, past the segment's area) and
  // wait; every one gets PeerLostError naming the dead one, and no spill is left once they exit.
  for (int node = 0; node < 2; ++node) {
    start(node, 2, 2, {"gather-kill", shared_.string(), "3"});  // not a leader
  }
  wait_all();
  auto ends = results();
  ASSERT_EQ(ends.size(), 3U) << all_output();
  for (int rank : {0, 1, 2}) {
    EXPECT_TRUE(ends[rank].starts_with("lost 3 ")) << rank << ": " << ends[rank];
  }
  EXPECT_EQ(lockstep::testing::spill_files(), std::vector<std::string>{}) << all_output();
}

TEST_P(MultiNode, AKilledProcessFailsItsLeaderAndTheJob) {
  for (int node = 0; node < 2; ++node) {
    start(node, 2, 2, {"kill", shared_.string(), "3"});  // not a leader
  }
  wait_all();
  auto ends = results();
  ASSERT_EQ(ends.size(), 3U) << all_output();
  for (int rank : {0, 1, 2}) {
    EXPECT_TRUE(ends[rank].starts_with("lost 3 ")) << rank << ": " << ends[rank];
  }
}

// Node 1's leader (process 2) dies at each step of its part: before meeting the other leaders,
// and after meeting them but before releasing its node.
TEST_P(MultiNode, ALeaderKilledAtEachStepFailsEveryNode) {
  for (const char* point : {"lead.local@2:5", "lead.met@2:5"}) {
    std::ofstream(shared_, std::ios::trunc).put('\0');
    nodes_.clear();
    for (int node = 0; node < 2; ++node) {
      start(node, 2, 2, {"rounds", shared_.string(), "100"}, "", "", point);
    }
    wait_all();
    auto ends = results();
    ASSERT_EQ(ends.size(), 3U) << point << "\n" << all_output();
    for (int rank : {0, 1, 3}) {
      EXPECT_TRUE(ends[rank].starts_with("lost 2 ")) << point << ": " << rank << ": " << ends[rank];
    }
  }
}

// Flags mode across nodes (issue 42, item 4), on a fake GPU: every node's leader polls its
// node's streams, meets the others on the host and releases its node; no stream passes a round
// before every process of every node did its work, host barriers and a second stream between,
// and no call waits for its stream (the first, behind 300 ms of work, returns at once).
TEST_P(MultiNode, StreamBarriersAcrossNodesNeverPassEarly) {
  if (GetParam() != std::string("tcp")) {
    GTEST_SKIP() << "the stream barrier's relay is the same code over any transport: run in tcp";
  }
  run_job(2, 2, {"streams", shared_.string(), "600"});
  auto ends = results();
  ASSERT_EQ(ends.size(), 4U) << all_output();
  for (const auto& [rank, text] : ends) {
    EXPECT_EQ(text, "streams 600 early 0 drained 1 first call returned at once") << "rank " << rank;
  }
}

// Flags mode across nodes, and a job's clean end (node_worker's stream-leave): node 0 passes the
// last barrier and one of its processes leaves at once, while node 1's leader, stopped, has not
// yet read node 0's arrival. Node 0's idle relay once told node 1 of the leave as a loss, and
// node 1 failed the barrier node 0 had passed (seen in CI under load).
TEST_P(MultiNode, AProcessLeavingAfterItsLastStreamCallFailsNoOtherNode) {
  if (GetParam() != std::string("tcp")) {
    GTEST_SKIP() << "the stream barrier's relay is the same code over any transport: run in tcp";
  }
  run_job(2, 2, {"stream-leave", shared_.string()});
  auto ends = results();
  ASSERT_EQ(ends.size(), 4U) << all_output();
  for (const auto& [rank, text] : ends) {
    EXPECT_EQ(text, "passed") << "rank " << rank << "\n" << all_output();
  }
}

// Flags mode across nodes through lockstep's CUDA code itself, on the fake CUDA driver
// (tests/fake_cuda): the stream memory operations, the relay's thread (which puts itself in the
// relaxed capture mode before its first CUDA call: the fake counts threads that did not), no
// stream passing a round before every process of every node did its work.
TEST_P(MultiNode, StreamBarriersThroughTheCudaDriverAcrossNodes) {
  if (GetParam() != std::string("tcp")) {
    GTEST_SKIP() << "the stream barrier's relay is the same code over any transport: run in tcp";
  }
  const char* fake = std::getenv("LOCKSTEP_TEST_FAKE_CUDA_DIR");  // NOLINT(concurrency-mt-unsafe)
  if (fake == nullptr || *fake == '\0') {
    GTEST_SKIP() << "built without the CUDA headers: no fake CUDA driver";
  }
  node_env_["LD_LIBRARY_PATH"] = fake;
  node_env_["LOCKSTEP_GPU_BARRIER"] = "flags";
  run_job(2, 2, {"cuda-streams", shared_.string(), "300"});
  auto ends = results();
  ASSERT_EQ(ends.size(), 4U) << all_output();
  for (const auto& [rank, text] : ends) {
    EXPECT_EQ(text, "cuda-streams 300 early 0 foreign-global 0") << "rank " << rank;
  }
}

// A device that cannot run flags mode on one machine (issue 62, item 3): every process of
// every machine fails the set-up with one clear error, and the job goes on. Before the marks
// were gathered across machines, the other machine's processes passed their set-up and their
// leader's relay waited, without a deadline, for a machine whose relay never started.
TEST_P(MultiNode, ADeviceWithoutFlagsFailsEveryMachineTogether) {
  if (GetParam() != std::string("tcp")) {
    GTEST_SKIP() << "the stream barrier's set-up is the same code over any transport: run in tcp";
  }
  for (int refuser : {3, 0}) {
    nodes_.clear();
    run_job(2, 2, {"stream-refused", shared_.string(), std::to_string(refuser)});
    auto ends = results();
    ASSERT_EQ(ends.size(), 4U) << all_output();
    for (const auto& [rank, text] : ends) {
      EXPECT_EQ(text, "refused together") << "refuser " << refuser << ", rank " << rank;
    }
  }
}

// A process SIGKILLed while every stream waits in a stream barrier across nodes: every
// survivor's stream, on its node and the other, is released within the bound, and the next call
// names the dead process. A node's main process, and another.
TEST_P(MultiNode, AKilledProcessReleasesEveryNodesStreams) {
  if (GetParam() != std::string("tcp")) {
    GTEST_SKIP() << "the stream barrier's relay is the same code over any transport: run in tcp";
  }
  for (int victim : {3, 2}) {
    std::ofstream(shared_, std::ios::trunc).put('\0');
    nodes_.clear();
    for (int node = 0; node < 2; ++node) {
      start(node, 2, 2, {"stream-kill", shared_.string(), std::to_string(victim)});
    }
    wait_all();
    std::map<int, std::string> released;
    std::map<int, std::string> ended;
    for (const auto& node : nodes_) {
      std::istringstream lines(node.output());
      for (std::string line; std::getline(lines, line);) {
        int rank = -1;
        if (std::sscanf(line.c_str(), "[rank %d] RESULT", &rank) != 1) {
          continue;
        }
        const std::string text = line.substr(line.find("RESULT ") + 7);
        (text.starts_with("stream released") ? released : ended)[rank] = text;
      }
    }
    for (int rank = 0; rank < 4; ++rank) {
      if (rank == victim) {
        continue;
      }
      double after = -1;
      int ok = 0;
      ASSERT_EQ(std::sscanf(released[rank].c_str(), "stream released %d after %lf", &ok, &after), 2)
          << "victim " << victim << ", rank " << rank << "\n"
          << all_output();
      std::cout << "victim " << victim << ", rank " << rank << ": " << released[rank] << "; "
                << ended[rank] << "\n";
      EXPECT_EQ(ok, 1) << "victim " << victim << ", rank " << rank << "'s stream still waits";
      EXPECT_LT(after, lockstep::testing::kStreamReleaseBound)
          << "victim " << victim << ", rank " << rank;
      EXPECT_TRUE(ended[rank].starts_with("lost " + std::to_string(victim) + " "))
          << "victim " << victim << ", rank " << rank << ": " << ended[rank];
    }
  }
}

// A node whose streams are late to a timed stream barrier across nodes: the other node's relay
// gives up after the timeout, every stream of both nodes is released (node 1's work is still
// running), and every process's next call throws the TimeoutError naming node 1's processes.
TEST_P(MultiNode, AStreamBarrierAcrossNodesTimesOutOnALateNode) {
  if (GetParam() != std::string("tcp")) {
    GTEST_SKIP() << "the stream barrier's relay is the same code over any transport: run in tcp";
  }
  for (int node = 0; node < 2; ++node) {
    start(node, 2, 2, {"stream-late", shared_.string()});
  }
  wait_all();
  const std::string out = all_output();
  for (int rank = 0; rank < 2; ++rank) {
    int ms = -1;
    const auto at = out.find("[rank " + std::to_string(rank) + "] RESULT released after ");
    ASSERT_NE(at, std::string::npos) << out;
    ASSERT_EQ(std::sscanf(out.c_str() + at, "[rank %*d] RESULT released after %d ms", &ms), 1);
    EXPECT_LT(ms, 2500) << "rank " << rank << "'s stream waited for node 1's work";
  }
  auto ends = results();
  ASSERT_EQ(ends.size(), 4U) << out;
  for (const auto& [rank, text] : ends) {
    EXPECT_TRUE(text.starts_with("timeout missing=2,3, ")) << "rank " << rank << ": " << text;
  }
}

TEST_P(MultiNode, AStrayConnectionIsRefusedAndNeverJoins) {
  start(0, 2, 2, {"rounds", shared_.string(), "200"});
  // A plain TCP client that sends junk to node 0's port.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = node0_address();
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const char junk[] = "GET / HTTP/1.0\r\n\r\n";
    (void)::write(fd, junk, sizeof junk);
  }
  // Another job's node 1 on the same port: refused, it fails and never joins.
  Node& stray = start(1, 2, 2, {"rounds", shared_.string(), "200"}, job_ + "-other");
  const pid_t stray_pid = stray.pid;
  int status = 0;
  ASSERT_EQ(::waitpid(stray_pid, &status, 0), stray_pid);
  nodes_.back().ended = true;
  nodes_.back().status = status;
  EXPECT_NE(nodes_.back().code(), 0);
  EXPECT_NE(nodes_.back().output().find("refused"), std::string::npos) << all_output();
  EXPECT_NE(nodes_.back().output().find("another job"), std::string::npos) << all_output();
  // The job's own node 1 then joins, and the job runs.
  start(1, 2, 2, {"rounds", shared_.string(), "200"});
  wait_all();
  ::close(fd);
  EXPECT_EQ(nodes_[0].code(), 0) << all_output();
  EXPECT_EQ(nodes_[2].code(), 0) << all_output();
  EXPECT_NE(nodes_[0].output().find("refused a connection"), std::string::npos) << all_output();
}

// Issue 12: node 1's processes arrived 1.2 s late at a wait that node 0 timed out on after
// 1 s, and returned normally (node 1's leader found node 0's arrival and its abort together and
// took the arrival first). Every process of both nodes must get the error.
TEST_P(MultiNode, ALateNodeNeverPassesAnEpisodeTheOthersTimedOutOn) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    nodes_.clear();
    for (int node = 0; node < 2; ++node) {
      start(node, 2, 2, {"late", shared_.string(), "1200"});
    }
    wait_all();
    auto ends = results();
    ASSERT_EQ(ends.size(), 4U) << all_output();
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_TRUE(ends[rank].starts_with("timeout missing=2,3, ")) << rank << ": " << ends[rank];
    }
    for (int rank : {2, 3}) {
      EXPECT_NE(ends[rank].find("gave up"), std::string::npos) << ends[rank];
    }
  }
}

// Issue 12: 8 bytes of 0xff and 8 of 0x00 sent to MASTER_PORT made UCX's connection manager
// fail an assertion and abort node 0. The port is lockstep's own now: that packet, garbage, a
// half-sent frame and more idle connections than node 0 keeps waiting are all dropped.
TEST_P(MultiNode, CraftedBytesAtTheMasterPortNeverHurtTheJob) {
  start(0, 2, 2, {"rounds", shared_.string(), "100"});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Node 0 listens once its processes have started (slow under a sanitizer on a busy machine).
  auto open_connection = [&] { return connect_to_node0(); };
  std::vector<int> fds;
  std::vector<unsigned char> packet(16, 0x00);
  std::fill(packet.begin(), packet.begin() + 8, 0xff);
  fds.push_back(open_connection());
  EXPECT_EQ(::send(fds.back(), packet.data(), packet.size(), MSG_NOSIGNAL), 16);
  std::mt19937 random(12);
  for (int i = 0; i < 8; ++i) {
    std::vector<unsigned char> junk(1 + random() % 4096);
    for (auto& byte : junk) {
      byte = static_cast<unsigned char>(random());
    }
    fds.push_back(open_connection());
    (void)::send(fds.back(), junk.data(), junk.size(), MSG_NOSIGNAL);
  }
  // A frame that promises 100 bytes and sends 3, then a valid length with a foreign message.
  fds.push_back(open_connection());
  const unsigned char half[] = {100, 0, 0, 0, 1, 2, 3};
  EXPECT_EQ(::send(fds.back(), half, sizeof half, MSG_NOSIGNAL), 7);
  for (int i = 0; i < 100; ++i) {
    fds.push_back(open_connection());  // idle
  }
  start(1, 2, 2, {"rounds", shared_.string(), "100"});
  wait_all();
  for (int fd : fds) {
    ::close(fd);
  }
  EXPECT_EQ(nodes_[0].code(), 0) << all_output();
  EXPECT_EQ(nodes_[1].code(), 0) << all_output();
}

// Issue 21: node 0 trusted anyone who knew the job's identity. A stranger that sent a
// well-formed hello first was welcomed as node 1 (and given the job's token and every leader's
// UCX address), and an 8-byte worker address in a hello made UCX abort node 0. Now: 0.2's hello
// is refused before it is read, a stranger with another secret learns nothing, an authenticated
// node's impossible worker address is refused before UCX sees it, and the real node 1 joins.
TEST_P(MultiNode, OnlyANodeThatProvesTheSecretJoins) {
  start(0, 2, 1, {"rounds", shared_.string(), "20"});
  namespace wire = lockstep::detail::wire;
  namespace rendezvous = lockstep::detail::rendezvous;
  wire::Hello hello;
  hello.identity = lockstep::detail::job_identity(job_ + "@" + host_ + ":" + std::to_string(port_));
  hello.num_nodes = 2;
  hello.world_size = 2;
  hello.node = 1;
  hello.ranks = {1};
  hello.address.assign(8, std::byte{0x5a});
  const auto message = wire::encode(hello);

  // 0.2's attack: the hello first, with the right identity. Refused unread, with no job data.
  const int fd = connect_to_node0();
  const auto bytes = rendezvous::frame(message);
  EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  std::vector<std::byte> reply;
  std::array<std::byte, 4096> chunk{};
  for (ssize_t got = 0; (got = ::recv(fd, chunk.data(), chunk.size(), 0)) > 0;) {
    reply.insert(reply.end(), chunk.begin(), chunk.begin() + got);  // until node 0 closes
  }
  ::close(fd);
  ASSERT_GT(reply.size(), 4U);
  auto answer = wire::decode(std::span(reply).subspan(4));
  ASSERT_TRUE(std::holds_alternative<wire::Refuse>(answer));
  EXPECT_NE(std::get<wire::Refuse>(answer).reason.find("authenticated join"), std::string::npos)
      << std::get<wire::Refuse>(answer).reason;

  // A stranger with another secret, through lockstep's own client: node 0 cannot be made to
  // answer it, and it says why.
  sockaddr_storage address{};
  const sockaddr_in node0 = node0_address();
  std::memcpy(&address, &node0, sizeof node0);
  std::string last_error;
  const auto soon = Clock::now() + std::chrono::seconds(30);
  try {
    (void)rendezvous::exchange(address, sizeof(sockaddr_in), message,
                               {"a secret that is not the job's", "the test"}, soon, last_error);
    ADD_FAILURE() << "a stranger with another secret got an answer";
  } catch (const rendezvous::AuthError& error) {
    EXPECT_NE(std::string(error.what()).find("could not prove"), std::string::npos) << error.what();
  }

  // A node with the job's secret (this user's key file, as the nodes use) and an 8-byte worker
  // address: refused, and node 0 lives on.
  const auto secret = lockstep::detail::load_job_secret(lockstep::detail::process_environment());
  auto refused = rendezvous::exchange(address, sizeof(sockaddr_in), message,
                                      {secret.bytes, secret.source}, soon, last_error);
  ASSERT_TRUE(refused.has_value()) << last_error;
  auto verdict = wire::decode(*refused);
  ASSERT_TRUE(std::holds_alternative<wire::Refuse>(verdict));
  EXPECT_NE(std::get<wire::Refuse>(verdict).reason.find("worker address"), std::string::npos)
      << std::get<wire::Refuse>(verdict).reason;

  start(1, 2, 1, {"rounds", shared_.string(), "20"});
  wait_all();
  EXPECT_EQ(nodes_[0].code(), 0) << all_output();
  EXPECT_EQ(nodes_[1].code(), 0) << all_output();
}

// Nodes that hold different secrets: the joining node says so at once, naming its secret's
// source; node 0 names the node that could not prove the secret when its join times out.
TEST_P(MultiNode, NodesWithDifferentSecretsSayWhy) {
  join_timeout_ = "3";
  node_secret_[1] = "another secret, long enough to be taken";
  start(0, 2, 1, {"rounds", shared_.string(), "10"});
  start(1, 2, 1, {"rounds", shared_.string(), "10"});
  wait_all();
  EXPECT_NE(nodes_[0].code(), 0);
  EXPECT_NE(nodes_[1].code(), 0);
  EXPECT_NE(nodes_[1].output().find("could not prove that it holds this job's secret"),
            std::string::npos)
      << all_output();
  EXPECT_NE(nodes_[1].output().find("LOCKSTEP_SECRET"), std::string::npos) << all_output();
  EXPECT_NE(nodes_[0].output().find("could not prove that it holds the job's secret"),
            std::string::npos)
      << all_output();
}

// Node 0 used to wait the whole join timeout and then say that node 1 "never connected" when
// node 1 had connected and been refused. It says that it was refused, and why.
TEST_P(MultiNode, NodeZerosTimeoutSaysThatANodeWasRefused) {
  join_timeout_ = "3";
  start(0, 2, 1, {"rounds", shared_.string(), "10"});
  start(1, 2, 1, {"rounds", shared_.string(), "10"}, job_ + "-other");
  wait_all();
  EXPECT_NE(nodes_[0].code(), 0);
  const std::string output = nodes_[0].output();
  EXPECT_NE(output.find("node 1 connected from " + node_host(1) + ":"), std::string::npos)
      << all_output();
  EXPECT_NE(output.find("and was refused: it belongs to another job"), std::string::npos)
      << all_output();
}

// Issue 21 (a note): nodes started with different --nproc-per-node: node 0 waited out its join
// timeout although it had refused node 1 for that reason. Both now fail at once, saying why.
TEST_P(MultiNode, NodesThatDisagreeOnTheShapeFailAtOnce) {
  join_timeout_ = "60";
  const auto start_time = std::chrono::steady_clock::now();
  start(0, 2, 1, {"rounds", shared_.string(), "10"});
  start(1, 2, 2, {"rounds", shared_.string(), "10"});
  wait_all();
  EXPECT_LT(std::chrono::steady_clock::now() - start_time, std::chrono::seconds(30));
  EXPECT_NE(nodes_[0].code(), 0);
  EXPECT_NE(nodes_[1].code(), 0);
  EXPECT_NE(nodes_[0].output().find("node 0 refused node 1 (from " + node_host(1) + ":"),
            std::string::npos)
      << all_output();
  EXPECT_NE(nodes_[0].output().find("describes a job of 4 processes on 2 nodes"), std::string::npos)
      << all_output();
  EXPECT_NE(nodes_[0].output().find("same --nnodes and --nproc-per-node"), std::string::npos)
      << all_output();
}

TEST_P(MultiNode, TheNcclBackendRunsOrFailsCleanly) {
  // Simulated nodes share this machine's GPUs: with none (CI), or one (both leaders would take
  // it, which NCCL refuses), every process must get an error that says why, and nothing hangs.
  // With a GPU per node the job may run; either way it ends, and an error names NCCL or CUDA.
  auto built = lockstep::detail::built_backends();
  if (std::find(built.begin(), built.end(), "nccl") == built.end()) {
    GTEST_SKIP() << "this build has no NCCL backend (it needs CUDA, NCCL's header and UCX)";
  }
  for (int node = 0; node < 2; ++node) {
    start(node, 2, 1, {"rounds", shared_.string(), "100"}, "", "nccl");
  }
  wait_all();
  if (nodes_[0].code() == 0 && nodes_[1].code() == 0) {
    std::cout << "the NCCL job ran: 100 barriers over NCCL" << std::endl;
    return;
  }
  auto ends = results();
  std::cout << "the NCCL job failed, as it must here: " << ends[0] << std::endl;
  ASSERT_EQ(ends.size(), 2U) << all_output();
  for (const auto& [rank, text] : ends) {
    EXPECT_TRUE(text.starts_with("config ") || text.starts_with("error ")) << rank << ": " << text;
    EXPECT_TRUE(text.find("NCCL") != std::string::npos || text.find("CUDA") != std::string::npos)
        << rank << ": " << text;
  }
}

// Issue 21: faults across a real network. A node whose link is cut (its veth down) can no
// longer be reached: UCX's TCP connections retransmit for a quarter of an hour, and the job hung.
// Each node's link to node 0 (rendezvous.hpp) is watched by the kernel: every process of every
// node gets PeerLostError naming the node it lost, within kLinkTimeout (5 s) and a margin.
TEST_P(MultiNode, ALinkCutMidBarrierFailsEveryNodeInBoundedTime) {
  if (!netns()) {
    GTEST_SKIP() << "cuts a link: the netns variant only";
  }
  node_env_["LOCKSTEP_LINK_TIMEOUT"] = "2";  // issue 45: the bound is the user's (5 s unset)
  for (int node = 0; node < 2; ++node) {
    start(node, 2, 2, {"forever", shared_.string()});
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));  // joined, and in barriers
  const auto cut_at = Clock::now();
  namespaces_->cut(1);
  wait_all();
  const double took = std::chrono::duration<double>(Clock::now() - cut_at).count();
  std::cout << "every node ended " << took << " s after the cut" << std::endl;
  EXPECT_LT(took, 8) << "beyond the link timeout (2 s), the kernel's probe and the waits' polls";
  auto ends = results();
  ASSERT_EQ(ends.size(), 4U) << all_output();
  for (int rank : {0, 1}) {
    EXPECT_TRUE(ends[rank].starts_with("lost 2 ")) << rank << ": " << ends[rank];
  }
  for (int rank : {2, 3}) {
    EXPECT_TRUE(ends[rank].starts_with("lost 0 ")) << rank << ": " << ends[rank];
  }
  EXPECT_NE(ends[0].find("node 1's main process (process 2) is unreachable: its machine has not "
                         "answered for 2 s (LOCKSTEP_LINK_TIMEOUT"),
            std::string::npos)
      << ends[0];
}

// Between episodes: the link is cut while every process computes; the next barrier fails at once
// (the kernel found the link dead meanwhile, within the link timeout of 2 s), on the node cut off
// and on the others.
TEST_P(MultiNode, ALinkCutBetweenEpisodesFailsTheNextBarrier) {
  if (!netns()) {
    GTEST_SKIP() << "cuts a link: the netns variant only";
  }
  node_env_["LOCKSTEP_LINK_TIMEOUT"] = "2";
  for (int node = 0; node < 3; ++node) {
    start(node, 3, 1, {"pause", shared_.string(), "6000"});
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));  // through the first barrier, computing
  namespaces_->cut(2);
  wait_all();
  auto ends = results();
  ASSERT_EQ(ends.size(), 3U) << all_output();
  for (int rank : {0, 1}) {
    EXPECT_TRUE(ends[rank].starts_with("lost 2 ")) << rank << ": " << ends[rank];
  }
  EXPECT_TRUE(ends[2].starts_with("lost 0 ")) << ends[2];
  // Each found it at its first barrier after the pause, not a link timeout later.
  for (const auto& [rank, text] : ends) {
    EXPECT_NE(text.find("after the pause"), std::string::npos) << rank << ": " << text;
  }
}

// Issue 45, item 2: a node that fails after node 0's welcome (here a welcome changed on the way,
// injected: LOCKSTEP_FAULT_POINT) could die inside UCX (SIGABRT in ucp_worker_destroy) as node 0
// wired up to the worker it was destroying. Nobody wires up before every node took the welcome
// now: the node ends with its own error, never a signal, and node 0 fails at once naming it.
// (The join's order, not the network: over tcp only.)
class Welcome : public MultiNode {};

TEST_P(Welcome, ANodeThatCannotTakeItFailsCleanly) {
  for (int round = 0; round < 6; ++round) {
    nodes_.clear();
    const auto began = Clock::now();
    start(0, 3, 1, {"rounds", shared_.string(), "10"});
    start(1, 3, 1, {"rounds", shared_.string(), "10"}, "", "", "join.welcome-changed");
    start(2, 3, 1, {"rounds", shared_.string(), "10"});
    wait_all(std::chrono::seconds(30));
    const double took = std::chrono::duration<double>(Clock::now() - began).count();
    auto ends = results();
    ASSERT_EQ(ends.size(), 3U) << all_output();
    EXPECT_TRUE(ends[1].starts_with("config what=lockstep: what answers at 127.0.0.1:")) << ends[1];
    EXPECT_TRUE(
        ends[0].starts_with("lost 1 what=lockstep: joining the job: node 1's main "
                            "process (process 1) left after node 0's welcome"))
        << ends[0];
    // Node 2 took the welcome and waited for node 0's word: it learns which node could not join.
    EXPECT_TRUE(
        ends[2].starts_with("lost 1 what=lockstep: joining the job: node 1's main "
                            "process (process 1) could not join after node 0's welcome"))
        << ends[2];
    EXPECT_EQ(nodes_[0].code(), 11) << all_output();
    EXPECT_EQ(nodes_[1].code(), 12) << all_output();
    EXPECT_EQ(nodes_[2].code(), 11) << all_output();
    EXPECT_LT(took, 10) << "node 0 waited for a node that had given up";
  }
}

INSTANTIATE_TEST_SUITE_P(Ucx, Welcome, ::testing::Values("tcp"),
                         [](const auto& info) { return std::string(info.param); });

// Issue 45: a partition between two machines that both still reach node 0. Nodes 1 and 2 lose
// each other mid-run (a blackhole route, or a silent neighbour) while every link to node 0 holds:
// the leaders' own paths are watched too, so every process of every node gets PeerLostError
// within the link timeout (5 s by default) and a margin, naming the pair, and no node waits on in
// a barrier the others gave up on.
class Partition : public MultiNode {
 protected:
  // `bound`: LOCKSTEP_LINK_TIMEOUT's seconds (0: unset, 5).
  void run(bool blackhole, int bound) {
    if (!netns()) {
      GTEST_SKIP() << "parts two nodes: the netns variant only";
    }
    if (bound != 0) {
      node_env_["LOCKSTEP_LINK_TIMEOUT"] = std::to_string(bound);
    }
    for (int node = 0; node < 3; ++node) {
      start(node, 3, 2, {"forever", shared_.string()});
    }
    std::this_thread::sleep_for(std::chrono::seconds(2));  // joined, and in barriers
    const auto parted_at = Clock::now();
    namespaces_->part(1, 2, blackhole);
    wait_all(std::chrono::seconds(40));
    const double took = std::chrono::duration<double>(Clock::now() - parted_at).count();
    std::cout << "every node ended " << took << " s after the partition" << std::endl;
    EXPECT_LT(took, (bound != 0 ? bound : 5) + 5)
        << "beyond the link timeout, the kernel's probes and the polls";
    auto ends = results();
    ASSERT_EQ(ends.size(), 6U) << all_output();
    // Every process names the pair that cannot talk: node 0's too (node 0 passes on what the
    // first of the two to see it says).
    for (const auto& [rank, text] : ends) {
      EXPECT_TRUE(text.starts_with("lost ")) << rank << ": " << text;
      EXPECT_TRUE(
          text.find("node 1's main process (process 2) is gone or unreachable from node 2") !=
              std::string::npos ||
          text.find("node 2's main process (process 4) is gone or unreachable from node 1") !=
              std::string::npos)
          << rank << ": " << text;
    }
  }
};

TEST_P(Partition, ABlackholeRouteBetweenTwoNodesFailsEveryNode) {
  run(true, 0);
}

TEST_P(Partition, ASilentNeighbourBetweenTwoNodesFailsEveryNode) {
  run(false, 2);  // the user's bound
}

// An outage shorter than the link timeout (2 s of 5) is ridden out: every barrier passes.
TEST_P(Partition, AShortOutageIsRiddenOut) {
  if (!netns()) {
    GTEST_SKIP() << "parts two nodes: the netns variant only";
  }
  for (int node = 0; node < 3; ++node) {
    start(node, 3, 1, {"for", shared_.string(), "5000"});
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  namespaces_->part(1, 2, true);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  namespaces_->heal(1, 2, true);
  wait_all(std::chrono::seconds(60));
  for (const auto& node : nodes_) {
    EXPECT_EQ(node.code(), 0) << all_output();
  }
}

INSTANTIATE_TEST_SUITE_P(Ucx, Partition, ::testing::Values("netns"),
                         [](const auto& info) { return std::string(info.param); });

// Mid-join: node 1 has connected to node 0 and waits for the welcome when its link is cut; node
// 2 joins after. Nodes 0 and 2 find node 1 gone as they connect to it; node 1 times out its join.
// Node 0's connection to node 1 is UCX's blocking connect(2): it waits out the kernel's SYN
// retries (docs/across-machines.md, "A machine the network no longer reaches"; up to 127 s with
// Linux's default, 7 s in these namespaces).
TEST_P(MultiNode, ALinkCutMidJoinFailsEveryNode) {
  if (!netns()) {
    GTEST_SKIP() << "cuts a link: the netns variant only";
  }
  join_timeout_ = "10";
  start(0, 3, 1, {"rounds", shared_.string(), "100"});
  start(1, 3, 1, {"rounds", shared_.string(), "100"});
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto cut_at = Clock::now();
  namespaces_->cut(1);
  start(2, 3, 1, {"rounds", shared_.string(), "100"});
  wait_all(std::chrono::seconds(180));
  const double took = std::chrono::duration<double>(Clock::now() - cut_at).count();
  std::cout << "every node ended " << took << " s after the cut" << std::endl;
  EXPECT_LT(took, 45) << "beyond the namespaces' SYN retries (7 s) and the join timeout";
  auto ends = results();
  ASSERT_EQ(ends.size(), 3U) << all_output();
  for (int rank : {0, 2}) {
    EXPECT_TRUE(ends[rank].starts_with("lost 1 ")) << rank << ": " << ends[rank];
  }
  EXPECT_TRUE(ends[1].starts_with("timeout ")) << ends[1];
  EXPECT_NE(ends[1].find("could not join node 0's main process at 10.77.0.1:"), std::string::npos)
      << ends[1];
}

INSTANTIATE_TEST_SUITE_P(Ucx, MultiNode, ::testing::Values("tcp", "default", "netns"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
