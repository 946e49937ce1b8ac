// libFuzzer target: an exchange's bytes as another machine's leader sends them
// (membership/exchange_format.hpp): a run of a node's records (a gather's part, the job's
// outcome) and a broadcast. Reading must never crash, read out of bounds or allocate without
// bound (ASan, UBSan); what reads as records or a broadcast writes back to the same bytes (one
// encoding each), and each record's bytes lie within the input.
//
// The input's first byte chooses the reader (even: records; odd: a broadcast).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "membership/exchange_format.hpp"

namespace detail = lockstep::detail;

namespace {

[[noreturn]] void fail(const char* why) {
  std::fprintf(stderr, "fuzz_exchange: %s\n", why);
  std::abort();
}

void check_records(std::span<const std::byte> input) {
  const auto records = detail::read_records(input);
  if (!records) {
    return;  // refused, as a torn or foreign part must be
  }
  std::vector<std::byte> again;
  for (const auto& record : *records) {
    if (record.bytes.data() < input.data() ||
        record.bytes.data() + record.bytes.size() > input.data() + input.size()) {
      fail("a record's bytes lie outside the input");
    }
    detail::append_record(again, record.rank, record.held, record.bytes);
  }
  if (again.size() != input.size() || !std::equal(again.begin(), again.end(), input.begin())) {
    fail("records read write back to other bytes");
  }
}

void check_broadcast(std::span<const std::byte> input) {
  const auto broadcast = detail::read_broadcast(input);
  if (!broadcast) {
    return;
  }
  const auto again = detail::encode_broadcast(broadcast->held, broadcast->bytes);
  if (again.size() != input.size() || !std::equal(again.begin(), again.end(), input.begin())) {
    fail("a broadcast read writes back to other bytes");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) {
    check_records(input);
  } else {
    check_broadcast(input);
  }
  return 0;
}
