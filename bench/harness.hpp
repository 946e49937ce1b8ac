// Runs a barrier family in N forked processes for Google Benchmark (internal to bench/): the
// ranks and their timing are ranks.hpp's; the parent hands Google Benchmark the time per
// episode through manual timing.
#pragma once

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "ranks.hpp"

namespace lockstep::bench {

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

// Puts the distribution of the sampled episodes into `state`'s counters (microseconds).
inline void report_tails(benchmark::State& state, Report& report) {
  const std::size_t n = std::min(report.num_samples, kMaxSamples);
  if (n == 0) {
    return;
  }
  state.counters["p50_us"] = benchmark::Counter(sampled_quantile(report, 0.5));
  state.counters["p99_us"] = benchmark::Counter(sampled_quantile(report, 0.99));
  state.counters["p999_us"] = benchmark::Counter(sampled_quantile(report, 0.999));
  state.counters["max_us"] = benchmark::Counter(sampled_quantile(report, 1.0));
  state.counters["samples"] = benchmark::Counter(static_cast<double>(n));
}

template <class Family>
void run_episodes(benchmark::State& state, int ranks) {
  const std::int64_t episodes = state.max_iterations;
  Report* report = shared_report();
  Family family(ranks);
  const bool ok = run_ranks(family, ranks, episodes, kWarmup, *report);
  if (!ok) {
    fail_run(state, "a rank failed");
  }
  const double cpu = total_cpu(*report, ranks);
  const double per_episode = report->elapsed / static_cast<double>(episodes);
  for (auto _ : state) {
    state.SetIterationTime(per_episode);
  }
  // CPU time per episode, summed over all processes: spinning shows here, sleeping does not.
  state.counters["cpu_us"] = benchmark::Counter(cpu * 1e6 / static_cast<double>(episodes));
  report_tails(state, *report);
  ::munmap(report, sizeof(Report));
}

// A training-like loop: in each episode every rank computes for a time drawn from [0, 2 * mean)
// (the same draw on every run: a hash of the episode and the rank), then waits on the barrier.
// The compute is work, not a clock loop, so that a rank that loses its CPU computes longer, as
// real work would; each rank records how long its compute took. The result is the barrier's
// overhead per episode: rank 0's wall time less, episode by episode, the slowest rank's compute
// (counter overhead_us; the benchmark's time is the whole episode).
template <class Family>
void run_training(benchmark::State& state, int ranks, double mean_us) {
  const std::int64_t episodes = state.max_iterations;
  const double rate = work_per_us();
  Report* report = shared_report();
  const std::size_t cells = static_cast<std::size_t>(episodes) * static_cast<std::size_t>(ranks);
  auto* computed = shared_array<float>(cells);  // [episode][rank], microseconds
  if (computed == nullptr) {
    fail_run(state, "mmap of the compute record failed");
    ::munmap(report, sizeof(Report));
    return;
  }
  Family family(ranks);
  const bool ok = fork_ranks(ranks, [&](int rank) {
    start_rank(family, rank);
    const double cpu0 = cpu_seconds();
    const double wall0 = wall_seconds();
    for (std::int64_t e = 0; e < episodes; ++e) {
      const double start = wall_seconds();
      compute(work_units(e, rank, mean_us, rate));
      computed[static_cast<std::size_t>(e) * ranks + rank] =
          static_cast<float>((wall_seconds() - start) * 1e6);
      family.wait(rank);
    }
    report_rank(*report, rank, cpu0, wall0, wall_seconds());
    family.detach(rank);
  });
  if (!ok) {
    fail_run(state, "a rank failed");
  }
  double slowest = 0;  // microseconds, summed over episodes
  for (std::int64_t e = 0; e < episodes; ++e) {
    const float* row = computed + static_cast<std::size_t>(e) * ranks;
    slowest += static_cast<double>(*std::max_element(row, row + ranks));
  }
  const double overhead_us = (report->elapsed * 1e6 - slowest) / static_cast<double>(episodes);
  // The time per episode drives Google Benchmark's choice of episodes; the overhead is the
  // result (a counter).
  for (auto _ : state) {
    state.SetIterationTime(report->elapsed / static_cast<double>(episodes));
  }
  const double cpu = total_cpu(*report, ranks);
  state.counters["overhead_us"] = benchmark::Counter(overhead_us);
  state.counters["episode_us"] =
      benchmark::Counter(report->elapsed * 1e6 / static_cast<double>(episodes));
  state.counters["cpu_us"] = benchmark::Counter(cpu * 1e6 / static_cast<double>(episodes));
  ::munmap(computed, cells * sizeof(float));
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
