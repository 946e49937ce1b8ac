// The NCCL backend: the node leaders' barrier as a one-element all-reduce on the GPU.
#include <dlfcn.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "base/dynamic_library.hpp"
#include "base/function_ref.hpp"
#include "gpu/cuda_driver.hpp"
#include "gpu/devices.hpp"  // visible_device
#include "lockstep/error.hpp"
#include "membership/backend.hpp"

namespace lockstep::detail {
namespace {

// After the node's poll window, a waiting leader sleeps this long between polls of the GPU.
constexpr auto kPollSleep = std::chrono::microseconds(50);

// The NCCL entry points, from libnccl.so.2 opened at run time: a build with the NCCL backend
// neither needs NCCL installed nor loads it unless a job selects the backend.
struct Nccl {
  void* library = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
};

void bind(void* library, const char* name, auto& function) {
  bind_symbol(library, name, function, "the NCCL library (2.14 or later is needed)");
}

Nccl load_nccl() {
  Nccl nccl;
  std::string tried;
  const char* chosen = std::getenv("LOCKSTEP_NCCL_LIBRARY");  // NOLINT(concurrency-mt-unsafe)
  for (const char* path : {chosen, "libnccl.so.2", LOCKSTEP_NCCL_DEFAULT_PATH}) {
    if (path == nullptr) {
      continue;
    }
    nccl.library = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (nccl.library != nullptr) {
      break;
    }
    tried += std::string(tried.empty() ? "" : "; ") + ::dlerror();  // NOLINT(concurrency-mt-unsafe)
    if (path == chosen) {
      break;  // the user's choice, and only it
    }
  }
  if (nccl.library == nullptr) {
    throw ConfigError("lockstep: the NCCL backend cannot load NCCL (" + tried +
                      "): install it, or set LOCKSTEP_NCCL_LIBRARY to libnccl.so.2's path");
  }
  bind(nccl.library, "ncclGetUniqueId", nccl.get_unique_id);
  bind(nccl.library, "ncclCommInitRankConfig", nccl.init_rank_config);
  bind(nccl.library, "ncclCommGetAsyncError", nccl.get_async_error);
  bind(nccl.library, "ncclCommAbort", nccl.abort);
  bind(nccl.library, "ncclCommDestroy", nccl.destroy);
  bind(nccl.library, "ncclAllReduce", nccl.all_reduce);
  bind(nccl.library, "ncclGetErrorString", nccl.error_string);
  bind(nccl.library, "ncclGetLastError", nccl.last_error);
  return nccl;
}

class NcclBackend final : public Backend {
 public:
  NcclBackend(const LeaderConfig& config, std::unique_ptr<Bootstrap> bootstrap);
  ~NcclBackend() override;
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  [[nodiscard]] const char* name() const noexcept override { return "nccl"; }
  [[nodiscard]] const std::vector<NodeInfo>& nodes() const noexcept override {
    return bootstrap_->nodes();
  }
  void barrier(std::optional<Clock::time_point> deadline, const char* what) override;
  // Through the bootstrap (UCX's large-message path: NCCL moves device memory, and these bytes
  // are the host's).
  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> part,
                                                std::optional<Clock::time_point> deadline,
                                                const char* what) override {
    try {
      return bootstrap_->allgather(part, deadline, what);
    } catch (const Error&) {
      abort_communicator();
      throw;
    }
  }
  std::vector<std::byte> share(std::span<const std::byte> data,
                               std::optional<Clock::time_point> deadline,
                               const char* what) override {
    try {
      return bootstrap_->share(data, deadline, what);
    } catch (const Error&) {
      abort_communicator();
      throw;
    }
  }
  void abort(const Failure& failure) noexcept override;
  // The bootstrap's question (UCX's places desk).
  [[nodiscard]] std::optional<NodePlaces> places(const std::vector<int>& nodes) const override {
    return bootstrap_->places(nodes);
  }

 private:
  // "; on node 1, ...": where the other nodes' processes are (NCCL cannot tell which is late).
  [[nodiscard]] std::string others_places() const {
    return places_text(*this, nodes_but(*this, config_.job.node_index));
  }
  // Polls `done` until it is true; on the deadline, an NCCL error or a failure the bootstrap
  // reports, aborts the communicator (so that nothing waits on it again) and throws.
  // (A FunctionRef: one wait's machine code for every caller, base/function_ref.hpp.)
  void wait_until(FunctionRef<bool()> done, std::optional<Clock::time_point> deadline,
                  const char* what, const char* doing);
  [[noreturn]] void fail(const Failure& failure, const char* what);
  void abort_communicator() noexcept;
  void set_up(const char* what);

  LeaderConfig config_;
  std::unique_ptr<Bootstrap> bootstrap_;
  Nccl nccl_;
  ncclComm_t comm_ = nullptr;  // null once aborted
  const cuda::Driver* cuda_ = nullptr;
  CUstream stream_ = nullptr;
  int* buffer_ = nullptr;  // one int in device memory
};

NcclBackend::NcclBackend(const LeaderConfig& config, std::unique_ptr<Bootstrap> bootstrap)
    : config_(config), bootstrap_(std::move(bootstrap)) {
  const char* what = "lockstep: joining the job (NCCL backend)";
  try {
    set_up(what);
  } catch (const Error& error) {
    // Tell the other leaders why, rather than leaving them to find this one's connections gone.
    Failure failure = failure_of(error, what);
    failure.message = "node " + std::to_string(config.job.node_index) + ": " + failure.message;
    bootstrap_->abort(failure);
    throw;
  }
}

void NcclBackend::set_up(const char* what) {
  const LeaderConfig& config = config_;
  nccl_ = load_nccl();
  const int device = visible_device(0);
  if (device < 0) {
    std::string why;
    (void)visible_device_count(why);
    throw ConfigError(std::string(what) + ": node " + std::to_string(config.job.node_index) +
                      " has no CUDA device (" + why +
                      "): the NCCL backend needs one GPU per node's main process");
  }
  // What cudaSetDevice does: the device's primary context, current on this thread.
  cuda_ = &cuda::driver(what);
  // cuMemAlloc, and NCCL's own calls, on the user's thread: see RelaxedCapture.
  const cuda::RelaxedCapture relaxed(*cuda_);
  CUdevice handle = 0;
  CUcontext context = nullptr;
  cuda::check(*cuda_, cuda_->device_get(&handle, device), what, "cuDeviceGet");
  cuda::check(*cuda_, cuda_->device_primary_ctx_retain(&context, handle), what,
              "cuDevicePrimaryCtxRetain");
  cuda::check(*cuda_, cuda_->ctx_set_current(context), what, "cuCtxSetCurrent");
  cuda::check(*cuda_, cuda_->stream_create(&stream_, CU_STREAM_NON_BLOCKING), what,
              "cuStreamCreate");
  CUdeviceptr buffer = 0;
  cuda::check(*cuda_, cuda_->mem_alloc(&buffer, sizeof(int)), what, "cuMemAlloc");
  buffer_ = reinterpret_cast<int*>(buffer);  // NOLINT(performance-no-int-to-ptr): device memory

  ncclUniqueId id{};
  if (config.job.node_index == 0) {
    if (ncclResult_t rc = nccl_.get_unique_id(&id); rc != ncclSuccess) {
      throw Error(std::string(what) + ": ncclGetUniqueId failed: " + nccl_.error_string(rc));
    }
  }
  auto blob = bootstrap_->broadcast(std::as_bytes(std::span(&id, 1)), config.deadline, what);
  if (blob.size() != sizeof id) {
    throw Error(std::string(what) + ": node 0 sent an NCCL id of " + std::to_string(blob.size()) +
                " bytes, not " + std::to_string(sizeof id));
  }
  std::memcpy(&id, blob.data(), sizeof id);

  ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
  nccl_config.blocking = 0;  // every wait is polled, so that nothing can hang
  ncclResult_t rc =
      nccl_.init_rank_config(&comm_, config.job.num_nodes, id, config.job.node_index, &nccl_config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    throw Error(std::string(what) + ": ncclCommInitRankConfig failed: " + nccl_.error_string(rc) +
                " (" + nccl_.last_error(comm_) + ")");
  }
  wait_until(
      [&] {
        ncclResult_t state = ncclSuccess;
        nccl_.get_async_error(comm_, &state);
        if (state != ncclSuccess && state != ncclInProgress) {
          throw Error(std::string(what) + ": creating the NCCL communicator failed: " +
                      nccl_.error_string(state) + " (" + nccl_.last_error(comm_) + ")");
        }
        return state == ncclSuccess;
      },
      config.deadline, what, "creating the NCCL communicator");
}

NcclBackend::~NcclBackend() {
  // Destroying waits for the peers; a broken job's communicator was aborted instead (every
  // failure aborts it: fail(), wait_until and abort()).
  if (comm_ != nullptr) {
    nccl_.destroy(comm_);
  }
  // The stream and buffer go with the process: at exit the CUDA runtime may already be gone.
}

void NcclBackend::abort_communicator() noexcept {
  if (comm_ != nullptr) {
    nccl_.abort(comm_);
    comm_ = nullptr;
  }
}

void NcclBackend::fail(const Failure& failure, const char* what) {
  abort_communicator();
  bootstrap_->abort(failure);
  throw_failure(failure, std::string(what) + ": ");
}

void NcclBackend::wait_until(FunctionRef<bool()> done, std::optional<Clock::time_point> deadline,
                             const char* what, const char* doing) {
  // NCCL as a place to wait: polling asks NCCL and the bootstrap (a dead or aborting leader:
  // NCCL alone would wait for ever); blocking sleeps kPollSleep, since a GPU has nothing to
  // sleep on here.
  // Out of line, each call: see WaitSite (waiting/waiter.hpp).
  struct Site : WaitSite {
    NcclBackend& backend;
    FunctionRef<bool()>& ready;
    const char* what;
    [[gnu::noinline]] bool done() {
      try {
        // An abort received wins over a completion (see Backend::check_aborted).
        backend.bootstrap_->check_aborted(what);
        if (ready()) {
          return true;
        }
        backend.check_cancelled(what);
        backend.bootstrap_->poll(what);
      } catch (const Error&) {
        backend.abort_communicator();
        throw;
      }
      return false;
    }
    [[gnu::noinline]] static void block(std::chrono::nanoseconds limit) {
      std::this_thread::sleep_for(std::clamp<std::chrono::nanoseconds>(limit, {}, kPollSleep));
    }
    [[gnu::noinline]] void stalled(std::chrono::nanoseconds waited) const noexcept {
      // NCCL does not say which rank it waits for: the line says what is waited on.
      try {
        say_stalled(backend.config_.job.rank, what, waited,
                    std::string("the other machines, ") + doing +
                        " (NCCL cannot tell which node is late)" + backend.others_places());
      } catch (...) {
        // Out of memory for a diagnostic: the wait goes on without it.
      }
    }
    const char* doing;
  } site{{}, *this, done, what, doing};
  const Waiter::End end = config_.waiter->wait(site, deadline, kPollSleep);
  if (end == Waiter::End::interrupted) {
    abort_communicator();
    throw InterruptedError(std::string(what) + ": interrupted by a signal");
  }
  if (end == Waiter::End::timed_out) {
    fail(Failure{FailureKind::timeout,
                 -1,
                 {},
                 std::string("timed out ") + doing + " (NCCL cannot tell which node is late)" +
                     others_places()},
         what);
  }
}

void NcclBackend::barrier(std::optional<Clock::time_point> deadline, const char* what) {
  const cuda::RelaxedCapture relaxed(*cuda_);  // NCCL's calls and the query: see RelaxedCapture
  ncclResult_t rc = nccl_.all_reduce(buffer_, buffer_, 1, ncclInt32, ncclSum, comm_, stream_);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    fail(Failure{FailureKind::error,
                 -1,
                 {},
                 std::string("ncclAllReduce failed: ") + nccl_.error_string(rc) + " (" +
                     nccl_.last_error(comm_) + ")"},
         what);
  }
  wait_until(
      [&] {
        ncclResult_t state = ncclSuccess;
        nccl_.get_async_error(comm_, &state);
        if (state != ncclSuccess && state != ncclInProgress) {
          fail(Failure{FailureKind::error,
                       -1,
                       {},
                       std::string("the NCCL all-reduce failed: ") + nccl_.error_string(state) +
                           " (" + nccl_.last_error(comm_) + ")"},
               what);
        }
        const CUresult status = cuda_->stream_query(stream_);
        if (status != CUDA_SUCCESS && status != CUDA_ERROR_NOT_READY) {
          fail(Failure{FailureKind::error,
                       -1,
                       {},
                       "the NCCL stream failed: " + cuda::describe(*cuda_, status)},
               what);
        }
        return state == ncclSuccess && status == CUDA_SUCCESS;
      },
      deadline, what, "in the NCCL all-reduce");
}

void NcclBackend::abort(const Failure& failure) noexcept {
  abort_communicator();
  bootstrap_->abort(failure);
}

std::unique_ptr<Backend> make_nccl(const LeaderConfig& config,
                                   std::unique_ptr<Bootstrap> bootstrap) {
  return std::make_unique<NcclBackend>(config, std::move(bootstrap));
}

}  // namespace

// Given a bootstrap (which carries NCCL's unique id from node 0 and reports dead leaders), opens
// libnccl.so.2 (LOCKSTEP_NCCL_LIBRARY, else the loader's path, else the CUDA toolkit's), makes
// visible_device(0) current and creates a communicator of one rank per node. Every NCCL call that
// can wait is polled against the deadline and the bootstrap's failure reports; on either, the
// communicator is aborted (ncclCommAbort), never waited on.
extern constinit const BackendType nccl_backend_type{"nccl", &make_nccl, nullptr, true};

}  // namespace lockstep::detail
