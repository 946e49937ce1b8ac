// The launcher's own messages and the writes that relay the ranks' output (output.hpp).
#include "output.hpp"

#include <unistd.h>

#include <cerrno>
#include <string>

namespace lockstep::run {

// Writes all of `text`; 0, or the errno of the write that failed.
int write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return n < 0 ? errno : EIO;
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

void say(const std::string& text) {
  std::string line = "lockstep-run: " + text + "\n";
  write_all(STDERR_FILENO, line);
}

}  // namespace lockstep::run
