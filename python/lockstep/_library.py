"""The C API (lockstep/lockstep.h) through ctypes: loading liblockstep and its prototypes."""
import ctypes
import os

from . import _where

(OK, ERROR, TIMEOUT, PEER_LOST, CONFIG_ERROR, SYSTEM_ERROR, INVALID_ARGUMENT,
 INTERRUPTED) = range(8)

# lockstep.h's lockstep_bytes_fn: (context, process index, bytes, size), the bytes valid during
# the call only.
BYTES_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)

_QUERIES = ("process_index", "local_process_index", "num_processes", "num_local_processes",
            "node_index", "num_nodes", "is_main_process", "is_local_main_process",
            "is_last_process", "device", "use_distributed")


def _candidates():
    chosen = os.environ.get("LOCKSTEP_LIBRARY")
    if chosen:
        return [chosen]  # the user's choice, and only it
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.normpath(os.path.join(here, _where.LIBRARY))]


def load():
    """Opens liblockstep: LOCKSTEP_LIBRARY if set, else the one installed with this package."""
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as error:
            errors.append(str(error))
    else:
        raise ImportError("lockstep: cannot load liblockstep (" + "; ".join(errors) + "): "
                          "reinstall lockstep, or set LOCKSTEP_LIBRARY to liblockstep.so's path")
    lib.lockstep_state_create.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.lockstep_state_create.restype = ctypes.c_int
    for name in _QUERIES:
        function = getattr(lib, "lockstep_" + name)
        function.argtypes = [ctypes.c_void_p]
        function.restype = ctypes.c_int
    lib.lockstep_leave.argtypes = [ctypes.c_void_p]
    lib.lockstep_leave.restype = ctypes.c_int
    lib.lockstep_available_backends.argtypes = []
    lib.lockstep_available_backends.restype = ctypes.c_char_p
    lib.lockstep_wait_for_everyone.argtypes = [ctypes.c_void_p]
    lib.lockstep_wait_for_everyone.restype = ctypes.c_int
    lib.lockstep_wait_for_everyone_for.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.lockstep_wait_for_everyone_for.restype = ctypes.c_int
    lib.lockstep_try_wait_for_everyone.argtypes = [ctypes.c_void_p]
    lib.lockstep_try_wait_for_everyone.restype = ctypes.c_int
    lib.lockstep_broadcast.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                       ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_size_t)]
    lib.lockstep_broadcast.restype = ctypes.c_int
    lib.lockstep_free.argtypes = [ctypes.c_void_p]
    lib.lockstep_free.restype = None
    lib.lockstep_set_trigger.argtypes = [ctypes.c_void_p]
    lib.lockstep_set_trigger.restype = ctypes.c_int
    for name in ("main_process_first_begin", "main_process_first_end",
                 "local_main_process_first_begin", "local_main_process_first_end"):
        function = getattr(lib, "lockstep_" + name)
        function.argtypes = [ctypes.c_void_p]
        function.restype = ctypes.c_int
    lib.lockstep_split_range.argtypes = [ctypes.c_uint64, ctypes.c_int, ctypes.c_int] + \
        [ctypes.POINTER(ctypes.c_uint64)] * 3
    lib.lockstep_split_range.restype = ctypes.c_int
    # The calls' _at forms: the caller's file, line and function (lockstep.h), kept alive by
    # lockstep._site for the process's life.
    site = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    for name, head in (("state_create_at", [ctypes.POINTER(ctypes.c_void_p)]),
                       ("wait_for_everyone_at", [ctypes.c_void_p]),
                       ("wait_for_everyone_for_at", [ctypes.c_void_p, ctypes.c_int64]),
                       ("try_wait_for_everyone_at", [ctypes.c_void_p]),
                       ("broadcast_at", lib.lockstep_broadcast.argtypes),
                       ("gather_object_at", [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                             ctypes.POINTER(ctypes.c_void_p),
                                             ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]),
                       ("broadcast_in_place_at", [ctypes.c_void_p, ctypes.c_char_p,
                                                  ctypes.c_size_t, BYTES_FN, ctypes.c_void_p]),
                       ("gather_object_in_place_at", [ctypes.c_void_p, ctypes.c_char_p,
                                                      ctypes.c_size_t, BYTES_FN,
                                                      ctypes.c_void_p]),
                       ("check_trigger_at", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]),
                       ("main_process_first_begin_at", [ctypes.c_void_p]),
                       ("main_process_first_end_at", [ctypes.c_void_p]),
                       ("local_main_process_first_begin_at", [ctypes.c_void_p]),
                       ("local_main_process_first_end_at", [ctypes.c_void_p])):
        function = getattr(lib, "lockstep_" + name)
        function.argtypes = head + site
        function.restype = ctypes.c_int
    lib.lockstep_set_interrupt_fd.argtypes = [ctypes.c_int]
    lib.lockstep_set_interrupt_fd.restype = ctypes.c_int
    for name in ("lockstep_last_error", "lockstep_version"):
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = ctypes.c_char_p
    lib.lockstep_status_name.argtypes = [ctypes.c_int]
    lib.lockstep_status_name.restype = ctypes.c_char_p
    return lib
