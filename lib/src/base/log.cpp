#include "base/log.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

namespace lockstep::detail {

void log_line(int rank, const std::string& text) noexcept {
  try {
    const auto now = std::chrono::system_clock::now();
    const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    const auto millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
        1000;
    std::tm utc{};
    (void)::gmtime_r(&seconds, &utc);
    char stamp[64];
    (void)std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                        utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min,
                        utc.tm_sec, static_cast<int>(millis));
    const std::string line =
        "lockstep [" + std::string(stamp) + " rank " + std::to_string(rank) + "] " + text + "\n";
    std::size_t done = 0;
    while (done < line.size()) {
      const ssize_t wrote = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
      if (wrote <= 0) {
        return;  // best effort: a closed stderr loses the line
      }
      done += static_cast<std::size_t>(wrote);
    }
  } catch (...) {
    // (out of memory) the line is lost
  }
}

}  // namespace lockstep::detail
