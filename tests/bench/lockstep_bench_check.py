"""lockstep-bench as a user runs it: the three formats, every family, and bad flags refused.

    python3 lockstep_bench_check.py path/to/lockstep-bench
"""
import csv
import io
import json
import os
import subprocess
import sys

BENCH = sys.argv[1]
FAMILIES = ["adaptive", "block", "spin", "pthread", "boost"]
CPUS = len(os.sched_getaffinity(0))


def run(*args, code=0):
    done = subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=300)
    if done.returncode != code:
        sys.exit(f"lockstep-bench {' '.join(args)}: exit {done.returncode}, not {code}\n"
                 f"{done.stdout}{done.stderr}")
    return done


def check_cell(row, nproc, family, iterations=400):
    if family == "spin" and nproc > CPUS:
        if "CPUs" not in row["skipped"]:
            sys.exit(f"spin at N={nproc} on {CPUS} CPUs should be skipped, saying why: {row}")
        return
    values = {k: float(row[k]) for k in ("avg_us", "min_us", "p50_us", "max_us", "cpu_us")}
    if not (values["avg_us"] > 0 and 0 < values["min_us"] <= values["p50_us"] <= values["max_us"]
            and values["cpu_us"] > 0):
        sys.exit(f"implausible cell N={nproc} {family}: {row}")
    # One episode in 16 is timed; p99 only from 100 samples on (below, it would be the max).
    samples = int(row["samples"])
    if samples != -(-iterations // 16):
        sys.exit(f"N={nproc} {family}: {samples} samples of {iterations} iterations: {row}")
    p99 = row["p99_us"]
    if samples < 100:
        if p99 not in ("", "None"):
            sys.exit(f"N={nproc} {family}: a p99 of {samples} samples: {row}")
    elif not values["p50_us"] <= float(p99) <= values["max_us"]:
        sys.exit(f"implausible p99 N={nproc} {family}: {row}")


def shm():
    return set(os.listdir("/dev/shm"))


before = shm()
common = ["--nproc", "2,3", "--iterations", "400", "--warmup", "20"]

out = run(*common, "--format", "csv").stdout
rows = list(csv.DictReader(io.StringIO(out)))
cells = [(int(r["nproc"]), r["family"]) for r in rows]
if cells != [(n, f) for n in (2, 3) for f in FAMILIES]:
    sys.exit(f"CSV cells: {cells}\n{out}")
for row in rows:
    check_cell(row, int(row["nproc"]), row["family"])

document = json.loads(run(*common, "--families", "adaptive,pthread", "--format", "json").stdout)
if document["tool"] != "lockstep-bench" or document["iterations"] != 400 or \
        document["machine"]["cpus"] != CPUS:
    sys.exit(f"JSON head: {document}")
results = document["results"]
if [(r["nproc"], r["family"]) for r in results] != [(2, "adaptive"), (2, "pthread"),
                                                     (3, "adaptive"), (3, "pthread")]:
    sys.exit(f"JSON cells: {results}")
for r in results:
    check_cell({k: str(v) for k, v in r.items()}, r["nproc"], r["family"])

long = json.loads(run("--nproc", "2", "--iterations", "1600", "--warmup", "20", "--families",
                     "adaptive", "--format", "json").stdout)["results"]
for r in long:  # 100 samples: the p99 is there
    check_cell({k: str(v) for k, v in r.items()}, r["nproc"], r["family"], iterations=1600)

# --runs: every cell K times, interleaved, each run with its round trip; cells flagged bimodal
# exactly when a run's avg is more than 1.5x another's of the same placement.
runs = json.loads(run("--nproc", "2,3", "--iterations", "200", "--warmup", "10", "--families",
                      "adaptive,pthread", "--runs", "3", "--format", "json").stdout)
order = [(r["run"], r["nproc"], r["family"]) for r in runs["results"]]
if order != [(k, n, f) for k in range(3) for n in (2, 3) for f in ("adaptive", "pthread")]:
    sys.exit(f"--runs 3: the runs are not interleaved: {order}")
for r in runs["results"]:
    trip = r["round_trip_us"]
    # (Any positive time: on a busy machine the two ranks may share a CPU, a round trip then
    # taking a context switch or a slice.)
    if (trip is None) != (CPUS < 2) or (trip is not None and not trip > 0):
        sys.exit(f"--runs 3: implausible round trip on {CPUS} CPUs: {r}")
for cell in runs["cells"]:
    mine = [r for r in runs["results"]
            if (r["nproc"], r["family"]) == (cell["nproc"], cell["family"])]
    avgs = [r["avg_us"] for r in mine]
    # Within one placement: SMT siblings (a round trip under 0.1 us) or separate cores.
    groups = [[r["avg_us"] for r in mine if ((r["round_trip_us"] or 1.0) < 0.1) == smt]
              for smt in (True, False)]
    bimodal = any(g and max(g) > 1.5 * min(g) for g in groups)
    if cell["runs"] != 3 or cell["fastest_avg_us"] != min(avgs) or \
            cell["slowest_avg_us"] != max(avgs) or cell["bimodal"] != bimodal:
        sys.exit(f"--runs 3: cell {cell} against its runs {mine}")
csv_runs = run("--nproc", "2", "--iterations", "200", "--warmup", "10", "--families", "adaptive",
               "--runs", "2", "--format", "csv")
if [r["run"] for r in csv.DictReader(io.StringIO(csv_runs.stdout))] != ["0", "1"]:
    sys.exit(f"--runs 2 --format csv:\n{csv_runs.stdout}")
table_runs = run("--nproc", "2", "--iterations", "200", "--warmup", "10", "--families",
                 "adaptive", "--runs", "2").stdout
if "each cell's runs" not in table_runs or "N=2 lockstep adaptive: avg" not in table_runs:
    sys.exit(f"--runs 2: the table lacks each cell's runs:\n{table_runs}")

table = run("--nproc", "2", "--iterations", "200", "--warmup", "10").stdout
for want in ("# lockstep-bench ", "avg", "min", "p50", "p99", "max", "cpu", "samples",
             "p99 is shown from 100 samples on", "lockstep adaptive", "run", "trip",
             "pthread_barrier_t", "Boost.Interprocess"):
    if want not in table:
        sys.exit(f"the table lacks {want!r}:\n{table}")

# Bad input: exit 2, naming what was wrong, before anything runs.
for args, words in ((["--nproc", "0"], '"0" in "0" is not a process count'),
                    (["--nproc", "2,x"], '"x" in "2,x" is not a process count'),
                    (["--nproc", "2,4,"], '"" in "2,4," is not a process count'),
                    (["--nproc", "999"], "is not a process count (1-256)"),
                    (["--families", "adaptive,mpi"], '"mpi" is not a family'),
                    (["--iterations", "0"], "--iterations"),
                    (["--format", "xml"], "--format"),
                    (["--runs", "0"], "--runs"),
                    (["--no-such-flag"], "--no-such-flag")):
    done = run(*args, code=2)
    if words not in done.stderr + done.stdout:
        sys.exit(f"lockstep-bench {' '.join(args)} did not say {words!r}:\n{done.stderr}")
    if "nproc  family" in done.stdout:
        sys.exit(f"lockstep-bench {' '.join(args)} ran cells before refusing")

left = shm() - before
if left:
    sys.exit(f"left in /dev/shm: {sorted(left)}")
print(f"lockstep-bench: {len(rows)} CSV cells, {len(results)} JSON cells, the table and "
      f"{8} refusals, --runs checked on {CPUS} CPUs")
