// Barrier latency, N processes looping on one barrier, every family by the same harness.
//
//   BM_Lockstep{Adaptive,Spin,Block}/ranks:N  lockstep::State::wait_for_everyone()
//   BM_PthreadBarrier/ranks:N                 pthread_barrier_t, PTHREAD_PROCESS_SHARED
//   BM_BoostInterprocess/ranks:N              interprocess_mutex + interprocess_condition
//   BM_CacheLinePingPong/ranks:2              one cache line passed back and forth (the floor)
//   BM_Training{Adaptive,Block,Spin,Pthread}/ranks:N
//                                             a training-like loop: each process computes for
//                                             0-100 us (mean 50), then waits; counter
//                                             overhead_us = the barrier's cost per episode
//                                             beyond the slowest process's compute
//   BM_StateJoin/ranks:N                      starting N processes that construct a State
//   BM_LongWaitCpu/ranks:N                    CPU used by N-1 processes waiting 1 s for a late one
//   BM_LockstepCrossNode/nodes:M/per_node:P   a job of M simulated nodes of P processes each,
//                                             the nodes meeting through the cross-node backend
//                                             on 127.0.0.1 (built with a backend only)
//
// Time is per episode (manual time from rank 0); the counter cpu_us is CPU time per episode
// summed over all processes; p50_us, p99_us, p999_us and max_us describe rank 0's sampled
// episodes (one in 16). tools/bench-report runs these with and without busy processes beside
// them (its load matrix).
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/interprocess/managed_shared_memory.hpp>
#include <boost/interprocess/sync/interprocess_condition.hpp>
#include <boost/interprocess/sync/interprocess_mutex.hpp>
#include <boost/interprocess/sync/scoped_lock.hpp>
#include <chrono>
#include <lockstep/lockstep.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "harness.hpp"

namespace {

namespace bip = boost::interprocess;
using lockstep::bench::run_episodes;
using lockstep::bench::set_job_environment;

std::string fresh_id(const char* family) {
  static int counter = 0;
  return std::string("bench-") + family + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter++);
}

template <lockstep::WaitPolicy Policy>
class LockstepFamily {
 public:
  explicit LockstepFamily(int ranks) : ranks_(ranks), id_(fresh_id(wait_policy_name(Policy))) {}
  void attach(int rank) {
    set_job_environment(id_, rank, ranks_, Policy);
    state_.emplace();
  }
  void wait(int /*rank*/) { state_->wait_for_everyone(); }
  void detach(int /*rank*/) {}

 private:
  int ranks_;
  std::string id_;
  std::optional<lockstep::State> state_;
};

constexpr auto kAdaptive = lockstep::WaitPolicy::adaptive;
constexpr auto kSpin = lockstep::WaitPolicy::spin;
constexpr auto kBlock = lockstep::WaitPolicy::block;

template <class T>
T* shared_object() {
  void* memory =
      ::mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    throw std::runtime_error("mmap failed");
  }
  return static_cast<T*>(memory);
}

class PthreadFamily {
 public:
  explicit PthreadFamily(int ranks) : barrier_(shared_object<pthread_barrier_t>()) {
    pthread_barrierattr_t attr;
    pthread_barrierattr_init(&attr);
    pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(barrier_, &attr, static_cast<unsigned>(ranks));
    pthread_barrierattr_destroy(&attr);
  }
  void attach(int /*rank*/) {}
  void wait(int /*rank*/) { pthread_barrier_wait(barrier_); }
  void detach(int /*rank*/) {}

 private:
  pthread_barrier_t* barrier_;
};

// The barrier a Boost user writes (Boost 1.74 ships no interprocess barrier): a generation
// count under an interprocess_mutex, waiters on an interprocess_condition.
struct BoostBarrier {
  explicit BoostBarrier(int n) : ranks(n) {}
  void wait() {
    bip::scoped_lock<bip::interprocess_mutex> lock(mutex);
    const unsigned my_generation = generation;
    if (++arrived == ranks) {
      arrived = 0;
      ++generation;
      condition.notify_all();
      return;
    }
    condition.wait(lock, [&] { return generation != my_generation; });
  }
  bip::interprocess_mutex mutex;
  bip::interprocess_condition condition;
  int ranks;
  int arrived = 0;
  unsigned generation = 0;
};

class BoostFamily {
 public:
  explicit BoostFamily(int ranks) : name_(fresh_id("boost")) {
    bip::permissions owner_only;
    owner_only.set_permissions(0600);
    segment_.emplace(bip::create_only, name_.c_str(), 65536, nullptr, owner_only);
    barrier_ = segment_->construct<BoostBarrier>("barrier")(ranks);
  }
  ~BoostFamily() {
    segment_.reset();
    bip::shared_memory_object::remove(name_.c_str());
  }
  BoostFamily(const BoostFamily&) = delete;
  BoostFamily& operator=(const BoostFamily&) = delete;
  void attach(int /*rank*/) {}
  void wait(int /*rank*/) { barrier_->wait(); }
  void detach(int /*rank*/) {}

 private:
  std::string name_;
  std::optional<bip::managed_shared_memory> segment_;
  BoostBarrier* barrier_ = nullptr;
};

// The hardware floor: rank 0 writes an odd value, rank 1 answers with the next even one.
// One episode is one round trip of one cache line between two cores.
class PingPongFamily {
 public:
  explicit PingPongFamily(int /*ranks*/) : line_(shared_object<Line>()) {}
  void attach(int /*rank*/) {}
  void wait(int rank) {
    // Acquire/release: each side reads what the other published; nothing else is shared.
    if (rank == 0) {
      std::uint64_t next = ++sent_ * 2 - 1;
      line_->value.store(next, std::memory_order_release);
      while (line_->value.load(std::memory_order_acquire) != next + 1) {
        __builtin_ia32_pause();
      }
    } else {
      std::uint64_t want = ++sent_ * 2 - 1;
      while (line_->value.load(std::memory_order_acquire) != want) {
        __builtin_ia32_pause();
      }
      line_->value.store(want + 1, std::memory_order_release);
    }
  }
  void detach(int /*rank*/) {}

 private:
  struct alignas(64) Line {
    std::atomic<std::uint64_t> value;
  };
  Line* line_;
  std::uint64_t sent_ = 0;
};

void ranks_arguments(benchmark::internal::Benchmark* bench) {
  bench->ArgName("ranks");
  for (int ranks : {2, 4, 8, 16}) {
    bench->Arg(ranks);
  }
  bench->UseManualTime()->Unit(benchmark::kMicrosecond);
}

template <class Family>
void BM_Family(benchmark::State& state) {
  run_episodes<Family>(state, static_cast<int>(state.range(0)));
}

BENCHMARK(BM_Family<LockstepFamily<kAdaptive>>)
    ->Name("BM_LockstepAdaptive")
    ->Apply(ranks_arguments);
BENCHMARK(BM_Family<LockstepFamily<kBlock>>)->Name("BM_LockstepBlock")->Apply(ranks_arguments);
// Spinning with more processes than cores costs whole scheduler ticks per episode: bench-report
// runs it only where the machine has a CPU per process.
BENCHMARK(BM_Family<LockstepFamily<kSpin>>)->Name("BM_LockstepSpin")->Apply(ranks_arguments);
BENCHMARK(BM_Family<PthreadFamily>)->Name("BM_PthreadBarrier")->Apply(ranks_arguments);
BENCHMARK(BM_Family<BoostFamily>)->Name("BM_BoostInterprocess")->Apply(ranks_arguments);
BENCHMARK(BM_Family<PingPongFamily>)
    ->Name("BM_CacheLinePingPong")
    ->ArgName("ranks")
    ->Arg(2)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

constexpr double kTrainingMeanUs = 50;

template <class Family>
void BM_Training(benchmark::State& state) {
  lockstep::bench::run_training<Family>(state, static_cast<int>(state.range(0)), kTrainingMeanUs);
}
BENCHMARK(BM_Training<LockstepFamily<kAdaptive>>)
    ->Name("BM_TrainingAdaptive")
    ->Apply(ranks_arguments);
BENCHMARK(BM_Training<LockstepFamily<kBlock>>)->Name("BM_TrainingBlock")->Apply(ranks_arguments);
BENCHMARK(BM_Training<LockstepFamily<kSpin>>)->Name("BM_TrainingSpin")->Apply(ranks_arguments);
BENCHMARK(BM_Training<PthreadFamily>)->Name("BM_TrainingPthread")->Apply(ranks_arguments);

// Simulated nodes: M groups of P processes, each group its own node (its own segment), the
// leaders meeting through the cross-node backend on loopback, as tests/backends/multinode_test.cpp
// runs them.
struct CrossNodeShape {
  int nodes = 2;
  int port = 0;
};
CrossNodeShape& cross_node_shape() {
  static CrossNodeShape shape;
  return shape;
}

// A TCP port on 127.0.0.1 that nothing listens on now.
class CrossNodeFamily {
 public:
  explicit CrossNodeFamily(int ranks) : ranks_(ranks), id_(fresh_id("crossnode")) {}
  // NOLINTBEGIN(concurrency-mt-unsafe): a freshly forked, single-threaded child
  void attach(int rank) {
    const CrossNodeShape& shape = cross_node_shape();
    const int per_node = ranks_ / shape.nodes;
    set_job_environment(id_, rank, ranks_, kAdaptive);
    ::setenv("LOCAL_RANK", std::to_string(rank % per_node).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(per_node).c_str(), 1);
    ::setenv("GROUP_RANK", std::to_string(rank / per_node).c_str(), 1);
    ::setenv("LOCKSTEP_NNODES", std::to_string(shape.nodes).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(shape.port).c_str(), 1);
    ::setenv("UCX_NET_DEVICES", "lo", 0);  // loopback only, unless the caller chose
    state_.emplace();
  }
  // NOLINTEND(concurrency-mt-unsafe)
  void wait(int /*rank*/) { state_->wait_for_everyone(); }
  void detach(int /*rank*/) {}

 private:
  int ranks_;
  std::string id_;
  std::optional<lockstep::State> state_;
};

void BM_LockstepCrossNode(benchmark::State& state) {
  if (lockstep::available_backends().empty()) {
    state.SkipWithError("this build of lockstep has no cross-node backend");
    return;
  }
  cross_node_shape().nodes = static_cast<int>(state.range(0));
  cross_node_shape().port = lockstep::detail::free_port();
  run_episodes<CrossNodeFamily>(state, static_cast<int>(state.range(0) * state.range(1)));
}
BENCHMARK(BM_LockstepCrossNode)
    ->ArgNames({"nodes", "per_node"})
    ->ArgsProduct({{2, 4}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Joining: N fresh processes each construct a lockstep::State (the node's rendezvous) and leave.
void BM_StateJoin(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  for (auto _ : state) {
    std::string id = fresh_id("join");
    double start = lockstep::bench::wall_seconds();
    if (!lockstep::bench::fork_ranks(ranks, [&](int rank) {
          set_job_environment(id, rank, ranks, kAdaptive);
          lockstep::State joined;
        })) {
      lockstep::bench::fail_run(state, "a rank failed to join");
    }
    state.SetIterationTime(lockstep::bench::wall_seconds() - start);
  }
}
BENCHMARK(BM_StateJoin)
    ->ArgName("ranks")
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// A long wait: rank N-1 arrives 1 s late. Reports the waiters' CPU use as a share of one core
// each (cpu_share = CPU seconds of the N-1 waiters / (N-1) / wall seconds).
void BM_LongWaitCpu(benchmark::State& state) {
  // One late episode per run, measured here rather than through run_episodes (whose warm-up
  // episodes would each be late too).
  const int ranks = static_cast<int>(state.range(0));
  for (auto _ : state) {
    auto* report = lockstep::bench::shared_report();
    std::string id = fresh_id("late");
    const bool ok = lockstep::bench::fork_ranks(ranks, [&](int rank) {
      set_job_environment(id, rank, ranks, kAdaptive);
      lockstep::State joined;
      joined.wait_for_everyone();
      double cpu0 = lockstep::bench::cpu_seconds();
      double wall0 = lockstep::bench::wall_seconds();
      if (rank == ranks - 1) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      joined.wait_for_everyone();
      report->cpu[rank] = lockstep::bench::cpu_seconds() - cpu0;
      if (rank == 0) {
        report->elapsed = lockstep::bench::wall_seconds() - wall0;
      }
    });
    if (!ok) {
      lockstep::bench::fail_run(state, "a rank failed");
      ::munmap(report, sizeof(lockstep::bench::Report));
      break;
    }
    double waiters_cpu = 0;
    for (int rank = 0; rank < ranks - 1; ++rank) {
      waiters_cpu += report->cpu[rank];
    }
    state.SetIterationTime(report->elapsed);
    state.counters["cpu_share"] = benchmark::Counter(waiters_cpu / (ranks - 1) / report->elapsed);
    ::munmap(report, sizeof(lockstep::bench::Report));
  }
}
BENCHMARK(BM_LongWaitCpu)
    ->ArgName("ranks")
    ->Arg(2)
    ->Arg(4)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  return lockstep::bench::run_main(argc, argv);
}
