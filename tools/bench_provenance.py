"""Where a published figure comes from, for tools/bench-report, tools/bench-crossnode and
tools/bench-ab: the date, the commit, whether the tree was dirty, the command and the machine (and
the placement of two vCPUs, told by their cache-line round trip); a folder per run and its line in
bench/results/INDEX.md; a published run's raw files packed in one archive."""
import datetime
import os
import platform
import shlex
import shutil
import stat
import sys
import tarfile

import bench_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
# A published run's raw/, packed (pack_raw).
RAW_ARCHIVE = "raw.tar.xz"
# A cache-line round trip between two vCPUs below this (us): they were SMT siblings of one core
# (about 0.05 us); above, separate cores (0.13-0.3 us). The host moves a VM's vCPUs between the
# two, which moves every figure: the tools compare rounds within one placement.
SMT_ROUND_TRIP_US = 0.1
# A round whose round trip before and after differ by more than this saw its vCPUs move.
MOVED = 1.25


def placement(before, after):
    """Where two vCPUs were during a round, told by the round trips (us) before and after it:
    "SMT siblings", "separate cores", "moved" (between the two), or "unknown" (one not measured)."""
    if before is None or after is None:
        return "unknown"
    if max(before, after) > MOVED * min(before, after):
        return "moved"
    return "SMT siblings" if max(before, after) < SMT_ROUND_TRIP_US else "separate cores"


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/etc/os-release") as f:
            os_name = next((l.split("=", 1)[1].strip().strip('"') for l in f
                            if l.startswith("PRETTY_NAME=")), "Linux")
    except OSError:
        os_name = "Linux"
    return f"{os.cpu_count()} vCPUs ({model}), {os_name}, kernel {platform.release()}"


def tree_commit(root):
    """(the commit of the source tree `root`, 12 digits, or None when it is not a git checkout;
    whether its tracked files have uncommitted changes)."""
    def git(*argv):
        out = bench_process.query(["git", "-C", root, *argv])
        return None if out is None else out.strip()
    commit = git("rev-parse", "--short=12", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    # A checkout whose status cannot be read is not called clean.
    return commit, bool(status) or (commit is not None and status is None)


def provenance():
    """Where a run's figures come from: the date (UTC), the commit, whether the tree had
    uncommitted changes, the command, the machine."""
    commit, dirty = tree_commit(ROOT)
    return {"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "commit": commit or "unknown (not a git checkout)",
            "dirty": dirty, "machine": machine(),
            "command": " ".join([f"tools/{os.path.basename(sys.argv[0])}"]
                                + [shlex.quote(a) for a in sys.argv[1:]])}


def measured_by(prov):
    """The first words of every published block."""
    dirty = " with uncommitted changes" if prov["dirty"] else ""
    return (f"Measured by `{prov['command']}` on {prov['date']} at commit "
            f"{prov['commit']}{dirty}: {prov['machine']}")


def prepare_output(args, prov, tool="bench-report", suffix=""):
    """The run's own folder (args.out when given). A run that is published (args.publish) goes
    into bench/results/runs/ with a line in bench/results/INDEX.md, and is refused from a dirty
    tree unless args.allow_dirty, or with an args.out outside bench/results; any other stays
    outside the source tree."""
    name = f"{prov['date']}-{prov['commit'].split()[0]}" + ("-dirty" if prov["dirty"] else "")
    # A published run's figures must stay with the blocks that quote them.
    if args.publish and args.out and not os.path.realpath(args.out).startswith(
            os.path.realpath(RESULTS) + os.sep):
        sys.exit(f"{tool}: --publish keeps the run in bench/results/runs/ with a line in "
                 f"bench/results/INDEX.md, and --out {args.out} is outside bench/results: "
                 "leave --out out to publish")
    if args.publish and prov["dirty"] and not args.allow_dirty:
        sys.exit(f"{tool}: --publish publishes figures, and this tree has uncommitted changes "
                 "(git status): commit them first, or pass --allow-dirty, which says so in "
                 "every published block")
    if not args.out:
        if args.publish:
            args.out = os.path.join(RESULTS, "runs", name + suffix)
        else:
            cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
                os.path.expanduser("~"), ".cache")
            args.out = os.path.join(cache, "lockstep", "bench", name + suffix)
    os.makedirs(os.path.join(args.out, "raw"), exist_ok=True)
    unpack_raw(args.out)
    index = os.path.join(RESULTS, "INDEX.md")
    if args.publish and os.path.exists(index):  # args.out lies in bench/results (see above)
        with open(index, "a") as f:
            f.write(f"| {prov['date']} | {prov['commit']}{' (dirty)' if prov['dirty'] else ''} | "
                    f"{prov['machine']} | `{prov['command']}` | "
                    f"{os.path.relpath(args.out, os.path.dirname(index))} |\n")


def pack_raw(out):
    """Packs the run folder `out`'s raw/ into raw.tar.xz and removes raw/, for a published run:
    the raw files of a load matrix with --baseline are about 730 JSON files and 11 MB, which every
    clone would carry. Only regular files are packed, each as raw/<name>."""
    raw = os.path.join(out, "raw")
    names = sorted(name for name in os.listdir(raw)
                   if stat.S_ISREG(os.lstat(os.path.join(raw, name)).st_mode))
    archive = os.path.join(out, RAW_ARCHIVE)
    partial = archive + ".partial"

    def anonymous(info):
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info
    with tarfile.open(partial, "w:xz") as tar:
        for name in names:
            tar.add(os.path.join(raw, name), arcname=f"raw/{name}", recursive=False,
                    filter=anonymous)
    os.replace(partial, archive)
    shutil.rmtree(raw)


def unpack_raw(out):
    """A run into a folder that holds a packed raw/ (the same date and commit, published before)
    unpacks it first, so that the earlier run's raw files stay beside the new ones; a file already
    in raw/ is kept. Only plain files named raw/<name> are taken (never a link, a device, or a name
    that leads out of raw/), each created anew (never through a link left in raw/)."""
    archive = os.path.join(out, RAW_ARCHIVE)
    if not os.path.exists(archive):
        return
    raw = os.path.join(out, "raw")
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar:
            name = member.name[len("raw/"):] if member.name.startswith("raw/") else ""
            if not member.isreg() or not name or "/" in name or name in (".", ".."):
                continue
            source = tar.extractfile(member)
            try:
                with source, open(os.path.join(raw, name), "xb") as target:
                    shutil.copyfileobj(source, target)
            except FileExistsError:
                pass
    os.remove(archive)
