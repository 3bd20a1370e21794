"""Exceptions raised by trt_inline.

Every error a user can cause names the node or submodule it is about, so that a
failing save of a large model points at the block to look at.
"""

from __future__ import annotations


class TrtInlineError(Exception):
    """Base class of every error trt_inline raises on purpose."""


class InlineError(TrtInlineError, ValueError):
    """A partitioned module cannot be inlined as it stands.

    Raised for graphs that do not have the shape ``torch_tensorrt.dynamo.compile``
    (or :func:`trt_inline.reference.compile`) produces: a call with the wrong
    number of arguments, an accelerated submodule of an unknown type, an engine
    call node without ``meta["val"]``.
    """


class EngineFormatError(TrtInlineError, ValueError):
    """A reference-engine program string or payload is malformed."""


class SaveError(TrtInlineError, ValueError):
    """``trt_inline.save`` was given something it cannot write."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message: what a one-line error report shows."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""
