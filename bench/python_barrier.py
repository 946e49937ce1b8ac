#!/usr/bin/python3
"""lockstep's barrier from Python (the package `lockstep`, over the C API through ctypes), timed
as bench/gloo_barrier.py times torch.distributed's gloo barrier, for bench-report's table.

    PYTHONPATH=build/python lockstep-run --nproc-per-node N \\
        /usr/bin/python3 bench/python_barrier.py --episodes K --repetitions R

Each process loops PartialState().wait_for_everyone(); rank 0 prints one JSON object:
{"family": "lockstep-python", "ranks": N, "episodes": K, "us_per_episode": [one per repetition],
 "init_s": seconds for import, PartialState() and one barrier}.

With --exchange BYTES, each repetition also times, in turn, broadcast_object and gather_object of
a BYTES-long text (a str) per process (K / 10 calls each), and what pickling costs alone: one
pickle.dumps of the process's object and a pickle.loads of each process's into one list, as a
gather makes and returns them. The list matters: N megabytes alive together and then freed
together are what glibc gives back to the kernel (its trim threshold), so each call's objects
land on fresh pages, at a page fault each; N loads freed one by one reuse one chunk.
The JSON gains "broadcast_us", "gather_us" and "pickle_us" (one per repetition), "gather_target":
issue 46's, a gather within 3x one barrier plus one broadcast of the same size, and
"pickle_target": issue 58's, a gather within 2x its pickling alone, each judged on the medians.
"""
import pickle
import argparse
import json
import statistics
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10000)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--exchange", type=int, default=0, metavar="BYTES",
                        help="also time broadcast_object and gather_object of BYTES each")
    args = parser.parse_args()
    if args.episodes < 10 or args.repetitions < 1 or args.exchange < 0:
        parser.error("--episodes must be at least 10, --repetitions at least 1, --exchange at "
                     "least 0")
    start = time.perf_counter()
    import lockstep  # pylint: disable=import-outside-toplevel

    state = lockstep.PartialState()
    state.wait_for_everyone()
    init_s = time.perf_counter() - start
    wait = state.wait_for_everyone
    for _ in range(200):  # warm-up
        wait()
    results = []
    exchanges = {"broadcast_us": [], "gather_us": [], "pickle_us": []}
    payload = "".join(chr(32 + (k * 7919) % 95) for k in range(min(args.exchange, 4096)))
    payload = (payload * (args.exchange // 4096 + 1))[:args.exchange]

    def pickled_alone():  # the objects a gather returns: one list of them all, alive together
        mine = pickle.dumps([payload])
        return [pickle.loads(mine) for _ in range(state.num_processes)]
    calls = args.episodes // 10
    for _ in range(args.repetitions):
        begin = time.perf_counter()
        for _ in range(args.episodes):
            wait()
        results.append((time.perf_counter() - begin) * 1e6 / args.episodes)
        if args.exchange:
            for name, call in (("broadcast_us", lambda: state.broadcast_object(payload)),
                               ("gather_us", lambda: lockstep.gather_object([payload])),
                               ("pickle_us", pickled_alone)):
                wait()
                begin = time.perf_counter()
                for _ in range(calls):
                    call()
                exchanges[name].append((time.perf_counter() - begin) * 1e6 / calls)
    wait()
    if state.is_main_process:
        report = {"family": "lockstep-python", "ranks": state.num_processes,
                  "episodes": args.episodes, "us_per_episode": results, "init_s": init_s}
        if args.exchange:
            report.update(exchanges, exchange_bytes=args.exchange)
            median = statistics.median
            bound = 3 * (median(results) + median(exchanges["broadcast_us"]))
            report["gather_target"] = {"bound_us": bound,
                                       "met": median(exchanges["gather_us"]) <= bound}
            bound = 2 * median(exchanges["pickle_us"])
            report["pickle_target"] = {"bound_us": bound,
                                       "met": median(exchanges["gather_us"]) <= bound}
        print(json.dumps(report))


if __name__ == "__main__":
    main()
