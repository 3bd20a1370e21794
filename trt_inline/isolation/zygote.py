"""One clean interpreter that forks the children (``with reusing_interpreter():``).

Starting an interpreter and importing torch takes a second or two. Inside the
block one interpreter (torch and trt-inline imported, no file ever opened in it)
forks each child; each child still enters the sandbox and the limits itself.
Outside such a block nothing is left running.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import select
import socket
from collections.abc import Iterator
from pathlib import Path

from trt_inline.isolation.limits import Limits
from trt_inline.isolation.pipes import Pipes
from trt_inline.isolation.process import Ended, kill_group, supervise
from trt_inline_interpreter import StartedInterpreter, child_environment, start_interpreter, zygote_key

log = logging.getLogger(__name__)


def serve(channel_fd: int) -> None:
    """The interpreter's loop: for each job it receives (its folder, environment and its pipe ends, over
    the UNIX socket ``channel_fd``), fork a child that becomes what a fresh interpreter running
    ``child_main(folder)`` would be; report its pid, then its wait status and peak RSS."""
    import tempfile

    import torch  # noqa: F401  (what the children would import first: done once, here)

    from trt_inline import compat
    from trt_inline.isolation.inside import child_main

    compat.import_loaders()
    channel = socket.socket(fileno=channel_fd)
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
        channel.sendall(f"pid {pid}\n".encode())
        _, status, usage = os.wait4(pid, 0)
        channel.sendall(f"exit {status} {usage.ru_maxrss}\n".encode())


class _Zygote:
    """A clean interpreter (``python -I``, torch and trt-inline imported) that forks one child per job.

    It never opens a file: each child, in a session of its own, opens one and
    enters the sandbox and the limits itself, exactly as a fresh interpreter's ``child_main``.
    """

    def __init__(self, started: StartedInterpreter | None = None) -> None:
        self.prestarted = started is not None
        self.started = started if started is not None else start_interpreter()
        self._pending = b""

    def alive(self) -> bool:
        return self.started.process.poll() is None

    def _line(self, timeout: float | None) -> list[str] | None:
        """The next line it writes, split; None after ``timeout`` seconds. Raises EOFError if it ended."""
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self.started.channel], [], [], timeout)
            if not ready:
                return None
            chunk = self.started.channel.recv(4096)
            if not chunk:
                raise EOFError("the interpreter that forks the children ended")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode().split()

    def run(self, work: Path, pipes: Pipes, limits: Limits) -> Ended:
        log.debug(
            "forking the child from the interpreter started %s",
            "before this process imported torch" if self.prestarted else "for this block",
        )
        message = json.dumps([str(work), child_environment(work)]).encode()
        socket.send_fds(self.started.channel, [message], list(pipes.child_ends()))
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
            return supervise(pid, limits, work, pipes, ended)
        except BaseException:  # interrupted: neither the child nor the interpreter may outlive the call
            kill_group(pid)
            self.close()
            raise
        finally:
            kill_group(pid)

    def close(self) -> None:
        self.started.stop()


# The reusable interpreter of the innermost reusing_interpreter() block, if any.
_reusable: contextvars.ContextVar[list[_Zygote] | None] = contextvars.ContextVar("trt_inline_zygote", default=None)


def zygote_for_now() -> _Zygote | None:
    """The block's interpreter, started (or restarted, after it ended or the environment changed) on first use."""
    slot = _reusable.get()
    if slot is None:
        return None
    if slot and (not slot[0].alive() or slot[0].started.key != zygote_key()):
        log.debug(
            "the interpreter the children are forked from %s: starting another",
            "ended" if not slot[0].alive() else "has another environment than a child would get now",
        )
        slot.pop().close()
    if not slot:
        slot.append(_Zygote())
    return slot[0]


@contextlib.contextmanager
def reusing_interpreter(started: StartedInterpreter | None = None) -> Iterator[None]:
    """Within the block, ``verify``, ``inspect`` and ``diff`` fork their children from one clean interpreter.

    Each child is as isolated as a fresh one (own session, sandbox, limits,
    private folder); the block only saves starting an interpreter and importing
    torch per file. The interpreter is stopped when the block ends. ``started``: one already started
    (:func:`trt_inline_interpreter.prestart`), used while what its children inherit is unchanged.
    """
    slot: list[_Zygote] = [] if started is None else [_Zygote(started)]
    token = _reusable.set(slot)
    try:
        yield
    finally:
        _reusable.reset(token)
        for zygote in slot:
            zygote.close()
