// The cross-node backends driven directly: each forked process is one node's leader.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu/devices.hpp"
#include "lockstep/error.hpp"
#include "membership/backend.hpp"
#include "ranks.hpp"

namespace {

using lockstep::detail::Bootstrap;
using lockstep::detail::Failure;
using lockstep::detail::FailureKind;
using lockstep::detail::JobConfig;
using lockstep::detail::LeaderConfig;
using lockstep::detail::Leaders;
using lockstep::testing::contains;
using lockstep::testing::failures;
using lockstep::testing::Job;
using lockstep::testing::run_ranks;
using Clock = std::chrono::steady_clock;

using lockstep::testing::free_port;

bool built(const std::string& name) {
  auto names = lockstep::detail::built_backends();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// What node `node` of `nodes` (one process each) brings to a join through `backend`.
LeaderConfig leader(const std::string& backend, int node, int nodes, int port) {
  ::setenv("UCX_NET_DEVICES", "lo", 1);  // NOLINT(concurrency-mt-unsafe): a forked child
  // The leaders' shared secret, so that nothing is written to the user's home.
  ::setenv("LOCKSTEP_SECRET", "the backend test's secret", 1);  // NOLINT(concurrency-mt-unsafe)
  JobConfig job;
  job.source = "test";
  job.rank = node;
  job.world_size = nodes;
  job.local_rank = 0;
  job.local_size = 1;
  job.node_index = node;
  job.num_nodes = nodes;
  job.identity = "job=backend-test-" + std::to_string(port);
  job.master_addr = "127.0.0.1";
  job.rendezvous_port = port;
  job.rendezvous_port_source = "test";
  job.backend = backend;
  // One leader per process (each node is a forked process): the waiter lives as long.
  static lockstep::detail::Waiter waiter(lockstep::WaitPolicy::adaptive,
                                         lockstep::detail::WaitShape{1, 1, true});
  return LeaderConfig{job, {node}, &waiter, Clock::now() + std::chrono::seconds(30), {}};
}

// Node `node` of `nodes`, leading through `backend`.
std::unique_ptr<Leaders> join(const std::string& backend, int node, int nodes, int port) {
  return lockstep::detail::join_leaders(leader(backend, node, nodes, port));
}

std::vector<std::byte> blob_of(std::size_t size, int seed) {
  std::vector<std::byte> blob(size);
  for (std::size_t i = 0; i < size; ++i) {
    blob[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(seed)) & 0xff);
  }
  return blob;
}

TEST(UcxBackend, Barriers) {
  if (!built("ucx")) {
    GTEST_SKIP() << "built without UCX";
  }
  const int port = free_port();
  auto ends = run_ranks(Job::plain_process(), [](int) {});  // warm the harness
  Job job = Job::of(3);
  job.plain = true;
  ends = run_ranks(job, [port](int node) {
    auto leaders = join("ucx", node, 3, port);
    RANK_CHECK(std::string(leaders->name()) == "ucx");
    RANK_CHECK(leaders->nodes().size() == 3);
    RANK_CHECK(leaders->nodes()[2].ranks == std::vector<int>{2});
    for (int round = 0; round < 300; ++round) {
      leaders->barrier(std::nullopt, "barrier");
    }
  });
  EXPECT_EQ(failures(ends), "");
}

// UCX as another backend's bootstrap: broadcasts of every size, in order, with polls between.
TEST(UcxBootstrap, BroadcastsOfEverySize) {
  if (!built("ucx")) {
    GTEST_SKIP() << "built without UCX";
  }
  const int port = free_port();
  Job job = Job::of(3);
  job.plain = true;
  // Node 0 only sends, so the test holds it back: it stays at most kMaxAhead broadcasts ahead
  // (a receiver keeps at most Bootstrap::kMaxAhead unread ones). No node ends before every node
  // has stopped polling: an end is reported to the others as a lost leader.
  auto* got = lockstep::testing::shared_array<std::atomic<int>>(3);
  auto* quiet = lockstep::testing::shared_array<std::atomic<int>>(1);
  auto ends = run_ranks(job, [port, got, quiet](int node) {
    auto bootstrap = lockstep::detail::make_bootstrap(leader("ucx", node, 3, port));
    RANK_CHECK(bootstrap->nodes().size() == 3);
    auto others_got = [&] { return std::min(got[1].load(), got[2].load()); };
    auto hold = [&](int round) {
      while (node == 0 && round - others_got() >= Bootstrap::kMaxAhead) {
        bootstrap->poll("poll");
      }
    };
    for (int round = 0; round < 60; ++round) {
      hold(round);
      // Sizes 0 .. the limit; node 0's blob reaches everyone, whatever the others pass.
      std::size_t size = static_cast<std::size_t>(round) * 71 % (Bootstrap::kMaxBlob + 1);
      auto mine = node == 0 ? blob_of(size, round) : std::vector<std::byte>{};
      auto blob = bootstrap->broadcast(mine, Clock::now() + std::chrono::seconds(20), "broadcast");
      RANK_CHECK(blob == blob_of(size, round));
      got[node].store(round + 1);
      bootstrap->poll("poll");
      bootstrap->check_aborted("check");
    }
    if (node == 0) {
      try {
        (void)bootstrap->broadcast(blob_of(Bootstrap::kMaxBlob + 1, 0), std::nullopt, "broadcast");
        RANK_CHECK(false);
      } catch (const lockstep::Error& error) {
        RANK_CHECK(contains(error.what(), "at most"));
      }
    }
    // Still usable after a refused blob (and held back like the others: without that, node 0
    // was once 17 ahead of a slow node here, which then waited for the last blob for ever).
    hold(60);
    auto last = node == 0 ? blob_of(5, 1) : std::vector<std::byte>{};
    RANK_CHECK(bootstrap->broadcast(last, std::nullopt, "broadcast") == blob_of(5, 1));
    got[node].store(1000);
    // Everyone keeps the exchange moving until all have everything, then waits, no longer
    // polling, until all have stopped: only then may a node end.
    while (std::min(others_got(), got[0].load()) != 1000) {
      bootstrap->poll("poll");
    }
    quiet[0].fetch_add(1);
    while (quiet[0].load() != 3) {
      std::this_thread::yield();
    }
  });
  EXPECT_EQ(failures(ends), "");
}

// Node 0 gets further ahead than a leader keeps: that leader's next call says so (a blob past
// the window was once dropped, and the leader waited for it for ever).
TEST(UcxBootstrap, TooFarAheadIsAnError) {
  if (!built("ucx")) {
    GTEST_SKIP() << "built without UCX";
  }
  const int port = free_port();
  Job job = Job::of(2);
  job.plain = true;
  auto* told = lockstep::testing::shared_array<std::atomic<int>>(1);
  auto ends = run_ranks(job, [port, told](int node) {
    auto bootstrap = lockstep::detail::make_bootstrap(leader("ucx", node, 2, port));
    if (node == 0) {
      for (int round = 0; round <= Bootstrap::kMaxAhead; ++round) {
        (void)bootstrap->broadcast(blob_of(3, round), std::nullopt, "broadcast");
      }
      // Every blob leaves before node 0 stops polling; it ends once node 1 has seen the error
      // (an end would be reported as a lost leader instead).
      while (told[0].load() == 0) {
        bootstrap->poll("poll");
      }
      return;
    }
    // Node 1 takes none of them, only progresses, until it is told (polling throws the job's
    // failure); then its broadcast throws the same.
    std::string said;
    const auto until = Clock::now() + std::chrono::seconds(10);
    try {
      while (Clock::now() < until) {
        bootstrap->poll("poll");
      }
    } catch (const lockstep::Error& error) {
      said = error.what();
    }
    RANK_CHECK(contains(said,
                        "node 0 sent broadcast 16 while node 1 had taken 0: a leader keeps "
                        "at most 16 broadcasts that it has not asked for"));
    try {
      (void)bootstrap->broadcast({}, std::nullopt, "broadcast");
      RANK_CHECK(false);
    } catch (const lockstep::Error& error) {
      RANK_CHECK(contains(error.what(), "node 0 sent broadcast 16"));
    }
    told[0].store(1);
  });
  EXPECT_EQ(failures(ends), "");
}

TEST(UcxBackend, AnAbortReachesEveryLeader) {
  if (!built("ucx")) {
    GTEST_SKIP() << "built without UCX";
  }
  const int port = free_port();
  Job job = Job::of(3);
  job.plain = true;
  auto ends = run_ranks(job, [port](int node) {
    auto leaders = join("ucx", node, 3, port);
    try {
      // Node 1 aborts once it is through the first barrier, which the others may not be yet:
      // they fail in the first barrier or in the second.
      leaders->barrier(Clock::now() + std::chrono::seconds(20), "barrier");
      if (node == 1) {
        leaders->abort(Failure{FailureKind::peer_lost, 7, {}, "process 7 died"});
        return;
      }
      leaders->barrier(Clock::now() + std::chrono::seconds(20), "barrier");
    } catch (const lockstep::PeerLostError& error) {
      RANK_CHECK(node != 1);
      RANK_CHECK(error.process_index() == 7);
      RANK_CHECK(contains(error.what(), "node 1 gave up: process 7 died"));
      // Broken for good: the next call throws the same.
      try {
        leaders->barrier(std::nullopt, "again");
      } catch (const lockstep::PeerLostError& again) {
        RANK_CHECK(contains(again.what(), "process 7 died"));
        return;
      }
      RANK_CHECK(false);
    }
    RANK_CHECK(false);
  });
  EXPECT_EQ(failures(ends), "");
}

// NCCL with one node: the communicator (set up through a UCX bootstrap) and its all-reduce
// barrier, on a GPU.
TEST(NcclBackend, OneNodeOnAGpu) {
  if (!built("nccl")) {
    GTEST_SKIP() << "built without the NCCL backend";
  }
  auto* device = lockstep::testing::shared_array<int>(1);
  auto probe = run_ranks(Job::plain_process(),
                         [device](int) { *device = lockstep::detail::visible_device(0); });
  ASSERT_EQ(failures(probe), "");
  if (*device < 0) {
    GTEST_SKIP() << "no CUDA device here: tools/gpu-check runs this on a machine with one";
  }
  const int port = free_port();
  auto ends = run_ranks(Job::plain_process(), [port](int) {
    auto leaders = join("nccl", 0, 1, port);
    RANK_CHECK(std::string(leaders->name()) == "nccl");
    for (int round = 0; round < 1000; ++round) {
      leaders->barrier(Clock::now() + std::chrono::seconds(20), "barrier");
    }
  });
  EXPECT_EQ(failures(ends), "");
}

// Allgathers and shares of every size between three leaders, each node's part its own size (0, a
// chunk's edges, several chunks), byte for byte, with barriers between some of them.
TEST(UcxBackend, AllgathersOfEverySize) {
  if (!built("ucx")) {
    GTEST_SKIP() << "built without UCX";
  }
  const int port = free_port();
  Job job = Job::of(3);
  job.plain = true;
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  const std::vector<std::size_t> sizes{0,          1,          4096,           kChunk - 1, kChunk,
                                       kChunk + 1, 3 * kChunk, 5 * kChunk + 7, 17 * kChunk};
  auto ends = run_ranks(job, [port, &sizes](int node) {
    auto leaders = join("ucx", node, 3, port);
    for (int round = 0; round < static_cast<int>(sizes.size()) + 6; ++round) {
      const auto size_of = [&](int of) {
        return sizes[static_cast<std::size_t>(round + 4 * of) % sizes.size()];
      };
      const auto parts = leaders->allgather(blob_of(size_of(node), node + 7 * round),
                                            Clock::now() + std::chrono::seconds(60), "allgather");
      RANK_CHECK(parts.size() == 3);
      for (int of = 0; of < 3; ++of) {
        RANK_CHECK(parts[static_cast<std::size_t>(of)] == blob_of(size_of(of), of + 7 * round));
      }
      // Node 0's bytes alone, as a broadcast shares them (the others' are ignored).
      const auto own = blob_of(size_of(node), 100 + node + 7 * round);
      RANK_CHECK(leaders->share(own, Clock::now() + std::chrono::seconds(60), "share") ==
                 blob_of(size_of(0), 100 + 7 * round));
      if (round % 3 == 0) {
        leaders->barrier(std::nullopt, "barrier");
      }
    }
    leaders->barrier(std::nullopt, "barrier");  // none ends while another still receives
  });
  EXPECT_EQ(failures(ends), "");
}

// A leader killed while it sends a large part: the others' allgather (or, where its part had
// all arrived, the barrier after it) throws, naming the lost leader, long before the deadline.
TEST(UcxBackend, ALeaderKilledMidAllgatherFailsTheOthers) {
  if (!built("ucx")) {
    GTEST_SKIP() << "built without UCX";
  }
  const int port = free_port();
  Job job = Job::of(3);
  job.plain = true;
  auto ends = run_ranks(job, [port](int node) {
    auto leaders = join("ucx", node, 3, port);
    leaders->barrier(std::nullopt, "barrier");
    const auto part = blob_of(std::size_t{64} << 20, node);
    if (node == 2) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        ::kill(::getpid(), SIGKILL);
      }).detach();
    }
    try {
      (void)leaders->allgather(part, Clock::now() + std::chrono::seconds(30), "allgather");
      leaders->barrier(Clock::now() + std::chrono::seconds(30), "barrier");
      RANK_CHECK(!"the job went on without the killed leader");
    } catch (const lockstep::TimeoutError&) {
      RANK_CHECK(!"it waited for the killed leader until its deadline");
    } catch (const lockstep::Error& error) {
      RANK_CHECK(contains(error.what(), "node 2") || contains(error.what(), "process 2"));
    }
  });
  EXPECT_EQ(failures(ends, 2), "");
}

// Leaders as Context uses them: a backend that throws, or returns parts that do not match the
// machines, breaks the job for good (every later call throws the same, without the backend).
class ScriptedBackend final : public lockstep::detail::Backend {
 public:
  explicit ScriptedBackend(std::size_t parts) : parts_(parts) { nodes_.resize(2); }
  [[nodiscard]] const char* name() const noexcept override { return "scripted"; }
  [[nodiscard]] const std::vector<lockstep::detail::NodeInfo>& nodes() const noexcept override {
    return nodes_;
  }
  void barrier(std::optional<Clock::time_point> /*deadline*/, const char* /*what*/) override {
    ++calls;
  }
  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> /*part*/,
                                                std::optional<Clock::time_point> /*deadline*/,
                                                const char* what) override {
    ++calls;
    if (parts_ == 0) {
      throw lockstep::PeerLostError(std::string(what) + ": node 1 is gone", 1);
    }
    return std::vector<std::vector<std::byte>>(parts_);
  }
  std::vector<std::byte> share(std::span<const std::byte> data,
                               std::optional<Clock::time_point> /*deadline*/,
                               const char* what) override {
    ++calls;
    if (parts_ == 0) {
      throw lockstep::PeerLostError(std::string(what) + ": node 1 is gone", 1);
    }
    return {data.begin(), data.end()};
  }
  void abort(const Failure& /*failure*/) noexcept override {}

  int calls = 0;

 private:
  std::size_t parts_;
  std::vector<lockstep::detail::NodeInfo> nodes_;
};

TEST(Leaders, AFailedAllgatherBreaksTheJob) {
  for (const std::size_t parts : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
    auto backend = std::make_unique<ScriptedBackend>(parts);
    ScriptedBackend& seen = *backend;
    Leaders leaders(std::move(backend));
    const char* expected = parts == 0 ? "node 1 is gone" : "returned";
    try {
      (void)leaders.allgather({}, std::nullopt, "gather_object");
      ADD_FAILURE() << "a broken allgather returned";
    } catch (const lockstep::Error& error) {
      EXPECT_TRUE(contains(error.what(), expected)) << error.what();
    }
    for (int i = 0; i < 2; ++i) {
      try {
        if (i == 0) {
          (void)leaders.allgather({}, std::nullopt, "gather_object");
        } else {
          leaders.barrier(std::nullopt, "wait_for_everyone");
        }
        ADD_FAILURE() << "a broken job went on";
      } catch (const lockstep::Error& error) {
        EXPECT_TRUE(contains(error.what(), "the job cannot go on")) << error.what();
        EXPECT_TRUE(contains(error.what(), expected)) << error.what();
      }
    }
    EXPECT_EQ(seen.calls, 1);
  }
  // Two parts for two machines: what the backend gave.
  Leaders whole(std::make_unique<ScriptedBackend>(2));
  EXPECT_EQ(whole.allgather({}, std::nullopt, "gather_object").size(), 2U);
  // A share that throws breaks the job as well.
  Leaders lost(std::make_unique<ScriptedBackend>(0));
  EXPECT_THROW((void)lost.share({}, std::nullopt, "broadcast"), lockstep::PeerLostError);
  try {
    lost.barrier(std::nullopt, "wait_for_everyone");
    ADD_FAILURE() << "a broken job went on";
  } catch (const lockstep::Error& error) {
    EXPECT_TRUE(contains(error.what(), "wait_for_everyone: the job cannot go on: node 1 is gone"))
        << error.what();
  }
}

}  // namespace
