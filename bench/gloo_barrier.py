#!/usr/bin/python3
"""torch.distributed's barrier on gloo: what Accelerate's wait_for_everyone() runs on CPU.

    /usr/bin/python3 bench/gloo_barrier.py --ranks N --episodes K --repetitions R

Starts N processes on 127.0.0.1 (torchrun's variables, set by hand: Debian's torchrun crashes
in its default form), loops dist.barrier(), and prints one JSON object from rank 0:
{"family": "gloo", "ranks": N, "episodes": K, "us_per_episode": [one per repetition],
 "init_s": seconds for init_process_group plus one barrier}.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(args):
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    start = time.perf_counter()
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    dist.barrier()
    init_s = time.perf_counter() - start
    for _ in range(20):  # warm-up
        dist.barrier()
    results = []
    for _ in range(args.repetitions):
        begin = time.perf_counter()
        for _ in range(args.episodes):
            dist.barrier()
        results.append((time.perf_counter() - begin) * 1e6 / args.episodes)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"family": "gloo", "ranks": args.ranks, "episodes": args.episodes,
                          "us_per_episode": results, "init_s": init_s}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_process:
        rank_main(args)
        return
    port = free_port()
    children = []
    for rank in range(args.ranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1")
        children.append(subprocess.Popen([sys.executable, __file__, "--rank-process",
                                          "--ranks", str(args.ranks),
                                          "--episodes", str(args.episodes),
                                          "--repetitions", str(args.repetitions)], env=env))
    codes = [child.wait() for child in children]
    if any(codes):
        sys.exit(f"gloo_barrier: ranks ended with {codes}")


if __name__ == "__main__":
    main()
