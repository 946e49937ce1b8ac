// Finding UCX's TCP connections under the worker's event fd (paths.hpp).
#include "ucx/paths.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "ucx/rendezvous.hpp"

namespace lockstep::detail::ucx {
namespace {

std::string fd_link(int fd) {
  return "/proc/self/fd/" + std::to_string(fd);
}

// What /proc's link `link` (fd_link) says its descriptor is ("socket:[123]",
// "anon_inode:[eventpoll]"), or "".
std::string what_is(const std::string& link) {
  char target[128] = {};
  const ssize_t length = ::readlink(link.c_str(), target, sizeof target - 1);
  return length > 0 ? std::string(target, static_cast<std::size_t>(length)) : std::string();
}

// The descriptors epoll instance `fd` watches, with the inode each had when it was added.
std::vector<PathSocket> watched_by(int fd) {
  std::vector<PathSocket> out;
  std::ifstream info("/proc/self/fdinfo/" + std::to_string(fd));
  for (std::string line; std::getline(info, line);) {
    // "tfd:       12 events:       19 data: 7f..  pos:0 ino:5c1f sdev:8"
    if (!line.starts_with("tfd:")) {
      continue;
    }
    std::istringstream fields(line.substr(4));
    PathSocket entry;
    fields >> entry.fd;
    const auto at = line.find(" ino:");
    if (!fields || at == std::string::npos) {
      continue;
    }
    entry.inode = static_cast<ino_t>(std::strtoull(line.c_str() + at + 5, nullptr, 16));
    out.push_back(entry);
  }
  return out;
}

bool is_connected_tcp(int fd) {
  int type = 0;
  int protocol = 0;
  socklen_t size = sizeof type;
  sockaddr_storage peer{};
  socklen_t peer_size = sizeof peer;
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &size) == 0 && type == SOCK_STREAM &&
         (size = sizeof protocol,
          ::getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &size) == 0) &&
         protocol == IPPROTO_TCP &&
         ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) == 0 &&
         (peer.ss_family == AF_INET || peer.ss_family == AF_INET6);
}

void collect(int epoll_fd, int depth, std::vector<PathSocket>& sockets) {
  if (depth > 4) {
    return;  // UCX nests two deep (the worker's, a transport's); more is not UCX's
  }
  for (const PathSocket& entry : watched_by(epoll_fd)) {
    // stat(2) of /proc's link, not fstat(2) of the descriptor: it is UCX's, often made by UCX's
    // async thread (an accepted connection), and ThreadSanitizer, which cannot see the kernel's
    // order (the descriptor is in UCX's epoll instance before fdinfo lists it), reported the
    // fstat as a race on the descriptor. The inode check is the same.
    struct stat now {};
    const std::string link = fd_link(entry.fd);
    if (::stat(link.c_str(), &now) != 0 || now.st_ino != entry.inode) {
      continue;  // closed since, or the number reused by another file
    }
    const std::string what = what_is(link);
    if (what == "anon_inode:[eventpoll]") {
      collect(entry.fd, depth + 1, sockets);
    } else if (what.starts_with("socket:") && is_connected_tcp(entry.fd) &&
               std::find(sockets.begin(), sockets.end(), entry) == sockets.end()) {
      sockets.push_back(entry);
    }
  }
}

}  // namespace

std::vector<PathSocket> tcp_sockets_under(int event_fd) {
  std::vector<PathSocket> sockets;
  if (what_is(fd_link(event_fd)) == "anon_inode:[eventpoll]") {
    collect(event_fd, 0, sockets);
  }
  return sockets;
}

void watch_paths(const std::vector<PathSocket>& found, std::vector<PathSocket>& watched,
                 std::chrono::milliseconds timeout) {
  for (const PathSocket& socket : found) {
    if (std::find(watched.begin(), watched.end(), socket) != watched.end()) {
      continue;
    }
    watched.push_back(socket);  // once: one that refuses is left as UCX made it
    try {
      rendezvous::make_link(socket.fd, timeout);
    } catch (const std::exception&) {
    }
  }
}

}  // namespace lockstep::detail::ucx
