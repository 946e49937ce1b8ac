// The cross-node backend interface and registry (internal).
//
// A job that spans nodes is hierarchical: the processes of each node meet in the node segment,
// and only each node's main process (its leader, local index 0) talks to the other nodes,
// through a Backend. Backends live in backends/<name>/, one folder each, and register
// themselves: each defines a BackendType, and backends/meson.build lists the ones found at
// configure time (meson -D<name>=auto|enabled|disabled) in a generated registry. A single-node job
// creates none.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/failure_record.hpp"
#include "base/function_ref.hpp"
#include "job/job_config.hpp"
#include "waiting/waiter.hpp"

namespace lockstep::detail {

using Clock = std::chrono::steady_clock;

// One node of the job, as its leader described it when it joined.
struct NodeInfo {
  int node = 0;
  std::vector<int> ranks;  // the node's processes (ascending); ranks[0] leads it
};

// What a leader brings to the backend's join.
struct LeaderConfig {
  JobConfig job;
  std::vector<int> ranks;      // this node's processes
  Waiter* waiter;              // how this process waits (outlives the backend)
  Clock::time_point deadline;  // for joining
  // Where this node's processes are: this node's answer when another leader asks
  // (LeaderLinks::places), engine/whereabouts.hpp's Whereabouts::now. Any thread may call it
  // while the links live. Empty: this node does not answer.
  std::function<std::string()> places;
};

// What other machines' leaders told of where their processes are (LeaderLinks::places).
struct NodePlaces {
  std::map<int, std::string> told;  // by node: each leader's LeaderConfig::places, as it wrote it
  std::chrono::milliseconds waited{0};  // how long the question waited for the others
};

// What the leaders of a job share, whatever carries it: the nodes, exchanges of bytes, word of
// a node that gave up, and where each machine's processes are. A Backend adds the barrier; a
// Bootstrap (the links a backend with its own communicator is set up through) adds node 0's
// broadcast and progress. One object may be both (UCX's): this is their one base.
class LeaderLinks {
 public:
  LeaderLinks() = default;
  virtual ~LeaderLinks() = default;
  LeaderLinks(const LeaderLinks&) = delete;
  LeaderLinks& operator=(const LeaderLinks&) = delete;

  // Every node of the job, by node index (known once the links are made).
  [[nodiscard]] virtual const std::vector<NodeInfo>& nodes() const noexcept = 0;
  // Every leader passes its `part` (any size that memory allows, empty where it has nothing to
  // give) and returns every leader's, by node index (its own included), once they have all
  // arrived: the exchanges' way between machines, for bytes of any size (the backend's
  // large-message path, in chunks). Throws as Backend::barrier does, and Error when a leader's
  // part is not what it said or cannot be held.
  virtual std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> part,
                                                        std::optional<Clock::time_point> deadline,
                                                        const char* what) = 0;
  // As allgather, but only node 0's leader gives: it passes `data` and returns once it has left;
  // every other leader (whose `data` is ignored) returns node 0's. One exchange of the same
  // numbering as allgather's.
  virtual std::vector<std::byte> share(std::span<const std::byte> data,
                                       std::optional<Clock::time_point> deadline,
                                       const char* what) = 0;
  // Tells the other leaders that this node cannot go on: their waits throw `failure`. Best
  // effort, never throws.
  virtual void abort(const Failure& failure) noexcept = 0;
  // Asks the leaders of `nodes` where their processes are, waiting about a second at most for
  // the answers: what they told (a node that did not answer is missing); nullopt where these
  // links cannot ask. Any thread.
  [[nodiscard]] virtual std::optional<NodePlaces> places(const std::vector<int>& nodes) const {
    (void)nodes;
    return std::nullopt;
  }
};

// A backend: the leaders' barrier. Implementations need not remember their failures: Leaders
// does (below), and no call reaches a backend after one of its calls has thrown.
class Backend : public virtual LeaderLinks {
 public:
  [[nodiscard]] virtual const char* name() const noexcept = 0;
  // Waits until every leader has called barrier() as often as this one. Throws TimeoutError
  // naming the processes of the nodes not heard from when `deadline` passes (and tells the
  // others), PeerLostError when a leader is gone, Error when a leader aborted.
  virtual void barrier(std::optional<Clock::time_point> deadline, const char* what) = 0;
  // Makes a barrier() that another thread waits in end within the backend's sleep slice, and
  // every later one at once, with Error (the process leaves the job, or gives up on it, while
  // its GPU relay thread waits for the other nodes). Any thread; abort() still sends.
  void cancel() noexcept { cancelled_.store(true, std::memory_order_relaxed); }

 protected:
  // Throws Error if cancel() was called (a backend's waits ask between their polls).
  void check_cancelled(const char* what) const;

 private:
  std::atomic<bool> cancelled_{false};
};

// What a backend that builds its own communicator is given to set it up (UCC's out-of-band
// exchange; NCCL's unique id travels through one): node 0's broadcast to the leaders, and word
// of leaders that are gone or gave up while the other communicator waits.
class Bootstrap : public virtual LeaderLinks {
 public:
  static constexpr std::size_t kMaxBlob = 4096;
  // How many broadcasts a leader keeps that it has not yet asked for: node 0 must not get further
  // ahead of the others (a later one breaks the job on that leader: its next call throws, naming
  // both numbers).
  static constexpr int kMaxAhead = 16;

  // Node 0's leader passes `blob` (at most kMaxBlob bytes) and returns at once; every leader
  // returns it.
  virtual std::vector<std::byte> broadcast(std::span<const std::byte> blob,
                                           std::optional<Clock::time_point> deadline,
                                           const char* what) = 0;
  // Makes progress on the transport; throws as Backend::barrier would if a leader is gone or
  // aborted.
  virtual void poll(const char* what) = 0;
  // Throws if another leader's abort has been received (no progress, no system call). Asked
  // before an operation of the other communicator is taken as complete: once a node has received
  // the job's abort, none of its processes completes the episode.
  virtual void check_aborted(const char* what) = 0;
};

// "; on node 1, process 3 is not in a lockstep call: ...": where the processes of `nodes` are,
// as their leaders tell `links` (LeaderLinks::places; the text is the whereabouts room's); empty
// where the links cannot ask or `nodes` is empty.
[[nodiscard]] std::string places_text(const LeaderLinks& links, const std::vector<int>& nodes);
// Every node of `links` but `me`.
[[nodiscard]] std::vector<int> nodes_but(const LeaderLinks& links, int me);

// A backend type, as backends/<name>/<name>_backend.cpp defines it.
struct BackendType {
  const char* name;
  // Joins the other leaders. `bootstrap` is given (made by the first built type that can make
  // one) exactly when needs_bootstrap.
  std::unique_ptr<Backend> (*make)(const LeaderConfig& config,
                                   std::unique_ptr<Bootstrap> bootstrap);
  // Joins the other leaders as another backend's bootstrap; null when this type cannot.
  std::unique_ptr<Bootstrap> (*make_bootstrap)(const LeaderConfig& config);
  bool needs_bootstrap;
};

// The node's link to the other leaders: a backend, and the latch that keeps it broken once one of
// its calls has failed (an episode cannot be taken back): every later barrier() throws the same
// failure. Context and the tests use backends through this alone.
// The leader's use of its backend. Two threads may use it (the caller's, and across nodes in
// flags mode the GPU relay's: gpu/flag_barrier.hpp), one at a time: each call holds a mutex.
class Leaders {
 public:
  explicit Leaders(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {}

  [[nodiscard]] const char* name() const noexcept { return backend_->name(); }
  [[nodiscard]] const std::vector<NodeInfo>& nodes() const noexcept { return backend_->nodes(); }
  void barrier(std::optional<Clock::time_point> deadline, const char* what);
  // Backend::allgather and Backend::share.
  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> part,
                                                std::optional<Clock::time_point> deadline,
                                                const char* what);
  std::vector<std::byte> share(std::span<const std::byte> data,
                               std::optional<Clock::time_point> deadline, const char* what);
  // Best effort, never throws; broken afterwards. If another thread's barrier holds the backend,
  // that barrier is cancelled (it ends within a sleep slice) and the failure is sent after it.
  void abort(const Failure& failure) noexcept;
  // As abort, but only if no other thread's call holds the backend now; false (nothing done)
  // if one does.
  bool try_abort(const Failure& failure) noexcept;
  // Backend::cancel: a barrier another thread waits in ends soon with Error, as every later call.
  void cancel() noexcept { backend_->cancel(); }

 private:
  // `call`'s outcome, the backend held (mutex_); throws the job's failure if an earlier call
  // failed, and keeps this one's if it throws.
  template <class Call>
  auto latched(const char* what, Call call);
  void abort_locked(const Failure& failure) noexcept;

  std::unique_ptr<Backend> backend_;
  std::mutex mutex_;  // held by each call (the backend is used by one thread at a time)
  std::optional<Failure> broken_;
};

// The backends this build has, in order of preference (their names: built_backends(),
// job/job_config.hpp).
std::span<const BackendType* const> built_backend_types();

// Throws ConfigError unless this build has a backend for `job` (the one LOCKSTEP_BACKEND names, or
// any). Every process of a multi-node job checks this, not only the leaders.
void check_backend_built(const JobConfig& job);

// Makes the backend `config.job.backend` names (the first built when empty) and joins the other
// leaders through it. ConfigError when none is built or the named one is not.
std::unique_ptr<Leaders> join_leaders(const LeaderConfig& config);
// Joins the other leaders as a bootstrap, through the first built type that can be one.
std::unique_ptr<Bootstrap> make_bootstrap(const LeaderConfig& config);

}  // namespace lockstep::detail
