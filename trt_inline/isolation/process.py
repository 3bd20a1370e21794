"""Starting and supervising a child interpreter: its process group, its supervision, its end.

A child is ``python -I`` with the parent's import path and only the variables
that configure Python, torch and the devices (its command line and environment:
:mod:`trt_inline.isolation.interpreter`, known before torch is imported); the parent polls it against the
time limit and, where CUDA makes the address-space limit useless, against the
resident memory of its process group, and kills the group when it is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trt_inline.isolation.interpreter import child_environment, interpreter_command
from trt_inline.isolation.limits import Limits, proc_kib_field
from trt_inline.isolation.pipes import POLL_SECONDS, Pipes


@dataclass(frozen=True)
class Ended:
    status: int  # wait status
    peak_rss: int
    stopped: str | None  # which limit stopped it, if one did
    result: bytes
    overflow: bool
    limited: bool = False  # the child said it set its address-space limit (the job ran under it)


def run_fresh(work: Path, pipes: Pipes, limits: Limits) -> Ended:
    """The child as a new interpreter."""
    command = interpreter_command(
        "from trt_inline.isolation.inside import child_main; child_main(sys.argv[2])", str(work)
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
                **child_environment(work),
                "TRT_INLINE_RESULT_FD": str(result_write),
                "TRT_INLINE_PROGRESS_FD": str(progress_write),
                "TRT_INLINE_FEED_FD": str(feed_write),
                **relay_fds,
            },
        )
    pipes.handed_over()
    try:
        return supervise(process.pid, limits, work, pipes, lambda: _reap(process))
    finally:
        kill_group(process.pid)
        if process.returncode is None:
            process.wait()


def _reap(process: subprocess.Popen[bytes]) -> tuple[int, int] | None:
    """(wait status, peak RSS) once the child has ended; else None."""
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if not pid:
        return None
    process.returncode = os.waitstatus_to_exitcode(status)
    return status, usage.ru_maxrss * 1024


def supervise(pid: int, limits: Limits, work: Path, pipes: Pipes, ended: Callable[[], tuple[int, int] | None]) -> Ended:
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
            limited = (work / ADDRESS_SPACE_LIMITED).exists()
            return Ended(outcome[0], outcome[1], stopped, bytes(pipes.result), pipes.overflow, limited)
        pipes.drain(POLL_SECONDS)
        if stopped is None:
            if rss_limit is None:
                rss_limit = _rss_limit(work)
            if time.monotonic() > deadline:
                stopped = "time"
            elif rss_limit is not None and _group_resident(pid) > rss_limit:
                stopped = "memory"
            if stopped:
                kill_group(pid)


# The file a child writes in its folder once it runs under its address-space limit (untrusted: it only
# chooses the words of an error).
ADDRESS_SPACE_LIMITED = "address_space_limited"


def _rss_limit(work: Path) -> int | None:
    """The resident-memory limit a child on a CUDA machine asks the parent to watch (written in its folder)."""
    try:
        return int((work / "rss_limit").read_text()[:32]) or None
    except (OSError, ValueError):
        return None


def tail(path: Path, limit: int = 1 << 20) -> str:
    """The last ``limit`` bytes of a file the child wrote, as text."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _resident(pid: int | str) -> int:
    return proc_kib_field(f"/proc/{pid}/status", "VmRSS")


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


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
