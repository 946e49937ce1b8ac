// Where another machine's processes are: a leader's messages about a machine that is
// late name where that machine's processes are. The late process is often that machine's main
// process itself, in its own code, or its main process waits in its machine's own barrier for
// one that is: neither polls UCX. So every node's main process keeps a thread, its desk, that
// reads its links (the join's authenticated TCP connections, rendezvous.hpp: node 0 has one to
// each node, the others one to node 0) and answers there, reading the node segment as
// lockstep-run --status does. Node 0 asks the others itself; another node asks node 0, which
// asks the nodes named and answers for them all (the others have no link to each other).
//
// On a link, after the join (little-endian; id: 4 bytes, the asker's own numbering):
//   node 0 -> node k: 'Q' id                      where are your processes?
//   node k -> node 0: 'P' id length text          here (text: at most kMaxPlaces bytes)
//   node k -> node 0: 'A' id count node...        where are these nodes' processes? (4 bytes each)
//   node 0 -> node k: 'R' id length entries       entries: node, length, text; each as in 'P'
// A frame that breaks these rules is dropped with what the link held then; its sender, who
// passed the join's authentication, is then told nothing (it says so after kPlacesWait).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "base/service_thread.hpp"

namespace lockstep::detail::ucx {

inline constexpr std::size_t kMaxPlaces = 4096;
// At most this much text in one 'R' (what does not fit is left out: those nodes are not known).
inline constexpr std::size_t kMaxRelayed = 16384;
// How long node 0 waits for the answers before it says what it knows without them; another node
// waits this and kRelayMargin for node 0's.
inline constexpr auto kPlacesWait = std::chrono::milliseconds(500);
inline constexpr auto kRelayMargin = std::chrono::milliseconds(250);

// How long a frame may take to arrive whole from its first byte: a link whose frame stalls longer
// loses what it held (that frame's answer only, not the ones after it).
inline constexpr auto kFrameBound = std::chrono::seconds(1);
// Questions ('Q', 'A') a desk answers on one link: at most kQuestionBurst at once, then one every
// kQuestionEvery; the others are dropped unanswered (their asker says it was not told).
inline constexpr int kQuestionBurst = 8;
inline constexpr auto kQuestionEvery = std::chrono::milliseconds(50);

// One whole frame off a link.
struct DeskFrame {
  std::byte type{};
  std::uint32_t id = 0;
  std::vector<std::byte> bytes;  // the whole frame, its head included
};
// The next whole frame at the start of `got`, taken out of it, for the desk of node `me` among
// `nodes` (what may come to it: node 0 takes answers and asks, another node questions and
// relays); nullopt while none is whole. Bytes that cannot begin such a frame are passed over, and
// a frame's length over its limit drops all that `got` holds. (A function of its inputs, so that
// fuzz/fuzz_desk.cpp reaches every check.)
std::optional<DeskFrame> next_frame(std::vector<std::byte>& got, int me, std::size_t nodes);
// The entries of node 0's relayed answer ('R'), by node: each node's text made printable; what
// breaks the format ends them.
std::map<int, std::string> relayed_entries(const std::vector<std::byte>& frame, std::size_t nodes);
// A peer's text as a message may carry it (base/text.hpp's printable).
std::string peer_text(std::span<const std::byte> bytes);

class PlacesDesk {
 public:
  // `me`: this node; `links`: by node (-1: none; node 0's own, and all but node 0's on another
  // node); `places`: this node's processes' places (any thread may call it). The links stay
  // their owner's, who closes one only after this is destroyed. The thread reads nothing more
  // from a link that reports an error or its end (the owner sees that there, as before:
  // rendezvous::look_at_link).
  PlacesDesk(int me, std::vector<int> links, std::function<std::string()> places);
  ~PlacesDesk();  // stops the thread ("lockstep-desk"), and waits for it
  PlacesDesk(const PlacesDesk&) = delete;
  PlacesDesk& operator=(const PlacesDesk&) = delete;

  // Where the processes of `nodes` are, by node: those that answered within kPlacesWait (node 0
  // asks) or kPlacesWait and kRelayMargin (another node asks node 0). Any thread.
  std::map<int, std::string> ask(const std::vector<int>& nodes);
  // How long ask() waits for the answers at most.
  [[nodiscard]] std::chrono::milliseconds answer_wait() const {
    return me_ == 0 ? kPlacesWait : kPlacesWait + kRelayMargin;
  }

 private:
  struct Asked {  // one question out: node 0's own or relayed, or another node's to node 0
    std::set<int> waiting;  // the nodes whose answers have not come
    std::map<int, std::string> answers;
    std::chrono::steady_clock::time_point deadline;
    int reply_to = -1;  // node 0 relaying: the node that asked, and its id
    std::uint32_t reply_id = 0;
  };

  void run() noexcept;
  // Reads what `node`'s link has (poll's `revents` for it) into `got`, taking the frames it
  // completes; `since`: when the frame left in `got` began to arrive. False once the link is
  // gone.
  bool read_link(std::size_t node, short revents, std::vector<std::byte>& got,
                 std::optional<std::chrono::steady_clock::time_point>& since);
  // The frames that `node`'s link brought (`got`, what is left of one stays there).
  void take(int node, std::vector<std::byte>& got);
  // Whether `node` may be answered one more question now (kQuestionBurst, kQuestionEvery).
  bool may_answer(std::size_t node);
  std::string own();  // this node's text, at most kMaxPlaces
  std::vector<std::byte> answer_frame(std::uint32_t id);
  // `from`'s answer to question `id` (node 0's 'R' on another node: its entries).
  void took(int from, std::uint32_t id, std::map<int, std::string> answers);
  // Node 0: another node's 'A' frame; asks those nodes, answered by send_relays_due.
  void relay(int from, std::uint32_t id, const std::vector<std::byte>& frame);
  // Node 0's question about `nodes` for `asker` (-1: itself): its own text at once, and the
  // others, but the asker, to be asked on their links.
  Asked node0_question(const std::vector<int>& nodes, int asker);
  void gone(std::size_t node);  // `node`'s link ended or failed: no answer will come
  int relays_due_in();          // milliseconds until a relayed question is due (-1: none)
  void send_relays_due();
  // Sends `nodes`' question (node 0: 'Q' to each of `asked.waiting`; another node: 'A' to node
  // 0) and keeps it; its id.
  std::uint32_t question(const std::vector<int>& nodes, Asked asked);
  bool send(int node, const std::vector<std::byte>& frame);

  int me_;
  std::vector<int> links_;
  std::function<std::string()> places_;
  std::mutex send_mutex_;  // one frame at a time on a link
  std::mutex mutex_;       // what follows
  std::condition_variable answered_;
  std::uint32_t last_id_ = 0;
  std::map<std::uint32_t, Asked> asked_;
  // The desk thread's own: by node, the questions it may still answer at once and when it last
  // counted them.
  std::vector<int> allowance_;
  std::vector<std::chrono::steady_clock::time_point> counted_;
  ServiceThread thread_;  // last: it stops before the rest goes
};

}  // namespace lockstep::detail::ucx
