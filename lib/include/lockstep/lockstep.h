/* lockstep's C API: the same job membership and barrier as lockstep::State, for C and for
 * foreign-function interfaces (Python's ctypes, ...). Compiles as C89 and later, and as C++ of any
 * standard. */
#ifndef LOCKSTEP_LOCKSTEP_H
#define LOCKSTEP_LOCKSTEP_H

#include <stddef.h> /* NOLINT(modernize-deprecated-headers): a C header */
#include <stdint.h> /* NOLINT(modernize-deprecated-headers): a C header */

#if defined(LOCKSTEP_BUILDING) || defined(LOCKSTEP_STATIC)
#define LOCKSTEP_C_API __attribute__((visibility("default")))
#else
#define LOCKSTEP_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* What a call returned. Every failing call also sets a one-line message for the calling thread,
 * read with lockstep_last_error(). */
/* NOLINTNEXTLINE(modernize-use-using): this header is C */
typedef enum lockstep_status {
  LOCKSTEP_OK = 0,
  LOCKSTEP_ERROR = 1,            /* any other lockstep::Error */
  LOCKSTEP_TIMEOUT = 2,          /* lockstep::TimeoutError */
  LOCKSTEP_PEER_LOST = 3,        /* lockstep::PeerLostError */
  LOCKSTEP_CONFIG_ERROR = 4,     /* lockstep::ConfigError */
  LOCKSTEP_SYSTEM_ERROR = 5,     /* lockstep::SystemError */
  LOCKSTEP_INVALID_ARGUMENT = 6, /* a null pointer or a negative timeout */
  LOCKSTEP_INTERRUPTED = 7       /* lockstep::InterruptedError (see lockstep_set_interrupt_fd) */
} lockstep_status;

/* A handle to this process's membership in the job (a lockstep::State). */
/* NOLINTNEXTLINE(modernize-use-using): this header is C */
typedef struct lockstep_state lockstep_state;

/* Joins the job the environment describes (blocking until the node's processes have joined) and
 * stores a new handle in *out; every handle of a process shares one membership. */
LOCKSTEP_C_API lockstep_status lockstep_state_create(lockstep_state** out);
/* Releases a handle (the process leaves the job at exit, not here). Null is ignored. */
LOCKSTEP_C_API void lockstep_state_destroy(lockstep_state* state);

/* Queries; -1 (or 0 for the is_ ones) for a null handle. */
LOCKSTEP_C_API int lockstep_process_index(const lockstep_state* state);
LOCKSTEP_C_API int lockstep_local_process_index(const lockstep_state* state);
LOCKSTEP_C_API int lockstep_num_processes(const lockstep_state* state);
LOCKSTEP_C_API int lockstep_num_local_processes(const lockstep_state* state);
LOCKSTEP_C_API int lockstep_node_index(const lockstep_state* state);
LOCKSTEP_C_API int lockstep_num_nodes(const lockstep_state* state);
LOCKSTEP_C_API int lockstep_is_main_process(const lockstep_state* state);
LOCKSTEP_C_API int lockstep_is_local_main_process(const lockstep_state* state);
LOCKSTEP_C_API int lockstep_is_last_process(const lockstep_state* state);
/* 1 when the job has more than one process (Accelerate's use_distributed). */
LOCKSTEP_C_API int lockstep_use_distributed(const lockstep_state* state);
/* Leaves the job now (State::leave; Python's destroy_process_group): the others' waits that need
 * this process fail naming it, and later calls of this process fail. */
LOCKSTEP_C_API lockstep_status lockstep_leave(lockstep_state* state);

/* Returns once every process of the job has called it (see State::wait_for_everyone). */
LOCKSTEP_C_API lockstep_status lockstep_wait_for_everyone(lockstep_state* state);
/* As above; LOCKSTEP_TIMEOUT when the others have not all arrived within `timeout_ms`
 * milliseconds (the message names them; on one machine this process's arrival is withdrawn,
 * across machines the job is broken). The rule is State::wait_for_everyone(timeout)'s: 0 fails
 * at once unless everyone already waits, a negative timeout is LOCKSTEP_INVALID_ARGUMENT, one
 * beyond a century means none. */
LOCKSTEP_C_API lockstep_status lockstep_wait_for_everyone_for(lockstep_state* state,
                                                              int64_t timeout_ms);
/* Arrives and waits at most about a millisecond (State::try_wait_for_everyone): LOCKSTEP_OK once
 * every process has arrived; LOCKSTEP_TIMEOUT if they had not, with this process's arrival
 * withdrawn (nothing happened: the next call arrives anew), and across machines at once, without
 * arriving. Never LOCKSTEP_INTERRUPTED: for a binding that arms its signal handling (see
 * lockstep_set_interrupt_fd) only when a wait takes longer. */
LOCKSTEP_C_API lockstep_status lockstep_try_wait_for_everyone(lockstep_state* state);

/* Main computes, everyone uses (State::broadcast): process 0 passes `data` (`size` bytes, any
 * size that memory allows); every process receives a copy of those bytes in `*out` (allocated by
 * lockstep, freed with lockstep_free; null when there are none) and their number in `*out_size`.
 * The others' `data` is ignored (null with size 0 will do). Every process must call it, as
 * lockstep_wait_for_everyone, which it implies. Bytes that /dev/shm cannot hold (full):
 * LOCKSTEP_ERROR on every process, naming why. */
LOCKSTEP_C_API lockstep_status lockstep_broadcast(lockstep_state* state, const void* data,
                                                  size_t size, void** out, size_t* out_size);
/* Frees what lockstep_broadcast or lockstep_gather_object returned (null: nothing). */
LOCKSTEP_C_API void lockstep_free(void* buffer);
/* Everyone's results, everywhere (State::gather_object): each process passes `data` (`size`
 * bytes, any size that memory allows); every process receives every process's bytes one after
 * another, by process index, in `*out` (allocated by lockstep, freed with lockstep_free; null
 * when there are none), and each one's size in `out_sizes` (an array of `out_sizes_count`
 * entries, at least lockstep_num_processes, or LOCKSTEP_INVALID_ARGUMENT before anything is
 * done). Every process must call it, as lockstep_wait_for_everyone, which it implies. A process
 * whose bytes /dev/shm cannot hold (full): LOCKSTEP_ERROR on every process, naming it and why. */
LOCKSTEP_C_API lockstep_status lockstep_gather_object(lockstep_state* state, const void* data,
                                                      size_t size, void** out, size_t* out_sizes,
                                                      size_t out_sizes_count);
/* lockstep_broadcast and lockstep_gather_object read where the bytes lie, without a copy
 * (State::broadcast_in_place, State::gather_object_in_place): `each` is called on this process's
 * thread, before the call returns, with `context`, a process index and that process's bytes
 * (valid during the call only; null when there are none): once with the main process's
 * (broadcast), or once for every process, in no particular order (gather). For a reader that
 * decodes the bytes anyway (Python's gather_object unpickles them in place). A process's large
 * bytes go to windows of shared memory that it keeps mapped until it leaves the job (at most
 * 12 MiB; see State::gather_object_in_place). `each` must not call lockstep with this state;
 * the others wait for it to return. */
/* NOLINTNEXTLINE(modernize-use-using): this header is C */
typedef void (*lockstep_bytes_fn)(void* context, int process_index, const void* bytes, size_t size);
LOCKSTEP_C_API lockstep_status lockstep_broadcast_in_place(lockstep_state* state, const void* data,
                                                           size_t size, lockstep_bytes_fn each,
                                                           void* context);
LOCKSTEP_C_API lockstep_status lockstep_gather_object_in_place(lockstep_state* state,
                                                               const void* data, size_t size,
                                                               lockstep_bytes_fn each,
                                                               void* context);
/* Stop everyone when one says so (State::set_trigger, State::check_trigger): set marks this
 * process; check, which every process calls at the same point, sets `*out_triggered` to 1 on
 * every process when any process set its mark since its last check (and clears every mark),
 * else 0. */
LOCKSTEP_C_API lockstep_status lockstep_set_trigger(lockstep_state* state);
LOCKSTEP_C_API lockstep_status lockstep_check_trigger(lockstep_state* state, int* out_triggered);

/* Stream-ordered (see State::wait_for_everyone(cudaStream_t)): `cuda_stream` is a cudaStream_t
 * (null: the legacy default stream). LOCKSTEP_CONFIG_ERROR when lockstep was built without CUDA. */
LOCKSTEP_C_API lockstep_status lockstep_wait_for_everyone_on_stream(lockstep_state* state,
                                                                    void* cuda_stream);
/* As above, with State::wait_for_everyone(stream, timeout)'s rule (flags mode): when this
 * process's stream has not passed the barrier `timeout_ms` after the stream reached it (not after
 * the call: its own backlog before the barrier never counts against its own timeout), the
 * streams are released and every later call returns LOCKSTEP_TIMEOUT. Other processes' timed
 * calls count from their own streams' arrival, so this stream's backlog beyond their timeout
 * fails the job through them. Negative: LOCKSTEP_INVALID_ARGUMENT. */
LOCKSTEP_C_API lockstep_status lockstep_wait_for_everyone_on_stream_for(lockstep_state* state,
                                                                        void* cuda_stream,
                                                                        int64_t timeout_ms);
/* 1 when a failure released this node's GPU streams (State::gpu_barrier_released()), else 0. */
LOCKSTEP_C_API int lockstep_gpu_barrier_released(const lockstep_state* state);
/* The CUDA device this process should use (State::device()); -1 without one. */
LOCKSTEP_C_API int lockstep_device(const lockstep_state* state);

/* Where the job's description came from: "lockstep-run", "torchrun", "openmpi", "mpich",
 * "slurm" or "none" ("" for a null handle); valid while the handle lives. */
LOCKSTEP_C_API const char* lockstep_environment_source(const lockstep_state* state);
/* The wait policy this process uses: "adaptive", "spin" or "block" ("" for a null handle). */
LOCKSTEP_C_API const char* lockstep_wait_policy(const lockstep_state* state);
/* The cross-node backends this build has, comma-separated in order of preference ("ucx,nccl"),
 * "" when it has none. */
LOCKSTEP_C_API const char* lockstep_available_backends(void);
/* This process's contiguous share of `size` items, [*begin, *end): the first size % n processes
 * take one more (Accelerate's split_between_processes, over indices). *padding (when not null):
 * how many copies of the last item make the share as long as the longest. */
LOCKSTEP_C_API lockstep_status lockstep_split_between_processes(const lockstep_state* state,
                                                                int64_t size, int64_t* begin,
                                                                int64_t* end, int64_t* padding);
/* The same share for any process of any job size, with no state (no communication): the one rule
 * that lockstep_split_between_processes, C++'s split_range and Python's split_range use.
 * LOCKSTEP_INVALID_ARGUMENT unless 0 <= process_index < num_processes. */
LOCKSTEP_C_API lockstep_status lockstep_split_range(uint64_t size, int num_processes,
                                                    int process_index, uint64_t* begin,
                                                    uint64_t* end, uint64_t* padding);
/* main_process_first as a pair: the main process returns from _begin at once and the others
 * wait in it until the main process has called _end (local_: each node's main process first).
 * Every process calls both, once each, in order. Blocks nest to any depth, of either kind (a
 * local block inside a global one, as TRL prepares a per-machine cache): the handle keeps a
 * stack of open blocks, and an _end must end the innermost one (LOCKSTEP_INVALID_ARGUMENT
 * otherwise, naming both places, or when no block is open). As in C++, the main process's _begin
 * fails at once when the job is broken (a lost peer). After LOCKSTEP_INTERRUPTED either call may
 * be made again. */
LOCKSTEP_C_API lockstep_status lockstep_main_process_first_begin(lockstep_state* state);
LOCKSTEP_C_API lockstep_status lockstep_main_process_first_end(lockstep_state* state);
LOCKSTEP_C_API lockstep_status lockstep_local_main_process_first_begin(lockstep_state* state);
LOCKSTEP_C_API lockstep_status lockstep_local_main_process_first_end(lockstep_state* state);
/* Makes the process's waits interruptible: while `fd` is readable (the read end of a signal
 * handler's self-pipe, such as the one Python's signal.set_wakeup_fd writes to), every wait and
 * join gives up with LOCKSTEP_INTERRUPTED, within 100 ms of the byte's arrival (at once when the
 * signal interrupts a sleep). The caller drains the descriptor. An interrupted wait on one machine
 * withdraws the process's arrival, as a timeout does, so the call can be made again; a node's main
 * process interrupted while it waits for the other machines ends the job. -1 turns it off (the
 * default: waits resume after a signal handler returns). Returns the previous descriptor. */
LOCKSTEP_C_API int lockstep_set_interrupt_fd(int fd);
/* The message of the last failing call on this thread ("" if none). Valid until the thread's
 * next failing call. */
LOCKSTEP_C_API const char* lockstep_last_error(void);
/* A name for `status`, such as "LOCKSTEP_TIMEOUT". */
LOCKSTEP_C_API const char* lockstep_status_name(lockstep_status status);
/* The library's version, such as "0.1.0". */
LOCKSTEP_C_API const char* lockstep_version(void);

/* Call sites. Each call that meets the others has an _at form taking the caller's file, line and
 * function, which the call records in this process's slot of the node's segment: the messages of
 * a wait that lasts or fails then say where each process is (State's std::source_location).
 * `file` and `function` are read during the call only (the library keeps its own copy of each
 * site, known by its text; a string literal, as LOCKSTEP_HERE gives, is then known by its
 * address, at no cost). A null `file` records an unknown site, as the plain functions do. */
LOCKSTEP_C_API lockstep_status lockstep_state_create_at(lockstep_state** out, const char* file,
                                                        int line, const char* function);
LOCKSTEP_C_API lockstep_status lockstep_wait_for_everyone_at(lockstep_state* state,
                                                             const char* file, int line,
                                                             const char* function);
LOCKSTEP_C_API lockstep_status lockstep_wait_for_everyone_for_at(lockstep_state* state,
                                                                 int64_t timeout_ms,
                                                                 const char* file, int line,
                                                                 const char* function);
LOCKSTEP_C_API lockstep_status lockstep_try_wait_for_everyone_at(lockstep_state* state,
                                                                 const char* file, int line,
                                                                 const char* function);
LOCKSTEP_C_API lockstep_status lockstep_broadcast_at(lockstep_state* state, const void* data,
                                                     size_t size, void** out, size_t* out_size,
                                                     const char* file, int line,
                                                     const char* function);
LOCKSTEP_C_API lockstep_status lockstep_gather_object_at(lockstep_state* state, const void* data,
                                                         size_t size, void** out, size_t* out_sizes,
                                                         size_t out_sizes_count, const char* file,
                                                         int line, const char* function);
LOCKSTEP_C_API lockstep_status lockstep_broadcast_in_place_at(lockstep_state* state,
                                                              const void* data, size_t size,
                                                              lockstep_bytes_fn each, void* context,
                                                              const char* file, int line,
                                                              const char* function);
LOCKSTEP_C_API lockstep_status lockstep_gather_object_in_place_at(lockstep_state* state,
                                                                  const void* data, size_t size,
                                                                  lockstep_bytes_fn each,
                                                                  void* context, const char* file,
                                                                  int line, const char* function);
LOCKSTEP_C_API lockstep_status lockstep_check_trigger_at(lockstep_state* state, int* out_triggered,
                                                         const char* file, int line,
                                                         const char* function);
LOCKSTEP_C_API lockstep_status lockstep_wait_for_everyone_on_stream_at(lockstep_state* state,
                                                                       void* cuda_stream,
                                                                       const char* file, int line,
                                                                       const char* function);
LOCKSTEP_C_API lockstep_status lockstep_wait_for_everyone_on_stream_for_at(
    lockstep_state* state, void* cuda_stream, int64_t timeout_ms, const char* file, int line,
    const char* function);
LOCKSTEP_C_API lockstep_status lockstep_main_process_first_begin_at(lockstep_state* state,
                                                                    const char* file, int line,
                                                                    const char* function);
LOCKSTEP_C_API lockstep_status lockstep_main_process_first_end_at(lockstep_state* state,
                                                                  const char* file, int line,
                                                                  const char* function);
LOCKSTEP_C_API lockstep_status lockstep_local_main_process_first_begin_at(lockstep_state* state,
                                                                          const char* file,
                                                                          int line,
                                                                          const char* function);
LOCKSTEP_C_API lockstep_status lockstep_local_main_process_first_end_at(lockstep_state* state,
                                                                        const char* file, int line,
                                                                        const char* function);

#ifdef __cplusplus
}
#endif

/* Unless LOCKSTEP_NO_SITE_MACROS is defined, each plain name above is also a macro that passes the
 * caller's __FILE__, __LINE__ and function to its _at form, so that `lockstep_wait_for_everyone(s)`
 * records where it was called. The functions stay: `(lockstep_wait_for_everyone)(s)` and a
 * pointer to one call them, recording an unknown site. */
#ifndef LOCKSTEP_NO_SITE_MACROS
/* NOLINTBEGIN(cppcoreguidelines-macro-usage,bugprone-macro-parentheses): a C header's macros */
#if defined(__cplusplus) || (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L)
#define LOCKSTEP_FUNCTION_NAME __func__
#else
#define LOCKSTEP_FUNCTION_NAME ((const char*)0) /* C89 has no __func__ */
#endif
#define LOCKSTEP_HERE __FILE__, __LINE__, LOCKSTEP_FUNCTION_NAME
#define lockstep_state_create(out) lockstep_state_create_at((out), LOCKSTEP_HERE)
#define lockstep_wait_for_everyone(state) lockstep_wait_for_everyone_at((state), LOCKSTEP_HERE)
#define lockstep_wait_for_everyone_for(state, timeout_ms) \
  lockstep_wait_for_everyone_for_at((state), (timeout_ms), LOCKSTEP_HERE)
#define lockstep_try_wait_for_everyone(state) \
  lockstep_try_wait_for_everyone_at((state), LOCKSTEP_HERE)
#define lockstep_broadcast(state, data, size, out, out_size) \
  lockstep_broadcast_at((state), (data), (size), (out), (out_size), LOCKSTEP_HERE)
#define lockstep_gather_object(state, data, size, out, out_sizes, out_sizes_count)          \
  lockstep_gather_object_at((state), (data), (size), (out), (out_sizes), (out_sizes_count), \
                            LOCKSTEP_HERE)
#define lockstep_broadcast_in_place(state, data, size, each, context) \
  lockstep_broadcast_in_place_at((state), (data), (size), (each), (context), LOCKSTEP_HERE)
#define lockstep_gather_object_in_place(state, data, size, each, context) \
  lockstep_gather_object_in_place_at((state), (data), (size), (each), (context), LOCKSTEP_HERE)
#define lockstep_check_trigger(state, out_triggered) \
  lockstep_check_trigger_at((state), (out_triggered), LOCKSTEP_HERE)
#define lockstep_wait_for_everyone_on_stream(state, cuda_stream) \
  lockstep_wait_for_everyone_on_stream_at((state), (cuda_stream), LOCKSTEP_HERE)
#define lockstep_wait_for_everyone_on_stream_for(state, cuda_stream, timeout_ms) \
  lockstep_wait_for_everyone_on_stream_for_at((state), (cuda_stream), (timeout_ms), LOCKSTEP_HERE)
#define lockstep_main_process_first_begin(state) \
  lockstep_main_process_first_begin_at((state), LOCKSTEP_HERE)
#define lockstep_main_process_first_end(state) \
  lockstep_main_process_first_end_at((state), LOCKSTEP_HERE)
#define lockstep_local_main_process_first_begin(state) \
  lockstep_local_main_process_first_begin_at((state), LOCKSTEP_HERE)
#define lockstep_local_main_process_first_end(state) \
  lockstep_local_main_process_first_end_at((state), LOCKSTEP_HERE)
/* NOLINTEND(cppcoreguidelines-macro-usage,bugprone-macro-parentheses) */
#endif

#endif /* LOCKSTEP_LOCKSTEP_H */
