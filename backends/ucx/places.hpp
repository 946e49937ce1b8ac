// Where another machine's processes are (issue 44): node 0's messages about a machine that is
// late name where that machine's processes are. The late process is often that machine's main
// process itself, in its own code, or its main process waits in its machine's own barrier for
// one that is: neither polls UCX. So each other node's main process keeps a thread that answers
// node 0's question on its link (the join's authenticated TCP connection, rendezvous.hpp), reading
// the node segment as lockstep-run --status does.
//
// On a link, after the join: node 0 sends 'Q' and an id (4 bytes); the node answers 'P', the id,
// a length (4 bytes) and that many bytes of text (at most kMaxPlaces). Little-endian.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace lockstep::detail::ucx {

inline constexpr std::size_t kMaxPlaces = 4096;
// How long node 0 waits for the answers before it says what it knows without them.
inline constexpr auto kPlacesWait = std::chrono::milliseconds(500);

// A node's answerer: a thread that answers node 0's questions on `link` with `places()` (any
// thread may call it). The link stays its owner's, who closes it only after this is destroyed.
// The thread reads nothing once the link reports an error (the owner's look at the link sees it
// there, as before: rendezvous::look_at_link), or ends.
class PlacesAnswerer {
 public:
  PlacesAnswerer(int link, std::function<std::string()> places);
  ~PlacesAnswerer();  // stops the thread, and waits for it
  PlacesAnswerer(const PlacesAnswerer&) = delete;
  PlacesAnswerer& operator=(const PlacesAnswerer&) = delete;

 private:
  void run() noexcept;
  void answer(std::uint32_t id) noexcept;

  int link_;
  int stop_;  // an eventfd: the destructor's word
  std::function<std::string()> places_;
  std::thread thread_;
};

// Node 0: asks each of `nodes` (by index into `links`; a link of -1 is not asked) where its
// processes are, and waits for their answers for at most kPlacesWait. The answers, by node (a
// node that did not answer in time, or answered what is not an answer, is left out).
std::map<int, std::string> ask_places(const std::vector<int>& links, const std::vector<int>& nodes);

}  // namespace lockstep::detail::ucx
