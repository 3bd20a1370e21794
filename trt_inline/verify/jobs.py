"""What each child job is sent, and what ``inspect`` and ``check`` hand back: one dataclass per message.

A request holds the option groups a job reads (:mod:`trt_inline.verify.options`), as
:func:`~trt_inline.verify.options.for_child` makes them (tensors travel apart, through
``torch.save``), and the job's own fields; each is built in one place (its ``of``).
:func:`~trt_inline.isolation.run_isolated` sends it as plain data
(:func:`trt_inline.messages.encode`, decoded first in the parent as the child will) and the
child decodes it strictly into the dataclass its job's first parameter names
(:func:`trt_inline.messages.decode`) before the job runs:

=====================  ===========  ===========================================================
request                job          sent by
=====================  ===========  ===========================================================
:class:`VerifyRequest` ``verify``   :func:`trt_inline.verify`, each rank of a rank set
:class:`DiffRequest`   ``diff``     :func:`trt_inline.diff`
:class:`InspectRequest` ``inspect`` ``trt-inline inspect``
:class:`NeedsRequest`  ``needs``    ``trt-inline check`` (:func:`~trt_inline.verify.engine_needs.check_engines`)
=====================  ===========  ===========================================================

The engine infos ``inspect`` and ``needs`` hand back (:class:`InspectResponse`,
:class:`NeedsResponse`) are read by the same decoder (:func:`response_of_child`), within the
bounds :class:`~trt_inline.deployment.EngineInfo` declares; a ``verify`` or ``diff`` report too
(:meth:`~trt_inline.verify.report.VerifyReport.from_dict`), within the bounds its fields declare
and the whole report's (:data:`~trt_inline.verify.report.REPORT_BOUNDS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from trt_inline.deployment import EngineInfo
from trt_inline.errors import IsolationError
from trt_inline.messages import MessageError, decode, wire
from trt_inline.output_tree import OutputTree
from trt_inline.verify.options import Inputs, Options, Reference, Tolerances, Trust, for_child

__all__ = [
    "DiffRequest",
    "InspectRequest",
    "InspectResponse",
    "NeedsRequest",
    "NeedsResponse",
    "VerifyRequest",
    "response_of_child",
]

# The most engine infos a child may hand back.
MAX_ENGINES = 4096

R = TypeVar("R")


@dataclass(frozen=True)
class VerifyRequest:
    """What a ``verify`` child is sent besides its tensors (the given inputs, the expected outputs, recorded
    boundaries). ``label``: ``"module"`` where the expected outputs are ``expected_module``'s, which ran in the
    parent (the report's expected source); ``expected_tree``: how the expected outputs are nested; what the child
    hands back besides its report: its outputs (``keep_outputs``: ``save_outputs``), its run with every boundary
    (``keep_reference``: ``save_boundaries``), the divergent engine or region as a program (``extract``), its runs
    at the ends of the ranges (``keep_range_ends``: for the parent's ``expected_module``)."""

    path: str
    inputs: Inputs
    reference: Reference
    tolerances: Tolerances
    trust: Trust
    label: Literal["module"] | None = None
    expected_tree: OutputTree | None = None
    keep_outputs: bool = False
    keep_reference: bool = False
    extract: bool = False
    keep_range_ends: bool = False

    @classmethod
    def of(
        cls,
        path: str,
        options: Options,
        *,
        label: Literal["module"] | None = None,
        expected_tree: OutputTree | None = None,
    ) -> VerifyRequest:
        """The request of ``verify`` (and of each rank of a rank set) on ``path`` with ``options``."""
        outputs = options.outputs
        return cls(
            path, for_child(options.inputs), for_child(options.reference), for_child(options.tolerances),
            for_child(options.trust), label=label, expected_tree=expected_tree,
            keep_outputs=outputs.save_outputs is not None, keep_reference=outputs.save_boundaries is not None,
            extract=outputs.extract is not None, keep_range_ends=label == "module",
        )  # fmt: skip


@dataclass(frozen=True)
class DiffRequest:
    """What a ``diff`` child is sent besides the given inputs: both files (``path_b`` the reference), and whether it
    hands back both files' outputs (``keep_outputs``: ``save_outputs``)."""

    path_a: str
    path_b: str
    inputs: Inputs
    tolerances: Tolerances
    trust: Trust
    keep_outputs: bool = False

    @classmethod
    def of(cls, path_a: str, path_b: str, options: Options) -> DiffRequest:
        return cls(
            path_a, path_b, for_child(options.inputs), for_child(options.tolerances), for_child(options.trust),
            keep_outputs=options.outputs.save_outputs is not None,
        )  # fmt: skip


@dataclass(frozen=True)
class InspectRequest:
    """What an ``inspect`` child is sent: the file, and what it may do."""

    path: str
    trust: Trust

    @classmethod
    def of(cls, path: str, trust: Trust) -> InspectRequest:
        return cls(path, for_child(trust))


@dataclass(frozen=True)
class NeedsRequest:
    """What a ``needs`` child (``trt-inline check``) is sent: the file, and what it may do (pickles only: it reads
    the engines' infos as data)."""

    path: str
    trust: Trust

    @classmethod
    def of(cls, path: str, allow_pickle: bool) -> NeedsRequest:
        return cls(path, Trust(allow_pickle=allow_pickle))


@dataclass(frozen=True)
class InspectResponse:
    """What an ``inspect`` child hands back: the table's lines, and its engines' infos."""

    lines: list[str]
    engines: list[EngineInfo] = field(metadata=wire(max_items=MAX_ENGINES))


@dataclass(frozen=True)
class NeedsResponse:
    """What a ``needs`` child hands back: its engines' infos."""

    engines: list[EngineInfo] = field(metadata=wire(max_items=MAX_ENGINES))


def response_of_child(cls: type[R], value: Any, where: str) -> R:
    """What a child handed back, read strictly as ``cls`` (:func:`trt_inline.messages.decode`: every field of its
    type, strings escaped and cut, within its bounds); :class:`IsolationError` naming ``where`` otherwise."""
    try:
        return decode(cls, value)
    except MessageError as exc:
        raise IsolationError(f"{where}: the child process handed back a malformed answer ({exc})") from None
