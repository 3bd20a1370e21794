"""Progress of long work (reading, loading, running engine k of n, comparing, writing), for a person watching.

Library code reports with :func:`report` and prints nothing. Each report is an
INFO record of the ``trt_inline.progress`` logger (from Python, a handler on the
``trt_inline`` logger shows it), and goes to the listeners of the current
context: the command line's printer (:func:`printing`: ``--progress``, or stderr
a terminal; never with ``--json``), or, in a child process that opens a file, the
pipe that carries its reports to the parent, where they are reported again.

A report is one line: what is being done, and where it is repetitive, which
step of how many (``step=(k, n)``); the printer shows such steps at most once a
second, and always the last.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

__all__ = ["Listener", "listening", "printing", "report"]

log = logging.getLogger(__name__)

# A listener gets each report's text and, for repetitive work, (step, of).
Listener = Callable[[str, "tuple[int, int] | None"], None]
_listeners: contextvars.ContextVar[tuple[Listener, ...]] = contextvars.ContextVar("trt_inline_progress", default=())


def report(message: str, step: tuple[int, int] | None = None) -> None:
    """Say what is being done now (``step``: this is step k of n of it)."""
    if log.isEnabledFor(logging.INFO):
        log.info("%s%s", message, f" ({step[0]} of {step[1]})" if step else "")
    for listener in _listeners.get():
        listener(message, step)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Within the block, every report also goes to ``listener``."""
    token = _listeners.set((*_listeners.get(), listener))
    try:
        yield
    finally:
        _listeners.reset(token)


@contextlib.contextmanager
def printing(enabled: bool, stream: TextIO | None = None, prefix: str = "trt-inline") -> Iterator[None]:
    """Within the block, print reports as plain lines (``[  1.2 s] reading ...``) on ``stream`` (stderr)."""
    if not enabled:
        yield
        return
    out = stream if stream is not None else sys.stderr
    started = time.monotonic()
    last: dict[str, float] = {}

    def show(message: str, step: tuple[int, int] | None) -> None:
        now = time.monotonic()
        if step is not None and step[0] < step[1] and now - last.get(message, 0.0) < 1.0:
            return
        last[message] = now
        counted = f" ({step[0]} of {step[1]})" if step else ""
        out.write(f"{prefix}: [{now - started:6.1f} s] {message}{counted}\n")
        out.flush()

    with listening(show):
        yield
