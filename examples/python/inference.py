#!/usr/bin/env python3
"""Accelerate's distributed-inference pattern on lockstep, the import aside line for line:

    lockstep-run --nproc-per-node 4 examples/python/inference.py [OUTDIR] [PROMPTS]

Every process takes its share of the prompts (split_between_processes), "generates" a few
kilobytes of text for each (a stand-in for model.generate: words drawn from the prompt's hash, so
that no model is needed), then every process's completions are gathered (gather_object, any size)
and the main process writes them, one JSON line per prompt in the prompts' order, to
OUTDIR/inference-<job>.jsonl. With Accelerate the imports would read `from accelerate import
PartialState` and `from accelerate.utils import gather_object`.
"""
import hashlib
import json
import os
import sys
import tempfile

from lockstep import PartialState, gather_object

WORDS = ("the", "model", "said", "that", "every", "process", "waits", "for", "its", "peers",
         "and", "then", "goes", "on", "with", "a", "share", "of", "prompts", "gathered")


def generate(prompt, tokens=600):
    """A completion of `tokens` words (about 3 KB) that depends on the prompt alone."""
    seed = hashlib.sha256(prompt.encode()).digest()
    words = [WORDS[(seed[k % len(seed)] + k * 7) % len(WORDS)] for k in range(tokens)]
    return prompt + " " + " ".join(words)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    state = PartialState()
    prompts = [f"prompt {k}: tell me about barrier number {k}" for k in range(count)]

    completions_per_process = []
    with state.split_between_processes(prompts) as my_prompts:
        for prompt in my_prompts:
            completions_per_process.append({"prompt": prompt, "completion": generate(prompt)})

    completions = gather_object(completions_per_process)  # every process's, in process order

    if state.is_main_process:
        job = os.environ.get("LOCKSTEP_JOB_ID", "job").split("@")[0]
        path = os.path.join(out, f"inference-{job}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for one in completions:
                f.write(json.dumps(one) + "\n")
        size = sum(len(one["completion"]) for one in completions)
        print(f"inference: {len(completions)} completions ({size} bytes) from "
              f"{state.num_processes} processes written to {path}")
        # The check a user would make: every prompt once, in order, with its own completion.
        if [one["prompt"] for one in completions] != prompts or any(
                one["completion"] != generate(one["prompt"]) for one in completions):
            sys.exit("inference: the gathered completions are not the prompts' own, in order")
    state.wait_for_everyone()


if __name__ == "__main__":
    main()
