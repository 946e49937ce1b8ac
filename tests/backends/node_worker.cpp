// One process of a multi-node test job, started by lockstep-run (see multinode_test.cpp).
//
//   node_worker SCENARIO SHARED_FILE [ARGS...]
//
// SHARED_FILE is a file that every process of every simulated node maps: the nodes are simulated
// on one machine, so the test can check across them what a real cluster could not. Each process
// prints "RESULT ..." lines that the test reads, and exits 0 when its scenario went as expected.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <lockstep/lockstep.hpp>
#include <random>
#include <string>
#include <thread>

namespace {

struct Shared {
  std::atomic<std::int64_t> round[64];             // per process: the round it last entered
  std::atomic<std::int32_t> local_main_calls[16];  // per node
  std::atomic<std::int32_t> prepared;
};

Shared* map_shared(const char* path) {
  int fd = ::open(path, O_RDWR);
  if (fd < 0 || ::ftruncate(fd, sizeof(Shared)) != 0) {
    std::cerr << "cannot open " << path << "\n";
    std::exit(3);
  }
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (mem == MAP_FAILED) {
    std::exit(3);
  }
  return static_cast<Shared*>(mem);
}

int env_int(const char* name) {
  const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
  return value != nullptr ? std::atoi(value) : -1;
}

#define CHECK(condition)                                                         \
  do {                                                                           \
    if (!(condition)) {                                                          \
      std::cout << "RESULT failed " << __LINE__ << ": " #condition << std::endl; \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

// Every State query, then `rounds` barriers with random delays, checking after each that no
// process of any node is still before it; on_local_main_process and main_process_first.
int rounds(lockstep::State& state, Shared& shared, int rounds) {
  const int me = state.process_index();
  const int n = state.num_processes();
  CHECK(me == env_int("RANK"));
  CHECK(n == env_int("WORLD_SIZE"));
  CHECK(state.local_process_index() == env_int("LOCAL_RANK"));
  CHECK(state.num_local_processes() == env_int("LOCAL_WORLD_SIZE"));
  CHECK(state.node_index() == env_int("GROUP_RANK"));
  CHECK(state.num_nodes() == env_int("LOCKSTEP_NNODES"));
  CHECK(state.is_main_process() == (me == 0));
  CHECK(state.is_local_main_process() == (env_int("LOCAL_RANK") == 0));
  CHECK(state.is_last_process() == (me == n - 1));

  state.on_local_main_process([&] { shared.local_main_calls[state.node_index()].fetch_add(1); })();
  {
    auto guard = state.main_process_first();
    if (state.is_main_process()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      shared.prepared.store(42);
    } else {
      CHECK(shared.prepared.load() == 42);  // the main process went first
    }
  }
  for (int node = 0; node < state.num_nodes(); ++node) {
    CHECK(shared.local_main_calls[node].load() == 1);  // once per node
  }

  if (state.num_nodes() > 1) {
    // Across machines a try gives up at once without arriving (an arrival there cannot be taken
    // back): had it arrived, the rounds below would be one episode out of step.
    CHECK(!state.try_wait_for_everyone());
  }
  std::mt19937 random(static_cast<unsigned>(me) * 7919U + 17U);
  int early = 0;
  for (int r = 1; r <= rounds; ++r) {
    shared.round[me].store(r);
    if (random() % 50 == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(random() % 2000));
    }
    state.wait_for_everyone();
    for (int p = 0; p < n; ++p) {
      auto seen = shared.round[p].load();
      if (seen < r || seen > r + 1) {
        ++early;  // p had not entered round r (or ran ahead by two): an early pass
      }
    }
  }
  state.print("PRINTED once by node ", state.node_index());  // once per machine
  std::cout << "RESULT rounds " << rounds << " early " << early << std::endl;
  CHECK(early == 0);
  return 0;
}

// `rounds` broadcasts of the main process's bytes, up to the limit, then one over it.
int broadcast_rounds(lockstep::State& state, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    const std::size_t size =
        (static_cast<std::size_t>(round) * 7919U) % (lockstep::State::kMaxBroadcast + 1);
    std::string text(size, '\0');
    for (std::size_t i = 0; i < size; ++i) {
      text[i] = static_cast<char>('a' + (i + static_cast<std::size_t>(round)) % 26);
    }
    if (state.broadcast(state.is_main_process() ? text : "not this") != text) {
      std::cout << "RESULT wrong bytes in round " << round << std::endl;
      return 1;
    }
  }
  try {
    (void)state.broadcast(
        std::string(state.is_main_process() ? lockstep::State::kMaxBroadcast + 1 : 0, 'y'));
    std::cout << "RESULT a broadcast over the limit passed" << std::endl;
    return 1;
  } catch (const lockstep::Error& error) {
    if (std::string(error.what()).find("carries at most 32768") == std::string::npos) {
      std::cout << "RESULT refused with " << error.what() << std::endl;
      return 1;
    }
  }
  std::cout << "RESULT " << state.broadcast(state.is_main_process() ? "done" : "") << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: node_worker SCENARIO SHARED_FILE [ARGS...]\n";
    return 2;
  }
  const std::string scenario = argv[1];
  Shared& shared = *map_shared(argv[2]);
  const int arg = argc > 3 ? std::atoi(argv[3]) : 0;
  // When one process fails, lockstep-run stops the node's others with SIGTERM: they must still
  // report how their wait ended (the test gives the launcher a long grace period).
  (void)std::signal(SIGTERM, SIG_IGN);
  try {
    lockstep::State state;
    std::cout << "RESULT joined " << state.process_index() << std::endl;
    if (scenario == "rounds") {
      return rounds(state, shared, arg);
    }
    if (scenario == "timeout") {  // node `arg` arrives 4 s late; the others wait 1 s
      state.wait_for_everyone();
      if (state.node_index() == arg) {
        std::this_thread::sleep_for(std::chrono::seconds(4));
        state.wait_for_everyone();
      } else {
        state.wait_for_everyone(std::chrono::seconds(1));
      }
      std::cout << "RESULT passed" << std::endl;
      return 1;
    }
    if (scenario == "late") {  // node 1's processes come `arg` ms late to the one timed wait
      if (state.node_index() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(arg));
      }
      state.wait_for_everyone(std::chrono::milliseconds(1000));
      std::cout << "RESULT passed" << std::endl;
      return 1;
    }
    if (scenario == "broadcast") {
      return broadcast_rounds(state, arg);
    }
    if (scenario == "stall") {  // node 1's processes come `arg` ms late to an untimed wait
      if (state.node_index() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(arg));
      }
      state.wait_for_everyone();
      std::cout << "RESULT passed" << std::endl;
      return 0;
    }
    if (scenario == "forever") {  // barriers until one fails
      for (;;) {
        state.wait_for_everyone();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (scenario == "pause") {  // a barrier, `arg` ms of work, then barriers until one fails
      state.wait_for_everyone();
      std::this_thread::sleep_for(std::chrono::milliseconds(arg));
      try {
        state.wait_for_everyone();
      } catch (const lockstep::PeerLostError& error) {
        std::cout << "RESULT lost " << error.process_index()
                  << " after the pause what=" << error.what() << std::endl;
        return 11;
      }
      for (;;) {
        state.wait_for_everyone();
      }
    }
    if (scenario == "kill") {  // process `arg` dies after 20 rounds; the others keep waiting
      for (int r = 0; r < 20; ++r) {
        state.wait_for_everyone();
      }
      if (state.process_index() == arg) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ::kill(::getpid(), SIGKILL);
      }
      state.wait_for_everyone();
      std::cout << "RESULT passed" << std::endl;
      return 1;
    }
    std::cerr << "unknown scenario " << scenario << "\n";
    return 2;
  } catch (const lockstep::TimeoutError& error) {
    std::string missing;
    for (int p : error.missing()) {
      missing += std::to_string(p) + ",";
    }
    std::cout << "RESULT timeout missing=" << missing << " what=" << error.what() << std::endl;
    return 10;
  } catch (const lockstep::PeerLostError& error) {
    std::cout << "RESULT lost " << error.process_index() << " what=" << error.what() << std::endl;
    return 11;
  } catch (const lockstep::ConfigError& error) {
    std::cout << "RESULT config what=" << error.what() << std::endl;
    return 12;
  } catch (const lockstep::Error& error) {
    std::cout << "RESULT error what=" << error.what() << std::endl;
    return 13;
  }
}
