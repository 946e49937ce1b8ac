// sleep-ab: what a sleep costs. Minimal central-counter barriers that differ only in how a
// waiter sleeps, beside pthread_barrier_t and lockstep's block policy, interleaved block by
// block in ONE job, so that every variant sees the same load phases (a load matrix's cells run
// seconds apart, and bursty loads move more than the differences sought here).
//
//   sleep-ab NPROC BLOCKS EPISODES_PER_BLOCK
//
// Every variant: one fetch_add per arrival, a futex word changed and woken by the completer;
// the waiters re-check the counter after reading the word, then sleep at once (no spin):
//   futex            FUTEX_WAIT without a timeout (what pthread_barrier_t does)
//   futex+timeout    FUTEX_WAIT with a 100 ms timeout (lockstep's periodic check before 0.3)
//   waitv(1)         futex_waitv on the word alone, untimed
//   waitv(N)         futex_waitv on the word and N - 1 other words (one per peer), untimed
//   pthread          pthread_barrier_t, process-shared
//   lockstep block   lockstep::State::wait_for_everyone() with LOCKSTEP_WAIT_POLICY=block
// Rank 0 times each block; each variant's block is compared with the pthread block of the same
// cycle. Prints, per variant, the median block (us per episode) and the median, p25 and p75 of
// those ratios. Run it beside the load to study (tools/bench-report's loads; docs/performance.md,
// "What a sleep costs").
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "base/text.hpp"  // lib/src: parse_integer
#include "families.hpp"
#include "ranks.hpp"

namespace {

using namespace lockstep::bench;

constexpr int kMaxWords = 64;

struct Shared {
  alignas(64) std::atomic<std::uint64_t> arrivals{0};
  alignas(64) std::atomic<std::uint32_t> word{0};
  alignas(64) std::array<std::atomic<std::uint32_t>, kMaxWords> others{};
};

enum class Sleep { futex, futex_timeout, waitv_one, waitv_all };

long futex(std::atomic<std::uint32_t>& word, int op, std::uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), op, value, timeout, nullptr,
                   0);
}

futex_waitv entry(std::atomic<std::uint32_t>& word, std::uint32_t value) {
  futex_waitv one{};
  one.val = value;
  one.uaddr = reinterpret_cast<std::uintptr_t>(&word);
  one.flags = FUTEX_32;  // shared: no FUTEX_PRIVATE_FLAG
  return one;
}

class Minimal {
 public:
  Minimal(int ranks, Sleep sleep)
      : ranks_(ranks), sleep_(sleep), shared_(new (shared_object<Shared>()) Shared()) {}

  void wait() {
    const std::uint64_t full = ++episode_ * static_cast<std::uint64_t>(ranks_);
    if (shared_->arrivals.fetch_add(1, std::memory_order_seq_cst) + 1 == full) {
      shared_->word.fetch_add(1, std::memory_order_release);
      futex(shared_->word, FUTEX_WAKE, INT_MAX, nullptr);
      return;
    }
    while (shared_->arrivals.load(std::memory_order_acquire) < full) {
      const std::uint32_t seen = shared_->word.load(std::memory_order_acquire);
      if (shared_->arrivals.load(std::memory_order_seq_cst) >= full) {
        break;
      }
      sleep(seen);
    }
  }

 private:
  void sleep(std::uint32_t seen) {
    switch (sleep_) {
      case Sleep::futex:
        futex(shared_->word, FUTEX_WAIT, seen, nullptr);
        return;
      case Sleep::futex_timeout: {
        const timespec timeout{0, 100'000'000};
        futex(shared_->word, FUTEX_WAIT, seen, &timeout);
        return;
      }
      case Sleep::waitv_one:
      case Sleep::waitv_all: {
        std::array<futex_waitv, kMaxWords + 1> entries{};
        std::size_t count = 0;
        entries[count++] = entry(shared_->word, seen);
        const int others = sleep_ == Sleep::waitv_all ? std::min(ranks_ - 1, kMaxWords) : 0;
        for (int i = 0; i < others; ++i) {
          entries[count++] = entry(shared_->others[static_cast<std::size_t>(i)], 0);
        }
        ::syscall(SYS_futex_waitv, entries.data(), count, 0, nullptr, CLOCK_MONOTONIC);
        return;
      }
    }
  }

  int ranks_;
  Sleep sleep_;
  Shared* shared_;
  std::uint64_t episode_ = 0;
};

int number(const char* text, const char* what) {
  const std::optional<long long> value = lockstep::detail::parse_integer(text);
  if (!value || *value < 1 || *value > 1'000'000) {
    (void)std::fprintf(stderr, "sleep-ab: %s must be a number from 1 to 1000000, not '%s'\n", what,
                       text);
    std::exit(2);  // NOLINT(concurrency-mt-unsafe): single-threaded, before any fork
  }
  return static_cast<int>(*value);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    (void)std::fprintf(stderr, "usage: sleep-ab NPROC BLOCKS EPISODES_PER_BLOCK\n");
    return 2;
  }
  const int ranks = number(argv[1], "NPROC");
  const int blocks = number(argv[2], "BLOCKS");
  const int per_block = number(argv[3], "EPISODES_PER_BLOCK");
  const std::array<const char*, 6> names = {"futex",    "futex+timeout", "waitv(1)",
                                            "waitv(N)", "pthread",       "lockstep block"};
  constexpr int kVariants = 6;
  constexpr int kPthread = 4;
  if (blocks < 2 * kVariants) {
    (void)std::fprintf(stderr, "sleep-ab: BLOCKS must be at least %d\n", 2 * kVariants);
    return 2;
  }
  Minimal plain(ranks, Sleep::futex);
  Minimal timed(ranks, Sleep::futex_timeout);
  Minimal one(ranks, Sleep::waitv_one);
  Minimal all(ranks, Sleep::waitv_all);
  PthreadFamily pthread(ranks);
  LockstepFamily block(ranks, lockstep::WaitPolicy::block);
  auto* times =
      static_cast<double*>(::mmap(nullptr, sizeof(double) * static_cast<std::size_t>(blocks),
                                  PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (times == MAP_FAILED) {
    (void)std::fprintf(stderr, "sleep-ab: mmap failed\n");
    return 1;
  }
  const auto episode = [&](int variant, int rank) {
    switch (variant) {
      case 0:
        plain.wait();
        break;
      case 1:
        timed.wait();
        break;
      case 2:
        one.wait();
        break;
      case 3:
        all.wait();
        break;
      case 4:
        pthread.wait(rank);
        break;
      default:
        block.wait(rank);
        break;
    }
  };
  const bool ok = fork_ranks(ranks, [&](int rank) {
    block.attach(rank);
    for (int i = 0; i < 100; ++i) {
      for (int variant = 0; variant < kVariants; ++variant) {
        episode(variant, rank);
      }
    }
    for (int b = 0; b < blocks; ++b) {
      const double start = wall_seconds();
      for (int i = 0; i < per_block; ++i) {
        episode(b % kVariants, rank);
      }
      if (rank == 0) {
        times[b] = (wall_seconds() - start) * 1e6 / per_block;
      }
    }
  });
  if (!ok) {
    return 1;
  }
  std::printf(
      "# sleep-ab: N=%d, %d blocks of %d episodes, interleaved; us per episode, and the\n"
      "# ratio to the pthread block of the same cycle (median, p25, p75)\n",
      ranks, blocks, per_block);
  for (int variant = 0; variant < kVariants; ++variant) {
    std::vector<double> micros;
    std::vector<double> ratios;
    for (int cycle = 0; cycle + kVariants <= blocks; cycle += kVariants) {
      micros.push_back(times[cycle + variant]);
      ratios.push_back(times[cycle + variant] / times[cycle + kPthread]);
    }
    if (micros.empty()) {
      continue;
    }
    std::sort(micros.begin(), micros.end());
    std::sort(ratios.begin(), ratios.end());
    const std::size_t n = ratios.size();
    std::printf("%-15s %9.2f us   %.2fx (%.2f-%.2f)\n", names[static_cast<std::size_t>(variant)],
                micros[micros.size() / 2], ratios[n / 2], ratios[n / 4], ratios[3 * n / 4]);
  }
  return 0;
}
