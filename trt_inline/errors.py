"""Every exception class trt_inline raises on purpose.

Each error a user can cause names the node, submodule, file or archive entry it
is about, so that a failing save or check of a large model points at the place
to look. The classes are re-exported where they were first defined
(``trt_inline.plugin.PatchError``, ``trt_inline.verify.VerifyInputError``).
"""

from __future__ import annotations

import re


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


class PatchError(TrtInlineError, RuntimeError):
    """The installed Torch-TensorRT's exporter does not look like any supported version."""


class VerifyInputError(TrtInlineError, ValueError):
    """The input to verification is unusable: not a program file, no reference data, wrong inputs.

    Also raised when a file is refused before loading because loading it could
    run code from it (a pickle that needs more than plain tensors, a zip bomb).
    """


class UnsafeArchiveError(VerifyInputError):
    """A file was refused before loading: reading it could run code or exhaust memory.

    The message names the archive entry and why; ``allow_pickle=True`` (CLI
    ``--allow-pickle``) lets pickles through for files from a trusted source.
    """


class RefusedOperatorError(UnsafeArchiveError):
    """A graph or a reference engine in a file calls something that is not an allowed operator.

    The message names the node (or the engine and its step) and the operator;
    see :mod:`trt_inline.allowed_ops` for the allow-list, ``allow_ops`` /
    ``--allow-op`` to extend it for a file from a trusted source.
    """


class IsolationError(VerifyInputError):
    """The child process that loads and runs a file was stopped: a limit was hit, or it died on a signal."""


class IncompatibleTorchError(TrtInlineError, RuntimeError):
    """The installed torch lacks a private API that a trt_inline feature needs.

    The message names the feature and the API; see the compatibility table in
    the README for the torch versions each feature was run on.
    """


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character escaped (``\\x1b``): safe to print whatever a file put in it.

    Strings from a saved file (archive entry names, targets, recorded output
    kinds, messages of exceptions raised while loading it) go through this before
    they reach a terminal, so that a file cannot move the cursor, rewrite earlier
    lines or forge a line of the report.
    """
    return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, control characters escaped: what a one-line report shows."""
    lines = str(exc).strip().splitlines()
    return printable(lines[0]) if lines else ""
