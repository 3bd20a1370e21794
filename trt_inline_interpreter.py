"""A child interpreter's command line and environment, and the interpreter the children are forked from.

These are known before ``trt_inline`` (and so torch) is imported, so the ``trt-inline`` command
(:mod:`trt_inline_command`) starts the interpreter its child will be forked from first, and imports
torch while that interpreter imports it too: on two cores the two imports overlap rather than follow
one another. The rest of the isolation — the zygote's loop, the sandbox, the limits, the supervision —
is in :mod:`trt_inline.isolation`, which reads the command line and the environment from here.
This module imports nothing but the standard library (the lowest floor of ``python3 .ci/imports``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import getpass
import json
import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "StartedInterpreter", "child_environment", "interpreter_command", "prestart", "start_interpreter",
    "take_prestarted", "user_name", "zygote_key",
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
    return sys.executable, tuple(sys.path), tuple(sorted(child_environment().items()))


# The zygote's loop (trt_inline.isolation.zygote.serve), given its end of the socket.
_ZYGOTE_CODE = "from trt_inline.isolation.zygote import serve; serve(int(sys.argv[2]))"


@dataclass
class StartedInterpreter:
    """A clean interpreter (``python -I``, in a session of its own) importing torch and trt-inline, then
    forking one child per job it receives on ``channel``. ``key``: what its children inherit."""

    process: subprocess.Popen[bytes]
    channel: socket.socket
    key: Key

    def stop(self) -> None:
        """Close its socket and kill its process group (it holds nothing worth a graceful end)."""
        with contextlib.suppress(OSError):
            self.channel.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def start_interpreter() -> StartedInterpreter:
    """Start the interpreter the children are forked from; it imports torch while the caller goes on."""
    ours, first = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # Its end on a descriptor above 2: where the caller started with 0, 1 or 2 closed, the pair may be given
    # those, and the interpreter's stdin, stdout and stderr (/dev/null) would replace its end.
    theirs = socket.socket(fileno=fcntl.fcntl(first.fileno(), fcntl.F_DUPFD_CLOEXEC, 3))
    first.close()
    with theirs:
        process = subprocess.Popen(
            interpreter_command(_ZYGOTE_CODE, str(theirs.fileno())),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
            env=child_environment(),
        )
    return StartedInterpreter(process, ours, zygote_key())


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
