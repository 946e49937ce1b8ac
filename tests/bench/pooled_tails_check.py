"""tools/bench-report's pooled paired tails, checked against what bench/sleep-ab measured itself.

    python3 pooled_tails_check.py SOURCE_ROOT path/to/sleep-ab OUT_DIR

One pass pooled alone must give sleep-ab's own p99 and p99.9 (computed from every episode) out of
the largest 10% it keeps; three passes pooled must give the quantile of all their episodes
together; a family slower in every cycle must be MISSED, one drawn from the same episodes must
not be, nor one slower in one pass of three only; and sleep-ab must refuse BLOCKS that do not
fill whole cycles.
"""
import json
import os
import random
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the checks
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_module import fail, load_bench_report  # noqa: E402

ROOT, SLEEP_AB, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(OUT, exist_ok=True)
load_bench_report(ROOT)
load = sys.modules["bench_load"]
tables = sys.modules["bench_load_tables"]


def quantile(values, q):
    """bench/ranks.hpp's quantile(): the floor(q * n)-th of the n values, ascending."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# 1. A real run: one pass pooled alone is sleep-ab's own quantile (the top list keeps 2 decimals).
raw_path = os.path.join(OUT, "pooled-tails.json")
done = subprocess.run([SLEEP_AB, "2", "12", "200", "block,adaptive", raw_path],
                      capture_output=True, text=True, timeout=120)
if done.returncode != 0:
    fail(f"sleep-ab exited {done.returncode}: {done.stdout}{done.stderr}")
with open(raw_path) as f:
    raw = json.load(f)
for name, tails in raw["tails"].items():
    if tails["episodes"] != 4 * 200:
        fail(f"{name}: {tails['episodes']} episodes, not 800")
    if len(tails["top"]) != 80:
        fail(f"{name}: {len(tails['top'])} largest episodes kept, not 10% of 800")
    if [v for v, _ in tails["top"]] != sorted((v for v, _ in tails["top"]), reverse=True):
        fail(f"{name}: the largest episodes are not largest first")
    if any(not 0 <= cycle < 4 for _, cycle in tails["top"]):
        fail(f"{name}: a cycle outside 0-3 in {tails['top']}")
cells = {}
load.read_paired(raw_path, "1", 2, cells)
rows = cells[("paired", "1", 2, "tails")]
for q, key in ((0.99, "p99"), (0.999, "p999")):
    adaptive, block, pthread, ratio, interval = tables.pooled_tails(rows, q)
    for name, value in (("adaptive", adaptive), ("block", block), ("pthread", pthread)):
        if value is None or abs(value - raw["tails"][name][key]) > 0.006:
            fail(f"{name}'s pooled {key} of one pass is {value}, sleep-ab said "
                 f"{raw['tails'][name][key]}")
    # Four cycles can be too few for the resamplings to reach the p99 in the largest 10% kept:
    # then no interval, which the report judges as if it lay above 1x.
    if interval is not None and not interval[0] <= ratio <= interval[1]:
        fail(f"the {key} ratio {ratio} lies outside its interval {interval}")

# 2. Three passes of made-up episodes: the pooled quantile is that of all of them together.
generator = random.Random(7)


def made_up_pass(scale_of, slow_phases=0.1):
    """A pass of 20 cycles of 200 episodes per family, as sleep-ab's raw file keeps it."""
    tails = {}
    episodes_of = {}
    bursts = [10.0 if generator.random() < slow_phases else 1.0 for _ in range(20)]
    for name in ("pthread", "block", "adaptive"):
        episodes = []
        for cycle, burst in enumerate(bursts):
            episodes += [(generator.expovariate(1 / 12.0) * burst * scale_of(name, cycle), cycle)
                         for _ in range(200)]
        top = sorted(episodes, key=lambda e: -e[0])[:400]
        tails[name] = {"episodes": len(episodes), "top": [[round(v, 2), c] for v, c in top]}
        episodes_of[name] = [round(v, 2) for v, _ in episodes]
    return {"pooled": tails, "cycles": 20}, episodes_of


passes = [made_up_pass(lambda name, cycle: 1.0) for _ in range(3)]
rows = [row for row, _ in passes]
for q in (0.99, 0.999):
    result = tables.pooled_tails(rows, q)
    for index, name in enumerate(("adaptive", "block", "pthread")):
        everything = [v for _, episodes in passes for v in episodes[name]]
        if result[index] != quantile(everything, q):
            fail(f"{name}: pooled {q} {result[index]}, all episodes together "
                 f"{quantile(everything, q)}")

# 3. The verdicts: the same episodes are never MISSED; 1.5x in every cycle always is.
rows = [row for row, _ in passes]
for row in rows:
    row["pooled"]["adaptive"] = row["pooled"]["pthread"]
for q in (0.99, 0.999):
    _, _, _, ratio, interval = tables.pooled_tails(rows, q)
    if ratio != 1.0 or not interval[0] <= 1.0 <= interval[1]:
        fail(f"the same episodes: ratio {ratio}, interval {interval}")
slower = [made_up_pass(lambda name, cycle: 1.5 if name == "adaptive" else 1.0)
          for _ in range(3)]
for q in (0.99, 0.999):
    _, _, _, ratio, interval = tables.pooled_tails([row for row, _ in slower], q)
    if not interval[0] > 1.0:
        fail(f"adaptive 1.5x slower in every cycle: ratio {ratio}, interval {interval}")
table = tables.LoadCells({("paired", "1", 2, "tails"): [row for row, _ in slower]})
verdicts = []
lines = tables.load_paired_tails_table(table, [2], ["1"], verdicts, 60)
if not verdicts or verdicts[0]["verdict"] != "MISSED" or verdicts[0]["met"]:
    fail(f"adaptive 1.5x slower is not MISSED: {verdicts} {lines[-1]}")

# 3b. Passes that disagree: adaptive 1.3x pthread in one pass and as fast in the other two (a
# state that lasts a pass, as one scheduler mode can). The pooled ratio is above 1x, but three
# passes cannot tell it from pthread's: within noise, not MISSED (resampling only the cycles
# called it MISSED: the passes' spread never entered the interval).
generator.seed(3)
disagree = [made_up_pass(lambda name, cycle, k=k: k if name == "adaptive" else 1.0, 0)[0]
            for k in (1.3, 1.0, 1.0)]
_, _, _, ratio, interval = tables.pooled_tails(disagree, 0.99)
if not ratio > 1.0 or interval is None or not interval[0] <= 1.0:
    fail(f"passes at 1.3x, 1x and 1x: ratio {ratio}, interval {interval}: not within noise")

# 4. BLOCKS that do not fill whole cycles are refused, saying so.
done = subprocess.run([SLEEP_AB, "2", "7", "10", "block,adaptive"], capture_output=True,
                      text=True, timeout=60)
if done.returncode != 2 or "multiple of the variants' count" not in done.stderr:
    fail(f"sleep-ab 2 7 10 block,adaptive: exit {done.returncode}: {done.stderr}")
print("pooled tails: one pass matches sleep-ab's own quantiles, three passes together match all "
      "their episodes, the verdicts tell the same from 1.5x slower, and one pass of three from "
      "three")
