// MPI_Barrier latency under mpirun, reported in the same shape as barrier_bench:
//
//   mpirun -n N mpi_barrier_bench --episodes=K [google benchmark flags]
//
// Every rank runs the same fixed number of episodes (Google Benchmark's adaptive iteration
// count would differ between ranks and deadlock the barrier); rank 0 reports. The counter
// cpu_us is CPU time per episode summed over all ranks.
#include <benchmark/benchmark.h>
// The C API only: the MPI C++ bindings are deprecated and warn.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <ctime>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void BM_MpiBarrier(benchmark::State& state) {
  for (int i = 0; i < 200; ++i) {  // warm-up, as barrier_bench
    MPI_Barrier(MPI_COMM_WORLD);
  }
  double cpu0 = cpu_seconds();
  double wall0 = MPI_Wtime();
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
  }
  double elapsed = MPI_Wtime() - wall0;
  double cpu = cpu_seconds() - cpu0;
  double total_cpu = 0;
  MPI_Reduce(&cpu, &total_cpu, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  // Rank 0's wall time, as in barrier_bench (every rank leaves the last barrier together).
  MPI_Bcast(&elapsed, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  const auto episodes = static_cast<double>(state.iterations());
  state.SetIterationTime(elapsed);
  state.counters["cpu_us"] = benchmark::Counter(total_cpu * 1e6 / episodes);
}

class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context& /*context*/) override { return true; }
  void ReportRuns(const std::vector<Run>& /*runs*/) override {}
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long long episodes = 10000;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--episodes=", 11) == 0) {
      episodes = std::atoll(argv[i] + 11);
    } else if (rank != 0 && std::strncmp(argv[i], "--benchmark_out", 15) == 0) {
      // Rank 0 alone writes the results file.
    } else {
      args.push_back(argv[i]);
    }
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  benchmark::RegisterBenchmark(("BM_MpiBarrier/ranks:" + std::to_string(size)).c_str(),
                               BM_MpiBarrier)
      ->Iterations(episodes)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
