#!/usr/bin/env python3
"""lockstep from Python through ctypes: processes started by lockstep-run meet in its barrier.

    lockstep-run --nproc-per-node 4 python3 examples/python/lockstep_barrier.py [WORKDIR]

Set LOCKSTEP_LIBRARY to the path of liblockstep.so when it is not on the loader's path.
Each process writes a file, waits for everyone, then checks that every file is there; the main
process reports. Exits non-zero on any failure, with lockstep's message.
"""
import ctypes
import os
import sys
import tempfile

OK, TIMEOUT = 0, 2


class LockstepError(RuntimeError):
    pass


def load():
    lib = ctypes.CDLL(os.environ.get("LOCKSTEP_LIBRARY", "liblockstep.so.0"))
    lib.lockstep_state_create.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.lockstep_state_create.restype = ctypes.c_int
    lib.lockstep_state_destroy.argtypes = [ctypes.c_void_p]
    lib.lockstep_state_destroy.restype = None
    for name in ("process_index", "local_process_index", "num_processes",
                 "num_local_processes", "node_index", "num_nodes", "is_main_process",
                 "is_local_main_process", "is_last_process"):
        function = getattr(lib, "lockstep_" + name)
        function.argtypes = [ctypes.c_void_p]
        function.restype = ctypes.c_int
    lib.lockstep_wait_for_everyone.argtypes = [ctypes.c_void_p]
    lib.lockstep_wait_for_everyone.restype = ctypes.c_int
    lib.lockstep_wait_for_everyone_for.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.lockstep_wait_for_everyone_for.restype = ctypes.c_int
    lib.lockstep_last_error.argtypes = []
    lib.lockstep_last_error.restype = ctypes.c_char_p
    lib.lockstep_status_name.argtypes = [ctypes.c_int]
    lib.lockstep_status_name.restype = ctypes.c_char_p
    return lib


class State:
    """A small Python face on lockstep's C API, in Accelerate's names."""

    def __init__(self, lib):
        self._lib = lib
        self._handle = ctypes.c_void_p()
        self._check(lib.lockstep_state_create(ctypes.byref(self._handle)))

    def _check(self, status):
        if status != OK:
            name = self._lib.lockstep_status_name(status).decode()
            raise LockstepError(f"{name}: {self._lib.lockstep_last_error().decode()}")

    def __getattr__(self, name):
        function = getattr(self._lib, "lockstep_" + name)
        value = function(self._handle)
        return bool(value) if name.startswith("is_") else value

    def wait_for_everyone(self, timeout_ms=None):
        if timeout_ms is None:
            self._check(self._lib.lockstep_wait_for_everyone(self._handle))
        else:
            self._check(self._lib.lockstep_wait_for_everyone_for(self._handle, timeout_ms))

    def close(self):
        self._lib.lockstep_state_destroy(self._handle)


def main():
    workdir = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
    state = State(load())
    rank, n = state.process_index, state.num_processes
    job = os.environ.get("LOCKSTEP_JOB_ID", "solo").split("@")[0]
    mine = os.path.join(workdir, f"lockstep-py-{job}-{rank}")
    with open(mine, "w") as f:
        f.write(str(rank))
    state.wait_for_everyone()
    seen = [os.path.exists(os.path.join(workdir, f"lockstep-py-{job}-{k}")) for k in range(n)]
    if not all(seen):
        raise SystemExit(f"process {rank}: passed the barrier before every file was written")
    for _ in range(1000):
        state.wait_for_everyone(timeout_ms=30000)
    state.wait_for_everyone()  # nobody removes a file before everyone has checked
    os.remove(mine)
    if state.is_main_process:
        print(f"python: {n} processes met in lockstep's barrier 1002 times")
    state.close()


if __name__ == "__main__":
    main()
