"""What every child is sent around its job's request, and what it answers with around its job's response.

:class:`Envelope` is the first line of a child's request pipe (the tensors follow it, as ``torch.save``
bytes); :class:`Answer` is the first line of its result pipe (the tensors it hands back follow it). Both
are read with the one decoder of messages (:func:`trt_inline.codec.decode`): the envelope in the
child, the answer in the parent, which trusts nothing in it. The job's own request and response inside
them are read by the types the job declares (:mod:`trt_inline.isolation.jobs`), not here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trt_inline.codec import Bounds, wire
from trt_inline.errors import MAX_TEXT

__all__ = ["ANSWER_BOUNDS", "Answer", "Envelope", "ReadAhead"]


@dataclass(frozen=True)
class ReadAhead:
    """The file the parent reads into the page cache ahead of the child (``read_ahead``): its identity (device,
    inode), which the child checks before it says how far it has read, and how far ahead it reads at most."""

    identity: tuple[int, int]
    window: int


@dataclass(frozen=True)
class Envelope:
    """A child's request: the job (the ``module`` and ``function`` it was registered as, :mod:`.jobs`) and its
    request as plain data; the memory
    it may use above its imports and the bytes of the files it may map (its address-space limit); the files the
    sandbox lets it read; which walls it enters (``sandbox``, ``namespaces``), whether it may load native code
    or import by name (``imports``), whether it prints its traceback (``debug``), the read-ahead it paces."""

    job: tuple[str, str]
    arguments: Any = field(metadata=wire(unread=True))  # (read by the job's declared request dataclass)
    memory: int
    mapped: int = 0
    files: tuple[str, ...] = ()
    native_code: bool = False
    sandbox: bool = True
    imports: bool = False
    namespaces: bool = True
    debug: bool = False
    read_ahead: ReadAhead | None = None


@dataclass(frozen=True)
class Answer:
    """A child's answer: the job's response as plain data (``value``), or the error that ended it (``error``, the
    name of a trt-inline error, and its ``message``); what the sandbox set up, in words (None: none); its resident
    memory once its imports were done and at its peak, and the job's peaks of anonymous and file-backed memory above
    that (bytes; 0 where not measured)."""

    value: Any = field(default=None, metadata=wire(unread=True))  # (read by the job's own reader in the parent)
    error: str | None = field(default=None, metadata=wire(cut=60))
    message: str = ""
    sandbox: str | None = None
    base_rss: int = field(default=0, metadata=wire(at_least=0))
    peak_rss: int = field(default=0, metadata=wire(at_least=0))
    peak_anonymous: int = field(default=0, metadata=wire(at_least=0))
    peak_file: int = field(default=0, metadata=wire(at_least=0))


# An answer's text escaped and cut as a document's is; a field it leaves out takes its default (an error says
# nothing of memory).
ANSWER_BOUNDS = Bounds(text=MAX_TEXT, defaults=True)
