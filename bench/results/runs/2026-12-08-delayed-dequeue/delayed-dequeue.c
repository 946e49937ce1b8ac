// Whether the kernel's count of runnable tasks (/proc/loadavg's fourth field) includes a task
// that has gone to sleep. On CPU 0, A spins for ever and B spins `run_ms` then sleeps `sleep_ms`
// (usleep); on CPU 1 this program reads the count every 100 us, 20,000 times, and B measures how
// late its sleeps end (its wake-up waits for A's slice). B is runnable for run_ms plus that
// lateness per cycle; if the count holds B more often than that (with the sampler and A always
// there: 2 tasks, 3 with B), the kernel counts B while it sleeps. With `alone`, A does not run
// (the control: then B has a CPU to itself and blocks with nothing owed).
//   cc -O2 -o delayed-dequeue delayed-dequeue.c && ./delayed-dequeue 1 5 [alone]
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  if (argc != 3 && !(argc == 4 && strcmp(argv[3], "alone") == 0)) {
    fprintf(stderr, "usage: %s RUN_MS SLEEP_MS [alone]\n", argv[0]);
    return 2;
  }
  const double run_ms = atof(argv[1]);
  const double sleep_ms = atof(argv[2]);
  volatile double* late_ms =
      mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  const int alone = argc == 4;
  const pid_t a = fork();
  if (a == 0) {
    pin(0);
    for (;;) {
      if (alone) {
        pause();
      }
    }
  }
  const pid_t b = fork();
  if (b == 0) {
    pin(0);
    double late = 0;
    for (long cycles = 1;; ++cycles) {
      const double start = now();
      while (now() - start < run_ms / 1e3) {
      }
      const double slept = now();
      usleep((useconds_t)(sleep_ms * 1e3));
      late += now() - slept - sleep_ms / 1e3;
      *late_ms = late / (double)cycles * 1e3;
    }
  }
  pin(1);
  usleep(100000);
  const int fd = open("/proc/loadavg", O_RDONLY);
  int seen[16] = {0};
  for (int i = 0; i < 20000; ++i) {
    char text[128];
    const ssize_t length = pread(fd, text, sizeof text - 1, 0);
    text[length > 0 ? length : 0] = 0;
    const char* field = text;
    for (int skip = 0; skip < 3 && field; ++skip) {
      field = strchr(field, ' ');
      field = field ? field + 1 : NULL;
    }
    const int runnable = field ? atoi(field) : -1;
    if (runnable >= 0 && runnable < 16) {
      ++seen[runnable];
    }
    usleep(100);
  }
  kill(a, SIGKILL);
  kill(b, SIGKILL);
  while (wait(NULL) > 0) {
  }
  for (int i = 0; i < 16; ++i) {
    if (seen[i]) {
      printf("runnable %d: %d samples\n", i, seen[i]);
    }
  }
  const double cycle = run_ms + sleep_ms + *late_ms;
  const int with_b = alone ? 2 : 3;  // the sampler, A unless alone, and B
  printf(
      "B's sleeps ended %.3f ms late on average: B runnable %.1f%% of the time; counted %.1f%%\n",
      *late_ms, 100 * (run_ms + *late_ms) / cycle,
      100.0 * (seen[with_b] + seen[with_b + 1]) / 20000);
  return 0;
}
