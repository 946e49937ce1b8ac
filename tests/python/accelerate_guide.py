"""The snippets of Accelerate's execution-process guide (accelerate/basic_tutorials/execution),
each as the guide writes it but for the import (`from lockstep import Accelerator`), under
lockstep-run with 2 processes (issue 46). Each process checks what ran on it; exits non-zero
naming the first snippet that differs."""
import sys
import types

from lockstep import Accelerator


def expect(what, got, wanted):
    if got != wanted:
        sys.exit(f"accelerate_guide: {what}: {got!r}, not {wanted!r}")


def tqdm_module():
    """tqdm's tqdm.auto, or where tqdm is not installed (CI's Python) a stand-in that records
    what the snippet asks of it."""
    try:
        from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
        return tqdm
    except ImportError:
        print("accelerate_guide: tqdm is not installed: a stand-in takes the snippet's call")
        calls = []
        def stand_in(iterable, disable=False):
            calls.append(disable)
            return types.SimpleNamespace(disable=disable, iterable=iterable)
        return stand_in


def main():
    accelerator = Accelerator()
    me = accelerator.process_index
    ran = []

    # Execute on one process: a progress bar on the local main process only.
    tqdm = tqdm_module()
    max_train_steps = 3
    progress_bar = tqdm(range(max_train_steps), disable=not accelerator.is_local_main_process)
    expect("tqdm's disable", progress_bar.disable, me != 0)

    if accelerator.is_local_main_process:
        ran.append("is_local_main_process")
    accelerator.print("Accelerate is the best")

    @accelerator.on_local_main_process
    def do_my_thing():
        ran.append("on_local_main_process")
    do_my_thing()

    if accelerator.is_main_process:
        ran.append("is_main_process")

    @accelerator.on_main_process
    def do_my_main_thing():
        ran.append("on_main_process")
    do_my_main_thing()

    # Execute on a specific process.
    @accelerator.on_process(process_index=0)
    def do_thing_on_index_zero():
        ran.append("on_process(process_index=0)")
    do_thing_on_index_zero()

    @accelerator.on_local_process(local_process_idx=0)
    def do_thing_on_local_index_zero():
        ran.append("on_local_process(local_process_idx=0)")
    do_thing_on_local_index_zero()

    @accelerator.on_local_process(local_process_index=1)
    def do_thing_on_local_index_one():
        ran.append("on_local_process(local_process_index=1)")
    do_thing_on_local_index_one()

    @accelerator.on_last_process
    def do_thing_on_last():
        ran.append("on_last_process")
    do_thing_on_last()

    # Defer execution.
    accelerator.wait_for_everyone()
    with accelerator.main_process_first():
        ran.append("main_process_first")
    with accelerator.split_between_processes(["a", "b", "c"], apply_padding=True) as mine:
        ran.append(f"split {mine}")
    accelerator.wait_for_everyone()

    if me == 0:
        want = ["is_local_main_process", "on_local_main_process", "is_main_process",
                "on_main_process", "on_process(process_index=0)",
                "on_local_process(local_process_idx=0)", "main_process_first",
                "split ['a', 'b']"]
    else:
        want = ["on_local_process(local_process_index=1)", "on_last_process",
                "main_process_first", "split ['c', 'c']"]
    expect(f"what ran on process {me}", ran, want)

    # Stop execution early (Accelerate's set_trigger / check_trigger): one process says so, and
    # every process leaves its loop at the same step.
    steps = 0
    for step in range(10):
        steps += 1
        if me == 1 and step == 3:  # should_do_early_stopping(loss)
            accelerator.set_trigger()
        if accelerator.check_trigger():
            break
    expect("the steps before the trigger", steps, 4)

    # The rest of Accelerate is not pretended to.
    try:
        accelerator.prepare(None)
        sys.exit("accelerate_guide: accelerator.prepare was found")
    except AttributeError as error:
        expect("the refusal of prepare", "execution control only" in str(error), True)
    print(f"accelerate_guide: ok on process {me}")


if __name__ == "__main__":
    main()
