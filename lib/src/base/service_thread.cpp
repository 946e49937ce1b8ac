#include "base/service_thread.hpp"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "base/proc.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {

ServiceThread::~ServiceThread() {
  stop();
}

bool ServiceThread::in_forked_child() const noexcept {
  return thread_.joinable() && ::getpid() != owner_;
}

void ServiceThread::start(const char* name, std::function<void()> body, const std::string& what) {
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) {
    throw_errno(what, "eventfd");
  }
  wake_ = std::move(wake);
  stopping_.store(false, std::memory_order_seq_cst);
  owner_ = ::getpid();  // before the thread runs: nothing then sees it as a forked child's
  sigset_t all;
  sigset_t before;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &before);
  try {
    thread_ = std::thread(std::move(body));
  } catch (const std::system_error& error) {
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    wake_.reset();
    throw SystemError(what + ": starting the " + name + " thread failed: " + error.what(),
                      error.code().value());
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  pthread_setname_np(thread_.native_handle(), name);
}

void ServiceThread::drain() const noexcept {
  std::uint64_t count = 0;
  [[maybe_unused]] const ssize_t got = ::read(wake_.get(), &count, sizeof count);
}

void ServiceThread::wake() const noexcept {
  if (in_forked_child()) {
    return;  // the eventfd is the parent's thread's too
  }
  const std::uint64_t one = 1;
  // An eventfd write of 1 fails only on a full counter (2^64 - 2 wakes unread).
  [[maybe_unused]] const ssize_t written = ::write(wake_.get(), &one, sizeof one);
}

void ServiceThread::request_stop() noexcept {
  if (thread_.joinable() && !in_forked_child()) {
    stopping_.store(true, std::memory_order_seq_cst);
    wake();
  }
}

void ServiceThread::stop() noexcept {
  if (in_forked_child()) {
    forget();
    return;
  }
  if (!thread_.joinable()) {
    wake_.reset();
    return;
  }
  request_stop();
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // stopped from its own body (an exit handler on it): it ends on return
  } else {
    try {
      thread_.join();
    } catch (...) {
      // (a join that fails: the thread is gone) nothing to wait for
    }
  }
  wake_.reset();
}

void ServiceThread::forget() noexcept {
  if (thread_.joinable()) {
    static auto* kept = new std::vector<std::thread>();  // NOLINT: never freed
    try {
      kept->push_back(std::move(thread_));
    } catch (...) {
      (void)new std::thread(std::move(thread_));  // NOLINT: never freed
    }
  }
  wake_.reset();  // this child's copy: the parent's thread polls its own
}

}  // namespace lockstep::detail
