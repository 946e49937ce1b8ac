#!/usr/bin/python3
"""How a run of BM_LockstepAdaptive/ranks:N (unbound) placed its ranks over the CPUs.

    placement-sampler.py BUILD N ROUNDS

Runs BUILD/bench/barrier_bench for that benchmark ROUNDS times (0.5 s each) and, every 10 ms
while it runs, reads each rank's CPU (field 39 of /proc/PID/stat of the benchmark's children);
prints each run's time per episode and how often each placement was seen (4 ranks on 2 CPUs:
2:2 or 3:1 or 4). The sampler takes a little of a CPU itself.
"""
import collections
import json
import os
import subprocess
import sys
import time


def ranks_cpus(pid):
    try:
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        return []
    cpus = []
    for child in children:
        try:
            fields = open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()
            cpus.append(int(fields[36]))
        except OSError:
            pass
    return cpus


def main():
    build, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    binary = os.path.join(build, "bench", "barrier_bench")
    for r in range(rounds):
        run = subprocess.Popen([binary, f"--benchmark_filter=BM_LockstepAdaptive/ranks:{n}/",
                                "--benchmark_min_time=0.5", "--benchmark_format=json"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        seen = collections.Counter()
        while run.poll() is None:
            cpus = ranks_cpus(run.pid)
            if len(cpus) == n:
                per_cpu = sorted(collections.Counter(cpus).values(), reverse=True)
                seen[":".join(map(str, per_cpu))] += 1
            time.sleep(0.01)
        result = json.loads(run.stdout.read())
        us = [b["real_time"] for b in result["benchmarks"] if b.get("run_type") == "iteration"][0]
        total = sum(seen.values()) or 1
        print(f"round {r}: {us:.2f} us  " +
              "  ".join(f"{k} {v * 100 // total}%" for k, v in seen.most_common()), flush=True)


if __name__ == "__main__":
    main()
