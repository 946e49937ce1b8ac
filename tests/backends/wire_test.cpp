// The UCX backend's wire format, pinned byte for byte (backends/ucx/wire.hpp), in every build:
// the fuzzer (clang only) checks that decoding is safe; these check that the format does not
// change by accident, and that what decodes is what was sent. Also the finding of UCX's
// connections under its event fd (paths.hpp), which needs no UCX either.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/little_endian.hpp"
#include "hex.hpp"
#include "ranks.hpp"  // LOCKSTEP_TEST_ASAN
#include "ucx/part_inbox.hpp"
#include "ucx/paths.hpp"
#include "ucx/places.hpp"
#include "ucx/rendezvous.hpp"
#include "ucx/wire.hpp"

namespace lockstep::detail::wire {
namespace {

using lockstep::testing::hex;
using lockstep::testing::unhex;
std::vector<std::byte> bytes(const std::string& text) {
  return lockstep::testing::bytes_of(text);
}

constexpr std::uint64_t kToken = 0x0123'4567'89ab'cdefULL;
// Two processes of one boot and pid namespace.
constexpr ProcessMark kMark{
    {0x0123'4567'89ab'cdefULL, 0xfedc'ba98'7654'3210ULL}, 4026531836, 1234, 98765};
constexpr ProcessMark kOtherMark{
    {0x0123'4567'89ab'cdefULL, 0xfedc'ba98'7654'3210ULL}, 4026531836, 1300, 98800};

struct Golden {
  Message message;
  const char* bytes;  // "LKS1", version 4, kind, then the fields, little-endian
};

// NOLINTNEXTLINE(cert-err58-cpp): a test's fixed data
const Golden kGolden[] = {
    {Hello{"job=a@h:1", 2, 4, 1, {2, 3}, bytes("addr"), kMark},
     "4c4b533104000100090000006a6f623d6140683a3102000000040000000100000002000000020000000300000004"
     "00000061646472efcdab89674523011032547698badcfefcffffef00000000d2040000cd81010000000000"},
    {Welcome{kToken, {{0, {0, 1}, bytes("A"), kMark}, {1, {2, 3}, bytes("B"), kOtherMark}}},
     "4c4b533104000200efcdab896745230102000000000000000200000000000000010000000100000041efcdab8967"
     "4523011032547698badcfefcffffef00000000d2040000cd810100000000000100000002000000020000000300000"
     "0"
     "0100000042efcdab89674523011032547698badcfefcffffef0000000014050000f081010000000000"},
    {Refuse{"no"}, "4c4b533104000300020000006e6f"},
    {Arrive{kToken, 1, 42, 3, {0x5}},
     "4c4b533104000400efcdab8967452301010000002a0000000000000003000000010000000500000000000000"},
    {Abort{kToken, 1, 2, -1, {2, 3}, "gone"},
     "4c4b533104000500efcdab89674523010100000002000000ffffffff020000000200000003000000040000006"
     "76f6e65"},
    {Blob{kToken, 0, 7, bytes("id")},
     "4c4b533104000600efcdab8967452301000000000700000000000000020000006964"},
    {Chunk{kToken, 2, 7, 3000000, 1048576, 1048576},
     "4c4b533104000800efcdab8967452301020000000700000000000000c0c62d00000000000000100000000000"
     "0000100000000000"},
};

TEST(Wire, EachKindEncodesToItsPinnedBytes) {
  for (const auto& golden : kGolden) {
    EXPECT_EQ(hex(encode(golden.message)), golden.bytes) << "kind " << golden.message.index() + 1;
  }
}

TEST(Wire, ThePinnedBytesDecodeToTheSameMessage) {
  for (const auto& golden : kGolden) {
    const Message decoded = decode(unhex(golden.bytes));
    EXPECT_EQ(decoded.index(), golden.message.index());
    EXPECT_EQ(hex(encode(decoded)), golden.bytes);
  }
  const auto hello = std::get<Hello>(decode(unhex(kGolden[0].bytes)));
  EXPECT_EQ(hello.identity, "job=a@h:1");
  EXPECT_EQ(hello.ranks, (std::vector<std::int32_t>{2, 3}));
  EXPECT_EQ(hello.process, kMark);
  const auto welcome = std::get<Welcome>(decode(unhex(kGolden[1].bytes)));
  EXPECT_EQ(welcome.nodes.at(1).process, kOtherMark);
}

TEST(Wire, TruncatedForeignAndOverLimitMessagesAreRefused) {
  const auto hello = unhex(kGolden[0].bytes);
  for (std::size_t length = 0; length < hello.size(); ++length) {
    EXPECT_THROW((void)decode(std::span(hello).first(length)), WireError) << length;
  }
  auto trailing = hello;
  trailing.push_back(std::byte{0});
  EXPECT_THROW((void)decode(trailing), WireError);
  auto other_version = hello;
  other_version[4] = std::byte{3};  // the hello without its process mark
  EXPECT_THROW((void)decode(other_version), WireError);
  other_version[4] = std::byte{2};  // gathers in pieces: no chunks
  EXPECT_THROW((void)decode(other_version), WireError);
  auto unknown_kind = hello;
  unknown_kind[6] = std::byte{7};  // the pieces of a gather, no longer sent
  EXPECT_THROW((void)decode(unknown_kind), WireError);
  // An identity length of 2^32 - 1: over the limit, never allocated.
  auto huge = unhex(
      "4c4b53310400010"
      "0ffffffff");
  EXPECT_THROW((void)decode(huge), WireError);
}

// The chunks of an allgather's parts, as node 0 of 3 takes them (ucx/part_inbox.hpp).
using ucx::ChunkPlace;
using ucx::PartInbox;
using Verdict = ChunkPlace::Verdict;

Chunk chunk_of(std::uint32_t from, std::uint64_t sequence, std::uint64_t total,
               std::uint64_t index) {
  return {kToken, from, sequence, total, index * kChunk, PartInbox::chunk_length(total, index)};
}

TEST(PartInbox, ChunksInAnyOrderMakeTheParts) {
  PartInbox inbox(0, 3, kToken, 4, kMaxTotal);
  const std::uint64_t total = 3 * kChunk + 5;
  EXPECT_EQ(PartInbox::chunks(0), 1U);
  EXPECT_EQ(PartInbox::chunks(kChunk), 1U);
  EXPECT_EQ(PartInbox::chunks(total), 4U);
  EXPECT_EQ(PartInbox::chunk_length(total, 3), 5U);
  EXPECT_EQ(inbox.missing(), (std::vector<int>{1, 2}));
  for (const std::uint64_t index : {2, 0, 3, 1}) {
    const Chunk head = chunk_of(1, 0, total, index);
    const ChunkPlace place = inbox.place(head, head.length);
    ASSERT_EQ(place.verdict, Verdict::take) << place.why;
    std::fill_n(place.at, head.length, static_cast<std::byte>(index + 1));
    inbox.received(head, true);
  }
  EXPECT_EQ(inbox.missing(), (std::vector<int>{2}));
  // Node 2's empty part, and its chunk of the next exchange, early (a leader one ahead).
  ASSERT_EQ(inbox.place(chunk_of(2, 0, 0, 0), 0).verdict, Verdict::take);
  inbox.received(chunk_of(2, 0, 0, 0), true);
  const ChunkPlace early = inbox.place(chunk_of(2, 1, 7, 0), 7);
  ASSERT_EQ(early.verdict, Verdict::take);
  std::fill_n(early.at, 7, std::byte{9});
  inbox.received(chunk_of(2, 1, 7, 0), true);
  EXPECT_TRUE(inbox.missing().empty());
  auto parts = inbox.finish();
  ASSERT_EQ(parts.size(), 3U);
  ASSERT_EQ(parts[1].size(), total);
  EXPECT_EQ(parts[1][0], std::byte{1});
  EXPECT_EQ(parts[1][kChunk], std::byte{2});
  EXPECT_EQ(parts[1][total - 1], std::byte{4});
  EXPECT_TRUE(parts[2].empty());
  EXPECT_EQ(inbox.current(), 1U);
  EXPECT_EQ(inbox.missing(), (std::vector<int>{1}));  // node 2's came early
  // An exchange that has ended: its chunks are dropped.
  EXPECT_EQ(inbox.place(chunk_of(1, 0, total, 0), kChunk).verdict, Verdict::drop);
}

TEST(PartInbox, ChunksThatAreNotThePartsAreRefusedOrDropped) {
  const std::uint64_t total = 2 * kChunk;
  const auto verdict = [](const Chunk& head, std::size_t length, std::string* why = nullptr) {
    PartInbox inbox(0, 3, kToken, 4, kMaxTotal);
    const Chunk first = chunk_of(1, 0, total, 0);
    (void)inbox.place(first, first.length);  // node 1 announced 2 chunks
    const ChunkPlace place = inbox.place(head, length);
    if (why != nullptr) {
      *why = place.why;
    }
    return place.verdict;
  };
  Chunk head = chunk_of(2, 0, total, 0);
  head.token ^= 1;
  EXPECT_EQ(verdict(head, kChunk), Verdict::drop);                      // another job's
  EXPECT_EQ(verdict(chunk_of(0, 0, total, 0), kChunk), Verdict::drop);  // this node's own
  EXPECT_EQ(verdict(chunk_of(3, 0, total, 0), kChunk), Verdict::drop);  // no such node
  std::string why;
  EXPECT_EQ(verdict(chunk_of(1, 0, total, 0), kChunk, &why), Verdict::refuse);
  EXPECT_EQ(why, "node 1 sent the chunk at 0 of its part twice");
  EXPECT_EQ(verdict(chunk_of(1, 0, total + 1, 1), kChunk, &why), Verdict::refuse);
  EXPECT_EQ(why, "node 1 announced its part as 2097153 bytes, and as 2097152 before");
  EXPECT_EQ(verdict(chunk_of(2, 4, 5, 0), 5, &why), Verdict::refuse);  // too far ahead
  EXPECT_EQ(why, "node 2 sent a chunk of exchange 4 while this machine was at exchange 0");
  EXPECT_EQ(verdict(chunk_of(2, 0, kMaxTotal + 1, 0), kChunk, &why), Verdict::refuse);
  EXPECT_EQ(why,
            "node 2 announced a part of 70368744177665 bytes, more than this machine's memory "
            "(70368744177664 bytes)");
  head = chunk_of(2, 0, total, 1);
  head.offset += 1;  // not at a chunk's start
  EXPECT_EQ(verdict(head, kChunk), Verdict::refuse);
  head = chunk_of(2, 0, total, 2);  // past the last chunk
  EXPECT_EQ(verdict(head, 0), Verdict::refuse);
  head = chunk_of(2, 0, total, 1);
  EXPECT_EQ(verdict(head, kChunk - 1, &why), Verdict::refuse);  // fewer bytes than its head says
  EXPECT_EQ(why,
            "node 2 sent a chunk that is not one of its part's (1048575 bytes at 1048576 of "
            "2097152)");
  head.length -= 1;
  EXPECT_EQ(verdict(head, kChunk - 1), Verdict::refuse);          // a head that says so
#if !defined(LOCKSTEP_TEST_ASAN) && !defined(LOCKSTEP_TEST_TSAN)  // (which abort instead)
  // A part larger than memory can give: refused, nothing kept.
  EXPECT_EQ(verdict(chunk_of(2, 0, kMaxTotal, 0), kChunk, &why), Verdict::refuse);
  EXPECT_EQ(why, "this machine cannot hold node 2's part of 70368744177664 bytes (out of memory)");
#endif
  // Larger than the machine: refused before anything is asked of memory.
  PartInbox small(0, 3, kToken, 4, 3 * kChunk);
  EXPECT_EQ(small.place(chunk_of(2, 0, 3 * kChunk, 0), kChunk).verdict, Verdict::take);
  const ChunkPlace over = small.place(chunk_of(1, 0, 3 * kChunk + 1, 0), kChunk);
  EXPECT_EQ(over.verdict, Verdict::refuse);
  EXPECT_EQ(over.why,
            "node 1 announced a part of 3145729 bytes, more than this machine's memory "
            "(3145728 bytes)");
}

// Random heads, as a leader that holds the job's token but not lockstep's protocol might send:
// every place given is inside its part, each chunk is given once, and a part is complete only
// when every one of its chunks has arrived (the sanitizer builds run this too).
TEST(PartInbox, RandomHeadsNeverPlaceOutsideAPart) {
  std::mt19937_64 random(20261206);
  const auto below = [&](std::uint64_t n) { return n == 0 ? 0 : random() % n; };
  std::optional<PartInbox> inbox(std::in_place, 1, 4, kToken, 3, kMaxTotal);
  int since = 0;  // rounds since the last exchange ended
  std::map<std::pair<std::uint64_t, std::uint32_t>, std::uint64_t> totals;
  std::map<std::pair<std::uint64_t, std::uint32_t>, std::vector<bool>> given;
  int taken = 0;
  std::map<std::pair<std::uint64_t, std::uint32_t>, std::uint64_t> honest;  // what each sends
  for (int round = 0; round < 20000; ++round) {
    if (++since == 400) {
      // A part that cannot be completed (its first chunk announced another total): the job would
      // have failed here. Start again.
      inbox.emplace(1, 4, kToken, 3, kMaxTotal);
      totals.clear();
      given.clear();
      honest.clear();
      since = 0;
    }
    Chunk head{below(50) == 0 ? random() : kToken,
               static_cast<std::uint32_t>(below(5)),
               inbox->current() + below(4) - (inbox->current() > 0 ? 1 : 0),
               0,
               0,
               0};
    const std::uint64_t sends =
        honest.emplace(std::make_pair(head.sequence, head.from), below(4 * kChunk)).first->second;
    head.total = below(16) == 0 ? random() % (4 * kChunk) : sends;
    head.offset = below(16) == 0 ? random() : below(PartInbox::chunks(head.total) + 1) * kChunk;
    head.length = below(16) == 0 ? below(2 * kChunk)
                                 : PartInbox::chunk_length(head.total, head.offset / kChunk);
    const std::size_t length = below(16) == 0 ? below(2 * kChunk) : head.length;
    const ChunkPlace place = inbox->place(head, length);
    if (place.verdict != Verdict::take) {
      continue;
    }
    ++taken;
    const auto key = std::make_pair(head.sequence, head.from);
    ASSERT_EQ(totals.emplace(key, head.total).first->second, head.total);
    ASSERT_LE(head.offset + length, head.total);
    ASSERT_EQ(length, head.length);
    auto& chunks = given[key];
    chunks.resize(PartInbox::chunks(head.total));
    ASSERT_FALSE(chunks[head.offset / kChunk]) << "a chunk given twice";
    chunks[head.offset / kChunk] = true;
    std::fill_n(place.at, length, std::byte{0x5a});  // inside the part (ASan)
    inbox->received(head, true);
    if (inbox->missing().empty()) {
      for (const int node : {0, 2, 3}) {
        const auto& all = given[{inbox->current(), static_cast<std::uint32_t>(node)}];
        ASSERT_TRUE(std::all_of(all.begin(), all.end(), [](bool b) { return b; }));
      }
      (void)inbox->finish();
      since = 0;
    }
  }
  EXPECT_GT(taken, 1000) << "too few chunks taken: the rounds test little";
}

// The rendezvous frame: a 4-byte little-endian length, then the message.
TEST(Rendezvous, FramesAreReadWhateverTheChunks) {
  const auto message = unhex(kGolden[2].bytes);
  const auto framed = rendezvous::frame(message);
  EXPECT_EQ(hex(framed), "0e000000" + std::string(kGolden[2].bytes));
  for (std::size_t chunk = 1; chunk <= framed.size(); ++chunk) {
    rendezvous::FrameReader reader;
    std::size_t at = 0;
    while (!reader.complete()) {
      at += reader.feed(std::span(framed).subspan(at, std::min(chunk, framed.size() - at)));
    }
    EXPECT_EQ(at, framed.size());
    EXPECT_EQ(hex({reader.message().begin(), reader.message().end()}), kGolden[2].bytes);
  }
  // The packet that made UCX 1.13 abort node 0: a length of 2^32 - 1, refused at once.
  rendezvous::FrameReader reader;
  const auto packet = unhex("ffffffffffffffff0000000000000000");
  EXPECT_THROW((void)reader.feed(packet), WireError);
  rendezvous::FrameReader empty;
  EXPECT_THROW((void)empty.feed(unhex("00000000")), WireError);
}

// Two ends of a TCP connection on loopback.
std::pair<int, int> tcp_pair() {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  EXPECT_EQ(::listen(listener, 1), 0);
  EXPECT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const int server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ::close(listener);
  return {client, server};
}

unsigned user_timeout(int fd) {
  unsigned value = 0;
  socklen_t size = sizeof value;
  EXPECT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &value, &size), 0);
  return value;
}

void watch(int epoll, int fd) {
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = fd;
  ASSERT_EQ(::epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event), 0);
}

// Issue 45: UCX's connections are found under its worker's event fd (an epoll instance that
// watches each transport's instance, which watches its sockets), and only they: a TCP
// connection that no instance there watches (the user's), a UDP socket and a Unix socket are
// left alone, and each found one gets the links' user timeout.
TEST(Paths, OnlyTheTcpConnectionsUnderTheEventFdAreFoundAndWatched) {
  const auto [ucx_client, ucx_server] = tcp_pair();
  const auto [user_client, user_server] = tcp_pair();
  const int udp = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int unix_pair[2] = {-1, -1};
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, unix_pair), 0);
  const int worker = ::epoll_create1(EPOLL_CLOEXEC);
  const int transport = ::epoll_create1(EPOLL_CLOEXEC);
  watch(transport, ucx_client);
  watch(transport, udp);
  watch(worker, transport);
  watch(worker, ucx_server);
  watch(worker, unix_pair[0]);

  std::vector<int> found;
  for (const auto& socket : ucx::tcp_sockets_under(worker)) {
    found.push_back(socket.fd);
  }
  std::sort(found.begin(), found.end());
  EXPECT_EQ(found,
            (std::vector<int>{std::min(ucx_client, ucx_server), std::max(ucx_client, ucx_server)}));
  EXPECT_TRUE(ucx::tcp_sockets_under(ucx_client).empty()) << "not an epoll instance";

  std::vector<ucx::PathSocket> watched;
  ucx::watch_paths(ucx::tcp_sockets_under(worker), watched, std::chrono::milliseconds(3000));
  EXPECT_EQ(watched.size(), 2U);
  EXPECT_EQ(user_timeout(ucx_client), 3000U);
  EXPECT_EQ(user_timeout(ucx_server), 3000U);
  EXPECT_EQ(user_timeout(user_client), 0U) << "the user's connection was touched";
  EXPECT_EQ(user_timeout(user_server), 0U);
  // A second look finds nothing new.
  ucx::watch_paths(ucx::tcp_sockets_under(worker), watched, std::chrono::milliseconds(3000));
  EXPECT_EQ(watched.size(), 2U);
  for (int fd : {ucx_client, ucx_server, user_client, user_server, udp, unix_pair[0], unix_pair[1],
                 worker, transport}) {
    ::close(fd);
  }
}

// Issue 44: every leader's desk answers on its links. Node 0 asks a node where its processes are,
// and the node's thread answers with what its places function says, whatever the node's main
// thread does; another node asks node 0, which asks the nodes named and answers for them all.
// Bytes that are not a frame are passed over; an answer to an earlier question is not taken for
// this one's; a node that does not answer (or answers what is not an answer) is left out in
// bounded time; text that is not printable is made so.
class Places : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto* pair : {&one_, &two_}) {
      ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair->data()), 0);
    }
  }
  void TearDown() override {
    for (auto* pair : {&one_, &two_}) {
      for (const int fd : *pair) {
        if (fd >= 0) {
          ::close(fd);
        }
      }
    }
  }
  // Node 0's desk, with links to node 1 (one_) and node 2 (two_): each node's end is [1].
  std::unique_ptr<ucx::PlacesDesk> node0() {
    return std::make_unique<ucx::PlacesDesk>(0, std::vector<int>{-1, one_[0], two_[0]},
                                             [] { return std::string("process 0 waits"); });
  }
  std::unique_ptr<ucx::PlacesDesk> node(int index, std::function<std::string()> places) {
    return std::make_unique<ucx::PlacesDesk>(
        index, std::vector<int>{index == 1 ? one_[1] : two_[1], -1, -1}, std::move(places));
  }
  // What arrives on `fd` within `wait` (nothing: empty).
  static std::vector<std::byte> read_some(int fd, std::chrono::milliseconds wait) {
    pollfd entry{fd, POLLIN, 0};
    std::vector<std::byte> got(65536);
    if (::poll(&entry, 1, static_cast<int>(wait.count())) <= 0) {
      return {};
    }
    const ssize_t n = ::recv(fd, got.data(), got.size(), MSG_DONTWAIT);
    got.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    return got;
  }
  static constexpr auto kBound = ucx::kPlacesWait + ucx::kRelayMargin + std::chrono::seconds(1);
  std::array<int, 2> one_{-1, -1};
  std::array<int, 2> two_{-1, -1};
};

TEST_F(Places, NodeZeroAsksTheOthersOnTheirLinks) {
  std::atomic<int> asked{0};
  const auto zero = node0();
  const auto two = node(2, [] { return std::string("process 5 waits"); });
  {
    const auto one = node(1, [&] {
      return "process 3 is at train.py:" + std::to_string(120 + asked.fetch_add(1)) + "\n";
    });
    // Stray bytes before the question; then the rest of a question nobody waits for.
    const std::vector<std::byte> stray = bytes("xyzQ");
    ASSERT_EQ(::write(one_[0], stray.data(), stray.size()), 4);
    const std::vector<std::byte> rest = unhex("00000000");
    ASSERT_EQ(::write(one_[0], rest.data(), rest.size()), 4);
    const auto answers = zero->ask({0, 1, 2});
    ASSERT_EQ(answers.size(), 3U);
    EXPECT_EQ(answers.at(0), "process 0 waits");
    // The earlier answer passed over; the line's end escaped.
    EXPECT_EQ(answers.at(1), "process 3 is at train.py:121\\x0a");
    EXPECT_EQ(answers.at(2), "process 5 waits");
    EXPECT_EQ(asked.load(), 2);
    EXPECT_EQ(zero->ask({1}).at(1), "process 3 is at train.py:122\\x0a");
  }
  // Node 1's desk is gone (its thread stopped, the link still open): no answer, in bounded time;
  // node 2 still answers.
  const auto began = std::chrono::steady_clock::now();
  const auto answers = zero->ask({1, 2});
  EXPECT_EQ(answers.size(), 1U);
  EXPECT_EQ(answers.count(2), 1U);
  EXPECT_LT(std::chrono::steady_clock::now() - began, kBound);
  // What node 1's end sends is not an answer (a length past the limit): not taken.
  const std::vector<std::byte> forged = unhex("500100000000000100");
  ASSERT_EQ(::write(one_[1], forged.data(), forged.size()), 9);
  EXPECT_TRUE(zero->ask({1}).empty());
  // Node 1's end closes (its process ended): the question ends as the link does, not after the
  // full wait.
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::close(std::exchange(one_[1], -1));
  });
  const auto asked_at = std::chrono::steady_clock::now();
  EXPECT_TRUE(zero->ask({1}).empty());
  closer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - asked_at, ucx::kPlacesWait / 2);
}

TEST_F(Places, AnotherNodeAsksNodeZeroWhichAsksForIt) {
  const auto zero = node0();
  const auto one = node(1, [] { return std::string("process 2 is not in a lockstep call"); });
  {
    const auto two = node(2, [] { return std::string("process 4 waits\x01"); });
    const auto answers = one->ask({0, 2});
    ASSERT_EQ(answers.size(), 2U);
    EXPECT_EQ(answers.at(0), "process 0 waits");
    EXPECT_EQ(answers.at(2), "process 4 waits\\x01");
  }
  // Node 2 does not answer: node 1 hears node 0's word for node 0 alone, in bounded time.
  const auto began = std::chrono::steady_clock::now();
  const auto answers = one->ask({0, 2});
  EXPECT_EQ(answers.size(), 1U);
  EXPECT_EQ(answers.count(0), 1U);
  EXPECT_LT(std::chrono::steady_clock::now() - began, kBound);
  // Node 2's end asks by hand: node 0 answers with node 1's entry ('R', the asker's id 7). (The
  // question node 0 relayed to node 2 just now is read away first.)
  EXPECT_EQ(read_some(two_[1], std::chrono::milliseconds(0)).size(), 5U);
  const std::vector<std::byte> ask = unhex("41070000000100000001000000");
  ASSERT_EQ(::write(two_[1], ask.data(), ask.size()), static_cast<ssize_t>(ask.size()));
  const std::string text = "process 2 is not in a lockstep call";
  std::vector<std::byte> want = unhex("5207000000");
  want.resize(want.size() + 4);
  put_le(&want[5], 8 + text.size(), 4);
  for (const std::size_t value : {std::size_t{1}, text.size()}) {
    want.resize(want.size() + 4);
    put_le(&want[want.size() - 4], value, 4);
  }
  const std::vector<std::byte> body = bytes(text);
  want.insert(want.end(), body.begin(), body.end());
  std::vector<std::byte> got;
  while (got.size() < want.size()) {
    const std::vector<std::byte> more = read_some(two_[1], kBound);
    ASSERT_FALSE(more.empty()) << "node 0 did not answer node 2's question";
    got.insert(got.end(), more.begin(), more.end());
  }
  EXPECT_EQ(got, want);
  // A question that names a node that is not in the job is not answered.
  const std::vector<std::byte> bad = unhex("41080000000100000009000000");
  ASSERT_EQ(::write(two_[1], bad.data(), bad.size()), static_cast<ssize_t>(bad.size()));
  EXPECT_TRUE(read_some(two_[1], ucx::kPlacesWait + ucx::kRelayMargin).empty());
}

// The question and the answer, byte for byte as each side writes them ('Q' id; 'P' id length
// text), each against the hand-made other side.
TEST_F(Places, QuestionsAndAnswersArePinnedByteForByte) {
  {
    const auto one = node(1, [] { return std::string("hi"); });
    const std::vector<std::byte> question = unhex("5107000000");
    ASSERT_EQ(::write(one_[0], question.data(), question.size()), 5);
    EXPECT_EQ(hex(read_some(one_[0], kBound)),
              "500700000002000000"
              "6869");
  }
  const auto zero = node0();
  std::map<int, std::string> answers;
  std::thread asker([&] { answers = zero->ask({1}); });
  EXPECT_EQ(hex(read_some(one_[1], kBound)), "5101000000");
  const std::vector<std::byte> answer = unhex("5001000000020000006f6b");
  ASSERT_EQ(::write(one_[1], answer.data(), answer.size()), static_cast<ssize_t>(answer.size()));
  asker.join();
  EXPECT_EQ(answers, (std::map<int, std::string>{{1, "ok"}}));
}

// A frame that a peer begins and never finishes costs its own answer only: after kFrameBound the
// link's bytes are dropped, and the peer's next answers are taken (8 later answers were all
// swallowed, each "not known").
TEST_F(Places, AStalledFrameCostsOnlyItsOwnAnswer) {
  const auto zero = node0();
  // Node 1's end: the first 6 bytes of an answer ('P', id, the length's first byte), no more.
  const std::vector<std::byte> part = unhex("500100000005");
  ASSERT_EQ(::write(one_[1], part.data(), part.size()), static_cast<ssize_t>(part.size()));
  std::this_thread::sleep_for(ucx::kFrameBound + std::chrono::milliseconds(200));
  const auto two = node(2, [] { return std::string("process 5 waits"); });
  std::thread answerer([&] {  // node 1's end answers node 0's next question by hand
    const std::vector<std::byte> question = read_some(one_[1], kBound);
    if (question.size() != 5) {
      return;
    }
    std::vector<std::byte> answer = question;
    answer[0] = std::byte{0x50};  // 'P', the same id
    const std::string text = "process 3 is back";
    answer.resize(9);
    put_le(&answer[5], text.size(), 4);
    const std::vector<std::byte> body = bytes(text);
    answer.insert(answer.end(), body.begin(), body.end());
    (void)::write(one_[1], answer.data(), answer.size());
  });
  const auto answers = zero->ask({1, 2});
  answerer.join();
  ASSERT_EQ(answers.count(1), 1U) << "the stalled frame swallowed the next answer";
  EXPECT_EQ(answers.at(1), "process 3 is back");
  EXPECT_EQ(answers.at(2), "process 5 waits");
}

// A peer that asks as fast as it can is answered kQuestionBurst times at once, then about once
// every kQuestionEvery: what node 0 sends back stays bounded.
TEST_F(Places, QuestionsFromOnePeerAreRateLimited) {
  const auto zero = node0();
  const auto two = node(2, [] { return std::string("process 5 waits"); });
  std::vector<std::byte> flood;
  for (std::uint32_t id = 1; id <= 200; ++id) {  // 'A' id, 1 node: node 0
    const std::vector<std::byte> ask = unhex("41000000000100000000000000");
    flood.insert(flood.end(), ask.begin(), ask.end());
    put_le(&flood[flood.size() - ask.size() + 1], id, 4);
  }
  ASSERT_EQ(::write(one_[1], flood.data(), flood.size()), static_cast<ssize_t>(flood.size()));
  std::vector<std::byte> back;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
  while (std::chrono::steady_clock::now() < until) {
    const std::vector<std::byte> more = read_some(one_[1], std::chrono::milliseconds(50));
    back.insert(back.end(), more.begin(), more.end());
  }
  int relays = 0;
  for (std::size_t at = 0; at + 9 <= back.size(); at += 9 + get_le(&back[at + 5], 4)) {
    relays += back[at] == std::byte{0x52} ? 1 : 0;
  }
  EXPECT_GE(relays, ucx::kQuestionBurst);
  EXPECT_LE(relays, ucx::kQuestionBurst + 12) << "200 questions at once, answered " << relays;
}

}  // namespace
}  // namespace lockstep::detail::wire