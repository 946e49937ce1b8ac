"""One process of a real job, checking the Python package from inside it:

    lockstep-run --nproc-per-node 4 python3 -m job_check DIR     (PYTHONPATH: lockstep, tests/python)

DIR: an empty folder the job shares. Every check that fails exits 1 with its reason; the main
process prints "job_check: ok N" once every process has passed.
"""
import os
import signal
import sys
import threading
import time

import lockstep


def fail(what):
    print(f"job_check: process {os.environ.get('RANK', '?')}: FAILED: {what}", file=sys.stderr,
          flush=True)
    sys.exit(1)


def check(condition, what):
    if not condition:
        fail(what)


def main():
    folder = sys.argv[1]
    os.makedirs(folder, exist_ok=True)
    state = lockstep.PartialState()
    n, me = state.num_processes, state.process_index
    check(lockstep.PartialState().process_index == me, "a second PartialState differs")
    check(me == int(os.environ["RANK"]), f"process_index {me} but RANK={os.environ['RANK']}")
    check(n == int(os.environ["WORLD_SIZE"]), f"num_processes {n}")
    check(state.local_process_index == int(os.environ["LOCAL_RANK"]), "local_process_index")
    check(state.is_main_process == (me == 0), "is_main_process")
    check(state.is_local_main_process == (state.local_process_index == 0), "is_local_main")
    check(state.is_last_process == (me == n - 1), "is_last_process")
    check(n >= 3, "the job needs 3 processes or more")

    # main_process_first: the main process writes, the others find it written.
    marker = os.path.join(folder, "prepared")
    with state.main_process_first():
        if state.is_main_process:
            if os.path.exists(marker):
                os.remove(marker)  # an earlier run's
            time.sleep(0.2)
            with open(marker, "w", encoding="utf-8") as f:
                f.write("ready")
        else:
            check(os.path.exists(marker), "inside main_process_first before the main process")
    with state.local_main_process_first():
        check(os.path.exists(marker), "local_main_process_first")

    # The decorators: each runs where it says and returns None elsewhere.
    ran = []

    @state.on_main_process
    def on_main():
        ran.append("main")
        return "main"

    @state.on_local_main_process
    def on_local_main():
        ran.append("local-main")

    @state.on_last_process
    def on_last():
        ran.append("last")

    @state.on_process(process_index=1)
    def on_one(value):
        ran.append(f"one:{value}")

    @state.on_local_process(local_process_index=2)
    def on_local_two():
        ran.append("local-two")

    result = on_main()
    on_local_main()
    on_last()
    on_one(7)
    on_local_two()
    want = (["main"] if me == 0 else []) + (["local-main"] if state.local_process_index == 0
                                           else []) + (["last"] if me == n - 1 else []) + \
        (["one:7"] if me == 1 else []) + (["local-two"] if state.local_process_index == 2 else [])
    check(ran == want, f"decorators ran {ran}, not {want}")
    check(result == ("main" if me == 0 else None), f"on_main_process returned {result!r}")
    check(on_main.__name__ == "on_main", "the decorator keeps the function's name")

    # split_between_processes: every item once, across the job.
    items = list(range(4 * n + 1))
    with state.split_between_processes(items) as mine:
        with open(os.path.join(folder, f"share{me}"), "w", encoding="utf-8") as f:
            f.write(",".join(map(str, mine)))
    state.wait_for_everyone()
    if state.is_main_process:
        seen = []
        for rank in range(n):
            with open(os.path.join(folder, f"share{rank}"), encoding="utf-8") as f:
                text = f.read()
            seen += [int(x) for x in text.split(",") if x]
        check(seen == items, f"the shares cover {seen}, not {items}")

    # A timeout: the main process waits 0.3 s while the others come 1 s later. It is both
    # lockstep.TimeoutError and the built-in TimeoutError, names the late ones, and the job goes on.
    if state.is_main_process:
        try:
            state.wait_for_everyone(timeout=0.3)
            fail("wait_for_everyone(timeout=0.3) returned while the others slept")
        except TimeoutError as error:
            check(isinstance(error, lockstep.TimeoutError), "not a lockstep.TimeoutError")
            check(isinstance(error, lockstep.Error), "not a lockstep.Error")
            check("1" in str(error), f"the message names no process: {error}")
    else:
        time.sleep(1.0)
    state.wait_for_everyone()
    try:
        state.wait_for_everyone(timeout=-1)
        fail("a negative timeout was accepted")
    except ValueError:
        pass
    state.wait_for_everyone(timeout=30)
    state.wait_for_everyone(timeout=float("inf"))  # no deadline (issue 21: was OverflowError)
    check_interrupts(state, folder)
    state.print(f"job_check: ok {n}")


def check_interrupts(state, folder):
    """Ctrl-C interrupts a wait (issue 21 #7): the main process gets SIGINT while the others are
    late, catches KeyboardInterrupt, and waits again with them (its first arrival was withdrawn).
    Process 1's own signal, whose handler returns, does not end its wait."""
    me = state.process_index
    came = os.path.join(folder, "came")
    if me == 0 and os.path.exists(came):
        os.remove(came)  # an earlier run's
    state.wait_for_everyone()
    if me == 0:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        start = time.monotonic()
        try:
            state.wait_for_everyone()
            fail("wait_for_everyone returned while the others slept (no KeyboardInterrupt)")
        except KeyboardInterrupt:
            check(time.monotonic() - start < 1.2, "Ctrl-C took more than 1.2 s to interrupt")
        check(not os.path.exists(came), "a late process came before the interrupt")
    else:
        caught = []
        previous = signal.signal(signal.SIGUSR1, lambda *_: caught.append(1))
        if me == 1:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
            state.wait_for_everyone(timeout=30)  # process 2 comes at 1.5 s: the signal was first
            check(caught == [1], f"process 1's handler ran {len(caught)} times")
        else:
            time.sleep(1.5)
            with open(came, "w", encoding="utf-8") as f:
                f.write("came")
            state.wait_for_everyone()
        signal.signal(signal.SIGUSR1, previous)
    if me == 0:
        state.wait_for_everyone()  # with the others' one arrival: the interrupted one is withdrawn
        check(os.path.exists(came), "the wait after the interrupt passed before the late process")
    state.wait_for_everyone(timeout=30)  # and the episodes still line up


if __name__ == "__main__":
    main()
