"""What tools/bench-report's parts share: running a child, reading Google Benchmark's files,
formatting a figure, the build's facts and docs/performance.md's blocks."""
import json
import os
import statistics
import sys
import time

import bench_process
from bench_provenance import machine, tree_commit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(text):
    """A line on standard error, named by the tool that runs (bench-report, bench-exchanges)."""
    print(f"{os.path.basename(sys.argv[0])}: {text}", file=sys.stderr, flush=True)


run = bench_process.run  # each child within --child-timeout (tools/bench_process.py)


def gb_runs(path, on_error):
    """Google Benchmark's measured runs in the JSON file `path`, as (name up to its first '/',
    N from its 'ranks:' argument, real time in us, the whole entry); a failed run goes to
    on_error(text) instead."""
    with open(path) as f:
        data = json.load(f)
    for bench in data["benchmarks"]:
        if bench.get("error_occurred"):
            on_error(f"{bench['name']}: {bench.get('error_message')}")
            continue
        if bench.get("run_type") != "iteration":
            continue
        base, _, rest = bench["name"].partition("/")
        ranks = int(rest.split("ranks:")[1].split("/")[0])
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[bench["time_unit"]]
        yield base, ranks, bench["real_time"] * scale, bench


def fmt(value):
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def build_options(build):
    """The build's options, {name: value} ({} when they cannot be told)."""
    try:
        options = json.loads(bench_process.query(["meson", "introspect", "--buildoptions", build]))
    except (TypeError, json.JSONDecodeError):
        return {}
    return {o["name"]: o["value"] for o in options}


def machine_state():
    """The load average, and the runnable tasks other than this reader (the mean of ten
    samples over a second: the load average lags by minutes)."""
    runnable = []
    for _ in range(10):
        with open("/proc/loadavg") as f:
            fields = f.read().split()
        runnable.append(int(fields[3].split("/")[0]) - 1)
        time.sleep(0.1)
    return {"loadavg": [float(x) for x in fields[:3]],
            "runnable": statistics.mean(runnable)}


def source_commit(build):
    """The commit of the source tree a build directory was configured from (with "-dirty" when
    that tree has uncommitted changes), or None."""
    try:
        with open(os.path.join(build, "meson-info", "meson-info.json")) as f:
            source = json.load(f)["directories"]["source"]
    except (OSError, KeyError, json.JSONDecodeError):
        return None
    commit, dirty = tree_commit(source)
    return commit and commit + ("-dirty" if dirty else "")


def build_info(build):
    info = {"machine": machine(), "cpus": len(os.sched_getaffinity(0))}
    try:
        intro = lambda what: json.loads(bench_process.query(["meson", "introspect", what, build]))
        info["version"] = intro("--projectinfo").get("version")
        options = {o["name"]: o["value"] for o in intro("--buildoptions")}
        info["buildtype"] = options.get("buildtype")
        info["wait_policy_default"] = options.get("wait_policy")
        # Meson 1.0 has no --compilers: the compiler that built the library's first source.
        target = next(t for t in intro("--targets") if t["name"].startswith("lockstep_")
                      and t["target_sources"])
        compiler = target["target_sources"][0]["compiler"]
        info["compiler"] = bench_process.query(compiler[:1] + ["--version"]).splitlines()[0]
    except (TypeError, AttributeError, json.JSONDecodeError, StopIteration, KeyError, IndexError):
        pass
    return info


def publish_block(report, out, block="bench-report"):
    path = os.path.join(ROOT, "docs", "performance.md")
    with open(path) as f:
        text = f.read()
    begin, end = f"<!-- {block}:begin -->", f"<!-- {block}:end -->"
    if begin not in text or end not in text:
        log(f"docs/performance.md has no {block} markers: not updated")
        return
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    image = os.path.relpath(os.path.join(out, "latency.svg"), os.path.dirname(path))
    plot = (f"\n![Barrier latency against N]({image})\n"
            if block == "bench-report" and os.path.exists(os.path.join(out, "latency.svg"))
            else "")
    with open(path, "w") as f:
        f.write(head + begin + "\n" + report + plot + end + tail)
