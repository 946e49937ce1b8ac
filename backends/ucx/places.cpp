// Where another machine's processes are: the desk on the links (places.hpp).
#include "ucx/places.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <span>
#include <string_view>

#include "base/bytes.hpp"
#include "base/text.hpp"  // printable
#include "ucx/rendezvous.hpp"

namespace lockstep::detail::ucx {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::byte kQuestion{0x51};  // 'Q'
constexpr std::byte kAnswer{0x50};    // 'P'
constexpr std::byte kAsk{0x41};       // 'A'
constexpr std::byte kRelayed{0x52};   // 'R'
constexpr std::size_t kQuestionSize = 5;
constexpr std::size_t kHead = 9;  // the type, the id, and a length or a count
constexpr std::size_t kEntryHead = 8;
constexpr auto kSendBound = std::chrono::seconds(1);

// A frame's start: its type and id (the question's whole frame).
ByteWriter head(std::byte type, std::uint32_t id) {
  ByteWriter w;
  w.u8(std::to_integer<std::uint8_t>(type));
  w.u32(id);
  return w;
}

// The head of a frame that `got` begins with, if it holds that much: its id, and (but for a
// question) its length or count.
struct FrameHead {
  std::uint32_t id = 0;
  std::size_t length = 0;
};
std::optional<FrameHead> frame_head(const std::vector<std::byte>& got, bool question) {
  ByteReader r(got);
  if (r.left() < (question ? kQuestionSize : kHead)) {
    return std::nullopt;
  }
  (void)r.u8();
  FrameHead head{r.u32(), 0};
  if (!question) {
    head.length = r.u32();
  }
  return head;
}

// What poll() waits for: `relays` ms (-1: for ever), or less, until the first held frame's bound.
int wait_ms(int relays, const std::vector<std::optional<Clock::time_point>>& since) {
  int wait = relays;
  const auto now = Clock::now();
  for (const auto& began : since) {
    if (began) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*began + kFrameBound - now);
      const int ms = static_cast<int>(std::max<std::int64_t>(left.count(), 0));
      wait = wait < 0 ? ms : std::min(wait, ms);
    }
  }
  return wait;
}

}  // namespace

std::string peer_text(std::span<const std::byte> bytes) {
  return printable({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
}

std::optional<DeskFrame> next_frame(std::vector<std::byte>& got, int me, std::size_t nodes) {
  while (!got.empty()) {
    const std::byte type = got.front();
    const bool for_me =
        me == 0 ? (type == kAnswer || type == kAsk) : (type == kQuestion || type == kRelayed);
    if (!for_me) {
      got.erase(got.begin());  // not a frame's start: nothing else is sent on a link
      continue;
    }
    const auto head = frame_head(got, type == kQuestion);
    if (!head) {
      return std::nullopt;
    }
    if (type == kQuestion) {
      DeskFrame frame{type, head->id, {got.begin(), got.begin() + kQuestionSize}};
      got.erase(got.begin(), got.begin() + kQuestionSize);
      return frame;
    }
    const std::size_t length = head->length;
    const std::size_t limit = type == kAsk      ? nodes
                              : type == kAnswer ? kMaxPlaces
                                                : kMaxRelayed + nodes * kEntryHead;
    if (length > limit) {
      got.clear();  // not what the other side sends: what the link held is dropped
      return std::nullopt;
    }
    const std::size_t size = kHead + (type == kAsk ? 4 * length : length);
    if (got.size() < size) {
      return std::nullopt;
    }
    DeskFrame frame{type, head->id, {got.begin(), got.begin() + static_cast<std::ptrdiff_t>(size)}};
    got.erase(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(size));
    return frame;
  }
  return std::nullopt;
}

std::map<int, std::string> relayed_entries(const std::vector<std::byte>& frame, std::size_t nodes) {
  std::map<int, std::string> answers;
  ByteReader r(frame);
  if (r.left() < kHead) {
    return answers;
  }
  (void)r.raw(kHead, "the head");
  while (r.left() >= kEntryHead) {
    const std::size_t node = r.u32();
    const std::size_t length = r.u32();
    if (node >= nodes || length > kMaxPlaces || length > r.left()) {
      break;  // not what node 0 sends: the rest is dropped
    }
    answers[static_cast<int>(node)] = peer_text(r.raw(length, "an entry"));
  }
  return answers;
}

PlacesDesk::PlacesDesk(int me, std::vector<int> links, std::function<std::string()> places)
    : me_(me),
      links_(std::move(links)),
      places_(std::move(places)),
      allowance_(links_.size(), kQuestionBurst),
      counted_(links_.size(), Clock::now()) {
  try {
    thread_.start(
        "lockstep-desk", [this] { run(); }, "lockstep: the places desk");
  } catch (const std::exception&) {
    // No desk: questions to this node go unanswered, and its own ask() says "not known".
  }
}

PlacesDesk::~PlacesDesk() {
  thread_.stop();
}

std::string PlacesDesk::own() {
  std::string text;
  try {
    text = places_();
  } catch (const std::exception& error) {
    text = std::string("its places could not be read: ") + error.what();
  }
  text.resize(std::min(text.size(), kMaxPlaces));
  return text;
}

bool PlacesDesk::send(int node, const std::vector<std::byte>& frame) {
  const int fd = node >= 0 && static_cast<std::size_t>(node) < links_.size()
                     ? links_[static_cast<std::size_t>(node)]
                     : -1;
  const std::scoped_lock lock(send_mutex_);
  return fd >= 0 && rendezvous::send_all(fd, frame, Clock::now() + kSendBound, false);
}

PlacesDesk::Asked PlacesDesk::node0_question(const std::vector<int>& nodes, int asker) {
  Asked asked;
  asked.deadline = Clock::now() + kPlacesWait;
  for (const int node : nodes) {
    if (node == 0) {
      asked.answers[0] = own();
    } else if (node != asker && node > 0 && static_cast<std::size_t>(node) < links_.size() &&
               links_[static_cast<std::size_t>(node)] >= 0) {
      asked.waiting.insert(node);
    }
  }
  return asked;
}

std::map<int, std::string> PlacesDesk::ask(const std::vector<int>& nodes) {
  Asked asked;
  if (me_ == 0) {
    asked = node0_question(nodes, -1);
  } else {
    asked.deadline = Clock::now() + answer_wait();
    if (std::find(nodes.begin(), nodes.end(), me_) != nodes.end()) {
      asked.answers[me_] = own();
    }
    if (!links_.empty() && links_[0] >= 0 && nodes.size() <= links_.size()) {
      asked.waiting.insert(0);  // node 0 answers for all
    }
  }
  const std::uint32_t id = question(nodes, std::move(asked));
  std::unique_lock lock(mutex_);
  const auto found = asked_.find(id);
  answered_.wait_until(lock, found->second.deadline, [&] { return found->second.waiting.empty(); });
  std::map<int, std::string> answers = std::move(found->second.answers);
  asked_.erase(found);
  std::erase_if(answers, [&](const auto& answer) {  // what was asked only
    return std::find(nodes.begin(), nodes.end(), answer.first) == nodes.end();
  });
  return answers;
}

std::uint32_t PlacesDesk::question(const std::vector<int>& nodes, Asked asked) {
  const std::set<int> to = asked.waiting;
  std::uint32_t id = 0;
  {
    const std::scoped_lock lock(mutex_);
    id = ++last_id_;
    asked_.emplace(id, std::move(asked));
  }
  ByteWriter w = head(me_ == 0 ? kQuestion : kAsk, id);
  if (me_ != 0) {
    w.u32(static_cast<std::uint32_t>(nodes.size()));
    for (const int node : nodes) {
      w.u32(static_cast<std::uint32_t>(node));
    }
  }
  const std::vector<std::byte> frame = w.take();
  for (const int node : to) {
    if (!send(node, frame)) {
      const std::scoped_lock lock(mutex_);
      asked_.at(id).waiting.erase(node);  // it will not answer
    }
  }
  return id;
}

bool PlacesDesk::read_link(std::size_t node, short revents, std::vector<std::byte>& got,
                           std::optional<Clock::time_point>& since) {
  // An error is left on the link for its owner to read (rendezvous::look_at_link).
  if ((revents & (POLLERR | POLLNVAL)) != 0 || (revents & POLLIN) == 0) {
    gone(node);  // a failed link; or one that hung up with nothing more to read
    return false;
  }
  std::array<std::byte, 4096> bytes{};
  const ssize_t n = ::recv(links_[node], bytes.data(), bytes.size(), MSG_DONTWAIT);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      return true;
    }
    gone(node);  // the link ended (its owner sees that too) or failed as it was read
    return false;
  }
  got.insert(got.end(), bytes.begin(), bytes.begin() + n);
  const std::size_t held = got.size();
  take(static_cast<int>(node), got);
  if (got.empty()) {
    since.reset();
  } else if (got.size() < held || !since) {
    since = Clock::now();  // a frame begins to arrive
  }
  return true;
}

void PlacesDesk::run() noexcept {
  std::vector<std::vector<std::byte>> got(links_.size());
  // When the frame that `got` begins with began to arrive (none: nothing held).
  std::vector<std::optional<Clock::time_point>> since(links_.size());
  std::vector<bool> reading(links_.size());
  for (std::size_t node = 0; node < links_.size(); ++node) {
    reading[node] = links_[node] >= 0 && static_cast<int>(node) != me_;
  }
  try {
    for (;;) {
      std::vector<pollfd> fds{{thread_.wake_fd(), POLLIN, 0}};
      std::vector<int> nodes;
      for (std::size_t node = 0; node < links_.size(); ++node) {
        if (reading[node]) {
          fds.push_back({links_[node], POLLIN, 0});
          nodes.push_back(static_cast<int>(node));
        }
      }
      if (::poll(fds.data(), fds.size(), wait_ms(relays_due_in(), since)) < 0 && errno != EINTR) {
        return;
      }
      for (std::size_t node = 0; node < since.size(); ++node) {
        if (since[node] && Clock::now() - *since[node] >= kFrameBound) {
          got[node].clear();  // a frame that stalled: its answer is lost, not the later ones'
          since[node].reset();
        }
      }
      if (fds[0].revents != 0) {
        return;  // stopped
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        const auto node = static_cast<std::size_t>(nodes[i - 1]);
        if (fds[i].revents == 0) {
          continue;
        }
        reading[node] = read_link(node, fds[i].revents, got[node], since[node]);
      }
      send_relays_due();
    }
  } catch (...) {
    // Out of memory: this node's desk stops; the askers say that they were not told.
  }
}

void PlacesDesk::take(int node, std::vector<std::byte>& got) {
  while (auto frame = next_frame(got, me_, links_.size())) {
    if ((frame->type == kQuestion || frame->type == kAsk) &&
        !may_answer(static_cast<std::size_t>(node))) {
      continue;  // asked faster than any lockstep asks: dropped
    }
    if (frame->type == kQuestion) {
      send(node, answer_frame(frame->id));
    } else if (frame->type == kAsk) {
      relay(node, frame->id, frame->bytes);
    } else if (frame->type == kAnswer) {
      took(node, frame->id, {{node, peer_text(std::span(frame->bytes).subspan(kHead))}});
    } else {
      took(0, frame->id, relayed_entries(frame->bytes, links_.size()));
    }
  }
}

bool PlacesDesk::may_answer(std::size_t node) {
  const auto now = Clock::now();
  const auto earned = (now - counted_[node]) / kQuestionEvery;
  if (earned > 0) {
    allowance_[node] = static_cast<int>(std::min<std::int64_t>(
        kQuestionBurst, allowance_[node] + static_cast<std::int64_t>(earned)));
    counted_[node] = now;
  }
  if (allowance_[node] == 0) {
    return false;
  }
  --allowance_[node];
  return true;
}

std::vector<std::byte> PlacesDesk::answer_frame(std::uint32_t id) {
  const std::string text = own();
  ByteWriter w = head(kAnswer, id);
  w.text(text);
  return w.take();
}

void PlacesDesk::took(int from, std::uint32_t id, std::map<int, std::string> answers) {
  const std::scoped_lock lock(mutex_);
  const auto found = asked_.find(id);
  if (found == asked_.end() || found->second.waiting.erase(from) == 0) {
    return;  // an answer that came too late, or was not asked of `from`
  }
  answers.merge(found->second.answers);  // what this node knew itself stays
  found->second.answers = std::move(answers);
  answered_.notify_all();
}

void PlacesDesk::gone(std::size_t node) {
  const std::scoped_lock lock(mutex_);
  for (auto& [id, asked] : asked_) {
    asked.waiting.erase(static_cast<int>(node));  // it answers no more
  }
  answered_.notify_all();
}

void PlacesDesk::relay(int from, std::uint32_t id, const std::vector<std::byte>& frame) {
  std::vector<int> nodes;
  ByteReader r(frame);
  if (r.left() < kHead) {
    return;  // (next_frame gives whole frames)
  }
  (void)r.raw(kHead, "the head");
  while (r.left() >= 4) {
    const std::size_t node = r.u32();
    if (node >= links_.size()) {
      return;  // not what another node asks: not answered
    }
    nodes.push_back(static_cast<int>(node));
  }
  Asked asked = node0_question(nodes, from);
  asked.reply_to = from;
  asked.reply_id = id;
  (void)question(nodes, std::move(asked));  // answered by send_relays_due
}

int PlacesDesk::relays_due_in() {
  const std::scoped_lock lock(mutex_);
  int wait = -1;
  const auto now = Clock::now();
  for (const auto& [id, asked] : asked_) {
    if (asked.reply_to >= 0) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(asked.deadline - now);
      const int ms = asked.waiting.empty() ? 0 : static_cast<int>(std::max<long>(left.count(), 0));
      wait = wait < 0 ? ms : std::min(wait, ms);
    }
  }
  return wait;
}

void PlacesDesk::send_relays_due() {
  std::vector<std::pair<int, std::vector<std::byte>>> due;
  {
    const std::scoped_lock lock(mutex_);
    const auto now = Clock::now();
    for (auto it = asked_.begin(); it != asked_.end();) {
      const Asked& asked = it->second;
      if (asked.reply_to < 0 || (!asked.waiting.empty() && now < asked.deadline)) {
        ++it;
        continue;
      }
      ByteWriter body;
      for (const auto& [node, text] : asked.answers) {
        if (body.size() + kEntryHead + text.size() <= kMaxRelayed) {
          body.u32(static_cast<std::uint32_t>(node));
          body.text(text);
        }
      }
      const std::vector<std::byte> entries = body.take();
      ByteWriter frame = head(kRelayed, asked.reply_id);
      frame.sized(entries);
      due.emplace_back(asked.reply_to, frame.take());
      it = asked_.erase(it);
    }
  }
  for (const auto& [node, frame] : due) {
    (void)send(node, frame);
  }
}

}  // namespace lockstep::detail::ucx
