#include "waiting/waiter.hpp"

#include <algorithm>
#include <atomic>

namespace lockstep::detail {

using std::chrono::microseconds;
using std::chrono::nanoseconds;
using namespace wait_tuning;

namespace {

// A shared load sample's word (Waiter::share_samples): the stamp above kSampleBits, then the
// sample: kUncertain, and the count of competing tasks below it.
constexpr int kSampleBits = 16;
constexpr std::uint64_t kUncertain = std::uint64_t{1} << (kSampleBits - 1);
constexpr std::uint64_t kCountMask = kUncertain - 1;
constexpr std::uint64_t kStampMask = (std::uint64_t{1} << (64 - kSampleBits)) - 1;

}  // namespace

Waiter::Waiter(WaitPolicy policy, WaitShape shape, WaitSignals& signals) noexcept
    : policy_(policy),
      shape_(shape),
      signals_(signals),
      adaptive_(policy == WaitPolicy::adaptive),
      options_(plan_wait(policy_, shape_, loaded_, spin_)) {}

std::optional<Waiter::Sample> Waiter::peers_sample(std::uint64_t stamp,
                                                   nanoseconds period) noexcept {
  // Relaxed: a hint in one word (never torn); a stale value is only an older sample.
  const std::uint64_t word = shared_->load(std::memory_order_relaxed);
  const std::uint64_t taken = word >> kSampleBits;
  if (word == 0 || taken == last_stamp_ || stamp < taken ||
      stamp - taken >=
          static_cast<std::uint64_t>(std::chrono::duration_cast<microseconds>(period).count())) {
    return std::nullopt;
  }
  last_stamp_ = taken;
  ++stats_.shared_samples;
  return Sample{static_cast<int>(word & kCountMask), (word & kUncertain) != 0};
}

// The foreign tasks are counted twice. At most: the machine's runnable tasks less the job's that
// are awake (a peer asleep in a wait is taken as off the run queue). At least: less all of the
// job's, asleep or not. They differ where the kernel still counts a peer that went to sleep:
// Linux 6.12 and later (EEVDF's delayed dequeue) keep a task that blocks before it has had its
// share of the CPU on the run queue, and in /proc/loadavg's count, until its turn comes. With
// more processes than CPUs the job's own peers are such tasks, each time they sleep: a job whose
// processes slept at once (loaded) saw one to four "foreign" tasks in half its samples on an
// idle machine, and stayed loaded for good, every wait a sleep (2x slower at N = 8 on 2 vCPUs).
std::optional<Waiter::Sample> Waiter::own_sample(std::uint64_t stamp) noexcept {
  const int runnable = signals_.runnable_tasks();
  if (runnable < 0) {
    return std::nullopt;
  }
  const int asleep = peers_asleep_ ? peers_asleep_() : 0;
  const int here = std::max(shape_.processes, shape_.processes_here);
  const int ours = here - std::clamp(asleep, 0, here - 1);  // this process is awake
  const int foreign = std::max(0, runnable - ours);
  const int surely = std::max(0, runnable - here);
  // Competing only when it and the whole job awake would not fit the machine's CPUs.
  const bool tight = foreign + here > signals_.online_cpus();
  const Sample sample{tight ? foreign : 0, tight && foreign > 0 && surely == 0};
  if (shared_ != nullptr) {
    // Relaxed: a hint (see share_samples).
    const auto count =
        static_cast<std::uint64_t>(std::min(sample.competing, static_cast<int>(kCountMask)));
    shared_->store(stamp << kSampleBits | (sample.uncertain ? kUncertain : 0) | count,
                   std::memory_order_relaxed);
    last_stamp_ = stamp;
  }
  return sample;
}

// A sample counts the runnable tasks that are not the job's: the machine's runnable tasks less
// the job's processes on this node that do not sleep in a wait (a process computing, spinning or
// preempted is runnable; a process in a wait's futex is not). It counts only while those tasks
// and all of the job's processes here would be more than the machine's CPUs: a busy process
// elsewhere on a large machine competes with nobody here, and one that fits beside the job only
// while a peer sleeps competes as soon as the barrier wakes it (before, the gate was
// the runnable tasks alone, and N=2 beside one busy process on 2 CPUs, sampling while its peer
// slept, saw the machine idle again and yielded its CPU to the busy one thousands of times).
// The machine is taken as loaded once the last kLoadWindow samples all saw a foreign task,
// kSureToLoad of them surely, and as idle again once kIdleWindow samples saw none with no sure
// one between them (uncertain ones are skipped): a competitor is there in nearly every sample,
// while kernel threads and tasks being woken come and go (on this 2-vCPU VM, single samples at
// idle saw up to two such tasks, and a smoothed mean of them flipped an idle job to loaded
// several times per second). Uncertain samples alone (the job's sleepers, which the kernel may
// count) turned the first processes of a node to turn idle loaded again while their peers still
// slept; and one sure sample of a kernel thread's slice (kdamond's, 1.7 ms) followed by the
// uncertain ones of the sleeps it caused turned an idle job loaded.
bool Waiter::sample_load(WaitClock::time_point now, bool now_or_never) noexcept {
  const nanoseconds period = next_ < kLoadWindow ? nanoseconds(kFirstSamplesPeriod)
                             : loaded_           ? nanoseconds(kLoadedSamplePeriod)
                                                 : nanoseconds(kLoadSamplePeriod);
  if (!adaptive_ || (!now_or_never && now - last_sample_ < period)) {
    return loaded_;
  }
  last_sample_ = now;
  ++stats_.samples;
  // The sample's stamp: the steady clock in microseconds, 48 bits (they wrap after 8.9 years).
  const auto stamp = static_cast<std::uint64_t>(
                         std::chrono::duration_cast<microseconds>(now.time_since_epoch()).count()) &
                     kStampMask;
  // The sample's foreign tasks where they compete with the job, else 0.
  std::optional<Sample> sample;
  if (shared_ != nullptr && !now_or_never) {
    sample = peers_sample(stamp, period);
  }
  if (!sample) {
    sample = own_sample(stamp);
    if (!sample) {
      return loaded_;  // no /proc: the shape alone decides, as before load was seen
    }
  }
  recent_[next_++ % recent_.size()] = *sample;
  quiet_ = sample->sure() ? 0 : quiet_ + (sample->competing == 0 ? 1 : 0);
  if (next_ < kLoadWindow) {
    return loaded_;  // too few samples yet
  }
  const bool was = loaded_;
  loaded_ = loaded_ ? quiet_ < kIdleWindow : all_saw(kLoadWindow, true) && sure_in_window();
  stats_.became_loaded += !was && loaded_ ? 1 : 0;
  stats_.became_idle += was && !loaded_ ? 1 : 0;
  options_ = plan_wait(policy_, shape_, loaded_, spin_);
  return loaded_;
}

template <class Pred>
std::size_t Waiter::count_last(std::size_t count, Pred pred) const noexcept {
  std::size_t held = 0;
  for (std::size_t i = 1; i <= count && i <= next_; ++i) {  // newest first
    held += pred(recent_[(next_ - i) % recent_.size()]) ? 1 : 0;
  }
  return held;
}

bool Waiter::sure_in_window() const noexcept {
  return count_last(kLoadWindow, [](const Sample& sample) { return sample.sure(); }) >= kSureToLoad;
}

bool Waiter::all_saw(std::size_t count, bool load) const noexcept {
  return next_ >= count && count_last(count, [load](const Sample& sample) {
                             return (sample.competing > 0) == load;
                           }) == count;
}

double Waiter::foreign_load() const noexcept {
  const std::size_t n = std::min<std::size_t>(next_, recent_.size());
  if (n == 0) {
    return 0;
  }
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sum += recent_[i].competing;
  }
  return sum / static_cast<double>(n);
}

// The spin phase follows the waits seen (adaptive, one node, a CPU per process, idle machine):
// a wait that a spin of kSpinMaxIdle would have covered, and that took more than half the
// current spin, doubles it (up to that); a longer wait halves it (down to kSpinMin). So a loop
// whose waits last 30-100 us learns to spin through them, and a peer that is often late by
// milliseconds costs a short spin each time. Waits on a loaded machine teach nothing here.
void Waiter::learn(nanoseconds waited) noexcept {
  if (!learns()) {
    return;
  }
  const nanoseconds cap = kSpinMaxIdle;
  if (waited <= cap) {
    if (waited > spin_ / 2) {
      // Not std::min, whose reference to `cap` GCC 12 took for a dangling one (-O3).
      spin_ = spin_ * 2 < cap ? spin_ * 2 : cap;
    }
  } else {
    spin_ = std::max(nanoseconds(kSpinMin), spin_ / 2);
  }
  options_ = plan_wait(policy_, shape_, loaded_, spin_);
}

}  // namespace lockstep::detail
