"""Every exception class trt_inline raises on purpose.

Each error a user can cause names the node, submodule, file or archive entry it
is about, so that a failing save or check of a large model points at the place
to look. The classes are re-exported where they were defined before
(``trt_inline.plugin.PatchError``, ``trt_inline.verify.VerifyInputError``,
``trt_inline.fixing.FixError``, ``trt_inline.codec.MessageError``,
``trt_inline.isolation.sandbox.SandboxUnavailable``). (Exceptions a module raises and
catches itself, to stop a walk, stay private to it.) Standard library only: the lowest floor
(``python3 .ci/imports``), so that a child interpreter started before torch raises them too.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any


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


class CompileError(TrtInlineError, RuntimeError):
    """A compile by the reference backend failed in a step of torch's: the message says which and on what
    (torch's exception is chained: its traceback follows, or shows with ``--debug``)."""


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


class LoadError(VerifyInputError):
    """``trt_inline.load`` cannot load a file here: not a program file, unreadable, or an engine this machine
    cannot run (a refusal of the strict reader stays an :class:`UnsafeArchiveError`)."""


class IsolationError(VerifyInputError):
    """The child process that loads and runs a file was stopped: a limit was hit, or it died on a signal."""


class RankSetError(TrtInlineError, RuntimeError):
    """A tensor-parallel rank set does not fit together: a rank did not arrive, or a file is another rank's.

    The message names the ranks (and the file) concerned.
    """


class FixError(TrtInlineError, ValueError):
    """``find_fix`` cannot search: no case to hold the build to, a strategy the settings cannot express, a script
    ``trt-inline fix`` cannot read a model from."""


class MessageError(ValueError):
    """A message between a parent and its child that is not what its dataclass declares: its path
    (``tolerances.atol``) and what is wrong (:mod:`trt_inline.codec`; the parent says it as an
    :class:`IsolationError` or a :class:`VerifyInputError` naming the file)."""


class SandboxUnavailable(RuntimeError):
    """A wall the sandbox needs (Landlock, seccomp) cannot be set up on this system
    (:mod:`trt_inline.isolation.sandbox`; said as an :class:`IsolationError` before any child starts)."""


class ForkedCallError(Exception):
    """What a child forked for one call raised (:func:`trt_inline.isolation.interpreter.call_forked`; ``kind``: its
    type's name, ``message``: its first line, ``summary``: both, ``details``: its traceback), or how it ended without
    an answer (``kind`` empty)."""

    def __init__(self, kind: str, message: str, details: str = "") -> None:
        self.kind, self.message, self.details = kind, message, details
        self.summary = f"{kind}: {message}" if kind and message else kind or message
        super().__init__(self.summary)


class Unencodable(Exception):
    """An argument of a block's node that an engine program cannot hold (:mod:`trt_inline.reference.program`): the
    block is not made an engine."""


class StdoutGone(Exception):
    """The reader of stdout left (``| head -1``) while a command's report was written
    (:mod:`trt_inline.commands.output`; the command ends as a closed pipe ends it)."""


class IncompatibleTorchError(TrtInlineError, RuntimeError):
    """The installed torch lacks a private API that a trt_inline feature needs.

    The message names the feature and the API; see the compatibility table in
    the README for the torch versions each feature was run on.
    """


# Unicode categories escaped in anything printed from a file: controls (newlines included), format
# characters (bidi marks, zero-width spaces), line and paragraph separators, surrogates, private use
# and unassigned code points.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# How long a string from a file may be once decoded: names, messages and labels are cut here.
MAX_TEXT = 2000


def _escape(character: str) -> str:
    return character.encode("unicode_escape").decode("ascii")


def printable(text: str) -> str:
    """``text`` with every control and format character escaped (``\\x1b``, ``\\n``, ``\\u200f``).

    Strings from a saved file (archive entry names, targets, recorded names and
    output kinds, messages of exceptions raised while loading it) go through
    this where they are decoded, so that a file cannot move the cursor, rewrite
    earlier lines, forge a line of the report or reorder it with bidi marks.
    """
    if text.isascii():
        return _ASCII_CONTROL.sub(lambda match: _escape(match.group()), text)
    if len(text) > _CHUNK:  # (escaping holds an object per character: a chunk at a time, not the whole text)
        return "".join(printable(text[start : start + _CHUNK]) for start in range(0, len(text), _CHUNK))
    return "".join(
        _escape(c) if c < " " or c == "\x7f" or (c > "~" and unicodedata.category(c) in _ESCAPED_CATEGORIES) else c
        for c in text
    )


# How many characters printable escapes at once.
_CHUNK = 1 << 16


def decoded_text(text: str, limit: int = MAX_TEXT) -> str:
    """A string from a file as it may be kept and shown: escaped (:func:`printable`), then cut to ``limit``, saying
    how many escaped characters were cut."""
    # Each character escapes to one or more: the first ``limit`` give all that is shown; the rest is only counted,
    # a chunk at a time (a child's report may hold tens of MiB of text).
    head = printable(text[:limit])
    if len(text) <= limit and len(head) <= limit:
        return head
    rest = sum(len(printable(text[start : start + _CHUNK])) for start in range(limit, len(text), _CHUNK))
    return f"{head[:limit]}... ({len(head) + rest - limit} more characters)"


def bounded_strings(value: Any, limit: int = MAX_TEXT) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string and key through :func:`decoded_text`.

    What a child process hands back goes through this before it leaves the child
    and again where the parent decodes it: code that ran in the child cannot put a
    raw or unbounded string in front of the user.
    """
    if isinstance(value, str):
        return decoded_text(value, limit)
    if isinstance(value, dict):
        return {decoded_text(str(k), limit): bounded_strings(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [bounded_strings(v, limit) for v in value]
    return value


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, escaped and cut: what a one-line report shows."""
    lines = str(exc).strip().splitlines()
    return decoded_text(lines[0]) if lines else ""
