// Where another machine's processes are: the question on the links (places.hpp).
#include "ucx/places.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <span>

#include "base/little_endian.hpp"

namespace lockstep::detail::ucx {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::byte kQuestion{0x51};  // 'Q'
constexpr std::byte kAnswer{0x50};    // 'P'
constexpr std::size_t kQuestionSize = 5;
constexpr std::size_t kAnswerHead = 9;
constexpr auto kAnswerSendBound = std::chrono::seconds(1);

// Sends all of `bytes` on `fd` by `deadline`; false if the link fails or stays full.
bool send_all(int fd, std::span<const std::byte> bytes, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n =
        ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return false;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return false;
    }
    pollfd entry{fd, POLLOUT, 0};
    const int ready = ::poll(&entry, 1, static_cast<int>(left.count()));
    if ((ready < 0 && errno != EINTR) ||
        (ready > 0 && (entry.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0)) {
      return false;
    }
  }
  return true;
}

// A peer's text as a message may carry it: printable, and at most kMaxPlaces bytes.
std::string printable(std::span<const std::byte> bytes) {
  std::string text;
  text.reserve(bytes.size());
  for (const std::byte byte : bytes) {
    const auto c = static_cast<unsigned char>(byte);
    text.push_back(c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c));
  }
  return text;
}

}  // namespace

PlacesAnswerer::PlacesAnswerer(int link, std::function<std::string()> places)
    : link_(link), stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), places_(std::move(places)) {
  if (stop_ >= 0 && link_ >= 0) {
    thread_ = std::thread([this] { run(); });
  }
}

PlacesAnswerer::~PlacesAnswerer() {
  if (thread_.joinable()) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(stop_, &one, sizeof one);  // cannot fail
    thread_.join();
  }
  if (stop_ >= 0) {
    ::close(stop_);
  }
}

void PlacesAnswerer::run() noexcept {
  std::vector<std::byte> got;
  for (;;) {
    std::array<pollfd, 2> fds{{{link_, POLLIN, 0}, {stop_, POLLIN, 0}}};
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) {
        continue;
      }
      return;
    }
    // An error is left on the link for its owner to read (rendezvous::look_at_link).
    if (fds[1].revents != 0 || (fds[0].revents & (POLLERR | POLLNVAL)) != 0 ||
        (fds[0].revents & POLLIN) == 0) {
      return;  // stopped; a failed link; or one that hung up with nothing more to read
    }
    std::array<std::byte, 64> bytes{};
    const ssize_t n = ::recv(link_, bytes.data(), bytes.size(), MSG_DONTWAIT);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        continue;
      }
      return;  // the link ended (its owner sees that too) or failed as it was read
    }
    got.insert(got.end(), bytes.begin(), bytes.begin() + n);
    while (!got.empty()) {
      if (got.front() != kQuestion) {
        got.erase(got.begin());  // not a question: nothing else is sent on a link after the join
        continue;
      }
      if (got.size() < kQuestionSize) {
        break;
      }
      answer(static_cast<std::uint32_t>(get_le(&got[1], 4)));
      got.erase(got.begin(), got.begin() + kQuestionSize);
    }
  }
}

void PlacesAnswerer::answer(std::uint32_t id) noexcept {
  try {
    std::string text;
    try {
      text = places_();
    } catch (const std::exception& error) {
      text = std::string("its places could not be read: ") + error.what();
    }
    text.resize(std::min(text.size(), kMaxPlaces));
    std::vector<std::byte> frame(kAnswerHead + text.size());
    frame[0] = kAnswer;
    put_le(&frame[1], id, 4);
    put_le(&frame[5], text.size(), 4);
    std::transform(text.begin(), text.end(), frame.begin() + kAnswerHead,
                   [](char c) { return static_cast<std::byte>(c); });
    (void)send_all(link_, frame, Clock::now() + kAnswerSendBound);
  } catch (...) {
    // Out of memory: node 0 says that this node did not answer.
  }
}

std::map<int, std::string> ask_places(const std::vector<int>& links,
                                      const std::vector<int>& nodes) {
  static std::atomic<std::uint32_t> last_id{0};
  const std::uint32_t id = last_id.fetch_add(1, std::memory_order_relaxed) + 1;
  std::array<std::byte, kQuestionSize> question{kQuestion};
  put_le(&question[1], id, 4);
  const auto deadline = Clock::now() + kPlacesWait;
  struct Asked {
    int node;
    int fd;
    std::vector<std::byte> got;
  };
  std::vector<Asked> asked;
  for (const int node : nodes) {
    const int fd = node >= 0 && static_cast<std::size_t>(node) < links.size()
                       ? links[static_cast<std::size_t>(node)]
                       : -1;
    if (fd >= 0 && send_all(fd, question, deadline)) {
      asked.push_back({node, fd, {}});
    }
  }
  std::map<int, std::string> answers;
  while (!asked.empty()) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    std::vector<pollfd> fds;
    fds.reserve(asked.size());
    for (const Asked& one : asked) {
      fds.push_back({one.fd, POLLIN, 0});
    }
    if (left.count() <= 0 ||
        (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) < 0 && errno != EINTR)) {
      break;
    }
    for (std::size_t i = 0; i < asked.size(); ++i) {
      Asked& one = asked[i];
      // An error stays on the link for check_links to read.
      if ((fds[i].revents & POLLIN) == 0 || (fds[i].revents & (POLLERR | POLLNVAL)) != 0) {
        one.fd = fds[i].revents == 0 ? one.fd : -1;
        continue;
      }
      std::array<std::byte, 1024> bytes{};
      const ssize_t n = ::recv(one.fd, bytes.data(), bytes.size(), MSG_DONTWAIT);
      if (n <= 0) {
        one.fd = n < 0 && (errno == EAGAIN || errno == EINTR) ? one.fd : -1;
        continue;
      }
      one.got.insert(one.got.end(), bytes.begin(), bytes.begin() + n);
      // Answers to earlier questions (asked again before they came) are passed over.
      while (one.got.size() >= kAnswerHead && one.fd >= 0) {
        const auto length = static_cast<std::size_t>(get_le(&one.got[5], 4));
        if (one.got.front() != kAnswer || length > kMaxPlaces) {
          one.fd = -1;  // not an answer: this node's is not taken
          break;
        }
        if (one.got.size() < kAnswerHead + length) {
          break;
        }
        if (get_le(&one.got[1], 4) == id) {
          answers[one.node] = printable(std::span(one.got).subspan(kAnswerHead, length));
          one.fd = -1;  // answered
          break;
        }
        one.got.erase(one.got.begin(),
                      one.got.begin() + static_cast<std::ptrdiff_t>(kAnswerHead + length));
      }
    }
    std::erase_if(asked, [](const Asked& one) { return one.fd < 0; });
  }
  return answers;
}

}  // namespace lockstep::detail::ucx
