"""What verification found: per-output comparisons and the report, as text or JSON.

A report crosses from a sandboxed child to its parent as JSON: :meth:`VerifyReport.from_dict` reads it
strictly (every field of its type, every string escaped and cut, at most :data:`MAX_COMPARISONS` comparisons),
so that what the parent then formats, plots or writes is bounded whatever the child sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from trt_inline.errors import decoded_text
from trt_inline.module_paths import NOT_RECORDED, brief

__all__ = [
    "EXIT_STATUS", "MAX_COMPARISONS", "RANGE_END_NAMES", "BoundaryRow", "Divergence", "OpDrill", "OutputComparison",
    "VerifyReport", "describe_value",
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
RANGE_END_NAMES = ("minimum", "maximum", "optimization point")


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
    # Signal to quantization-noise ratio over those values, in dB: +inf where none differs, None where not measured.
    sqnr_db: float | None = None
    # With --top-k K (logits): of the rows (leading dimensions flattened), the fraction whose top-K indices are the
    # same set as the reference's, and the first row that does not (None: every row agrees). None: not ranked.
    top_k: int | None = None
    top_k_rows: int | None = None
    top_k_agreement: float | None = None
    top_k_first_disagreement: int | None = None

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
    values: list[OutputComparison]
    own: list[OutputComparison] | None = None
    own_problem: str | None = None
    # An engine's row: the modules its steps come from, where the file records them ("0.proj (Linear), 1.fc (Linear)").
    origin: str = ""

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
        return _Reader().boundary(data, "boundary")


@dataclass
class OpDrill:
    """Inside a divergent engine, op by op (:mod:`trt_inline.verify.op_drill`): the first op whose own error crosses
    its tolerance, in the user's terms; or, with no ``step``, a line saying why no op is named."""

    summary: str  # the op and its own error; or every op within tolerance; or no op-level program
    step: int | None = None  # the op's step in the engine's program
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
    producers: list[str] = field(default_factory=list)
    consumers: list[str] = field(default_factory=list)
    # A fallback region's nodes, every one (``where`` elides the middle of a long region).
    nodes: list[str] = field(default_factory=list)
    # Inside a divergent engine: its first op past tolerance (``kind`` "engine" only).
    op_drill: OpDrill | None = None
    # In the user's terms, where the file records them (:mod:`trt_inline.module_paths`): the module path and class
    # and the source line of the node computing the diverging value (an engine: its steps' source lines), every
    # module it covers, and what it reads and feeds (``reads relu: 0.act (ReLU); model.py:31 in forward: ...``).
    module: str = ""
    source: str = ""
    modules: list[str] = field(default_factory=list)
    near: list[str] = field(default_factory=list)

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
    # Runs at the ends of the dynamic ranges (:mod:`trt_inline.verify.range_ends`): which end, its sizes, whether
    # its outputs were compared with a reference, and what the run found.
    range_end_runs: list[dict[str, Any]] = field(default_factory=list)
    # What looks like garbage without a reference (all zeros, NaN, constant, the same in every row):
    # :mod:`trt_inline.verify.garbage`. They fail only under ``strict`` (then they are problems too).
    warnings: list[str] = field(default_factory=list)

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
        # By hand rather than dataclasses.asdict, which deep-copies every value: a report of a hundred thousand
        # comparisons is encoded in a fraction of the time.
        result = {f.name: getattr(self, f.name) for f in fields(self)}
        result["problems"], result["notes"] = list(self.problems), list(self.notes)
        result["warnings"] = list(self.warnings)
        result["outputs"] = [dict(vars(output)) for output in self.outputs]
        result["boundaries"] = [
            {
                "boundary": row.boundary, "engine": row.engine, "values": [dict(vars(v)) for v in row.values],
                "own": None if row.own is None else [dict(vars(v)) for v in row.own], "own_problem": row.own_problem,
                "ok": row.ok, "own_ok": row.own_ok, "origin": row.origin,
            }
            for row in self.boundaries
        ]  # fmt: skip
        result["divergence"] = None if self.divergence is None else {
            f.name: getattr(self.divergence, f.name) for f in fields(self.divergence)
        }  # fmt: skip
        if self.divergence is not None and self.divergence.op_drill is not None:
            result["divergence"]["op_drill"] = dict(vars(self.divergence.op_drill))
        result["random_runs"] = [dict(run) for run in self.random_runs]
        result["range_end_runs"] = [dict(run) for run in self.range_end_runs]
        result.update(ok=self.ok, compared=self.compared)
        return result

    @classmethod
    def from_dict(cls, data: Any) -> VerifyReport:
        """The report :meth:`to_dict` gave (how a child process hands its report back), read strictly: raises
        ``ValueError`` naming the field for anything else (a field of another type, an unknown key, more than
        :data:`MAX_COMPARISONS` comparisons); every string is escaped and cut."""
        return _Reader().report(data)

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
            lines.append(
                f"  {mark} output {output.index}  {output.dtype}[{dims}]  {output.error_text()}{relative}  "
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


# ---------------------------------------------------------------------------
# Reading a report a child sent
# ---------------------------------------------------------------------------

_COMPARISON_FIELDS = {f.name for f in fields(OutputComparison)}
_BOUNDARY_FIELDS = {f.name for f in fields(BoundaryRow)} | {"ok", "own_ok"}
_DIVERGENCE_FIELDS = {f.name for f in fields(Divergence)}
_OP_DRILL_FIELDS = {f.name for f in fields(OpDrill)}
_REPORT_FIELDS = {f.name for f in fields(VerifyReport)} | {"ok", "compared"}
_RUN_FIELDS = {"iteration", "sizes", "symbols", "ok", "problem"}
_RANGE_END_FIELDS = {"end", "sizes", "symbols", "ok", "problem", "compared"}


class _Reader:
    """One report's strict reading: types checked field by field, strings escaped and cut, comparisons counted."""

    def __init__(self) -> None:
        self.comparisons = 0
        self.items = 0

    def _count(self, items: int) -> None:
        self.items += items
        if self.items > _MAX_ITEMS:
            raise ValueError(f"the report holds more than {_MAX_ITEMS} items in all")

    def _fields(self, data: Any, known: set[str], required: set[str], what: str) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise ValueError(f"{what} is not an object")
        self._count(len(data))
        unknown = [key for key in data if key not in known]
        if unknown:
            raise ValueError(f"{what} has a field {decoded_text(str(unknown[0]), 60)!r}")
        missing = sorted(required - set(data))
        if missing:
            raise ValueError(f"{what} has no {missing[0]}")
        return data

    @staticmethod
    def _text(value: Any, what: str, *, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise ValueError(f"{what} is not text")
        return decoded_text(value)

    @staticmethod
    def _integer(value: Any, what: str, *, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        if type(value) is not int or abs(value) >= 1 << 63:
            raise ValueError(f"{what} is not an integer")
        return value

    @staticmethod
    def _number(value: Any, what: str) -> float:
        if type(value) not in (int, float) or (type(value) is int and abs(value) >= 1 << 63):
            raise ValueError(f"{what} is not a number")
        return float(value)

    @staticmethod
    def _flag(value: Any, what: str) -> bool:
        if type(value) is not bool:
            raise ValueError(f"{what} is not true or false")
        return value

    def _items(self, value: Any, what: str, limit: int = MAX_COMPARISONS) -> list[Any]:
        if not isinstance(value, list):
            raise ValueError(f"{what} is not a list")
        if len(value) > limit:
            raise ValueError(f"{what} holds {len(value)} items, more than {limit}")
        self._count(len(value))
        return value

    def comparison(self, data: Any, what: str) -> OutputComparison:
        self.comparisons += 1
        if self.comparisons > MAX_COMPARISONS:
            raise ValueError(f"the report holds more than {MAX_COMPARISONS} comparisons")
        data = self._fields(data, _COMPARISON_FIELDS, {"index", "shape", "dtype", "ok"}, what)
        get = data.get
        return OutputComparison(
            index=self._integer(data["index"], f"{what} index"),
            shape=[self._integer(d, f"{what} shape") for d in self._items(data["shape"], f"{what} shape", _MAX_DIMS)],
            dtype=self._text(data["dtype"], f"{what} dtype"),
            max_abs_diff=self._number(get("max_abs_diff", 0.0), f"{what} max_abs_diff"),
            max_rel_diff=self._number(get("max_rel_diff", 0.0), f"{what} max_rel_diff"),
            atol=self._number(get("atol", 0.0), f"{what} atol"),
            rtol=self._number(get("rtol", 0.0), f"{what} rtol"),
            ok=self._flag(data["ok"], f"{what} ok"),
            problem=self._text(get("problem"), f"{what} problem", optional=True),
            mean_abs_diff=self._number(get("mean_abs_diff", 0.0), f"{what} mean_abs_diff"),
            median_abs_diff=self._number(get("median_abs_diff", 0.0), f"{what} median_abs_diff"),
            p99_abs_diff=self._number(get("p99_abs_diff", 0.0), f"{what} p99_abs_diff"),
            cosine_similarity=self._number(get("cosine_similarity", 1.0), f"{what} cosine_similarity"),
            nan_count=self._integer(get("nan_count", 0), f"{what} nan_count"),
            inf_count=self._integer(get("inf_count", 0), f"{what} inf_count"),
            finite_count=self._integer(get("finite_count"), f"{what} finite_count", optional=True),
            sqnr_db=None if get("sqnr_db") is None else self._not_nan(data["sqnr_db"], f"{what} sqnr_db"),
            top_k=self._count_of(get("top_k"), f"{what} top_k", least=1),
            top_k_rows=self._count_of(get("top_k_rows"), f"{what} top_k_rows", least=1),
            top_k_agreement=self._fraction(get("top_k_agreement"), f"{what} top_k_agreement"),
            top_k_first_disagreement=self._count_of(
                get("top_k_first_disagreement"), f"{what} top_k_first_disagreement", least=0
            ),
        )

    @classmethod
    def _count_of(cls, value: Any, what: str, *, least: int) -> int | None:
        """An optional integer of at least ``least`` (a count, a row index)."""
        number: int | None = cls._integer(value, what, optional=True)
        if number is not None and number < least:
            raise ValueError(f"{what} is less than {least}")
        return number

    @classmethod
    def _not_nan(cls, value: Any, what: str) -> float:
        """A number that may be infinite (an SQNR where nothing differs), never NaN."""
        number = cls._number(value, what)
        if number != number:
            raise ValueError(f"{what} is NaN")
        return number

    @classmethod
    def _fraction(cls, value: Any, what: str) -> float | None:
        """An optional number from 0 to 1 (NaN, outside every range, is refused)."""
        if value is None:
            return None
        number = cls._number(value, what)
        if not 0.0 <= number <= 1.0:
            raise ValueError(f"{what} is not a fraction from 0 to 1")
        return number

    def boundary(self, data: Any, what: str) -> BoundaryRow:
        data = self._fields(data, _BOUNDARY_FIELDS, {"boundary", "values"}, what)
        own = data.get("own")
        return BoundaryRow(
            self._text(data["boundary"], f"{what} name"),
            self._integer(data.get("engine"), f"{what} engine", optional=True),
            [self.comparison(v, f"{what} value") for v in self._items(data["values"], f"{what} values")],
            None if own is None else [self.comparison(v, f"{what} own") for v in self._items(own, f"{what} own")],
            self._text(data.get("own_problem"), f"{what} own_problem", optional=True),
            self._text(data.get("origin", ""), f"{what} origin"),
        )

    def _texts(self, value: Any, what: str) -> list[str]:
        return [self._text(item, what) for item in self._items(value, what)]

    def divergence(self, data: Any) -> Divergence:
        data = self._fields(data, _DIVERGENCE_FIELDS, {"kind", "where", "detail"}, "divergence")
        return Divergence(
            self._text(data["kind"], "divergence kind"),
            self._text(data["where"], "divergence where"),
            self._text(data["detail"], "divergence detail"),
            producers=self._texts(data.get("producers", []), "divergence producers"),
            consumers=self._texts(data.get("consumers", []), "divergence consumers"),
            nodes=self._texts(data.get("nodes", []), "divergence nodes"),
            op_drill=None if data.get("op_drill") is None else self.op_drill(data["op_drill"]),
            module=self._text(data.get("module", ""), "divergence module"),
            source=self._text(data.get("source", ""), "divergence source"),
            modules=self._texts(data.get("modules", []), "divergence modules"),
            near=self._texts(data.get("near", []), "divergence near"),
        )

    def op_drill(self, data: Any) -> OpDrill:
        data = self._fields(data, _OP_DRILL_FIELDS, {"summary"}, "divergence op_drill")
        return OpDrill(
            self._text(data["summary"], "op_drill summary"),
            self._count_of(data.get("step"), "op_drill step", least=0),
            *(self._text(data.get(name, ""), f"op_drill {name}") for name in ("op", "module", "source")),
        )

    def _sizes(self, value: Any, what: str) -> list[Any]:
        """A run's input sizes: one list of dimensions per input (or a text)."""
        return [
            [self._integer(d, f"{what} size") for d in self._items(shape, f"{what} sizes", _MAX_DIMS)]
            if isinstance(shape, list) else self._text(shape, f"{what} sizes")
            for shape in self._items(value, f"{what} sizes", _MAX_INPUTS)
        ]  # fmt: skip

    def _symbols(self, value: Any, what: str) -> dict[str, int]:
        """A run's size symbols and their values."""
        if not isinstance(value, dict):
            raise ValueError(f"{what} symbols is not an object")
        if len(value) > _MAX_INPUTS * _MAX_DIMS:
            raise ValueError(f"{what} symbols holds {len(value)} symbols, more than {_MAX_INPUTS * _MAX_DIMS}")
        self._count(len(value))
        return {self._text(k, f"{what} symbol"): self._integer(v, f"{what} symbol") for k, v in value.items()}

    def random_run(self, data: Any) -> dict[str, Any]:
        data = self._fields(data, _RUN_FIELDS, {"iteration", "sizes", "ok"}, "random run")
        return {
            "iteration": self._integer(data["iteration"], "random run iteration"),
            "sizes": self._sizes(data["sizes"], "random run"),
            "symbols": self._symbols(data.get("symbols", {}), "random run"),
            "ok": self._flag(data["ok"], "random run ok"),
            "problem": self._text(data.get("problem"), "random run problem", optional=True),
        }

    def range_end_run(self, data: Any) -> dict[str, Any]:
        data = self._fields(data, _RANGE_END_FIELDS, _RANGE_END_FIELDS - {"problem"}, "range end run")
        if data["end"] not in RANGE_END_NAMES:
            raise ValueError(f"range end run end is not one of {', '.join(RANGE_END_NAMES)}")
        return {
            "end": data["end"],
            "sizes": self._sizes(data["sizes"], "range end run"),
            "symbols": self._symbols(data["symbols"], "range end run"),
            "ok": self._flag(data["ok"], "range end run ok"),
            "problem": self._text(data.get("problem"), "range end run problem", optional=True),
            "compared": self._flag(data["compared"], "range end run compared"),
        }

    def report(self, data: Any) -> VerifyReport:
        data = self._fields(
            data, _REPORT_FIELDS, {"source", "problems", "notes", "outputs", "expected_source"}, "report"
        )
        divergence = data.get("divergence")
        return VerifyReport(
            source=self._text(data["source"], "report source"),
            problems=self._texts(data["problems"], "report problems"),
            notes=self._texts(data["notes"], "report notes"),
            outputs=[self.comparison(o, "output") for o in self._items(data["outputs"], "report outputs")],
            expected_source=self._text(data["expected_source"], "report expected_source"),
            allow_pickle=self._flag(data.get("allow_pickle", False), "report allow_pickle"),
            child_peak_extra_bytes=self._integer(data.get("child_peak_extra_bytes"), "report peak", optional=True),
            child_peak_anonymous_bytes=self._integer(
                data.get("child_peak_anonymous_bytes"), "report peak", optional=True
            ),
            child_peak_file_bytes=self._integer(data.get("child_peak_file_bytes"), "report peak", optional=True),
            boundaries=[self.boundary(b, "boundary") for b in self._items(data.get("boundaries", []), "boundaries")],
            boundaries_on=self._text(data.get("boundaries_on", ""), "report boundaries_on"),
            divergence=None if divergence is None else self.divergence(divergence),
            random_runs=[
                self.random_run(run) for run in self._items(data.get("random_runs", []), "random runs", _MAX_RUNS)
            ],
            range_end_runs=[
                self.range_end_run(run)
                for run in self._items(data.get("range_end_runs", []), "range end runs", len(RANGE_END_NAMES))
            ],
            warnings=self._texts(data.get("warnings", []), "report warnings"),
        )
