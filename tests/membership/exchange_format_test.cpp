// The exchanges' bytes (lib/src/membership/exchange_format.hpp), pinned byte for byte: a gather's
// entry head and in-memory tail in the segment's regions, the records between machines and a
// broadcast between machines; what is not one of them is refused. fuzz/fuzz_exchange.cpp checks
// the readers on any bytes.
#include "membership/exchange_format.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "hex.hpp"

namespace lockstep::detail {
namespace {

using lockstep::testing::bytes_of;
using lockstep::testing::hex;
using lockstep::testing::unhex;

TEST(ExchangeFormat, AnEntrysHeadAndInMemoryTailArePinned) {
  const auto head = encode_head(EntryHead{3, Held::in_memory, 0x1122334455ULL});
  EXPECT_EQ(hex(head),
            "03000000"
            "04000000"
            "5544332211000000");
  const EntryHead back = decode_head(head);
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.held, Held::in_memory);
  EXPECT_EQ(back.size, 0x1122334455ULL);
  const auto tail = encode_in_memory(InMemory{4242, 4026531836ULL, 0x7f0012345678ULL});
  EXPECT_EQ(hex(tail),
            "92100000"
            "00000000"
            "fcffffef00000000"
            "78563412007f0000");
  const InMemory where = decode_in_memory(tail);
  EXPECT_EQ(where.pid, 4242U);
  EXPECT_EQ(where.pid_namespace, 4026531836ULL);
  EXPECT_EQ(where.address, 0x7f0012345678ULL);
}

TEST(ExchangeFormat, RecordsArePinnedAndOnlyWholeOnesRead) {
  std::vector<std::byte> records;
  append_record(records, 1, Held::inline_bytes, bytes_of("ab"));
  append_record(records, 2, Held::failed, bytes_of("no"));
  append_record(records, 3, Held::inline_bytes, {});
  EXPECT_EQ(hex(records),
            "01000000"
            "00000000"
            "0200000000000000"
            "6162"
            "02000000"
            "02000000"
            "0200000000000000"
            "6e6f"
            "03000000"
            "00000000"
            "0000000000000000");
  const auto read = read_records(records);
  ASSERT_TRUE(read);
  ASSERT_EQ(read->size(), 3U);
  EXPECT_EQ((*read)[0].rank, 1);
  EXPECT_EQ(hex((*read)[0].bytes), "6162");
  EXPECT_EQ((*read)[1].held, Held::failed);
  EXPECT_TRUE((*read)[2].bytes.empty());
  EXPECT_TRUE(read_records({}));  // no records: a node that gave nothing

  for (std::size_t cut = 1; cut < records.size(); ++cut) {
    if (cut != 18 && cut != 36) {  // whole records end there
      EXPECT_FALSE(read_records(std::span(records).first(cut))) << cut;
    }
  }
  // A record held otherwise (spilled, elsewhere, in memory) never travels; a size past the end.
  for (const char* bad : {"01000000010000000000000000000000", "01000000040000000000000000000000",
                          "0100000000000000ffffffffffffffff"}) {
    EXPECT_FALSE(read_records(unhex(bad))) << bad;
  }
}

TEST(ExchangeFormat, ABroadcastIsPinnedAndItsSizeMustBeExact) {
  const auto sent = encode_broadcast(Held::inline_bytes, bytes_of("xyz"));
  EXPECT_EQ(hex(sent),
            "00000000"
            "0300000000000000"
            "78797a");
  const auto read = read_broadcast(sent);
  ASSERT_TRUE(read);
  EXPECT_EQ(read->held, Held::inline_bytes);
  EXPECT_EQ(hex(read->bytes), "78797a");
  EXPECT_EQ(read_broadcast(encode_broadcast(Held::main_elsewhere, {}))->held, Held::main_elsewhere);
  auto longer = sent;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(read_broadcast(longer));
  EXPECT_FALSE(read_broadcast(std::span(sent).first(sent.size() - 1)));
  EXPECT_FALSE(read_broadcast(std::span(sent).first(11)));
  EXPECT_FALSE(read_broadcast(encode_broadcast(Held::spilled, bytes_of("xyz"))));
}

}  // namespace
}  // namespace lockstep::detail
