"""What verification found: per-output comparisons and the report, as text or JSON.

A report crosses from a sandboxed child to its parent as JSON: :meth:`VerifyReport.from_dict` reads it
strictly with the one decoder of messages (:func:`trt_inline.codec.decode`: every field of its type and within
the bounds declared beside it, every string escaped and cut, at most :data:`MAX_COMPARISONS` comparisons and
:data:`REPORT_BOUNDS` items in all), so that what the parent then formats, plots or writes is bounded whatever the
child sent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, TypedDict, get_args

import torch

from trt_inline.codec import Bounds, Wire, decode, encode, wire
from trt_inline.errors import MAX_TEXT
from trt_inline.module_paths import NOT_RECORDED, brief

__all__ = [
    "EXIT_STATUS", "MAX_COMPARISONS", "RANGE_END_NAMES", "REPORT_BOUNDS", "BoundaryRow", "Divergence", "OpDrill",
    "OutputComparison", "RandomRun", "RangeEndRun", "VerifyReport", "describe_value",
]  # fmt: skip

# What each verdict exits with: UNVERIFIED (nothing wrong found, nothing compared) its own status, apart from
# unusable input (ERROR).
EXIT_STATUS = {"PASS": 0, "FAIL": 1, "ERROR": 2, "UNVERIFIED": 3}

# The comparisons (outputs, boundary values, engines run alone) one report may hold: a model's outputs and engine
# boundaries by the hundred thousand, and a bound on what a parent parses, formats and writes for one child.
MAX_COMPARISONS = 250_000
# Every item of every list and object of a report together (a comparison counts its fields): what the parent builds
# from a report is bounded whatever its shape, not only in comparisons.
_MAX_ITEMS = 32 * MAX_COMPARISONS
_MAX_RUNS = 10_000  # random runs (--random-inputs)
_MAX_INPUTS = 256  # sizes per random run
_MAX_DIMS = 64
# The ends of a program's dynamic ranges a run is made at (:mod:`trt_inline.verify.range_ends`), each at most once.
RangeEnd = Literal["minimum", "maximum", "optimization point"]
RANGE_END_NAMES: tuple[RangeEnd, ...] = get_args(RangeEnd)
_LISTED = wire(max_items=MAX_COMPARISONS)  # a list of comparisons, boundary rows, problems, notes or names


def describe_value(val: Any) -> str:
    """``float32[2, 3, 8, 8]`` for a tensor (fake or real), ``int`` for a scalar, ``None``, the type's name
    otherwise."""
    if isinstance(val, torch.Tensor):
        return f"{str(val.dtype).removeprefix('torch.')}{list(val.shape)}"
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return type(val).__name__.removeprefix("Sym").lower()
    return "None" if val is None else type(val).__name__


@dataclass
class OutputComparison:
    """One value against its reference: the error statistics Polygraphy users read, and the verdict."""

    index: int
    shape: list[int] = field(metadata=wire(max_items=_MAX_DIMS))
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
    # Signal to quantization-noise ratio over those values, in dB: +inf where none differs, None where not measured.
    sqnr_db: float | None = field(default=None, metadata=wire(at_least=-math.inf))  # (NaN is refused)
    # With --top-k K (logits): of the rows (leading dimensions flattened), the fraction whose top-K indices are the
    # same set as the reference's, and the first row that does not (None: every row agrees). None: not ranked.
    top_k: int | None = field(default=None, metadata=wire(at_least=1))
    top_k_rows: int | None = field(default=None, metadata=wire(at_least=1))
    top_k_agreement: float | None = field(default=None, metadata=wire(at_least=0.0, at_most=1.0))
    top_k_first_disagreement: int | None = field(default=None, metadata=wire(at_least=0))
    # A floating value that collapsed where its reference did not (all zeros, or one value everywhere), whatever
    # the tolerance: a warning, a failure with --strict (:func:`~trt_inline.verify.compare.collapse_warnings`).
    collapsed: str | None = field(default=None, metadata=wire(max_len=64))

    def sqnr_text(self) -> str:
        """``SQNR 42.1 dB``; ``SQNR inf dB`` where no value differs."""
        return "SQNR -" if self.sqnr_db is None else f"SQNR {self.sqnr_db:.3g} dB"

    def top_k_text(self) -> str | None:
        """``top-5: 3 of 4 rows agree (0.75), the first that does not is row 2``; None where not ranked."""
        if self.top_k is None or self.top_k_agreement is None:
            return None
        text = f"top-{self.top_k}: "
        if self.top_k_rows is not None:  # (counts: a fraction of a million rows rounds to 1 with one row off)
            text += f"{round(self.top_k_agreement * self.top_k_rows)} of {self.top_k_rows} rows agree "
        text += f"({self.top_k_agreement:.6g})"
        if self.top_k_first_disagreement is not None:
            text += f", the first that does not is row {self.top_k_first_disagreement}"
        return text

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
            f"cosine similarity {self.cosine_similarity:.6f}  {self.sqnr_text()}"
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
    values: list[OutputComparison] = field(metadata=_LISTED)
    own: list[OutputComparison] | None = field(default=None, metadata=_LISTED)
    own_problem: str | None = None
    # An engine's row: the modules its steps come from, where the file records them ("0.proj (Linear), 1.fc (Linear)").
    origin: str = ""
    # Written for readers of the JSON report; computed again where one is read.
    __wire_derived__: ClassVar[tuple[str, ...]] = ("ok", "own_ok")

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.values)

    @property
    def own_ok(self) -> bool:
        return self.own is None or all(v.ok for v in self.own)

    @staticmethod
    def worst(values: list[OutputComparison] | None) -> float | None:
        return None if values is None else max((v.max_abs_diff for v in values), default=0.0)


@dataclass
class OpDrill:
    """Inside a divergent engine, op by op (:mod:`trt_inline.verify.drill`): the first op whose own error crosses
    its tolerance, in the user's terms; or, with no ``step``, a line saying why no op is named."""

    summary: str  # the op and its own error; or every op within tolerance; or no op-level program
    step: int | None = field(default=None, metadata=wire(at_least=0))  # the op's step in the engine's program
    op: str = ""  # "aten::mul.Tensor"
    module: str = ""  # "stages.1.boost (Boost)"
    source: str = ""  # "model.py:41 in forward: big = x * self.gain"

    def to_text(self) -> list[str]:
        lines = [f"  inside it: {self.summary}"]
        return lines + [f"    {label}: {text}" for label, text in (("module", self.module), ("source", self.source))
                        if text]  # fmt: skip


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
    producers: list[str] = field(default_factory=list, metadata=_LISTED)
    consumers: list[str] = field(default_factory=list, metadata=_LISTED)
    # A fallback region's nodes, every one (``where`` elides the middle of a long region).
    nodes: list[str] = field(default_factory=list, metadata=_LISTED)
    # Inside a divergent engine: its first op past tolerance (``kind`` "engine" only).
    op_drill: OpDrill | None = None
    # In the user's terms, where the file records them (:mod:`trt_inline.module_paths`): the module path and class
    # and the source line of the node computing the diverging value (an engine: its steps' source lines), every
    # module it covers, and what it reads and feeds (``reads relu: 0.act (ReLU); model.py:31 in forward: ...``).
    module: str = ""
    source: str = ""
    modules: list[str] = field(default_factory=list, metadata=_LISTED)
    near: list[str] = field(default_factory=list, metadata=_LISTED)

    def named(self) -> bool:
        """Whether it names anything in the user's terms."""
        return bool(self.module or self.source or self.modules or self.near)

    def to_text(self) -> str:
        lines = [f"first divergence: {self.where}", f"  {self.detail}"]
        if self.module:
            lines.append(f"  module: {self.module}")
        if self.modules and self.modules != [self.module]:
            lines.append(f"  covers: {brief(self.modules)}")
        if self.source:
            lines.append(f"  source: {self.source}")
        lines += self.op_drill.to_text() if self.op_drill is not None else []
        if self.producers:
            lines.append(f"  reads: {', '.join(self.producers)}")
        if self.consumers:
            lines.append(f"  feeds: {', '.join(self.consumers)}")
        lines += [f"  {entry}" for entry in self.near]
        return "\n".join(lines)


def boundary_table(rows: list[BoundaryRow]) -> list[str]:
    """The per-boundary table: the worst error in the run (max abs diff, and the lowest SQNR and cosine similarity of
    its values), the engine's own error run alone, the verdict."""
    width = max([44, *(len(row.boundary) for row in rows)])
    lines = [
        f"  {'boundary':<{width}} {'values':>6} {'max abs diff':>13} {'SQNR dB':>8} {'cosine':>9} {'own error':>13}"
        "  status"
    ]
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
        # (over the values measured: one of another shape or dtype, or with no finite value, has no SQNR)
        measured = [v for v in row.values if v.sqnr_db is not None]
        sqnr_text = f"{min(v.sqnr_db for v in measured if v.sqnr_db is not None):.3g}" if measured else "-"
        cosine_text = f"{min(v.cosine_similarity for v in measured):.6f}" if measured else "-"
        lines.append(
            f"  {row.boundary:<{width}} {len(row.values):>6} {worst_text:>13} {sqnr_text:>8} {cosine_text:>9} "
            f"{own_text:>13}  {status}"
        )
    return lines


def _engine_legend(rows: list[BoundaryRow]) -> list[str]:
    """Each engine of the table in the user's terms, once: the modules its steps come from."""
    named = {row.engine: row.origin for row in rows if row.engine is not None and row.origin}
    if not named:
        return []
    return ["engines in the model (the modules their steps come from):"] + [
        f"  engine {engine}: {origin}" for engine, origin in named.items()
    ]


# A run's input sizes: one list of dimensions per input.
_Sizes = Annotated[list[Annotated[list[int], Wire(max_items=_MAX_DIMS)]], Wire(max_items=_MAX_INPUTS)]
# A run's size symbols and their values.
_Symbols = Annotated[dict[str, int], Wire(max_items=_MAX_INPUTS * _MAX_DIMS)]


class RandomRun(TypedDict):
    """A run on random inputs (``--random-inputs``): the sizes drawn, and what it found."""

    iteration: int
    sizes: _Sizes
    symbols: _Symbols
    ok: bool
    problem: str | None


class RangeEndRun(TypedDict):
    """A run at an end of the dynamic ranges: which end, its sizes, what it found, whether it was compared."""

    end: RangeEnd
    sizes: _Sizes
    symbols: _Symbols
    ok: bool
    problem: str | None
    compared: bool


@dataclass
class VerifyReport:
    """What :func:`trt_inline.verify` found.

    ``ok`` means every structural check passed *and* outputs were compared and agree.
    """

    source: str
    problems: list[str] = field(default_factory=list, metadata=_LISTED)
    notes: list[str] = field(default_factory=list, metadata=_LISTED)
    outputs: list[OutputComparison] = field(default_factory=list, metadata=_LISTED)
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
    boundaries: list[BoundaryRow] = field(default_factory=list, metadata=_LISTED)
    # Which inputs the boundaries are of, where not the reference inputs the outputs above are compared on.
    boundaries_on: str = ""
    divergence: Divergence | None = None
    # Runs on random inputs (``--random-inputs``): the sizes drawn, and what each run found.
    random_runs: list[RandomRun] = field(default_factory=list, metadata=wire(max_items=_MAX_RUNS))
    # Runs at the ends of the dynamic ranges (:mod:`trt_inline.verify.range_ends`): which end, its sizes, whether
    # its outputs were compared with a reference, and what the run found.
    range_end_runs: list[RangeEndRun] = field(default_factory=list, metadata=wire(max_items=len(RANGE_END_NAMES)))
    # What looks like garbage without a reference (all zeros, NaN, constant, the same in every row):
    # :mod:`trt_inline.verify.garbage`. They fail only under ``strict`` (then they are problems too).
    warnings: list[str] = field(default_factory=list, metadata=_LISTED)
    # Written for readers of the JSON report; computed again where one is read.
    __wire_derived__: ClassVar[tuple[str, ...]] = ("ok", "compared")

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
        """The report as plain data (:func:`trt_inline.codec.encode`), with ``ok`` and ``compared`` (and each
        boundary row's ``ok`` and ``own_ok``) for readers of the JSON."""
        encoded: dict[str, Any] = encode(self)
        return encoded

    @classmethod
    def from_dict(cls, data: Any) -> VerifyReport:
        """The report :meth:`to_dict` gave (how a child process hands its report back), read strictly within
        :data:`REPORT_BOUNDS` (:func:`trt_inline.codec.decode`): raises :class:`~trt_inline.codec.MessageError`
        (a ``ValueError``) naming the field for anything else (a field of another type, an unknown key, more than
        :data:`MAX_COMPARISONS` comparisons); every string is escaped and cut."""
        return decode(cls, data, REPORT_BOUNDS)

    def to_json(self) -> str:
        """The report as JSON: indented, but on one line past 10,000 comparisons (the indenting encoder is
        written in Python, ten times slower than the compact one)."""
        count = len(self.outputs) + sum(len(row.values) + len(row.own or ()) for row in self.boundaries)
        return json.dumps(self.to_dict(), indent=2 if count <= 10_000 else None, sort_keys=True)

    def to_text(self) -> str:
        lines = [f"{self.status} {self.source} (expected outputs: {self.expected_source})"]
        for output in self.outputs:
            dims = ", ".join(map(str, output.shape))
            mark = "ok  " if output.ok else "DIFF"
            relative = "" if output.nan_count or output.inf_count else f"  max rel diff {output.max_rel_diff:.6g}"
            kind = output.dtype if output.dtype == "None" else f"{output.dtype}[{dims}]"  # (a None output)
            lines.append(
                f"  {mark} output {output.index}  {kind}  {output.error_text()}{relative}  "
                f"(atol {output.atol:g}, rtol {output.rtol:g})"
            )
            lines.append(f"       {output.statistics_text()}")
            if (ranking := output.top_k_text()) is not None:
                lines.append(f"       {ranking}")
        for run in self.range_end_runs:
            sizes = "; ".join(str(s) for s in run["sizes"])
            symbols = ", ".join(f"{name}={value}" for name, value in run["symbols"].items())
            lines.append(
                f"  {'ok  ' if run['ok'] else 'FAIL'} at the {run['end']} ({symbols}; sizes {sizes})"
                + ("" if run["compared"] else ", not compared")
                + (f": {run['problem']}" if run.get("problem") else "")
            )
        for random_run in self.random_runs:
            sizes = "; ".join(str(s) for s in random_run["sizes"])
            lines.append(
                f"  {'ok  ' if random_run['ok'] else 'FAIL'} random inputs {random_run['iteration']} (sizes {sizes})"
                + (f": {random_run['problem']}" if random_run.get("problem") else "")
            )
        if self.boundaries:
            lines.append(
                f"engine boundaries{' on ' + self.boundaries_on if self.boundaries_on else ''} (max abs diff in the "
                "run; own error: the engine run alone on the reference's inputs to it):"
            )
            lines += boundary_table(self.boundaries)
            lines += _engine_legend(self.boundaries)
        if self.divergence is not None:
            lines.append(self.divergence.to_text())
        if (self.boundaries or self.divergence is not None) and not (
            any(row.origin for row in self.boundaries) or (self.divergence is not None and self.divergence.named())
        ):
            lines.append(f"  in the model: {NOT_RECORDED}")  # (said once, not on every line)
        lines += [f"  problem: {problem}" for problem in self.problems]
        lines += [f"  warning: {warning}" for warning in self.warnings]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


# What a report may hold in all: every item of every list and object (a comparison counts its fields), at most
# MAX_COMPARISONS comparisons wherever they sit, every string escaped and cut; a field left out takes its default
# (a report written by hand, or before the field was added).
REPORT_BOUNDS = Bounds(
    items=_MAX_ITEMS, counted=((OutputComparison, MAX_COMPARISONS, "comparisons"),), text=MAX_TEXT, defaults=True
)
