"""The queries for a run's record (git, meson introspect, the compiler's --version) are bounded.

    python3 queries_check.py SOURCE_ROOT OUT_DIR

With a `git` and a `meson` on PATH that never answer, and the queries' limit at 1 s, the record
of a run comes back within seconds with those fields unknown, the hung processes (and one each
started) killed; a checkout whose status cannot be read (git status hangs or fails after the
commit was read) is not called clean.
"""
import os
import stat
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ beside the checks
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_module import fail, load_bench_report  # noqa: E402

ROOT, OUT = sys.argv[1], sys.argv[2]
report = load_bench_report(ROOT)
process = sys.modules["bench_process"]
provenance = sys.modules["bench_provenance"]
process.QUERY_TIMEOUT = 1.0

fake = os.path.join(OUT, "bin")
os.makedirs(fake, exist_ok=True)
pids = os.path.join(OUT, "pids")


def script(name, body):
    path = os.path.join(fake, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, stat.S_IRWXU)


# A query that hangs, with a process of its own that holds its stdout open.
HANG = f'sleep 300 & echo $! >>"{pids}"\nsleep 300\n'
script("meson", HANG)
os.environ["PATH"] = fake + os.pathsep + os.environ["PATH"]


def timed(what, call):
    start = time.monotonic()
    result = call()
    took = time.monotonic() - start
    if took > 10:
        fail(f"{what} took {took:.1f} s with queries limited to 1 s")
    return result


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


build = os.path.join(OUT, "build")
os.makedirs(build, exist_ok=True)
if timed("sanitizers() with a hung meson", lambda: report.sanitizers(build)) != "":
    fail("sanitizers() did not say none when meson did not answer")
info = timed("build_info() with a hung meson", lambda: sys.modules["bench_common"].build_info(build))
if "buildtype" in info or "compiler" in info or info.get("cpus", 0) < 1:
    fail(f"build_info() with a hung meson: {info}")

# git: a hung rev-parse leaves the commit unknown; a status that hangs or fails after the commit
# was read is not clean.
for status, expect in (("sleep 300", True), ("exit 128", True), ("exit 0", False),
                       ("echo ' M lib/x.cpp'", True)):
    script("git", f'case "$3" in\n  rev-parse) echo 0123456789ab ;;\n  status) {status} ;;\nesac\n')
    commit, dirty = timed("tree_commit()", lambda: provenance.tree_commit(ROOT))
    if commit != "0123456789ab" or dirty != expect:
        fail(f"tree_commit() with git status `{status}`: {commit}, dirty {dirty}; "
             f"expected dirty {expect}")
script("git", HANG)
commit, dirty = timed("tree_commit() with a hung git", lambda: provenance.tree_commit(ROOT))
if commit is not None or dirty:
    fail(f"tree_commit() with a hung git: {commit}, dirty {dirty}")

with open(pids) as f:
    started = [int(line) for line in f if line.strip()]
if len(started) < 3:
    fail(f"the hung queries started {len(started)} processes, expected one per query")
deadline = time.monotonic() + 5
while not all(gone(pid) for pid in started):
    if time.monotonic() > deadline:
        fail(f"processes of hung queries left running: "
             f"{[pid for pid in started if not gone(pid)]}")
    time.sleep(0.05)
print(f"queries: {len(started)} hung queries stopped after 1 s each; their processes killed")
