"""How tools/bench-report and tools/bench-crossnode run a benchmark process.

A child that hangs (a barrier that never completes, a rank stopped or stuck, a peer that never
connects) would hang the report for ever, with its load generators still running beside it: each
child has CHILD_TIMEOUT seconds (the tools' --child-timeout sets it), then it and every process
it started are killed and the tool stops, naming the command. Each child runs in a session of its
own, so that all of them can be killed together; a Ctrl-C, which reaches the tool's process group
only, kills them too.
"""
import os
import shlex
import signal
import subprocess
import sys

CHILD_TIMEOUT = 900.0
# Seconds a query for the record (git, meson introspect, a compiler's --version) may take.
QUERY_TIMEOUT = 60.0


def kill_session(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # nothing of it left
    proc.wait()


def finish(proc, timeout):
    """proc.communicate(timeout=timeout); on a timeout (raised again) or any other exception,
    `proc` and the processes it started are killed first."""
    try:
        return proc.communicate(timeout=timeout)
    except BaseException:
        kill_session(proc)
        raise


def run(command, check=True, limited=True, **kwargs):
    """subprocess.run(command, check=check, text=True, ...), within CHILD_TIMEOUT if `limited`
    (not a build, whose length says nothing about a hang)."""
    proc = subprocess.Popen(command, text=True, start_new_session=True, **kwargs)
    try:
        stdout, stderr = finish(proc, CHILD_TIMEOUT if limited else None)
    except subprocess.TimeoutExpired:
        sys.exit(f"{os.path.basename(sys.argv[0])}: `{shlex.join(map(str, command))}` did not "
                 f"finish within {CHILD_TIMEOUT:g} s (--child-timeout); it and the processes it "
                 "started were killed, and the run stops here")
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, command, stdout, stderr)
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def query(command):
    """The stdout of `command`, or None when it cannot be run, fails or takes more than
    QUERY_TIMEOUT seconds (a stale lock, a network file system): then it and the processes it
    started are killed, and what it would have told the record stays unknown; the run goes on."""
    try:
        proc = subprocess.Popen(command, text=True, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    try:
        stdout, _ = finish(proc, QUERY_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None
    return stdout if proc.returncode == 0 else None


def add_argument(parser):
    parser.add_argument("--child-timeout", type=float, default=CHILD_TIMEOUT,
                        help="seconds each benchmark process may run before it and the "
                        "processes it started are killed and the run stops (default %(default)g)")


def apply(parser, args):
    """Sets CHILD_TIMEOUT from the parsed --child-timeout (a parser error unless above 0)."""
    global CHILD_TIMEOUT
    if not args.child_timeout > 0:
        parser.error("--child-timeout: more than 0 seconds")
    CHILD_TIMEOUT = args.child_timeout
