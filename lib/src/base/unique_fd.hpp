// A file descriptor with one owner (internal): closed when its owner goes or takes another, moved
// and never copied. Every descriptor lockstep opens is held by one; nothing else calls close.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <utility>

namespace lockstep::detail {

class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  // Takes `fd` (a negative one: none).
  explicit UniqueFd(int fd) noexcept : fd_(fd < 0 ? -1 : fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }

  // Gives the descriptor up without closing it: the caller owns it now.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }

  // Closes the descriptor held, if any, and takes `fd`. errno is as before: a caller that is
  // about to report the failure of a call on the descriptor reports that call's error.
  void reset(int fd = -1) noexcept {
    const int old = std::exchange(fd_, fd < 0 ? -1 : fd);
    if (old >= 0 && old != fd_) {
      const int saved = errno;
      (void)::close(old);  // Linux releases the descriptor even when close reports an error
      errno = saved;
    }
  }

 private:
  int fd_ = -1;
};

}  // namespace lockstep::detail
