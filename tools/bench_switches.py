"""tools/bench-report's table of the cells where the processes outnumber the CPUs, in context
switches (the unit: half of BM_YieldPingPong's round trip, measured each round)."""
import statistics

from bench_common import fmt


def switches_table(results, ranks_list, cpus, families, handoff):
    """With more processes than CPUs an episode costs context switches, whose price the host sets
    (here ~1.5 us, and it moves between rounds): each such cell in switches, each round's episode
    over half that round's CPU ping-pong, beside the floor."""
    halves = [t / 2 for t in results.values(handoff, 2)]
    over = [n for n in ranks_list if n > cpus]
    if not halves or not over:
        return []
    switch = f"{fmt(statistics.median(halves))} us, {fmt(min(halves))}-{fmt(max(halves))}"
    lines = ["", f"With more processes than CPUs ({cpus} here) each episode costs context "
             "switches: the episode in switches, each round's over half that round's CPU "
             f"ping-pong (one switch: {switch}), "
             "median (min-max). The floor: a CPU passes between its processes (N/C, rounded "
             "up) at least one time fewer than their count an episode (the last to arrive on a "
             "CPU completes the episode and arrives at the next before it yields).", "",
             "| family | " + " | ".join(f"N={n}" for n in over) + " |",
             "|---|" + "---|" * len(over),
             "| floor | " + " | ".join(str(-(-n // cpus) - 1) for n in over) + " |"]
    for family in families:
        cells = []
        for n in over:
            values = results.values(family, n)
            per = [v / h for v, h in zip(values, halves)] if len(values) == len(halves) else []
            cells.append(f"{statistics.median(per):.2f} ({min(per):.2f}-{max(per):.2f})"
                         if per else "-")
        if any(c != "-" for c in cells):
            lines.append(f"| {family} | " + " | ".join(cells) + " |")
    return lines
