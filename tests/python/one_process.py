"""Accelerate's PartialState in a job of one process (python3 run directly, no launcher), where
Accelerate is not distributed: what it does there, lockstep does (issue 46). Exits non-zero naming
the first member that differs."""
import sys
import types

import lockstep


def expect(what, got, wanted):
    if got != wanted:
        sys.exit(f"one_process: {what} is {got!r}, not {wanted!r}")


def fake_torch():
    """A stand-in for torch whose torch.distributed has an initialized default group (torch is
    not installed here): records destroy_process_group's calls."""
    calls = []
    distributed = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: not calls,
        destroy_process_group=lambda group=None: calls.append(group))
    sys.modules["torch"] = types.SimpleNamespace(distributed=distributed)
    return calls


def main():
    for bad in (3, ""):
        try:
            lockstep.PartialState(backend=bad)
            sys.exit(f"one_process: backend={bad!r} was accepted")
        except ValueError as error:
            expect("the refusal of a bad backend", "a backend's name" in str(error), True)
    state = lockstep.PartialState()
    expect("num_processes", state.num_processes, 1)
    expect("use_distributed", state.use_distributed, False)
    expect("backend", state.backend, None)
    expect("distributed_type", state.distributed_type, "NO")
    # Not distributed, Accelerate runs every decorated function (on_process(process_index=3)
    # included); lockstep ran it nowhere.
    expect("on_process(process_index=3)", state.on_process(lambda: "ran", process_index=3)(),
           "ran")
    expect("on_local_process(local_process_index=1)",
           state.on_local_process(local_process_index=1)(lambda: "ran")(), "ran")
    with state.split_between_processes({"a": [1, 2], "name": "run"}) as mine:
        expect("the one process's share", mine, {"a": [1, 2], "name": "run"})
    # Not distributed, Accelerate's gather_object returns the object itself; the trigger works.
    expect("gather_object", lockstep.gather_object({"a": 1}), {"a": 1})
    accelerator = lockstep.Accelerator()
    accelerator.set_trigger()
    expect("check_trigger, set", accelerator.check_trigger(), True)
    expect("check_trigger, after", accelerator.check_trigger(), False)
    # destroy_process_group also destroys torch.distributed's default group, as Accelerate's.
    calls = fake_torch()
    state.destroy_process_group()
    expect("torch.distributed.destroy_process_group's calls", calls, [None])
    expect("initialized after leaving", state.initialized, False)
    state.destroy_process_group()  # once more: torch's group is gone, lockstep's left
    expect("torch.distributed.destroy_process_group's calls, again", calls, [None])
    print("one_process: ok")


if __name__ == "__main__":
    main()
