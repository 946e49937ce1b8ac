// Exchanges by size: N processes looping on one exchange of B bytes per process, beside what the
// same bytes cost through a pipe and through memcpy, in the same run.
//
//   BM_LockstepGather/ranks:N/bytes:B     lockstep::State::gather_object(B bytes): every process
//                                         receives every process's B bytes
//   BM_LockstepBroadcast/ranks:N/bytes:B  lockstep::State::broadcast: every process receives the
//                                         main process's B bytes
//   BM_PipeRing/ranks:N/bytes:B           the gather's delivery through pipes: each process passes
//                                         what it has to the next in a ring, N - 1 steps, so that
//                                         each receives the others' B bytes (N - 1 reads of B)
//   BM_Memcpy/ranks:N/bytes:B             each process copies N * B bytes within itself: the floor
//                                         of any way to hand it those bytes
//   BM_LockstepGatherAcross/ranks:4/bytes:B, BM_LockstepBroadcastAcross/ranks:4/bytes:B
//                                         the same calls on 2 simulated machines of 2 processes,
//                                         whose leaders meet through the cross-node backend
//                                         (UCX) on loopback
//
// Time is per exchange (manual time from rank 0); the counter delivered_GBps is the bytes each
// process receives per exchange (N * B for a gather, B for a broadcast, (N - 1) * B through the
// ring, N * B for memcpy) over that time, in GB/s (10^9 bytes).
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <lockstep/lockstep.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "families.hpp"
#include "harness.hpp"

namespace {

using lockstep::bench::fail_run;
using lockstep::bench::fresh_id;
using lockstep::bench::Report;
using lockstep::bench::set_job_environment;
using lockstep::bench::shared_report;

// The bytes a process gives: its rank's pattern (every byte written, so that the pages are real).
std::vector<std::byte> given(std::size_t bytes, int rank) {
  std::vector<std::byte> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    data[i] = static_cast<std::byte>(i * 131 + static_cast<std::size_t>(rank));
  }
  return data;
}

class LockstepExchange {
 public:
  // On `nodes` simulated machines (1: one machine), their leaders meeting through the
  // cross-node backend on loopback, as bench/barrier_bench's BM_LockstepCrossNode runs them.
  LockstepExchange(int ranks, std::size_t bytes, bool gather, int nodes = 1)
      : ranks_(ranks),
        bytes_(bytes),
        gather_(gather),
        nodes_(nodes),
        port_(nodes > 1 ? lockstep::detail::free_port() : 0),
        id_(fresh_id("exchange")) {}
  void attach(int rank) {
    if (nodes_ > 1) {
      lockstep::bench::set_cross_node_environment(id_, rank, ranks_, nodes_, port_,
                                                  lockstep::WaitPolicy::adaptive);
    } else {
      set_job_environment(id_, rank, ranks_, lockstep::WaitPolicy::adaptive);
    }
    state_.emplace();
    data_ = given(bytes_, rank);
  }
  void wait(int rank) {
    if (gather_) {
      benchmark::DoNotOptimize(state_->gather_object(data_));
    } else {
      benchmark::DoNotOptimize(
          state_->broadcast(rank == 0 ? std::span(data_) : std::span(data_).first(0)));
    }
  }
  void detach(int /*rank*/) {}
  [[nodiscard]] double delivered(int ranks) const {
    return static_cast<double>(bytes_) * (gather_ ? ranks : 1);
  }

 private:
  int ranks_;
  std::size_t bytes_;
  bool gather_;
  int nodes_;
  int port_;
  std::string id_;
  std::optional<lockstep::State> state_;
  std::vector<std::byte> data_;
};

class LockstepGather : public LockstepExchange {
 public:
  LockstepGather(int ranks, std::size_t bytes) : LockstepExchange(ranks, bytes, true) {}
};

class LockstepBroadcast : public LockstepExchange {
 public:
  LockstepBroadcast(int ranks, std::size_t bytes) : LockstepExchange(ranks, bytes, false) {}
};

// Two simulated machines, half the processes on each.
class LockstepGatherAcross : public LockstepExchange {
 public:
  LockstepGatherAcross(int ranks, std::size_t bytes) : LockstepExchange(ranks, bytes, true, 2) {}
};

class LockstepBroadcastAcross : public LockstepExchange {
 public:
  LockstepBroadcastAcross(int ranks, std::size_t bytes)
      : LockstepExchange(ranks, bytes, false, 2) {}
};

// Pipes in a ring (rank r writes to r + 1; N even): in step s each process passes on the block
// it received in step s - 1 (its own first), and reads the previous process's, N - 1 steps. The
// pipes are made before the fork.
class PipeRing {
 public:
  PipeRing(int ranks, std::size_t bytes)
      : ranks_(ranks), bytes_(bytes), fds_(std::size_t{2} * static_cast<std::size_t>(ranks)) {
    for (std::size_t r = 0; r < static_cast<std::size_t>(ranks); ++r) {
      if (::pipe(&fds_[2 * r]) != 0) {
        throw std::runtime_error("pipe failed");
      }
    }
  }
  ~PipeRing() {
    for (const int fd : fds_) {
      (void)::close(fd);
    }
  }
  PipeRing(const PipeRing&) = delete;
  PipeRing& operator=(const PipeRing&) = delete;
  void attach(int rank) {
    in_ = fds_[2 * static_cast<std::size_t>((rank + ranks_ - 1) % ranks_)];
    out_ = fds_[2 * static_cast<std::size_t>(rank) + 1];
    blocks_.assign(static_cast<std::size_t>(ranks_), std::vector<std::byte>(bytes_));
    blocks_[static_cast<std::size_t>(rank)] = given(bytes_, rank);
  }
  void wait(int rank) {
    for (int step = 0; step < ranks_ - 1; ++step) {
      const auto send = static_cast<std::size_t>((rank - step + ranks_) % ranks_);
      const auto take = static_cast<std::size_t>((rank - step - 1 + 2 * ranks_) % ranks_);
      // Even ranks send first, odd ranks read first (N is even): every write meets a reader.
      if (rank % 2 == 0) {
        transfer(blocks_[send], true);
        transfer(blocks_[take], false);
      } else {
        transfer(blocks_[take], false);
        transfer(blocks_[send], true);
      }
    }
  }
  void detach(int /*rank*/) {}
  [[nodiscard]] double delivered(int ranks) const {
    return static_cast<double>(bytes_) * (ranks - 1);
  }

 private:
  void transfer(std::vector<std::byte>& block, bool write) const {
    std::size_t at = 0;
    while (at < block.size()) {
      const ssize_t n = write ? ::write(out_, block.data() + at, block.size() - at)
                              : ::read(in_, block.data() + at, block.size() - at);
      if (n <= 0) {
        throw std::runtime_error("pipe transfer failed");
      }
      at += static_cast<std::size_t>(n);
    }
  }

  int ranks_;
  std::size_t bytes_;
  std::vector<int> fds_;
  int in_ = -1;
  int out_ = -1;
  std::vector<std::vector<std::byte>> blocks_;
};

class Memcpy {
 public:
  Memcpy(int ranks, std::size_t bytes) : ranks_(ranks), bytes_(bytes) {}
  void attach(int rank) { source_ = given(bytes_ * static_cast<std::size_t>(ranks_), rank); }
  void wait(int /*rank*/) {
    std::vector<std::byte> copy(source_.size());  // a fresh destination, as a receiver has
    std::memcpy(copy.data(), source_.data(), source_.size());
    benchmark::DoNotOptimize(copy.data());
  }
  void detach(int /*rank*/) {}
  [[nodiscard]] double delivered(int ranks) const { return static_cast<double>(bytes_) * ranks; }

 private:
  int ranks_;
  std::size_t bytes_;
  std::vector<std::byte> source_;
};

template <class Family>
void BM_Exchange(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const std::int64_t episodes = state.max_iterations;
  Report* report = shared_report();
  Family family(ranks, bytes);
  if (!lockstep::bench::run_ranks(family, ranks, episodes, 2, *report)) {
    fail_run(state, "a rank failed");
  }
  const double per_episode = report->elapsed / static_cast<double>(episodes);
  for (auto _ : state) {
    state.SetIterationTime(per_episode);
  }
  state.counters["delivered_GBps"] =
      benchmark::Counter(family.delivered(ranks) / per_episode / 1e9);
  ::munmap(report, sizeof(Report));
}

void sizes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"ranks", "bytes"});
  for (const int ranks : {2, 4, 8}) {
    for (const std::int64_t bytes :
         {std::int64_t{1} << 10, std::int64_t{64} << 10, std::int64_t{1} << 20,
          std::int64_t{16} << 20, std::int64_t{64} << 20}) {
      bench->Args({ranks, bytes});
    }
  }
  bench->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Exchange<LockstepGather>)->Name("BM_LockstepGather")->Apply(sizes);
BENCHMARK(BM_Exchange<PipeRing>)->Name("BM_PipeRing")->Apply(sizes);
BENCHMARK(BM_Exchange<Memcpy>)->Name("BM_Memcpy")->Apply(sizes);
BENCHMARK(BM_Exchange<LockstepBroadcast>)->Name("BM_LockstepBroadcast")->Apply(sizes);

// Across machines: 2 simulated machines of 2 processes.
void sizes_across(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"ranks", "bytes"});
  for (const std::int64_t bytes :
       {std::int64_t{1} << 10, std::int64_t{1} << 20, std::int64_t{16} << 20}) {
    bench->Args({4, bytes});
  }
  bench->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Exchange<LockstepGatherAcross>)->Name("BM_LockstepGatherAcross")->Apply(sizes_across);
BENCHMARK(BM_Exchange<LockstepBroadcastAcross>)
    ->Name("BM_LockstepBroadcastAcross")
    ->Apply(sizes_across);

}  // namespace

int main(int argc, char** argv) {
  return lockstep::bench::run_main(argc, argv);
}
