// lockstep-bench: the barrier's latency on the machine it runs on, lockstep's wait policies and
// the alternatives side by side, in the style of the OSU micro-benchmarks and nccl-tests:
//
//   lockstep-bench [--nproc 2,4,8] [--iterations 10000] [--warmup 1000]
//                  [--families adaptive,block,spin,pthread,boost] [--format table|csv|json]
//                  [--runs 1]
//
// For each N and family it forks N processes that loop on one barrier (bench/ranks.hpp, the
// same ranks the Google Benchmark suite uses) and prints avg / min / p50 / p99 / max per episode,
// how many episodes were timed, and the CPU time per episode. Each run of the cells begins with
// the cache-line round trip between two CPUs (the host may move a VM's vCPUs between separate
// cores and SMT siblings from one run to the next, which moves every figure); with --runs K the
// cells run K times, interleaved, and a cell with a run more than 1.5x another of the same
// placement (SMT siblings or separate cores, told by the round trip) is flagged as bimodal, with
// each run and its round trip, rather than hidden in an average.
// Installed beside lockstep-run; tools/bench-report is the full comparison (MPI, gloo, the load
// matrix).
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <lockstep/lockstep.hpp>
#include <lockstep/version.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/proc.hpp"  // lib/src: usable_cpus
#include "base/text.hpp"  // json_string
#include "families.hpp"
#include "ranks.hpp"

namespace {

using lockstep::bench::BoostFamily;
using lockstep::bench::LockstepFamily;
using lockstep::bench::PingPongFamily;
using lockstep::bench::PthreadFamily;
using lockstep::bench::Report;

struct Options {
  std::string nproc = "2,4,8";
  std::int64_t iterations = 10000;
  std::int64_t warmup = 1000;
  std::string families = "adaptive,block,spin,pthread,boost";
  std::string format = "table";
  bool spin_oversubscribed = false;
  bool pin = false;
  int runs = 1;
};

// A family as the user names it, and as the table shows it.
struct FamilyName {
  const char* key;
  const char* label;
};
constexpr FamilyName kFamilies[] = {
    {"adaptive", "lockstep adaptive"}, {"block", "lockstep block"},     {"spin", "lockstep spin"},
    {"pthread", "pthread_barrier_t"},  {"boost", "Boost.Interprocess"},
};
constexpr int kMaxProcesses = static_cast<int>(sizeof(Report::cpu) / sizeof(Report::cpu[0]));

// A cell with a run whose avg is more than this times another's of the same placement is flagged
// as bimodal.
constexpr double kBimodal = 1.5;
// A run whose cache-line round trip was below this had its two vCPUs on SMT siblings of one core
// (about 0.05 us), above on separate cores (0.13-0.3 us): placements, compared apart (the split
// of tools/bench_provenance.py's SMT_ROUND_TRIP_US).
constexpr double kSmtRoundTripUs = 0.1;

// Below this many timed episodes p99 is the largest one, the max: it is left out (a table's "-",
// CSV's empty field, JSON's null) rather than shown as a p99.
constexpr std::size_t kSamplesForP99 = 100;

struct Row {
  int nproc = 0;
  FamilyName family{};
  int run = 0;                 // which of --runs (0-based)
  std::optional<double> trip;  // the run's cache-line round trip (us); none on one CPU
  double avg = 0, min = 0, p50 = 0, p99 = 0, max = 0, cpu = 0;
  std::size_t samples = 0;  // rank 0's timed episodes, which min, p50, p99 and max are of
  std::string skipped;      // why the cell was not measured (empty: measured)
};

std::vector<int> parse_nproc(const std::string& text) {
  std::vector<int> counts;
  for (const std::string& part : lockstep::bench::split(text, ',')) {
    std::size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || n < 1 || n > kMaxProcesses) {
      std::string why = "\"";
      why += part;
      why += "\" in \"";
      why += text;
      why += "\" is not a process count (1-";
      why += std::to_string(kMaxProcesses);
      why += ")";
      throw CLI::ValidationError("--nproc", why);
    }
    counts.push_back(n);
  }
  if (counts.empty()) {
    throw CLI::ValidationError("--nproc", "is empty: give process counts, e.g. 2,4,8");
  }
  return counts;
}

std::vector<FamilyName> parse_families(const std::string& text) {
  std::vector<FamilyName> chosen;
  for (const std::string& part : lockstep::bench::split(text, ',')) {
    bool known = false;
    for (const FamilyName& family : kFamilies) {
      if (part == family.key) {
        chosen.push_back(family);
        known = true;
      }
    }
    if (!known) {
      throw CLI::ValidationError("--families", "\"" + part +
                                                   "\" is not a family: the families are "
                                                   "adaptive, block, spin, pthread, boost");
    }
  }
  if (chosen.empty()) {
    throw CLI::ValidationError("--families", "is empty");
  }
  return chosen;
}

// Runs one cell: `nproc` processes of `family`; nullopt if a rank failed.
template <class Family>
std::optional<Row> measure(Family& family, int nproc, const Options& options) {
  Report* report = lockstep::bench::shared_report();
  const bool ok =
      lockstep::bench::run_ranks(family, nproc, options.iterations, options.warmup, *report);
  std::optional<Row> row;
  if (ok) {
    const auto episodes = static_cast<double>(options.iterations);
    row.emplace();
    row->avg = report->elapsed * 1e6 / episodes;
    row->samples = std::min(report->num_samples, lockstep::bench::kMaxSamples);
    row->min = lockstep::bench::sampled_quantile(*report, 0.0);
    row->p50 = lockstep::bench::sampled_quantile(*report, 0.5);
    row->p99 = lockstep::bench::sampled_quantile(*report, 0.99);
    row->max = lockstep::bench::sampled_quantile(*report, 1.0);
    row->cpu = lockstep::bench::total_cpu(*report, nproc) * 1e6 / episodes;
  }
  ::munmap(report, sizeof(Report));
  return row;
}

std::optional<Row> run_cell(const FamilyName& name, int nproc, const Options& options) {
  const std::string key = name.key;
  if (key == "pthread") {
    PthreadFamily family(nproc);
    return measure(family, nproc, options);
  }
  if (key == "boost") {
    BoostFamily family(nproc);
    return measure(family, nproc, options);
  }
  LockstepFamily family(nproc, *lockstep::wait_policy_named(key));
  return measure(family, nproc, options);
}

// The cache-line round trip between two CPUs now (us per round trip), the placement a run's
// figures belong to; none where this process has one CPU.
std::optional<double> round_trip_us(int cpus) {
  if (cpus < 2) {
    return std::nullopt;
  }
  PingPongFamily family(2);
  Options options;
  // Short: 0.2-0.5 ms on an idle machine, and bounded where the two ranks must share a CPU
  // (each round trip a context switch).
  options.iterations = 2000;
  options.warmup = 200;
  const std::optional<Row> row = measure(family, 2, options);
  if (!row) {
    return std::nullopt;
  }
  return row->avg;
}

std::string iso_date() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char text[32];
  (void)std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string first_line_after(const char* path, const std::string& prefix) {
  std::ifstream file(path);
  for (std::string line; std::getline(file, line);) {
    if (line.rfind(prefix, 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line
                                        : line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "";
}

struct Machine {
  int cpus = lockstep::detail::usable_cpus();
  std::string model = first_line_after("/proc/cpuinfo", "model name");
  std::string kernel;
  std::string load;
  std::string date = iso_date();
  Machine() {
    utsname name{};
    kernel = ::uname(&name) == 0 ? std::string(name.sysname) + " " + name.release : "?";
    std::string five, fifteen;
    std::ifstream loadavg("/proc/loadavg");
    loadavg >> load >> five >> fifteen;
    load += " " + five + " " + fifteen;
  }
};

// Whether this binary has the link-time optimization of liblockstep.so (meson option
// bench_lto): without it, the lockstep rows lack the inlining across files that users' programs
// get from liblockstep.so.
#ifdef LOCKSTEP_BENCH_LTO
constexpr bool kLinkTimeOptimized = true;
#else
constexpr bool kLinkTimeOptimized = false;
#endif

void table_header(const Options& options, const Machine& machine) {
  std::printf("# lockstep-bench %s: barrier latency, N processes looping on one barrier\n",
              LOCKSTEP_VERSION_STRING);
  if (!kLinkTimeOptimized) {
    std::printf(
        "# built without link-time optimization (meson option bench_lto): the lockstep rows lack "
        "liblockstep.so's inlining across files\n");
  }
  std::printf("# %s, %d CPUs (%s), %s, load average %s\n", machine.date.c_str(), machine.cpus,
              machine.model.c_str(), machine.kernel.c_str(), machine.load.c_str());
  std::printf("# %lld iterations after %lld warm-up per cell; microseconds per episode:\n",
              static_cast<long long>(options.iterations), static_cast<long long>(options.warmup));
  std::printf(
      "#   avg = rank 0's loop time / iterations; min p50 p99 max = rank 0's episodes, one in "
      "%lld timed (samples: how many);\n#   p99 is shown from %zu samples on (fewer: -, it would "
      "be the max; --iterations %lld or more)\n#   cpu = CPU time per episode summed over the "
      "processes (spinning shows here, sleeping does not)\n#\n",
      static_cast<long long>(lockstep::bench::kSampleEvery), kSamplesForP99,
      static_cast<long long>(kSamplesForP99) *
          static_cast<long long>(lockstep::bench::kSampleEvery));
  std::printf(
      "#   run = which of --runs; trip = that run's cache-line round trip between two CPUs (its "
      "placement)\n");
  std::printf("# %5s  %-20s %11s %11s %11s %11s %11s %11s %8s %4s %8s\n", "nproc", "family", "avg",
              "min", "p50", "p99", "max", "cpu", "samples", "run", "trip");
}

// "0.254", or "-" where no round trip was measured (one CPU).
std::string trip_text(const std::optional<double>& trip, const char* none) {
  if (!trip) {
    return none;
  }
  char text[32];
  (void)std::snprintf(text, sizeof text, "%.4f", *trip);
  return text;
}

void table_row(const Row& row) {
  if (!row.skipped.empty()) {
    std::printf("  %5d  %-20s skipped: %s\n", row.nproc, row.family.label, row.skipped.c_str());
  } else {
    char p99[32] = "-";
    if (row.samples >= kSamplesForP99) {
      (void)std::snprintf(p99, sizeof p99, "%.3f", row.p99);
    }
    std::printf("  %5d  %-20s %11.3f %11.3f %11.3f %11s %11.3f %11.3f %8zu %4d %8s\n", row.nproc,
                row.family.label, row.avg, row.min, row.p50, p99, row.max, row.cpu, row.samples,
                row.run, trip_text(row.trip, "-").c_str());
  }
}

// One cell's measured runs (skipped ones left out), in the order they ran.
struct Cell {
  int nproc = 0;
  FamilyName family{};
  std::vector<Row> runs;
  [[nodiscard]] double fastest() const {
    return std::min_element(runs.begin(), runs.end(), by_avg)->avg;
  }
  [[nodiscard]] double slowest() const {
    return std::max_element(runs.begin(), runs.end(), by_avg)->avg;
  }
  // Whether a run took more than kBimodal times another of the same placement (a slow state;
  // runs on SMT siblings and on separate cores differ by their placement).
  [[nodiscard]] bool bimodal() const {
    for (const bool smt : {true, false}) {
      double low = 0;
      double high = 0;
      for (const Row& row : runs) {
        if ((row.trip.value_or(1.0) < kSmtRoundTripUs) == smt) {
          low = low == 0 ? row.avg : std::min(low, row.avg);
          high = std::max(high, row.avg);
        }
      }
      if (low > 0 && high > kBimodal * low) {
        return true;
      }
    }
    return false;
  }
  static bool by_avg(const Row& a, const Row& b) { return a.avg < b.avg; }
};

std::vector<Cell> cells_of(const std::vector<Row>& rows) {
  std::vector<Cell> cells;
  for (const Row& row : rows) {
    if (!row.skipped.empty()) {
      continue;
    }
    auto cell = std::find_if(cells.begin(), cells.end(), [&](const Cell& c) {
      return c.nproc == row.nproc && std::string(c.family.key) == row.family.key;
    });
    if (cell == cells.end()) {
      cells.push_back(Cell{row.nproc, row.family, {}});
      cell = cells.end() - 1;
    }
    cell->runs.push_back(row);
  }
  return cells;
}

// "N=4 lockstep adaptive: avg 1.920-24.310 us over 5 runs, the slowest 12.66x the fastest: run 0
// 1.920 us (trip 0.0660 us), run 1 24.310 us (trip 0.2540 us), ...".
std::string runs_text(const Cell& cell) {
  char head[160];
  (void)std::snprintf(head, sizeof head,
                      "N=%d %s: avg %.3f-%.3f us over %zu runs, the slowest %.2fx the fastest",
                      cell.nproc, cell.family.label, cell.fastest(), cell.slowest(),
                      cell.runs.size(), cell.slowest() / cell.fastest());
  std::string text = head;
  const char* separator = ": ";
  for (const Row& row : cell.runs) {
    char run[96];
    (void)std::snprintf(run, sizeof run, "%srun %d %.3f us (trip %s us)", separator, row.run,
                        row.avg, trip_text(row.trip, "-").c_str());
    text += run;
    separator = ", ";
  }
  return text;
}

// After the table, with --runs above 1: each cell's runs, bimodal ones flagged.
void table_runs(const std::vector<Cell>& cells, const Options& options) {
  if (options.runs < 2) {
    return;
  }
  std::printf(
      "#\n# each cell's runs (bimodal: a run's avg more than %.1fx another's of the same "
      "placement, SMT siblings or separate cores, told by its round trip):\n",
      kBimodal);
  for (const Cell& cell : cells) {
    std::printf("# %s %s\n", cell.bimodal() ? "BIMODAL" : "       ", runs_text(cell).c_str());
  }
}

constexpr const char* kCsvHeader =
    "nproc,family,iterations,avg_us,min_us,p50_us,p99_us,max_us,cpu_us,samples,run,round_trip_us,"
    "skipped";

void csv_row(const Row& row, const Options& options) {
  if (!row.skipped.empty()) {
    std::printf("%d,%s,%lld,,,,,,,,%d,%s,\"%s\"\n", row.nproc, row.family.key,
                static_cast<long long>(options.iterations), row.run,
                trip_text(row.trip, "").c_str(), row.skipped.c_str());
  } else {
    char p99[32] = "";
    if (row.samples >= kSamplesForP99) {
      (void)std::snprintf(p99, sizeof p99, "%.4f", row.p99);
    }
    std::printf("%d,%s,%lld,%.4f,%.4f,%.4f,%s,%.4f,%.4f,%zu,%d,%s,\n", row.nproc, row.family.key,
                static_cast<long long>(options.iterations), row.avg, row.min, row.p50, p99, row.max,
                row.cpu, row.samples, row.run, trip_text(row.trip, "").c_str());
  }
}

void print_json(const std::vector<Row>& rows, const std::vector<Cell>& cells,
                const Options& options, const Machine& machine) {
  std::printf("{\"tool\": \"lockstep-bench\", \"version\": %s, \"date\": %s,\n",
              lockstep::detail::json_string(LOCKSTEP_VERSION_STRING).c_str(),
              lockstep::detail::json_string(machine.date).c_str());
  std::printf(" \"machine\": {\"cpus\": %d, \"model\": %s, \"kernel\": %s, \"loadavg\": %s},\n",
              machine.cpus, lockstep::detail::json_string(machine.model).c_str(),
              lockstep::detail::json_string(machine.kernel).c_str(),
              lockstep::detail::json_string(machine.load).c_str());
  std::printf(" \"link_time_optimized\": %s,\n", kLinkTimeOptimized ? "true" : "false");
  std::printf(
      " \"iterations\": %lld, \"warmup\": %lld, \"sample_every\": %lld, \"unit\": \"us\",\n",
      static_cast<long long>(options.iterations), static_cast<long long>(options.warmup),
      static_cast<long long>(lockstep::bench::kSampleEvery));
  std::printf(" \"results\": [");
  const char* separator = "\n";
  for (const Row& row : rows) {
    std::printf(R"(%s  {"nproc": %d, "family": %s, "label": %s, "run": %d, "round_trip_us": %s)",
                separator, row.nproc, lockstep::detail::json_string(row.family.key).c_str(),
                lockstep::detail::json_string(row.family.label).c_str(), row.run,
                trip_text(row.trip, "null").c_str());
    if (row.skipped.empty()) {
      char p99[32] = "null";
      if (row.samples >= kSamplesForP99) {
        (void)std::snprintf(p99, sizeof p99, "%.4f", row.p99);
      }
      std::printf(
          ", \"avg_us\": %.4f, \"min_us\": %.4f, \"p50_us\": %.4f, \"p99_us\": %s, "
          "\"max_us\": %.4f, \"cpu_us\": %.4f, \"samples\": %zu}",
          row.avg, row.min, row.p50, p99, row.max, row.cpu, row.samples);
    } else {
      std::printf(", \"skipped\": %s}", lockstep::detail::json_string(row.skipped).c_str());
    }
    separator = ",\n";
  }
  std::printf("\n ],\n \"runs\": %d, \"bimodal_above\": %.1f,\n \"cells\": [", options.runs,
              kBimodal);
  separator = "\n";
  for (const Cell& cell : cells) {
    std::printf(R"(%s  {"nproc": %d, "family": %s, "runs": %zu, "fastest_avg_us": %.4f, )"
                R"("slowest_avg_us": %.4f, "bimodal": %s})",
                separator, cell.nproc, lockstep::detail::json_string(cell.family.key).c_str(),
                cell.runs.size(), cell.fastest(), cell.slowest(),
                cell.bimodal() ? "true" : "false");
    separator = ",\n";
  }
  std::printf("\n]}\n");
}

// Every cell, in order, each printed as it ends (a table or CSV; JSON at the end); false if a
// cell failed (a rank that could not run).
bool run_all(const Options& options) {
  const Machine machine;
  std::vector<Row> rows;
  bool ok = true;
  if (options.format == "table") {
    table_header(options, machine);
  } else if (options.format == "csv") {
    std::printf("%s\n", kCsvHeader);
  }
  (void)std::fflush(stdout);
  for (int run = 0; run < options.runs; ++run) {
    const std::optional<double> trip = round_trip_us(machine.cpus);
    for (int nproc : parse_nproc(options.nproc)) {
      for (const FamilyName& family : parse_families(options.families)) {
        Row row;
        if (std::string(family.key) == "spin" && nproc > machine.cpus &&
            !options.spin_oversubscribed) {
          row.skipped = "more processes than the " + std::to_string(machine.cpus) +
                        " CPUs this process may use (spinning then measures the scheduler; "
                        "--spin-oversubscribed runs it)";
        } else if (auto measured = run_cell(family, nproc, options)) {
          row = *measured;
        } else {
          row.skipped = "a process failed (see above)";
          ok = false;
        }
        row.nproc = nproc;
        row.family = family;
        row.run = run;
        row.trip = trip;
        rows.push_back(row);
        if (options.format == "table") {
          table_row(row);
        } else if (options.format == "csv") {
          csv_row(row, options);
        }
        (void)std::fflush(stdout);
      }
    }
  }
  const std::vector<Cell> cells = cells_of(rows);
  if (options.format == "json") {
    print_json(rows, cells, options, machine);
  } else if (options.format == "table") {
    table_runs(cells, options);
  } else {
    for (const Cell& cell : cells) {
      if (cell.bimodal()) {
        (void)std::fprintf(stderr, "lockstep-bench: bimodal: %s\n", runs_text(cell).c_str());
      }
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{
      "lockstep-bench: barrier latency on this machine, lockstep's wait policies and the "
      "alternatives side by side (N forked processes per cell)"};
  app.add_option("--nproc,-n", options.nproc, "process counts, comma-separated")
      ->capture_default_str();
  app.add_option("--iterations,-i", options.iterations, "measured episodes per cell")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--warmup,-w", options.warmup, "episodes before the measured ones, per cell")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--families,-f", options.families,
                 "adaptive, block, spin (lockstep's wait policies), pthread "
                 "(pthread_barrier_t), boost (Boost.Interprocess mutex + condition)")
      ->capture_default_str();
  app.add_option("--format", options.format, "table, csv or json")
      ->check(CLI::IsMember({"table", "csv", "json"}))
      ->capture_default_str();
  app.add_flag("--spin-oversubscribed", options.spin_oversubscribed,
               "run the spin policy also where N exceeds the CPUs");
  app.add_flag("--pin", options.pin, "pin rank r to CPU r mod CPUs");
  app.add_option("--runs,-r", options.runs,
                 "run every cell this many times, interleaved, each run after a cache-line round "
                 "trip; a cell whose runs on one placement differ by more than 1.5x is flagged as "
                 "bimodal")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
    (void)parse_nproc(options.nproc);  // refuse bad input before any cell runs
    (void)parse_families(options.families);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;  // --help: 0; a bad flag: 2, as lockstep-run
  }
  if (options.pin) {
    ::setenv("LOCKSTEP_BENCH_PIN", "1", 1);  // NOLINT(concurrency-mt-unsafe): no threads yet
  }
  try {
    return run_all(options) ? 0 : 1;
  } catch (const std::exception& error) {
    (void)std::fprintf(stderr, "lockstep-bench: %s\n", error.what());
    return 1;
  }
}
