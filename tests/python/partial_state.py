"""Accelerate's PartialState members, under lockstep-run with 2 processes on one machine without
a GPU (issue 23): what Accelerate has, lockstep has or refuses by name. Exits non-zero naming
the first member that differs."""
import gc
import sys
import weakref

import lockstep


def expect(what, got, wanted):
    if got != wanted:
        sys.exit(f"partial_state: {what} is {got!r}, not {wanted!r}")


class _Refused:
    """An object that process `index` cannot unpickle."""

    def __init__(self, index):
        self.index = index

    def __reduce__(self):
        return (_refuse_on, (self.index,))


def _refuse_on(index):
    if lockstep.PartialState().process_index == index:
        raise ValueError(f"refused on process {index}")
    return index


class _Tracked:
    """An object whose life a weak reference shows."""

    def __init__(self, text):
        self.text = text


def _freed_when_dropped(state):
    """What a gather or a broadcast returned is freed as soon as the caller drops it, not when
    the cyclic collector runs: a reference cycle once held each result (1 MiB per process a
    call) until then."""
    gc.disable()
    try:
        for size in (10, 600000):  # in the node segment; read in place from a window
            got = lockstep.gather_object([_Tracked("g" * size)])
            watched = [weakref.ref(each) for each in got]
            del got
            expect(f"a gather's objects of {size} bytes, alive once dropped",
                   [each() is not None for each in watched], [False, False])
            got = state.broadcast_object(_Tracked("b" * size))
            watched = weakref.ref(got)
            del got
            expect(f"a broadcast's object of {size} bytes, alive once dropped",
                   watched() is not None, False)
    finally:
        gc.enable()


def main():
    try:
        lockstep.PartialState(mixed_precision="fp16")
        sys.exit("partial_state: an argument for torch.distributed was accepted")
    except TypeError as error:
        expect("the refusal", "mixed_precision" in str(error), True)
    # torch.distributed's backend, as Accelerate's scripts pass it: recorded (issue 46: it was a
    # ValueError), lockstep's transport left as LOCKSTEP_BACKEND says.
    state = lockstep.PartialState(cpu=True, timeout=30, backend="gloo")
    expect("backend", state.backend, "gloo")
    expect("LOCKSTEP_BACKEND", "LOCKSTEP_BACKEND" in __import__("os").environ, False)
    expect("initialized", state.initialized, True)
    expect("use_distributed", state.use_distributed, True)
    expect("device", state.device, "cpu")
    expect("distributed_type", state.distributed_type, "MULTI_CPU")
    expect("debug", state.debug, False)
    expect("is_last_process", state.is_last_process, state.process_index == 1)
    state.set_device()  # on the CPU: nothing
    ran = []
    state.on_last_process(lambda: ran.append(True))()
    expect("on_last_process ran", bool(ran), state.process_index == 1)
    # A negative index chooses no process, as in Accelerate (issue 58); a string is refused.
    expect("on_process(process_index=-1)", state.on_process(lambda: "ran", process_index=-1)(),
           None)
    try:
        state.on_process(print, process_index="0")
        sys.exit("partial_state: a str process index was accepted")
    except lockstep.ConfigError as error:
        expect("the refusal of a bad index", "process index" in str(error), True)
    state.wait_for_everyone()
    # Main computes, everyone uses.
    config = {"run": "run-42", "seed": 7}
    expect("broadcast_object", state.broadcast_object(config if state.is_main_process else "x"),
           config)
    items = [f"mine-{state.process_index}", 3]
    expect("broadcast_object_list", lockstep.broadcast_object_list(items), ["mine-0", 3])
    expect("the list, in place", items, ["mine-0", 3])
    try:
        lockstep.broadcast_object_list(items, from_process=1)
        sys.exit("partial_state: broadcast_object_list from process 1 was accepted")
    except ValueError as error:
        expect("the refusal of from_process=1", "main process (0) only" in str(error), True)
    # Any size (issue 58): 1 MiB pickled, past the segment's area, through a spill.
    big = {"texts": ["x" * 1000 + str(k) for k in range(1000)]}
    expect("a large broadcast", state.broadcast_object(big if state.is_main_process else None),
           big)
    expect("a broadcast after the large one", state.broadcast_object(state.process_index), 0)
    # Everyone's results, everywhere (issue 46): Accelerate's gather_object joins the processes'
    # lists in process order.
    mine = [{"process": state.process_index, "loss": 0.5 * state.process_index}]
    expect("gather_object", lockstep.gather_object(mine),
           [{"process": 0, "loss": 0.0}, {"process": 1, "loss": 0.5}])
    expect("gather_object of nothing", lockstep.gather_object([]), [])
    # Any size (issue 58): each process's 100 KB past its share of the area, through spills.
    texts = [f"{state.process_index}:{k}:" + "y" * 100 for k in range(1000)]
    gathered = lockstep.gather_object(texts)
    expect("a large gather", gathered, [f"{p}:{k}:" + "y" * 100 for p in range(2)
                                        for k in range(1000)])
    expect("a gather after the large one", lockstep.gather_object([state.process_index]), [0, 1])
    # From 512 KiB (at N = 2) a process's pickle goes to its spill, and each process unpickles
    # it there.
    texts = [f"{state.process_index}:{k}:" + "z" * 1000 for k in range(600)]
    expect("a gather read in place", lockstep.gather_object(texts),
           [f"{p}:{k}:" + "z" * 1000 for p in range(2) for k in range(600)])
    # What unpickling raises is raised on that process once every process has read; the others
    # have their objects, and the job goes on.
    try:
        got = lockstep.gather_object([_Refused(1), "z" * 600000])
        expect("the gather beside a refusal", got[1::2], ["z" * 600000] * 2)
        expect("the process that refused", state.process_index, 0)
    except ValueError as error:
        expect("the refusal", (str(error), state.process_index), ("refused on process 1", 1))
    expect("a gather after a refusal", lockstep.gather_object([state.process_index]), [0, 1])
    _freed_when_dropped(state)
    accelerator = lockstep.Accelerator(cpu=True)
    expect("check_trigger, none set", accelerator.check_trigger(), False)
    if state.process_index == 1:
        accelerator.set_trigger()
    expect("check_trigger, set on process 1", accelerator.check_trigger(), True)
    expect("check_trigger, after", accelerator.check_trigger(), False)
    if state.process_index == 1:
        state.destroy_process_group()
        expect("initialized after leaving", state.initialized, False)
        try:
            state.wait_for_everyone()
            sys.exit("partial_state: a wait after destroy_process_group returned")
        except lockstep.Error as error:
            expect("the error after leaving", "has left the job" in str(error), True)
        return
    try:
        state.wait_for_everyone(timeout=20)
        sys.exit("partial_state: the wait for a process that left returned")
    except lockstep.PeerLostError as error:
        expect("who left", "process 1 of 2" in str(error), True)
    print("partial_state: ok")


if __name__ == "__main__":
    main()
