"""``diff``: two saves of one model run on the same inputs, compared at every engine boundary.

The second file is the reference: its run is traced first, and the first file's
run is compared with it boundary by boundary (:mod:`trt_inline.verify.localize`),
engines aligned by position and checked by signature; each engine of the first
file is also run alone on the second file's inputs to that engine. Files whose
engines do not pair up (partitioned differently) are compared at the values both
hand between PyTorch nodes and engines, matched by the exported node computing them. The report
names the first divergence in both files' words, e.g. a fallback region that
reads ``engine 1 output 1`` where the other file's reads ``engine 1 output 0``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from trt_inline import allowed_ops
from trt_inline.archive.loading import AOTI_PACKAGE, LoadedFile, open_file
from trt_inline.archive.reader import check_path
from trt_inline.distributed.manifest import collectives_of
from trt_inline.errors import RefusedOperatorError, VerifyInputError, first_line
from trt_inline.isolation import Limits, default_memory_limit
from trt_inline.output_tree import OutputTree, describe_spec, paired_by_path, structure_problems
from trt_inline.verify import range_ends
from trt_inline.verify.boundaries import as_boundaries, trace_program
from trt_inline.verify.compare import Criteria, ranked, run_on
from trt_inline.verify.jobs import DiffRequest
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
    Outputs,
    Tolerances,
    Trust,
    gather,
)
from trt_inline.verify.pipeline import capture_device, inputs_mismatch
from trt_inline.verify.random_inputs import Draw, draw_inputs
from trt_inline.verify.range_ends import End
from trt_inline.verify.report import OutputComparison, VerifyReport
from trt_inline.verify.structure import structural_problems
from trt_inline.verify.verifier import report_of_child, save_target, save_tensors

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # (typing has it from 3.11)
    from typing_extensions import Unpack

__all__ = ["diff", "diff_job"]


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
    return report_of_child(
        "diff", request, tensors, limits, where=os.fspath(path_a), files=(os.fspath(path_a), os.fspath(path_b)),
        sandbox=isolation.sandbox, debug=isolation.debug, verbose=isolation.verbose, save_outputs=save_outputs,
    )  # fmt: skip


def _program(loaded: LoadedFile) -> ExportedProgram:
    """The program whose run is compared: an ExportedProgram file's (a package's engines exist only compiled)."""
    return _checked(loaded).program  # type: ignore[return-value]


def _checked(loaded: LoadedFile) -> LoadedFile:
    """``loaded``, refused if it is a package (its engines exist only compiled)."""
    if loaded.kind == AOTI_PACKAGE or loaded.program is None:
        raise VerifyInputError(
            f"{loaded.path} is an AOTInductor package: its engines run inside its compiled code and the program it "
            "carries holds no weights, so there are no engine boundaries to compare; diff the ExportedProgram files "
            "saved from the same modules"
        )
    return loaded


def _provenance(loaded: LoadedFile) -> dict[str, Any] | None:
    """Which exported node each value between PyTorch and an engine is, as a file's save recorded (None: not)."""
    return loaded.reference.provenance if loaded.reference is not None else None


def _inputs(
    tensors: dict[str, Any], a: LoadedFile, b: LoadedFile
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], str | None]:
    """The inputs both run on, and the device their reference was captured on (None: where the program is)."""
    if tensors.get("args") is not None or tensors.get("kwargs"):
        return list(tensors.get("args") or ()), dict(tensors.get("kwargs") or {}), None
    for loaded in (a, b):
        if loaded.reference is not None:
            return loaded.reference.args, loaded.reference.kwargs, capture_device(loaded.reference)
    raise VerifyInputError(f"neither {a.path} nor {b.path} embeds reference inputs: give --inputs FILE (or arg_inputs)")


def _rank_outputs(
    report: VerifyReport, outputs_a: Sequence[Any], outputs_b: Sequence[torch.Tensor], k: int, minimum: float | None
) -> None:
    """The program outputs' top-``k`` agreement (``--top-k``), in place: the row of program outputs holds the same
    comparisons; an output below ``minimum`` is a problem."""
    for comparison in report.outputs:
        if comparison.index < min(len(outputs_a), len(outputs_b)):
            ranked(comparison, outputs_a[comparison.index], outputs_b[comparison.index], k, minimum)
            agreement = comparison.top_k_agreement
            if minimum is not None and agreement is not None and agreement < minimum and comparison.problem:
                report.problems.append(comparison.problem)
    if not any(comparison.top_k is not None for comparison in report.outputs):
        report.notes.append(f"--top-k {k}: no output was ranked (none is floating point with at least {k} values in "
                            "its last dimension)")  # fmt: skip


def _outputs_by_path(
    report: VerifyReport,
    outputs: tuple[Sequence[Any], Sequence[Any]],
    trees: tuple[OutputTree, OutputTree],
    criteria: Criteria,
) -> list[OutputComparison]:
    """The program outputs of A compared with B's at the same path, where the two structure them otherwise (the
    comparison by position of the last boundary row pairs what a caller reads under different names)."""
    order = paired_by_path(*trees)
    if order is None or any(len(values) != len(tree.paths) for values, tree in zip(outputs, trees, strict=True)):
        return report.outputs
    comparisons = [criteria.output(index, outputs[0][order[index]], want, ranked=False)
                   for index, want in enumerate(outputs[1])]  # fmt: skip
    report.problems += [comparison.problem for comparison in comparisons if comparison.problem]
    return comparisons


def diff_job(request: DiffRequest, tensors: dict[str, Any]) -> Any:
    """:func:`diff` in this process (the child's job); with ``keep_outputs`` (``save_outputs``), the outputs of both
    as well."""
    path_a, path_b = request.path_a, request.path_b
    inputs, tolerances, trust = request.inputs, request.tolerances, request.trust
    criteria = tolerances.criteria()
    atol, rtol, stat = criteria.atol, criteria.rtol, criteria.stat
    # (the policy given to what opens each file, and ambient once around the runs: the engine op's kernel reads it)
    with allowed_ops.allowing(trust.allow_ops, native_code=trust.allow_native_code):
        opened = [
            open_file(
                path,
                allow_pickle=trust.allow_pickle,
                allow_native_code=trust.allow_native_code,
                allow_ops=trust.allow_ops,
            )
            for path in (path_a, path_b)
        ]
        program_a, program_b = (_program(loaded) for loaded in opened)
        module_a, module_b = (loaded.module for loaded in opened)
        report = VerifyReport(source=f"{path_a} against {path_b}", expected_source=f"from {path_b}")
        report.allow_pickle = trust.allow_pickle
        for path, program in ((path_a, program_a), (path_b, program_b)):
            problems, _ = structural_problems(program)
            report.notes += [f"{Path(path).name}: {problem}" for problem in problems]
        # What a caller reads: A's outputs under B's names (values are compared in B's order of paths below).
        tree_a, tree_b = (describe_spec(program.call_spec.out_spec) for program in (program_a, program_b))
        report.problems += structure_problems(tree_a, tree_b, Path(path_b).name)
        args, kwargs, captured = _inputs(tensors, *opened)
        device = inputs.device or captured
        if tensors.get("args") is not None or tensors.get("kwargs"):  # (the user's: said as verify says it)
            for path, module in ((path_b, module_b), (path_a, module_a)):
                unlike = inputs_mismatch(module, args, kwargs, "given")
                if unlike is not None:
                    raise VerifyInputError(f"{path}: the program does not accept the given inputs: {unlike}")
        # Each set of inputs: the inputs above (None), then the ends of A's dynamic ranges, then random draws.
        sets: list[tuple[End | Draw | None, list[Any], dict[str, Any]]] = [(None, args, kwargs)]
        plan = range_ends.plan(program_a, (args, kwargs), inputs.seed, inputs.range_ends)
        report.notes += plan.notes
        sets += [(end, end.draw.args, end.draw.kwargs) for end in plan.ends]
        if inputs.random_inputs:
            draws = draw_inputs(program_a, inputs.random_inputs, inputs.seed, (args, kwargs))
            sets += [(draw, draw.args, draw.kwargs) for draw in draws]
        ends_run: list[End] = []
        iteration = -1  # (of the random draws)
        for what, run_args, run_kwargs in sets:
            end = what if isinstance(what, End) else None
            draw = what.draw if isinstance(what, End) else what
            iteration += isinstance(what, Draw)
            refused = None
            try:
                with opened[1].reading_ahead():
                    trace_b = trace_program(module_b, run_args, run_kwargs, device)
                if trace_b.crash is not None:
                    refused = f"raised at {trace_b.crash.where(trace_b.calls)} ({trace_b.crash.error})"
            except RefusedOperatorError:
                raise
            except VerifyInputError as exc:
                if end is None:
                    raise
                refused = f"refused them ({first_line(exc)})"
            if refused is not None and end is not None:  # (B declares other ranges: nothing to compare with)
                report.notes.append(f"not compared at the {end.label}: {Path(path_b).name} {refused}")
                continue
            if refused is not None:  # the reference of the comparison: a run of it must complete
                raise VerifyInputError(f"{path_b}: its program {refused}")
            try:
                with opened[0].reading_ahead():
                    trace_a = trace_program(module_a, run_args, run_kwargs, device, as_boundaries(trace_b))
            except RefusedOperatorError:
                raise
            except VerifyInputError as exc:
                if end is None:
                    raise
                # A size A's own ranges declare, which B accepts: A is wrong there.
                problem = f"{Path(path_a).name} rejected inputs within its declared ranges: {first_line(exc)}"
                report.range_end_runs.append({"end": end.name, "sizes": end.draw.shapes(), "symbols": end.draw.symbols,
                                              "ok": False, "problem": problem, "compared": False})  # fmt: skip
                report.problems.append(f"at the {end.where}: {problem}")
                ends_run.append(end)
                continue
            for path, trace in ((path_a, trace_a), (path_b, trace_b)):  # (as structural problems: notes here)
                report.notes += [
                    note for p in trace.disagreements if (note := f"{Path(path).name}: {p}") not in report.notes
                ]
            if same_partition(trace_a, trace_b) or trace_a.crash is not None:
                reference = Reference(path_b, as_boundaries(trace_b), trace_b.outputs, trace_b)
                rows, divergence = localize(trace_a, reference, atol, rtol, stat)
            else:  # engines cannot be paired: compared where both partitions cut
                provenance = (_provenance(opened[0]), _provenance(opened[1]))
                rows, divergence, how = localize_partitions(trace_a, trace_b, path_b, atol, rtol, stat, provenance)
                if how not in report.notes:
                    report.notes.append(how)
            if draw is None and trace_a.crash is None:
                # As verify holds a program: the same bits under inference mode, and within tolerance on inputs laid
                # out as a caller may (each trace above was the checked normal call).
                for path, module in ((path_a, module_a), (path_b, module_b)):
                    try:
                        ran = run_on(module, run_args, run_kwargs, device, layouts=not collectives_of(module),
                                     checked=False)  # fmt: skip
                    except RefusedOperatorError:
                        raise
                    except VerifyInputError as exc:  # (it ran as the traced call: raising now is a mode of its own)
                        report.problems.append(f"{Path(path).name}: raises when run again ({first_line(exc)})")
                        continue
                    report.problems += [f"{Path(path).name}: {problem}" for problem in ran.problems]
            if draw is None:
                report.outputs = rows[-1].values if trace_a.crash is None else []
                if tree_a.structure != tree_b.structure and trace_a.crash is None:
                    report.outputs = _outputs_by_path(
                        report, (trace_a.outputs, trace_b.outputs), (tree_a, tree_b), criteria
                    )
                if tolerances.top_k is not None:
                    _rank_outputs(report, trace_a.outputs, trace_b.outputs, tolerances.top_k,
                                  tolerances.min_top_k_agreement)  # fmt: skip
                report.boundaries = rows
                outputs = {"a": trace_a.outputs, "b": trace_b.outputs}
            else:
                run = {
                    "sizes": draw.shapes(),
                    "symbols": draw.symbols,
                    "ok": divergence is None,
                    "problem": None if divergence is None else f"first divergence: {divergence.where}",
                }
                if end is not None:
                    ends_run.append(end)
                    report.range_end_runs.append({"end": end.name, **run, "compared": True})
                else:
                    report.random_runs.append({"iteration": iteration, **run})
            if divergence is not None:
                report.boundaries, report.divergence = rows, divergence
                on = None
                if end is not None:
                    on = f"the {end.where}"
                elif draw is not None:
                    on = f"random inputs {iteration} (sizes {draw.shapes()})"
                if on is not None:
                    report.boundaries_on = on
                report.problems += own_error_problems(rows)
                report.problems.append(f"first divergence{'' if on is None else f' ({on})'}: {divergence.where}")
                break
        if ends_run:
            report.notes.append(plan.summary("each run by both files and compared boundary by boundary", ends_run))
    if request.keep_outputs:
        return report.to_dict(), {"outputs": outputs}
    return report.to_dict()
