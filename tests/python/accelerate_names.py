"""What Accelerate users' code and Accelerate's own tests use (issue 58), under lockstep-run with
2 processes on one machine without a GPU: nested first blocks, DistributedType, the devices as
torch.device (a stand-in torch module: torch is not installed here), _reset_state(),
AcceleratorState, end_training, free_memory, the module's wait_for_everyone, any integer type as
an index. Exits non-zero naming the first thing that differs from Accelerate."""
import os
import sys
import tempfile
import time
import types

# A stand-in for torch with Accelerate's torch.device (torch is not installed here): lockstep
# takes torch where it can import it, and must make its devices with it then.
if "torch" not in sys.modules:
    class _Device:
        def __init__(self, name):
            self.type, _, index = name.partition(":")
            self.index = int(index) if index else None

        def __eq__(self, other):
            return isinstance(other, _Device) and (self.type, self.index) == (other.type,
                                                                              other.index)

        def __repr__(self):
            return f"device(type={self.type!r})"

    sys.modules["torch"] = types.SimpleNamespace(device=_Device, distributed=None)

import lockstep  # noqa: E402 (after the stand-in)
from lockstep import DistributedType  # noqa: E402


def expect(what, got, wanted):
    if got != wanted:
        sys.exit(f"accelerate_names: {what} is {got!r}, not {wanted!r}")


class Index:
    """An integer of another type, as numpy.int64 and torch's integer scalars are (__index__)."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


def nested_first_blocks(state, out):
    """TRL's per-machine cache inside the global one, and one block twice: each body runs on
    its first process, and is finished there, before any other process enters it."""
    def body(name, first):
        path = os.path.join(out, name)
        if first:
            time.sleep(0.2)  # the others would overtake the main process if let in
            with open(path, "w", encoding="utf-8") as f:
                f.write("done")
        else:
            expect(f"{name} written before process {state.process_index} entered",
                   os.path.exists(path), True)

    with state.main_process_first():
        with state.local_main_process_first():
            body("inner", state.is_local_main_process)
        body("outer", state.is_main_process)
    with state.main_process_first():
        with state.main_process_first():
            body("twice", state.is_main_process)


def main():
    state = lockstep.PartialState(cpu=True)
    rank = state.process_index
    job = os.environ.get("LOCKSTEP_JOB_ID", "job").split("@")[0]
    out = os.path.join(tempfile.gettempdir(), f"lockstep-names-{job}")
    if rank == 0:
        os.makedirs(out, exist_ok=True)
    lockstep.wait_for_everyone()  # accelerate.utils.wait_for_everyone
    try:
        nested_first_blocks(state, out)
    finally:
        lockstep.wait_for_everyone()
        if rank == 0:
            for name in os.listdir(out):
                os.unlink(os.path.join(out, name))
            os.rmdir(out)

    # DistributedType: an enum of str, compared either way.
    expect("distributed_type", state.distributed_type, DistributedType.MULTI_CPU)
    expect("distributed_type as a str", state.distributed_type == "MULTI_CPU", True)
    expect("DistributedType.MULTI_GPU", DistributedType("MULTI_GPU"), DistributedType.MULTI_GPU)
    expect("a str", isinstance(DistributedType.NO, str), True)
    # The devices, as torch.device where torch is there.
    torch = sys.modules["torch"]
    expect("device", state.device, torch.device("cpu"))
    expect("device.type", state.device.type, "cpu")
    expect("default_device", state.default_device, torch.device("cpu"))

    # Any integer type as an index; None or a negative index chooses no process, as Accelerate.
    ran = []
    state.on_process(lambda: ran.append("numpy-like"), process_index=Index(1))()
    state.on_local_process(lambda: ran.append("local"), local_process_index=Index(0))()
    expect("on_process(Index(1)) ran", "numpy-like" in ran, rank == 1)
    expect("on_local_process(Index(0)) ran", "local" in ran, rank == 0)
    for index in (None, -1):
        expect(f"on_process(process_index={index})",
               state.on_process(lambda: "ran", process_index=index)(), None)
        expect(f"on_local_process(local_process_index={index})",
               state.on_local_process(local_process_index=index)(lambda: "ran")(), None)
    expect("@state.on_process without an index", state.on_process(lambda: "ran")(), None)
    for bad in (True, 1.0, "0"):
        try:
            state.on_process(print, process_index=bad)
            sys.exit(f"accelerate_names: process_index={bad!r} was accepted")
        except lockstep.ConfigError as error:
            expect("the refusal of a bad index", "a process index is an integer" in str(error),
                   True)

    # _reset_state(), as Accelerate's tests call it: members raise AttributeError until a state is
    # made again, which is the same member of the job.
    lockstep.PartialState._reset_state()  # pylint: disable=protected-access
    for member in ("process_index", "num_processes", "device", "distributed_type"):
        try:
            getattr(state, member)
            sys.exit(f"accelerate_names: {member} was read after _reset_state()")
        except AttributeError as error:
            expect("the reset's message", "_reset_state() was called" in str(error), True)
    try:
        state.wait_for_everyone()
        sys.exit("accelerate_names: a wait after _reset_state() was made")
    except AttributeError:
        pass
    expect("initialized after _reset_state()", state.initialized, False)
    again = lockstep.PartialState(cpu=True)
    expect("process_index, made again", again.process_index, rank)
    expect("the old instance, made again", state.num_processes, 2)
    again.wait_for_everyone()

    # AcceleratorState: what an Accelerator holds, reset alone or with PartialState.
    accelerator = lockstep.Accelerator(cpu=True)
    expect("accelerator.state", type(accelerator.state), lockstep.AcceleratorState)
    expect("mixed_precision", accelerator.mixed_precision, "no")
    expect("accelerator.distributed_type", accelerator.distributed_type,
           DistributedType.MULTI_CPU)
    lockstep.AcceleratorState._reset_state()  # pylint: disable=protected-access
    try:
        accelerator.state.process_index  # pylint: disable=pointless-statement
        sys.exit("accelerate_names: AcceleratorState was read after its _reset_state()")
    except AttributeError:
        pass
    expect("PartialState after AcceleratorState's reset alone", state.process_index, rank)
    lockstep.AcceleratorState._reset_state(True)  # pylint: disable=protected-access
    try:
        state.process_index  # pylint: disable=pointless-statement
        sys.exit("accelerate_names: PartialState was read after _reset_state(True)")
    except AttributeError:
        pass
    accelerator = lockstep.Accelerator(cpu=True)
    expect("process_index, a new Accelerator", accelerator.process_index, rank)
    expect("free_memory", accelerator.free_memory([1], {"a": 2}), [None, None])
    expect("clear", accelerator.clear(), [])
    accelerator.wait_for_everyone()
    accelerator.end_training()  # leaves the job: every later call raises
    try:
        accelerator.wait_for_everyone()
        sys.exit("accelerate_names: a wait after end_training() returned")
    except lockstep.Error as error:
        expect("the error after end_training", "has left the job" in str(error), True)
    print(f"accelerate_names: process {rank}: ok")


if __name__ == "__main__":
    main()
