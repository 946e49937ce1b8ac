// The UCX backend's wire format, pinned byte for byte (backends/ucx/wire.hpp), in every build:
// the fuzzer (clang only) checks that decoding is safe; these check that the format does not
// change by accident, and that what decodes is what was sent.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "ucx/rendezvous.hpp"
#include "ucx/wire.hpp"

namespace lockstep::detail::wire {
namespace {

std::vector<std::byte> bytes(const std::string& text) {
  std::vector<std::byte> out;
  for (char c : text) {
    out.push_back(static_cast<std::byte>(c));
  }
  return out;
}

std::vector<std::byte> unhex(const std::string& hex) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<std::byte>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string hex(const std::vector<std::byte>& data) {
  std::string out;
  for (std::byte b : data) {
    char pair[3];
    (void)std::snprintf(pair, sizeof pair, "%02x", std::to_integer<unsigned>(b));
    out += pair;
  }
  return out;
}

constexpr std::uint64_t kToken = 0x0123'4567'89ab'cdefULL;

struct Golden {
  Message message;
  const char* bytes;  // "LKS1", version 2, kind, then the fields, little-endian
};

// NOLINTNEXTLINE(cert-err58-cpp): a test's fixed data
const Golden kGolden[] = {
    {Hello{"job=a@h:1", 2, 4, 1, {2, 3}, bytes("addr")},
     "4c4b533102000100090000006a6f623d6140683a3102000000040000000100000002000000020000000300000004"
     "00000061646472"},
    {Welcome{kToken, {{0, {0, 1}, bytes("A")}, {1, {2, 3}, bytes("B")}}},
     "4c4b533102000200efcdab89674523010200000000000000020000000000000001000000010000004101000000020"
     "0000002000000030000000100000042"},
    {Refuse{"no"}, "4c4b533102000300020000006e6f"},
    {Arrive{kToken, 1, 42, 3, {0x5}},
     "4c4b533102000400efcdab8967452301010000002a0000000000000003000000010000000500000000000000"},
    {Abort{kToken, 1, 2, -1, {2, 3}, "gone"},
     "4c4b533102000500efcdab89674523010100000002000000ffffffff020000000200000003000000040000006"
     "76f6e65"},
    {Blob{kToken, 0, 7, bytes("id")},
     "4c4b533102000600efcdab8967452301000000000700000000000000020000006964"},
    {Part{kToken, 2, 7, bytes("id")},
     "4c4b533102000700efcdab8967452301020000000700000000000000020000006964"},
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
  other_version[4] = std::byte{1};  // 0.3's first protocol: it had no gather
  EXPECT_THROW((void)decode(other_version), WireError);
  auto unknown_kind = hello;
  unknown_kind[6] = std::byte{8};
  EXPECT_THROW((void)decode(unknown_kind), WireError);
  // An identity length of 2^32 - 1: over the limit, never allocated.
  auto huge = unhex(
      "4c4b53310200010"
      "0ffffffff");
  EXPECT_THROW((void)decode(huge), WireError);
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

}  // namespace
}  // namespace lockstep::detail::wire
