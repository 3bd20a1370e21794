"""What :func:`~trt_inline.fixing.find_fix` answers: the settings, the set in the user's terms, what it cost.

A :class:`FixReport` says how the search ended (:data:`OUTCOMES`), the settings to compile with as a dict and
as the ``compile(...)`` call to paste, each case's error before and after, the set by module path and source
line (:class:`FixedNode`), the engines and fallbacks of the build before and after, and the compiles made. Its
text (:meth:`FixReport.to_text`) is what ``trt-inline fix`` prints, its dict (:meth:`FixReport.to_dict`) what
``--json`` prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trt_inline.errors import FixError

__all__ = ["OUTCOMES", "BuildShape", "CaseError", "FixError", "FixReport", "FixedNode"]

# How a search ends. The first two are a fix (the settings bring every case within tolerance); "out of compiles"
# and "interrupted" may still hold a set that does (``FixReport.works``), not yet made as small as it can be.
NOTHING_TO_FIX, FIXED, NO_FIX, OUT_OF_COMPILES, INTERRUPTED = (
    "nothing to fix", "fixed", "no fix", "out of compiles", "interrupted",
)  # fmt: skip
OUTCOMES = (NOTHING_TO_FIX, FIXED, NO_FIX, OUT_OF_COMPILES, INTERRUPTED)


@dataclass(frozen=True)
class FixedNode:
    """What the fix changes, in the user's terms: a module kept in fp32 (``name`` its path, as the setting matches
    it; ``op`` the operators of it that ran in reduced precision) or an operator run in PyTorch (``name``
    ``torch.ops.aten.div.Tensor``, ``op`` ``aten.div.Tensor``; ``module`` the modules its nodes are in)."""

    name: str
    op: str
    module: str  # "stage2.0.conv (Linear)", or "" where the graph does not record it
    source: str  # "model.py:41 in forward: h = self.conv(x)", or ""
    nodes: int = 1  # how many nodes of the build it changes

    @property
    def is_operator(self) -> bool:
        return self.op == self.name.removeprefix("torch.ops.")

    def describe(self) -> str:
        count = f"{self.nodes} node{'' if self.nodes == 1 else 's'}"
        if self.is_operator:
            where = "; ".join(part for part in (f"in {self.module}" if self.module else "", self.source) if part)
            return f"{self.op} ({count})" + (f": {where}" if where else "")
        head = self.module or self.name
        return f"{head}: {count} ({self.op})" + (f"; {self.source}" if self.source else "")


@dataclass(frozen=True)
class CaseError:
    """One case's worst max abs error (over its outputs) with the settings given and with the fix; ``after`` is
    None where no set was compiled that brings every case within tolerance."""

    name: str
    before: float
    after: float | None
    ok_before: bool
    ok_after: bool | None


@dataclass(frozen=True)
class BuildShape:
    """How a build is partitioned: its ``_run_on_acc_N`` engines and ``_run_on_gpu_N`` fallbacks (None where the
    compiled module is not partitioned that way)."""

    engines: int | None
    fallbacks: int | None

    def describe(self) -> str:
        if self.engines is None:
            return "not a partitioned module"
        return f"{self.engines} engine{'' if self.engines == 1 else 's'}, {self.fallbacks} fallback" + (
            "" if self.fallbacks == 1 else "s"
        )


@dataclass
class FixReport:
    """What :func:`~trt_inline.fixing.find_fix` found: the settings to compile with, what they change, what it
    cost.

    ``outcome``: one of :data:`OUTCOMES`. ``settings``: the settings that bring every case within tolerance
    (the fix, or the best set found by an interrupted or budget-bound search); the given ones where none was
    found. ``nodes``: the set those settings add, in the user's terms. ``compile_call``: the call to paste.
    """

    strategy: str
    settings: dict[str, Any]
    outcome: str = NOTHING_TO_FIX
    nodes: list[FixedNode] = field(default_factory=list)
    compile_call: str = ""
    cases: list[CaseError] = field(default_factory=list)
    before: BuildShape | None = None
    after: BuildShape | None = None
    compiles: int = 0
    budget: int = 0
    candidates: int = 0
    notes: list[str] = field(default_factory=list)
    # Whether the set was checked to be minimal: leaving out any one member puts a case out of tolerance.
    minimal: bool = False
    # Which pipeline built the builds (one line), and the torch_tensorrt call with the settings (where the builds
    # were rehearsals).
    pipeline: str = ""
    release_call: str = ""

    @property
    def fixed(self) -> bool:
        """Whether the search ended with a fix: every case within tolerance, with the set as small as it made it."""
        return self.outcome in (NOTHING_TO_FIX, FIXED)

    @property
    def needed(self) -> bool:
        """Whether the settings given were out of tolerance and a set that brings them within it was found."""
        return bool(self.nodes)

    @property
    def interrupted(self) -> bool:
        return self.outcome == INTERRUPTED

    @property
    def works(self) -> bool:
        """Whether ``settings`` bring every case within tolerance (a fix, or the best set a stopped search found)."""
        return self.outcome == NOTHING_TO_FIX or bool(self.nodes)

    @property
    def error_before(self) -> float:
        """The worst error over every case with the settings given."""
        return max((case.before for case in self.cases), default=0.0)

    @property
    def error_after(self) -> float | None:
        """The worst error over every case with ``settings`` (None where no set that works was compiled)."""
        if not self.cases or any(case.after is None for case in self.cases):
            return None
        return max(case.after for case in self.cases if case.after is not None)

    def to_text(self) -> str:
        what = "modules kept in fp32" if self.strategy == "higher_precision" else "operators run in PyTorch"
        spent = f"{self.compiles} compile{'' if self.compiles == 1 else 's'}"
        if self.outcome == NOTHING_TO_FIX:
            lines = [f"nothing to fix: every case is within tolerance (worst error {_number(self.error_before)}; "
                     f"{spent})"]  # fmt: skip
        elif self.outcome == FIXED:
            lines = [
                f"fixed: {len(self.nodes)} of {self.candidates} candidate {what} bring every case within tolerance "
                f"(worst error {_number(self.error_before)} -> {_number(self.error_after)}; {spent})"
            ]
        elif self.outcome == NO_FIX:
            lines = [f"no fix: no set of the {self.candidates} candidate {what} brings every case within tolerance "
                     f"({spent})"]  # fmt: skip
        else:
            stopped = "interrupted" if self.outcome == INTERRUPTED else f"out of compiles (max {self.budget})"
            found = (
                f"the best set found so far, {len(self.nodes)} of {self.candidates} candidate {what}, brings every "
                f"case within tolerance (worst error {_number(self.error_before)} -> {_number(self.error_after)}); "
                "a smaller one may exist"
                if self.works
                else "no set that brings every case within tolerance was found yet"
            )
            lines = [f"{stopped} after {spent}: {found}"]
        lines += self.notes
        if self.works and self.nodes:
            lines.append(f"the set ({what}, by module path and source line):")
            lines += [f"  {node.describe()}" for node in self.nodes]
            if self.minimal:
                lines.append(f"minimal: leaving out any one of the {len(self.nodes)} puts a case out of tolerance "
                             "(each checked)")  # fmt: skip
        if self.cases:
            changed = self.outcome != NOTHING_TO_FIX
            head = "error per case (worst max abs error over its outputs)"
            lines.append(head + (", before -> after:" if changed else ":"))
            width = max(len(case.name) for case in self.cases)
            for case in self.cases:
                after = f" -> {_verdict(case.after, case.ok_after)}" if changed and case.after is not None else ""
                lines.append(f"  {case.name:<{width}}  {_verdict(case.before, case.ok_before)}{after}")
        if self.before is not None:
            shape = f"build: {self.before.describe()}"
            if self.after is not None and self.outcome != NOTHING_TO_FIX:
                shape += f" -> {self.after.describe()}"
            lines.append(shape)
        if self.pipeline:
            lines.append(f"built on: {self.pipeline}")
        if self.works:
            lines.append(f"settings: {_settings_text(self.settings)}")
            lines.append(f"compile with: {self.compile_call}")
            if self.release_call and self.release_call != self.compile_call:
                lines.append(f"on TensorRT: {self.release_call}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (``trt-inline fix --json``): settings values as JSON has them (a dtype by its
        name, a set as a sorted list), errors as numbers (an infinite one as the string ``"inf"``)."""
        return {
            "outcome": self.outcome,
            "fixed": self.fixed,
            "works": self.works,
            "strategy": self.strategy,
            "settings": plain(self.settings),
            "compile_call": self.compile_call if self.works else None,
            "release_call": (self.release_call or None) if self.works else None,
            "pipeline": self.pipeline,
            "minimal": self.minimal,
            "nodes": [
                {"name": n.name, "op": n.op, "module": n.module, "source": n.source, "nodes": n.nodes}
                for n in self.nodes
            ],
            "cases": [
                {
                    "name": c.name,
                    "error_before": _json_number(c.before),
                    "ok_before": c.ok_before,
                    "error_after": None if c.after is None else _json_number(c.after),
                    "ok_after": c.ok_after,
                }
                for c in self.cases
            ],
            "build_before": None if self.before is None else vars(self.before),
            "build_after": None if self.after is None else vars(self.after),
            "compiles": self.compiles,
            "max_compiles": self.budget,
            "candidates": self.candidates,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def plain(value: Any) -> Any:
    """``value`` as JSON holds it: a dtype by its name (``"torch.float16"``), a set as a sorted list, anything else
    that is not plain data by its ``repr``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return _json_number(value)
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((plain(item) for item in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return str(value) if type(value).__module__ == "torch" else repr(value)


def _settings_text(settings: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{key!r}: {_repr(value)}" for key, value in settings.items()) + "}"


def _repr(value: Any) -> str:
    """A setting as Python code: sets sorted, so the same settings read the same."""
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_repr(item) for item in value)) + "}" if value else "set()"
    if isinstance(value, list):
        return "[" + ", ".join(_repr(item) for item in value) + "]"
    return repr(value)


def settings_arguments(settings: Mapping[str, Any]) -> str:
    """``enable_autocast=True, autocast_excluded_nodes=['^div$']``: the settings as keyword arguments."""
    return ", ".join(f"{key}={_repr(value)}" for key, value in settings.items())


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def _verdict(value: float, ok: bool | None) -> str:
    return f"{_number(value)} ({'within tolerance' if ok else 'out of tolerance'})"


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
