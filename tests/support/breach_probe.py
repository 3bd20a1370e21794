"""Code that runs inside the sandboxed child, as if a file had got code to run there (the assume-breach tests).

Reachable only from the tests: ``tests/isolation/test_sandbox.py`` registers :func:`run` as
a job of :mod:`trt_inline.isolation.child` for the length of a test. No file and
no command-line flag can name it. Each attempt is one thing code from a hostile
file would try; the result says, per attempt, ``"blocked: <error>"`` or
``"SUCCEEDED"``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trt_inline.codec import wire
from trt_inline.isolation import job


def _attempt(results: dict[str, str], name: str, action: Callable[[], object]) -> None:
    try:
        action()
    except BaseException as exc:
        results[name] = f"blocked: {type(exc).__name__}: {exc}"
    else:
        results[name] = "SUCCEEDED"


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _connect_tcp(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"breach")


def _connect_unix(path: str) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(2)
        sock.connect(path)
        sock.sendall(b"breach")


def _fork_lingering(marker: str) -> None:
    """A child process that sleeps, then writes the marker: it must never exist, or not outlive the job."""
    pid = os.fork()
    if pid == 0:
        time.sleep(1)
        _write(marker, "outlived the job")
        os._exit(0)


def _spawn(marker: str) -> None:
    subprocess.Popen(["/bin/sh", "-c", f"sleep 1; echo outlived > {marker}"])


def _exec(marker: str) -> None:
    os.execv("/bin/sh", ["sh", "-c", f"echo executed > {marker}"])


def _raw_clone() -> None:
    """``clone(SIGCHLD)`` straight through syscall(2): a new process without the C library's fork."""
    libc = ctypes.CDLL(None, use_errno=True)
    pid = libc.syscall(56, 17, 0, 0, 0, 0)  # x86-64 clone(flags=SIGCHLD)
    if pid == 0:
        os._exit(0)
    if pid < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _ptrace(pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, pid, 0, 0) == -1:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _lower_limits(pid: int) -> None:
    """Set another process's open-file limit (to the value it passed down, so that a broken wall changes nothing)."""
    import resource

    resource.prlimit(pid, resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))


@dataclass(frozen=True)
class BreachRequest:
    """What the probe is to try: a target for each attempt, by name (plain data: a test's)."""

    arguments: dict[str, Any] = field(default_factory=dict, metadata=wire(unread=True))


@dataclass(frozen=True)
class EnvironmentRequest:
    """Nothing: the probe hands back its environment."""


@job(BreachRequest)
def run(request: BreachRequest, tensors: Any) -> dict[str, str]:
    """Try everything the request names a target for; what happened to each attempt."""
    arguments = request.arguments
    results: dict[str, str] = {}
    parent = int(arguments["parent"])
    _attempt(results, "read a secret file outside", lambda: _read(arguments["secret"]))
    _attempt(results, "list the folder the secret is in", lambda: os.listdir(os.path.dirname(arguments["secret"])))
    _attempt(results, "write a file outside", lambda: _write(arguments["outside"], "written"))
    _attempt(results, "change a file outside", lambda: _write(arguments["victim"], "changed"))
    _attempt(results, "delete a file outside", lambda: os.unlink(arguments["victim"]))
    _attempt(results, "rewrite another job's request", lambda: _write(arguments["other_request"], "{}"))
    _attempt(results, "read the home folder", lambda: os.listdir(arguments["home"]))
    _attempt(results, "connect to a listener on 127.0.0.1", lambda: _connect_tcp(int(arguments["port"])))
    _attempt(results, "connect to a UNIX socket", lambda: _connect_unix(arguments["unix_socket"]))
    _attempt(results, "execve /bin/sh", lambda: _exec(arguments["marker"]))
    _attempt(results, "fork a process that outlives the job", lambda: _fork_lingering(arguments["marker"]))
    _attempt(results, "spawn a program", lambda: _spawn(arguments["marker"]))
    if os.uname().machine == "x86_64":
        _attempt(results, "clone a process by syscall", _raw_clone)
    _attempt(results, "signal the parent", lambda: os.kill(parent, signal.SIGTERM))
    _attempt(results, "ptrace the parent", lambda: _ptrace(parent))
    _attempt(results, "read the parent's memory", lambda: _read(f"/proc/{parent}/mem"))
    _attempt(results, "read the parent's environment", lambda: _read(f"/proc/{parent}/environ"))
    _attempt(results, "leave its process group", lambda: os.setpgid(0, 0))
    _attempt(results, "lower the parent's limits", lambda: _lower_limits(parent))
    _attempt(
        results,
        "renice every process of its user",
        lambda: os.setpriority(os.PRIO_USER, 0, os.getpriority(os.PRIO_PROCESS, 0)),
    )
    # What must keep working inside: its own folder, threads, torch.
    private = Path(os.environ["TMPDIR"])
    _attempt(results, "write its own folder", lambda: (private / "own.txt").write_text("fine"))
    thread = threading.Thread(target=lambda: None)
    _attempt(results, "start a thread", thread.start)
    thread.join()
    import torch

    _attempt(results, "compute with torch", lambda: float((torch.ones(64, 64) @ torch.ones(64, 64)).sum()))
    results["own folder holds"] = ", ".join(sorted(os.listdir(private.parent)))
    return results


@job(EnvironmentRequest)
def environment(request: EnvironmentRequest, tensors: Any) -> dict[str, str]:
    """The child's environment, as code in it would read it."""
    return dict(os.environ)
