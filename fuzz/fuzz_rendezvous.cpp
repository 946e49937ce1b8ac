// libFuzzer target: what node 0's rendezvous reads from anyone who connects to MASTER_PORT
// (backends/ucx/rendezvous). The bytes arrive in chunks of every size; the frame reader must
// never crash, read out of bounds or allocate beyond what arrived, and a frame it completes must
// be exactly the length prefix plus that many bytes, which the wire decoder then takes or refuses.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "ucx/rendezvous.hpp"
#include "ucx/wire.hpp"

namespace rendezvous = lockstep::detail::rendezvous;
namespace wire = lockstep::detail::wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  // The first byte sets the chunk size (how recv() splits the stream).
  const std::size_t chunk = 1 + data[0] % 64;
  std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  rendezvous::FrameReader reader;
  std::size_t consumed = 0;
  try {
    while (consumed < input.size() && !reader.complete()) {
      const auto piece = input.subspan(consumed, std::min(chunk, input.size() - consumed));
      const std::size_t used = reader.feed(piece);
      if (used > piece.size() || (used < piece.size() && !reader.complete())) {
        std::abort();  // took more than it was given, or stopped before the frame's end
      }
      consumed += used;
    }
  } catch (const wire::WireError&) {
    return 0;  // a length of 0 or over the limit: the connection is dropped
  }
  if (!reader.complete()) {
    return 0;
  }
  const auto framed = rendezvous::frame(reader.message());
  if (framed.size() != consumed || !std::equal(framed.begin(), framed.end(), input.begin())) {
    std::abort();
  }
  try {
    (void)wire::decode(reader.message());
  } catch (const wire::WireError&) {
  }
  return 0;
}
