// The launcher's own messages and the writes that relay the ranks' output (output.hpp).
#include "output.hpp"

#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

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

namespace {

// One stream of the console (start_console): its queue and the thread that writes it. Each
// stream has its own, so that a stdout nobody reads does not hold back the launcher's lines on
// stderr.
struct Writer {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::string> queue;
  std::size_t backlog = 0;
  bool running = false;
  bool stopping = false;
  std::thread thread;

  Writer() = default;
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  // At exit without finish_console() (an exception out of the launcher): written, then stopped.
  ~Writer() { finish(); }

  void start(int fd) {
    const std::lock_guard lock(mutex);
    if (!running) {
      running = true;
      stopping = false;
      thread = std::thread([this, fd] { run(fd); });
    }
  }
  // False when not running (the caller writes at once).
  bool queue_up(std::string& text) {
    const std::lock_guard lock(mutex);
    if (!running) {
      return false;
    }
    backlog += text.size();
    queue.push_back(std::move(text));
    changed.notify_one();
    return true;
  }
  void finish() {
    {
      const std::lock_guard lock(mutex);
      stopping = true;
      changed.notify_one();
    }
    if (thread.joinable()) {
      thread.join();
    }
    const std::lock_guard lock(mutex);
    running = false;
  }
  void run(int fd) {
    std::unique_lock lock(mutex);
    for (;;) {
      changed.wait(lock, [this] { return stopping || !queue.empty(); });
      if (queue.empty()) {
        return;  // stopping, and everything written
      }
      std::string text = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      (void)write_all(fd, text);  // a console that fails is not the job's failure
      lock.lock();
      backlog -= text.size();
    }
  }
};

Writer& writer(int fd) {
  static Writer out;
  static Writer err;
  return fd == STDERR_FILENO ? err : out;
}

}  // namespace

void start_console() {
  writer(STDOUT_FILENO).start(STDOUT_FILENO);
  writer(STDERR_FILENO).start(STDERR_FILENO);
}

void to_console(int fd, std::string text) {
  if (!writer(fd).queue_up(text)) {
    (void)write_all(fd, text);
  }
}

std::size_t console_backlog() {
  std::size_t total = 0;
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    Writer& w = writer(fd);
    const std::lock_guard lock(w.mutex);
    total += w.backlog;
  }
  return total;
}

void finish_console() {
  writer(STDOUT_FILENO).finish();
  writer(STDERR_FILENO).finish();
}

void say(const std::string& text) {
  to_console(STDERR_FILENO, "lockstep-run: " + text + "\n");
}

}  // namespace lockstep::run
