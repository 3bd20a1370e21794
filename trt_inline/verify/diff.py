"""``diff``: two saves of one model run on the same inputs, compared at every engine boundary.

The second file is the reference: its run is traced first, and the first file's
run is compared with it boundary by boundary (:mod:`trt_inline.verify.localize`),
engines aligned by position and checked by signature; each engine of the first
file is also run alone on the second file's inputs to that engine. Files whose
engines do not pair up (partitioned differently) are compared at the values both
hand between PyTorch nodes and engines, matched by the exported node computing them. The report
names the first divergence in both files' words, e.g. a fallback region that
reads ``engine 1 output 1`` where the other file's reads ``engine 1 output 0``.

:class:`Comparison` makes one diff a step per method; what is the same work as ``verify``'s is
:mod:`~trt_inline.verify.pipeline`'s: opening a file under the trust policy, the check of given inputs,
and the pairing of outputs by path (:func:`trt_inline.output_tree.by_path`), held to the one :class:`Criteria`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from trt_inline import allowed_ops
from trt_inline.archive.loading import AOTI_PACKAGE, LoadedFile
from trt_inline.archive.output_types import stood_in_note
from trt_inline.archive.reader import check_path
from trt_inline.distributed.manifest import collectives_of
from trt_inline.errors import RefusedOperatorError, VerifyInputError, first_line
from trt_inline.isolation import Limits, default_memory_limit, job
from trt_inline.output_tree import OutputTree, Pairing, by_path, describe_spec
from trt_inline.verify import range_ends
from trt_inline.verify.boundaries import ProgramTrace, as_boundaries, trace_program
from trt_inline.verify.compare import Criteria, collapse_warnings, ranked, run_on, say_unranked
from trt_inline.verify.localize import (
    Reference,
    localize,
    localize_partitions,
    own_error_problems,
    same_partition,
)
from trt_inline.verify.options import (
    DIFF,
    DiffFields,
    Inputs,
    Isolation,
    Options,
    Outputs,
    Tolerances,
    Trust,
    for_child,
    gather,
)
from trt_inline.verify.pipeline import Keep, capture_device, check_given_inputs, open_trusted
from trt_inline.verify.random_inputs import Draw, draw_inputs
from trt_inline.verify.range_ends import End
from trt_inline.verify.report import BoundaryRow, Divergence, VerifyReport
from trt_inline.verify.structure import structural_problems
from trt_inline.verify.verifier import report_of_child, save_target, save_tensors

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # (typing has it from 3.11)
    from typing_extensions import Unpack

__all__ = ["Comparison", "DiffRequest", "diff", "diff_job"]


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

    def keep(self) -> Keep:
        """What the child hands back besides its report: both files' outputs, where asked."""
        return Keep(outputs=self.keep_outputs)


def diff(
    path_a: str | os.PathLike[str],
    path_b: str | os.PathLike[str],
    *,
    inputs: Inputs | None = None,
    tolerances: Tolerances | None = None,
    trust: Trust | None = None,
    isolation: Isolation | None = None,
    outputs: Outputs | None = None,
    **fields: Unpack[DiffFields],
) -> VerifyReport:
    """Run two saved programs on the same inputs and compare them at every engine boundary, ``path_b`` the reference.

    The options are :func:`trt_inline.verify`'s groups (:mod:`trt_inline.verify.options`), or their fields as
    keywords, but for what only ``verify`` takes: no ``reference`` (``path_b`` is the reference), no ``strict``,
    ``save_boundaries`` or ``extract`` (a :class:`TypeError`).

    Inputs: ``arg_inputs`` / ``kwarg_inputs``, else the reference inputs the
    first file embeds, else the second's. ``range_ends``: also the sets at the ends
    of the first program's declared ranges (:mod:`trt_inline.verify.range_ends`;
    ``"auto"`` by default). ``random_inputs``: that many more sets
    drawn within the first program's declared ranges (``seed``); the comparison
    stops at the first set that diverges. ``report.ok`` is true when every
    boundary of every run agrees within tolerance; ``report.divergence`` names
    the first that does not. Both files are opened with the checks of
    :func:`trt_inline.verify` and run in one sandboxed child process (``isolate``, ``sandbox``).
    ``top_k`` / ``min_top_k_agreement``: the program outputs' top-k agreement, as :func:`trt_inline.verify` says.
    """
    options = gather(DIFF, fields, inputs=inputs, tolerances=tolerances, trust=trust, isolation=isolation,
                     outputs=outputs)  # fmt: skip
    inputs, isolation, save_outputs = options.inputs, options.isolation, options.outputs.save_outputs
    request = DiffRequest.of(os.fspath(path_a), os.fspath(path_b), options)
    tensors = {
        "args": None if inputs.arg_inputs is None else list(inputs.arg_inputs),
        "kwargs": inputs.kwarg_inputs,
    }
    for path in (path_a, path_b):
        check_path(path)  # (said at once, before a child starts: the child reads each file again, strictly)
    if not isolation.isolate:
        result = diff_job(request, tensors)
        if save_outputs is not None:
            report_dict, kept = result
            save_tensors(kept["outputs"], save_outputs)
            return VerifyReport.from_dict(report_dict)
        return VerifyReport.from_dict(result)
    memory_limit = isolation.memory_limit
    if memory_limit is None:
        # Working room and half of each file (both are mapped), within what the machine has.
        size_b = os.path.getsize(path_b) if os.path.isfile(path_b) else 0
        memory_limit = max(default_memory_limit(path_a), default_memory_limit(path_b)) + size_b // 2
    if save_outputs is not None:
        save_target(save_outputs)
    limits = Limits.for_file(path_a, isolation.timeout, memory_limit)
    report, handed = report_of_child(
        request, tensors, limits, where=os.fspath(path_a), files=(os.fspath(path_a), os.fspath(path_b)),
        isolation=isolation,
    )  # fmt: skip
    if save_outputs is not None:
        save_tensors(handed.outputs, save_outputs)
    return report


def _program(loaded: LoadedFile) -> ExportedProgram:
    """The program whose run is compared: an ExportedProgram file's (a package's engines exist only compiled)."""
    if loaded.kind == AOTI_PACKAGE or loaded.program is None:
        raise VerifyInputError(
            f"{loaded.path} is an AOTInductor package: its engines run inside its compiled code and the program it "
            "carries holds no weights, so there are no engine boundaries to compare; diff the ExportedProgram files "
            "saved from the same modules"
        )
    return loaded.program


def _provenance(loaded: LoadedFile) -> dict[str, Any] | None:
    """Which exported node each value between PyTorch and an engine is, as a file's save recorded (None: not)."""
    return loaded.reference.provenance if loaded.reference is not None else None


def _rank_outputs(
    report: VerifyReport, outputs_a: Sequence[Any], outputs_b: Sequence[torch.Tensor], criteria: Criteria
) -> None:
    """The program outputs' top-k agreement (``--top-k``), in place: the row of program outputs holds the same
    comparisons; an output below the minimum agreement is a problem."""
    k, minimum = criteria.top_k, criteria.min_top_k_agreement
    assert k is not None
    for comparison in report.outputs:
        if comparison.index < min(len(outputs_a), len(outputs_b)):
            ranked(comparison, outputs_a[comparison.index], outputs_b[comparison.index], k, minimum)
            agreement = comparison.top_k_agreement
            if minimum is not None and agreement is not None and agreement < minimum and comparison.problem:
                report.problems.append(comparison.problem)
    say_unranked(report, k, minimum)  # (as verify says it: a floor asked for and nothing held to it, no pass)


@dataclass
class _File:
    """The open step's result for one file: its program, what runs it, and how a caller reads its outputs."""

    path: str
    loaded: LoadedFile
    program: ExportedProgram
    module: torch.fx.GraphModule
    tree: OutputTree  # (of its output spec: every leaf a value, a None output too)

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True)
class _InputSet:
    """One set of inputs both files run on: the chosen inputs (no ``draw``), the inputs at an end of A's ranges
    (``end``, its ``draw``), or random draw ``iteration``."""

    args: list[Any]
    kwargs: dict[str, Any]
    end: End | None = None
    draw: Draw | None = None
    iteration: int = -1

    @property
    def on(self) -> str | None:
        """Which inputs these are, in a divergence's words; None: the chosen inputs."""
        if self.end is not None:
            return f"the {self.end.where}"
        if self.draw is not None:
            return f"random inputs {self.iteration} (sizes {self.draw.shapes()})"
        return None


class Comparison:
    """One diff, a step per method, as :class:`~trt_inline.verify.pipeline.Verification` is one verify: open both
    files, choose the inputs, plan the sets of inputs; then for each set run the reference B, run A against B's
    boundaries, compare boundary by boundary; on the chosen inputs, hold both to the inference-mode and layout runs
    and take the outputs; at an end of the ranges or on a random draw, record the run; at the first divergence, stop.
    Each step adds to one report."""

    def __init__(self, request: DiffRequest, tensors: dict[str, Any]) -> None:
        self.request, self.tensors = request, tensors
        self.criteria = request.tolerances.criteria()
        self.report = VerifyReport(
            source=f"{request.path_a} against {request.path_b}",
            expected_source=f"from {request.path_b}",
            allow_pickle=request.trust.allow_pickle,
        )
        self.device: str | None = None
        self.pairing = Pairing()  # A's outputs against B's by path (:meth:`open`)
        self.plan = range_ends.Plan()  # the runs at the ends of A's ranges (:meth:`input_sets`)
        self.ends_run: list[End] = []
        self.outputs: dict[str, Any] = {}  # both files' outputs on the chosen inputs (``keep_outputs``)

    def __call__(self) -> tuple[VerifyReport, dict[str, Any]]:
        """Every step in order; the report and both files' outputs on the chosen inputs."""
        trust, report = self.request.trust, self.report
        # (the policy given to what opens each file, and ambient once around the runs: the engine op's kernel reads it)
        with allowed_ops.allowing(trust.allow_ops, native_code=trust.allow_native_code):
            a, b = self.open()
            for inputs in self.input_sets(a, self.choose_inputs(a, b)):
                trace_b = self.run_reference(b, inputs)
                trace_a = None if trace_b is None else self.run(a, inputs, trace_b)
                if trace_a is None or trace_b is None:
                    continue
                rows, divergence = self.compare(a, b, trace_a, trace_b)
                if inputs.draw is None:
                    if trace_a.crash is None:
                        self.hold(a, b, inputs)
                    self.take(a, b, trace_a, trace_b, rows)
                else:
                    self.record(inputs, divergence)
                if divergence is not None:
                    self.diverged(inputs, rows, divergence)
                    break
            if self.ends_run:
                report.notes.append(self.plan.summary("each run by both files and compared boundary by boundary",
                                                      self.ends_run))  # fmt: skip
        return report, self.outputs

    # -- open ---------------------------------------------------------------------------------------------------

    def open(self) -> tuple[_File, _File]:
        """Both files opened through the strict reader with what the trust policy lets through (a package refused),
        each program's structure checked (notes: the other file is the reference), and A's output structure held to
        B's."""
        request, report = self.request, self.report
        paths = (request.path_a, request.path_b)
        opened = [open_trusted(path, request.trust) for path in paths]
        programs = [_program(loaded) for loaded in opened]
        modules = [loaded.module for loaded in opened]
        for path, program in zip(paths, programs, strict=True):
            problems, _ = structural_problems(program)
            report.notes += [f"{Path(path).name}: {problem}" for problem in problems]
        a, b = (
            _File(path, loaded, program, module, describe_spec(program.call_spec.out_spec))
            for path, loaded, program, module in zip(paths, opened, programs, modules, strict=True)
        )
        # What a caller reads: A's outputs under B's names (values are compared in B's order of paths: :meth:`take`).
        self.pairing = by_path(a.tree, b.tree, b.name)
        report.problems += self.pairing.problems
        return a, b

    # -- choose the inputs --------------------------------------------------------------------------------------

    def choose_inputs(self, a: _File, b: _File) -> _InputSet:
        """The inputs both run on: the given ones (held to what each program takes, as verify says it), else the
        reference inputs A embeds, else B's; and the device to run on (given, else where they were captured)."""
        tensors, device = self.tensors, self.request.inputs.device
        if tensors.get("args") is not None or tensors.get("kwargs"):
            args, kwargs = list(tensors.get("args") or ()), dict(tensors.get("kwargs") or {})
            self.device = device
            for file in (b, a):
                check_given_inputs(file.module, args, kwargs, file.path)
            return _InputSet(args, kwargs)
        for file in (a, b):
            embedded = file.loaded.reference
            if embedded is not None:
                self.device = device or capture_device(embedded)
                return _InputSet(embedded.args, embedded.kwargs)
        raise VerifyInputError(
            f"neither {a.path} nor {b.path} embeds reference inputs: give --inputs FILE (or arg_inputs)"
        )

    def input_sets(self, a: _File, chosen: _InputSet) -> list[_InputSet]:
        """The chosen inputs, then the ends of A's dynamic ranges, then random draws within them."""
        options, report = self.request.inputs, self.report
        sample = (chosen.args, chosen.kwargs)
        self.plan = range_ends.plan(a.program, sample, options.seed, options.range_ends)
        report.notes += self.plan.notes
        sets = [chosen, *(_InputSet(end.draw.args, end.draw.kwargs, end, end.draw) for end in self.plan.ends)]
        if options.random_inputs:
            draws = draw_inputs(a.program, options.random_inputs, options.seed, sample)
            sets += [_InputSet(draw.args, draw.kwargs, draw=draw, iteration=index) for index, draw in enumerate(draws)]
        return sets

    # -- run ----------------------------------------------------------------------------------------------------

    def run_reference(self, b: _File, inputs: _InputSet) -> ProgramTrace | None:
        """B's run, traced: the reference, which must complete; at an end of A's ranges that B does not run, None
        (a note: nothing to compare with, B declares other ranges)."""
        refused = None
        try:
            with b.loaded.reading_ahead():
                trace = trace_program(b.module, inputs.args, inputs.kwargs, self.device)
            if trace.crash is not None:
                refused = f"raised at {trace.crash.where(trace.calls)} ({trace.crash.error})"
        except RefusedOperatorError:
            raise
        except VerifyInputError as exc:
            if inputs.end is None:
                raise
            refused = f"refused them ({first_line(exc)})"
        if refused is None:
            return trace
        if inputs.end is not None:
            self.report.notes.append(f"not compared at the {inputs.end.label}: {b.name} {refused}")
            return None
        raise VerifyInputError(f"{b.path}: its program {refused}")

    def run(self, a: _File, inputs: _InputSet, trace_b: ProgramTrace) -> ProgramTrace | None:
        """A's run, traced against B's boundaries; None where it rejects the inputs at an end of its own ranges,
        which B accepts (a problem: A is wrong there)."""
        report = self.report
        try:
            with a.loaded.reading_ahead():
                return trace_program(a.module, inputs.args, inputs.kwargs, self.device, as_boundaries(trace_b))
        except RefusedOperatorError:
            raise
        except VerifyInputError as exc:
            end = inputs.end
            if end is None:
                raise
            problem = f"{a.name} rejected inputs within its declared ranges: {first_line(exc)}"
            report.range_end_runs.append({"end": end.name, "sizes": end.draw.shapes(), "symbols": end.draw.symbols,
                                          "ok": False, "problem": problem, "compared": False})  # fmt: skip
            report.problems.append(f"at the {end.where}: {problem}")
            self.ends_run.append(end)
            return None

    # -- compare and localize -----------------------------------------------------------------------------------

    def compare(
        self, a: _File, b: _File, trace_a: ProgramTrace, trace_b: ProgramTrace
    ) -> tuple[list[BoundaryRow], Divergence | None]:
        """A's run against B's boundary by boundary, engines paired by position (:func:`localize`); where they do
        not pair up, at the values both partitions hand between PyTorch and an engine (:func:`localize_partitions`).
        The rows and the first divergence."""
        report = self.report
        for file, trace in ((a, trace_a), (b, trace_b)):  # (as structural problems: notes here)
            report.notes += [note for p in trace.disagreements if (note := f"{file.name}: {p}") not in report.notes]
        if same_partition(trace_a, trace_b) or trace_a.crash is not None:
            return localize(trace_a, Reference(b.path, as_boundaries(trace_b), trace_b.outputs, trace_b), self.criteria)
        provenance = (_provenance(a.loaded), _provenance(b.loaded))
        rows, divergence, how = localize_partitions(trace_a, trace_b, b.path, self.criteria, provenance)
        if how not in report.notes:
            report.notes.append(how)
        return rows, divergence

    # -- on the chosen inputs -----------------------------------------------------------------------------------

    def hold(self, a: _File, b: _File, inputs: _InputSet) -> None:
        """As verify holds a program: the same bits under inference mode, and within tolerance on inputs laid out as
        a caller may (each trace was the checked normal call)."""
        report = self.report
        for file in (a, b):
            try:
                ran = run_on(file.module, inputs.args, inputs.kwargs, self.device,
                             layouts=not collectives_of(file.module), checked=False)  # fmt: skip
            except RefusedOperatorError:
                raise
            except VerifyInputError as exc:  # (it ran as the traced call: raising now is a mode of its own)
                report.problems.append(f"{file.name}: raises when run again ({first_line(exc)})")
                continue
            report.problems += [f"{file.name}: {problem}" for problem in ran.problems]

    def take(self, a: _File, b: _File, trace_a: ProgramTrace, trace_b: ProgramTrace, rows: list[BoundaryRow]) -> None:
        """The program outputs' row as the report's outputs, or A's outputs compared with B's at the same path
        where the two structure them otherwise (the row pairs by position what a caller reads under different
        names); their top-k agreement; the table; both files' outputs kept."""
        report, criteria = self.report, self.criteria
        report.outputs = rows[-1].values if trace_a.crash is None else []
        outputs_a, outputs_b = trace_a.outputs, trace_b.outputs
        # (a spec counts a None output as a value: paired by path only where the values are one per path)
        counts = (len(outputs_a), len(outputs_b)) == (len(a.tree.paths), len(b.tree.paths))
        paired = self.pairing.order is not None and counts
        if a.tree.structure != b.tree.structure and trace_a.crash is None and paired:
            report.outputs = [criteria.output(index, got, want, ranked=False)
                              for index, (got, want) in enumerate(zip(self.pairing.ordered(outputs_a), outputs_b,
                                                                      strict=True))]  # fmt: skip
            report.problems += [comparison.problem for comparison in report.outputs if comparison.problem]
        if criteria.top_k is not None:
            _rank_outputs(report, outputs_a, outputs_b, criteria)
        report.warnings += collapse_warnings(report.outputs, report.warnings)
        report.boundaries = rows
        self.outputs = {"a": outputs_a, "b": outputs_b}

    # -- at the ends of the ranges and random draws -------------------------------------------------------------

    def record(self, inputs: _InputSet, divergence: Divergence | None) -> None:
        """A run at an end of A's ranges or on a random draw, into the report's runs."""
        report, draw, end = self.report, inputs.draw, inputs.end
        assert draw is not None
        sizes, ok = draw.shapes(), divergence is None
        problem = None if divergence is None else f"first divergence: {divergence.where}"
        if end is not None:
            self.ends_run.append(end)
            report.range_end_runs.append({"end": end.name, "sizes": sizes, "symbols": draw.symbols, "ok": ok,
                                          "problem": problem, "compared": True})  # fmt: skip
        else:
            report.random_runs.append({"iteration": inputs.iteration, "sizes": sizes, "symbols": draw.symbols,
                                       "ok": ok, "problem": problem})  # fmt: skip

    # -- report -------------------------------------------------------------------------------------------------

    def diverged(self, inputs: _InputSet, rows: list[BoundaryRow], divergence: Divergence) -> None:
        """The first divergence, on whichever inputs it was found: its table, the engines' own errors, where."""
        report, on = self.report, inputs.on
        report.boundaries, report.divergence = rows, divergence
        if on is not None:
            report.boundaries_on = on
        report.problems += own_error_problems(rows)
        report.problems.append(f"first divergence{'' if on is None else f' ({on})'}: {divergence.where}")


@job(DiffRequest, response=VerifyReport)
def diff_job(request: DiffRequest, tensors: dict[str, Any]) -> Any:
    """:func:`diff` in this process (the child's job); with ``keep_outputs`` (``save_outputs``), the outputs of both
    as well."""
    report, outputs = Comparison(request, tensors)()
    report.notes += [note] if (note := stood_in_note()) else []
    if request.keep_outputs:
        return report.to_dict(), {"outputs": outputs}
    return report.to_dict()
