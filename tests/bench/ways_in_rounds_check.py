"""tools/bench-ways-in's table of idle rounds: each round's placement, told by the round trips
before and after it, beside each way's episode over the installed library's in that round.

    python3 ways_in_rounds_check.py SOURCE_ROOT
"""
import argparse
import importlib.machinery
import importlib.util
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the checks
root = sys.argv[1]
loader = importlib.machinery.SourceFileLoader("bench_ways_in",
                                              os.path.join(root, "tools", "bench-ways-in"))
spec = importlib.util.spec_from_loader("bench_ways_in", loader)
ways_in = importlib.util.module_from_spec(spec)
loader.exec_module(ways_in)


def fail(message):
    sys.exit(f"FAIL: {message}")


smt = sys.modules["bench_provenance"].SMT_ROUND_TRIP_US
if ways_in.placement(smt / 2, smt / 2 * 1.1) != "SMT siblings" or \
        ways_in.placement(smt * 3, smt * 3.3) != "separate cores" or \
        ways_in.placement(smt / 2, smt * 3) != "moved" or ways_in.placement(None, 1.0) != "unknown":
    fail("placement() does not tell SMT siblings, separate cores, a move and an unknown apart")

args = argparse.Namespace(ways=["installed", "static"], policies=["adaptive"], ranks=[2])
# Two idle rounds (the installed way, then the static link: us, ratio, paired, direct) and one
# under a load, which the table leaves out.
results = {("installed", "adaptive", 2, 0): [(0.2, 0.1, 1.0, 1.0), (0.3, 0.1, 1.0, 1.0)],
           ("static", "adaptive", 2, 0): [(0.22, 0.1, 1.0, 1.1), (0.27, 0.1, 1.0, 0.9)],
           ("installed", "adaptive", 2, 1): [(2.0, 1.0, 1.0, 1.0)],
           ("static", "adaptive", 2, 1): [(2.0, 1.0, 1.0, 1.0)]}
trips = {("adaptive", 2, 0): [(smt * 3, smt * 3.1), (smt / 2, smt * 3)],
         ("adaptive", 2, 1): [(smt * 3, smt * 3)]}
rows = [line for line in ways_in.rounds_text(args, results, trips) if line.startswith("| adaptive")]
expect = [f"| adaptive | 2 | 1 | {smt * 3:.3f}-{smt * 3.1:.3f} | separate cores | 1.100x |",
          f"| adaptive | 2 | 2 | {smt / 2:.3f}-{smt * 3:.3f} | moved | 0.900x |"]
if rows != expect:
    fail(f"the rounds table's rows are {rows}, not {expect}")
args.ways = ["installed"]
if ways_in.rounds_text(args, results, trips):
    fail("a run of the installed way alone has a rounds table (nothing to compare in it)")
print("bench-ways-in: each idle round's placement and each way's ratio in it")
