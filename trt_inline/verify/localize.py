"""Where a run first leaves its reference: boundary by boundary, engine by engine.

Given the trace of a file's run (:func:`trt_inline.verify.boundaries.trace_program`)
and a reference (the boundaries a save recorded from the compiled module, or the
trace of a second file), the boundaries are compared in the order they ran::

    engine 0 inputs ─ engine 0 outputs ─ engine 1 inputs ─ engine 1 outputs ─ … ─ program outputs
                                       ▲
                                       └─ the first one past tolerance decides:
                                          inputs  → the fallback region (or wire) feeding them
                                          outputs → the engine itself

An engine whose inputs agree and whose outputs do not is the divergence, and its
own error (run alone on the recorded inputs) says so independently of the run. Inside such an engine,
:mod:`~trt_inline.verify.drill` names its first op past tolerance. The divergence and each engine's
rows are also named in the user's terms where the file records them (:mod:`trt_inline.module_paths`):
the modules and source lines an engine's steps come from, a region's module and line, what each reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from trt_inline.archive.reference_io import EngineBoundary
from trt_inline.verify.boundaries import EngineCall, ProgramTrace, Region
from trt_inline.verify.compare import Criteria, boundary_tolerance, compare_output, exactly_as, tolerance_for
from trt_inline.verify.drill import drill_divergence
from trt_inline.verify.report import BoundaryRow, Divergence, OutputComparison

__all__ = ["Reference", "localize", "localize_partitions", "own_error_problems", "same_partition"]

Tolerance = float | Mapping[str, float] | None


@dataclass
class Reference:
    """What a run is compared with: recorded engine boundaries and program outputs.

    ``name`` says where they come from ("the compiled module", a file); ``trace``
    is that file's own trace when the reference is another file (``diff``), for
    naming what it wired where this run wired something else.
    """

    name: str
    boundaries: Sequence[EngineBoundary]
    outputs: Sequence[torch.Tensor]
    trace: ProgramTrace | None = None


def _compare(
    actual: Sequence[Any], expected: Sequence[torch.Tensor], atol: Tolerance, rtol: Tolerance, stat: str
) -> list[OutputComparison]:
    """Value by value; a scalar's 0-d tensor is compared in the reference's dtype where it converts exactly
    (engines choose their own scalar dtypes); one that does not is a dtype mismatch."""
    result = []
    for index, (got, want) in enumerate(zip(actual, expected, strict=False)):
        if isinstance(got, torch.Tensor) and got.dim() == 0 and want.dim() == 0 and got.dtype != want.dtype:
            converted = exactly_as(got, want.dtype)
            got = got if converted is None else converted
        atol_here, rtol_here = tolerance_for(atol, index), tolerance_for(rtol, index)
        result.append(compare_output(index, got, want, atol_here, rtol_here, stat))
    if len(actual) != len(expected):
        problem = f"{len(actual)} values where the reference has {len(expected)}"
        result.append(OutputComparison(len(result), [], "", float("inf"), float("inf"), 0.0, 0.0, False, problem))
    return result


def _worst(values: Sequence[OutputComparison]) -> OutputComparison:
    return next(v for v in values if not v.ok)


def _signature(call: EngineCall, record: EngineBoundary, outputs: bool = True) -> str | None:
    """Why a recorded engine cannot be the same engine as the one that ran here, or None."""
    sides = [("inputs", call.inputs, record.inputs)] + ([("outputs", call.outputs, record.outputs)] if outputs else [])
    for what, mine, theirs in sides:
        if len(mine) != len(theirs):
            return f"it has {len(mine)} {what}, the reference's engine {len(theirs)}"
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            if a.shape != b.shape and not (a.dim() == 0 and b.dim() == 0):
                return f"its {what[:-1]} {index} is {list(a.shape)}, the reference's {list(b.shape)}"
    return None


def _their_region(reference: Reference, engine: int, position: int) -> Region | None:
    """The region that fed the same engine input in the reference file (``diff``), or None."""
    if reference.trace is not None and engine < len(reference.trace.calls):
        regions = reference.trace.calls[engine].regions
        return regions[position] if position < len(regions) else None
    return None


def _their_side(reference: Reference, engine: int, position: int) -> str:
    """What fed the same engine input in the reference, in its own words."""
    region = _their_region(reference, engine, position)
    if region is not None:
        return f"in {reference.name}: {region.describe()}"
    record = reference.boundaries[engine]
    if position < len(record.sources):
        return f"in the compiled module it came from {record.sources[position]}"
    return "the reference does not say where it came from"


def _boundary_words(reads: Sequence[str]) -> list[str]:
    """``engine 1 output 1`` of ``getitem_3 = engine 1 output 1``: what a read is, whatever the node is named."""
    return sorted(read.partition(" = ")[2] or read for read in reads)


def _value_divergence(
    where_value: str,
    region: Region,
    comparison: OutputComparison,
    theirs: str,
    feeds: list[str],
    their_region: Region | None = None,
) -> Divergence:
    """The divergence at a value produced by ``region``, whose own inputs agree with the reference."""
    error = comparison.error_text()
    mine, their_reads = _boundary_words(region.reads), _boundary_words(their_region.reads if their_region else [])
    if region.nodes and their_region is not None and mine != their_reads:
        where = f"{region.name()} (feeding {where_value})"
        detail = (
            f"{where_value} differs ({error}); the fallback region that computes it reads {', '.join(mine)} where "
            f"the reference's reads {', '.join(their_reads)}: it is wired to another value. Reference side: {theirs}"
        )
        return _region_named(
            Divergence("fallback", where, detail, list(region.reads), feeds, list(region.nodes)), region
        )
    if region.nodes:
        where = f"{region.name()} (feeding {where_value})"
        detail = (
            f"{where_value} differs ({error}); the fallback region that computes it reads only values that agree "
            "with the reference, so its ops or its wiring differ from the compiled module's (which, diff against "
            f"a good save of the same module tells). Reference side: {theirs}"
        )
        return _region_named(
            Divergence("fallback", where, detail, list(region.reads), feeds, list(region.nodes)), region
        )
    where = f"{where_value}, wired from {', '.join(region.reads) or 'nothing'}"
    detail = (
        f"{where_value} differs ({error}) and is wired straight from a value that agrees with the reference: "
        f"it is wired to the wrong value. Reference side: {theirs}"
    )
    return _region_named(Divergence("wiring", where, detail, list(region.reads), feeds), region)


def localize(
    trace: ProgramTrace, reference: Reference, criteria: Criteria
) -> tuple[list[BoundaryRow], Divergence | None]:
    """Every boundary of ``trace`` compared with ``reference``, and the first one past tolerance, named.

    An engine's inputs and outputs are held to the tolerance of ``criteria`` keyed by that engine
    (``engine2``, ``_run_on_acc_5``), else the one for every value (``*`` or a plain
    number), else the dtype's; the program's outputs to theirs (:func:`tolerance_for`).
    """
    atol, rtol, stat = criteria.atol, criteria.rtol, criteria.stat
    rows: list[BoundaryRow] = []
    divergence: Divergence | None = None

    def compare(call: EngineCall, actual: Sequence[Any], expected: Sequence[torch.Tensor]) -> list[OutputComparison]:
        inner_atol = boundary_tolerance(atol, call.index, call.label)
        return _compare(actual, expected, inner_atol, boundary_tolerance(rtol, call.index, call.label), stat)

    for call, record in zip(trace.calls, reference.boundaries, strict=False):
        title = f"engine {call.index} ({call.label})"
        if record.name and record.name != call.label:
            title = f"engine {call.index} ({call.label}, reference {record.name})"
        crashed = trace.crash is not None and trace.crash.engine == call.index
        mismatch = _signature(call, record, outputs=not crashed)
        if mismatch is not None:
            if _signature(call, record, outputs=False) is None:  # its outputs do not fit: its inputs still compare
                rows.append(BoundaryRow(f"{title} inputs", call.index, compare(call, call.inputs, record.inputs)))
            divergence = divergence or Divergence(
                "signature", title, f"{title} is not the reference's engine {call.index} ({record.name}): {mismatch}",
                call.producers, call.consumers,
            )  # fmt: skip
            break
        inputs = compare(call, call.inputs, record.inputs)
        rows.append(BoundaryRow(f"{title} inputs", call.index, inputs))
        if divergence is None and not rows[-1].ok:
            bad = _worst(inputs)
            divergence = _value_divergence(
                f"engine {call.index} in[{bad.index}]",
                call.regions[bad.index],
                bad,
                _their_side(reference, call.index, bad.index),
                [f"engine {call.index} in[{bad.index}]"],
                _their_region(reference, call.index, bad.index),
            )
        outputs = [] if crashed else compare(call, call.outputs, record.outputs)
        own = None if call.alone is None else compare(call, call.alone, record.outputs)
        rows.append(BoundaryRow(f"{title} outputs", call.index, outputs, own, call.alone_problem))
        if divergence is None and not crashed and not (rows[-1].ok and rows[-1].own_ok):
            own_worst = BoundaryRow.worst(own)
            run_worst = BoundaryRow.worst(outputs)
            detail = (
                f"its inputs agree with the reference and its outputs do not (max abs diff {run_worst:.6g} in the run"
                + ("" if own_worst is None else f", {own_worst:.6g} when run alone on the recorded inputs")
                + ")"
            )
            divergence = Divergence("engine", title, detail, call.producers, call.consumers)
    if trace.crash is not None:
        for call in trace.unreached:
            own = None if call.alone is None else compare(call, call.alone, reference.boundaries[call.index].outputs)
            title = f"engine {call.index} ({call.label}) outputs (not reached)"
            rows.append(BoundaryRow(title, call.index, [], own, call.alone_problem))
        return _named_rows(trace, rows), drill_divergence(trace, _named(trace, _crashed(trace, rows, divergence)))
    if divergence is None and len(trace.calls) != len(reference.boundaries):
        divergence = Divergence(
            "signature",
            f"engine {min(len(trace.calls), len(reference.boundaries))}",
            f"the run calls {len(trace.calls)} engines, the reference ({reference.name}) {len(reference.boundaries)}",
        )
    divergence = _amplified(rows, divergence, trace)
    outputs = _compare(trace.outputs, reference.outputs, atol, rtol, stat)
    rows.append(BoundaryRow("program outputs", None, outputs))
    if divergence is None and not rows[-1].ok:
        bad = _worst(outputs)
        region = trace.output_regions[bad.index] if bad.index < len(trace.output_regions) else Region()
        theirs, their_region = "the reference's output", None
        if reference.trace is not None and bad.index < len(reference.trace.output_regions):
            their_region = reference.trace.output_regions[bad.index]
            theirs = f"in {reference.name}: {their_region.describe()}"
        divergence = _value_divergence(f"output {bad.index}", region, bad, theirs, ["OUTPUT"], their_region)
    # (inside a divergent reference engine: its first op past)
    return _named_rows(trace, rows), drill_divergence(trace, _named(trace, divergence))


def _crashed(trace: ProgramTrace, rows: Sequence[BoundaryRow], divergence: Divergence | None) -> Divergence:
    """A run that raised: the divergence before the crash, if any, is its cause; else where it raised.

    An engine that returns another number or shape of values, or a wrong size,
    makes a later node raise: the boundary that first differs names it, and the
    crash is what followed. Where every boundary up to the crash agrees, the
    engine or fallback region that raised is the divergence itself.
    """
    crash = trace.crash
    assert crash is not None
    where = crash.where(trace.calls)
    then = f"the run then raised at {where}: {crash.error}"
    if divergence is not None:
        return replace(divergence, detail=f"{divergence.detail}; {then}")
    if crash.engine is not None:
        call = trace.calls[crash.engine]
        row = next((r for r in rows if r.engine == crash.engine and r.own is not None), None)
        alone = (
            f"; run alone on its recorded inputs it {'matches' if row.own_ok else 'differs from'} the reference"
            if row is not None
            else f" ({call.alone_problem})"
            if call.alone_problem
            else ""
        )
        detail = f"its inputs agree with the reference and it raised {crash.error}{alone}"
        return Divergence("crash", where, detail, call.producers, call.consumers)
    region = crash.region or Region()
    detail = f"every engine before it agrees with the reference, and node {crash.node} raised {crash.error}" + (
        f"; the region reads {', '.join(region.reads)}" if region.reads else ""
    )
    return _region_named(Divergence("crash", where, detail, list(region.reads), [], list(region.nodes)), region)


def _amplified(rows: Sequence[BoundaryRow], divergence: Divergence | None, trace: ProgramTrace) -> Divergence | None:
    """Blame by own error: an engine named only because it amplifies an earlier engine's own (small) error.

    The first boundary past tolerance can be an engine whose inputs agree within
    tolerance and whose own error is nil: an engine upstream of it changed a
    little (its own error nonzero, within tolerance) and this one magnified it.
    The earliest such upstream engine is then the cause; both views stay in the table.
    """
    if divergence is None or divergence.kind != "engine":
        return divergence
    named = next((row for row in rows if row.boundary == f"{divergence.where} outputs"), None)
    if named is None or named.own is None or not named.own_ok or (BoundaryRow.worst(named.own) or 0.0) > 0.0:
        return divergence
    upstream = _upstream_engines(trace, named.engine)
    for row in rows:
        if row is named:
            break
        own = BoundaryRow.worst(row.own)
        if row.engine in upstream and row.own is not None and own is not None and own > 0.0:
            title = row.boundary.removesuffix(" outputs")
            detail = (
                f"its own error (max abs diff {own:.6g} when run alone on its recorded inputs) is within tolerance, "
                f"and {divergence.where}, whose own error is 0, amplifies it past tolerance (max abs diff "
                f"{BoundaryRow.worst(named.values):.6g} at its outputs): {title} is the earliest engine feeding it "
                "that computes something else"
            )
            call = next((c for c in trace.calls if c.index == row.engine), None)
            producers, consumers = (call.producers, call.consumers) if call is not None else ([], [])
            return Divergence("engine", title, detail, producers, consumers)
    return divergence


_ENGINE_OUTPUT = re.compile(r"\bengine (\d+) output \d+\b")


def _upstream_engines(trace: ProgramTrace, engine: int | None) -> set[int]:
    """The engines whose outputs reach ``engine``'s inputs, through fallback regions or straight."""
    calls = {call.index: call for call in trace.calls}
    found: set[int] = set()
    pending = [engine] if engine is not None else []
    while pending:
        call = calls.get(pending.pop())
        for region in call.regions if call is not None else []:
            for read in region.reads:
                for match in _ENGINE_OUTPUT.finditer(read):
                    index = int(match.group(1))
                    if index not in found:
                        found.add(index)
                        pending.append(index)
    return found


def own_error_problems(rows: Sequence[BoundaryRow]) -> list[str]:
    """One problem per engine whose own error (run alone on its recorded inputs) is past tolerance."""
    problems = []
    for row in rows:
        if row.own is not None and not row.own_ok:
            title = row.boundary.removesuffix(" outputs")
            problems.append(
                f"{title}: its own error is past tolerance (max abs diff {BoundaryRow.worst(row.own):.6g} when run "
                "alone on its recorded inputs)"
            )
    return problems


def same_partition(a: ProgramTrace, b: ProgramTrace) -> bool:
    """Whether two runs have the same engines in the same order: as many calls, each with the same signature."""
    return len(a.calls) == len(b.calls) and all(
        _signature(mine, EngineBoundary(theirs.label, theirs.inputs, theirs.outputs)) is None
        for mine, theirs in zip(a.calls, b.calls, strict=True)
    )


@dataclass
class _Cut:
    """A value both partitions may cut at, named by the exported program's node computing it."""

    name: str
    value: torch.Tensor
    where: str  # "engine 1 in[0]", "engine 1 out[0]" or "output 0"
    what: str  # what computes it in this file, in the inspect vocabulary
    reads: list[str]  # the values its fallback region reads (none for an engine's output)
    nodes: list[str]  # its fallback region's nodes (none for an engine's output)
    feeds: list[str]  # the engine input or program output it is (none for an engine's output)
    region: Region | None = None  # what computes it: its fallback region, or the engine whose output it is
    call: EngineCall | None = None


def _cuts(trace: ProgramTrace, provenance: Mapping[str, Any] | None) -> dict[str, _Cut]:
    """The values crossing between PyTorch and an engine (or out of the program), by the node that computes them.

    With ``provenance`` (what the save recorded: which exported node each engine
    input and output and each program output is), every such value is named by
    its exported node, whichever side computes it. Without, a value a torch node
    of the saved program computes is named by that node, and an engine's output
    not at all: a weaker key (a re-export names a program's nodes again), used
    only when neither file recorded provenance. Program inputs are the same in
    both runs and are not cuts.
    """
    cuts: dict[str, _Cut] = {}
    engines = provenance.get("engines", []) if provenance is not None else []

    def add(
        name: str, value: Any, where: str, what: str, region: Region | None = None, call: EngineCall | None = None
    ) -> None:
        if name and isinstance(value, torch.Tensor):
            reads, nodes, feeds = (list(region.reads), list(region.nodes), [where]) if region else ([], [], [])
            cuts.setdefault(name, _Cut(name, value, where, what, reads, nodes, feeds, region, call))

    def key(producer: str, recorded: Sequence[str], index: int) -> str:
        if provenance is not None:
            return recorded[index] if index < len(recorded) else ""
        return "" if " = engine " in producer or " (" in producer else producer  # an engine's output, an input

    for call in trace.calls:
        recorded = engines[call.index] if call.index < len(engines) else {}
        for index, (producer, value, region) in enumerate(zip(call.producers, call.inputs, call.regions, strict=False)):
            name = key(producer, recorded.get("inputs", []), index)
            add(name, value, f"engine {call.index} in[{index}]", region.describe(), region)
        if provenance is not None:
            for index, value in enumerate(call.outputs):
                name = key("", recorded.get("outputs", []), index)
                add(name, value, f"engine {call.index} out[{index}]", f"engine {call.index} ({call.label})", call=call)
    returned = provenance.get("outputs", []) if provenance is not None else []
    for index, (producer, value, region) in enumerate(
        zip(trace.output_producers, trace.outputs, trace.output_regions, strict=False)
    ):
        add(key(producer, returned, index), value, f"output {index}", region.describe(), region)
    return cuts


def localize_partitions(
    trace: ProgramTrace,
    reference: ProgramTrace,
    name: str,
    criteria: Criteria,
    provenance: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] = (None, None),
) -> tuple[list[BoundaryRow], Divergence | None, str]:
    """Two runs of one program partitioned differently, compared at the cut points both share.

    Engines cannot be paired by position (4 engines against 1, another
    ``min_block_size``, another TensorRT): the values compared are those both
    runs hand between PyTorch and an engine (or return), matched by the
    exported program's node computing them (``provenance``: each file's record
    of it, used where both files have one), of the same shape and dtype, in
    the order the first run reaches them; then the program outputs. The first shared cut past tolerance names
    the divergence: it lies in what each run computes between the last
    agreeing cut and that one. Returns the rows, the divergence, and a line
    saying how the partitions differ.
    """
    atol, rtol, stat = criteria.atol, criteria.rtol, criteria.stat
    both = provenance if all(p is not None for p in provenance) else (None, None)  # one namespace or the other
    mine, theirs = _cuts(trace, both[0]), _cuts(reference, both[1])
    shared = [
        key for key in mine
        if key in theirs and (mine[key].value.shape, mine[key].value.dtype) == (theirs[key].value.shape,
                                                                              theirs[key].value.dtype)
    ]  # fmt: skip
    rows: list[BoundaryRow] = []
    divergence: Divergence | None = None
    last_agreeing = "the program inputs"
    for key in shared:
        a, b = mine[key], theirs[key]
        values = _compare([a.value], [b.value], _inner(atol), _inner(rtol), stat)
        rows.append(BoundaryRow(f"{key} (here {a.where}; {name}: {b.where})", None, values))
        if divergence is None and not rows[-1].ok:
            detail = (
                f"{key} differs ({values[0].error_text()}); the last value both cut at that agrees is "
                f"{last_agreeing}: what computes {key} from it differs (the engines and regions in between). "
                f"Here: {a.what}; in {name}: {b.what}"
            )
            divergence = _cut_named(Divergence("partition", f"{key} ({a.where})", detail, a.reads, a.feeds, a.nodes), a)
        elif divergence is None:
            last_agreeing = key
    if trace.crash is None:
        outputs = _compare(trace.outputs, reference.outputs, atol, rtol, stat)
        rows.append(BoundaryRow("program outputs", None, outputs))
        if divergence is None and not rows[-1].ok:
            bad = _worst(outputs)
            divergence = Divergence(
                "partition", f"output {bad.index}",
                f"output {bad.index} differs ({bad.error_text()}); the last value both cut at that agrees is "
                f"{last_agreeing}: the divergence lies after it",
            )  # fmt: skip
    else:
        divergence = _crashed(trace, rows, divergence)
    recorded = (
        "the exported node computing them, as each file recorded at save"
        if both[0] is not None
        else "the node of each saved program computing them (one file did not record the exported nodes at save)"
    )
    how = (
        f"the files are partitioned differently: this one runs {len(trace.calls)} engine "
        f"call{'' if len(trace.calls) == 1 else 's'}, {name} "
        f"{len(reference.calls)}; compared at the {len(shared)} values both hand between PyTorch and an engine "
        f"(or return), matched by {recorded}"
    )
    return rows, _named(trace, divergence), how


def _inner(tolerance: Tolerance) -> Tolerance:
    """Cut points are no program output: a tolerance keyed by output does not apply, one for every value does."""
    if not isinstance(tolerance, Mapping):
        return tolerance
    return {"*": tolerance["*"]} if "*" in tolerance else None


# ---------------------------------------------------------------------------
# Names in the user's terms (:mod:`trt_inline.module_paths`), where the file records them
# ---------------------------------------------------------------------------

_NAMES_ENGINE = re.compile(r"^engine (\d+)\b")
_ENGINE_INPUT = re.compile(r"^engine (\d+) in\[\d+\]$")


def _region_named(divergence: Divergence, region: Region) -> Divergence:
    """``divergence`` with its region's module path, source line and modules, and what each value it reads is."""
    divergence.module, divergence.source, divergence.modules = region.module, region.source, list(region.modules)
    divergence.near = [
        f"reads {read}: {origin}" for read, origin in zip(region.reads, region.read_origins, strict=False) if origin
    ]
    return divergence


def _engine_named(divergence: Divergence, call: EngineCall) -> Divergence:
    """``divergence`` with the modules and source lines of an engine's steps, and what it reads and feeds."""
    divergence.modules, divergence.source = list(call.coverage.modules), call.coverage.source_text()
    divergence.near = list(call.near)
    return divergence


def _cut_named(divergence: Divergence, cut: _Cut) -> Divergence:
    """A partition divergence at ``cut``, named by what computes it there: its fallback region, or its engine."""
    if cut.region is not None and cut.region.nodes:
        return _region_named(divergence, cut.region)
    return _engine_named(divergence, cut.call) if cut.call is not None else divergence


def _named(trace: ProgramTrace, divergence: Divergence | None) -> Divergence | None:
    """``divergence`` named in the user's terms: the engine it names (where nothing named it yet), and each engine
    whose input it feeds (``feeds engine 2 in[0]: engine 2 covers 1.proj (Linear)``)."""
    if divergence is None:
        return None
    calls = {call.index: call for call in (*trace.calls, *trace.unreached)}
    match = _NAMES_ENGINE.match(divergence.where)
    named = calls.get(int(match.group(1))) if match else None
    if named is not None and not divergence.named():
        _engine_named(divergence, named)
    for fed in divergence.consumers:
        match = _ENGINE_INPUT.match(fed)
        call = calls.get(int(match.group(1))) if match else None
        said = any(entry.startswith(f"feeds {fed}: ") for entry in divergence.near)
        if call is not None and call is not named and not said and (modules := call.coverage.module_text()):
            divergence.near.append(f"feeds {fed}: engine {call.index} covers {modules}")
    return divergence


def _named_rows(trace: ProgramTrace, rows: list[BoundaryRow]) -> list[BoundaryRow]:
    """``rows``, each engine's with the modules its steps come from."""
    calls = {call.index: call for call in (*trace.calls, *trace.unreached)}
    for row in rows:
        call = calls.get(row.engine) if row.engine is not None else None
        if call is not None:
            row.origin = call.coverage.module_text()
    return rows
