"""tools/bench-report's load matrix, as tables: each cell's ratios against the targets, and the
paired tails pooled over passes with their intervals (see bench_load.py for how they are run)."""
import random
import statistics

from bench_common import fmt
from bench_provenance import measured_by

BASELINE = "baseline"


def idle_load(label):
    """Whether a load (Load's label) is no load at all."""
    return label == "0"


# Episodes per block of bench/sleep-ab in the load matrix: 1-20 ms per block here, shorter than
# the phases of the loads (a scheduler slice, a burst's period), so that neighbouring blocks see
# the same phase.
PAIRED_EPISODES = 200


# The paired training-like loop: every rank computes 0-100 us (mean 50, as barrier_bench's
# BM_Training*) before each wait, 100 episodes per block (5-50 ms). Block and adaptive only:
# spin's blocks under load hold both CPUs for milliseconds per episode and disturb the blocks
# after them (N=2 beside a busy loop, 50 episodes per block: adaptive 100-111 us of
# overhead with spin in the rotation against block's 47-48; 42-45 against 41-46 without). Spin
# is judged in the coarse table, where it runs alone.
PAIRED_COMPUTE_US = 50
PAIRED_TRAINING_EPISODES = 100


# The paired tails are pooled over passes (the p99 of three passes' 12,000 episodes is their
# 120th largest; of one pass's 4,000, the 40th, and its p99.9 the 4th), from the largest 10% of
# each family's episodes that bench/sleep-ab keeps with their cycles. Their uncertainty comes
# from resampling in two stages, the passes and then each drawn pass's cycles (each cycle ran one
# block of every family, in the same load phase): TAIL_RESAMPLES draws of as many passes, with
# replacement, each of as many of its cycles, with replacement; the ratio's interval is the
# TAIL_INTERVAL central share of the draws' ratios. Slow episodes come in bursts (a busy loop
# holds a CPU for a scheduler slice), so cycles, not episodes, are drawn; and a pass differs from
# the next by more than its cycles tell (one build's p99 ratio ranged 1.01x-1.17x over six sets of
# runs whose cycle-only intervals were a third as wide: docs/performance-history.md, "Sharing the
# load samples"), so the passes are drawn too.
TAIL_RESAMPLES = 1000
TAIL_INTERVAL = 0.9
# A draw whose tail lies below the episodes kept (its cycles left out the slow load phases that
# hold the largest 10%) is left out; beyond this share of such draws, no interval.
TAIL_SHORT_DRAWS = 0.05


def pooled_quantile(tops, weights, q):
    """The q-quantile (ascending, the floor(q * n)-th of n, as bench/ranks.hpp's quantile())
    of the episodes of the units (a pass's cycles) in `weights`, unit -> (times drawn, episodes
    in its block), of which `tops` [(us, unit)] are the largest, largest first. None if the
    episodes kept do not reach that far."""
    total = sum(times * per_block for times, per_block in weights.values())
    if total == 0:
        return None
    rank = total - 1 - min(total - 1, int(q * total))  # 0-based, from the largest
    seen = 0
    for value, unit in tops:
        seen += weights.get(unit, (0, 0))[0]
        if seen > rank:
            return value
    return None


def pooled_tails(rows, q, seed=24):
    """For one cell's passes (rows with "pooled"): (adaptive's, block's and pthread's pooled
    q-quantiles, adaptive / pthread, (low, high) of its interval or None)."""
    units = []  # (pass, cycle)
    tops = {}
    per_block = {}
    for index, row in enumerate(rows):
        for cycle in range(row["cycles"]):
            units.append((index, cycle))
        for name, pooled in row["pooled"].items():
            tops.setdefault(name, []).extend(
                (value, (index, cycle)) for value, cycle in pooled["top"])
        per_block[index] = row["pooled"]["pthread"]["episodes"] // max(1, row["cycles"])
    for values in tops.values():
        values.sort(key=lambda entry: -entry[0])
    everyone = {unit: (1, per_block[unit[0]]) for unit in units}
    point = {name: pooled_quantile(values, everyone, q) for name, values in tops.items()}
    ratio = (point["adaptive"] / point["pthread"]
             if point.get("adaptive") and point.get("pthread") else None)
    draws = []
    generator = random.Random(seed)
    for _ in range(TAIL_RESAMPLES):
        weights = {}
        for index in generator.choices(range(len(rows)), k=len(rows)):
            cycles = range(rows[index]["cycles"])
            for cycle in generator.choices(cycles, k=len(cycles)):
                times, size = weights.get((index, cycle), (0, per_block[index]))
                weights[(index, cycle)] = (times + 1, size)
        a = pooled_quantile(tops["adaptive"], weights, q)
        b = pooled_quantile(tops["pthread"], weights, q)
        if a is not None and b:
            draws.append(a / b)
    if ratio is None or len(draws) < (1 - TAIL_SHORT_DRAWS) * TAIL_RESAMPLES:
        return point["adaptive"], point["block"], point["pthread"], ratio, None
    draws.sort()
    cut = (1 - TAIL_INTERVAL) / 2
    interval = (draws[int(cut * len(draws))],
                draws[min(len(draws) - 1, int((1 - cut) * len(draws)))])
    return point["adaptive"], point["block"], point["pthread"], ratio, interval


class LoadCells:
    """The load matrix's measurements: cells[(kind, load, ranks, column)] = one dict per pass."""

    def __init__(self, cells):
        self.cells = cells

    def values(self, kind, load, n, column, metric):
        return [row.get(metric) for row in self.cells.get((kind, load, n, column), [])]

    def med(self, kind, load, n, column, metric):
        xs = [x for x in self.values(kind, load, n, column, metric) if x is not None]
        return statistics.median(xs) if xs else None

    def ratio(self, kind, load, n, metric, others, column="adaptive"):
        """`column` / best of `others`, per pass, then the median over passes."""
        mine = self.values(kind, load, n, column, metric)
        pairs = []
        for i, x in enumerate(mine):
            best = [self.values(kind, load, n, c, metric)[i] for c in others
                    if i < len(self.values(kind, load, n, c, metric))]
            best = [b for b in best if b]
            if x is not None and best:
                pairs.append(x / min(best))
        return statistics.median(pairs) if pairs else None


def write_load_report(cells, ranks_list, loads, info, cpus, seconds):
    table = LoadCells(cells)
    before = info["before"]
    lines = [
        f"{measured_by(info)}; lockstep {info.get('version', '?')}, "
        f"{info.get('compiler', '?')}, build type {info.get('buildtype', '?')}; "
        f"{info['passes']} passes of {info['repetitions']} randomly interleaved runs per "
        f"benchmark (each at least {info['min_time_s']} s), medians over passes; "
        f"{seconds / 60:.1f} minutes in all (with the families above, when run together). Load "
        f"average before the run: {' '.join(f'{x:.2f}' for x in before['loadavg'])}, "
        f"{before['runnable']:.1f} other runnable tasks (mean of 10 samples over 1 s)."]
    if before["runnable"] >= 0.5:
        lines += ["", "**Warning: the machine was busy before the run started (other tasks "
                  "runnable); the idle cells (load 0) were not idle.**"]
    verdicts = []
    lines += load_latency_table(table, ranks_list, loads, verdicts)
    head = list(lines)  # what docs/performance.md shows (load_summary)
    if info.get("paired_blocks"):
        lines += load_paired_table(table, ranks_list, loads, verdicts, info["paired_blocks"])
    if info.get("baseline"):
        lines += load_baseline_table(table, ranks_list, loads, info["baseline"])
    lines += load_tails_table(table, ranks_list, loads, verdicts)
    if info.get("paired_blocks"):
        lines += load_paired_tails_table(table, ranks_list, loads, verdicts, info["paired_blocks"])
    lines += load_training_table(table, ranks_list, loads, verdicts)
    if info.get("paired_blocks"):
        lines += load_paired_training_table(table, ranks_list, loads, verdicts,
                                            info["paired_blocks"])
    return "\n".join(lines) + "\n", verdicts, head


# What each kind of verdict judges, in the order of load.md's tables.
VERDICT_KINDS = [
    ("paired", "the same targets, paired finely (`bench/sleep-ab`)"),
    ("tails", "adaptive's p99 and p99.9 at most pthread_barrier_t's"),
    ("paired-tails", "the same tails, paired"),
    ("training", "the training-like loop: adaptive at most 1.1x the better of block and spin"),
    ("paired-training", "the training-like loop, paired"),
]


def load_summary(head, verdicts, report_link):
    """docs/performance.md's load block: the run's line, the latency table, and for each of the
    run's other tables its targets met and the cells that missed them, with a link to the run's
    load.md, which has every table."""
    lines = list(head) + [
        "", f"The run's other targets, each in a table of [its load.md]({report_link}):", "",
        "| targets | cells met | missed (load, N: ratio) |", "|---|---|---|"]
    for kind, what in VERDICT_KINDS:
        judged = [v for v in verdicts if v["kind"] == kind]
        if not judged:
            continue
        # The paired tails have a third word: within noise (the interval reaches 1x).
        noise = [v for v in judged if v.get("verdict") == "within noise"]
        missed = [v for v in judged if not v["met"] and v not in noise]
        met = f"{len(judged) - len(missed) - len(noise)} of {len(judged)}" + (
            f" ({len(noise)} more within noise)" if noise else "")
        lines.append(f"| {what} | {met} | " + (
            ", ".join(f"{v['load']}, {v['ranks']}: {v['ratio']:.2f}x" for v in missed)
            or "none") + " |")
    return "\n".join(lines) + "\n"


LOAD_LEGEND = ("load: H busy loops; burstK@T: K processes alternating T ms of work and T ms of "
               "sleep; a+b: both")


# The load targets: under load, adaptive at most 1.1x the best of block and pthread, and block
# at most 1.1x pthread; idle, adaptive at most 1.1x the best of block and spin.
LOAD_LIMIT = 1.1


def ratio_verdict(judged, n):
    """(met, the table's word) for a cell's ratios against LOAD_LIMIT: the targets hold for
    N <= 8; beyond, a miss is reported, not counted."""
    met = bool(judged) and max(judged) <= LOAD_LIMIT
    if not judged:
        return met, "-"
    return met, "met" if met else ("MISSED" if n <= 8 else "missed (reported)")


def load_latency_table(table, ranks_list, loads, verdicts):
    lines = [
        "", "Barrier latency per episode (us) with a load beside the job (" + LOAD_LEGEND + "); "
        f"ratio = adaptive / best of block and pthread under load, adaptive / best of block and "
        f"spin idle; block ratio = block / pthread under load; target {LOAD_LIMIT}x each:", "",
        "| load | N | adaptive | block | spin | pthread | ratio | block ratio | target |",
        "|---|---|---|---|---|---|---|---|---|"]
    for load in loads:
        for n in ranks_list:
            idle = idle_load(load)
            r = table.ratio("latency", load, n, "us", ["block", "spin"] if idle else
                            ["block", "pthread"])
            rb = None if idle else table.ratio("latency", load, n, "us", ["pthread"], "block")
            judged = [x for x in (r, rb) if x is not None]
            met, verdict = ratio_verdict(judged, n)
            cols = [fmt(table.med("latency", load, n, c, "us"))
                    for c in ("adaptive", "block", "spin", "pthread")]
            cols += ["-" if x is None else f"{x:.2f}x" for x in (r, rb)]
            lines.append(f"| {load} | {n} | " + " | ".join(cols) + f" | {verdict} |")
            if judged:
                verdicts.append({"kind": "latency", "load": load, "ranks": n,
                                 "ratio": max(judged), "limit": LOAD_LIMIT, "met": met})
    return lines


def baseline_ratios(table, load, n, metric):
    """This build's adaptive / the baseline's, one ratio per round of run_baseline_rounds (both
    runs measured), in order."""
    this = table.values("ab", load, n, "this", metric)
    base = table.values("ab", load, n, BASELINE, metric)
    return [a / b for a, b in zip(this, base) if a is not None and b]


def load_baseline_table(table, ranks_list, loads, baseline):
    """Before/after: this build's adaptive against the baseline's, in alternating runs."""
    rounds = baseline["rounds"]
    lines = ["", f"Before/after: this build's adaptive against the baseline's (`--baseline "
             f"{baseline['build']}`, commit {baseline.get('commit') or 'unknown'}), "
             f"{rounds} pairs of runs per N, load and pass, one run of each build in turn (the "
             "order swapped every pair), each alone, as short as the runs above; us = medians "
             "over all the runs; ratio = the median over pairs of this build / the baseline; "
             "faster = the pairs where this build was the faster; p99 ratio likewise. No "
             "target: it says what a change did, in the same passes:", "",
             "| load | N | this build | baseline | ratio | faster | p99 ratio |",
             "|---|---|---|---|---|---|---|"]
    for load in loads:
        for n in ranks_list:
            ratios = baseline_ratios(table, load, n, "us")
            if not ratios:
                continue
            p99 = baseline_ratios(table, load, n, "p99_us")
            cols = [fmt(table.med("ab", load, n, c, "us")) for c in ("this", BASELINE)]
            cols += [f"{statistics.median(ratios):.2f}x",
                     f"{sum(r < 1 for r in ratios)}/{len(ratios)}",
                     f"{statistics.median(p99):.2f}x" if p99 else "-"]
            lines.append(f"| {load} | {n} | " + " | ".join(cols) + " |")
    return lines


def load_paired_table(table, ranks_list, loads, verdicts, blocks):
    """The same ratios, paired finely: bench/sleep-ab's blocks alternate the families every
    few milliseconds, so that the load's phases (which move a family's mean several-fold between
    runs a second apart) fall on all three alike."""
    lines = ["", f"The same targets, paired finely (`bench/sleep-ab N {blocks} {PAIRED_EPISODES} "
             "block,adaptive` beside each load, every pass): blocks of "
             f"{PAIRED_EPISODES} episodes of pthread_barrier_t, block and adaptive in turn; a "
             "ratio is the median over a pass's "
             f"{blocks // 3} cycles of one block against the other of the same cycle, then the "
             "median over passes; adaptive / best = the larger of adaptive / pthread and "
             f"adaptive / block (adaptive against the faster of the two); target {LOAD_LIMIT}x "
             "each. The interleaving breaks any state that outlasts a block, such as both "
             "ranks running while a spinning adaptive catches its peer, so these ratios judge "
             "adaptive's sleeping state (docs/performance-history.md, \"What a sleep costs\"):", "",
             "| load | N | block / pthread | adaptive / pthread | adaptive / block "
             "| adaptive / best | target |",
             "|---|---|---|---|---|---|---|"]
    for load in loads:
        if idle_load(load):
            continue
        for n in ranks_list:
            rb = table.med("paired", load, n, "block", "ratio")
            rp = table.med("paired", load, n, "adaptive/pthread", "ratio")
            rbb = table.med("paired", load, n, "adaptive/block", "ratio")
            ra = max(rp, rbb) if rp is not None and rbb is not None else None
            judged = [x for x in (rb, ra) if x is not None]
            if not judged:
                continue
            met, verdict = ratio_verdict(judged, n)
            lines.append(f"| {load} | {n} | " + " | ".join(
                "-" if x is None else f"{x:.2f}x" for x in (rb, rp, rbb, ra)) + f" | {verdict} |")
            verdicts.append({"kind": "paired", "load": load, "ranks": n, "ratio": max(judged),
                             "limit": LOAD_LIMIT, "met": met})
    return lines


def load_tails_table(table, ranks_list, loads, verdicts):
    lines = ["", "Tails of lockstep adaptive (rank 0, one episode in 16 timed, us): p50 / p99 / "
             "p99.9 / max, medians over passes; pthread_barrier_t beside it; under load, "
             "adaptive's p99 and p99.9 / pthread's (per pass, then the median), target 1x "
             "(no worse):", "",
             "| load | N | adaptive p50 | p99 | p99.9 | max | pthread p50 | p99 | p99.9 | max "
             "| p99 ratio | p99.9 ratio | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for load in loads:
        for n in ranks_list:
            cols = [fmt(table.med("latency", load, n, c, m)) for c in ("adaptive", "pthread")
                    for m in ("p50_us", "p99_us", "p999_us", "max_us")]
            ratios = [None if idle_load(load) else
                      table.ratio("latency", load, n, m, ["pthread"]) for m in ("p99_us", "p999_us")]
            judged = [r for r in ratios if r is not None]
            verdict = "-" if not judged else ("met" if max(judged) <= 1.0 else "MISSED")
            cols += ["-" if r is None else f"{r:.2f}x" for r in ratios]
            lines.append(f"| {load} | {n} | " + " | ".join(cols) + f" | {verdict} |")
            if judged:
                verdicts.append({"kind": "tails", "load": load, "ranks": n,
                                 "ratio": max(judged), "limit": 1.0, "met": max(judged) <= 1.0})
    return lines


def load_paired_tails_table(table, ranks_list, loads, verdicts, blocks):
    """The tails from the paired runs: rank 0 times every episode of bench/sleep-ab's run,
    whose families alternate every few milliseconds, so each family's tail comes from the same
    load phases. Pooled over passes, with an interval from resampling the cycles (see
    pooled_tails); runs whose raw files keep no largest episodes (from a
    bench/sleep-ab that kept none) fall back to the medians over passes."""
    per_pass = blocks // 3 * PAIRED_EPISODES
    lines = ["", "The same tails, paired (the runs of `bench/sleep-ab N "
             f"{blocks} {PAIRED_EPISODES} block,adaptive` above: rank 0 times every episode; "
             f"{per_pass} episodes per family and pass, in blocks alternating with the others' "
             "and starting with each family in turn), pooled over the passes: p99 and p99.9 (us) "
             "of all passes' episodes together, and adaptive's / pthread's with its "
             f"{TAIL_INTERVAL:.0%} interval from {TAIL_RESAMPLES} resamplings of the passes and of "
             "each drawn pass's cycles (a cycle: one block of each family, in one load phase). "
             "Target: no worse than "
             "pthread's: met where the ratio is at most 1x; within noise where it is above 1x "
             "but its interval reaches 1x (the measurement cannot tell it from pthread's); "
             "MISSED where the whole interval is above 1x:", "",
             "| load | N | adaptive p99 | block p99 | pthread p99 | adaptive p99.9 | block p99.9 "
             "| pthread p99.9 | p99 ratio | p99.9 ratio | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for load in loads:
        if idle_load(load):
            continue
        for n in ranks_list:
            rows = table.cells.get(("paired", load, n, "tails"), [])
            if not rows:
                continue
            if all("pooled" in r for r in rows):
                results = [pooled_tails(rows, q) for q in (0.99, 0.999)]
                cols = [fmt(result[i]) for result in results for i in (0, 1, 2)]
                ratios = [result[3] for result in results]
                intervals = [result[4] for result in results]
            else:
                med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
                cols = [fmt(med(f"{f}_{q}")) for q in ("p99", "p999")
                        for f in ("adaptive", "block", "pthread")]
                ratios = [statistics.median(r[f"adaptive_{q}"] / r[f"pthread_{q}"] for r in rows)
                          for q in ("p99", "p999")]
                intervals = [None, None]
            if any(r is None for r in ratios):
                lines.append(f"| {load} | {n} | " + " | ".join(cols) + " | - | - | - |")
                continue
            words = []
            for ratio, interval in zip(ratios, intervals):
                if ratio <= 1.0:
                    words.append("met")
                elif interval is not None and interval[0] <= 1.0:
                    words.append("within noise")
                else:
                    words.append("MISSED")
            verdict = ("MISSED" if "MISSED" in words else
                       "within noise" if "within noise" in words else "met")
            shown = [f"{r:.2f}x" + ("" if i is None else f" ({i[0]:.2f}-{i[1]:.2f})")
                     for r, i in zip(ratios, intervals)]
            lines.append(f"| {load} | {n} | " + " | ".join(cols) + " | " + " | ".join(shown) +
                         f" | {verdict} |")
            verdicts.append({"kind": "paired-tails", "load": load, "ranks": n,
                             "ratio": max(ratios), "limit": 1.0, "met": verdict == "met",
                             "verdict": verdict,
                             "intervals": [list(i) if i else None for i in intervals]})
    return lines


def load_paired_training_table(table, ranks_list, loads, verdicts, blocks):
    """The training-like loop, paired: bench/sleep-ab --compute alternates the families every
    few milliseconds, each rank computing the same draws in each."""
    lines = ["", "The training-like loop, paired (`bench/sleep-ab --compute "
             f"{PAIRED_COMPUTE_US} N {blocks} {PAIRED_TRAINING_EPISODES} block,adaptive` "
             "beside each load, every pass): the overhead per episode beyond the slowest rank's "
             "compute (us: each family's median over a pass's blocks, then the median over "
             "passes); adaptive / block of a pass's medians, then the median over passes; "
             f"target {LOAD_LIMIT}x (or adaptive's overhead at most 1 us). Spin is not in the "
             "rotation (under load its blocks disturb the next ones); the coarse table above "
             "has it:", "",
             "| load | N | adaptive | block | pthread | adaptive / block | target |",
             "|---|---|---|---|---|---|---|"]
    for load in loads:
        if idle_load(load):
            continue
        for n in ranks_list:
            best = table.ratio("paired-training", load, n, "overhead_us", ["block"])
            if best is None:
                continue
            a = table.med("paired-training", load, n, "adaptive", "overhead_us")
            met = best <= LOAD_LIMIT or (a is not None and a <= 1.0)
            cols = [fmt(table.med("paired-training", load, n, c, "overhead_us"))
                    for c in ("adaptive", "block", "pthread")] + [f"{best:.2f}x"]
            lines.append(f"| {load} | {n} | " + " | ".join(cols) +
                         f" | {'met' if met else 'MISSED'} |")
            verdicts.append({"kind": "paired-training", "load": load, "ranks": n, "ratio": best,
                             "limit": LOAD_LIMIT, "met": met})
    return lines


def load_training_table(table, ranks_list, loads, verdicts):
    lines = ["", "Training-like loop (every process computes 0-100 us, then waits): the "
             "barrier's overhead per episode beyond the slowest process's compute (us); "
             "ratio = adaptive / better of block and spin (block alone where spin did not "
             f"run); target {LOAD_LIMIT}x. The spin policy runs only where N <= CPUs.", "",
             "| load | N | adaptive | block | spin | pthread | ratio | target |",
             "|---|---|---|---|---|---|---|---|"]
    for load in loads:
        for n in ranks_list:
            r = table.ratio("training", load, n, "overhead_us", ["block", "spin"])
            cols = [fmt(table.med("training", load, n, c, "overhead_us"))
                    for c in ("adaptive", "block", "spin", "pthread")]
            # Overheads of a microsecond or less are within the noise of a 50 us compute.
            a = table.med("training", load, n, "adaptive", "overhead_us")
            verdict = "-" if r is None else ("met" if r <= LOAD_LIMIT or (a is not None and a <= 1.0)
                                             else "MISSED")
            lines.append(f"| {load} | {n} | " + " | ".join(cols) +
                         f" | {'-' if r is None else f'{r:.2f}x'} | {verdict} |")
            if r is not None:
                verdicts.append({"kind": "training", "load": load, "ranks": n, "ratio": r,
                                 "limit": LOAD_LIMIT, "met": verdict == "met"})
    return lines
