// N forked processes that loop on a barrier, timed: the part of the bench's harness that needs
// no Google Benchmark (bench/harness.hpp builds on it for the suites; lockstep-bench uses it
// alone). Internal to bench/.
//
// Every rank is a child process; the parent only forks and reports. Rank 0 times the measured
// loop (after a warm-up), every rank reports the CPU time its loop used. Each rank being a fresh
// process lets the lockstep family use the public lockstep::State, as a user would.
#pragma once

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <ctime>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "job/launch_env.hpp"  // lib/src: the job environment, written once for the launcher, tests and bench
#include "lockstep/wait_policy.hpp"

namespace lockstep::bench {

// Sets the variables lockstep-run would set for `rank` of `ranks` on one node (and the wait
// policy, when given). Runs in a freshly forked, single-threaded child.
// NOLINTBEGIN(concurrency-mt-unsafe)
inline void set_job_environment(const std::string& id, int rank, int ranks,
                                std::optional<lockstep::WaitPolicy> policy = std::nullopt) {
  lockstep::detail::LaunchSpec spec;
  spec.rank = rank;
  spec.world_size = ranks;
  spec.local_rank = rank;
  spec.local_size = ranks;
  spec.job_id = id;
  spec.wait_policy = policy ? lockstep::wait_policy_name(*policy) : "";
  for (const auto& [name, value] : lockstep::detail::job_environment(spec)) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }
}

// As set_job_environment, for a job of `nodes` simulated nodes of ranks / nodes processes each,
// whose leaders meet through the cross-node backend on loopback at `port` (as
// tests/backends/multinode_test.cpp runs them).
inline void set_cross_node_environment(const std::string& id, int rank, int ranks, int nodes,
                                       int port, std::optional<lockstep::WaitPolicy> policy) {
  set_job_environment(id, rank, ranks, policy);
  const int per_node = ranks / nodes;
  ::setenv("LOCAL_RANK", std::to_string(rank % per_node).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(per_node).c_str(), 1);
  ::setenv("GROUP_RANK", std::to_string(rank / per_node).c_str(), 1);
  ::setenv("LOCKSTEP_NNODES", std::to_string(nodes).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("UCX_NET_DEVICES", "lo", 0);  // loopback only, unless the caller chose
}
// NOLINTEND(concurrency-mt-unsafe)

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

// The training-like loop's compute (bench/harness.hpp's run_training, sleep-ab --compute).
inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Units of work per microsecond on this machine: the fastest of several timed runs, so that a
// run that lost its CPU (a loaded machine) does not count.
inline double work_per_us() {
  static const double rate = [] {
    double best = 0;
    for (int trial = 0; trial < 50; ++trial) {
      constexpr std::uint64_t kUnits = 20000;
      volatile std::uint64_t sink = 0;
      const double start = wall_seconds();
      auto x = static_cast<std::uint64_t>(trial);
      for (std::uint64_t i = 0; i < kUnits; ++i) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      }
      sink = x;
      (void)sink;
      best = std::max(best, static_cast<double>(kUnits) / ((wall_seconds() - start) * 1e6));
    }
    return best;
  }();
  return rate;
}

inline void compute(std::uint64_t units) {
  volatile std::uint64_t sink = 0;
  std::uint64_t x = units;
  for (std::uint64_t i = 0; i < units; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  }
  sink = x;
  (void)sink;
}

// Episode `episode`'s compute for `rank`: a time drawn from [0, 2 * mean_us) (the same draw on
// every run: a hash of the episode and the rank), as units of work at `rate` (work_per_us()).
inline std::uint64_t work_units(std::int64_t episode, int rank, double mean_us, double rate) {
  const std::uint64_t draw =
      mix(static_cast<std::uint64_t>(episode) * 1024 + static_cast<std::uint64_t>(rank));
  const double us = 2 * mean_us * static_cast<double>(draw >> 11) * 0x1.0p-53;
  return static_cast<std::uint64_t>(us * rate);
}

// Rank 0 times one episode in kSampleEvery (two clock reads, ~50 ns, on one episode in 16: about
// 3 ns per episode on average, so that the recording does not dominate at 0.1 us), at most
// kMaxSamples of them, for the distribution: p50, p99, p99.9, max.
constexpr std::int64_t kSampleEvery = 16;
constexpr std::size_t kMaxSamples = 1 << 16;

// What the ranks report back, in memory shared with the parent.
struct Report {
  double elapsed;   // rank 0's wall time for the measured loop
  double cpu[256];  // each rank's CPU time for it
  std::size_t num_samples;
  float samples[kMaxSamples];  // rank 0's sampled episodes, in microseconds
};

// Memory for `count` values of T that the processes forked after it share (zero-filled), or
// null when mmap fails. Released with ::munmap(pointer, count * sizeof(T)).
template <class T>
T* shared_array(std::size_t count) noexcept {
  void* memory =
      ::mmap(nullptr, sizeof(T) * count, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return memory == MAP_FAILED ? nullptr : static_cast<T*>(memory);
}

inline Report* shared_report() {
  auto* memory = shared_array<Report>(1);
  if (memory == nullptr) {
    std::perror("mmap");
    std::abort();
  }
  return new (memory) Report{};
}

// The CPUs this process may run on (its affinity mask; empty if it cannot be read).
inline std::vector<int> usable_cpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    return cpus;
  }
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) {
      cpus.push_back(cpu);
    }
  }
  return cpus;
}

// Runs this process on `cpu` alone; false if the kernel refused.
inline bool pin_to(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return ::sched_setaffinity(0, sizeof one, &one) == 0;
}

// With LOCKSTEP_BENCH_PIN=1, rank r runs on CPU r mod (usable CPUs) only (an option of the
// suite: tools/bench-report --pin).
inline void pin_if_asked(int rank) {
  const char* pin = std::getenv("LOCKSTEP_BENCH_PIN");  // NOLINT(concurrency-mt-unsafe)
  if (pin == nullptr || std::string(pin) != "1") {
    return;
  }
  const std::vector<int> cpus = usable_cpus();
  if (!cpus.empty()) {
    (void)pin_to(cpus[static_cast<std::size_t>(rank) % cpus.size()]);
  }
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

// A rank's start: pinned (if asked), attached, and through `warmup` episodes.
template <class Family>
void start_rank(Family& family, int rank, std::int64_t warmup = kWarmup) {
  pin_if_asked(rank);
  family.attach(rank);
  for (std::int64_t i = 0; i < warmup; ++i) {
    family.wait(rank);
  }
}

// A rank's end of the measured loop: its CPU time, and rank 0's wall time.
inline void report_rank(Report& report, int rank, double cpu0, double wall0, double wall1) {
  report.cpu[rank] = cpu_seconds() - cpu0;
  if (rank == 0) {
    report.elapsed = wall1 - wall0;
  }
}

// CPU seconds of the measured loop, summed over the ranks.
inline double total_cpu(const Report& report, int ranks) {
  double cpu = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    cpu += report.cpu[rank];
  }
  return cpu;
}

// Runs `episodes` episodes of `family` in `ranks` forked processes, after `warmup` more: rank 0
// times the loop, and one episode in kSampleEvery, into `report`; every rank its CPU time.
// Returns whether every rank exited 0.
template <class Family>
bool run_ranks(Family& family, int ranks, std::int64_t episodes, std::int64_t warmup,
               Report& report) {
  return fork_ranks(ranks, [&](int rank) {
    start_rank(family, rank, warmup);
    const double cpu0 = cpu_seconds();
    const double wall0 = wall_seconds();
    if (rank == 0) {
      std::size_t taken = 0;
      for (std::int64_t i = 0; i < episodes; ++i) {
        if (i % kSampleEvery == 0 && taken < kMaxSamples) {
          const double before = wall_seconds();
          family.wait(rank);
          report.samples[taken++] = static_cast<float>((wall_seconds() - before) * 1e6);
        } else {
          family.wait(rank);
        }
      }
      report.num_samples = taken;
    } else {
      for (std::int64_t i = 0; i < episodes; ++i) {
        family.wait(rank);
      }
    }
    report_rank(report, rank, cpu0, wall0, wall_seconds());
    family.detach(rank);
  });
}

// `text`'s parts between separators, empty ones kept (so that "2,4," is an error to report, not
// "2,4").
inline std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  for (;;) {
    const std::size_t at = text.find(separator);
    parts.emplace_back(text.substr(0, at));
    if (at == std::string_view::npos) {
      return parts;
    }
    text.remove_prefix(at + 1);
  }
}

// The value at quantile q of `sorted` (ascending; 0 when empty).
inline double quantile(std::span<const float> sorted, double q) {
  if (sorted.empty()) {
    return 0;
  }
  const std::size_t n = sorted.size();
  return static_cast<double>(
      sorted[std::min(n - 1, static_cast<std::size_t>(q * static_cast<double>(n)))]);
}

// Rank 0's sampled episodes, sorted in place: the episode at quantile q (microseconds).
inline double sampled_quantile(Report& report, double q) {
  const std::size_t n = std::min(report.num_samples, kMaxSamples);
  std::sort(report.samples, report.samples + n);
  return quantile(std::span<const float>(report.samples, n), q);
}

}  // namespace lockstep::bench
