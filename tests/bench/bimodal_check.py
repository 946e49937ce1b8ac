"""tools/bench-report shows placements and states apart: each round's round trip, a cell whose
rounds of one placement differ by more than 1.5x flagged as bimodal with its rounds listed, and
the N=2 target judged per placement (1.25x the round trip on SMT siblings, 0.55x on separate
cores).

    python3 bimodal_check.py SOURCE_ROOT
"""
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the checks
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_module import fail, load_bench_report  # noqa: E402

report = load_bench_report(sys.argv[1])
results = report.Results()
trips = [0.06, 0.25, 0.25]
for trip, two, four in zip(trips, [0.07, 0.13, 0.15], [2.0, 24.0, 2.5]):
    results.add(report.PINGPONG, 2, "us", trip)
    results.add(report.LOCKSTEP, 2, "us", two)
    results.add(report.LOCKSTEP, 4, "us", four)

if not report.bimodal([2.0, 24.0, 2.5]) or report.bimodal([2.0, 2.9, 2.5]) or \
        report.bimodal([3.0]):
    fail("bimodal(): a cell is bimodal exactly when one round took more than 1.5x another")
# Placements are not states: 0.07 us on SMT siblings and 0.13-0.15 us on separate cores is one
# state; 2.0 against 24.0 us on separate cores is two.
if report.bimodal([0.07, 0.13, 0.15], trips) or not report.bimodal([2.0, 24.0, 2.5], trips):
    fail("bimodal(): rounds are compared within their placement")

rows = report.rounds_table(results, [2, 4])
text = "\n".join(rows)
if "| round trip | 0.06 | 0.25 | 0.25 |" not in text.replace("0.060", "0.06").replace(
        "0.250", "0.25"):
    fail(f"each round's round trip is not listed:\n{text}")
if f"{report.LOCKSTEP}, N=4 |" not in text or f"{report.LOCKSTEP}, N=2 |" in text:
    fail(f"the rounds of the bimodal cell (N=4) alone should be listed:\n{text}")

targets = "\n".join(report.target_table(results, [2, 4]))
line = next((x for x in targets.splitlines() if "lockstep / ping-pong" in x), "")
smt, cores = line.split("|")[2:4]
# SMT siblings: 0.07 / 0.06 = 1.17x, within 1.25x; separate cores: 0.52x and 0.60x, median 0.56x,
# above 0.55x.
if "1.17x" not in smt or "met" not in smt or "0.56x" not in cores or "MISSED" not in cores:
    fail(f"the N=2 target is not judged per placement:\n{line}")
print("bench-report: bimodal cells flagged and listed with each round's round trip; the N=2 "
      "target judged per placement")
