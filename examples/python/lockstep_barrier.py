#!/usr/bin/env python3
"""lockstep from Python: processes started by lockstep-run meet in its barrier.

    lockstep-run --nproc-per-node 4 python3 examples/python/lockstep_barrier.py [WORKDIR]

The package `lockstep` is installed by `meson install` (or use the build tree's:
PYTHONPATH=build/python). Each process writes a file, waits for everyone, then checks that every
file is there; the main process reports. Exits non-zero on any failure, with lockstep's message.
"""
import os
import sys
import tempfile

import lockstep


def main():
    state = lockstep.PartialState()
    workdir = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
    job = os.environ.get("LOCKSTEP_JOB_ID", "job")
    mine = os.path.join(workdir, f"lockstep-py-{job}-{state.process_index}")
    with open(mine, "w", encoding="utf-8") as f:
        f.write(str(state.process_index))
    state.wait_for_everyone()
    for rank in range(state.num_processes):
        path = os.path.join(workdir, f"lockstep-py-{job}-{rank}")
        if not os.path.exists(path):
            raise SystemExit(f"process {state.process_index}: {path} is missing after the barrier")
    state.wait_for_everyone(timeout=60)
    os.remove(mine)
    state.print(f"python: {state.num_processes} processes met (lockstep {lockstep.__version__})")


if __name__ == "__main__":
    main()
