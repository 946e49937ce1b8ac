"""Issue 44 from Python: where each process is when a job hangs (the stall notice), a mismatched
barrier caught (LOCKSTEP_CHECK=strict), and a main_process_first block that raised on the main
process (an error, not a silent pairing). Runs jobs of 2 processes under lockstep-run (argv[1])
and checks what they say; exits non-zero naming the first difference."""
import os
import subprocess
import sys
import tempfile

CHILD = '''\
import sys, time, lockstep
state = lockstep.PartialState()
mode = sys.argv[1]
if mode == "first":
    try:
        with state.main_process_first():
            if state.is_main_process:
                raise RuntimeError("the download failed")
    except RuntimeError as error:
        print(f"rank {state.process_index}: {error}", flush=True)
    state.wait_for_everyone()
    state.wait_for_everyone()
    print(f"rank {state.process_index}: passed both", flush=True)
    sys.exit(0)
if state.process_index == 1:
    time.sleep(0.3)  # the main process waits long in its extra wait: its place is recorded
try:
    if state.is_main_process:
        state.wait_for_everyone()
    state.wait_for_everyone()
except lockstep.Error as error:  # kept in a file: the launcher stops the others at a failure
    with open(sys.argv[2] + str(state.process_index), "w", encoding="utf-8") as file:
        file.write(str(error))
    sys.exit(0)
if state.process_index == 1:
    time.sleep(1.5)
    state.wait_for_everyone()
'''
MAIN_ONLY = 19  # the child's lines
COMMON = 20


def run(launcher, child, mode, **env):
    return subprocess.run([launcher, "--nproc-per-node", "2", sys.executable, child, mode,
                           child + ".error-"],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60, check=False)


def expect(what, text, part):
    if part not in text:
        sys.exit(f"whereabouts: {what}: {part!r} is not in:\n{text}")


def main():
    launcher = sys.argv[1]
    with tempfile.TemporaryDirectory() as folder:
        child = os.path.join(folder, "child.py")
        with open(child, "w", encoding="utf-8") as file:
            file.write(CHILD)
        # The stall notice: the late process's last call, the waiter's place. (Process 1's
        # common wait passed in its quick try: Python records no place for it.)
        done = run(launcher, child, "stall", LOCKSTEP_STALL_WARNING="0.5")
        out = done.stdout + done.stderr
        if done.returncode != 0:
            sys.exit(f"whereabouts: the stall job failed ({done.returncode}):\n{out}")
        expect("stall", out, "wait_for_everyone has waited 0.5 s for process 1 of 2 (pid ")
        expect("stall", out, "; process 1 is not in a lockstep call: it returned from "
                             "wait_for_everyone at an unrecorded place (episode 0) ")
        expect("stall", out, f"; process 0 waits in wait_for_everyone at child.py:{COMMON} "
                             "(episode 1)")
        # Strict: the first episode fails on both processes, naming both places.
        done = run(launcher, child, "stall", LOCKSTEP_CHECK="strict")
        apart = (f"wait_for_everyone: episode 0 met at different places: process 0 in "
                 f"wait_for_everyone at child.py:{MAIN_ONLY}, process 1 in wait_for_everyone at "
                 f"child.py:{COMMON} (LOCKSTEP_CHECK=strict")
        for rank in (0, 1):
            try:
                with open(child + ".error-" + str(rank), encoding="utf-8") as file:
                    expect(f"strict, process {rank}", file.read(), apart)
            except FileNotFoundError:
                sys.exit(f"whereabouts: strict: process {rank} passed:\n"
                         f"{done.stdout + done.stderr}")
        # main_process_first: the others' guard fails naming both calls; nobody passes both.
        done = run(launcher, child, "first")
        out = done.stdout + done.stderr
        if done.returncode == 0 or "passed both" in out:
            sys.exit(f"whereabouts: the main_process_first job passed:\n{out}")
        # (Process 0's wait passed in its quick try: its place is not recorded.)
        expect("first", out, "met from different calls: process 0 in wait_for_everyone at "
                             "an unrecorded place, process 1 in main_process_first (waiting for "
                             "the main process) at child.py:6")
        expect("first", out, 'child.py", line 12, in <module>')  # process 0's next call fails
    print("whereabouts: the stall notice, strict and main_process_first say where each is")


if __name__ == "__main__":
    main()
