// libFuzzer target: every message the UCX backend decodes from the network (backends/ucx/wire).
// Decoding must never crash, read out of bounds or allocate without bound (ASan, UBSan), and a
// message that decodes must encode back to the same bytes (one encoding per message). A chunk's
// head goes on to the part inbox, whose place for it must hold it.
//
// LOCKSTEP_FUZZ_WRITE_SEEDS=DIR writes one encoded message of each kind to DIR (how
// fuzz/corpus/wire was made) and exits.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <string>

#include "ucx/part_inbox.hpp"
#include "ucx/wire.hpp"

namespace wire = lockstep::detail::wire;

namespace {

std::vector<std::byte> bytes_of(const char* text) {
  std::vector<std::byte> out;
  for (const char* c = text; *c != '\0'; ++c) {
    out.push_back(static_cast<std::byte>(*c));
  }
  return out;
}

constexpr lockstep::detail::ProcessMark kMark{
    {0x36143b52b96d4ffdULL, 0xa44c6e09656cba55ULL}, 4026531836, 4242, 123456};

void write_seeds(const std::string& dir) {
  const wire::Message samples[] = {
      wire::Hello{
          "job=run7@10.0.0.1:29500", 2, 8, 1, {4, 5, 6, 7}, bytes_of("worker-address"), kMark},
      wire::Welcome{
          0x1234'5678'9abc'def1ULL,
          {{0, {0, 1}, bytes_of("address-0"), kMark}, {1, {2, 3}, bytes_of("address-1"), {}}}},
      wire::Refuse{"node 1: it belongs to another job"},
      wire::Arrive{0x1234'5678'9abc'def1ULL, 1, 42, 0, {0x3}},
      wire::Abort{0x1234'5678'9abc'def1ULL, 1, 2, 3, {2, 3}, "process 3 died"},
      wire::Blob{0x1234'5678'9abc'def1ULL, 0, 0, bytes_of("nccl-unique-id")},
      wire::Chunk{0x1234'5678'9abc'def1ULL, 1, 3, 3 * wire::kChunk + 5, 2 * wire::kChunk,
                  wire::kChunk},
  };
  int index = 0;
  for (const auto& message : samples) {
    auto data = wire::encode(message);
    std::ofstream(dir + "/seed-" + std::to_string(index++), std::ios::binary)
        .write(reinterpret_cast<const char*>(data.data()),
               static_cast<std::streamsize>(data.size()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("LOCKSTEP_FUZZ_WRITE_SEEDS")) {  // NOLINT
    write_seeds(dir);
    std::exit(0);  // NOLINT(concurrency-mt-unsafe)
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  wire::Message message;
  try {
    message = wire::decode(input);
  } catch (const wire::WireError&) {
    return 0;  // refused, as it should be
  }
  auto again = wire::encode(message);
  if (again.size() != size || !std::equal(again.begin(), again.end(), input.begin())) {
    std::fprintf(stderr, "fuzz_wire: a decoded message encodes to other bytes\n");
    std::abort();
  }
  if (const auto* head = std::get_if<wire::Chunk>(&message)) {
    // A chunk's head as node 0 of 2 takes it (the token is the seeds', the memory 64 MiB): a
    // place it gives is inside the part, which ASan checks by writing the whole chunk there.
    lockstep::detail::ucx::PartInbox inbox(0, 2, 0x1234'5678'9abc'def1ULL, 4, 64 << 20);
    const auto place = inbox.place(*head, head->length);
    // (A chunk of an empty part is taken with no place, as UcxBackend's receiver copies none.)
    if (place.verdict == lockstep::detail::ucx::ChunkPlace::Verdict::take && head->length != 0) {
      std::memset(place.at, 0x5a, head->length);
    }
  }
  return 0;
}
