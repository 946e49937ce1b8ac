// Runs a barrier family in N forked processes for Google Benchmark (internal to bench/).
//
// Every rank is a child process; the parent only forks and reports. Rank 0 times the measured
// loop (after a warm-up), every rank reports the CPU time its loop used, and the parent hands
// Google Benchmark the time per episode through manual timing. Each rank being a fresh process
// lets the lockstep family use the public lockstep::State, as a user would.
#pragma once

#include <benchmark/benchmark.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <ctime>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace lockstep::bench {

// Sets the variables lockstep-run would set for `rank` of `ranks` on one node (and the wait
// policy, when given). Runs in a freshly forked, single-threaded child.
// NOLINTBEGIN(concurrency-mt-unsafe)
inline void set_job_environment(const std::string& id, int rank, int ranks,
                                const char* policy = nullptr) {
  ::setenv("LOCKSTEP_JOB_ID", id.c_str(), 1);
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(ranks).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
  ::setenv("GROUP_RANK", "0", 1);
  ::setenv("LOCKSTEP_NNODES", "1", 1);
  if (policy != nullptr) {
    ::setenv("LOCKSTEP_WAIT_POLICY", policy, 1);
  }
}
// NOLINTEND(concurrency-mt-unsafe)

// Runs that failed (a rank that could not run); main() exits non-zero when any did, so that a
// smoke run of the suite can fail.
inline int& failed_runs() {
  static int count = 0;
  return count;
}

inline void fail_run(benchmark::State& state, const char* why) {
  ++failed_runs();
  state.SkipWithError(why);
}

inline double cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

inline double wall_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// What the ranks report back, in memory shared with the parent.
struct Report {
  double elapsed;   // rank 0's wall time for the measured loop
  double cpu[256];  // each rank's CPU time for it
};

inline Report* shared_report() {
  void* memory =
      ::mmap(nullptr, sizeof(Report), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    std::perror("mmap");
    std::abort();
  }
  return new (memory) Report{};
}

// With LOCKSTEP_BENCH_PIN=1, rank r runs on CPU r mod (usable CPUs) only (an option of the
// suite: tools/bench-report --pin).
inline void pin_if_asked(int rank) {
  const char* pin = std::getenv("LOCKSTEP_BENCH_PIN");  // NOLINT(concurrency-mt-unsafe)
  if (pin == nullptr || std::string(pin) != "1") {
    return;
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    return;
  }
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) {
      cpus.push_back(cpu);
    }
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus[static_cast<std::size_t>(rank) % cpus.size()], &one);
  ::sched_setaffinity(0, sizeof one, &one);
}

// A family: `Family f(ranks)` in the parent before fork (shared set-up); in each child,
// `f.attach(rank)`, then `f.wait(rank)` per episode, then `f.detach(rank)`.
constexpr std::int64_t kWarmup = 200;

// Forks `ranks` processes; each runs `body(rank)`, then exits 0, or 1 (saying why) if it
// threw. exit, not _exit: a lockstep rank leaves its job in static destructors. Returns whether
// every rank exited 0.
template <class Body>
bool fork_ranks(int ranks, Body body) {
  std::vector<pid_t> children;
  bool ok = true;
  (void)std::fflush(nullptr);
  for (int rank = 0; rank < ranks && ok; ++rank) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        body(rank);
      } catch (const std::exception& error) {
        (void)std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
        code = 1;
      }
      (void)std::fflush(nullptr);
      std::exit(code);  // NOLINT(concurrency-mt-unsafe): a fresh single-threaded child
    }
    ok = pid > 0;
    if (ok) {
      children.push_back(pid);
    }
  }
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

template <class Family>
void run_episodes(benchmark::State& state, int ranks) {
  const std::int64_t episodes = state.max_iterations;
  Report* report = shared_report();
  Family family(ranks);
  const bool ok = fork_ranks(ranks, [&](int rank) {
    pin_if_asked(rank);
    family.attach(rank);
    for (std::int64_t i = 0; i < kWarmup; ++i) {
      family.wait(rank);
    }
    double cpu0 = cpu_seconds();
    double wall0 = wall_seconds();
    for (std::int64_t i = 0; i < episodes; ++i) {
      family.wait(rank);
    }
    double wall1 = wall_seconds();
    report->cpu[rank] = cpu_seconds() - cpu0;
    if (rank == 0) {
      report->elapsed = wall1 - wall0;
    }
    family.detach(rank);
  });
  if (!ok) {
    fail_run(state, "a rank failed");
  }
  double cpu = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    cpu += report->cpu[rank];
  }
  const double per_episode = report->elapsed / static_cast<double>(episodes);
  for (auto _ : state) {
    state.SetIterationTime(per_episode);
  }
  // CPU time per episode, summed over all processes: spinning shows here, sleeping does not.
  state.counters["cpu_us"] = benchmark::Counter(cpu * 1e6 / static_cast<double>(episodes));
  ::munmap(report, sizeof(Report));
}

// The suites' main(): Google Benchmark's, exiting non-zero when a run failed.
inline int run_main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 2;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return failed_runs() == 0 ? 0 : 1;
}

}  // namespace lockstep::bench
