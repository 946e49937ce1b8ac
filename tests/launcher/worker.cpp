// A program for the launcher tests: `worker MODE [ARGS]`, run under lockstep-run.
#include <unistd.h>
#include <csignal>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <lockstep/lockstep.hpp>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "ok";
  int chosen = argc > 2 ? std::atoi(argv[2]) : 0;
  int code = argc > 3 ? std::atoi(argv[3]) : 1;
  if (mode == "late") {  // rank `chosen` (by RANK) joins `code` seconds after the others
    const char* rank = std::getenv("RANK");  // NOLINT(concurrency-mt-unsafe): one thread
    if (rank != nullptr && std::atoi(rank) == chosen) {
      std::this_thread::sleep_for(std::chrono::seconds(code));
    }
  }
  lockstep::State state;
  state.wait_for_everyone();
  const int rank = state.process_index();
  if (mode == "ok" || mode == "late") {
    return 0;
  }
  if (mode == "print") {
    std::printf("hello from %d\npartial line from %d", rank, rank);
    std::fprintf(stderr, "error line from %d\n", rank);
    return 0;
  }
  if (mode == "fail") {  // rank `chosen` exits with `code`; the others would sleep for a minute
    if (rank == chosen) {
      return code;
    }
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "killself") {  // rank `chosen` dies; the others wait for it in a barrier
    if (rank == chosen) {
      ::raise(SIGKILL);
    }
    state.wait_for_everyone();
    return 0;
  }
  if (mode == "allkill") {  // everyone dies without leaving: the segment stays behind
    ::raise(SIGKILL);
  }
  if (mode == "sleep") {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "ignore-term") {
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGINT, SIG_IGN);
    std::printf("ready %d\n", rank);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  std::fprintf(stderr, "worker: unknown mode %s\n", mode.c_str());
  return 2;
}
