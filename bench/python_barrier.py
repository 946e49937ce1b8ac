#!/usr/bin/python3
"""lockstep's barrier from Python (the package `lockstep`, over the C API through ctypes), timed
as bench/gloo_barrier.py times torch.distributed's gloo barrier, for bench-report's table.

    PYTHONPATH=build/python lockstep-run --nproc-per-node N \\
        /usr/bin/python3 bench/python_barrier.py --episodes K --repetitions R

Each process loops PartialState().wait_for_everyone(); rank 0 prints one JSON object:
{"family": "lockstep-python", "ranks": N, "episodes": K, "us_per_episode": [one per repetition],
 "init_s": seconds for import, PartialState() and one barrier}.
"""
import argparse
import json
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10000)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    start = time.perf_counter()
    import lockstep  # pylint: disable=import-outside-toplevel

    state = lockstep.PartialState()
    state.wait_for_everyone()
    init_s = time.perf_counter() - start
    wait = state.wait_for_everyone
    for _ in range(200):  # warm-up
        wait()
    results = []
    for _ in range(args.repetitions):
        begin = time.perf_counter()
        for _ in range(args.episodes):
            wait()
        results.append((time.perf_counter() - begin) * 1e6 / args.episodes)
    wait()
    if state.is_main_process:
        print(json.dumps({"family": "lockstep-python", "ranks": state.num_processes,
                          "episodes": args.episodes, "us_per_episode": results,
                          "init_s": init_s}))


if __name__ == "__main__":
    main()
