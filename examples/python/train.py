#!/usr/bin/env python3
"""An Accelerate-style script on lockstep: the same lines as with Accelerate, the import aside.

    lockstep-run --nproc-per-node 2 examples/python/train.py [OUTDIR]
    PYTHONPATH=build/python build/tools/lockstep-run --nproc-per-node 2 examples/python/train.py

The main process prepares the data first (main_process_first), each process takes its share
(split_between_processes) and "trains" on it with a progress bar on each machine's main process,
every process gathers every process's results (gather_object), and the main process saves the
model after wait_for_everyone. With Accelerate the imports would read `from accelerate import
Accelerator` and `from accelerate.utils import gather_object`.
"""
import json
import os
import sys
import tempfile
import time

from lockstep import Accelerator, gather_object


def progress(items, disable):
    """tqdm's bar where tqdm is installed; else a line redrawn in place."""
    try:
        from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
        return tqdm(items, disable=disable)
    except ImportError:
        def drawn():
            for done, item in enumerate(items, 1):
                if not disable:
                    print(f"\rtraining {done}/{len(items)}", end="", flush=True)
                yield item
            if not disable:
                print()
        return drawn()


def main():
    accelerator = Accelerator()
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
    job = os.environ.get("LOCKSTEP_JOB_ID", "job").split("@")[0]
    data_file = os.path.join(out, f"lockstep-train-{job}-data.json")

    with accelerator.main_process_first():  # the main process downloads, the others read it
        if accelerator.is_main_process:
            with open(data_file, "w", encoding="utf-8") as f:
                json.dump(list(range(10)), f)
        with open(data_file, encoding="utf-8") as f:
            dataset = json.load(f)

    with accelerator.split_between_processes(dataset) as mine:
        results = []
        for sample in progress(mine, disable=not accelerator.is_local_main_process):
            time.sleep(0.05)  # a training step
            results.append(sample * sample)

    collected = gather_object(results)  # every process's results, in process order

    @accelerator.on_main_process
    def save():
        os.remove(data_file)
        if collected != [x * x for x in dataset]:
            raise SystemExit(f"train: the processes' results do not add up: {collected}")
        accelerator.print(f"train: {len(collected)} samples on {accelerator.num_processes} "
                          "processes; the model is saved")
    accelerator.wait_for_everyone()
    save()
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
