"""Loading and running a file in a child process with a time limit and a memory limit.

A file from a stranger can still make the native code that loads or runs it
crash (an operator with a memory-safety bug, a package's shared library, a
TensorRT plan), allocate without bound, or compute for hours. So ``verify`` and
``inspect`` open files in a child interpreter:

* started isolated (``python -I``: no current directory on ``sys.path``, no
  ``PYTHON*`` variables), with the parent's import path passed explicitly;
* in a session of its own, so that the time limit kills it and everything it started;
* with ``RLIMIT_AS`` set, once torch is imported, to what the child uses then
  plus the memory limit. Where CUDA is available the driver reserves far more
  address space than it uses, so there the parent watches the child's resident
  memory instead and kills it past the limit;
* no core dumps, and its temporary files in a folder removed afterwards.

The child writes its result as JSON; the parent turns a killed, crashed or
exhausted child into one :class:`IsolationError` line that says which limit or
which signal, and never crashes itself.

Starting an interpreter and importing torch takes a second or two. To check many
files, ``with reusing_interpreter():`` starts one clean interpreter (the same
``python -I``, torch and trt-inline imported, no file ever opened in it) and
forks each child from it; every child is still a process of its own, in its own
session, with the same limits. Outside such a block nothing is left running.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trt_inline.errors import (
    IsolationError,
    RefusedOperatorError,
    TrtInlineError,
    UnsafeArchiveError,
    VerifyInputError,
    first_line,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "Limits",
    "default_memory_limit",
    "format_size",
    "parse_size",
    "reusing_interpreter",
    "run_isolated",
]

DEFAULT_TIMEOUT = 3600.0
_BASE_MEMORY = 2 << 30
_POLL_SECONDS = 0.02
# What the parent reads back of the child's report: a report is a few lines per output and problem.
_MAX_RESULT_BYTES = 64 << 20
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1000, "KIB": 1 << 10, "M": 1 << 20, "MB": 1000**2, "MIB": 1 << 20}
_UNITS |= {"G": 1 << 30, "GB": 1000**3, "GIB": 1 << 30, "T": 1 << 40, "TB": 1000**4, "TIB": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``"2GiB"``, ``"512MiB"``, ``"1.5GB"`` or a plain number of bytes."""
    if isinstance(text, int):
        size = text
    else:
        match = _SIZE.match(text)
        unit = match.group(2).upper() if match else ""
        if match is None or unit not in _UNITS:
            raise VerifyInputError(f"memory limit {text!r}: give a size such as 2GiB, 512MiB or 4000000000")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise VerifyInputError(f"memory limit {text!r}: must be more than 0 bytes")
    return size


def format_size(size: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.3g} {unit}"
    return f"{size} B"


def default_memory_limit(path: str | os.PathLike[str] | None) -> int:
    """Twice the file's size plus 2 GiB: loading and running a program needs about its size again, and working room."""
    size = os.path.getsize(path) if path is not None and os.path.isfile(path) else 0
    return 2 * size + _BASE_MEMORY


@dataclass(frozen=True)
class Limits:
    """What a child may use: seconds of wall-clock time, and bytes beyond what it uses once torch is imported."""

    timeout: float
    memory: int

    @classmethod
    def for_file(cls, path: str | os.PathLike[str], timeout: float | None, memory_limit: int | str | None) -> Limits:
        """The limits asked for; :data:`DEFAULT_TIMEOUT` and :func:`default_memory_limit` for those not."""
        return cls(
            DEFAULT_TIMEOUT if timeout is None else float(timeout),
            default_memory_limit(path) if memory_limit is None else parse_size(memory_limit),
        )

    def describe(self) -> str:
        return f"{self.timeout:g} s, {format_size(self.memory)}"


@dataclass(frozen=True)
class ChildResult:
    value: Any
    peak_rss: int  # bytes, the child's maximum resident set
    base_rss: int  # bytes, the child's resident set once its imports were done, before the job


# The jobs a child can run, by name: (module, function). The function takes the request's
# JSON arguments and the tensors the parent saved, and returns something JSON can hold.
JOBS = {
    "verify": ("trt_inline.verify.verifier", "verify_job"),
    "inspect": ("trt_inline.verify.verifier", "inspect_job"),
    "diff": ("trt_inline.verify.diff", "diff_job"),
}


def run_isolated(
    job: str, arguments: dict[str, Any], tensors: Any, limits: Limits, *, where: str, debug: bool = False
) -> ChildResult:
    """Run ``job`` in a child process under ``limits``; its return value, or the error it raised, re-raised here.

    ``tensors`` go through ``torch.save`` and come back with ``weights_only=True``.
    Raises :class:`IsolationError` naming ``where`` when the child is stopped.
    """
    import torch

    with tempfile.TemporaryDirectory(prefix="trt-inline-") as folder:
        work = Path(folder)
        torch.save(tensors, work / "tensors.pt")
        request = {"job": job, "arguments": arguments, "memory": limits.memory, "debug": debug}
        (work / "request.json").write_text(json.dumps(request))
        # Its temporary files (torch's own, a package's extracted library) stay in the folder removed afterwards.
        (work / "tmp").mkdir()
        zygote = _zygote_for_now()
        if zygote is not None:
            status, peak, stopped = zygote.run(work, limits)
        else:
            status, peak, stopped = _run_fresh(work, limits)
        if debug:
            sys.stderr.write(_tail(work / "stderr.txt"))
        return _outcome(work, status, peak, stopped, limits, where)


def _interpreter_command(code: str, *arguments: str) -> list[str]:
    """``python -I -c code`` with this process's import path (absolute entries only) as its ``sys.path``."""
    path = [entry for entry in sys.path if entry and os.path.isabs(entry)]
    prelude = "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    return [sys.executable, "-I", "-c", prelude + code, json.dumps(path), *arguments]


def _child_environment() -> dict[str, str]:
    # Each thread's malloc arena reserves 64 MiB of address space: few arenas, so that the
    # address-space limit measures memory rather than the machine's core count.
    return {**os.environ, "MALLOC_ARENA_MAX": "2"}


def _run_fresh(work: Path, limits: Limits) -> tuple[int, int, str | None]:
    """The child as a new interpreter: (wait status, peak RSS in bytes, which limit stopped it or None)."""
    command = _interpreter_command(
        "from trt_inline.verify.isolation import child_main; child_main(sys.argv[2])", str(work)
    )
    env = {**_child_environment(), "TMPDIR": str(work / "tmp")}
    with open(work / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, start_new_session=True, env=env
        )
        try:
            return _supervise(process.pid, limits, work, lambda: _reap(process))
        except BaseException:  # interrupted: the child must not outlive the call
            _kill_group(process.pid)
            process.wait()
            raise


def _reap(process: subprocess.Popen[bytes]) -> tuple[int, int] | None:
    """(wait status, peak RSS) once the child has ended; else None, after a short wait."""
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if not pid:
        time.sleep(_POLL_SECONDS)
        return None
    process.returncode = os.waitstatus_to_exitcode(status)
    return status, usage.ru_maxrss * 1024


def _supervise(
    pid: int, limits: Limits, work: Path, ended: Callable[[], tuple[int, int] | None]
) -> tuple[int, int, str | None]:
    """Wait for child ``pid`` until ``ended()`` gives (wait status, peak RSS); kill its group past a limit.

    Returns (wait status, peak RSS in bytes, which limit stopped it or None).
    """
    deadline = time.monotonic() + limits.timeout
    stopped: str | None = None
    rss_limit: int | None = None
    while True:
        outcome = ended()
        if outcome is not None:
            return outcome[0], outcome[1], stopped
        if stopped is None:
            if rss_limit is None and (work / "rss_limit").exists():
                rss_limit = int((work / "rss_limit").read_text() or 0) or None
            if time.monotonic() > deadline:
                stopped = "time"
            elif rss_limit is not None and _resident(pid) > rss_limit:
                stopped = "memory"
            if stopped:
                _kill_group(pid)


# ---------------------------------------------------------------------------
# One clean interpreter that forks the children (reusing_interpreter)
# ---------------------------------------------------------------------------

# The interpreter's loop: for each folder it reads, fork a child that becomes what a fresh
# interpreter running child_main(folder) would be; report its pid, then its wait status and peak RSS.
_ZYGOTE = """
import os, tempfile
import torch
import trt_inline.reference, trt_inline.verify
from trt_inline import compat
from trt_inline.verify.isolation import child_main
compat.import_loaders()
for line in sys.stdin:
    folder, environment = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.environ.clear()
        os.environ.update(environment)
        os.setsid()
        output = os.open(os.path.join(folder, "stderr.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.environ["TMPDIR"] = os.path.join(folder, "tmp")
        tempfile.tempdir = None
        child_main(folder)
    print("pid", pid, flush=True)
    _, status, usage = os.wait4(pid, 0)
    print("exit", status, usage.ru_maxrss, flush=True)
"""


class _Zygote:
    """A clean interpreter (``python -I``, torch and trt-inline imported) that forks one child per job.

    It never opens a file: each child, in a session of its own, opens one and
    applies the limits itself, exactly as a fresh interpreter's ``child_main``.
    """

    def __init__(self) -> None:
        self.key = _zygote_key()
        self._pending = b""
        self.process = subprocess.Popen(
            _interpreter_command(_ZYGOTE),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=_child_environment(),
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def _line(self, timeout: float | None) -> list[str] | None:
        """The next line it writes, split; None after ``timeout`` seconds. Raises EOFError if it ended.

        Read from the pipe itself, with a buffer of our own: a buffered reader could
        take two lines at once, and ``select`` would then wait for the second in vain.
        """
        assert self.process.stdout is not None
        descriptor = self.process.stdout.fileno()
        while b"\n" not in self._pending:
            ready, _, _ = select.select([descriptor], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(descriptor, 4096)
            if not chunk:
                raise EOFError("the interpreter that forks the children ended")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode().split()

    def run(self, work: Path, limits: Limits) -> tuple[int, int, str | None]:
        assert self.process.stdin is not None
        # The caller's environment as it is now (the fresh path passes it too); TMPDIR is set in the child.
        self.process.stdin.write((json.dumps([str(work), _child_environment()]) + "\n").encode())
        self.process.stdin.flush()
        started = self._line(None)
        if not started or started[0] != "pid":
            raise EOFError("the interpreter that forks the children gave no child")
        pid = int(started[1])

        def ended() -> tuple[int, int] | None:
            line = self._line(_POLL_SECONDS)
            if line is None:
                return None
            return int(line[1]), int(line[2]) * 1024

        try:
            return _supervise(pid, limits, work, ended)
        except BaseException:  # interrupted: neither the child nor the interpreter may outlive the call
            _kill_group(pid)
            self.close()
            raise

    def close(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(self.process.pid)
            self.process.wait()


# Environment variables read when an interpreter starts or imports torch (allocator, threads, devices,
# torch's own settings): a change in one of them needs a new interpreter. Every other variable is
# handed to each child as it is when the child starts.
_STARTUP_VARIABLES = re.compile(r"^(PYTHON|LD_|MALLOC_|OMP_|MKL_|KMP_|GOMP_|CUDA_|NVIDIA_|TORCH|TRT_INLINE_)")


def _zygote_key() -> tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]:
    """What a child inherits from the interpreter it is forked from: a change here needs a new one."""
    startup = tuple(sorted((k, v) for k, v in os.environ.items() if _STARTUP_VARIABLES.match(k)))
    return sys.executable, tuple(sys.path), startup


# The reusable interpreter of the innermost reusing_interpreter() block, if any.
_reusable: contextvars.ContextVar[list[_Zygote] | None] = contextvars.ContextVar("trt_inline_zygote", default=None)


def _zygote_for_now() -> _Zygote | None:
    """The block's interpreter, started (or restarted, after it ended or the environment changed) on first use."""
    slot = _reusable.get()
    if slot is None:
        return None
    if slot and (not slot[0].alive() or slot[0].key != _zygote_key()):
        slot.pop().close()
    if not slot:
        slot.append(_Zygote())
    return slot[0]


@contextlib.contextmanager
def reusing_interpreter() -> Iterator[None]:
    """Within the block, ``verify`` and ``inspect`` fork their children from one clean interpreter.

    Each child is as isolated as a fresh one (own session, same limits, private
    temporary folder); the block only saves starting an interpreter and
    importing torch per file. The interpreter is stopped when the block ends.
    """
    slot: list[_Zygote] = []
    token = _reusable.set(slot)
    try:
        yield
    finally:
        _reusable.reset(token)
        for zygote in slot:
            zygote.close()


def _tail(path: Path, limit: int = 1 << 20) -> str:
    """The last ``limit`` bytes of a file the child wrote, as text."""
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - limit))
        return handle.read().decode(errors="replace")


def _resident(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _outcome(work: Path, status: int, peak: int, stopped: str | None, limits: Limits, where: str) -> ChildResult:
    result_file = work / "result.json"
    if stopped == "time":
        raise IsolationError(f"{where}: stopped after {limits.timeout:g} s, the time limit (--timeout raises it)")
    if stopped == "memory":
        raise IsolationError(
            f"{where}: stopped past {format_size(limits.memory)} of memory, the memory limit (--memory-limit raises it)"
        )
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        raise IsolationError(
            f"{where}: the child process loading it died on {name} (a crash in native code); "
            "nothing of it ran in this process"
        )
    if not result_file.exists():
        code = os.waitstatus_to_exitcode(status)
        raise IsolationError(f"{where}: the child process loading it exited with status {code} and no result")
    if result_file.stat().st_size > _MAX_RESULT_BYTES:
        raise IsolationError(f"{where}: the child process's report is larger than {format_size(_MAX_RESULT_BYTES)}")
    result = json.loads(result_file.read_text())
    if "error" in result:
        kinds = (RefusedOperatorError, UnsafeArchiveError, IsolationError, VerifyInputError)
        kind = {cls.__name__: cls for cls in kinds}.get(result["error"], VerifyInputError)
        message = str(result["message"])
        # The child's own errors name the file; a limit it hit or an unexpected error may not.
        raise kind(message if message.startswith(where) else f"{where}: {message}")
    return ChildResult(result["value"], peak, int(result.get("base_rss", 0)))


# ---------------------------------------------------------------------------
# The child
# ---------------------------------------------------------------------------


def child_main(folder: str) -> None:
    """Entry point of the child: limits, then the job, then its result as JSON. Never returns."""
    work = Path(folder)
    request = json.loads((work / "request.json").read_text())
    code = 0
    try:
        result = {"value": _child_job(work, request), "base_rss": request["base_rss"]}
    except MemoryError:
        result = _memory_error(request)
    except RecursionError:
        result = {"error": "VerifyInputError", "message": "nested too deeply to be read"}
    except Exception as exc:
        if _is_allocation_failure(exc):
            result = _memory_error(request)
        else:
            if request.get("debug"):
                traceback.print_exc()
            kind = type(exc).__name__ if isinstance(exc, TrtInlineError) else "VerifyInputError"
            message = first_line(exc) if isinstance(exc, TrtInlineError) else f"{type(exc).__name__}: {first_line(exc)}"
            result = {"error": kind, "message": message}
    (work / "result.json").write_text(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _child_job(work: Path, request: dict[str, Any]) -> Any:
    import importlib
    import resource

    import torch

    import trt_inline.reference
    import trt_inline.verify  # noqa: F401

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    request["base_rss"] = _own_resident()
    memory = int(request["memory"])
    if torch.cuda.is_available():
        # The CUDA driver reserves address space far beyond what it uses: the parent watches RSS instead.
        (work / "rss_limit").write_text(str(_own_resident() + memory))
    else:
        limit = _own_address_space() + memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    tensors = torch.load(work / "tensors.pt", weights_only=True)
    module_name, function_name = JOBS[request["job"]]
    job: Callable[..., Any] = getattr(importlib.import_module(module_name), function_name)
    return job(request["arguments"], tensors)


def _own_address_space() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _own_resident() -> int:
    return _resident(os.getpid())


def _is_allocation_failure(exc: BaseException) -> bool:
    """Whether an allocation failed under the limit: the error itself or one it was raised from."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        if isinstance(seen, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _memory_error(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "error": "IsolationError",
        "message": f"ran out of its memory limit of {format_size(int(request['memory']))} (--memory-limit raises it)",
    }
