"""tools/bench-report's load matrix: the loads beside the job, the passes that measure each
cell (barrier_bench's interleaved runs, bench/sleep-ab's paired blocks, a baseline build's
alternating runs) and the reading of their files; bench_load_tables.py writes the tables."""
import json
import os
import statistics
import subprocess
import sys
import time

from bench_common import ROOT, build_info, gb_runs, log, publish_block, run, source_commit
from bench_load_tables import (BASELINE, PAIRED_COMPUTE_US, PAIRED_EPISODES,
                               PAIRED_TRAINING_EPISODES, idle_load, load_summary,
                               write_load_report)

# The load matrix: Google Benchmark names, by the column they fill.
LATENCY = {"adaptive": "BM_LockstepAdaptive", "block": "BM_LockstepBlock",
           "spin": "BM_LockstepSpin", "pthread": "BM_PthreadBarrier"}
TRAINING = {"adaptive": "BM_TrainingAdaptive", "block": "BM_TrainingBlock",
            "spin": "BM_TrainingSpin", "pthread": "BM_TrainingPthread"}


DEFAULT_LOADS = "0,1,2,4,burst4@0.5,burst4@2,burst4@20,1+burst2@2"

# One process of a bursty load: T ms of work (a clock loop: it never sleeps in it), T ms of sleep.
BURST = ("import sys, time\n"
         "t = float(sys.argv[1]) / 1000\n"
         "while True:\n"
         "    end = time.perf_counter() + t\n"
         "    while time.perf_counter() < end:\n"
         "        pass\n"
         "    time.sleep(t)\n")


class Load:
    """What runs beside the job, as --loads names it: "H" (H busy loops at nice 0, as a busy
    workstation has), "burstK@T" (K processes alternating T ms of work and T ms of sleep, as data
    loaders do) or "H+burstK@T" (both). The label is the spec as given, normalized."""

    def __init__(self, spec):
        self.busy, self.bursts, self.period = 0, 0, 0.0
        for part in spec.strip().split("+"):
            if part.isdigit():
                self.busy += int(part)
            elif part.startswith("burst") and "@" in part:
                count, period = part[len("burst"):].split("@", 1)
                try:
                    self.bursts, self.period = int(count), float(period)
                except ValueError:
                    raise ValueError(f"{spec!r}: burstK@T needs a count K and a period T in ms")
                if self.bursts < 1 or not 0 < self.period <= 1000:
                    raise ValueError(f"{spec!r}: burstK@T needs K >= 1 and 0 < T <= 1000 ms")
            else:
                raise ValueError(f"{spec!r} is not a load: a number of busy loops (2), burstK@T "
                                 "(burst4@2: 4 processes alternating 2 ms of work and of sleep), "
                                 "or both (1+burst2@2)")
        parts = ([str(self.busy)] if self.busy or not self.bursts else []) + (
            [f"burst{self.bursts}@{self.period:g}"] if self.bursts else [])
        self.label = "+".join(parts)

    @staticmethod
    def idle(label):
        return idle_load(label)


class Hogs:
    """A load (Load's label) running beside the job for the length of a with-block."""

    def __init__(self, label):
        load = Load(label)
        self.procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"])
                      for _ in range(load.busy)]
        self.procs += [subprocess.Popen([sys.executable, "-c", BURST, f"{load.period:g}"])
                       for _ in range(load.bursts)]
        time.sleep(0.3 if self.procs else 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()


def matrix_filter(ranks_list, load, cpus, families):
    names = [families[c] for c in ("adaptive", "block", "pthread")]
    parts = [f"^({'|'.join(names)})/ranks:({'|'.join(map(str, ranks_list))})/"]
    spin_ranks = [n for n in ranks_list if n <= cpus]
    if spin_ranks and (Load.idle(load) or families is TRAINING):
        parts.append(f"^{families['spin']}/ranks:({'|'.join(map(str, spin_ranks))})/")
    return "|".join(parts)


def run_load_matrix(args, barrier_bench, ranks_list, loads, raw, before, started, prov):
    cpus = len(os.sched_getaffinity(0))
    for name in os.listdir(raw):
        if name.startswith(("load", "base-load", "ab-load")):
            os.remove(os.path.join(raw, name))
    base_bench = os.path.join(args.baseline, "bench", "barrier_bench") if args.baseline else None
    if base_bench and not os.path.exists(base_bench):
        sys.exit(f"bench-report: no bench/barrier_bench in {args.baseline}")
    sleep_ab = os.path.join(args.build, "bench", "sleep-ab") if args.paired_blocks else None
    if sleep_ab and not os.path.exists(sleep_ab):
        log("load matrix: no bench/sleep-ab in the build (-Dtools=false or -Dbench=disabled): "
            "no paired ratios")
        sleep_ab = None
    # cells[(kind, load, ranks, column)] = [one dict of measurements per pass]
    cells = {}
    gb_env = dict(os.environ, LOCKSTEP_BENCH_PIN="1" if args.pin else "0")
    for round_index in range(args.load_rounds):
        # Rotate the loads between passes, so that a drift of the host touches each alike.
        order = loads[round_index % len(loads):] + loads[:round_index % len(loads)]
        for load in order:
            log(f"load matrix: pass {round_index + 1} of {args.load_rounds}, load {load}")
            with Hogs(load):
                out = os.path.join(raw, f"load{load}-round{round_index}.json")
                run([barrier_bench, "--benchmark_filter="
                     + matrix_filter(ranks_list, load, cpus, LATENCY) + "|"
                     + matrix_filter(ranks_list, load, cpus, TRAINING),
                     f"--benchmark_min_time={args.load_min_time}",
                     f"--benchmark_repetitions={args.load_repetitions}",
                     "--benchmark_enable_random_interleaving=true",
                     "--benchmark_report_aggregates_only=false",
                     f"--benchmark_out={out}", "--benchmark_out_format=json"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=gb_env)
                read_matrix(out, load, cells)
                if base_bench:
                    run_baseline_rounds(args, barrier_bench, base_bench, load, ranks_list,
                                        round_index, raw, cells, gb_env)
                if sleep_ab and not Load.idle(load):
                    for n in ranks_list:
                        out = os.path.join(raw, f"load{load}-paired-n{n}-round{round_index}.json")
                        run([sleep_ab, str(n), str(args.paired_blocks), str(PAIRED_EPISODES),
                             "block,adaptive", out], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=gb_env)
                        read_paired(out, load, n, cells)
                        # The training-like loop, paired the same way.
                        out = os.path.join(
                            raw, f"load{load}-paired-training-n{n}-round{round_index}.json")
                        run([sleep_ab, "--compute", str(PAIRED_COMPUTE_US), str(n),
                             str(args.paired_blocks), str(PAIRED_TRAINING_EPISODES),
                             "block,adaptive", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=gb_env)
                        read_paired_training(out, load, n, cells)
    info = build_info(args.build)
    info.update(prov)
    info["before"] = before
    info["passes"] = args.load_rounds
    info["min_time_s"] = float(args.load_min_time)
    info["repetitions"] = args.load_repetitions
    info["paired_blocks"] = args.paired_blocks if sleep_ab else 0
    if base_bench:
        info["baseline"] = {"build": args.baseline, "commit": source_commit(args.baseline),
                            "rounds": args.baseline_rounds}
    report, verdicts, head = write_load_report(cells, ranks_list, loads, info, cpus,
                                               time.time() - started)
    with open(os.path.join(args.out, "load.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, "load.json"), "w") as f:
        json.dump({"info": info, "targets": verdicts,
                   "cells": [{"kind": k[0], "load": k[1], "ranks": k[2], "family": k[3],
                              "passes": v} for k, v in sorted(cells.items())]}, f, indent=1)
    if args.publish:
        link = os.path.relpath(os.path.join(args.out, "load.md"), os.path.join(ROOT, "docs"))
        publish_block(load_summary(head, verdicts, link), args.out, "bench-load")
    print(report)


def run_baseline_rounds(args, bench, base_bench, load, ranks_list, round_index, raw, cells,
                        env):
    """The before/after under one load: for each N, this build's adaptive and the baseline's
    alternate, one short run each (--load-min-time), --baseline-rounds times, the order swapped
    every round (A B, B A, ...), so that the two runs of a round are a second apart and in the
    same context (each alone). cells[("ab", load, N, "this" or BASELINE)] gets one row per
    round, in step: a round's ratio is the pair at one index."""
    for n in ranks_list:
        for k in range(args.baseline_rounds):
            pair = [(bench, "this"), (base_bench, BASELINE)]
            for binary, column in (pair if k % 2 == 0 else pair[::-1]):
                out = os.path.join(raw, f"ab-load{load}-n{n}-round{round_index}-{k}-{column}.json")
                run([binary, f"--benchmark_filter=^BM_LockstepAdaptive/ranks:{n}/",
                     f"--benchmark_min_time={args.load_min_time}",
                     f"--benchmark_out={out}", "--benchmark_out_format=json"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
                rows = [dict({"us": us}, **{m: b[m] for m in ("p99_us", "p999_us") if m in b})
                        for base, ranks, us, b in gb_runs(out, log)
                        if base == "BM_LockstepAdaptive" and ranks == n]
                # A failed run keeps the rounds in step: its row is empty, and its round is
                # left out of the ratios.
                cells.setdefault(("ab", load, n, column), []).append(rows[0] if rows else {})


def read_matrix(path, load, cells):
    """One pass's file: each benchmark ran --load-repetitions times, randomly interleaved with the
    others; its row for the pass is the mean over its repetitions, weighted by episodes (the
    tails: the median of the repetitions' values)."""
    by_gb = {v: ("latency", k) for k, v in LATENCY.items()}
    by_gb.update({v: ("training", k) for k, v in TRAINING.items()})
    reps = {}
    for base, ranks, us, bench in gb_runs(path, log):
        if base not in by_gb:
            continue
        kind, column = by_gb[base]
        row = {"us": us, "episodes": bench["iterations"]}
        for counter in ("cpu_us", "p50_us", "p99_us", "p999_us", "max_us", "overhead_us",
                        "episode_us"):
            if counter in bench:
                row[counter] = bench[counter]
        reps.setdefault((kind, load, ranks, column), []).append(row)
    for key, rows in reps.items():
        episodes = sum(r["episodes"] for r in rows)
        merged = {"episodes": episodes, "repetitions": len(rows)}
        for metric in ("us", "cpu_us", "overhead_us", "episode_us"):
            if all(metric in r for r in rows):
                merged[metric] = sum(r[metric] * r["episodes"] for r in rows) / episodes
        for metric in ("p50_us", "p99_us", "p999_us"):
            if all(metric in r for r in rows):
                merged[metric] = statistics.median(r[metric] for r in rows)
        if all("max_us" in r for r in rows):
            merged["max_us"] = max(r["max_us"] for r in rows)
        cells.setdefault(key, []).append(merged)



def paired_ratios(raw, key, pairs):
    """{name: median over cycles of raw[key][cycle][a] / raw[key][cycle][b]} for each
    name: (a, b) in `pairs` whose variants ran; cycles where b is not positive are skipped.
    (Not a / the faster of two per cycle: the minimum of two noisy blocks is biased low, by
    20-50% under busy loops.)"""
    at = {name: i for i, name in enumerate(raw["variants"])}
    ratios = {}
    for name, (a, b) in pairs.items():
        if a not in at or b not in at:
            continue
        values = [cycle[at[a]] / cycle[at[b]] for cycle in raw.get(key, []) if cycle[at[b]] > 0]
        if values:
            ratios[name] = (statistics.median(values), len(values))
    return ratios


def read_paired(path, load, n, cells):
    """bench/sleep-ab's raw file for one cell and pass: per cycle (pthread, block, adaptive
    blocks in turn), the ratios block / pthread, adaptive / pthread and adaptive / block; the
    pass's values are their medians over its cycles. And the tails: adaptive's and block's p99
    and p99.9 over the run's episodes against pthread's."""
    with open(path) as f:
        raw = json.load(f)
    ratios = paired_ratios(raw, "cycles", {"block": ("block", "pthread"),
                                           "adaptive/pthread": ("adaptive", "pthread"),
                                           "adaptive/block": ("adaptive", "block")})
    for column, (ratio, count) in ratios.items():
        cells.setdefault(("paired", load, n, column), []).append(
            {"ratio": ratio, "cycles": count})
    tails = raw.get("tails", {})
    if all(name in tails for name in ("pthread", "block", "adaptive")):
        row = {}
        for name in ("pthread", "block", "adaptive"):
            for q in ("p99", "p999"):
                row[f"{name}_{q}"] = tails[name][q]
        if all("top" in tails[name] for name in ("pthread", "block", "adaptive")):
            row["pooled"] = {name: {"episodes": tails[name]["episodes"], "top": tails[name]["top"]}
                             for name in ("pthread", "block", "adaptive")}
            row["cycles"] = len(raw.get("cycles", []))
        cells.setdefault(("paired", load, n, "tails"), []).append(row)


def read_paired_training(path, load, n, cells):
    """bench/sleep-ab --compute's raw file for one cell and pass: each family's median overhead
    per episode beyond the slowest rank's compute over the pass's cycles. (Ratios are of these
    medians, not medians of per-cycle ratios: spin's overhead is bimodal under load, near zero
    in the blocks where every spinner holds a CPU, and a ratio to it explodes there.)"""
    with open(path) as f:
        raw = json.load(f)
    for name, i in {name: i for i, name in enumerate(raw["variants"])}.items():
        overheads = [cycle[i] for cycle in raw.get("overheads", [])]
        if overheads:
            cells.setdefault(("paired-training", load, n, name), []).append(
                {"overhead_us": statistics.median(overheads)})
