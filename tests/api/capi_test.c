/* The C API from C, run under lockstep-run: `capi_test` checks queries, the barrier, a timeout
 * that names the missing process, and argument errors. Exits non-zero naming the failed check. */
#include <lockstep/lockstep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(condition)                                                                   \
  do {                                                                                     \
    if (!(condition)) {                                                                    \
      fprintf(stderr, "capi_test: line %d: check failed: %s (last error: %s)\n", __LINE__, \
              #condition, lockstep_last_error());                                          \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

/* What lockstep_gather_object_in_place and lockstep_broadcast_in_place gave: calls by process
 * index, and how many of them had that process's 1 MiB of its letter. */
struct seen {
  int calls[64];
  int whole[64];
  int other;
};

static void see(void* context, int process_index, const void* bytes, size_t size) {
  struct seen* seen = context;
  const char* at = bytes;
  size_t k = 0;
  int whole = size == (size_t)1 << 20;
  if (process_index < 0 || process_index >= 64) {
    ++seen->other;
    return;
  }
  for (k = 0; whole && k < size; ++k) {
    whole = at[k] == 'a' + process_index;
  }
  ++seen->calls[process_index];
  seen->whole[process_index] += whole;
}

int main(void) {
  lockstep_state* state = NULL;
  int common_line = 0;
  CHECK(lockstep_state_create(NULL) == LOCKSTEP_INVALID_ARGUMENT);
  CHECK(strstr(lockstep_last_error(), "out is null") != NULL);
  CHECK(lockstep_state_create(&state) == LOCKSTEP_OK);
  const int rank = lockstep_process_index(state);
  const int n = lockstep_num_processes(state);
  CHECK(n >= 2);
  CHECK(rank >= 0 && rank < n);
  CHECK(lockstep_local_process_index(state) == rank);
  CHECK(lockstep_num_local_processes(state) == n);
  CHECK(lockstep_node_index(state) == 0 && lockstep_num_nodes(state) == 1);
  CHECK(lockstep_is_main_process(state) == (rank == 0));
  CHECK(lockstep_is_local_main_process(state) == (rank == 0));
  CHECK(lockstep_is_last_process(state) == (rank == n - 1));
  CHECK(lockstep_process_index(NULL) == -1);
  CHECK(lockstep_wait_for_everyone(NULL) == LOCKSTEP_INVALID_ARGUMENT);
  CHECK(lockstep_wait_for_everyone_for(state, -5) == LOCKSTEP_INVALID_ARGUMENT);
  CHECK(strstr(lockstep_last_error(), "-5 is negative") != NULL);
  CHECK(strcmp(lockstep_status_name(LOCKSTEP_PEER_LOST), "LOCKSTEP_PEER_LOST") == 0);
  {
    /* Main computes, everyone uses: the main process's bytes on every process. */
    const char seed[] = "seed=42";
    void* got = NULL;
    size_t size = 0;
    CHECK(lockstep_broadcast(state, NULL, 3, &got, &size) == LOCKSTEP_INVALID_ARGUMENT);
    CHECK(lockstep_broadcast(state, rank == 0 ? seed : "other", rank == 0 ? sizeof seed : 5, &got,
                             &size) == LOCKSTEP_OK);
    CHECK(size == sizeof seed && got != NULL && memcmp(got, seed, sizeof seed) == 0);
    lockstep_free(got);
    CHECK(lockstep_broadcast(state, NULL, 0, &got, &size) == LOCKSTEP_OK);
    CHECK(size == 0 && got == NULL);
  }
  {
    /* Everyone's results, everywhere: process r gives r + 1 bytes of 'a' + r. */
    char mine[64];
    size_t sizes[64];
    char* all = NULL;
    size_t at = 0;
    int i = 0;
    int triggered = -1;
    CHECK(n <= 64);
    memset(mine, 'a' + rank, sizeof mine);
    CHECK(lockstep_gather_object(state, mine, (size_t)rank + 1, (void**)&all, sizes, 1) ==
          LOCKSTEP_INVALID_ARGUMENT);
    CHECK(strstr(lockstep_last_error(), "room for 1 sizes") != NULL);
    CHECK(lockstep_gather_object(state, mine, (size_t)rank + 1, (void**)&all, sizes, 64) ==
          LOCKSTEP_OK);
    for (i = 0; i < n; ++i) {
      CHECK(sizes[i] == (size_t)i + 1);
      CHECK(all != NULL && all[at] == 'a' + i && all[at + sizes[i] - 1] == 'a' + i);
      at += sizes[i];
    }
    lockstep_free(all);
    /* Any size (issue 58): 200,000 bytes each, past the segment's area, through spills. */
    {
      const size_t big = 200000;
      char* given = malloc(big);
      CHECK(given != NULL);
      memset(given, 'A' + rank, big);
      CHECK(lockstep_gather_object(state, given, big, (void**)&all, sizes, 64) == LOCKSTEP_OK);
      for (i = 0; i < n; ++i) {
        CHECK(sizes[i] == big && all[(size_t)i * big] == 'A' + i &&
              all[(size_t)i * big + big - 1] == 'A' + i);
      }
      lockstep_free(all);
      /* Read in place: each process's bytes once, where they lie (1 MiB each: mapped from
       * spills); a null `each` is refused. */
      {
        const size_t large = (size_t)1 << 20;
        struct seen seen = {{0}, {0}, 0};
        char* bigger = realloc(given, large);
        CHECK(bigger != NULL);
        given = bigger;
        memset(given, 'a' + rank, large);
        CHECK(lockstep_gather_object_in_place(state, given, large, NULL, NULL) ==
              LOCKSTEP_INVALID_ARGUMENT);
        CHECK(lockstep_gather_object_in_place(state, given, large, see, &seen) == LOCKSTEP_OK);
        for (i = 0; i < n; ++i) {
          CHECK(seen.calls[i] == 1 && seen.whole[i] == 1);
        }
        CHECK(lockstep_broadcast_in_place(state, given, large, see, &seen) == LOCKSTEP_OK);
        CHECK(seen.calls[0] == 2 && seen.whole[0] == 2 && seen.other == 0);
      }
      free(given);
    }
    /* Stop everyone when one says so. */
    if (rank == n - 1) {
      CHECK(lockstep_set_trigger(state) == LOCKSTEP_OK);
    }
    CHECK(lockstep_check_trigger(state, &triggered) == LOCKSTEP_OK && triggered == 1);
    CHECK(lockstep_check_trigger(state, &triggered) == LOCKSTEP_OK && triggered == 0);
  }
  CHECK(strlen(lockstep_version()) > 0);

  /* What the job is: the launcher, the policy, the backends. */
  CHECK(strcmp(lockstep_environment_source(state), "lockstep-run") == 0);
  CHECK(strcmp(lockstep_environment_source(NULL), "") == 0);
  CHECK(strcmp(lockstep_wait_policy(state), "adaptive") == 0 ||
        strcmp(lockstep_wait_policy(state), "spin") == 0 ||
        strcmp(lockstep_wait_policy(state), "block") == 0);
  CHECK(lockstep_available_backends() != NULL);

  /* split_between_processes over indices: this process's share of 10 * n + 1 items. */
  {
    int64_t begin = -1;
    int64_t end = -1;
    int64_t padding = -1;
    const int64_t size = 10 * (int64_t)n + 1;
    CHECK(lockstep_split_between_processes(state, size, &begin, &end, &padding) == LOCKSTEP_OK);
    CHECK(begin == 10 * (int64_t)rank + (rank > 0 ? 1 : 0));
    CHECK(end - begin == (rank == 0 ? 11 : 10));
    CHECK(padding == (rank == 0 ? 0 : 1));
    CHECK(lockstep_split_between_processes(state, -1, &begin, &end, NULL) ==
          LOCKSTEP_INVALID_ARGUMENT);
    CHECK(lockstep_split_between_processes(state, 5, NULL, &end, NULL) ==
          LOCKSTEP_INVALID_ARGUMENT);
  }

  /* main_process_first as a pair: the others find the main process's file written. */
  {
    char path[256];
    snprintf(path, sizeof path, "/tmp/lockstep-capi-first-%s", getenv("LOCKSTEP_JOB_ID"));
    CHECK(lockstep_main_process_first_begin(state) == LOCKSTEP_OK);
    /* Blocks nest (a local one inside, as TRL's): the handle keeps a stack of open blocks. */
    CHECK(lockstep_local_main_process_first_begin_at(state, "capi_test.c", 1001, "main") ==
          LOCKSTEP_OK);
    if (rank == 0) {
      usleep(200 * 1000);
      FILE* file = fopen(path, "w");
      CHECK(file != NULL);
      fclose(file);
    } else {
      CHECK(access(path, F_OK) == 0);
    }
    /* An _end that is not the innermost block's: refused, naming both places; nothing ends. */
    CHECK(lockstep_main_process_first_end_at(state, "capi_test.c", 1002, "main") ==
          LOCKSTEP_INVALID_ARGUMENT);
    CHECK(strstr(lockstep_last_error(),
                 "lockstep_main_process_first_end at capi_test.c:1002: "
                 "the innermost open block is a local_main_process_first "
                 "block, begun at capi_test.c:1001") != NULL);
    CHECK(lockstep_local_main_process_first_end(state) == LOCKSTEP_OK);
    CHECK(lockstep_main_process_first_end(state) == LOCKSTEP_OK);
    CHECK(lockstep_main_process_first_end(state) == LOCKSTEP_INVALID_ARGUMENT);
    CHECK(strstr(lockstep_last_error(), "no open block") != NULL);
    CHECK(lockstep_local_main_process_first_begin(state) == LOCKSTEP_OK);
    CHECK(access(path, F_OK) == 0);
    CHECK(lockstep_local_main_process_first_end(state) == LOCKSTEP_OK);
    CHECK(lockstep_wait_for_everyone(state) == LOCKSTEP_OK);
    if (rank == 0) {
      unlink(path);
    }
  }

  CHECK(lockstep_device(NULL) == -1);
  CHECK(lockstep_wait_for_everyone_on_stream(NULL, NULL) == LOCKSTEP_INVALID_ARGUMENT);
  if (lockstep_device(state) < 0) {
    /* No GPU (or no CUDA in this build): the stream form fails on every process, saying so. */
    CHECK(lockstep_wait_for_everyone_on_stream(state, NULL) != LOCKSTEP_OK);
    CHECK(strstr(lockstep_last_error(), "wait_for_everyone(stream)") != NULL);
  }

  for (int round = 0; round < 1000; ++round) {
    CHECK(lockstep_wait_for_everyone(state) == LOCKSTEP_OK);
  }
  /* The try: rank 0 tries until it passes while the others wait, some of them late (20 ms, far
   * beyond the try's bound of about a millisecond); then a try that meets a late process gives up
   * soon, says so, and withdraws its arrival (the episodes stay in step: the timeouts below). */
  CHECK(lockstep_try_wait_for_everyone(NULL) == LOCKSTEP_INVALID_ARGUMENT);
  for (int round = 0; round < 200; ++round) {
    if (rank == 0) {
      lockstep_status status;
      while ((status = lockstep_try_wait_for_everyone(state)) == LOCKSTEP_TIMEOUT) {
      }
      CHECK(status == LOCKSTEP_OK);
    } else {
      if (round % 40 == rank) {
        usleep(20 * 1000);
      }
      CHECK(lockstep_wait_for_everyone(state) == LOCKSTEP_OK);
    }
  }
  if (rank == n - 1) {
    usleep(300 * 1000);
  } else {
    struct timespec before;
    struct timespec after;
    clock_gettime(CLOCK_MONOTONIC, &before);
    CHECK(lockstep_try_wait_for_everyone(state) == LOCKSTEP_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &after);
    const double waited_ms = (double)(after.tv_sec - before.tv_sec) * 1e3 +
                             (double)(after.tv_nsec - before.tv_nsec) / 1e6;
    CHECK(waited_ms < 200);
    CHECK(strstr(lockstep_last_error(), "arrival was withdrawn") != NULL);
  }
  common_line = __LINE__ + 1;
  CHECK(lockstep_wait_for_everyone(state) == LOCKSTEP_OK);

  /* The last process comes late: the others time out, naming it and where it was last (the
   * macro passed this file's line), and carry on. */
  if (rank == n - 1) {
    usleep(800 * 1000);
  } else {
    char expected[64];
    char where[128];
    snprintf(expected, sizeof expected, "process %d of %d had not arrived", n - 1, n);
    snprintf(where, sizeof where,
             "process %d is not in a lockstep call: it returned from wait_for_everyone at "
             "capi_test.c:%d (episode ",
             n - 1, common_line);
    CHECK(lockstep_wait_for_everyone_for(state, 200) == LOCKSTEP_TIMEOUT);
    CHECK(strstr(lockstep_last_error(), expected) != NULL);
    CHECK(strstr(lockstep_last_error(), where) != NULL);
  }
  CHECK(lockstep_wait_for_everyone_for(state, 30000) == LOCKSTEP_OK);
  lockstep_state_destroy(state);
  lockstep_state_destroy(NULL);
  return 0;
}
