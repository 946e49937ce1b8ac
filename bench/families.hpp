// The barrier families the bench compares, each usable by ranks.hpp's fork_ranks (internal to
// bench/): `Family f(ranks)` in the parent before fork, then in each child `f.attach(rank)`,
// `f.wait(rank)` per episode, `f.detach(rank)`.
//
//   LockstepFamily      lockstep::State::wait_for_everyone(), one wait policy
//   PthreadFamily       pthread_barrier_t, PTHREAD_PROCESS_SHARED
//   BoostFamily         interprocess_mutex + interprocess_condition in a Boost segment
//   PingPongFamily      one cache line passed back and forth between two ranks (the floor)
//   CounterFloorFamily  the node barrier's counter alone, without the library's code
//   YieldPingPongFamily one CPU passed back and forth between two ranks by sched_yield (the
//                       floor of a barrier whose processes outnumber the CPUs)
#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <boost/interprocess/managed_shared_memory.hpp>
#include <boost/interprocess/sync/interprocess_condition.hpp>
#include <boost/interprocess/sync/interprocess_mutex.hpp>
#include <boost/interprocess/sync/scoped_lock.hpp>
#include <cstdint>
#include <lockstep/lockstep.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ranks.hpp"
#include "waiting/line_claim.hpp"  // lib/src: claim_line, as the node barrier claims

namespace lockstep::bench {

namespace bip = boost::interprocess;

// A name no other run of this process has used (the job id, a Boost segment's name).
inline std::string fresh_id(const char* family) {
  static int counter = 0;
  return std::string("bench-") + family + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter++);
}

// lockstep::State::wait_for_everyone() under one wait policy, each rank joining as a process of
// a job that lockstep-run started would.
class LockstepFamily {
 public:
  LockstepFamily(int ranks, lockstep::WaitPolicy policy)
      : ranks_(ranks), policy_(policy), id_(fresh_id(wait_policy_name(policy))) {}
  void attach(int rank) {
    set_job_environment(id_, rank, ranks_, policy_);
    state_.emplace();
  }
  void wait(int /*rank*/) { state_->wait_for_everyone(); }
  void detach(int /*rank*/) {}

 private:
  int ranks_;
  lockstep::WaitPolicy policy_;
  std::string id_;
  std::optional<lockstep::State> state_;
};

// One T's memory, shared with the ranks forked after (throws when mmap fails).
template <class T>
T* shared_object() {
  auto* memory = shared_array<T>(1);
  if (memory == nullptr) {
    throw std::runtime_error("mmap failed");
  }
  return memory;
}

class PthreadFamily {
 public:
  explicit PthreadFamily(int ranks) : barrier_(shared_object<pthread_barrier_t>()) {
    pthread_barrierattr_t attr;
    pthread_barrierattr_init(&attr);
    pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(barrier_, &attr, static_cast<unsigned>(ranks));
    pthread_barrierattr_destroy(&attr);
  }
  void attach(int /*rank*/) {}
  void wait(int /*rank*/) { pthread_barrier_wait(barrier_); }
  void detach(int /*rank*/) {}

 private:
  pthread_barrier_t* barrier_;
};

// The barrier a Boost user writes (Boost 1.74 ships no interprocess barrier): a generation
// count under an interprocess_mutex, waiters on an interprocess_condition.
struct BoostBarrier {
  explicit BoostBarrier(int n) : ranks(n) {}
  void wait() {
    bip::scoped_lock<bip::interprocess_mutex> lock(mutex);
    const unsigned my_generation = generation;
    if (++arrived == ranks) {
      arrived = 0;
      ++generation;
      condition.notify_all();
      return;
    }
    condition.wait(lock, [&] { return generation != my_generation; });
  }
  bip::interprocess_mutex mutex;
  bip::interprocess_condition condition;
  int ranks;
  int arrived = 0;
  unsigned generation = 0;
};

class BoostFamily {
 public:
  explicit BoostFamily(int ranks) : name_(fresh_id("boost")) {
    bip::permissions owner_only;
    owner_only.set_permissions(0600);
    segment_.emplace(bip::create_only, name_.c_str(), 65536, nullptr, owner_only);
    barrier_ = segment_->construct<BoostBarrier>("barrier")(ranks);
  }
  ~BoostFamily() {
    segment_.reset();
    bip::shared_memory_object::remove(name_.c_str());
  }
  BoostFamily(const BoostFamily&) = delete;
  BoostFamily& operator=(const BoostFamily&) = delete;
  void attach(int /*rank*/) {}
  void wait(int /*rank*/) { barrier_->wait(); }
  void detach(int /*rank*/) {}

 private:
  std::string name_;
  std::optional<bip::managed_shared_memory> segment_;
  BoostBarrier* barrier_ = nullptr;
};

// One cache line passed back and forth between two ranks: rank 0 writes an odd value, rank 1
// answers with the next even one, each polling the line (with `Relax` between polls) until it
// sees the other's. One episode is one round trip.
template <void (*Relax)()>
class LinePingPong {
 public:
  explicit LinePingPong(int /*ranks*/) : line_(shared_object<Line>()) {}
  void attach(int /*rank*/) {}
  void wait(int rank) {
    // Acquire/release: each side reads what the other published; nothing else is shared.
    if (rank == 0) {
      std::uint64_t next = ++sent_ * 2 - 1;
      line_->value.store(next, std::memory_order_release);
      while (line_->value.load(std::memory_order_acquire) != next + 1) {
        Relax();
      }
    } else {
      std::uint64_t want = ++sent_ * 2 - 1;
      while (line_->value.load(std::memory_order_acquire) != want) {
        Relax();
      }
      line_->value.store(want + 1, std::memory_order_release);
    }
  }
  void detach(int /*rank*/) {}

 private:
  struct alignas(64) Line {
    std::atomic<std::uint64_t> value;
  };
  Line* line_;
  std::uint64_t sent_ = 0;
};

inline void cpu_pause() {
  __builtin_ia32_pause();
}
inline void cpu_yield() {
  ::sched_yield();
}

// The hardware floor: one round trip of one cache line between two cores.
using PingPongFamily = LinePingPong<cpu_pause>;

// The floor with more processes than CPUs: both ranks on one CPU (the first this process may
// use), each yielding the CPU until it sees the other's value. One episode is one round trip of
// the CPU: two context switches. Each CPU of a barrier whose N processes share C CPUs must pass
// between its N/C processes at least N/C - 1 times an episode (each must arrive; the last to
// arrive on a CPU completes an episode and arrives at the next before it gives the CPU up).
class YieldPingPongFamily : public LinePingPong<cpu_yield> {
 public:
  explicit YieldPingPongFamily(int ranks) : LinePingPong(ranks) {
    const std::vector<int> cpus = usable_cpus();
    cpu_ = cpus.empty() ? 0 : cpus.front();
  }
  void attach(int /*rank*/) const {
    if (!pin_to(cpu_)) {
      throw std::runtime_error("sched_setaffinity failed");
    }
  }

 private:
  int cpu_ = 0;
};

// The node barrier's protocol with none of the library's code around it: one counter that each
// rank's arrival increments, episode e complete at (e + 1) * ranks, a waiter polling it (with
// `pause`) and asking for the line in the state its next arrival writes (PREFETCHW, as the node
// barrier at N = 2). What lockstep costs beyond it is its own code: the calls, the checks, the
// call log. Spins: ranks 2 only, on two CPUs.
class CounterFloorFamily {
 public:
  explicit CounterFloorFamily(int ranks)
      : ranks_(static_cast<std::uint64_t>(ranks)), line_(shared_object<Line>()) {}
  void attach(int /*rank*/) {}
  void wait(int /*rank*/) {
    const std::uint64_t full = ++episodes_ * ranks_;
    // seq_cst, as the node barrier's arrival; acquire polls read every arrival before the last.
    if (line_->count.fetch_add(1, std::memory_order_seq_cst) + 1 == full) {
      return;
    }
    for (;;) {
      if (claims_) {
        lockstep::detail::claim_line(&line_->count);
      }
      if (line_->count.load(std::memory_order_acquire) >= full) {
        return;
      }
      cpu_pause();
    }
  }
  void detach(int /*rank*/) {}

 private:
  struct alignas(64) Line {
    std::atomic<std::uint64_t> count;
  };
  std::uint64_t ranks_;
  Line* line_;
  bool claims_ = lockstep::detail::can_claim_lines();
  std::uint64_t episodes_ = 0;
};

}  // namespace lockstep::bench
