// The leaders' own paths to each other, watched as the links to node 0 are (internal to
// backends/ucx).
//
// UCX's TCP transport keeps one or two connections between each pair of leaders, with the
// kernel's keepalive (10 s idle) but no user timeout: a connection whose data goes unanswered is
// retransmitted for about a quarter of an hour, so two machines that lose each other but not
// node 0 left the job waiting. UCX 1.13 cannot set a user timeout, so lockstep finds
// UCX's connections itself: the worker's event fd is an epoll instance, and each transport's
// instance under it watches that transport's sockets (/proc/self/fdinfo lists what an epoll
// instance watches). Each found TCP connection gets the link's keepalive and user timeout
// (rendezvous::make_link); when the kernel gives up on it, UCX reports the endpoint failed.
// Nothing else in the process is touched: a socket that no epoll instance of UCX's worker
// watches is not found.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <vector>

namespace lockstep::detail::ucx {

// A socket, by descriptor and inode (a descriptor closed and reused is another socket).
struct PathSocket {
  int fd = -1;
  ino_t inode = 0;
  friend bool operator==(const PathSocket&, const PathSocket&) = default;
};

// The connected TCP sockets that epoll instance `event_fd` watches, directly or through the
// epoll instances it watches. Empty where /proc cannot say.
std::vector<PathSocket> tcp_sockets_under(int event_fd);

// Gives each of `found` that is not in `watched` the link's keepalive and user timeout
// (`timeout`), and adds it there; a socket that refuses is left as UCX made it.
void watch_paths(const std::vector<PathSocket>& found, std::vector<PathSocket>& watched,
                 std::chrono::milliseconds timeout);

}  // namespace lockstep::detail::ucx
