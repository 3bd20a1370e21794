"""A child interpreter's command line and environment, and the interpreter the children are forked from.

These are known before torch is imported (this module and the package's ``__init__`` import only the standard
library), so the ``trt-inline`` command
(:mod:`trt_inline.__main__`) starts the interpreter its child will be forked from first, and imports
torch while that interpreter imports it too: on two cores the two imports overlap rather than follow
one another. Such an interpreter's loop (:func:`fork_per_job`: a job over a UNIX socket, a child forked
for it, its pid and its end reported) and the parent's side of it (:class:`StartedInterpreter`) are here
too; what a child becomes is given by the module the interpreter serves: the sandboxed child's
(:func:`trt_inline.isolation.zygote.serve`), or the tests' own. The rest of the isolation — the sandbox,
the limits, the supervision — is in :mod:`trt_inline.isolation`, which reads the command line and the
environment from here. This module imports nothing but the standard library (the lowest floor of
``python3 .ci/imports``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import getpass
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trt_inline.errors import ForkedCallError

__all__ = [
    "ForkedCallError", "ForkedServer", "StartedInterpreter", "call_forked", "child_environment", "fork_per_job",
    "interpreter_command", "prestart", "start_interpreter", "take_prestarted", "user_name", "zygote_key",
]  # fmt: skip


def interpreter_command(code: str, *arguments: str) -> list[str]:
    """``python -I -c code`` with this process's import path (absolute entries only) as its ``sys.path``."""
    path = [entry for entry in sys.path if entry and os.path.isabs(entry)]
    prelude = "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    return [sys.executable, "-I", "-c", prelude + code, json.dumps(path), *arguments]


# Environment variables a child keeps: what configures the interpreter, torch, its threads, its
# allocator and the devices it sees. A change in one of them needs a new interpreter to fork from.
_STARTUP_VARIABLES = re.compile(
    r"^(PYTHON|PYTORCH_|LD_|MALLOC_|OMP_|MKL_|KMP_|GOMP_|OPENBLAS_|CUDA_|NVIDIA_|TORCH|TRT_INLINE_|LANG$|LC_|TZ$)"
)


def child_environment(work: Path | None = None) -> dict[str, str]:
    """The variables a child gets: the startup ones of this process, and where its temporary files go.

    Each thread's malloc arena reserves 64 MiB of address space: few arenas, so that the
    address-space limit measures memory rather than the machine's core count. OpenBLAS
    (numpy's) would start a thread at import, and a process with threads cannot enter new
    namespaces; torch does not use it.
    """
    environment = {k: v for k, v in os.environ.items() if _STARTUP_VARIABLES.match(k)}
    # The user's name, as a normal call sees it: the sandbox hides /etc/passwd, where getpass.getuser()
    # looks without these, and torch before 2.13 names its cache folder after it (KeyError otherwise).
    environment.update(USER=user_name(), LOGNAME=user_name(), MALLOC_ARENA_MAX="2", OPENBLAS_NUM_THREADS="1")
    if work is not None:
        private = str(work / "tmp")
        environment.update(
            TMPDIR=private, HOME=private, CUDA_CACHE_PATH=private, XDG_CACHE_HOME=private,
            TORCHINDUCTOR_CACHE_DIR=private, TRITON_CACHE_DIR=private,
        )  # fmt: skip
    return environment


@functools.cache
def user_name() -> str:
    """This process's user name (``getpass.getuser()``), ``uid_N`` where the system has none for it."""
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):
        return f"uid_{os.getuid()}"


Key = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]


def zygote_key() -> Key:
    """What a child inherits from the interpreter it is forked from: a change here needs a new one."""
    return _key(child_environment())


def _key(environment: dict[str, str]) -> Key:
    return sys.executable, tuple(sys.path), tuple(sorted(environment.items()))


# What an interpreter runs: serve(channel_fd, *arguments) of the module named after its import path (sys.argv[2]).
_SERVE = "import importlib; importlib.import_module(sys.argv[2]).serve(int(sys.argv[3]), *sys.argv[4:])"


def fork_per_job(channel_fd: int, child: Callable[[Any, list[int]], object]) -> None:
    """An interpreter's loop: for each job it receives over the UNIX socket ``channel_fd`` (one JSON message with
    up to 4 descriptors), fork a child that runs ``child(job, descriptors)`` and ends there; report ``pid N``, then
    ``exit STATUS MAXRSS`` (its wait status, its peak RSS in KiB). Ends when the socket is closed.

    A job is data for ``child``: what a child runs is fixed by the interpreter's start, never by a message.
    """
    channel = socket.socket(fileno=channel_fd)
    while True:
        message, descriptors, _, _ = socket.recv_fds(channel, 1 << 20, 4)
        if not message:
            break
        job = json.loads(message)
        pid = os.fork()
        if pid == 0:
            try:
                channel.close()
                child(job, descriptors)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:  # (``child`` does not return; should it, or raise, its process must not serve this loop too)
                os._exit(1)
        for descriptor in descriptors:
            os.close(descriptor)
        channel.sendall(f"pid {pid}\n".encode())
        _, status, usage = os.wait4(pid, 0)
        channel.sendall(f"exit {status} {usage.ru_maxrss}\n".encode())


@dataclass
class StartedInterpreter:
    """A clean interpreter (``python -I``, in a session of its own) importing torch and what its loop needs,
    then forking one child per job it receives on ``channel`` (:func:`fork_per_job`). ``key``: what its
    children inherit."""

    process: subprocess.Popen[bytes]
    channel: socket.socket
    key: Key
    _pending: bytes = field(default=b"", init=False, repr=False)

    def alive(self) -> bool:
        """Whether its process is still running."""
        return self.process.poll() is None

    def fork(self, job: object, descriptors: Sequence[int] = ()) -> None:
        """Ask for a child for ``job`` (JSON, kept short: it is read in one piece), handing it ``descriptors``."""
        socket.send_fds(self.channel, [json.dumps(job).encode()], list(descriptors))

    def forked(self, timeout: float | None = None) -> int:
        """The pid of the child asked for. Raises TimeoutError after ``timeout`` seconds, EOFError if it ended."""
        line = self._line(timeout)
        if line is None:
            raise TimeoutError("the interpreter that forks the children gave no child in time")
        if not line or line[0] != "pid":
            raise EOFError("the interpreter that forks the children gave no child")
        return int(line[1])

    def ended(self, timeout: float | None = None) -> tuple[int, int] | None:
        """That child's wait status and peak RSS in bytes once it has ended; None after ``timeout`` seconds.
        Raises EOFError if the interpreter ended."""
        line = self._line(timeout)
        return None if line is None else (int(line[1]), int(line[2]) * 1024)

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

    def stop(self) -> None:
        """Close its socket and kill its process group (it holds nothing worth a graceful end). Once it has been
        waited for (``poll()`` saw it end) its pid may be another process's: then nothing is killed."""
        with contextlib.suppress(OSError):
            self.channel.close()
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def start_interpreter(
    loop: str = "trt_inline.isolation.zygote",
    *arguments: str,
    environment: dict[str, str] | None = None,
    output: IO[bytes] | None = None,
) -> StartedInterpreter:
    """Start an interpreter whose loop is ``loop.serve(channel_fd, *arguments)``: by default the one the sandboxed
    children are forked from, which imports torch while the caller goes on. ``environment``: its variables (by
    default a child's, :func:`child_environment`); ``output``: where its stdout and stderr go (by default nowhere).
    """
    environment = child_environment() if environment is None else environment
    ours, first = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # Its end on a descriptor above 2: where the caller started with 0, 1 or 2 closed, the pair may be given
    # those, and the interpreter's stdin, stdout and stderr (/dev/null) would replace its end.
    theirs = socket.socket(fileno=fcntl.fcntl(first.fileno(), fcntl.F_DUPFD_CLOEXEC, 3))
    first.close()
    with theirs:
        process = subprocess.Popen(
            interpreter_command(_SERVE, loop, str(theirs.fileno()), *arguments),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if output is None else output,
            stderr=subprocess.DEVNULL if output is None else output,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
            env=environment,
        )
    return StartedInterpreter(process, ours, _key(environment))


_prestarted: list[StartedInterpreter] = []


def prestart() -> None:
    """Start the interpreter now, for :func:`take_prestarted` to hand to the first block that forks children;
    stopped at exit where nothing took it."""
    import atexit

    if not _prestarted:
        _prestarted.append(start_interpreter())
        atexit.register(_stop_untaken)


def take_prestarted() -> StartedInterpreter | None:
    """The interpreter :func:`prestart` started, once; None where none was."""
    return _prestarted.pop() if _prestarted else None


def _stop_untaken() -> None:
    while _prestarted:
        _prestarted.pop().stop()


def call_forked(job: Callable[[], bytes], *, timeout: float | None = None, output: str = os.devnull) -> bytes:
    """The bytes ``job()`` returns, run in a child forked from this process.

    The child starts as this process is (its memory copied on write, the caller's objects included), so
    whatever it changes — modules it imports, globals it sets, registrations it makes — ends with it: nothing of
    it reaches this process but the bytes. Its standard output and error, and its log records, go to ``output``.
    Raises :class:`ForkedCallError` with the child's exception (or how it ended: an answer counts only from a
    child that exited normally), :class:`TimeoutError` after ``timeout`` seconds (the child is killed); Ctrl-C
    here kills the child too.

    Callers that compute in the child keep to one thread there: GNU OpenMP's threads do not survive a fork, and a
    parallel region started in the child of a process that used them waits forever.
    """
    _flush_standard_streams()
    readable, writable = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        os.close(readable)
        os.close(writable)
        raise
    if pid == 0:  # the child: never returns into the caller's stack, whatever fails
        _run_child(lambda: _answer(job, writable), closing=(readable,), output=output)
    os.close(writable)
    return _answer_of(pid, readable, timeout)


def _run_child(body: Callable[[], None], *, closing: Sequence[int], output: str | None) -> None:
    """In a forked child: close the parent's ends, send output to ``output`` (None: where it goes already), run
    ``body``, and end the process (exit status 0 only where ``body`` returned), never returning into the stack it
    was forked from."""
    status = 1
    try:
        for descriptor in closing:
            os.close(descriptor)
        if output is not None:
            _redirect_output(output)
        body()
        status = 0
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):  # (what is buffered here would be written twice)
        with contextlib.suppress(Exception):
            stream.flush()


def _redirect_output(output: str) -> None:
    """Descriptors 1 and 2, ``sys.stdout``/``sys.stderr`` and every log record of this (forked) process to
    ``output``: the caller may have replaced its streams or attached handlers (a log file of its own) that the
    child would otherwise write to."""
    import logging

    sink = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    os.close(sink)
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # (never closed: the process ends with os._exit)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        if isinstance(logger, logging.Logger):
            logger.handlers = []
    logging.getLogger().addHandler(logging.StreamHandler(sys.stderr))


def _answer(job: Callable[[], bytes], writable: int) -> None:
    """In a forked child: write ``job()``'s bytes (``R...``) or how it raised (``E`` and JSON) to ``writable``."""
    try:
        answer = b"R" + job()
    except BaseException as exc:  # (KeyboardInterrupt too: the caller hears how the child ended)
        answer = b"E" + _told(exc)
    with os.fdopen(writable, "wb") as pipe:
        pipe.write(answer)


def _told(exc: BaseException) -> bytes:
    import traceback

    first = (str(exc).strip().splitlines() or [""])[0]
    return json.dumps({"kind": type(exc).__name__, "message": first, "details": traceback.format_exc()}).encode()


def _answer_of(pid: int, readable: int, timeout: float | None) -> bytes:
    """What the child ``pid`` wrote to ``readable`` (:func:`_answer`), once it ended: its bytes, or its
    exception raised as :class:`ForkedCallError`."""
    try:
        answer = _read_all(readable, timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    finally:
        os.close(readable)
    _, status = os.waitpid(pid, 0)
    return _decoded_answer(_checked_answer(answer, status))


def _checked_answer(answer: bytes, status: int) -> bytes:
    """``answer`` where the child that wrote it exited with status 0, else how the child ended (an ``E`` answer):
    a child killed while it wrote (out of memory, a signal) leaves an answer cut short."""
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and answer[:1] in (b"R", b"E"):
        return answer
    ended = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
    told = {"kind": "", "message": f"the forked child ended with {ended} before it answered", "details": ""}
    return b"E" + json.dumps(told).encode()


def _decoded_answer(answer: bytes) -> bytes:
    if answer[:1] == b"R":
        return answer[1:]
    told = json.loads(answer[1:])
    raise ForkedCallError(str(told["kind"]), str(told["message"]), str(told["details"]))


class ForkedServer:
    """A child forked from this process that prepares once (``setup()``: an import that takes seconds) and then,
    for each :meth:`call`, forks a child of its own that answers ``handle(request)``: every call starts from the
    state ``setup`` left, never from what an earlier call did. As with :func:`call_forked`, nothing of it reaches
    this process but the bytes; :meth:`close` (or leaving the ``with`` block) ends it and the child answering.
    The server and its children are a process group of their own: Ctrl-C at the terminal reaches this process,
    which ends them.
    """

    def __init__(
        self, setup: Callable[[], None], handle: Callable[[bytes], bytes], *, output: str = os.devnull
    ) -> None:
        _flush_standard_streams()
        requests_read, self._requests = os.pipe()
        self._answers, answers_written = os.pipe()
        try:
            self.pid = os.fork()
        except BaseException:
            for descriptor in (requests_read, self._requests, self._answers, answers_written):
                os.close(descriptor)
            raise
        if self.pid == 0:
            _run_child(
                functools.partial(self._serve, setup, handle, requests_read, answers_written),
                closing=(self._requests, self._answers),
                output=output,
            )
        with contextlib.suppress(OSError):  # (both sides set the group: whichever runs first)
            os.setpgid(self.pid, self.pid)
        os.close(requests_read)
        os.close(answers_written)

    @staticmethod
    def _serve(setup: Callable[[], None], handle: Callable[[bytes], bytes], requests: int, answers: int) -> None:
        """The server's loop (in its process): a framed request in, a child forked per request, its framed answer
        out. A failing ``setup`` answers every request with its exception."""
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the caller decides when this ends)
        failure: bytes | None = None
        try:
            setup()
        except BaseException as exc:
            failure = b"E" + _told(exc)
        while (request := _read_frame(requests)) is not None:
            if failure is not None:
                _write_frame(answers, failure)
                continue
            readable, writable = os.pipe()
            pid = os.fork()
            if pid == 0:
                job = functools.partial(handle, request)
                _run_child(functools.partial(_answer, job, writable), closing=(readable,), output=None)
            os.close(writable)
            answer = _read_all(readable, None)
            os.close(readable)
            _, child_status = os.waitpid(pid, 0)
            _write_frame(answers, _checked_answer(answer, child_status))

    def call(self, request: bytes) -> bytes:
        """The bytes ``handle(request)`` returns in a child of the server; :class:`ForkedCallError` as
        :func:`call_forked` raises it (also where the server itself ended, or was closed)."""
        if not self.pid:
            raise ForkedCallError("", "the forked server was closed")
        try:
            _write_frame(self._requests, request)
            answer = _read_frame(self._answers)
        except BrokenPipeError:
            answer = None
        except BaseException:
            self.close()
            raise
        if answer is None:
            self.close()  # (reaps it)
            raise ForkedCallError("", "the forked server ended before it answered")
        return _decoded_answer(answer)

    def close(self) -> None:
        """End the server and the child answering (they hold nothing worth a graceful end)."""
        if self.pid:
            for descriptor in (self._requests, self._answers):
                with contextlib.suppress(OSError):
                    os.close(descriptor)
            self._requests = self._answers = -1
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = 0

    def __enter__(self) -> ForkedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_frame(descriptor: int, data: bytes) -> None:
    """``data`` with its length first (8 bytes): what :func:`_read_frame` reads back whole."""
    view = memoryview(len(data).to_bytes(8, "little") + data)
    while view:
        written = os.write(descriptor, view)
        view = view[written:]


def _read_frame(descriptor: int) -> bytes | None:
    """The next frame :func:`_write_frame` wrote, or None where the other end closed."""
    head = _read_exactly(descriptor, 8)
    if head is None:
        return None
    body = _read_exactly(descriptor, int.from_bytes(head, "little"))
    return body


def _read_exactly(descriptor: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(descriptor, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_all(descriptor: int, timeout: float | None) -> bytes:
    """Everything written to ``descriptor`` until it is closed; TimeoutError after ``timeout`` seconds. (poll, not
    select: a caller may hold more than 1024 descriptors.)"""
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    poller = select.poll()
    poller.register(descriptor, select.POLLIN | select.POLLHUP | select.POLLERR)
    chunks: list[bytes] = []
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
        if not poller.poll(left):
            raise TimeoutError(f"the forked child gave no answer within {timeout:g} s")
        chunk = os.read(descriptor, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
