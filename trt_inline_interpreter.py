"""A child interpreter's command line and environment, and the interpreter the children are forked from.

These are known before ``trt_inline`` (and so torch) is imported, so the ``trt-inline`` command
(:mod:`trt_inline_command`) starts the interpreter its child will be forked from first, and imports
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

__all__ = [
    "StartedInterpreter", "child_environment", "fork_per_job", "interpreter_command", "prestart",
    "start_interpreter", "take_prestarted", "user_name", "zygote_key",
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
