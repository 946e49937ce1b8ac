// consumer-bench: lockstep's barrier as a user's program gets it, however the user took lockstep
// in (a Meson subproject, the installed library, a static link: bench/consumer/meson.build), timed
// against a process-shared pthread_barrier_t in the same job, block by block.
//
//   lockstep-run --nproc-per-node N consumer-bench BLOCKS EPISODES_PER_BLOCK
//
// Only the public API: every rank joins the job with lockstep::State (its wait policy is
// LOCKSTEP_WAIT_POLICY's, or the build's default). Rank 0 makes a pthread_barrier_t in a shared
// mapping and broadcasts its name. Then the ranks run BLOCKS blocks (an even number, at least 4)
// of EPISODES_PER_BLOCK episodes each, a block of wait_for_everyone() and a block of
// pthread_barrier_wait() in turn, the pair's order swapped every cycle, so that both see the same
// load phases. Rank 0 times each block and prints one line:
//   consumer-bench: N=2 policy=adaptive lockstep_us=0.251 pthread_us=10.1 ratio=0.0249
//     ratio_p25=0.0241 ratio_p75=0.0262 cycles=20
// the median block of each (microseconds per episode) and the median (and quartiles) over cycles
// of lockstep's block / pthread's block in that cycle. tools/bench-ways-in runs it, built each way,
// in alternation.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <lockstep/lockstep.hpp>

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const double at = q * static_cast<double>(values.size() - 1);
  const auto low = static_cast<std::size_t>(at);
  const std::size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (at - static_cast<double>(low));
}

long positive(const char* text, const char* what) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > 100'000'000) {
    throw std::runtime_error(std::string(what) + " " + text + ": not a whole number from 1 to " +
                             "100000000");
  }
  return value;
}

// A process-shared pthread_barrier_t for the job's processes: made by rank 0 in a shared memory
// object whose name it broadcasts; the name is unlinked once every process has mapped it.
pthread_barrier_t* map_barrier(const std::string& name, bool create) {
  const int fd = ::shm_open(name.c_str(), create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  if (fd < 0 || (create && ::ftruncate(fd, sizeof(pthread_barrier_t)) != 0)) {
    throw std::runtime_error("shm_open or ftruncate of " + name + " failed");
  }
  void* memory =
      ::mmap(nullptr, sizeof(pthread_barrier_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (memory == MAP_FAILED) {
    throw std::runtime_error("mmap of " + name + " failed");
  }
  return static_cast<pthread_barrier_t*>(memory);
}

// Unlinks the shared memory object it names, however the function that made it ends.
struct Unlink {
  std::string name;
  Unlink() = default;
  Unlink(const Unlink&) = delete;
  Unlink& operator=(const Unlink&) = delete;
  ~Unlink() {
    if (!name.empty()) {
      ::shm_unlink(name.c_str());
    }
  }
};

pthread_barrier_t* shared_pthread_barrier(lockstep::State& state) {
  std::string name;
  pthread_barrier_t* barrier = nullptr;
  Unlink made;  // rank 0's: once every process has mapped it, or on an error
  if (state.is_main_process()) {
    std::random_device device;
    name =
        "/lockstep-consumer-bench-" + std::to_string(::getpid()) + "-" + std::to_string(device());
    barrier = map_barrier(name, true);
    made.name = name;
    pthread_barrierattr_t attributes;
    pthread_barrierattr_init(&attributes);
    pthread_barrierattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(barrier, &attributes, static_cast<unsigned>(state.num_processes()));
    pthread_barrierattr_destroy(&attributes);
  }
  name = state.broadcast(name);  // made before the broadcast, opened after it
  if (!state.is_main_process()) {
    barrier = map_barrier(name, false);
  }
  state.wait_for_everyone();  // every process has mapped it
  return barrier;
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int run(int argc, char** argv) {
  if (argc != 3) {
    (void)std::fprintf(stderr,
                       "usage: consumer-bench BLOCKS EPISODES_PER_BLOCK (under lockstep-run)\n");
    return 2;
  }
  const long blocks = positive(argv[1], "BLOCKS");
  const long per_block = positive(argv[2], "EPISODES_PER_BLOCK");
  if (blocks < 4 || blocks % 2 != 0) {
    (void)std::fprintf(stderr, "consumer-bench: BLOCKS %ld: an even number, at least 4\n", blocks);
    return 2;
  }
  lockstep::State state;
  pthread_barrier_t* barrier = shared_pthread_barrier(state);
  const auto block = [&](bool ours) {
    const double start = seconds_now();
    for (long i = 0; i < per_block; ++i) {
      if (ours) {
        state.wait_for_everyone();
      } else {
        pthread_barrier_wait(barrier);
      }
    }
    return (seconds_now() - start) * 1e6 / static_cast<double>(per_block);
  };
  for (int warm = 0; warm < 2; ++warm) {
    (void)block(true);
    (void)block(false);
  }
  std::vector<double> ours;
  std::vector<double> theirs;
  std::vector<double> ratios;
  for (long cycle = 0; cycle < blocks / 2; ++cycle) {
    const bool ours_first = cycle % 2 == 0;
    const double first = block(ours_first);
    const double second = block(!ours_first);
    ours.push_back(ours_first ? first : second);
    theirs.push_back(ours_first ? second : first);
    ratios.push_back(ours.back() / theirs.back());
  }
  state.wait_for_everyone();
  if (state.is_main_process()) {
    const char* policy = std::getenv("LOCKSTEP_WAIT_POLICY");  // NOLINT(concurrency-mt-unsafe)
    std::printf(
        "consumer-bench: N=%d policy=%s lockstep_us=%.4g pthread_us=%.4g ratio=%.4g "
        "ratio_p25=%.4g ratio_p75=%.4g cycles=%zu\n",
        state.num_processes(), policy != nullptr ? policy : "default", median(ours), median(theirs),
        median(ratios), quantile(ratios, 0.25), quantile(ratios, 0.75), ratios.size());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    (void)std::fprintf(stderr, "consumer-bench: %s\n", error.what());
    return 1;
  }
}
