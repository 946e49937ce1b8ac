// Barrier latency, N processes looping on one barrier, every family by the same harness.
//
//   BM_Lockstep{Adaptive,Spin,Block}/ranks:N  lockstep::State::wait_for_everyone()
//   BM_PthreadBarrier/ranks:N                 pthread_barrier_t, PTHREAD_PROCESS_SHARED
//   BM_BoostInterprocess/ranks:N              interprocess_mutex + interprocess_condition
//   BM_CacheLinePingPong/ranks:2              one cache line passed back and forth (the floor)
//   BM_CounterFloor/ranks:2                   the node barrier's counter protocol alone, none of
//                                             the library's code (what that code costs on top)
//   BM_YieldPingPong/ranks:2                  one CPU passed back and forth by sched_yield
//                                             between two processes (two context switches: the
//                                             floor's unit with more processes than CPUs)
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
#include <sys/mman.h>

#include <chrono>
#include <lockstep/lockstep.hpp>
#include <optional>
#include <string>
#include <thread>

#include "families.hpp"
#include "harness.hpp"

namespace {

using lockstep::bench::BoostFamily;
using lockstep::bench::CounterFloorFamily;
using lockstep::bench::fresh_id;
using lockstep::bench::LockstepFamily;
using lockstep::bench::PingPongFamily;
using lockstep::bench::PthreadFamily;
using lockstep::bench::run_episodes;
using lockstep::bench::set_job_environment;
using lockstep::bench::YieldPingPongFamily;

template <lockstep::WaitPolicy Policy>
class LockstepPolicy : public LockstepFamily {
 public:
  explicit LockstepPolicy(int ranks) : LockstepFamily(ranks, Policy) {}
};

constexpr auto kAdaptive = lockstep::WaitPolicy::adaptive;
constexpr auto kSpin = lockstep::WaitPolicy::spin;
constexpr auto kBlock = lockstep::WaitPolicy::block;

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

BENCHMARK(BM_Family<LockstepPolicy<kAdaptive>>)
    ->Name("BM_LockstepAdaptive")
    ->Apply(ranks_arguments);
BENCHMARK(BM_Family<LockstepPolicy<kBlock>>)->Name("BM_LockstepBlock")->Apply(ranks_arguments);
// Spinning with more processes than cores costs whole scheduler ticks per episode: bench-report
// runs it only where the machine has a CPU per process.
BENCHMARK(BM_Family<LockstepPolicy<kSpin>>)->Name("BM_LockstepSpin")->Apply(ranks_arguments);
BENCHMARK(BM_Family<PthreadFamily>)->Name("BM_PthreadBarrier")->Apply(ranks_arguments);
BENCHMARK(BM_Family<BoostFamily>)->Name("BM_BoostInterprocess")->Apply(ranks_arguments);
BENCHMARK(BM_Family<PingPongFamily>)
    ->Name("BM_CacheLinePingPong")
    ->ArgName("ranks")
    ->Arg(2)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Family<CounterFloorFamily>)
    ->Name("BM_CounterFloor")
    ->ArgName("ranks")
    ->Arg(2)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Family<YieldPingPongFamily>)
    ->Name("BM_YieldPingPong")
    ->ArgName("ranks")
    ->Arg(2)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

constexpr double kTrainingMeanUs = 50;

template <class Family>
void BM_Training(benchmark::State& state) {
  lockstep::bench::run_training<Family>(state, static_cast<int>(state.range(0)), kTrainingMeanUs);
}
BENCHMARK(BM_Training<LockstepPolicy<kAdaptive>>)
    ->Name("BM_TrainingAdaptive")
    ->Apply(ranks_arguments);
BENCHMARK(BM_Training<LockstepPolicy<kBlock>>)->Name("BM_TrainingBlock")->Apply(ranks_arguments);
BENCHMARK(BM_Training<LockstepPolicy<kSpin>>)->Name("BM_TrainingSpin")->Apply(ranks_arguments);
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
  void attach(int rank) {
    const CrossNodeShape& shape = cross_node_shape();
    lockstep::bench::set_cross_node_environment(id_, rank, ranks_, shape.nodes, shape.port,
                                                kAdaptive);
    state_.emplace();
  }
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
