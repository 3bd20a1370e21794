"""What verification found: per-output comparisons and the report, as text or JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["BoundaryRow", "Divergence", "OutputComparison", "VerifyReport", "describe_value"]


def describe_value(val: Any) -> str:
    """``float32[2, 3, 8, 8]`` for a tensor (fake or real), ``int`` for a scalar, the type's name otherwise."""
    if isinstance(val, torch.Tensor):
        return f"{str(val.dtype).removeprefix('torch.')}{list(val.shape)}"
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return type(val).__name__.removeprefix("Sym").lower()
    return type(val).__name__


@dataclass
class OutputComparison:
    """One value against its reference: the error statistics Polygraphy users read, and the verdict."""

    index: int
    shape: list[int]
    dtype: str
    max_abs_diff: float
    max_rel_diff: float
    atol: float
    rtol: float
    ok: bool
    problem: str | None = None
    mean_abs_diff: float = 0.0
    median_abs_diff: float = 0.0
    p99_abs_diff: float = 0.0
    cosine_similarity: float = 1.0
    # NaN / Inf where the reference has a finite value: a problem of its own, named apart from the diff.
    nan_count: int = 0
    inf_count: int = 0
    # How many values are finite on both sides: the statistics are over these (none: no statistics).
    finite_count: int | None = None

    def error_text(self) -> str:
        """``max abs diff 0.5``; NaN and Inf where the reference is finite are counted, never shown as a diff."""
        if self.nan_count or self.inf_count:
            counts = [f"{n} {kind}" for n, kind in ((self.nan_count, "NaN"), (self.inf_count, "Inf")) if n]
            return f"{' and '.join(counts)} where the reference is finite"
        return f"max abs diff {self.max_abs_diff:.6g}"

    def statistics_text(self) -> str:
        if self.finite_count == 0 and self.shape and all(self.shape):
            return "no value is finite on both sides: no error statistics"
        return (
            f"mean {self.mean_abs_diff:.3g}  median {self.median_abs_diff:.3g}  p99 {self.p99_abs_diff:.3g}  "
            f"cosine similarity {self.cosine_similarity:.6f}"
            + ("" if self.finite_count is None or not (self.nan_count or self.inf_count)
               else f"  (over the {self.finite_count} finite values)")
        )  # fmt: skip


@dataclass
class BoundaryRow:
    """One boundary of a run compared with the reference: an engine's inputs or outputs, or the program's outputs.

    ``own`` (engine outputs only): the engine run alone on its recorded inputs
    against its recorded outputs, its own error rather than the one it inherits.
    """

    boundary: str  # "engine 1 (_run_on_acc_3) inputs", "engine 1 (_run_on_acc_3) outputs", "program outputs"
    engine: int | None
    values: list[OutputComparison]
    own: list[OutputComparison] | None = None
    own_problem: str | None = None

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.values)

    @property
    def own_ok(self) -> bool:
        return self.own is None or all(v.ok for v in self.own)

    @staticmethod
    def worst(values: list[OutputComparison] | None) -> float | None:
        return None if values is None else max((v.max_abs_diff for v in values), default=0.0)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BoundaryRow:
        own = data.get("own")
        return cls(
            str(data["boundary"]),
            data.get("engine"),
            [OutputComparison(**v) for v in data["values"]],
            None if own is None else [OutputComparison(**v) for v in own],
            data.get("own_problem"),
        )


@dataclass
class Divergence:
    """Where a run first leaves its reference: an engine, a fallback region, or a wire.

    ``kind``: ``"engine"`` (its inputs agree, its outputs do not), ``"fallback"``
    (a region of PyTorch ops whose inputs agree and whose output does not),
    ``"wiring"`` (a value wired straight from another boundary that holds the
    wrong value), ``"signature"`` (the runs do not have the same engines).
    """

    kind: str
    where: str
    detail: str
    producers: list[str] = field(default_factory=list)
    consumers: list[str] = field(default_factory=list)
    # A fallback region's nodes, every one (``where`` elides the middle of a long region).
    nodes: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        lines = [f"first divergence: {self.where}", f"  {self.detail}"]
        if self.producers:
            lines.append(f"  reads: {', '.join(self.producers)}")
        if self.consumers:
            lines.append(f"  feeds: {', '.join(self.consumers)}")
        return "\n".join(lines)


def boundary_table(rows: list[BoundaryRow]) -> list[str]:
    """The per-boundary table: the worst error in the run, the engine's own error run alone, the verdict."""
    width = max([44, *(len(row.boundary) for row in rows)])
    lines = [f"  {'boundary':<{width}} {'values':>6} {'max abs diff':>13} {'own error':>13}  status"]
    for row in rows:
        own = BoundaryRow.worst(row.own)
        own_text = "-" if own is None else f"{own:.6g}"
        if row.own_problem:
            own_text = "not run"
        status = "ok" if row.ok and row.own_ok else ("OWN" if not row.own_ok else "DIFF")
        worst = BoundaryRow.worst(row.values) or 0.0
        if any(v.nan_count for v in row.values):
            worst_text = "NaN"
        elif any(v.inf_count for v in row.values):
            worst_text = "Inf"
        else:
            worst_text = "-" if not row.values else f"{worst:.6g}"
        lines.append(f"  {row.boundary:<{width}} {len(row.values):>6} {worst_text:>13} {own_text:>13}  {status}")
    return lines


@dataclass
class VerifyReport:
    """What :func:`trt_inline.verify` found.

    ``ok`` means every structural check passed *and* outputs were compared and agree.
    """

    source: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    outputs: list[OutputComparison] = field(default_factory=list)
    # Where the expected outputs came from: "embedded", "given", "module", "from NEW.pt2", or "none".
    expected_source: str = "none"
    allow_pickle: bool = False
    # Where the file was loaded in a child process: that child's peak resident memory above
    # its resident memory once its imports were done (what loading and running the file cost).
    child_peak_extra_bytes: int | None = None
    # Of that run, the peaks of anonymous memory (heap, copies) and of file-backed memory (mapped weights).
    child_peak_anonymous_bytes: int | None = None
    child_peak_file_bytes: int | None = None
    # Per-engine comparison (``--per-engine``, or an output mismatch with boundary data embedded).
    boundaries: list[BoundaryRow] = field(default_factory=list)
    # Which inputs the boundaries are of, where not the reference inputs the outputs above are compared on.
    boundaries_on: str = ""
    divergence: Divergence | None = None
    # Runs on random inputs (``--random-inputs``): the sizes drawn, and what each run found.
    random_runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def compared(self) -> bool:
        return self.expected_source != "none"

    @property
    def ok(self) -> bool:
        return not self.problems and self.compared and all(o.ok for o in self.outputs)

    @property
    def status(self) -> str:
        """``PASS``, ``FAIL`` (a problem) or ``UNVERIFIED`` (nothing wrong found, outputs not compared)."""
        return "PASS" if self.ok else ("FAIL" if self.problems else "UNVERIFIED")

    def to_dict(self) -> dict[str, Any]:
        result = asdict(self)
        result.update(ok=self.ok, compared=self.compared)
        for row, data in zip(self.boundaries, result["boundaries"], strict=True):
            data.update(ok=row.ok, own_ok=row.own_ok)
        return result

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VerifyReport:
        """The report :meth:`to_dict` gave (how a child process hands its report back)."""
        return cls(
            source=str(data["source"]),
            problems=[str(p) for p in data["problems"]],
            notes=[str(n) for n in data["notes"]],
            outputs=[OutputComparison(**output) for output in data["outputs"]],
            expected_source=str(data["expected_source"]),
            allow_pickle=bool(data["allow_pickle"]),
            child_peak_extra_bytes=data.get("child_peak_extra_bytes"),
            child_peak_anonymous_bytes=data.get("child_peak_anonymous_bytes"),
            child_peak_file_bytes=data.get("child_peak_file_bytes"),
            boundaries=[BoundaryRow.from_dict(row) for row in data.get("boundaries", [])],
            boundaries_on=str(data.get("boundaries_on", "")),
            divergence=None if data.get("divergence") is None else Divergence(**data["divergence"]),
            random_runs=list(data.get("random_runs", [])),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_text(self) -> str:
        lines = [f"{self.status} {self.source} (expected outputs: {self.expected_source})"]
        for output in self.outputs:
            dims = ", ".join(map(str, output.shape))
            mark = "ok  " if output.ok else "DIFF"
            relative = "" if output.nan_count or output.inf_count else f"  max rel diff {output.max_rel_diff:.6g}"
            lines.append(
                f"  {mark} output {output.index}  {output.dtype}[{dims}]  {output.error_text()}{relative}  "
                f"(atol {output.atol:g}, rtol {output.rtol:g})"
            )
            lines.append(f"       {output.statistics_text()}")
        for run in self.random_runs:
            sizes = "; ".join(str(s) for s in run["sizes"])
            lines.append(
                f"  {'ok  ' if run['ok'] else 'FAIL'} random inputs {run['iteration']} (sizes {sizes})"
                + (f": {run['problem']}" if run.get("problem") else "")
            )
        if self.boundaries:
            lines.append(
                f"engine boundaries{' on ' + self.boundaries_on if self.boundaries_on else ''} (max abs diff in the "
                "run; own error: the engine run alone on the reference's inputs to it):"
            )
            lines += boundary_table(self.boundaries)
        if self.divergence is not None:
            lines.append(self.divergence.to_text())
        lines += [f"  problem: {problem}" for problem in self.problems]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)
