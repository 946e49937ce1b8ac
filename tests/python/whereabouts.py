"""Issue 44 from Python: where each process is when a job hangs (the stall notice), a mismatched
barrier caught (LOCKSTEP_CHECK=strict), and a main_process_first block that raised on the main
process (an error, not a silent pairing). Runs jobs of 2 processes under lockstep-run (argv[1])
and checks what they say; exits non-zero naming the first difference."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

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
if mode == "status":
    state.wait_for_everyone()
    if state.process_index == 1:
        time.sleep(3)
    state.wait_for_everyone()  # status: process 0 waits here
    sys.exit(0)
if state.process_index == 1:
    time.sleep(1.0)  # the main process waits long in its extra wait: its place is recorded
try:
    if state.is_main_process:
        state.wait_for_everyone()  # main-only
    state.wait_for_everyone()  # common
except lockstep.Error as error:  # kept in a file: the launcher stops the others at a failure
    with open(sys.argv[2] + str(state.process_index), "w", encoding="utf-8") as file:
        file.write(str(error))
    sys.exit(0)
if state.process_index == 1:
    time.sleep(1.5)
    state.wait_for_everyone()
'''
def line_of(mark):
    return next(n for n, text in enumerate(CHILD.split("\n"), 1) if text.endswith("# " + mark))


MAIN_ONLY = line_of("main-only")
COMMON = line_of("common")
STATUS_WAIT = line_of("status: process 0 waits here")


def ranks(launcher, *command):
    """lockstep-run's command line for 2 processes of `command` under this interpreter; under
    ASan (LOCKSTEP_TEST_PRELOAD) the interpreter gets the runtime preloaded, not the launcher."""
    preload = os.environ.get("LOCKSTEP_TEST_PRELOAD", "")
    return ([launcher, "--nproc-per-node", "2"] +
            (["/usr/bin/env", "LD_PRELOAD=" + preload] if preload else []) +
            [sys.executable] + list(command))


def run(launcher, child, mode, **env):
    return subprocess.run(ranks(launcher, child, mode, child + ".error-"),
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60, check=False)


def expect(what, text, part, *others):
    """`part`, or one of `others`, is in `text`."""
    if not any(one in text for one in (part,) + others):
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
        # Both lines: process 1's common wait passed in its quick try (no place), and the notice
        # names the main-only wait that process 0 met it with. (A process 0 slower to start than
        # process 1's 1 s makes process 1 wait instead, recorded, and process 0's main-only
        # wait pass in its try: then nobody recorded the main-only line.)
        if not re.search("; process 1 is not in a lockstep call: it returned from "
                         r"wait_for_everyone at an unrecorded place \(episode 0\) [0-9.]+ s ago; "
                         "in episode 0, process 0 was in wait_for_everyone at "
                         f"child.py:{MAIN_ONLY};", out):
            expect("stall", out, "; process 1 is not in a lockstep call: it returned from "
                                 f"wait_for_everyone at child.py:{COMMON} (episode 0) ")
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
        # (Process 0's wait passes in its quick try, its place unrecorded, unless process 1 is
        # late to its guard by more than the try.)
        guard = ", process 1 in main_process_first (waiting for the main process) at child.py:6"
        expect("first", out, "met from different calls: process 0 in wait_for_everyone at an "
                             "unrecorded place" + guard,
               "met from different calls: process 0 in wait_for_everyone at child.py:11" + guard)
        expect("first", out, 'child.py", line 12, in <module>')  # process 0's next call fails
        check_status(launcher, child)
        # A path with accents, a terminal's escape and CJK letters, long enough that the log cuts
        # it (it keeps the file's last 90 bytes: here inside a 3-byte letter): --status --json
        # is strict UTF-8 and JSON, and the text carries no control character.
        strange = os.path.join(folder, "expériences \x1b[31m" + "漢" * 40 + "é")
        os.mkdir(strange)
        with open(os.path.join(strange, "child.py"), "w", encoding="utf-8") as file:
            file.write(CHILD)
        check_status(launcher, os.path.join(strange, "child.py"))
    print("whereabouts: the stall notice, strict, main_process_first and --status say where "
          "each process is, whatever the script's path")


def check_status(launcher, child):
    """lockstep-run --status while process 1 sleeps in its own code and process 0 waits: both
    forms, read without disturbing the job (which then ends as it would), nothing left after."""
    job = subprocess.Popen(ranks(launcher, child, "status"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = None
    deadline = time.monotonic() + 20
    while seen is None and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.1)
        # Strictly: bytes that are not UTF-8, or a control character in a string, raise here.
        listing = json.loads(subprocess.run([launcher, "--status", "--json"], capture_output=True,
                                            check=True, timeout=10).stdout.decode("utf-8"))
        for found in listing["jobs"]:
            states = {p["rank"]: p for p in found["processes"]}
            zero, one = states.get(0), states.get(1)
            if (found["world_size"] == 2 and zero and one and zero["state"] == "waiting" and
                    zero["line"] == STATUS_WAIT and one["state"] == "running"):
                seen = found
    if seen is None:
        job.kill()
        sys.exit(f"whereabouts: --status never showed process 0 waiting at line {STATUS_WAIT} "
                 f"and process 1 running:\n{listing}\n{job.communicate()[0]}")
    zero, one = sorted(seen["processes"], key=lambda p: p["rank"])
    if (not zero["file"].endswith("child.py") or zero["episode"] != 1 or
            zero["call"] != "wait_for_everyone" or one["episode"] != 0 or
            one["ended"] != "returned" or zero["pid"] <= 0 or one["pid"] <= 0):
        sys.exit(f"whereabouts: --status --json: {seen}")
    raw = subprocess.run([launcher, "--status"], capture_output=True, check=True,
                         timeout=10).stdout
    text = raw.decode("utf-8")  # strictly
    if any(ord(c) < 0x20 and c != "\n" or 0x7f <= ord(c) < 0xa0 for c in text):
        sys.exit(f"whereabouts: --status wrote a control character: {raw!r}")
    shown = zero["file"].replace("\x1b", "\\x1b")  # as the text escapes it
    expect("--status", text, f"process 0 (pid {zero['pid']}): waiting ")
    expect("--status", text, f" in wait_for_everyone at {shown}:{STATUS_WAIT} in <module> "
                             "(episode 1)")
    expect("--status", text, f"process 1 (pid {one['pid']}): running, its last call "
                             "wait_for_everyone at ")
    out = job.communicate(timeout=30)[0]
    if job.returncode != 0:
        sys.exit(f"whereabouts: the job --status looked at failed ({job.returncode}):\n{out}")
    if seen["segment"] in subprocess.run([launcher, "--status"], capture_output=True, text=True,
                                         check=True, timeout=10).stdout:
        sys.exit(f"whereabouts: {seen['segment']} is still listed after the job ended")


if __name__ == "__main__":
    main()
