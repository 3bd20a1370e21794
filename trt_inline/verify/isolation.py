"""Loading and running a file in a sandboxed child process with a time limit and a memory limit.

A file from a stranger can make the native code that loads or runs it crash
(an operator with a memory-safety bug, a package's shared library, a TensorRT
plan), allocate without bound, compute for hours, or, if code from it runs
after all, try to reach what is outside. So ``verify``, ``inspect`` and
``diff`` open files in a child interpreter:

* started isolated (``python -I``: no current directory on ``sys.path``, no
  ``PYTHON*`` variables of the user's shell beyond those listed below), with the
  parent's import path passed explicitly, in a session of its own;
* given only the environment variables that configure Python, torch, threads
  and devices (never the caller's tokens or credentials);
* sandboxed (:mod:`trt_inline.sandbox`) after its imports and before it reads
  the file: no network, no programs, no new processes, no signals or ptrace to
  other processes, files only from the Python installation, the files named in
  the job, and its own private folder, which nobody else uses;
* with ``RLIMIT_AS`` set to what it uses once torch is imported, plus the
  memory limit, plus the size of the files it may map. Where CUDA is available
  the driver reserves far more address space than it uses, so there the parent
  watches the resident memory of the child's process group instead;
* no core dumps; its folder removed afterwards, and the child and everything
  in its process group killed when the job ends.

The request and the report travel over pipes, never over files another process
could rewrite; so do the child's progress lines and how far the parent should
read the file ahead of the program (:mod:`trt_inline.verify.read_ahead`). The
parent turns a killed, crashed or exhausted child into one
:class:`IsolationError` line that says which limit or which signal, and never
crashes itself. Everything the child reports is untrusted: it is checked and
its strings escaped where the parent decodes it (:func:`decode_result`).

Starting an interpreter and importing torch takes a second or two. To check many
files, ``with reusing_interpreter():`` starts one clean interpreter (torch and
trt-inline imported, no file ever opened in it) and forks each child from it;
each child still enters the sandbox and the limits itself. Outside such a block
nothing is left running.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import getpass
import io
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trt_inline import progress
from trt_inline.errors import (
    IsolationError,
    RankSetError,
    RefusedOperatorError,
    TrtInlineError,
    UnsafeArchiveError,
    VerifyInputError,
    bounded_strings,
    decoded_text,
    first_line,
)
from trt_inline.formats import format_size
from trt_inline.verify.read_ahead import READ_AHEAD_FROM, FeedReader, window_for
from trt_inline.verify.views import unmappable

if TYPE_CHECKING:
    from trt_inline.distributed.relay import RelayServer

__all__ = [
    "DEFAULT_TIMEOUT",
    "ChildResult",
    "Limits",
    "MemorySampler",
    "available_memory",
    "is_allocation_failure",
    "default_memory_limit",
    "parse_size",
    "reusing_interpreter",
    "run_isolated",
    "sandbox_required",
]

DEFAULT_TIMEOUT = 3600.0
_BASE_MEMORY = 2 << 30
_MIN_MEMORY = 512 << 20
_POLL_SECONDS = 0.02
# What the parent reads back of the child's report: a report is a few lines per output and problem,
# plus the outputs themselves where the caller asked to save them.
_MAX_RESULT_BYTES = 256 << 20
_MAX_REPORT_BYTES = 128 << 20  # of which the JSON report (the rest: tensors handed back, read by the strict reader)
_RESULT_FD = 3
_PROGRESS_FD = 4
_MAX_PROGRESS_LINE = 8192
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


def _proc_kib_field(path: str, field: str) -> int:
    """The ``<field>: N kB`` figure of a ``/proc`` file, in bytes; 0 where unknown."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def available_memory() -> int:
    """Memory the system can give a new process now without swapping (``MemAvailable``); 0 where unknown."""
    return _proc_kib_field("/proc/meminfo", "MemAvailable")


def default_memory_limit(path: str | os.PathLike[str] | None) -> int:
    """What a child may use beyond its imports, by default: 2 GiB of working room and half the file's size.

    Weights are mapped from the file, not counted here (the address-space limit
    adds the file itself); what is counted is what is not mapped: activations,
    boundary data, copies of records that cannot be mapped. Never more than 80%
    of the memory available now, so that the limit, not the kernel, stops a child.
    """
    size = os.path.getsize(path) if path is not None and os.path.isfile(path) else 0
    wanted = _BASE_MEMORY + size // 2
    available = available_memory()
    return max(min(wanted, available * 4 // 5), _MIN_MEMORY) if available else wanted


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
    sandbox: str | None  # what the sandbox set up, in words; None: it ran without one
    tensors: bytes  # what the job returned besides its JSON value (torch.save bytes; untrusted)
    # The job's peak anonymous memory (its own: heap, copies) and file-backed memory (mapped weights),
    # sampled while it ran, above what it held once its imports were done; 0 where not measured.
    peak_anonymous: int = 0
    peak_file: int = 0


# The jobs a child can run, by name: (module, function). The function takes the request's
# JSON arguments and the tensors the parent sent, and returns something JSON can hold
# (or a pair of that and tensors to hand back).
JOBS: dict[str, tuple[str, str]] = {
    "verify": ("trt_inline.verify.verifier", "verify_job"),
    "inspect": ("trt_inline.verify.verifier", "inspect_job"),
    "diff": ("trt_inline.verify.diff", "diff_job"),
    "sandbox": ("trt_inline.verify.isolation", "sandbox_job"),
}


def _fits(files: tuple[str, ...], limits: Limits, where: str) -> None:
    """Refuse, before anything is read, a file that must be read into memory (it cannot be mapped) past the limit."""
    for file in files:
        size = os.path.getsize(file) if os.path.isfile(file) else 0
        why_not = unmappable(file) if size > limits.memory else None
        if why_not is not None:
            raise IsolationError(
                f"{where}: {file} cannot be mapped here ({why_not}), so opening it reads its {format_size(size)} into "
                f"memory, past the memory limit of {format_size(limits.memory)} (--memory-limit raises it; "
                f"{format_size(available_memory())} are available)"
            )


def sandbox_required(sandbox: bool) -> None:
    """Refuse, before any child starts, to open an untrusted file where the sandbox cannot be set up."""
    if not sandbox:
        return
    from trt_inline import sandbox as walls

    missing = walls.status().missing
    if missing:
        raise IsolationError(
            f"the OS sandbox that opens files from strangers cannot be set up here: this system lacks "
            f"{' and '.join(missing)}; --no-sandbox (sandbox=False) opens the file without it, with the child "
            "process's limits only"
        )


def run_isolated(
    job: str,
    arguments: dict[str, Any],
    tensors: Any,
    limits: Limits,
    *,
    where: str,
    files: tuple[str, ...] = (),
    sandbox: bool = True,
    imports: bool = False,
    debug: bool = False,
    namespaces: bool = True,
    relay: RelayServer | None = None,
    read_ahead: str | None = None,
) -> ChildResult:
    """Run ``job`` in a sandboxed child process under ``limits``; its return value, or its error re-raised here.

    ``files``: what the job opens (readable in the sandbox, and mapped within its
    address space). ``tensors`` go through ``torch.save`` into the request.
    ``sandbox=False`` runs the child without the OS sandbox (limits still hold).
    ``imports``: the sandbox lets the child read every folder on the import path
    (an unpickler the user allowed imports modules by name).
    ``namespaces=False`` leaves the namespace layer out (tests of the other walls).
    ``relay``: the child verifies one rank of a rank set; its collectives come
    over a second pair of pipes and ``relay`` answers them (:mod:`trt_inline.distributed.relay`).
    ``read_ahead``: one of ``files`` whose weights the job reads: this process
    reads it into the page cache from now on, paced by the child (:mod:`trt_inline.verify.read_ahead`).
    Raises :class:`IsolationError` naming ``where`` when the child is stopped.
    """
    import torch

    sandbox_required(sandbox)
    _fits(files, limits, where)
    progress.report(f"{where}: starting a {'sandboxed ' if sandbox else ''}child process to open it")
    module, function = JOBS[job]
    payload = io.BytesIO()
    torch.save(tensors, payload)
    request = {
        "job": [module, function],
        "arguments": arguments,
        "memory": limits.memory,
        "mapped": sum(os.path.getsize(f) for f in files if os.path.isfile(f)),
        "files": [os.path.abspath(f) for f in files],
        "sandbox": sandbox,
        "imports": imports,
        "namespaces": namespaces,
        "debug": debug,
    }
    work = Path(tempfile.mkdtemp(prefix="trt-inline-"))
    feed = None
    try:
        feed = _feed_reader(read_ahead)  # reading from now on: the child takes seconds to start
        if feed is not None:
            request["read_ahead"] = {"identity": list(feed.identity), "window": feed.window}
            progress.report(f"{where}: reading it ahead of the child, at most {format_size(feed.window)} ahead")
        message = json.dumps(request).encode() + b"\n" + payload.getvalue()
        # Its temporary files (torch's own, a package's extracted library) stay in its own folder.
        (work / "tmp").mkdir()
        with _Pipes(message, where, relay, feed) as pipes:
            zygote = _zygote_for_now() if relay is None else None
            if zygote is not None:
                outcome = zygote.run(work, pipes, limits)
            else:
                outcome = _run_fresh(work, pipes, limits)
        if debug:
            sys.stderr.write(_tail(work / "stderr.txt"))
        return _outcome(outcome, limits, where)
    finally:
        try:
            if feed is not None:
                feed.stop()
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _feed_reader(path: str | None) -> FeedReader | None:
    """A reader of ``path`` for the child to pace, already reading its first window; None for a small file."""
    if path is None:
        return None
    try:
        size = os.path.getsize(path)
        if size < READ_AHEAD_FROM:
            return None
        return FeedReader(path, window_for(size))
    except OSError:
        return None  # the child says what is wrong with the file


class _Pipes:
    """The request pipe (written by a thread: the child reads it while the parent supervises), the result pipe,
    the progress pipe and the read-ahead feed (:class:`~trt_inline.verify.read_ahead.Feed`).

    Each descriptor is closed once (a number closed twice may by then be another file's).
    """

    def __init__(
        self, message: bytes, where: str, relay: RelayServer | None = None, feed: FeedReader | None = None
    ) -> None:
        self.request_read, self.request_write = os.pipe()
        self.result_read, self.result_write = os.pipe()
        self.progress_read, self.progress_write = os.pipe()
        self.feed_read, self.feed_write = os.pipe()
        self.feed = feed
        self.relay = relay
        self.call_read, self.call_write = os.pipe() if relay is not None else (-1, -1)
        self.reply_read, self.reply_write = os.pipe() if relay is not None else (-1, -1)
        if relay is not None:
            os.set_blocking(self.reply_write, False)
        self.message = message
        self.where = where
        self.result = bytearray()
        self.overflow = False
        self._progress = bytearray()
        self._open = {
            self.request_read, self.request_write, self.result_read, self.result_write, self.progress_read,
            self.progress_write, self.feed_read, self.feed_write, self.call_read, self.call_write, self.reply_read,
            self.reply_write,
        } - {-1}  # fmt: skip
        self._lock = threading.Lock()
        self._writer = threading.Thread(target=self._write, daemon=True)

    def __enter__(self) -> _Pipes:
        self._writer.start()
        return self

    def _close(self, descriptor: int) -> None:
        with self._lock:
            if descriptor in self._open:
                self._open.discard(descriptor)
                with contextlib.suppress(OSError):
                    os.close(descriptor)

    def _write(self) -> None:
        with contextlib.suppress(OSError):  # the child died before reading all of it
            view = memoryview(self.message)
            while view:
                view = view[os.write(self.request_write, view[: 1 << 20]) :]
        self._close(self.request_write)

    def child_ends(self) -> tuple[int, int, int, int]:
        """The ends the child keeps (request, result, progress, feed); the parent closes its copies once it has them."""
        return self.request_read, self.result_write, self.progress_write, self.feed_write

    def relay_ends(self) -> tuple[int, int]:
        """The ends a rank-set child keeps: it writes its calls to the first and reads the replies from the second."""
        return self.call_write, self.reply_read

    def handed_over(self) -> None:
        self._close(self.request_read)
        self._close(self.result_write)
        self._close(self.progress_write)
        self._close(self.feed_write)
        self._close(self.call_write)
        self._close(self.reply_read)

    def _take(self, chunk: bytes) -> None:
        if len(self.result) + len(chunk) > _MAX_RESULT_BYTES:
            self.overflow = True
        else:
            self.result += chunk

    def drain(self, timeout: float) -> None:
        """Read what the child has written of its result and progress, waiting at most ``timeout`` seconds.

        A rank-set child's calls are read, and their replies written, here too,
        never blocking: the caller checks the limits between two drains.
        """
        relay = self.relay
        watched = [self.result_read] + [end for end in (self.progress_read, self.feed_read) if end in self._open]
        if relay is not None and relay.wants_input() and self.call_read in self._open:
            watched.append(self.call_read)
        replying = relay is not None and relay.wants_output() and self.reply_write in self._open
        ready, _, _ = select.select(watched, [self.reply_write] if replying else [], [], timeout)
        if self.result_read in ready:
            self._take(os.read(self.result_read, 1 << 20))
        if self.progress_read in ready:
            self._progress_lines(os.read(self.progress_read, 1 << 16))
        if self.feed_read in ready:
            self._feed_records(os.read(self.feed_read, 1 << 16))
        if relay is None:
            return
        if self.call_read in ready:
            relay.read_from(self.call_read)
        relay.pump()
        if relay.wants_output() and self.reply_write in self._open:
            try:
                relay.write_to(self.reply_write)
            except OSError:  # the child is gone: its outcome says so
                self._close(self.reply_write)

    def _progress_lines(self, chunk: bytes) -> None:
        """Report again each line of progress the child sent: untrusted, so escaped and cut (never a crash)."""
        if not chunk:
            self._close(self.progress_read)
            return
        self._progress += chunk
        while b"\n" in self._progress:
            line, _, rest = bytes(self._progress).partition(b"\n")
            self._progress = bytearray(rest)
            try:
                message, step = json.loads(line)
                counted = (int(step[0]), int(step[1])) if step else None
            except (ValueError, TypeError, IndexError):
                continue
            progress.report(f"{self.where}: {decoded_text(str(message), 400)}", counted)
        if len(self._progress) > _MAX_PROGRESS_LINE:
            self._progress.clear()

    def _feed_records(self, chunk: bytes) -> None:
        """Move the reading ahead as the child says (untrusted: see FeedReader.take)."""
        if not chunk:
            self._close(self.feed_read)
        elif self.feed is not None:
            self.feed.take(chunk)

    def finish(self) -> None:
        """Read the rest once the child has ended (its write end is closed: EOF comes)."""
        while not self.overflow:
            ready, _, _ = select.select([self.result_read], [], [], 1.0)
            if not ready:
                return  # something the child left holds the pipe open: what came is what there is
            chunk = os.read(self.result_read, 1 << 20)
            if not chunk:
                return
            self._take(chunk)

    def __exit__(self, *exc: object) -> None:
        self.handed_over()
        self._close(self.result_read)
        self._close(self.progress_read)
        self._close(self.feed_read)
        self._close(self.call_read)
        self._close(self.reply_write)
        self._close(self.request_write)  # unblocks the writer if the child never read
        self._writer.join(timeout=5)


@dataclass(frozen=True)
class _Ended:
    status: int  # wait status
    peak_rss: int
    stopped: str | None  # which limit stopped it, if one did
    result: bytes
    overflow: bool
    limited: bool = False  # the child said it set its address-space limit (the job ran under it)


def _interpreter_command(code: str, *arguments: str) -> list[str]:
    """``python -I -c code`` with this process's import path (absolute entries only) as its ``sys.path``."""
    path = [entry for entry in sys.path if entry and os.path.isabs(entry)]
    prelude = "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    return [sys.executable, "-I", "-c", prelude + code, json.dumps(path), *arguments]


# Environment variables a child keeps: what configures the interpreter, torch, its threads, its
# allocator and the devices it sees. A change in one of them needs a new interpreter to fork from.
_STARTUP_VARIABLES = re.compile(
    r"^(PYTHON|PYTORCH_|LD_|MALLOC_|OMP_|MKL_|KMP_|GOMP_|OPENBLAS_|CUDA_|NVIDIA_|TORCH|TRT_INLINE_|LANG$|LC_|TZ$)"
)


def _child_environment(work: Path | None = None) -> dict[str, str]:
    """The variables a child gets: the startup ones of this process, and where its temporary files go.

    Each thread's malloc arena reserves 64 MiB of address space: few arenas, so that the
    address-space limit measures memory rather than the machine's core count. OpenBLAS
    (numpy's) would start a thread at import, and a process with threads cannot enter new
    namespaces; torch does not use it.
    """
    environment = {k: v for k, v in os.environ.items() if _STARTUP_VARIABLES.match(k)}
    # The user's name, as a normal call sees it: the sandbox hides /etc/passwd, where getpass.getuser()
    # looks without these, and torch before 2.13 names its cache folder after it (KeyError otherwise).
    environment.update(USER=_user_name(), LOGNAME=_user_name(), MALLOC_ARENA_MAX="2", OPENBLAS_NUM_THREADS="1")
    if work is not None:
        private = str(work / "tmp")
        environment.update(
            TMPDIR=private, HOME=private, CUDA_CACHE_PATH=private, XDG_CACHE_HOME=private,
            TORCHINDUCTOR_CACHE_DIR=private, TRITON_CACHE_DIR=private,
        )  # fmt: skip
    return environment


@functools.cache
def _user_name() -> str:
    """This process's user name (``getpass.getuser()``), ``uid_N`` where the system has none for it."""
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):
        return f"uid_{os.getuid()}"


def _run_fresh(work: Path, pipes: _Pipes, limits: Limits) -> _Ended:
    """The child as a new interpreter."""
    command = _interpreter_command(
        "from trt_inline.verify.isolation import child_main; child_main(sys.argv[2])", str(work)
    )
    request_read, result_write, progress_write, feed_write = pipes.child_ends()
    relay_fds: dict[str, str] = {}
    if pipes.relay is not None:
        from trt_inline.distributed.relay import CALL_FD_ENV, REPLY_FD_ENV

        call_write, reply_read = pipes.relay_ends()
        relay_fds = {CALL_FD_ENV: str(call_write), REPLY_FD_ENV: str(reply_read)}
    with open(work / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(
            command,
            stdin=request_read,
            stdout=stderr,
            stderr=stderr,
            pass_fds=(result_write, progress_write, feed_write, *map(int, relay_fds.values())),
            start_new_session=True,
            env={
                **_child_environment(work),
                "TRT_INLINE_RESULT_FD": str(result_write),
                "TRT_INLINE_PROGRESS_FD": str(progress_write),
                "TRT_INLINE_FEED_FD": str(feed_write),
                **relay_fds,
            },
        )
    pipes.handed_over()
    try:
        return _supervise(process.pid, limits, work, pipes, lambda: _reap(process))
    finally:
        _kill_group(process.pid)
        if process.returncode is None:
            process.wait()


def _reap(process: subprocess.Popen[bytes]) -> tuple[int, int] | None:
    """(wait status, peak RSS) once the child has ended; else None."""
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if not pid:
        return None
    process.returncode = os.waitstatus_to_exitcode(status)
    return status, usage.ru_maxrss * 1024


def _supervise(
    pid: int, limits: Limits, work: Path, pipes: _Pipes, ended: Callable[[], tuple[int, int] | None]
) -> _Ended:
    """Read the child's result while it runs; kill its process group past a limit; what it left.

    ``ended()`` gives (wait status, peak RSS) once child ``pid`` has ended.
    """
    deadline = time.monotonic() + limits.timeout
    stopped: str | None = None
    rss_limit: int | None = None
    while True:
        outcome = ended()
        if outcome is not None:
            pipes.finish()
            limited = (work / _LIMITED).exists()
            return _Ended(outcome[0], outcome[1], stopped, bytes(pipes.result), pipes.overflow, limited)
        pipes.drain(_POLL_SECONDS)
        if stopped is None:
            if rss_limit is None:
                rss_limit = _rss_limit(work)
            if time.monotonic() > deadline:
                stopped = "time"
            elif rss_limit is not None and _group_resident(pid) > rss_limit:
                stopped = "memory"
            if stopped:
                _kill_group(pid)


# The file a child writes in its folder once it runs under its address-space limit (untrusted: it only
# chooses the words of an error).
_LIMITED = "address_space_limited"


def _rss_limit(work: Path) -> int | None:
    """The resident-memory limit a child on a CUDA machine asks the parent to watch (written in its folder)."""
    try:
        return int((work / "rss_limit").read_text()[:32]) or None
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------
# One clean interpreter that forks the children (reusing_interpreter)
# ---------------------------------------------------------------------------

# The interpreter's loop: for each job it receives (its folder, environment and its pipe ends,
# over a UNIX socket), fork a child that becomes what a fresh interpreter running
# child_main(folder) would be; report its pid, then its wait status and peak RSS.
_ZYGOTE = """
import os, socket, tempfile
import torch
import trt_inline.reference, trt_inline.verify
from trt_inline import compat
from trt_inline.verify.isolation import child_main
compat.import_loaders()
channel = socket.socket(fileno=int(sys.argv[2]))
while True:
    message, descriptors, _, _ = socket.recv_fds(channel, 1 << 20, 4)
    if not message:
        break
    folder, environment = json.loads(message)
    pid = os.fork()
    if pid == 0:
        channel.close()
        os.environ.clear()
        os.environ.update(environment)
        os.setsid()
        output = os.open(os.path.join(folder, "stderr.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(descriptors[0], 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.dup2(descriptors[1], 3)
        os.dup2(descriptors[2], 4)
        os.dup2(descriptors[3], 5)
        os.closerange(6, 1 << 16)
        os.environ["TRT_INLINE_RESULT_FD"] = "3"
        os.environ["TRT_INLINE_PROGRESS_FD"] = "4"
        os.environ["TRT_INLINE_FEED_FD"] = "5"
        tempfile.tempdir = None
        child_main(folder)
    for descriptor in descriptors:
        os.close(descriptor)
    channel.sendall(f"pid {pid}\\n".encode())
    _, status, usage = os.wait4(pid, 0)
    channel.sendall(f"exit {status} {usage.ru_maxrss}\\n".encode())
"""


class _Zygote:
    """A clean interpreter (``python -I``, torch and trt-inline imported) that forks one child per job.

    It never opens a file: each child, in a session of its own, opens one and
    enters the sandbox and the limits itself, exactly as a fresh interpreter's ``child_main``.
    """

    def __init__(self) -> None:
        self.key = _zygote_key()
        self._pending = b""
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            self.process = subprocess.Popen(
                _interpreter_command(_ZYGOTE, str(theirs.fileno())),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                env=_child_environment(),
            )

    def alive(self) -> bool:
        return self.process.poll() is None

    def _line(self, timeout: float | None) -> list[str] | None:
        """The next line it writes, split; None after ``timeout`` seconds. Raises EOFError if it ended."""
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self.channel], [], [], timeout)
            if not ready:
                return None
            chunk = self.channel.recv(4096)
            if not chunk:
                raise EOFError("the interpreter that forks the children ended")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode().split()

    def run(self, work: Path, pipes: _Pipes, limits: Limits) -> _Ended:
        message = json.dumps([str(work), _child_environment(work)]).encode()
        socket.send_fds(self.channel, [message], list(pipes.child_ends()))
        pipes.handed_over()
        started = self._line(None)
        if not started or started[0] != "pid":
            raise EOFError("the interpreter that forks the children gave no child")
        pid = int(started[1])

        def ended() -> tuple[int, int] | None:
            line = self._line(0)
            if line is None:
                return None
            return int(line[1]), int(line[2]) * 1024

        try:
            return _supervise(pid, limits, work, pipes, ended)
        except BaseException:  # interrupted: neither the child nor the interpreter may outlive the call
            _kill_group(pid)
            self.close()
            raise
        finally:
            _kill_group(pid)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.channel.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(self.process.pid)
            self.process.wait()


def _zygote_key() -> tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]:
    """What a child inherits from the interpreter it is forked from: a change here needs a new one."""
    return sys.executable, tuple(sys.path), tuple(sorted(_child_environment().items()))


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
    """Within the block, ``verify``, ``inspect`` and ``diff`` fork their children from one clean interpreter.

    Each child is as isolated as a fresh one (own session, sandbox, limits,
    private folder); the block only saves starting an interpreter and importing
    torch per file. The interpreter is stopped when the block ends.
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
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _resident(pid: int | str) -> int:
    return _proc_kib_field(f"/proc/{pid}/status", "VmRSS")


def _group_resident(group: int) -> int:
    """Resident memory of every process in process group ``group`` (the child, and the one it runs the job in)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(group):
            total += _resident(int(entry))
    return total


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _outcome(ended: _Ended, limits: Limits, where: str) -> ChildResult:
    if ended.stopped == "time":
        raise IsolationError(f"{where}: stopped after {limits.timeout:g} s, the time limit (--timeout raises it)")
    if ended.stopped == "memory":
        raise IsolationError(
            f"{where}: stopped past {format_size(limits.memory)} of memory, the memory limit (--memory-limit raises it)"
        )
    status = ended.status
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
    if ended.overflow:
        raise IsolationError(f"{where}: the child process's report is larger than {format_size(_MAX_RESULT_BYTES)}")
    header, _, tensors = ended.result.partition(b"\n")
    # Parsing JSON holds 10 (a report) to 21 (nested empty lists) times the bytes parsed: a report larger than a
    # sixteenth of the child's own memory limit (16 MiB at least, 128 MiB at most) is refused unread, so that the
    # parent parsing it stays near the limit the child ran under.
    header_limit = min(_MAX_REPORT_BYTES, max(16 << 20, limits.memory // 16))
    if len(header) > header_limit:
        raises = "; --memory-limit raises it" if header_limit < _MAX_REPORT_BYTES else ""
        raise IsolationError(
            f"{where}: the child process's report is {format_size(len(header))}, more than {format_size(header_limit)} "
            f"(a sixteenth of its memory limit, at least 16 MiB and at most 128 MiB{raises})"
        )
    try:
        result = json.loads(header)
        if not isinstance(result, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError, RecursionError):
        code = os.waitstatus_to_exitcode(status)
        if ended.limited:
            # Native code that cannot allocate under the limit (a thread's stack, a buffer) often exits so,
            # before Python can say MemoryError.
            raise IsolationError(
                f"{where}: the child process loading it exited with status {code} and no result while running "
                f"under its memory limit of {format_size(limits.memory)}: it most likely ran out of it (native "
                "code that cannot allocate ends so); --memory-limit raises it"
            ) from None
        raise IsolationError(f"{where}: the child process loading it exited with status {code} and no result") from None
    if "error" in result:
        kinds = (RefusedOperatorError, UnsafeArchiveError, IsolationError, VerifyInputError, RankSetError)
        kind = {cls.__name__: cls for cls in kinds}.get(str(result["error"]), VerifyInputError)
        message = first_line(Exception(str(result.get("message", ""))))
        # The child's own errors name the file; a limit it hit or an unexpected error may not.
        raise kind(message if message.startswith(where) else f"{where}: {message}")
    sandbox = result.get("sandbox")
    # The job process's own peak: the process that waits for it (namespaces) holds the whole
    # interpreter too, and the wait status's figure is the larger of the two.
    peak = result.get("peak_rss")
    base = result.get("base_rss")
    return ChildResult(
        result.get("value"),
        peak if isinstance(peak, int) and peak > 0 else ended.peak_rss,
        base if isinstance(base, int) else 0,
        first_line(Exception(sandbox)) if isinstance(sandbox, str) else None,
        tensors,
        *(max(0, n) if isinstance(n, int) else 0 for n in (result.get("peak_anonymous"), result.get("peak_file"))),
    )


# ---------------------------------------------------------------------------
# The child
# ---------------------------------------------------------------------------


def _read_request() -> tuple[dict[str, Any], bytes]:
    data = bytearray()
    while chunk := os.read(0, 1 << 20):
        data += chunk
    header, _, tensors = bytes(data).partition(b"\n")
    return json.loads(header), tensors


def child_main(folder: str) -> None:
    """Entry point of the child: request, sandbox and limits, the job, its result on the result pipe. Never returns."""
    work = Path(folder)
    result_fd = int(os.environ.get("TRT_INLINE_RESULT_FD", _RESULT_FD))
    progress_fd = int(os.environ.get("TRT_INLINE_PROGRESS_FD", _PROGRESS_FD))
    request: dict[str, Any] = {}
    tensors_out = b""

    def send_progress(message: str, step: tuple[int, int] | None) -> None:
        with contextlib.suppress(OSError):
            os.write(progress_fd, json.dumps([message, step]).encode() + b"\n")

    try:
        request, tensors = _read_request()
        with progress.listening(send_progress):
            value, tensors_out, applied = _child_job(work, request, tensors)
        peak = _own_status("VmHWM")
        result = {
            "value": value, "base_rss": request["base_rss"], "peak_rss": peak, "sandbox": applied,
            "peak_anonymous": request.get("peak_anonymous", 0), "peak_file": request.get("peak_file", 0),
        }  # fmt: skip
    except MemoryError:
        result = _memory_error(request)
    except RecursionError:
        result = {"error": "VerifyInputError", "message": "nested too deeply to be read"}
    except Exception as exc:
        if is_allocation_failure(exc):
            result = _memory_error(request)
        else:
            if request.get("debug"):
                traceback.print_exc()
            kind = type(exc).__name__ if isinstance(exc, TrtInlineError) else "VerifyInputError"
            message = first_line(exc) if isinstance(exc, TrtInlineError) else f"{type(exc).__name__}: {first_line(exc)}"
            result = {"error": kind, "message": message}
    try:
        with open(result_fd, "wb", closefd=False) as out:
            out.write(json.dumps(result).encode() + b"\n" + tensors_out)
    except OSError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _child_job(work: Path, request: dict[str, Any], payload: bytes) -> tuple[Any, bytes, str | None]:
    import importlib
    import resource

    import torch

    import trt_inline.reference
    import trt_inline.verify  # noqa: F401
    from trt_inline import sandbox as sandbox_walls

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    module_name, function_name = request["job"]
    job: Callable[..., Any] = getattr(importlib.import_module(module_name), function_name)
    tensors = torch.load(io.BytesIO(payload), weights_only=True)
    from trt_inline import compat

    applied = None
    # What loading a program imports, imported now: nothing is imported in the sandbox that could be before.
    compat.import_loaders()
    # Whether CUDA may be used, asked without initialising it: torch refuses CUDA in a process forked after
    # CUDA was initialised, and entering the sandbox forks (its PID namespace).
    cuda = compat.cuda_built() and sandbox_walls.cuda_devices_visible()
    if request["arguments"].get("allow_native_code"):
        compat.prepare_package_loading(cuda)
    feed = request.get("read_ahead")
    if feed is not None:  # the parent reads this file ahead: the child says how far
        from trt_inline.verify import read_ahead

        with contextlib.suppress(OSError, KeyError, TypeError, ValueError):
            device, inode = (int(number) for number in feed["identity"])
            read_ahead.feed_parent(int(os.environ["TRT_INLINE_FEED_FD"]), (device, inode), int(feed["window"]))
    if request.get("sandbox", True):
        readable = tuple(request.get("files", ()))
        if request.get("imports"):
            readable += tuple(entry for entry in sys.path if os.path.isabs(entry) and os.path.isdir(entry))
        # Native code the user allowed may bring a loader that writes outside its folder (torch 2.8's: /tmp).
        writable = compat.aoti_loader_folders() if request["arguments"].get("allow_native_code") else ()
        policy = sandbox_walls.Policy(
            work, readable, writable, devices=cuda, namespaces=bool(request.get("namespaces", True))
        )
        applied = sandbox_walls.enter(policy).describe()
    request["base_rss"] = _own_resident()
    memory = int(request["memory"])
    if cuda:
        # The CUDA driver reserves address space far beyond what it uses: the parent watches RSS instead.
        (work / "rss_limit").write_text(str(_own_resident() + memory))
    else:
        limit = _own_address_space() + memory + int(request.get("mapped", 0))
        (work / _LIMITED).touch()
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with MemorySampler() as sampler:
        value = job(request["arguments"], tensors)
    request["peak_anonymous"], request["peak_file"] = sampler.peaks()
    returned = b""
    if isinstance(value, tuple):
        value, extra = value
        buffer = io.BytesIO()
        torch.save(extra, buffer)
        returned = buffer.getvalue()
    # Strings from the file leave the child escaped and cut (the parent does it again: it trusts nothing here).
    return bounded_strings(value), returned, applied


class MemorySampler:
    """A thread reading this process's anonymous and file-backed resident memory every few milliseconds: the
    kernel keeps the peak of their sum only. Peaks are above what the process held when the sampler started."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._base = (_own_status("RssAnon"), _own_status("RssFile"))
        self._peak = self._base
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self._sample()

    def _sample(self) -> None:
        now = (_own_status("RssAnon"), _own_status("RssFile"))
        self._peak = (max(self._peak[0], now[0]), max(self._peak[1], now[1]))

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def peaks(self) -> tuple[int, int]:
        return self._peak[0] - self._base[0], self._peak[1] - self._base[1]


def sandbox_job(arguments: dict[str, Any], tensors: Any) -> dict[str, Any]:
    """What the sandbox of a child set up (``trt-inline doctor``): the layers are in the result itself; and
    whether CUDA starts and computes inside it, where this machine has NVIDIA devices."""
    from trt_inline import compat
    from trt_inline import sandbox as sandbox_walls

    if not (compat.cuda_built() and sandbox_walls.cuda_devices_visible()):
        return {"pid": os.getpid(), "cuda": None}
    import torch

    try:
        count = torch.cuda.device_count()
        if not torch.cuda.is_available() or count == 0:
            return {"pid": os.getpid(), "cuda": "FAILS: torch.cuda.is_available() is False inside the sandbox"}
        value = float((torch.ones(64, device="cuda") * 2).sum())
        name = torch.cuda.get_device_name(0)
    except Exception as exc:
        return {"pid": os.getpid(), "cuda": f"FAILS: {type(exc).__name__}: {first_line(exc)}"}
    if value != 128.0:
        return {"pid": os.getpid(), "cuda": f"FAILS: 64 twos summed to {value} on CUDA"}
    return {"pid": os.getpid(), "cuda": f"works ({count} device{'s' if count > 1 else ''}: {name})"}


def _own_address_space() -> int:
    return _own_status("VmSize")


def _own_resident() -> int:
    return _own_status("VmRSS")


def _own_status(field: str) -> int:
    """A memory figure of this process in bytes (``/proc/self``: in a PID namespace of its own, its pid is not
    the one /proc knows it by)."""
    return _proc_kib_field("/proc/self/status", field)


def is_allocation_failure(exc: BaseException) -> bool:
    """Whether an allocation failed under the limit: the error itself or one it was raised from."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        # A thread's stack is address space too: under the limit, starting one fails so.
        allocation = ("can't allocate memory", "out of memory", "can't start new thread", "cannot allocate memory")
        # A C function of the interpreter that returned failure without an exception: an allocation it could not
        # make (seen under a 16 MiB limit on torch 2.5: "SystemError: error return without exception set").
        unsaid = isinstance(seen, SystemError) and "without exception set" in text
        if isinstance(seen, MemoryError) or unsaid or any(words in text.lower() for words in allocation):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _memory_error(request: dict[str, Any]) -> dict[str, Any]:
    memory = request.get("memory")
    limit = format_size(int(memory)) if isinstance(memory, int) else "memory"
    return {"error": "IsolationError", "message": f"ran out of its memory limit of {limit} (--memory-limit raises it)"}
