// libFuzzer target: the frames a node's desk reads from its links (backends/ucx/places.hpp),
// which another machine's main process writes once it has passed the join's authentication.
// Reading must never crash, read out of bounds or allocate without bound (ASan, UBSan); every
// frame taken lies within what came, and a relayed answer's entries are printable text of nodes
// of the job.
//
// The input's first byte chooses the reader (node 0, or another node) and where the bytes are cut
// into two reads, as a link delivers them.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "ucx/places.hpp"

namespace ucx = lockstep::detail::ucx;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  const int me = (data[0] & 1) != 0 ? 0 : 1;
  constexpr std::size_t kNodes = 4;
  std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  const std::size_t cut = input.empty() ? 0 : (data[0] >> 1) % (input.size() + 1);
  std::vector<std::byte> got;
  std::size_t taken = 0;
  for (const auto piece : {input.first(cut), input.subspan(cut)}) {
    got.insert(got.end(), piece.begin(), piece.end());
    while (auto frame = ucx::next_frame(got, me, kNodes)) {
      taken += frame->bytes.size();
      if (taken > input.size()) {
        std::fprintf(stderr, "fuzz_desk: frames took more bytes than came\n");
        std::abort();
      }
      if (frame->type == std::byte{0x52}) {  // 'R': node 0's relayed answers
        for (const auto& [node, text] : ucx::relayed_entries(frame->bytes, kNodes)) {
          for (const char c : text) {
            if (node < 0 || node >= static_cast<int>(kNodes) ||
                static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
              std::fprintf(stderr, "fuzz_desk: an entry that is not a node's printable text\n");
              std::abort();
            }
          }
        }
      }
    }
  }
  return 0;
}
