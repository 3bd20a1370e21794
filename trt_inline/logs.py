"""trt_inline's loggers, and graph dumps that cost nothing unless DEBUG is on.

Every module logs to ``logging.getLogger(__name__)``, a child of ``"trt_inline"``.
To see the graph before and after each pass::

    import logging
    logging.basicConfig()
    logging.getLogger("trt_inline").setLevel(logging.DEBUG)

(``trt-inline --debug ...`` does the same for the command line.)
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

import torch.fx

__all__ = ["ROOT", "LazyGraph", "debug_to_stderr", "log_graph"]

ROOT = "trt_inline"


class LazyGraph:
    """A graph's listing, formatted only when a log record is actually emitted.

    Reads ``gm.graph`` rather than ``gm.code``: the passes leave recompiling to
    their caller, so the code can lag the graph they are editing.
    """

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm

    def __str__(self) -> str:
        return str(self.gm.graph)


def log_graph(log: logging.Logger, title: str, gm: torch.fx.GraphModule) -> None:
    """One DEBUG record: ``title`` and the graph, formatted only if DEBUG is enabled for ``log``."""
    log.debug("%s:\n%s", title, LazyGraph(gm))


@contextlib.contextmanager
def debug_to_stderr(enabled: bool) -> Iterator[None]:
    """While active (and ``enabled``), trt_inline's DEBUG records go to stderr; the logger is restored after."""
    if not enabled:
        yield
        return
    root = logging.getLogger(ROOT)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
