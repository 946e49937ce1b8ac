// sleep-ab: what a sleep costs. Minimal central-counter barriers that differ only in how a
// waiter sleeps, beside pthread_barrier_t and lockstep's block policy, interleaved block by
// block in ONE job, so that every variant sees the same load phases (a load matrix's cells run
// seconds apart, and bursty loads move more than the differences sought here).
//
//   sleep-ab [--compute MEAN_US] [--wakes] NPROC BLOCKS EPISODES_PER_BLOCK [VARIANTS [RAW_JSON]]
//
// VARIANTS, comma-separated (default futex,futex+timeout,waitv1,waitvN,block; pthread, the
// reference, always runs). The minimal ones: one fetch_add per arrival, a futex word changed and
// woken by the completer; the waiters re-check the counter after reading the word, then sleep at
// once (no spin):
//   futex            FUTEX_WAIT without a timeout (what pthread_barrier_t does)
//   futex+timeout    FUTEX_WAIT with a 100 ms timeout (lockstep's periodic check before 0.3)
//   waitv1           futex_waitv on the word alone, untimed
//   waitvN           futex_waitv on the word and N - 1 other words (one per peer), untimed
//   counted          futex, the sleep announced in a sleepers count (as the node barrier's) and
//                    the completer's wake skipped when nobody sleeps
//   clock            counted, and two reads of the steady clock (CLOCK_MONOTONIC), before the
//                    sleep and after it, as a wait that reads the time does
//   coarse           counted, the two reads of CLOCK_MONOTONIC_COARSE instead
//   waiter           counted, the wait driven by lockstep's Waiter (block policy, a watched site:
//                    untimed) as the node barrier's is, without the engine or the context
// and the real ones:
//   pthread          pthread_barrier_t, process-shared
//   block            lockstep's barrier with LOCKSTEP_WAIT_POLICY=block, as
//                    State::wait_for_everyone() runs it
//   adaptive         the same with the adaptive policy (the default)
//   spin             the same with the spin policy
// (block, adaptive and spin are jobs that every rank process joins, each with its own context:
// see ContextFamily.)
// Steps from futex to block split block's cost over pthread between the waiting module and the
// engine and context around it. A cycle runs one block of each variant, starting one variant
// later than the cycle before (BLOCKS is a multiple of the variants' count), so that no variant
// always follows the same other. Rank 0 times each block; each variant's block is compared with
// the pthread block of the same cycle. Prints, per variant, the median block (us per episode) and
// the median, p25 and p75 of those ratios. Rank 0 also times every episode (one clock read each,
// the same for every variant): the tails, p99 and p99.9 of each variant's episodes over the whole
// run, and their ratios to pthread's, paired as the blocks are (every variant's episodes come from
// the same load phases). With --compute, every rank computes before each wait, as in
// bench/barrier_bench's training-like loop (a draw from [0, 2 * MEAN_US), the same sequence for
// every variant), and each block's overhead per episode (its time less the slowest rank's compute
// in each episode) is paired the same way. RAW_JSON, if given, gets every cycle's blocks, the
// overheads and the tails (with each variant's largest 10% of episodes, for pooling passes). Last,
// for the adaptive variant, each rank's waiter counts: waits that began with the machine seen
// loaded, load samples, turns to loaded and to idle, yields, sleeps, loaded spins and how many of
// them caught the peer (docs/performance-history.md, "What a load sample sees"). With --wakes,
// every rank reads the clock as it arrives and as it returns, and each variant's wake-up order is
// printed: the time from an episode's last arrival to the first, second, ... last rank's return
// (median and p90 over the variant's episodes), which tells a slow wake-up chain from a slow path
// around the sleep (the same two clock reads per rank and episode in every variant); a variant that
// let a rank return before its episode's last arrival fails the run. Run it beside the load to
// study (tools/bench-report's loads; docs/performance-history.md, "What a sleep costs").
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/proc.hpp"  // lib/src: usable_cpus
#include "base/text.hpp"  // lib/src: parse_integer
#include "families.hpp"
#include "job/job_config.hpp"      // lib/src: read_job_config
#include "membership/context.hpp"  // lib/src: Context
#include "ranks.hpp"
#include "waiting/futex.hpp"   // lib/src
#include "waiting/waiter.hpp"  // lib/src

namespace {

using namespace lockstep::bench;

constexpr int kMaxWords = 64;

struct Shared {
  alignas(64) std::atomic<std::uint64_t> arrivals{0};
  alignas(64) std::atomic<std::uint32_t> word{0};
  alignas(64) std::atomic<std::uint32_t> sleepers{0};
  alignas(64) std::array<std::atomic<std::uint32_t>, kMaxWords> others{};
};

enum class Sleep { futex, futex_timeout, waitv_one, waitv_all, counted, clock, coarse, waiter };

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
      : ranks_(ranks),
        sleep_(sleep),
        shared_(new (shared_object<Shared>()) Shared()),
        waiter_(lockstep::WaitPolicy::block,
                lockstep::detail::WaitShape{ranks, lockstep::detail::usable_cpus(), false, 0}) {}

  void wait() {
    const std::uint64_t full = ++episode_ * static_cast<std::uint64_t>(ranks_);
    if (shared_->arrivals.fetch_add(1, std::memory_order_seq_cst) + 1 == full) {
      if (counted()) {
        if (shared_->sleepers.load(std::memory_order_seq_cst) == 0) {
          return;
        }
      }
      shared_->word.fetch_add(1, std::memory_order_release);
      futex(shared_->word, FUTEX_WAKE, INT_MAX, nullptr);
      return;
    }
    if (sleep_ == Sleep::waiter) {
      Site site(*shared_, full);
      (void)waiter_.wait(site, std::nullopt, std::chrono::milliseconds(100));
      return;
    }
    read_clock();  // as a wait that does not end at once reads it before sleeping
    while (shared_->arrivals.load(std::memory_order_acquire) < full) {
      const std::uint32_t seen = shared_->word.load(std::memory_order_acquire);
      if (counted()) {
        shared_->sleepers.fetch_add(1, std::memory_order_seq_cst);
      }
      if (shared_->arrivals.load(std::memory_order_seq_cst) < full) {
        sleep(seen);
      }
      if (counted()) {
        shared_->sleepers.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    read_clock();  // and after
  }

 private:
  // The counted sleep as a place for the Waiter: watched (nothing here can be lost), so it
  // blocks without a timeout, as the node barrier's untimed sleeps do.
  class Site : public lockstep::detail::WaitSite {
   public:
    Site(Shared& shared, std::uint64_t full) noexcept : shared_(shared), full_(full) {}
    [[nodiscard]] bool done() const noexcept {
      return shared_.arrivals.load(std::memory_order_acquire) >= full_;
    }
    void block(std::chrono::nanoseconds limit) noexcept {
      const std::uint32_t seen = shared_.word.load(std::memory_order_acquire);
      shared_.sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (shared_.arrivals.load(std::memory_order_seq_cst) < full_) {
        (void)lockstep::detail::futex_wait(shared_.word, seen, limit);
      }
      shared_.sleepers.fetch_sub(1, std::memory_order_relaxed);
    }
    static bool watched() noexcept { return true; }

   private:
    Shared& shared_;
    std::uint64_t full_;
  };

  [[nodiscard]] bool counted() const noexcept {
    return sleep_ == Sleep::counted || sleep_ == Sleep::clock || sleep_ == Sleep::coarse ||
           sleep_ == Sleep::waiter;
  }

  void read_clock() noexcept {
    if (sleep_ == Sleep::clock || sleep_ == Sleep::coarse) {
      timespec now{};
      (void)::clock_gettime(sleep_ == Sleep::clock ? CLOCK_MONOTONIC : CLOCK_MONOTONIC_COARSE,
                            &now);
      clock_sum_ += now.tv_nsec;  // kept, so that the read is not optimized away
    }
  }

  void sleep(std::uint32_t seen) {
    switch (sleep_) {
      case Sleep::futex:
      case Sleep::counted:
      case Sleep::clock:
      case Sleep::coarse:
      case Sleep::waiter:
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
  lockstep::detail::Waiter waiter_;  // Sleep::waiter's, one per process after the fork
  std::uint64_t episode_ = 0;
  std::int64_t clock_sum_ = 0;
};

// lockstep's barrier under one wait policy, the path State::wait_for_everyone() takes (the
// context's wait). Not a State: a process has one State context (Context::instance(), which the
// first State joins and every later one shares), and the lockstep variants of one run all live
// in every rank process, so each joins its own job with a context of its own. (Until
// 2026-12-01 both were States: the second shared the first's context, and "adaptive" beside
// "block" measured block.)
class ContextFamily {
 public:
  ContextFamily(int ranks, lockstep::WaitPolicy policy)
      : ranks_(ranks), policy_(policy), id_(fresh_id(lockstep::wait_policy_name(policy))) {}
  void attach(int rank) {
    set_job_environment(id_, rank, ranks_, policy_);
    context_ = std::make_shared<lockstep::detail::Context>(lockstep::detail::read_job_config(
        lockstep::detail::process_environment(), lockstep::WaitPolicy::adaptive));
    if (context_->config().wait_policy != policy_) {
      throw std::runtime_error(std::string("sleep-ab: the ") + lockstep::wait_policy_name(policy_) +
                               " variant joined with the " +
                               lockstep::wait_policy_name(context_->config().wait_policy) +
                               " policy");
    }
  }
  void wait() {
    // As State::wait_for_everyone records its caller's site.
    static constexpr lockstep::SourceLocation kHere{__FILE__, __LINE__, "ContextFamily::wait"};
    context_->wait(std::nullopt, "wait_for_everyone", lockstep::detail::CallKind::wait, kHere);
  }
  [[nodiscard]] lockstep::detail::Waiter::Stats stats() const noexcept {
    return context_ ? context_->wait_stats() : lockstep::detail::Waiter::Stats{};
  }
  void detach() noexcept { context_.reset(); }  // leaves the job

 private:
  int ranks_;
  lockstep::WaitPolicy policy_;
  std::string id_;
  std::shared_ptr<lockstep::detail::Context> context_;
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

struct Variant {
  std::string name;
  std::function<void(int rank)> wait;
};

// Episodes timed one by one at most (a float each, in memory shared with rank 0): 64 MiB.
constexpr std::size_t kMaxTimedEpisodes = std::size_t{1} << 24;

// The share of a variant's episodes whose times the raw file keeps, largest first, with the
// cycle of each: enough for tools/bench-report to pool the passes' tails (the p99 of three passes
// is the 1% largest of their episodes together) and to resample the cycles for an interval.
constexpr double kTopShare = 0.1;

// One variant's episodes as rank 0 saw them (microseconds), pooled over the run.
struct Tails {
  double p50 = 0;
  double p99 = 0;
  double p999 = 0;
  std::size_t episodes = 0;
  std::vector<std::pair<float, int>> top;  // the kTopShare largest (us, cycle), largest first
};

// `episodes` holds every block's episodes by slot (see main): variant v's are in slots v,
// v + count, ..., one per cycle.
Tails tails_of(const float* episodes, int variant, int count, int blocks, int per_block) {
  std::vector<std::pair<float, int>> cycles;  // (us, cycle)
  for (int b = variant; b < blocks; b += count) {
    const float* block =
        episodes + static_cast<std::size_t>(b) * static_cast<std::size_t>(per_block);
    for (int i = 0; i < per_block; ++i) {
      cycles.emplace_back(block[i], b / count);
    }
  }
  // Largest first: the quantiles are read from the end, then the top is kept.
  std::sort(cycles.begin(), cycles.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  const std::size_t n = cycles.size();
  const auto at = [&](double q) {
    return n == 0
               ? 0.0
               : static_cast<double>(
                     cycles[n - 1 -
                            std::min(n - 1, static_cast<std::size_t>(q * static_cast<double>(n)))]
                         .first);
  };
  Tails tails{at(0.5), at(0.99), at(0.999), n, {}};
  cycles.resize(
      std::min(n, static_cast<std::size_t>(std::ceil(kTopShare * static_cast<double>(n)))));
  tails.top = std::move(cycles);
  return tails;
}

// One variant's wake-up order: for the k-th rank to return from an episode, the time from the
// episode's last arrival to that return (us), median and p90 over the variant's episodes.
struct WakeOrder {
  std::vector<double> median;
  std::vector<double> p90;
  double earliest = 0;  // the least time from an episode's last arrival to its first return
};

// `stamps`: [episode][rank][arrived, returned], wall_seconds().
WakeOrder wake_order(const double* stamps, int variant, int count, int blocks, int per_block,
                     int ranks) {
  const auto n = static_cast<std::size_t>(ranks);
  std::vector<std::vector<float>> after(n);  // [k-th return] -> us after the last arrival
  std::vector<double> returns(n);
  double earliest = std::numeric_limits<double>::max();
  for (int b = variant; b < blocks; b += count) {
    for (int i = 0; i < per_block; ++i) {
      const double* row =
          stamps + (static_cast<std::size_t>(b) * static_cast<std::size_t>(per_block) +
                    static_cast<std::size_t>(i)) *
                       n * 2;
      double last = row[0];
      for (std::size_t r = 0; r < n; ++r) {
        last = std::max(last, row[2 * r]);
        returns[r] = row[2 * r + 1];
      }
      std::sort(returns.begin(), returns.end());
      earliest = std::min(earliest, returns[0] - last);
      for (std::size_t k = 0; k < n; ++k) {
        after[k].push_back(static_cast<float>((returns[k] - last) * 1e6));
      }
    }
  }
  WakeOrder order;
  order.earliest = earliest * 1e6;
  for (auto& values : after) {
    std::sort(values.begin(), values.end());
    order.median.push_back(quantile(values, 0.5));
    order.p90.push_back(quantile(values, 0.9));
  }
  return order;
}

void print_wakes(const std::vector<Variant>& variants, const std::vector<WakeOrder>& orders) {
  std::printf(
      "# --wakes: from an episode's last arrival to the 1st, 2nd, ... last rank's return (us, "
      "median [p90] over the variant's episodes)\n");
  for (std::size_t v = 0; v < orders.size(); ++v) {
    std::printf("%-15s", variants[v].name.c_str());
    for (std::size_t k = 0; k < orders[v].median.size(); ++k) {
      std::printf(" %7.2f [%.1f]", orders[v].median[k], orders[v].p90[k]);
    }
    std::printf("\n");
  }
}

// Per cycle (pthread's block first), a row of one number per variant.
void write_cycles(std::FILE* out, const char* key, const double* values, int count, int blocks) {
  (void)std::fprintf(out, ",\n \"%s\": [", key);
  for (int cycle = 0; cycle + count <= blocks; cycle += count) {
    (void)std::fputs(cycle == 0 ? "[" : ",\n  [", out);
    for (int v = 0; v < count; ++v) {
      (void)std::fprintf(out, "%s%.4f", v == 0 ? "" : ", ", values[cycle + v]);
    }
    (void)std::fputs("]", out);
  }
  (void)std::fputs("]", out);
}

// RAW_JSON: {"variants": [names], "cycles": [[us per episode of each variant], ...], "tails":
// {name: {"p50": us, "p99": us, "p999": us, "episodes": n, "top": [[us, cycle], ...]}, ...}[,
// "compute_us": mean, "overheads": [[us per episode of each variant], ...]]}, one row per cycle
// (in the variants' order, pthread first, whatever order the cycle ran them in), for
// tools/bench-report's paired ratios; "top" is the kTopShare largest episodes, largest first,
// each with its cycle; "tails" is {} when the run had more episodes than are timed one by one;
// the overheads come with --compute.
bool write_raw(const char* path, const std::vector<Variant>& variants, const double* times,
               const double* overheads, double compute_us, int blocks,
               const std::vector<Tails>& tails) {
  std::FILE* out = std::fopen(path, "w");
  if (out == nullptr) {
    (void)std::fprintf(stderr, "sleep-ab: cannot write %s\n", path);
    return false;
  }
  const int count = static_cast<int>(variants.size());
  (void)std::fputs("{\"variants\": [", out);
  for (int v = 0; v < count; ++v) {
    (void)std::fprintf(out, "%s\"%s\"", v == 0 ? "" : ", ",
                       variants[static_cast<std::size_t>(v)].name.c_str());
  }
  (void)std::fputs("]", out);
  write_cycles(out, "cycles", times, count, blocks);
  (void)std::fputs(",\n \"tails\": {", out);
  for (std::size_t v = 0; v < tails.size(); ++v) {
    (void)std::fprintf(out,
                       R"(%s"%s": {"p50": %.3f, "p99": %.3f, "p999": %.3f, "episodes": %zu, )"
                       R"("top": [)",
                       v == 0 ? "" : ",\n  ", variants[v].name.c_str(), tails[v].p50, tails[v].p99,
                       tails[v].p999, tails[v].episodes);
    for (std::size_t i = 0; i < tails[v].top.size(); ++i) {
      (void)std::fprintf(out, "%s[%.2f,%d]", i == 0 ? "" : ",",
                         static_cast<double>(tails[v].top[i].first), tails[v].top[i].second);
    }
    (void)std::fputs("]}", out);
  }
  (void)std::fputs("}", out);
  if (overheads != nullptr) {
    (void)std::fprintf(out, ",\n \"compute_us\": %.3f", compute_us);
    write_cycles(out, "overheads", overheads, count, blocks);
  }
  (void)std::fputs("}\n", out);
  return std::fclose(out) == 0;
}

// Prints one line per variant: the median of `values` over its blocks, and the median, p25 and
// p75 of its ratio to the pthread block of the same cycle.
void print_paired(const std::vector<Variant>& variants, const double* values, int blocks,
                  const char* unit, const std::vector<Tails>& tails) {
  const int count = static_cast<int>(variants.size());
  for (int variant = 0; variant < count; ++variant) {
    std::vector<double> own;
    std::vector<double> ratios;
    for (int cycle = 0; cycle + count <= blocks; cycle += count) {
      own.push_back(values[cycle + variant]);
      ratios.push_back(values[cycle + variant] / values[cycle]);
    }
    std::sort(own.begin(), own.end());
    std::sort(ratios.begin(), ratios.end());
    const std::size_t n = ratios.size();
    std::printf("%-15s %9.2f %s   %.2fx (%.2f-%.2f)",
                variants[static_cast<std::size_t>(variant)].name.c_str(), own[own.size() / 2], unit,
                ratios[n / 2], ratios[n / 4], ratios[3 * n / 4]);
    if (!tails.empty()) {
      const Tails& mine = tails[static_cast<std::size_t>(variant)];
      std::printf("   p99 %8.1f us %.2fx   p99.9 %8.1f us %.2fx", mine.p99, mine.p99 / tails[0].p99,
                  mine.p999, mine.p999 / tails[0].p999);
    }
    std::printf("\n");
  }
}

// One line per lockstep variant that waits adaptively, from each rank's waiter: how many of its
// waits outlasted the quick spins, how many of those began with the machine seen loaded, its load
// samples and how often they turned it loaded and idle, its yields and sleeps.
template <class Families, class Policies>
void print_wait_stats(const Families& families, const Policies& policies,
                      const lockstep::detail::Waiter::Stats* stats, int ranks) {
  for (std::size_t p = 0; p < families.size(); ++p) {
    if (!families[p] || policies[p].second != lockstep::WaitPolicy::adaptive) {
      continue;
    }
    std::printf(
        "# %s's waiter per rank: timed waits (begun loaded), samples (of them read by a peer), "
        "turned loaded / "
        "idle, yields, sleeps, loaded spins (caught)\n",
        policies[p].first);
    for (int rank = 0; rank < ranks; ++rank) {
      const auto& mine =
          stats[p * static_cast<std::size_t>(ranks) + static_cast<std::size_t>(rank)];
      std::printf("#   rank %d: %llu (%llu), %llu (%llu), %llu / %llu, %llu, %llu, %llu (%llu)\n",
                  rank, static_cast<unsigned long long>(mine.timed_waits),
                  static_cast<unsigned long long>(mine.loaded_waits),
                  static_cast<unsigned long long>(mine.samples),
                  static_cast<unsigned long long>(mine.shared_samples),
                  static_cast<unsigned long long>(mine.became_loaded),
                  static_cast<unsigned long long>(mine.became_idle),
                  static_cast<unsigned long long>(mine.yields),
                  static_cast<unsigned long long>(mine.blocks),
                  static_cast<unsigned long long>(mine.loaded_spins),
                  static_cast<unsigned long long>(mine.loaded_catches));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // --compute MEAN_US: every rank computes before each wait (the training-like loop's draw).
  // --wakes: every rank stamps its arrival and return (the wake-up order).
  double compute_us = 0;
  bool wakes = false;
  for (;;) {
    if (argc >= 3 && std::string_view(argv[1]) == "--compute") {
      compute_us = number(argv[2], "--compute's MEAN_US");
      argc -= 2;
      argv += 2;
    } else if (argc >= 2 && std::string_view(argv[1]) == "--wakes") {
      wakes = true;
      --argc;
      ++argv;
    } else {
      break;
    }
  }
  if (argc < 4 || argc > 6) {
    (void)std::fprintf(stderr,
                       "usage: sleep-ab [--compute MEAN_US] [--wakes] NPROC BLOCKS "
                       "EPISODES_PER_BLOCK [VARIANTS [RAW_JSON]]\n");
    return 2;
  }
#ifndef LOCKSTEP_BENCH_LTO
  (void)std::fputs(
      "sleep-ab: built without link-time optimization (meson option bench_lto): its "
      "lockstep variants run code that no user runs; for figures that count, "
      "configure with -Dbench_lto=enabled\n",
      stderr);
#endif
  const int ranks = number(argv[1], "NPROC");
  const int blocks = number(argv[2], "BLOCKS");
  const int per_block = number(argv[3], "EPISODES_PER_BLOCK");
  const std::vector<std::string> wanted =
      split(argc >= 5 ? argv[4] : "futex,futex+timeout,waitv1,waitvN,block", ',');
  const std::array<std::pair<const char*, Sleep>, 8> minimal = {
      {{"futex", Sleep::futex},
       {"futex+timeout", Sleep::futex_timeout},
       {"waitv1", Sleep::waitv_one},
       {"waitvN", Sleep::waitv_all},
       {"counted", Sleep::counted},
       {"clock", Sleep::clock},
       {"coarse", Sleep::coarse},
       {"waiter", Sleep::waiter}}};
  const std::array<std::pair<const char*, lockstep::WaitPolicy>, 3> policies = {
      {{"block", lockstep::WaitPolicy::block},
       {"adaptive", lockstep::WaitPolicy::adaptive},
       {"spin", lockstep::WaitPolicy::spin}}};
  PthreadFamily pthread(ranks);
  std::array<std::optional<ContextFamily>, 3> lockstep_families;  // policies' order
  std::vector<std::unique_ptr<Minimal>> barriers;
  std::vector<Variant> variants;
  variants.push_back({"pthread", [&](int rank) { pthread.wait(rank); }});
  for (const std::string& name : wanted) {
    if (name == "pthread") {
      continue;  // always there
    }
    const auto* policy = std::find_if(policies.begin(), policies.end(),
                                      [&](const auto& entry) { return name == entry.first; });
    if (policy != policies.end()) {
      auto& family = lockstep_families[static_cast<std::size_t>(policy - policies.begin())];
      if (family) {
        (void)std::fprintf(stderr, "sleep-ab: variant '%s' named twice\n", name.c_str());
        return 2;
      }
      family.emplace(ranks, policy->second);
      variants.push_back({name, [&family](int /*rank*/) { family->wait(); }});
      continue;
    }
    const auto* known = std::find_if(minimal.begin(), minimal.end(),
                                     [&](const auto& entry) { return name == entry.first; });
    if (known == minimal.end()) {
      (void)std::fprintf(stderr,
                         "sleep-ab: unknown variant '%s' (futex, futex+timeout, waitv1, waitvN, "
                         "counted, clock, coarse, waiter, pthread, block, adaptive, spin)\n",
                         name.c_str());
      return 2;
    }
    barriers.push_back(std::make_unique<Minimal>(ranks, known->second));
    Minimal& barrier = *barriers.back();
    variants.push_back({name, [&barrier](int /*rank*/) { barrier.wait(); }});
  }
  const int count = static_cast<int>(variants.size());
  if (blocks < 2 * count || blocks % count != 0) {
    (void)std::fprintf(stderr,
                       "sleep-ab: BLOCKS must be a multiple of the variants' count, pthread "
                       "included (%d), and at least %d\n",
                       count, 2 * count);
    return 2;
  }
  const std::size_t total = static_cast<std::size_t>(blocks) * static_cast<std::size_t>(per_block);
  if ((compute_us > 0 || wakes) && total * static_cast<std::size_t>(ranks) > kMaxTimedEpisodes) {
    (void)std::fprintf(stderr,
                       "sleep-ab: %s records every rank's episodes: at most %zu episodes "
                       "times NPROC\n",
                       compute_us > 0 ? "--compute" : "--wakes", kMaxTimedEpisodes);
    return 2;
  }
  auto* times = shared_array<double>(static_cast<std::size_t>(blocks));
  // Each episode as rank 0 saw it (us), when the run is not too long to keep.
  float* episodes = total <= kMaxTimedEpisodes ? shared_array<float>(total) : nullptr;
  // With --compute: [block][episode][rank], each rank's compute (us).
  float* computed =
      compute_us > 0 ? shared_array<float>(total * static_cast<std::size_t>(ranks)) : nullptr;
  // With --wakes: [block][episode][rank][arrived, returned], wall_seconds().
  double* stamps =
      wakes ? shared_array<double>(total * static_cast<std::size_t>(ranks) * 2) : nullptr;
  // What each rank's waiter did under each lockstep policy ([policy][rank]).
  using WaitStats = lockstep::detail::Waiter::Stats;
  auto* wait_stats =
      shared_array<WaitStats>(lockstep_families.size() * static_cast<std::size_t>(ranks));
  if (times == nullptr || (total <= kMaxTimedEpisodes && episodes == nullptr) ||
      (compute_us > 0 && computed == nullptr) || (wakes && stamps == nullptr) ||
      wait_stats == nullptr) {
    (void)std::fprintf(stderr, "sleep-ab: no memory to share with the ranks (mmap failed)\n");
    return 1;
  }
  const double rate = compute_us > 0 ? work_per_us() : 0;  // before the fork: one calibration
  const auto episode = [&](int variant, int rank) {
    variants[static_cast<std::size_t>(variant)].wait(rank);
  };
  const bool ok = fork_ranks(ranks, [&](int rank) {
    // Leaves the jobs however the body ends (fork_ranks's std::exit destroys no local).
    struct Leave {
      std::array<std::optional<ContextFamily>, 3>& families;
      ~Leave() {
        for (auto& family : families) {
          if (family) {
            family->detach();
          }
        }
      }
    } leave{lockstep_families};
    for (auto& family : lockstep_families) {
      if (family) {
        family->attach(rank);
      }
    }
    // The warm-up runs each variant's episodes together, as the blocks do: a rank that sleeps in
    // one variant's barrier looks awake to another's load samples (the adaptive waiter counts
    // only its own job's sleepers), so one episode of each in turn made adaptive see the machine
    // idle under load (2026-12-02: hundreds of yields, p99.9 4-5x pthread's at N=4 beside a busy
    // loop).
    for (int variant = 0; variant < count; ++variant) {
      for (int i = 0; i < 100; ++i) {
        episode(variant, rank);
      }
    }
    const bool timed = rank == 0 && episodes != nullptr;
    for (int b = 0; b < blocks; ++b) {
      // Cycle c runs the variants in turn from variant c mod count, so that none always follows
      // the same other (a block's first episodes pay for the switch). Results are kept by slot,
      // cycle by cycle in the variants' order.
      const int cycle = b / count;
      const int variant = (b + cycle) % count;
      const int slot = cycle * count + variant;
      const double start = wall_seconds();
      double last = start;
      for (int i = 0; i < per_block; ++i) {
        const std::size_t at =
            static_cast<std::size_t>(slot) * static_cast<std::size_t>(per_block) +
            static_cast<std::size_t>(i);
        if (computed != nullptr) {
          // The draw follows the episode's place in its variant's blocks: every variant computes
          // the same sequence.
          const double before = wall_seconds();
          compute(
              work_units(static_cast<std::int64_t>(cycle) * per_block + i, rank, compute_us, rate));
          computed[at * static_cast<std::size_t>(ranks) + static_cast<std::size_t>(rank)] =
              static_cast<float>((wall_seconds() - before) * 1e6);
        }
        double* stamped =
            stamps != nullptr
                ? stamps +
                      (at * static_cast<std::size_t>(ranks) + static_cast<std::size_t>(rank)) * 2
                : nullptr;
        if (stamped != nullptr) {
          stamped[0] = wall_seconds();
        }
        episode(variant, rank);
        if (stamped != nullptr) {
          stamped[1] = wall_seconds();
        }
        if (timed) {
          const double now = wall_seconds();
          episodes[at] = static_cast<float>((now - last) * 1e6);
          last = now;
        }
      }
      if (rank == 0) {
        times[slot] = (wall_seconds() - start) * 1e6 / per_block;
      }
    }
    for (std::size_t p = 0; p < lockstep_families.size(); ++p) {
      if (lockstep_families[p]) {
        wait_stats[p * static_cast<std::size_t>(ranks) + static_cast<std::size_t>(rank)] =
            lockstep_families[p]->stats();
      }
    }
  });
  if (!ok) {
    return 1;
  }
  std::vector<Tails> tails;
  if (episodes != nullptr) {
    for (int variant = 0; variant < count; ++variant) {
      tails.push_back(tails_of(episodes, variant, count, blocks, per_block));
    }
  }
  // With --compute: each block's overhead per episode, its time less the slowest rank's compute.
  std::vector<double> overheads;
  if (computed != nullptr) {
    for (int b = 0; b < blocks; ++b) {
      double slowest = 0;
      for (int i = 0; i < per_block; ++i) {
        const float* row = computed + (static_cast<std::size_t>(b) * per_block + i) * ranks;
        slowest += static_cast<double>(*std::max_element(row, row + ranks));
      }
      overheads.push_back(times[b] - slowest / per_block);
    }
  }
  std::printf(
      "# sleep-ab: N=%d, %d blocks of %d episodes, interleaved%s; us per episode, and the\n"
      "# ratio to the pthread block of the same cycle (median, p25, p75); %s\n",
      ranks, blocks, per_block, compute_us > 0 ? ", each rank computing first" : "",
      tails.empty() ? "tails not timed (more episodes than sleep-ab times one by one)"
                    : "rank 0's episodes' p99 and p99.9 (us), and their ratio to pthread's");
  print_paired(variants, times, blocks, "us", tails);
  if (computed != nullptr) {
    std::printf("# with --compute %g: the overhead per episode beyond the slowest rank's compute\n",
                compute_us);
    print_paired(variants, overheads.data(), blocks, "us", {});
  }
  if (stamps != nullptr) {
    std::vector<WakeOrder> orders;
    orders.reserve(variants.size());
    for (int variant = 0; variant < count; ++variant) {
      orders.push_back(wake_order(stamps, variant, count, blocks, per_block, ranks));
    }
    print_wakes(variants, orders);
    // A barrier lets nobody return before the last arrival: each stamp of an arrival precedes
    // it, each stamp of a return follows the episode's end, and CLOCK_MONOTONIC is one clock
    // for every CPU.
    for (std::size_t v = 0; v < orders.size(); ++v) {
      if (orders[v].earliest < 0) {
        (void)std::fprintf(stderr,
                           "sleep-ab: %s let a rank return %.3f us before its episode's last "
                           "arrival\n",
                           variants[v].name.c_str(), -orders[v].earliest);
        return 1;
      }
    }
  }
  print_wait_stats(lockstep_families, policies, wait_stats, ranks);
  if (argc == 6 &&
      !write_raw(argv[5], variants, times, computed != nullptr ? overheads.data() : nullptr,
                 compute_us, blocks, tails)) {
    return 1;
  }
  return 0;
}
