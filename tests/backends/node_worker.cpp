// One process of a multi-node test job, started by lockstep-run (see multinode_test.cpp). The
// stream scenarios drive flags mode's stream barrier through a fake GPU (linked from the library's
// internals: tests/support/fake_gpu.hpp).
//
//   node_worker SCENARIO SHARED_FILE [ARGS...]
//
// SHARED_FILE is a file that every process of every simulated node maps: the nodes are simulated
// on one machine, so the test can check across them what a real cluster could not. Each process
// prints "RESULT ..." lines that the test reads, and exits 0 when its scenario went as expected.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <lockstep/lockstep.hpp>
#include <random>
#include <string>
#include <thread>

#if defined(LOCKSTEP_TEST_FAKE_CUDA)
#include "node_worker_cuda.hpp"
#endif
#include "fake_gpu.hpp"
#include "pattern.hpp"

namespace {

using lockstep::testing::pattern;

struct Shared {
  std::atomic<std::int64_t> round[64];             // per process: the round it last entered
  std::atomic<std::int32_t> local_main_calls[16];  // per node
  std::atomic<std::int32_t> prepared;
  // The stream scenarios: each process's stream's work (the round it finished), and the time
  // (steady clock, ns) the victim died.
  std::atomic<std::uint64_t> stream_work[64];
  std::atomic<std::int64_t> killed_at;
  // The nested scenario: body k done on node j's first process (done[k][j]), or the job's ([k][0]).
  std::atomic<std::int32_t> done[4][16];
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

// `rounds` broadcasts of the main process's bytes, on both sides of the segment's area (32 KiB)
// and past it (any size: the backend's allgather between machines), then one of 3 MiB.
int broadcast_rounds(lockstep::State& state, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    const auto r = static_cast<std::size_t>(round);
    const std::size_t sizes[] = {0, r * 7919 % 32768, 32768, 32769, 40000 + r * 7919};
    const std::string text = pattern(sizes[r % 5], r);
    if (state.broadcast(state.is_main_process() ? text : "not this") != text) {
      std::cout << "RESULT wrong bytes in round " << round << std::endl;
      return 1;
    }
  }
  const std::string large = pattern(3 << 20, 99);
  if (state.broadcast(state.is_main_process() ? large : "") != large) {
    std::cout << "RESULT wrong bytes in the large broadcast" << std::endl;
    return 1;
  }
  std::cout << "RESULT " << state.broadcast(state.is_main_process() ? "done" : "") << std::endl;
  return 0;
}

// Issue 46, issue 58: everyone's results across machines: `rounds` gathers of different sizes
// (empty, within a process's region of the area, past it, past what one message between
// machines carries), a late node now and then; every process checks every process's bytes.
// Then one of 1 MiB per process, and a trigger set on the last node.
int gather_rounds(lockstep::State& state, int rounds) {
  const int n = state.num_processes();
  const auto bytes_of = [](int of, int round) {
    const std::size_t k = static_cast<std::size_t>(round) * 5 + static_cast<std::size_t>(of);
    const std::size_t sizes[] = {0, k * 389 % 4000, 9000, 70000 + k * 97};
    return pattern(sizes[k % 4], k);
  };
  for (int round = 0; round < rounds; ++round) {
    if (state.node_index() == round % state.num_nodes() && round % 3 == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto all = state.gather_object(bytes_of(state.process_index(), round));
    for (int of = 0; of < n; ++of) {
      if (all.size() != static_cast<std::size_t>(n) ||
          all[static_cast<std::size_t>(of)] != bytes_of(of, round)) {
        std::cout << "RESULT wrong bytes of process " << of << " in round " << round << std::endl;
        return 1;
      }
    }
  }
  const auto seed = [](int of) { return std::size_t{1000} + static_cast<std::size_t>(of); };
  const auto large = state.gather_object(pattern(1 << 20, seed(state.process_index())));
  for (int of = 0; of < n; ++of) {
    if (large.size() != static_cast<std::size_t>(n) ||
        large[static_cast<std::size_t>(of)] != pattern(1 << 20, seed(of))) {
      std::cout << "RESULT wrong bytes of process " << of << " in the large gather" << std::endl;
      return 1;
    }
  }
  if (state.node_index() == state.num_nodes() - 1 && state.is_local_main_process()) {
    state.set_trigger();
  }
  if (!state.check_trigger() || state.check_trigger()) {
    std::cout << "RESULT the trigger was not seen once everywhere" << std::endl;
    return 1;
  }
  std::cout << "RESULT " << state.gather_object(std::string("done"))[0] << std::endl;
  return 0;
}

// Issue 58: first blocks nested across machines (TRL's local block inside the global one, the
// other way round, one block twice): each body runs on its first process (the main process, or
// each machine's main process for a local block), and is done there, before any other enters.
int nested_blocks(lockstep::State& state, Shared& shared) {
  const int node = state.node_index();
  const auto body = [&](int k, bool local) {
    const bool first = local ? state.is_local_main_process() : state.is_main_process();
    std::atomic<std::int32_t>& done = shared.done[k][local ? node : 0];
    if (first) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the others would overtake
      done.store(1);
      return true;
    }
    return done.load() == 1;
  };
  {
    auto outer = state.main_process_first();
    {
      auto inner = state.local_main_process_first();
      CHECK(body(0, true));
    }
    CHECK(body(1, false));
  }
  {
    auto outer = state.local_main_process_first();
    {
      auto inner = state.main_process_first();
      CHECK(body(2, false));
    }
    CHECK(body(3, true));
  }
  {
    auto outer = state.main_process_first();
    auto inner = state.main_process_first();
    CHECK(body(1, false));  // done already: a plain check that nobody is lost
  }
  state.wait_for_everyone();
  std::cout << "RESULT done" << std::endl;
  return 0;
}

std::int64_t now_ns() {
  return std::chrono::steady_clock::now().time_since_epoch().count();
}

// Flags mode across nodes on a fake GPU (tests/support/fake_gpu.hpp): `rounds` stream barriers,
// each stream doing its round's work first (now and then behind a random delay) and checking
// after the barrier, on the stream, that every process of every node had done it. Every 16th
// round a host barrier comes between, checked the same way on the host, and the last process's
// stream is 30 ms late to the stream barrier before it (each node's leader meets the stream
// episodes first, in the same order on every node),
// every 8th round's call is on a second stream, and every 4th is timed. First, each stream
// is behind 300 ms of work, and no call may wait for it: every call returns at once.
int stream_rounds(lockstep::State& state, Shared& shared, int rounds) {
  using lockstep::testing::FakeStream;
  const int me = state.process_index();
  const int n = state.num_processes();
  FakeStream first(static_cast<unsigned>(me) * 31U + 1U);
  FakeStream second(static_cast<unsigned>(me) * 31U + 2U);
  std::atomic<int> early{0};
  first.launch([] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
  const auto before = std::chrono::steady_clock::now();
  state.wait_for_everyone(first.handle());
  const auto took = std::chrono::steady_clock::now() - before;
  std::mt19937 random(static_cast<unsigned>(me) * 7919U + 17U);
  for (int r = 1; r <= rounds; ++r) {
    FakeStream& stream = r % 8 == 0 ? second : first;
    unsigned delay = random() % 20 == 0 ? random() % 2000 : 0;
    if (r % 16 == 0 && me == n - 1) {
      delay = 30000;  // its node's leader meets this episode late, but before the host barrier
    }
    stream.launch([&shared, me, r, delay] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay));
      // The largest round done: this work on a new stream is not ordered after the old
      // stream's work (only the barrier's operations are), which may write a smaller round.
      auto& work = shared.stream_work[me];
      for (auto seen = work.load();
           seen < static_cast<std::uint64_t>(r) &&
           !work.compare_exchange_weak(seen, static_cast<std::uint64_t>(r));) {
      }
    });
    if (r % 4 == 0) {
      state.wait_for_everyone(stream.handle(), std::chrono::seconds(20));
    } else {
      state.wait_for_everyone(stream.handle());
    }
    stream.launch([&shared, &early, n, r] {
      for (int p = 0; p < n; ++p) {
        if (shared.stream_work[p].load() < static_cast<std::uint64_t>(r)) {
          early.fetch_add(1);
        }
      }
    });
    if (r % 16 == 0) {
      if (state.node_index() == 0 && !stream.synchronize(std::chrono::seconds(20))) {
        // Node 0's leader has met this stream episode before it comes to the host barrier; node
        // 1's comes to it at once, its stream late: their meets must still pair in one order.
        early.fetch_add(1000);
      }
      shared.round[me].store(r);
      state.wait_for_everyone();
      for (int p = 0; p < n; ++p) {
        if (shared.round[p].load() < r) {
          early.fetch_add(1);  // a host barrier passed before p came
        }
      }
    }
  }
  const bool drained =
      first.synchronize(std::chrono::seconds(20)) && second.synchronize(std::chrono::seconds(20));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  std::cout << "RESULT streams " << rounds << " early " << early.load() << " drained " << drained
            << " first call " << (ms < 100 ? "returned at once" : std::to_string(ms) + " ms")
            << std::endl;
  state.wait_for_everyone();
  CHECK(early.load() == 0 && drained && ms < 100);
  return 0;
}

// Flags mode across nodes on a fake GPU whose device refuses it in process `refuser` only:
// every process of every node fails its stream barrier's set-up alike, twice, with one clear
// error (the refuser with its reason, the others naming it), and the host barrier goes on.
int stream_refused(lockstep::State& state, int refuser) {
  lockstep::testing::FakeStream stream(static_cast<unsigned>(state.process_index()) + 5U);
  const std::string wanted =
      state.process_index() == refuser
          ? "has no 64-bit stream memory operations"
          : "process " + std::to_string(refuser) + " could not set up LOCKSTEP_GPU_BARRIER=flags";
  for (int call = 0; call < 2; ++call) {
    try {
      state.wait_for_everyone(stream.handle());
      std::cout << "RESULT a stream barrier returned" << std::endl;
      return 1;
    } catch (const lockstep::Error& error) {
      if (std::string(error.what()).find(wanted) == std::string::npos) {
        std::cout << "RESULT another error: " << error.what() << std::endl;
        return 1;
      }
    }
  }
  state.wait_for_everyone();
  std::cout << "RESULT refused together" << std::endl;
  return 0;
}

// Sleeps `ms` with nanosleep alone (async-signal-safe: for a child forked beside threads).
void nap_ms(long ms) {
  timespec left{ms / 1000, (ms % 1000) * 1000000};
  while (::nanosleep(&left, &left) != 0) {
  }
}

// Flags mode across nodes on a fake GPU, and a job's clean end: 4 stream barriers, then a last
// host barrier that node 0's processes come to 300 ms late, while node 1's leader is stopped
// (SIGSTOP, by a child of its own) from 100 ms to 700 ms after it arrived. Node 0 passes it,
// its second process leaves at once, and its leader stays 1.5 s, its relay idle. Node 1's
// leader then finds node 0's arrival and must pass too: a process that left after its last call
// is no loss to tell the other nodes of (they may still be finishing what it passed).
int stream_leave(lockstep::State& state) {
  lockstep::testing::FakeStream stream(static_cast<unsigned>(state.process_index()) + 11U);
  for (int round = 0; round < 4; ++round) {
    state.wait_for_everyone(stream.handle());
  }
  if (!stream.synchronize(std::chrono::seconds(20))) {
    std::cout << "RESULT not drained" << std::endl;
    return 1;
  }
  pid_t stopper = -1;
  if (state.node_index() == 1 && state.local_process_index() == 0) {
    const pid_t parent = ::getpid();
    stopper = ::fork();
    if (stopper < 0) {
      std::cout << "RESULT fork failed" << std::endl;
      return 1;
    }
    if (stopper == 0) {
      nap_ms(100);
      (void)::kill(parent, SIGSTOP);
      nap_ms(600);
      (void)::kill(parent, SIGCONT);
      ::_exit(0);
    }
  } else if (state.node_index() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  state.wait_for_everyone();
  std::cout << "RESULT passed" << std::endl;
  if (stopper > 0) {
    (void)::waitpid(stopper, nullptr, 0);
  }
  if (state.node_index() == 0 && state.local_process_index() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  return 0;
}

// Flags mode across nodes on a fake GPU: 10 stream barriers, then process `victim` queues 1 s of
// work and a barrier, and dies 300 ms later. Every other process's stream, waiting in that
// barrier, must be released (on every node) within 0.5 s of the death (2 s under a sanitizer),
// and its next call throws.
int stream_kill(lockstep::State& state, Shared& shared, int victim) {
  using lockstep::testing::FakeStream;
  const int me = state.process_index();
  FakeStream stream(static_cast<unsigned>(me) + 5U);
  for (int r = 0; r < 10; ++r) {
    state.wait_for_everyone(stream.handle());
  }
  if (!stream.synchronize(std::chrono::seconds(10))) {
    std::cout << "RESULT the first rounds never finished" << std::endl;
    return 1;
  }
  state.wait_for_everyone();
  if (me == victim) {
    stream.launch([] { std::this_thread::sleep_for(std::chrono::seconds(1)); });
    state.wait_for_everyone(stream.handle());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    shared.killed_at.store(now_ns());
    ::kill(::getpid(), SIGKILL);
  }
  state.wait_for_everyone(stream.handle());
  const bool released = stream.synchronize(std::chrono::seconds(5));
  const std::int64_t killed = shared.killed_at.load();
  const double after = killed == 0 ? -1.0 : static_cast<double>(now_ns() - killed) / 1e9;
  std::cout << "RESULT stream released " << released << " after " << after << " s" << std::endl;
  state.wait_for_everyone(stream.handle());  // throws: the job is broken
  std::cout << "RESULT passed" << std::endl;
  return 1;
}

// Flags mode across nodes on a fake GPU: node 1's streams are 3 s late to a stream barrier that
// every process calls with a 300 ms timeout. Node 0's leader's relay gives up 300 ms after its
// node's streams arrived; every stream of both nodes is released, long before node 1's work
// ends, and every process's next call throws the TimeoutError naming node 1's processes.
int stream_late(lockstep::State& state) {
  using lockstep::testing::FakeStream;
  const int me = state.process_index();
  FakeStream stream(static_cast<unsigned>(me) + 9U);
  state.wait_for_everyone(stream.handle());
  if (state.node_index() == 1) {
    stream.launch([] { std::this_thread::sleep_for(std::chrono::seconds(3)); });
  }
  const auto start = std::chrono::steady_clock::now();
  state.wait_for_everyone(stream.handle(), std::chrono::milliseconds(300));
  FakeStream other(static_cast<unsigned>(me) + 99U);  // node 1's own stream is still busy
  if (state.node_index() == 0 && !stream.synchronize(std::chrono::seconds(5))) {
    std::cout << "RESULT stream still waits" << std::endl;
    return 1;
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  if (state.node_index() == 0) {
    std::cout << "RESULT released after " << ms << " ms" << std::endl;
  }
  while (!state.gpu_barrier_released()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  state.wait_for_everyone(other.handle());  // throws
  std::cout << "RESULT passed" << std::endl;
  return 1;
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
  if (scenario.starts_with("streams") || scenario.starts_with("stream-")) {
    // stream-refused: process `arg`'s device cannot run flags mode.
    lockstep::testing::use_fake_gpu(scenario == "stream-refused" && env_int("RANK") == arg);
  }
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
    if (scenario == "late-one") {  // node `arg`'s second process comes 2.5 s late; its leader
                                   // waits for it untimed, the other nodes 1 s
      state.wait_for_everyone();
      if (state.node_index() != arg) {
        state.wait_for_everyone(std::chrono::seconds(1));
      } else {
        if (state.local_process_index() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        }
        state.wait_for_everyone();
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
    if (scenario == "gather") {
      return gather_rounds(state, arg);
    }
    if (scenario == "nested") {
      return nested_blocks(state, shared);
    }
    if (scenario == "streams") {
      return stream_rounds(state, shared, arg);
    }
    if (scenario == "stream-late") {
      return stream_late(state);
    }
    if (scenario == "stream-kill") {
      return stream_kill(state, shared, arg);
    }
    if (scenario == "stream-leave") {
      return stream_leave(state);
    }
    if (scenario == "cuda-streams") {
#if defined(LOCKSTEP_TEST_FAKE_CUDA)
      return lockstep::testing::cuda_stream_rounds(state, shared.stream_work, arg);
#else
      std::cout << "RESULT failed: built without CUDA headers" << std::endl;
      return 1;
#endif
    }
    if (scenario == "stream-refused") {
      return stream_refused(state, arg);
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
    if (scenario == "for") {  // barriers 1 ms apart for `arg` ms (node 0's clock), then ends
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(arg);
      for (int round = 0;; ++round) {
        state.wait_for_everyone();
        if (state.broadcast(std::chrono::steady_clock::now() > until ? "end" : "") == "end") {
          std::cout << "RESULT passed " << round << std::endl;
          return 0;
        }
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
    if (scenario == "gather-kill") {  // process `arg` dies while the others gather 1 MiB each
      state.wait_for_everyone();
      if (state.process_index() == arg) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ::kill(::getpid(), SIGKILL);
      }
      (void)state.gather_object(
          pattern(1 << 20, static_cast<std::uint64_t>(state.process_index())));
      std::cout << "RESULT passed" << std::endl;
      return 1;
    }
    if (scenario == "exchanges-late") {  // node 0's processes come `arg` ms late to a broadcast,
                                         // node 1's as late to a gather
      if (state.node_index() == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(arg));
      }
      const bool told = state.broadcast(state.process_index() == 0 ? "told" : "") == "told";
      if (state.node_index() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(arg));
      }
      const auto all = state.gather_object(std::to_string(state.process_index()));
      std::cout << "RESULT " << (told && all.size() == 4 && all[3] == "3" ? "done" : "wrong")
                << std::endl;
      return 0;
    }
    if (scenario == "hold") {  // `arg` barriers, then SHARED_FILE.held-<process> made, and a
                               // wait outside lockstep until SHARED_FILE.go is there
      for (int r = 0; r < arg; ++r) {
        state.wait_for_everyone();
      }
      const std::string base = argv[2];
      std::ofstream(base + ".held-" + std::to_string(state.process_index())).put('\n');
      while (::access((base + ".go").c_str(), F_OK) != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      state.wait_for_everyone();
      std::cout << "RESULT done" << std::endl;
      return 0;
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
