"""A published run's raw files, packed and unpacked (tools/bench_provenance.py).

    python3 raw_archive_check.py SOURCE_ROOT OUT_DIR

pack_raw leaves raw.tar.xz in place of raw/, with every regular file of raw/ and nothing else
(a link or a FIFO there is left out); unpack_raw brings the files back byte for byte, keeps a
file that raw/ already holds, never writes through a link left in raw/, and takes nothing from
an archive but plain files named raw/<name> (a member that names ../, a link, a device).
"""
import io
import os
import shutil
import sys
import tarfile

sys.dont_write_bytecode = True  # no __pycache__ beside the checks
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_module import fail, load_bench_report  # noqa: E402

ROOT, OUT = sys.argv[1], sys.argv[2]
load_bench_report(ROOT)
provenance = sys.modules["bench_provenance"]

run = os.path.join(OUT, "run")
shutil.rmtree(OUT, ignore_errors=True)
raw = os.path.join(run, "raw")
os.makedirs(raw)
files = {f"ab-load{i}-n2-round0-this.json": (b'{"benchmarks": [%d]}\n' % i) * (i + 1)
         for i in range(40)}
for name, data in files.items():
    with open(os.path.join(raw, name), "wb") as f:
        f.write(data)
outside = os.path.join(OUT, "outside.txt")
with open(outside, "w") as f:
    f.write("the user's\n")
os.symlink(outside, os.path.join(raw, "link.json"))
os.mkfifo(os.path.join(raw, "fifo.json"))

provenance.pack_raw(run)
archive = os.path.join(run, provenance.RAW_ARCHIVE)
if os.path.exists(raw) or not os.path.isfile(archive):
    fail(f"pack_raw: raw/ should be gone and {archive} there: {os.listdir(run)}")
with tarfile.open(archive, "r:xz") as tar:
    names = sorted(member.name for member in tar)
if names != sorted(f"raw/{name}" for name in files):
    fail(f"pack_raw packed {names}, not the {len(files)} regular files")

# A second run into the same folder: one file of its own already written, and a link where one of
# the packed files would go.
os.makedirs(raw)
mine = next(iter(files))
with open(os.path.join(raw, mine), "wb") as f:
    f.write(b"this run's\n")
linked = list(files)[1]
os.symlink(outside, os.path.join(raw, linked))
provenance.unpack_raw(run)
if os.path.exists(archive):
    fail("unpack_raw left the archive")
with open(os.path.join(raw, mine), "rb") as f:
    if f.read() != b"this run's\n":
        fail("unpack_raw overwrote a file of the run that unpacked it")
with open(outside) as f:
    if f.read() != "the user's\n":
        fail("unpack_raw wrote through a link in raw/")
for name, data in files.items():
    if name in (mine, linked):
        continue
    with open(os.path.join(raw, name), "rb") as f:
        if f.read() != data:
            fail(f"unpack_raw: {name} differs from what was packed")

# A crafted archive: only raw/<plain name> regular files come out.
shutil.rmtree(raw)
os.makedirs(raw)
with tarfile.open(archive, "w:xz") as tar:
    def add(name, data=b"x", kind=tarfile.REGTYPE, target=""):
        info = tarfile.TarInfo(name)
        regular = kind == tarfile.REGTYPE
        info.type, info.size, info.linkname = kind, len(data) if regular else 0, target
        tar.addfile(info, io.BytesIO(data) if regular else None)
    add("raw/../escaped.json")
    add("../escaped2.json")
    add("/tmp/absolute.json")
    add("raw/sub/deep.json")
    add("raw/link.json", kind=tarfile.SYMTYPE, target=outside)
    add("raw/hard.json", kind=tarfile.LNKTYPE, target="raw/good.json")
    add("raw/dev.json", kind=tarfile.CHRTYPE)
    add("raw/good.json", b"good\n")
provenance.unpack_raw(run)
if sorted(os.listdir(raw)) != ["good.json"]:
    fail(f"unpack_raw took more than raw/good.json from a crafted archive: {os.listdir(raw)}")
for stray in ("escaped.json", "escaped2.json"):
    if os.path.exists(os.path.join(run, stray)) or os.path.exists(os.path.join(OUT, stray)):
        fail(f"unpack_raw wrote {stray} outside raw/")
print(f"OK: {len(files)} files packed and unpacked; links, FIFOs and crafted members left out")
