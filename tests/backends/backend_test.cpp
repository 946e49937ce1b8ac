// The cross-node backends driven directly: each forked process is one node's leader.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/little_endian.hpp"
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

// Leaders::share as another node's leader sees it: node 0's chunks come from the network, and
// whatever they are, share() returns node 0's bytes whole or throws an Error that says what was
// wrong, and the job stays broken after it (every later call throws the same). A backend that
// hands out the chunks given.
class ScriptedBackend final : public lockstep::detail::Backend {
 public:
  explicit ScriptedBackend(std::deque<std::vector<std::byte>> chunks)
      : chunks_(std::move(chunks)) {}
  [[nodiscard]] const char* name() const noexcept override { return "scripted"; }
  [[nodiscard]] const std::vector<lockstep::detail::NodeInfo>& nodes() const noexcept override {
    return nodes_;
  }
  void barrier(std::optional<Clock::time_point> /*deadline*/, const char* /*what*/) override {
    ++barriers;
  }
  std::vector<std::byte> broadcast(std::span<const std::byte> blob,
                                   std::optional<Clock::time_point> /*deadline*/,
                                   const char* what) override {
    if (!blob.empty()) {
      sent.emplace_back(blob.begin(), blob.end());
      return {blob.begin(), blob.end()};
    }
    if (chunks_.empty()) {
      throw lockstep::TimeoutError(std::string(what) + ": node 0 sent nothing more", {});
    }
    std::vector<std::byte> chunk = std::move(chunks_.front());
    chunks_.pop_front();
    return chunk;
  }
  std::vector<std::vector<std::byte>> gather(std::span<const std::byte> part,
                                             std::optional<Clock::time_point> /*deadline*/,
                                             const char* /*what*/) override {
    sent.emplace_back(part.begin(), part.end());
    return {};
  }
  void abort(const Failure& /*failure*/) noexcept override {}

  int barriers = 0;
  std::vector<std::vector<std::byte>> sent;

 private:
  std::deque<std::vector<std::byte>> chunks_;
  std::vector<lockstep::detail::NodeInfo> nodes_;
};

std::vector<std::byte> framed(std::uint64_t length, std::size_t body, std::byte fill) {
  std::vector<std::byte> out(8 + body, fill);
  lockstep::detail::put_le(out.data(), length, 8);
  return out;
}

std::string share_error(std::deque<std::vector<std::byte>> chunks) {
  Leaders leaders(std::make_unique<ScriptedBackend>(std::move(chunks)));
  try {
    (void)leaders.share({}, false, std::nullopt, "broadcast");
  } catch (const lockstep::Error& error) {
    return error.what();
  }
  return "";
}

TEST(LeadersShare, ReassemblesNodeZerosChunks) {
  constexpr std::size_t kChunk = Bootstrap::kMaxBlob;
  std::vector<std::byte> data(Leaders::kMaxShare);
  for (std::size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<std::byte>(i * 7 + 3);
  }
  // Node 0: the length, then the data, in chunks of at most kMaxBlob.
  auto sender = std::make_unique<ScriptedBackend>(std::deque<std::vector<std::byte>>{});
  ScriptedBackend& out = *sender;
  Leaders node0(std::move(sender));
  EXPECT_EQ(node0.share(data, true, std::nullopt, "broadcast"), data);
  ASSERT_EQ(out.sent.size(), (8 + data.size() + kChunk - 1) / kChunk);
  EXPECT_EQ(lockstep::detail::get_le(out.sent[0].data(), 8), data.size());
  std::deque<std::vector<std::byte>> chunks;
  for (const auto& chunk : out.sent) {
    EXPECT_LE(chunk.size(), kChunk);
    chunks.push_back(chunk);
  }
  // Another node: node 0's chunks, whole again.
  Leaders other(std::make_unique<ScriptedBackend>(chunks));
  EXPECT_EQ(other.share({}, false, std::nullopt, "broadcast"), data);
  // Nothing, in one chunk of the length alone.
  Leaders empty(std::make_unique<ScriptedBackend>(
      std::deque<std::vector<std::byte>>{framed(0, 0, std::byte{0})}));
  EXPECT_TRUE(empty.share({}, false, std::nullopt, "broadcast").empty());
  // More than kMaxShare bytes never leave node 0.
  Leaders too_much(std::make_unique<ScriptedBackend>(std::deque<std::vector<std::byte>>{}));
  std::vector<std::byte> big(Leaders::kMaxShare + 1);
  try {
    (void)too_much.share(big, true, std::nullopt, "broadcast");
    ADD_FAILURE() << "a share above kMaxShare was sent";
  } catch (const lockstep::Error& error) {
    EXPECT_TRUE(contains(error.what(), "at most 49152 bytes travel between machines, not 49153"))
        << error.what();
  }
}

TEST(LeadersShare, RefusesChunksThatAreNotNodeZerosAndStaysBroken) {
  // Shorter than the length.
  EXPECT_TRUE(contains(share_error({std::vector<std::byte>(3)}),
                       "node 0 sent a broadcast that is not lockstep's (3 bytes, length 0)"));
  EXPECT_TRUE(contains(share_error({std::vector<std::byte>{}}), "that is not lockstep's (0 bytes"));
  // A length above kMaxShare: nothing is allocated for it.
  EXPECT_TRUE(contains(share_error({framed(std::uint64_t{1} << 62, 0, std::byte{1})}),
                       "not lockstep's (8 bytes, length 4611686018427387904)"));
  EXPECT_TRUE(
      contains(share_error({framed(Leaders::kMaxShare + 1, 100, std::byte{1})}), "not lockstep's"));
  // Pieces beyond the length, and an empty piece.
  EXPECT_TRUE(contains(share_error({framed(10, 4, std::byte{1}), std::vector<std::byte>(7)}),
                       "node 0's broadcast came in pieces that do not add up"));
  EXPECT_TRUE(contains(share_error({framed(10, 4, std::byte{1}), std::vector<std::byte>{}}),
                       "pieces that do not add up"));
  // A first piece longer than the length it leads.
  EXPECT_TRUE(contains(share_error({framed(10, 11, std::byte{1})}), "do not add up"));

  // Broken for good: the next share and barrier throw the same, without reaching the backend.
  auto backend = std::make_unique<ScriptedBackend>(
      std::deque<std::vector<std::byte>>{std::vector<std::byte>(3), framed(1, 1, std::byte{9})});
  ScriptedBackend& seen = *backend;
  Leaders leaders(std::move(backend));
  EXPECT_THROW((void)leaders.share({}, false, std::nullopt, "broadcast"), lockstep::Error);
  for (int i = 0; i < 2; ++i) {
    try {
      if (i == 0) {
        (void)leaders.share({}, false, std::nullopt, "broadcast");
      } else {
        leaders.barrier(std::nullopt, "wait_for_everyone");
      }
      ADD_FAILURE() << "a broken job went on";
    } catch (const lockstep::Error& error) {
      EXPECT_TRUE(contains(error.what(), "the job cannot go on")) << error.what();
      EXPECT_TRUE(contains(error.what(), "not lockstep's")) << error.what();
    }
  }
  EXPECT_EQ(seen.barriers, 0);
}

// Random chunks, as a hostile node 0 might send them: share() returns exactly the announced
// length or throws lockstep::Error; it never crashes, reads past a chunk or allocates beyond
// kMaxShare (the sanitizer builds run this too).
TEST(LeadersShare, RandomChunksEndInDataOrAnError) {
  std::mt19937_64 random(20261203);
  const auto below = [&](std::uint64_t n) { return n == 0 ? 0 : random() % n; };
  int whole = 0;
  int refused = 0;
  for (int round = 0; round < 3000; ++round) {
    // Node 0's chunks for a random length (mostly within kMaxShare), split at random points...
    const std::uint64_t length =
        below(8) == 0 ? random() : below(Leaders::kMaxShare + Leaders::kMaxShare / 8);
    std::vector<std::byte> stream(8 + std::min<std::uint64_t>(length, 2 * Leaders::kMaxShare));
    for (auto& b : stream) {
      b = static_cast<std::byte>(random());
    }
    lockstep::detail::put_le(stream.data(), length, 8);
    std::deque<std::vector<std::byte>> chunks;
    for (std::size_t at = 0; at < stream.size();) {
      const std::size_t n =
          std::min<std::size_t>(1 + below(Bootstrap::kMaxBlob), stream.size() - at);
      chunks.emplace_back(stream.begin() + static_cast<std::ptrdiff_t>(at),
                          stream.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
    }
    // ...then, two rounds in three, one thing changed.
    auto& some = chunks[below(chunks.size())];
    switch (below(9)) {
      case 0:
        some.resize(below(some.size() + 20));
        break;
      case 1:
        chunks.insert(chunks.begin() + static_cast<std::ptrdiff_t>(below(chunks.size() + 1)),
                      std::vector<std::byte>(below(3) == 0 ? 0 : 1 + below(100)));
        break;
      case 2:
        chunks.pop_back();
        break;
      case 3:
        chunks.front()[below(std::min<std::size_t>(8, chunks.front().size()))] ^=
            static_cast<std::byte>(1 + below(255));
        break;
      case 4:
        chunks.emplace_back(1 + below(10));
        break;
      case 5:
        chunks.front().resize(below(8));
        break;
      default:
        break;  // as node 0 sent them
    }
    if (chunks.empty()) {
      chunks.emplace_back();
    }
    const std::uint64_t announced =
        chunks.front().size() >= 8 ? lockstep::detail::get_le(chunks.front().data(), 8) : 0;
    std::vector<std::byte> sent;
    for (const auto& chunk : chunks) {
      sent.insert(sent.end(), chunk.begin(), chunk.end());
    }
    Leaders leaders(std::make_unique<ScriptedBackend>(chunks));
    try {
      const auto data = leaders.share({}, false, std::nullopt, "broadcast");
      ASSERT_EQ(data.size(), announced);
      ASSERT_LE(data.size(), Leaders::kMaxShare);
      ASSERT_TRUE(std::equal(data.begin(), data.end(), sent.begin() + 8));
      ++whole;
    } catch (const lockstep::Error& error) {
      ASSERT_TRUE(contains(error.what(), "broadcast")) << error.what();
      ++refused;
    }
  }
  EXPECT_GT(whole, 300) << "too few rounds reassembled: the rounds test little";
  EXPECT_GT(refused, 300);
}

}  // namespace
