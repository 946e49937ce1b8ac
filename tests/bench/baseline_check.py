"""tools/bench-report --baseline: the before/after pairs stay in step and say what they measured.

    python3 baseline_check.py SOURCE_ROOT BUILD_DIR OUT_DIR

A build slower in every pair must show a ratio above 1 and win no pair; a failed run (an empty
row) must drop its pair, not shift the pairs after it; and a real run with the build as its own
baseline must give a before/after row for every load and N, each from the runs it made.
"""
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the checks
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_module import fail, load_bench_report  # noqa: E402

ROOT, BUILD, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
load_bench_report(ROOT)
tables = sys.modules["bench_load_tables"]


def rows(table_lines):
    return [line for line in table_lines if line.startswith("| ") and "---" not in line
            and not line.startswith("| load")]


# 1. This build 1.5x the baseline in every pair: ratio 1.50x, faster in 0 of 4.
base = [10.0, 20.0, 5.0, 40.0]
cells = {("ab", "1", 2, "this"): [{"us": 1.5 * b, "p99_us": 3 * b} for b in base],
         ("ab", "1", 2, tables.BASELINE): [{"us": b, "p99_us": b} for b in base]}
info = {"build": "/tmp/base", "commit": "abc", "rounds": 4}
line = rows(tables.load_baseline_table(tables.LoadCells(cells), [2], ["1"], info))
if len(line) != 1 or "| 1.50x | 0/4 | 3.00x |" not in line[0]:
    fail(f"a build 1.5x slower in every pair: {line}")

# 2. A failed run of the baseline in the second pair: that pair is dropped, the others stay
# paired with their own (this build faster in each of the three left).
cells = {("ab", "1", 2, "this"): [{"us": 1.0}, {"us": 100.0}, {"us": 2.0}, {"us": 3.0}],
         ("ab", "1", 2, tables.BASELINE): [{"us": 2.0}, {}, {"us": 4.0}, {"us": 6.0}]}
line = rows(tables.load_baseline_table(tables.LoadCells(cells), [2], ["1"], info))
if len(line) != 1 or "| 0.50x | 3/3 |" not in line[0]:
    fail(f"a failed run did not drop just its pair: {line}")

# 3. End to end: the build against itself, idle and beside a busy loop, N = 2.
out = os.path.join(OUT, "run")
done = subprocess.run([os.path.join(ROOT, "tools", "bench-report"), "--matrix-only",
                       "--loads", "0,1", "--ranks", "2", "--load-rounds", "1",
                       "--load-repetitions", "1", "--load-min-time", "0.02", "--paired-blocks",
                       "0", "--baseline", BUILD, "--baseline-rounds", "2", "--build", BUILD,
                       "--out", out], capture_output=True, text=True, timeout=240)
if done.returncode != 0:
    fail(f"bench-report --baseline failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
with open(os.path.join(out, "load.md")) as f:
    text = f.read()
section = text.split("Before/after:", 1)
if len(section) != 2:
    fail("no before/after table in load.md")
got = rows(section[1].split("\n\n", 2)[1].splitlines())
if [r.split(" | ")[0:2] for r in got] != [["| 0", "2"], ["| 1", "2"]]:
    fail(f"before/after rows for loads 0 and 1 at N=2 expected: {got}")
with open(os.path.join(out, "load.json")) as f:
    data = json.load(f)
for load in ("0", "1"):
    for family in ("this", tables.BASELINE):
        passes = [c["passes"] for c in data["cells"] if c["kind"] == "ab"
                  and c["load"] == load and c["family"] == family]
        if len(passes) != 1 or len(passes[0]) != 2 or not all(p.get("us") for p in passes[0]):
            fail(f"load {load}, {family}: two measured runs expected, got {passes}")
if data["info"].get("baseline", {}).get("rounds") != 2:
    fail(f"load.json does not name the baseline: {data['info'].get('baseline')}")
raw = sorted(n for n in os.listdir(os.path.join(out, "raw")) if n.startswith("ab-"))
if len(raw) != 8:
    fail(f"8 raw files of pairs expected (2 loads x 2 pairs x 2 builds): {raw}")
print("bench-report --baseline: pairs in step, a failed run drops its pair, "
      f"{len(got)} before/after rows from {len(raw)} runs")
