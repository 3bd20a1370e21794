"""One clean interpreter that forks the children (``with reusing_interpreter():``).

Starting an interpreter and importing torch takes a second or two. Inside the
block one interpreter (torch and trt-inline imported, no file ever opened in it)
forks each child; each child still enters the sandbox and the limits itself.
Outside such a block nothing is left running.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trt_inline.isolation.interpreter import (
    StartedInterpreter,
    child_environment,
    fork_per_job,
    start_interpreter,
    zygote_key,
)
from trt_inline.isolation.limits import Limits
from trt_inline.isolation.pipes import Pipes
from trt_inline.isolation.process import Ended, kill_group, supervise

log = logging.getLogger(__name__)


def serve(channel_fd: int) -> None:
    """The interpreter's loop (:func:`~trt_inline.isolation.interpreter.fork_per_job` over the socket ``channel_fd``):
    each job (its folder and environment, with its pipe ends) becomes a child that is what a fresh interpreter
    running ``child_main(folder)`` would be; its pid, then its wait status and peak RSS, are reported."""
    import tempfile

    import torch  # noqa: F401  (what the children would import first: done once, here)

    from trt_inline import compat
    from trt_inline.isolation.inside import child_main

    compat.import_loaders()

    def become_child(job: Any, descriptors: list[int]) -> None:
        """In the forked child: the session, environment and descriptors a fresh child gets, then its entry point."""
        folder, environment = job
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

    fork_per_job(channel_fd, become_child)


class _Zygote:
    """A clean interpreter (``python -I``, torch and trt-inline imported) that forks one child per job.

    It never opens a file: each child, in a session of its own, opens one and
    enters the sandbox and the limits itself, exactly as a fresh interpreter's ``child_main``.
    """

    def __init__(self, started: StartedInterpreter | None = None) -> None:
        self.prestarted = started is not None
        self.started = started if started is not None else start_interpreter()

    def run(self, work: Path, pipes: Pipes, limits: Limits) -> Ended:
        log.debug(
            "forking the child from the interpreter started %s",
            "before this process imported torch" if self.prestarted else "for this block",
        )
        self.started.fork([str(work), child_environment(work)], pipes.child_ends())
        pipes.handed_over()
        pid = self.started.forked()
        try:
            return supervise(pid, limits, work, pipes, lambda: self.started.ended(0))
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
    if slot and (not slot[0].started.alive() or slot[0].started.key != zygote_key()):
        log.debug(
            "the interpreter the children are forked from %s: starting another",
            "ended" if not slot[0].started.alive() else "has another environment than a child would get now",
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
    (:func:`trt_inline.isolation.interpreter.prestart`), used while what its children inherit is unchanged.
    """
    slot: list[_Zygote] = [] if started is None else [_Zygote(started)]
    token = _reusable.set(slot)
    try:
        yield
    finally:
        _reusable.reset(token)
        for zygote in slot:
            zygote.close()
