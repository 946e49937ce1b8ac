#include <chrono>
#include <cstdlib>
#include <exception>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

// The plain names are this file's functions, not the header's macros (which call the _at forms).
#define LOCKSTEP_NO_SITE_MACROS
#include "api/c_handle.hpp"
#include "engine/spill.hpp"  // prefault
#include "lockstep/version.hpp"
#include "waiting/wait_controls.hpp"

namespace lockstep::detail::capi {
namespace {
thread_local std::string last_error;
}  // namespace

lockstep_status fail(lockstep_status status, const char* message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    // Out of memory for the message: the status still says what failed.
  }
  return status;
}

const char* last_error_text() noexcept {
  return last_error.c_str();
}

}  // namespace lockstep::detail::capi

using lockstep::detail::capi::fail;
using lockstep::detail::capi::guarded;
using lockstep::detail::capi::site_of;

namespace {

// A buffer the C caller frees with lockstep_free (malloc's); null for 0 bytes. Its pages are
// faulted in at once (a copy into new memory faults them a page at a time otherwise).
class MallocBuffer {
 public:
  explicit MallocBuffer(std::size_t size)
      // NOLINTNEXTLINE(cppcoreguidelines-no-malloc): the C caller frees it
      : bytes_(static_cast<std::byte*>(size == 0 ? nullptr : std::malloc(size))) {
    if (size != 0 && bytes_ == nullptr) {
      throw std::bad_alloc();
    }
    lockstep::detail::prefault(bytes_, size);
  }
  ~MallocBuffer() { std::free(bytes_); }  // NOLINT(cppcoreguidelines-no-malloc)
  MallocBuffer(const MallocBuffer&) = delete;
  MallocBuffer& operator=(const MallocBuffer&) = delete;
  MallocBuffer& operator=(MallocBuffer&& other) noexcept {
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  MallocBuffer(MallocBuffer&& other) noexcept : bytes_(std::exchange(other.bytes_, nullptr)) {}
  [[nodiscard]] std::byte* get() const noexcept { return bytes_; }
  std::byte* release() noexcept { return std::exchange(bytes_, nullptr); }

 private:
  std::byte* bytes_;
};

template <class Query>
int query(const lockstep_state* state, Query query, int if_null) noexcept {
  return state == nullptr ? if_null : query(state->state);
}

// A timed wait's call: the state and the timeout checked first (`name` is the C function's).
template <class Call>
lockstep_status timed(lockstep_state* state, int64_t timeout_ms, const char* name, Call call) {
  if (state == nullptr) {
    return fail(LOCKSTEP_INVALID_ARGUMENT, (std::string(name) + ": state is null").c_str());
  }
  if (timeout_ms < 0) {
    return fail(LOCKSTEP_INVALID_ARGUMENT,
                (std::string(name) + ": timeout_ms " + std::to_string(timeout_ms) + " is negative")
                    .c_str());
  }
  return guarded(call);
}

}  // namespace

extern "C" {

lockstep_status lockstep_state_create(lockstep_state** out) {
  return lockstep_state_create_at(out, nullptr, 0, nullptr);
}

lockstep_status lockstep_state_create_at(lockstep_state** out, const char* file, int line,
                                         const char* function) {
  if (out == nullptr) {
    return fail(LOCKSTEP_INVALID_ARGUMENT, "lockstep_state_create: out is null");
  }
  *out = nullptr;
  return guarded([&] { *out = new lockstep_state(site_of(file, line, function)); });
}

void lockstep_state_destroy(lockstep_state* state) {
  delete state;
}

int lockstep_process_index(const lockstep_state* state) {
  return query(
      state, [](const lockstep::State& s) { return s.process_index(); }, -1);
}
int lockstep_local_process_index(const lockstep_state* state) {
  return query(
      state, [](const lockstep::State& s) { return s.local_process_index(); }, -1);
}
int lockstep_num_processes(const lockstep_state* state) {
  return query(
      state, [](const lockstep::State& s) { return s.num_processes(); }, -1);
}
int lockstep_num_local_processes(const lockstep_state* state) {
  return query(
      state, [](const lockstep::State& s) { return s.num_local_processes(); }, -1);
}
int lockstep_node_index(const lockstep_state* state) {
  return query(
      state, [](const lockstep::State& s) { return s.node_index(); }, -1);
}
int lockstep_num_nodes(const lockstep_state* state) {
  return query(
      state, [](const lockstep::State& s) { return s.num_nodes(); }, -1);
}
int lockstep_is_main_process(const lockstep_state* state) {
  return query(
      state, [](const lockstep::State& s) { return s.is_main_process() ? 1 : 0; }, 0);
}
int lockstep_is_local_main_process(const lockstep_state* state) {
  return query(
      state, [](const lockstep::State& s) { return s.is_local_main_process() ? 1 : 0; }, 0);
}
int lockstep_is_last_process(const lockstep_state* state) {
  return query(
      state, [](const lockstep::State& s) { return s.is_last_process() ? 1 : 0; }, 0);
}

lockstep_status lockstep_wait_for_everyone(lockstep_state* state) {
  return lockstep_wait_for_everyone_at(state, nullptr, 0, nullptr);
}

lockstep_status lockstep_wait_for_everyone_at(lockstep_state* state, const char* file, int line,
                                              const char* function) {
  if (state == nullptr) {
    return fail(LOCKSTEP_INVALID_ARGUMENT, "lockstep_wait_for_everyone: state is null");
  }
  return guarded([&] { state->state.wait_for_everyone(site_of(file, line, function)); });
}

lockstep_status lockstep_try_wait_for_everyone(lockstep_state* state) {
  return lockstep_try_wait_for_everyone_at(state, nullptr, 0, nullptr);
}

lockstep_status lockstep_try_wait_for_everyone_at(lockstep_state* state, const char* file, int line,
                                                  const char* function) {
  if (state == nullptr) {
    return fail(LOCKSTEP_INVALID_ARGUMENT, "lockstep_try_wait_for_everyone: state is null");
  }
  bool done = false;
  const lockstep_status status =
      guarded([&] { done = state->state.try_wait_for_everyone(site_of(file, line, function)); });
  if (status == LOCKSTEP_OK && !done) {
    return fail(LOCKSTEP_TIMEOUT,
                "lockstep_try_wait_for_everyone: not every process had arrived within about a "
                "millisecond (this process's arrival was withdrawn; across machines none is made)");
  }
  return status;
}

lockstep_status lockstep_wait_for_everyone_for(lockstep_state* state, int64_t timeout_ms) {
  return lockstep_wait_for_everyone_for_at(state, timeout_ms, nullptr, 0, nullptr);
}

lockstep_status lockstep_wait_for_everyone_for_at(lockstep_state* state, int64_t timeout_ms,
                                                  const char* file, int line,
                                                  const char* function) {
  return timed(state, timeout_ms, "lockstep_wait_for_everyone_for", [&] {
    state->state.wait_for_everyone(std::chrono::milliseconds(timeout_ms),
                                   site_of(file, line, function));
  });
}

lockstep_status lockstep_broadcast(lockstep_state* state, const void* data, size_t size, void** out,
                                   size_t* out_size) {
  return lockstep_broadcast_at(state, data, size, out, out_size, nullptr, 0, nullptr);
}

lockstep_status lockstep_broadcast_at(lockstep_state* state, const void* data, size_t size,
                                      void** out, size_t* out_size, const char* file, int line,
                                      const char* function) {
  if (state == nullptr || out == nullptr || out_size == nullptr || (data == nullptr && size != 0)) {
    return fail(LOCKSTEP_INVALID_ARGUMENT,
                "lockstep_broadcast: state, out and out_size must not be null, nor data when size "
                "is not 0");
  }
  *out = nullptr;
  *out_size = 0;
  MallocBuffer copy(0);
  std::size_t copied = 0;
  const lockstep_status status = guarded([&] {
    state->state.broadcast_into(
        std::span(static_cast<const std::byte*>(data), size),
        [&](std::size_t bytes) {
          copy = MallocBuffer(bytes);
          copied = bytes;
          return copy.get();
        },
        site_of(file, line, function));
  });
  if (status == LOCKSTEP_OK) {  // what a failed call copied is freed here, not handed out
    *out = copy.release();
    *out_size = copied;
  }
  return status;
}

void lockstep_free(void* buffer) {
  std::free(buffer);  // NOLINT(cppcoreguidelines-no-malloc): lockstep_broadcast's malloc
}

lockstep_status lockstep_gather_object(lockstep_state* state, const void* data, size_t size,
                                       void** out, size_t* out_sizes, size_t out_sizes_count) {
  return lockstep_gather_object_at(state, data, size, out, out_sizes, out_sizes_count, nullptr, 0,
                                   nullptr);
}

lockstep_status lockstep_gather_object_at(lockstep_state* state, const void* data, size_t size,
                                          void** out, size_t* out_sizes, size_t out_sizes_count,
                                          const char* file, int line, const char* function) {
  if (state == nullptr || out == nullptr || out_sizes == nullptr ||
      (data == nullptr && size != 0)) {
    return fail(LOCKSTEP_INVALID_ARGUMENT,
                "lockstep_gather_object: state, out and out_sizes must not be null, nor data when "
                "size is not 0");
  }
  const auto processes = static_cast<std::size_t>(state->state.num_processes());
  if (out_sizes_count < processes) {
    const std::string message = "lockstep_gather_object: out_sizes has room for " +
                                std::to_string(out_sizes_count) + " sizes; the job has " +
                                std::to_string(processes) + " processes";
    return fail(LOCKSTEP_INVALID_ARGUMENT, message.c_str());
  }
  *out = nullptr;
  MallocBuffer copy(0);
  const lockstep_status status = guarded([&] {
    state->state.gather_object_into(
        std::span(static_cast<const std::byte*>(data), size),
        [&](std::span<const std::size_t> sizes) {
          std::size_t total = 0;
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            out_sizes[i] = sizes[i];
            total += sizes[i];
          }
          copy = MallocBuffer(total);
          return copy.get();
        },
        site_of(file, line, function));
  });
  if (status == LOCKSTEP_OK) {
    *out = copy.release();
  }
  return status;
}

lockstep_status lockstep_broadcast_in_place(lockstep_state* state, const void* data, size_t size,
                                            lockstep_bytes_fn each, void* context) {
  return lockstep_broadcast_in_place_at(state, data, size, each, context, nullptr, 0, nullptr);
}

lockstep_status lockstep_broadcast_in_place_at(lockstep_state* state, const void* data, size_t size,
                                               lockstep_bytes_fn each, void* context,
                                               const char* file, int line, const char* function) {
  if (state == nullptr || each == nullptr || (data == nullptr && size != 0)) {
    return fail(LOCKSTEP_INVALID_ARGUMENT,
                "lockstep_broadcast_in_place: state and each must not be null, nor data when size "
                "is not 0");
  }
  return guarded([&] {
    state->state.broadcast_in_place(
        std::span(static_cast<const std::byte*>(data), size),
        [&](std::span<const std::byte> bytes) {
          each(context, 0, bytes.empty() ? nullptr : bytes.data(), bytes.size());
        },
        site_of(file, line, function));
  });
}

lockstep_status lockstep_gather_object_in_place(lockstep_state* state, const void* data,
                                                size_t size, lockstep_bytes_fn each,
                                                void* context) {
  return lockstep_gather_object_in_place_at(state, data, size, each, context, nullptr, 0, nullptr);
}

lockstep_status lockstep_gather_object_in_place_at(lockstep_state* state, const void* data,
                                                   size_t size, lockstep_bytes_fn each,
                                                   void* context, const char* file, int line,
                                                   const char* function) {
  if (state == nullptr || each == nullptr || (data == nullptr && size != 0)) {
    return fail(LOCKSTEP_INVALID_ARGUMENT,
                "lockstep_gather_object_in_place: state and each must not be null, nor data when "
                "size is not 0");
  }
  return guarded([&] {
    state->state.gather_object_in_place(
        std::span(static_cast<const std::byte*>(data), size),
        [&](int rank, std::span<const std::byte> bytes) {
          each(context, rank, bytes.empty() ? nullptr : bytes.data(), bytes.size());
        },
        site_of(file, line, function));
  });
}

lockstep_status lockstep_set_trigger(lockstep_state* state) {
  if (state == nullptr) {
    return fail(LOCKSTEP_INVALID_ARGUMENT, "lockstep_set_trigger: state must not be null");
  }
  state->state.set_trigger();
  return LOCKSTEP_OK;
}

lockstep_status lockstep_check_trigger(lockstep_state* state, int* out_triggered) {
  return lockstep_check_trigger_at(state, out_triggered, nullptr, 0, nullptr);
}

lockstep_status lockstep_check_trigger_at(lockstep_state* state, int* out_triggered,
                                          const char* file, int line, const char* function) {
  if (state == nullptr || out_triggered == nullptr) {
    return fail(LOCKSTEP_INVALID_ARGUMENT,
                "lockstep_check_trigger: state and out_triggered must not be null");
  }
  *out_triggered = 0;
  return guarded(
      [&] { *out_triggered = state->state.check_trigger(site_of(file, line, function)) ? 1 : 0; });
}

lockstep_status lockstep_wait_for_everyone_on_stream(lockstep_state* state, void* cuda_stream) {
  return lockstep_wait_for_everyone_on_stream_at(state, cuda_stream, nullptr, 0, nullptr);
}

lockstep_status lockstep_wait_for_everyone_on_stream_at(lockstep_state* state, void* cuda_stream,
                                                        const char* file, int line,
                                                        const char* function) {
  if (state == nullptr) {
    return fail(LOCKSTEP_INVALID_ARGUMENT, "lockstep_wait_for_everyone_on_stream: state is null");
  }
  return guarded([&] {
    state->state.wait_for_everyone(static_cast<CUstream_st*>(cuda_stream),
                                   site_of(file, line, function));
  });
}

lockstep_status lockstep_wait_for_everyone_on_stream_for(lockstep_state* state, void* cuda_stream,
                                                         int64_t timeout_ms) {
  return lockstep_wait_for_everyone_on_stream_for_at(state, cuda_stream, timeout_ms, nullptr, 0,
                                                     nullptr);
}

lockstep_status lockstep_wait_for_everyone_on_stream_for_at(lockstep_state* state,
                                                            void* cuda_stream, int64_t timeout_ms,
                                                            const char* file, int line,
                                                            const char* function) {
  return timed(state, timeout_ms, "lockstep_wait_for_everyone_on_stream_for", [&] {
    state->state.wait_for_everyone(static_cast<CUstream_st*>(cuda_stream),
                                   std::chrono::milliseconds(timeout_ms),
                                   site_of(file, line, function));
  });
}

int lockstep_gpu_barrier_released(const lockstep_state* state) {
  return state != nullptr && state->state.gpu_barrier_released() ? 1 : 0;
}

int lockstep_use_distributed(const lockstep_state* state) {
  return query(
      state, [](const lockstep::State& s) { return s.use_distributed() ? 1 : 0; }, 0);
}

lockstep_status lockstep_leave(lockstep_state* state) {
  if (state == nullptr) {
    return fail(LOCKSTEP_INVALID_ARGUMENT, "lockstep_leave: state is null");
  }
  return guarded([&] { state->state.leave(); });
}

int lockstep_device(const lockstep_state* state) {
  return state == nullptr ? -1 : state->state.device();
}

const char* lockstep_environment_source(const lockstep_state* state) {
  return state == nullptr ? "" : state->source.c_str();
}

const char* lockstep_wait_policy(const lockstep_state* state) {
  if (state == nullptr) {
    return "";
  }
  return lockstep::wait_policy_name(state->state.wait_policy());
}

const char* lockstep_available_backends(void) {
  static const std::string names = [] {
    std::string out;
    try {
      for (const auto& name : lockstep::available_backends()) {
        out += (out.empty() ? "" : ",") + name;
      }
    } catch (...) {
      // (out of memory) an empty list
    }
    return out;
  }();
  return names.c_str();
}

lockstep_status lockstep_split_between_processes(const lockstep_state* state, int64_t size,
                                                 int64_t* begin, int64_t* end, int64_t* padding) {
  if (state == nullptr || begin == nullptr || end == nullptr) {
    return fail(LOCKSTEP_INVALID_ARGUMENT,
                "lockstep_split_between_processes: state, begin or end is null");
  }
  if (size < 0) {
    return fail(LOCKSTEP_INVALID_ARGUMENT,
                ("lockstep_split_between_processes: size " + std::to_string(size) + " is negative")
                    .c_str());
  }
  return guarded([&] {
    const lockstep::Share share = lockstep::split_range(
        static_cast<std::size_t>(size), state->state.num_processes(), state->state.process_index());
    *begin = static_cast<int64_t>(share.begin);
    *end = static_cast<int64_t>(share.end);
    if (padding != nullptr) {
      *padding = static_cast<int64_t>(share.padding);
    }
  });
}

lockstep_status lockstep_split_range(uint64_t size, int num_processes, int process_index,
                                     uint64_t* begin, uint64_t* end, uint64_t* padding) {
  if (begin == nullptr || end == nullptr || num_processes < 1 || process_index < 0 ||
      process_index >= num_processes) {
    return fail(LOCKSTEP_INVALID_ARGUMENT,
                ("lockstep_split_range: no share for process " + std::to_string(process_index) +
                 " of " + std::to_string(num_processes) + " (or begin or end is null)")
                    .c_str());
  }
  return guarded([&] {
    const lockstep::Share share = lockstep::split_range(size, num_processes, process_index);
    *begin = share.begin;
    *end = share.end;
    if (padding != nullptr) {
      *padding = share.padding;
    }
  });
}

const char* lockstep_last_error(void) {
  return lockstep::detail::capi::last_error_text();
}

const char* lockstep_status_name(lockstep_status status) {
  switch (status) {
    case LOCKSTEP_OK:
      return "LOCKSTEP_OK";
    case LOCKSTEP_ERROR:
      return "LOCKSTEP_ERROR";
    case LOCKSTEP_TIMEOUT:
      return "LOCKSTEP_TIMEOUT";
    case LOCKSTEP_PEER_LOST:
      return "LOCKSTEP_PEER_LOST";
    case LOCKSTEP_CONFIG_ERROR:
      return "LOCKSTEP_CONFIG_ERROR";
    case LOCKSTEP_SYSTEM_ERROR:
      return "LOCKSTEP_SYSTEM_ERROR";
    case LOCKSTEP_INVALID_ARGUMENT:
      return "LOCKSTEP_INVALID_ARGUMENT";
    case LOCKSTEP_INTERRUPTED:
      return "LOCKSTEP_INTERRUPTED";
  }
  return "LOCKSTEP_UNKNOWN_STATUS";
}

int lockstep_set_interrupt_fd(int fd) {
  return lockstep::detail::set_interrupt_fd(fd);
}

const char* lockstep_version(void) {
  return LOCKSTEP_VERSION_STRING;
}

}  // extern "C"
