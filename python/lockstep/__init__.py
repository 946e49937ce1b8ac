"""lockstep for Python: Accelerate's execution control for processes that lockstep-run, torchrun,
mpirun or srun started, over lockstep's shared-memory barrier.

    import lockstep

    state = lockstep.PartialState()
    with state.main_process_first():
        data = load_or_download()          # the main process first, then the others
    with state.split_between_processes(files) as mine:
        results = [work(f) for f in mine]  # each process its contiguous share
    state.wait_for_everyone()

    @state.on_main_process
    def report():
        print("done")

Errors are lockstep.Error and its kinds (ConfigError, TimeoutError, PeerLostError, SystemError),
with lockstep's one-line messages; lockstep.TimeoutError is also the built-in TimeoutError.
"""
import builtins
import contextlib
import ctypes
import enum
import functools
import gc
import math
import operator
import os
import pickle
import signal
import sys
import threading
import time

from . import _library, _where

__all__ = ["PartialState", "AcceleratorState", "Accelerator", "DistributedType", "Error",
           "ConfigError", "TimeoutError", "PeerLostError", "SystemError", "split_range",
           "wait_for_everyone", "broadcast_object_list", "gather_object", "__version__"]


class DistributedType(str, enum.Enum):
    """Accelerate's DistributedType, member for member: a str, so that `state.distributed_type ==
    "MULTI_GPU"` and `== DistributedType.MULTI_GPU` both hold. lockstep's jobs are NO (one
    process), MULTI_CPU or MULTI_GPU; the others are Accelerate's, for code that names them."""
    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


class Error(RuntimeError):
    """Every failure of lockstep (the C++ API's lockstep::Error)."""


class ConfigError(Error):
    """The job's description (its environment variables, the build) is wrong."""


class TimeoutError(Error, builtins.TimeoutError):  # pylint: disable=redefined-builtin
    """A wait did not complete in time; the message names the processes that had not arrived."""


class PeerLostError(Error):
    """Another process of the job died or left before it arrived."""


class SystemError(Error):  # pylint: disable=redefined-builtin
    """A system call failed (a full /dev/shm, ...)."""


_ERRORS = {
    _library.TIMEOUT: TimeoutError,
    _library.PEER_LOST: PeerLostError,
    _library.CONFIG_ERROR: ConfigError,
    _library.SYSTEM_ERROR: SystemError,
}

_lib = _library.load()
__version__ = _lib.lockstep_version().decode()


def _check(status):
    if status == _library.OK:
        return
    message = _lib.lockstep_last_error().decode(errors="replace")
    if status == _library.INVALID_ARGUMENT:
        raise ValueError(message)
    raise _ERRORS.get(status, Error)(message)


def _read_in_place(count, call):
    """What a gather or broadcast read in place gives: each process's object, unpickled where
    its bytes lie (liblockstep's lockstep_bytes_fn, called during the exchange: a mapping of the
    writer's file, the node segment), without a copy of its own; a gather of 1 MiB per process
    at N = 4 copied each process's pickle once more before it was unpickled, into memory new to
    the process. `call` makes the exchange with the callback it is given. What unpickling raises
    (KeyboardInterrupt included) is raised once the exchange is over: the callback may not raise
    through the C call.

    Nothing here may hold the objects in a reference cycle: a gather's result then lived until
    the cyclic collector ran, each call's megabytes on fresh pages (a callback stored on an
    object whose bound method it wraps is such a cycle)."""
    objects = [None] * count
    errors = []

    def each(_context, index, address, size):
        try:
            if not size:
                objects[index] = pickle.loads(b"")
                return
            view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
            try:
                objects[index] = pickle.loads(view)
            finally:
                view.release()
        except BaseException as error:  # pylint: disable=broad-exception-caught
            if not errors:
                errors.append(error)

    _check(call(_library.BYTES_FN(each)))
    if errors:
        raise errors.pop()  # held by no local, so its traceback's frames make no cycle
    return objects


_TORCH = []  # [torch module or None], once looked for


def _torch():
    """torch, where it can be imported (once looked for), else None."""
    if not _TORCH:
        try:
            import torch  # pylint: disable=import-outside-toplevel
        except ImportError:
            torch = None
        _TORCH.append(torch)
    return _TORCH[0]


def _device(name):
    """torch.device(name) where torch can be imported, else the name."""
    torch = _torch()
    return name if torch is None else torch.device(name)


_wakeup = []  # the self-pipe (read end, write end) that signals write to during a wait


def _interruptible(call, *args):
    """`call(*args)` (a blocking C function) with the signal module's wakeup descriptor pointed at
    a pipe that liblockstep watches: a signal with a Python handler ends the wait with
    INTERRUPTED. Off the main thread (where Python runs no handlers) the call is plain."""
    if threading.current_thread() is not threading.main_thread():
        return call(*args)
    if not _wakeup:
        _wakeup.extend(os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC))
    read_end, write_end = _wakeup
    try:
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter
        return call(*args)
    _lib.lockstep_set_interrupt_fd(read_end)
    try:
        return call(*args)
    finally:
        _lib.lockstep_set_interrupt_fd(-1)
        signal.set_wakeup_fd(previous)
        arrived = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read_end, 512):
                arrived += chunk
        if arrived and previous != -1:
            with contextlib.suppress(OSError):  # whoever set it (asyncio) sees the signals too
                os.write(previous, arrived)


def _blocking(call, *args, arguments=None):
    """Runs a blocking C call until it ends other than by a signal. The handlers of the signals
    that interrupted it run between two attempts: Ctrl-C's KeyboardInterrupt (or whatever a
    handler raises) leaves from here, with the process's arrival withdrawn as after a timeout;
    after a handler that returns, the call is made again, with `arguments()` if given (for a
    timeout that shrinks)."""
    while True:
        status = _interruptible(call, *(arguments() if arguments else args))
        if status != _library.INTERRUPTED:
            return status
        time.sleep(0)  # a point where Python runs the pending handlers, even without a bytecode


_STRICT = os.environ.get("LOCKSTEP_CHECK") == "strict"  # liblockstep validates the value
_HERE = os.path.dirname(__file__)  # as the package's code objects name their files
_CONTEXTLIB = contextlib.__file__  # main_process_first's frames go through contextlib's


def _site():
    """The caller's place outside this package, as the C API's _at forms take it: file, line,
    function (liblockstep reads them during the call and keeps its own copy). Taken only where
    a call is slow already (a wait that outlasted its try, a timed wait, a broadcast,
    main_process_first), so that the fast path stays one ctypes call."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename == _CONTEXTLIB or
                                 os.path.dirname(frame.f_code.co_filename) == _HERE):
        frame = frame.f_back
    if frame is None:
        return (None, 0, None)
    return (os.fsencode(frame.f_code.co_filename), frame.f_lineno,
            frame.f_code.co_name.encode(errors="replace"))


def _wait(handle):
    """wait_for_everyone without a timeout. Most waits end within a millisecond, so the first
    try is made as it is: arming Ctrl-C (_interruptible: the signal module's wakeup descriptor,
    checked by fstat and fcntl, and the pipe read after) costs several system calls, 5-8 us on
    2 vCPUs, where the wait costs 0.2-2 (PartialState().wait_for_everyone() in a loop at N = 2:
    8.3 us per call armed, 0.6 before Ctrl-C was handled). A wait that lasts longer than the try
    (about 1 ms) withdraws its arrival and is made again, armed; a signal during the try is
    handled as it returns (KeyboardInterrupt before the armed wait, or after a try that passed).
    The caller's place is taken for the armed wait only (every call's with LOCKSTEP_CHECK=strict,
    _wait_strict): a wait that passed in its try is at "an unrecorded place" in the others'
    messages. The fast path is as it was before places were recorded: one ctypes call."""
    status = _lib.lockstep_try_wait_for_everyone(handle)
    if status == _library.TIMEOUT:
        status = _blocking(_lib.lockstep_wait_for_everyone_at, handle, *_site())
    _check(status)


def _wait_strict(handle):
    """_wait under LOCKSTEP_CHECK=strict: every episode compares places, so every call takes its
    own (about 0.3 us more)."""
    site = _site()
    status = _lib.lockstep_try_wait_for_everyone_at(handle, *site)
    if status == _library.TIMEOUT:
        status = _blocking(_lib.lockstep_wait_for_everyone_at, handle, *site)
    _check(status)


if _STRICT:
    _wait = _wait_strict


def wait_for_everyone():
    """Accelerate's accelerate.utils.wait_for_everyone: PartialState().wait_for_everyone()."""
    PartialState().wait_for_everyone()


def broadcast_object_list(object_list, from_process=0):
    """Accelerate's accelerate.utils.broadcast_object_list: replaces the list's items, on every
    process, with the main process's (in place), and returns the list. lockstep broadcasts from
    the main process only: another from_process is refused with ValueError."""
    if from_process != 0:
        raise ValueError(f"lockstep: broadcast_object_list(from_process={from_process!r}): "
                         "lockstep broadcasts from the main process (0) only")
    object_list[:] = PartialState().broadcast_object(list(object_list))
    return object_list


def gather_object(object):  # pylint: disable=redefined-builtin
    """Accelerate's accelerate.utils.gather_object: every process's `object` (a list, as
    Accelerate's evaluation loops give it), pickled, joined into one list in process order, on
    every process; in a job of one process, `object` itself. Any size that memory allows (a
    process's pickled bytes past its share of the node segment are read by the others in its
    memory, or, where the others would copy 512 KiB or more together, unpickled by every process
    from shared memory: up to 4 MiB one of the writer's three windows, kept mapped until it
    leaves the job, larger a file of /dev/shm removed when every process has read it). The
    objects are the caller's alone: dropped, they are freed at once. What unpickling raises (an
    object that cannot be unpickled here) is raised on that process only, once every process
    has read. Every process must call it, as wait_for_everyone(), which it implies. Not
    interrupted by signal handlers: a Ctrl-C takes effect when it returns."""
    state = PartialState()
    if not state.use_distributed:
        return object
    return [item for one in state._gather(object) for item in one]


def available_backends():
    """The cross-node backends this build of lockstep has, in order of preference."""
    names = _lib.lockstep_available_backends().decode()
    return [name for name in names.split(",") if name]


def _configure(kwargs):
    """PartialState's backend and timeout (before joining): the timeout as the variable it stands
    for; the backend, torch.distributed's in Accelerate ("nccl", "gloo", ...), is recorded for
    `state.backend` and acts on nothing (lockstep's own transport is LOCKSTEP_BACKEND's)."""
    backend = kwargs.get("backend")
    if backend is not None:
        if not isinstance(backend, str) or not backend:
            raise ValueError(f"lockstep.PartialState: backend={backend!r}: a backend's name, "
                             "such as \"nccl\" or \"gloo\" (torch.distributed's, which lockstep "
                             "records and does not start), or None")
        PartialState._backend = backend
    if "timeout" in kwargs and kwargs["timeout"] is not None:
        timeout = kwargs["timeout"]
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
        if not seconds > 0 or math.isinf(seconds):
            raise ValueError(f"lockstep.PartialState: timeout={timeout!r}: a number of seconds "
                             "above 0")
        os.environ["LOCKSTEP_JOIN_TIMEOUT"] = f"{seconds:.3f}"


def split_range(size, num_processes, process_index, apply_padding=False):
    """The share of `size` items that process `process_index` of `num_processes` takes, as
    (start, stop, padding): contiguous, the first size % num_processes processes one more; with
    apply_padding, every share is ceil(size / num_processes) long, `padding` the count of copies
    of the last item it needs. The same everywhere, no communication: liblockstep's rule
    (lockstep_split_range), for sizes up to 2**64 - 1."""
    if (num_processes < 1 or not 0 <= process_index < num_processes or size < 0
            or size >= 2**64 or num_processes >= 2**31):
        raise ValueError(f"lockstep: no share for process {process_index} of {num_processes} "
                         f"in {size} items")
    start, stop, padding = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
    _check(_lib.lockstep_split_range(size, num_processes, process_index, ctypes.byref(start),
                                     ctypes.byref(stop), ctypes.byref(padding)))
    return start.value, stop.value, padding.value if apply_padding else 0


def _padded(share, last, padding, inputs):
    """`share` followed by `padding` copies of `last`, concatenated as the sequence's own kind
    concatenates (a numpy array's `+` adds, it does not append)."""
    if isinstance(share, (list, tuple, str, bytes, bytearray)):
        return share + last * padding
    kind = type(share).__module__.split(".")[0]
    if kind == "numpy":
        import numpy
        return numpy.concatenate([share] + [last] * padding)
    if kind == "torch":
        import torch
        return torch.cat([share] + [last] * padding)
    raise TypeError(f"lockstep: split_between_processes(apply_padding=True) cannot pad a "
                    f"{type(inputs).__name__}: lists, tuples, strings, bytes, numpy arrays and "
                    f"torch tensors can be padded (or pass apply_padding=False)")


def _split(inputs, num_processes, process_index, apply_padding):
    """split_between_processes's share, for any process (pure). Padding repeats the input's last
    item, as Accelerate's does (10 items on 4 processes: process 2 takes [6, 7, 9]). A dict's
    values are split alike, but for strings and bytes, which Accelerate passes whole."""
    if isinstance(inputs, dict):
        whole = (str, bytes)
        lengths = {len(value) for value in inputs.values() if not isinstance(value, whole)}
        if len(lengths) > 1:
            raise ValueError("lockstep: split_between_processes: the dict's values have different "
                             f"lengths {sorted(lengths)}")
        return {key: value if isinstance(value, whole) else
                _split(value, num_processes, process_index, apply_padding)
                for key, value in inputs.items()}
    start, stop, padding = split_range(len(inputs), num_processes, process_index, apply_padding)
    share = inputs[start:stop]
    if padding:
        share = _padded(share, inputs[len(inputs) - 1:], padding, inputs)
    return share


class PartialState:
    """This process's place in the job (Accelerate's PartialState). Every instance of a process
    shares one membership: the first joins the job (waiting until the node's processes have
    joined), the others are free."""

    _handle = None
    _kept = None  # the handle across a _reset_state(), until the next PartialState()
    _cpu = False
    _left = False
    _backend = None  # the backend= given, torch.distributed's (see backend)

    def __init__(self, cpu=False, **kwargs):
        """Accelerate's arguments: `cpu` (use no GPU: `device` is "cpu"); `backend`,
        torch.distributed's ("nccl", "gloo", ...), recorded for `backend` (lockstep starts no
        torch.distributed, and its own transport between machines is LOCKSTEP_BACKEND's);
        `timeout` (seconds, or a datetime.timedelta) for joining, as LOCKSTEP_JOIN_TIMEOUT.
        Both act on the first instance only, before it joins. Accelerate's other arguments
        configure torch.distributed: TypeError naming them."""
        unknown = sorted(set(kwargs) - {"backend", "timeout"})
        if unknown:
            raise TypeError(f"lockstep.PartialState: {', '.join(unknown)}: Accelerate passes "
                            "these to torch.distributed, which lockstep does not start; lockstep "
                            "takes cpu, backend and timeout")
        if PartialState._handle is None:
            _configure(kwargs)
            PartialState._cpu = bool(cpu)
            if PartialState._kept is not None:  # after _reset_state(): the same membership
                PartialState._handle, PartialState._kept = PartialState._kept, None
                return
            handle = ctypes.c_void_p()
            _check(_blocking(_lib.lockstep_state_create_at, ctypes.byref(handle), *_site()))
            PartialState._handle = handle  # kept for the process's life: it leaves at exit

    @staticmethod
    def _reset_state():
        """Accelerate's PartialState._reset_state(), which its tests call between cases: every
        instance's members then raise AttributeError until a PartialState (or an Accelerator) is
        made again, which reads its arguments anew. The process stays in the job (as
        torch.distributed's group stays in Accelerate's): the next instance is the same member."""
        if PartialState._handle is not None:
            PartialState._kept, PartialState._handle = PartialState._handle, None
        PartialState._cpu = False
        PartialState._backend = None

    def _reset_error(self, name):
        kind = type(self).__name__
        return AttributeError(f"lockstep.{kind} has no {name!r} now: {kind}._reset_state() was "
                              f"called, and no {kind} or Accelerator was made since")

    def _query(self, name):
        if PartialState._handle is None:
            raise self._reset_error(name)
        return getattr(_lib, "lockstep_" + name)(PartialState._handle)

    process_index = property(lambda self: self._query("process_index"))
    local_process_index = property(lambda self: self._query("local_process_index"))
    num_processes = property(lambda self: self._query("num_processes"))
    num_local_processes = property(lambda self: self._query("num_local_processes"))
    node_index = property(lambda self: self._query("node_index"))
    num_nodes = property(lambda self: self._query("num_nodes"))
    is_main_process = property(lambda self: bool(self._query("is_main_process")))
    is_local_main_process = property(lambda self: bool(self._query("is_local_main_process")))
    is_last_process = property(lambda self: bool(self._query("is_last_process")))
    use_distributed = property(lambda self: bool(self._query("use_distributed")))
    # Joined: the first instance joins in its constructor, or raises.
    initialized = property(lambda self: PartialState._handle is not None and not self._left)
    # Accelerate's ACCELERATE_DEBUG_MODE; lockstep's LOCKSTEP_LOG=debug or LOCKSTEP_DEBUG=1.
    debug = property(lambda self: os.environ.get("LOCKSTEP_LOG") == "debug" or (
        "LOCKSTEP_LOG" not in os.environ and os.environ.get("LOCKSTEP_DEBUG") == "1"))

    def _gpu(self):
        """This process's GPU index, or -1 (none, or cpu=True)."""
        return -1 if PartialState._cpu else self._query("device")

    @property
    def device(self):
        """This process's GPU, cuda:N (its local index modulo the devices CUDA shows it), or cpu
        without one or with cpu=True: a torch.device, as Accelerate's, where torch can be
        imported; else the string ("cuda:0", "cpu")."""
        index = self._gpu()
        return _device(f"cuda:{index}" if index >= 0 else "cpu")

    @property
    def default_device(self):
        """Accelerate's PartialState.default_device: cuda where this process finds a GPU, else
        cpu (whatever cpu= said); a torch.device where torch can be imported, else the string."""
        return _device("cuda" if self._query("device") >= 0 else "cpu")

    def set_device(self):
        """Makes `device` current for torch (torch.cuda.set_device), as Accelerate's; nothing
        on the CPU, or where torch is not installed."""
        index = self._gpu()
        torch = _torch()
        if index >= 0 and torch is not None:
            torch.cuda.set_device(index)

    @property
    def backend(self):
        """The `backend` the first PartialState was given (torch.distributed's, as Accelerate
        names here); without one, lockstep's backend between machines ("ucx" or "nccl") in a job
        of several, None in a job of one machine, which needs none."""
        if PartialState._backend is not None:
            return PartialState._backend
        if self.num_nodes <= 1:
            return None
        return os.environ.get("LOCKSTEP_BACKEND") or available_backends()[0]

    @property
    def distributed_type(self):
        """Accelerate's DistributedType (a str): NO for a job of one process, MULTI_GPU when each
        process has a GPU, else MULTI_CPU."""
        if self.num_processes == 1:
            return DistributedType.NO
        return DistributedType.MULTI_GPU if self._gpu() >= 0 else DistributedType.MULTI_CPU

    def destroy_process_group(self, group=None):
        """Leaves the job now (State::leave): the others' waits that need this process fail
        with PeerLostError naming it; later calls of this process raise lockstep.Error. As
        Accelerate's, it also destroys torch.distributed's default group where this process
        initialized one (torch already imported: a process that never imported it has none)."""
        if group is not None:
            raise ValueError("lockstep.PartialState.destroy_process_group: lockstep has one "
                             "group, the job: call it without a group")
        distributed = getattr(sys.modules.get("torch"), "distributed", None)
        if (distributed is not None and distributed.is_available()
                and distributed.is_initialized()):
            distributed.destroy_process_group()
        if PartialState._handle is not None and not PartialState._left:
            _check(_lib.lockstep_leave(PartialState._handle))
            PartialState._left = True

    def __repr__(self):
        return (f"lockstep.PartialState(process_index={self.process_index}, "
                f"num_processes={self.num_processes}, local_process_index="
                f"{self.local_process_index}, node_index={self.node_index}, "
                f"num_nodes={self.num_nodes})")

    def wait_for_everyone(self, timeout=None):
        """Returns once every process of the job has called it. With `timeout` (seconds),
        lockstep.TimeoutError naming the processes that had not arrived when it passes."""
        handle = PartialState._handle
        if handle is None:
            raise self._reset_error("wait_for_everyone")
        if timeout is None:
            _wait(handle)
            return
        milliseconds = timeout * 1000.0
        if math.isnan(milliseconds) or milliseconds < 0:
            raise ValueError(f"lockstep: wait_for_everyone(timeout={timeout!r}): the timeout "
                             "must be a number of seconds, 0 or more")
        if math.isinf(milliseconds):  # no deadline
            _wait(PartialState._handle)
            return
        deadline = time.monotonic() + min(math.ceil(milliseconds), 2**62) / 1000.0

        site = _site()

        def left():  # what is left of the timeout when a handler let the wait go on
            remaining = max(0, math.ceil((deadline - time.monotonic()) * 1000.0))
            return (PartialState._handle, min(remaining, 2**62)) + site
        _check(_blocking(_lib.lockstep_wait_for_everyone_for_at, arguments=left))

    def broadcast_object(self, obj=None):
        """Main computes, everyone uses: returns, on every process, the object the main process
        passed (the others' is ignored), pickled on the way, of any size that memory allows.
        Every process must call it, as wait_for_everyone(), which it implies. Not interrupted by
        signal handlers: a Ctrl-C takes effect when it returns."""
        data = pickle.dumps(obj) if self.is_main_process else b""
        site = _site()
        return _read_in_place(1, lambda each: _lib.lockstep_broadcast_in_place_at(
            PartialState._handle, data, len(data), each, None, *site))[0]

    def _gather(self, obj):
        """Every process's object, by process index, pickled on the way (gather_object)."""
        data = pickle.dumps(obj)
        site = _site()
        return _read_in_place(self.num_processes,
                              lambda each: _lib.lockstep_gather_object_in_place_at(
                                  PartialState._handle, data, len(data), each, None, *site))

    def _set_trigger(self):
        _check(_lib.lockstep_set_trigger(PartialState._handle))

    def _check_trigger(self):
        triggered = ctypes.c_int()
        _check(_lib.lockstep_check_trigger_at(PartialState._handle, ctypes.byref(triggered),
                                              *_site()))
        return bool(triggered.value)

    # Running a function on some processes only: each decorator (Accelerate's) returns a function
    # that runs the original where it applies and returns None elsewhere. As Accelerate's, it
    # runs everywhere in a job of one process (on_process(process_index=3) included).
    def _only(self, applies, function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if applies() or self.num_processes == 1:
                return function(*args, **kwargs)
            return None
        return wrapper

    def on_main_process(self, function):
        return self._only(lambda: self.is_main_process, function)

    def on_local_main_process(self, function):
        return self._only(lambda: self.is_local_main_process, function)

    def on_last_process(self, function):
        return self._only(lambda: self.is_last_process, function)

    @staticmethod
    def _as_index(what, index):
        """An index of any integer type (int, numpy's, a torch integer scalar) as an int; None
        stays None. As in Accelerate, None or a negative index chooses no process (but in a job of
        one, where the function runs anyway). A bool or a float is refused: it is never what was
        meant (Accelerate would take True as process 1)."""
        if index is None:
            return None
        if not isinstance(index, bool):
            try:
                return operator.index(index)
            except TypeError:
                pass
        raise ConfigError(f"lockstep: {what}: a process index is an integer, not {index!r}")

    def on_process(self, function=None, process_index=None):
        """@state.on_process(process_index=k)"""
        process_index = self._as_index("on_process", process_index)
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only(lambda: self.process_index == process_index, function)

    def on_local_process(self, function=None, local_process_index=None):
        """@state.on_local_process(local_process_index=k)"""
        local_process_index = self._as_index("on_local_process", local_process_index)
        if function is None:
            return functools.partial(self.on_local_process,
                                     local_process_index=local_process_index)
        return self._only(lambda: self.local_process_index == local_process_index, function)

    @staticmethod
    @contextlib.contextmanager
    def _goes_first(prefix):
        # The C API holds the rule (who waits where; the first process enters an intact job only).
        # A block that raises does not release the others, as in C++: they learn of the failure
        # when this process leaves the job.
        _check(_blocking(getattr(_lib, prefix + "begin_at"), PartialState._handle, *_site()))
        yield
        _check(_blocking(getattr(_lib, prefix + "end_at"), PartialState._handle, *_site()))

    def main_process_first(self):
        """`with state.main_process_first():` the main process runs the block, then the others."""
        return self._goes_first("lockstep_main_process_first_")

    def local_main_process_first(self):
        """As main_process_first, with each node's main process first."""
        return self._goes_first("lockstep_local_main_process_first_")

    @contextlib.contextmanager
    def split_between_processes(self, inputs, apply_padding=False):
        """`with state.split_between_processes(items) as mine:` this process's contiguous share
        of a sequence (a list, tuple, string, range, array: anything with len and slicing), or of
        each value of a dict of sequences of one length. The first len % n processes take one more;
        with apply_padding every share has the same length, the last item repeated."""
        yield self._share(inputs, apply_padding)

    def _share(self, inputs, apply_padding):
        return _split(inputs, self.num_processes, self.process_index, apply_padding)

    def print(self, *args, **kwargs):
        """print() once per machine, on its local main process (as Accelerate's)."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)


class AcceleratorState(PartialState):
    """Accelerate's AcceleratorState, the state an Accelerator holds (`accelerator.state`):
    PartialState's members, and `mixed_precision`, "no" (lockstep runs no training)."""

    _cleared = False  # AcceleratorState._reset_state() was called, and none was made since

    def __init__(self, mixed_precision=None, cpu=False, **kwargs):
        """Accelerate's `cpu`, and `mixed_precision` "no" (or None); PartialState's backend and
        timeout. Accelerate's plugins configure training: TypeError naming them."""
        if mixed_precision not in (None, "no"):
            raise TypeError(f"lockstep.AcceleratorState: mixed_precision={mixed_precision!r}: "
                            "lockstep runs no training; it takes \"no\" or None")
        super().__init__(cpu=cpu, **kwargs)
        AcceleratorState._cleared = False

    @staticmethod
    def _reset_state(reset_partial_state=False):  # pylint: disable=arguments-differ
        """Accelerate's AcceleratorState._reset_state(): this state's members raise
        AttributeError until an AcceleratorState (or an Accelerator) is made again; with
        reset_partial_state, PartialState's too (PartialState._reset_state())."""
        AcceleratorState._cleared = True
        if reset_partial_state:
            PartialState._reset_state()

    def _query(self, name):
        if AcceleratorState._cleared:
            raise self._reset_error(name)
        return super()._query(name)

    @property
    def mixed_precision(self):
        self._query("process_index")  # raises after a reset, as every member
        return "no"


class Accelerator:
    """The execution-control part of Accelerate's Accelerator, over the process's PartialState:
    the snippets of Accelerate's execution-process guide run with `from lockstep import
    Accelerator`. It is not the rest of Accelerate (prepare, backward, autocast, save_model,
    gather, trackers ...): those members raise AttributeError saying so.

        accelerator = Accelerator()
        if accelerator.is_local_main_process:
            print("once per machine")

        @accelerator.on_local_process(local_process_idx=0)
        def report():
            ...
        accelerator.wait_for_everyone()
    """

    # What PartialState answers under the same name (Accelerate's Accelerator forwards them).
    _FORWARDED = frozenset({
        "process_index", "local_process_index", "num_processes", "is_main_process",
        "is_local_main_process", "is_last_process", "use_distributed", "device",
        "distributed_type", "wait_for_everyone", "main_process_first", "local_main_process_first",
        "split_between_processes", "on_main_process", "on_local_main_process", "on_last_process",
        "print", "mixed_precision"})

    def __init__(self, cpu=False, **kwargs):
        """Accelerate's `cpu`; its other arguments configure training (mixed_precision,
        gradient_accumulation_steps, ...), which lockstep does not do: TypeError naming them."""
        if kwargs:
            raise TypeError(f"lockstep.Accelerator: {', '.join(sorted(kwargs))}: lockstep covers "
                            "Accelerate's execution control only (which process runs what, and "
                            "when); it takes cpu")
        self.state = AcceleratorState(cpu=cpu)

    def __getattr__(self, name):
        if name in Accelerator._FORWARDED:
            return getattr(self.state, name)
        if name.startswith("__") or name == "state":
            raise AttributeError(name)
        raise AttributeError(f"lockstep.Accelerator has no {name!r}: lockstep covers Accelerate's "
                             "execution control only (is_main_process, on_main_process, "
                             "wait_for_everyone, main_process_first, split_between_processes, "
                             "...); use Accelerate itself for the rest")

    def __dir__(self):
        return sorted(set(super().__dir__()) | Accelerator._FORWARDED)

    def on_process(self, function=None, process_index=None):
        """@accelerator.on_process(process_index=k)"""
        return self.state.on_process(function, process_index=process_index)

    def on_local_process(self, function=None, local_process_index=None, local_process_idx=None):
        """@accelerator.on_local_process(local_process_index=k); Accelerate's guide spells it
        local_process_idx, which is taken too."""
        if local_process_idx is not None:
            if local_process_index is not None and local_process_index != local_process_idx:
                raise ValueError(f"lockstep.Accelerator.on_local_process: local_process_index="
                                 f"{local_process_index!r} and local_process_idx="
                                 f"{local_process_idx!r} differ: give one")
            local_process_index = local_process_idx
        return self.state.on_local_process(function, local_process_index=local_process_index)

    def end_training(self):
        """Accelerate's Accelerator.end_training, at the end of a script: leaves the job
        (PartialState.destroy_process_group, which ends torch.distributed's group too where this
        process made one). lockstep has no trackers to finish."""
        self.state.destroy_process_group()

    def free_memory(self, *objects):
        """Accelerate's Accelerator.free_memory: returns a list of as many Nones as `objects`
        (`model, optimizer = accelerator.free_memory(model, optimizer)` drops the caller's
        references) and collects the garbage. lockstep keeps nothing between calls to free: each
        gather's and broadcast's memory is released as it returns."""
        objects = [None] * len(objects)
        gc.collect()
        return objects

    clear = free_memory

    def set_trigger(self):
        """Accelerate's Accelerator.set_trigger: marks this process, so that the next
        check_trigger() is true on every process (stop everyone when one says so)."""
        self.state._set_trigger()  # pylint: disable=protected-access

    def check_trigger(self):
        """Accelerate's Accelerator.check_trigger: True on every process when any process set its
        trigger since the last check (every trigger is then cleared), else False. Every process
        must call it at the same point, as wait_for_everyone()."""
        return self.state._check_trigger()  # pylint: disable=protected-access

    def __repr__(self):
        return f"lockstep.Accelerator({self.state!r})"
