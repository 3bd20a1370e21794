"""One verification, a step per method: open the file, choose the reference, run, compare, localize, run more.

:class:`Verification` is what ``verify`` does wherever it runs: in the sandboxed child (``verify_job``),
in the caller's process (``isolate=False``, an ExportedProgram given directly), one rank of a rank set,
one case of ``--cases``. Each step reads what the previous ones found and adds to one report; what the
caller asked to have handed back besides the report (the outputs, the run recorded engine by engine, the
divergent engine as a program of its own, the runs at the ends of the ranges) is collected in
:class:`Handed`, typed, rather than in lists passed in. The trust policy is explicit: it is given to
what opens the file, and entered as ambient state once, around the steps, since the engine op's kernel,
called by torch, is where it is read.

::

    open ──> choose the reference ──> run ──> compare ──> localize ──> more runs ──> report, handed
      │               │                 │                 (an output    (ends of the
      │               └─ none: report   └─ raised on its   differs, or    ranges, random
      └─ structure, rank check             own inputs:     --per-engine)  inputs)
                                           localize the crash
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from trt_inline import allowed_ops, distributed, progress
from trt_inline.archive.loading import AOTI_PACKAGE, LoadedFile, open_file
from trt_inline.archive.reference_io import (
    EngineBoundary,
    ReferenceIO,
    decode_boundaries_file,
    is_boundaries_file,
    tensors_only,
)
from trt_inline.distributed import relay as rank_relay
from trt_inline.distributed.manifest import collectives_of, decode_manifest, program_mismatch, rank_check_problem
from trt_inline.errors import RefusedOperatorError, VerifyInputError, first_line
from trt_inline.inlining.module_state import buffers_restored
from trt_inline.isolation import is_allocation_failure
from trt_inline.output_tree import OutputTree, by_path, describe, is_flat
from trt_inline.package import load_package
from trt_inline.verify import range_ends
from trt_inline.verify.boundaries import ProgramTrace, as_boundaries, recording, trace_program
from trt_inline.verify.checked_run import ProgramInputs
from trt_inline.verify.compare import Criteria, Run, normal_call, run_on, say_unranked
from trt_inline.verify.extract import diverged_engine, diverged_value, engine_repro, region_repro
from trt_inline.verify.garbage import Sightings, garbage_warnings
from trt_inline.verify.localize import Reference as BoundaryReference
from trt_inline.verify.localize import localize, own_error_problems
from trt_inline.verify.options import Inputs, Reference, Tolerances, Trust
from trt_inline.verify.random_inputs import draw_inputs
from trt_inline.verify.report import VerifyReport, describe_value
from trt_inline.verify.structure import structural_problems

__all__ = [
    "Handed", "Keep", "Verification", "capture_device", "check_given_inputs", "given_tree", "inputs_mismatch",
    "module_differs", "open_trusted", "range_end_runs",
]  # fmt: skip


@dataclass(frozen=True)
class Keep:
    """What the caller wants handed back besides the report (a child's parent writes or compares them)."""

    outputs: bool = False  # the outputs on the reference inputs (save_outputs)
    recorded_run: bool = False  # this run, engine by engine (save_boundaries)
    repro: bool = False  # the divergent engine or region as a program of its own (extract)
    range_ends: bool = False  # the runs at the ends of the ranges, for the caller's expected_module


@dataclass
class Handed:
    """What a verification hands back besides its report, as :class:`Keep` asked."""

    outputs: list[Any] | None = None
    recorded_run: ReferenceIO | None = None
    repro: list[tuple[str, bytes]] = field(default_factory=list)  # (what, archive)
    range_ends: list[dict[str, Any]] = field(default_factory=list)  # index, args, kwargs, outputs


@dataclass
class _Opened:
    """The open step's result: the file's program, what runs it, and the reference I/O it embeds."""

    loaded: LoadedFile | None
    program: ExportedProgram | None
    module: torch.fx.GraphModule | None
    embedded: ReferenceIO | None
    source: str


@dataclass
class _Chosen:
    """The reference step's result: the inputs to run on and what the outputs are held to (``want`` None: inputs
    alone, nothing compared)."""

    args: list[Any]
    kwargs: dict[str, Any]
    want: list[Any] | None
    want_tree: OutputTree | None = None
    recorded: list[EngineBoundary] | None = None
    device: str | None = None
    reference_program: torch.fx.GraphModule | None = None  # --expected-from's own program (the ends' reference)


class Verification:
    """One verification of a file or program with the option groups it was given.

    ``recorded``: the compiled module's engine boundaries the parent recorded (``expected_module`` with
    ``per_engine``); ``expected_tree``: the structure of the given expected outputs; ``collectives``: whether
    the file's collectives may run (one rank of a rank set, in its child or in the caller's process group).
    """

    def __init__(
        self,
        inputs: Inputs,
        reference: Reference,
        tolerances: Tolerances,
        trust: Trust,
        keep: Keep = Keep(),
        *,
        recorded: list[EngineBoundary] | None = None,
        expected_tree: OutputTree | None = None,
        collectives: bool = False,
    ) -> None:
        self.inputs, self.reference, self.trust, self.keep = inputs, reference, trust, keep
        self.criteria = tolerances.criteria()
        self.recorded, self.expected_tree, self.collectives = recorded, expected_tree, collectives
        self.handed = Handed()
        self.report = VerifyReport(source="<ExportedProgram>", allow_pickle=trust.allow_pickle)

    def __call__(self, path_or_program: str | os.PathLike[str] | ExportedProgram) -> tuple[VerifyReport, Handed]:
        """Every step in order; the report and what it hands back."""
        trust = self.trust
        with (
            allowed_ops.allowing(trust.allow_ops, native_code=trust.allow_native_code, collectives=self.collectives),
            contextlib.ExitStack() as cleanup,
        ):
            opened = self.open(path_or_program, cleanup)
            chosen = self.choose_reference(opened)
            if chosen is None:
                return self.report, self.handed
            runnable = self.runnable(opened)
            if runnable is None:
                return self.report, self.handed
            rank_file_here = _rank_file_checks(opened.loaded, opened.module)
            run = self.run(opened, chosen, runnable)
            if run is None:
                return self.report, self.handed
            rank_file = (
                rank_file_here
                or rank_relay.client() is not None
                or (opened.loaded is not None and opened.loaded.manifest_text is not None)
            )
            got = self.take(opened, chosen, runnable, run)
            sightings = [run.sightings] if run.sightings is not None else []
            if chosen.want is not None:
                mismatch = self.compare(got, chosen)
                if rank_relay.any_rank(
                    self.reference.per_engine or (mismatch and chosen.recorded is not None), in_process=rank_file_here
                ):  # (every rank of a rank set takes this branch or none does: its replays run collectives)
                    self.localize(opened, chosen)
            self.more_runs(opened, chosen, runnable, run, sightings, rank_file=rank_file)
            self.report.warnings += garbage_warnings(sightings)
            return self.report, self.handed

    # -- open ---------------------------------------------------------------------------------------------------

    def open(self, path_or_program: str | os.PathLike[str] | ExportedProgram, cleanup: contextlib.ExitStack) -> _Opened:
        """The file opened through the strict reader (or the program given), its structure checked, and what
        was let through or left unread said; its read-ahead stopped when ``cleanup`` closes."""
        trust, report = self.trust, self.report
        if isinstance(path_or_program, ExportedProgram):
            opened = _Opened(None, path_or_program, path_or_program.module(), None, "<ExportedProgram>")
        else:
            loaded = open_trusted(path_or_program, trust, read_ahead=True)
            cleanup.callback(loaded.stop_reading_ahead)
            module = loaded.module if loaded.program is not None and loaded.kind != AOTI_PACKAGE else None
            opened = _Opened(loaded, loaded.program, module, loaded.reference, os.fspath(path_or_program))
        report.source = opened.source
        file = opened.loaded
        if opened.program is not None:
            report.problems, report.notes = structural_problems(opened.program)
        else:
            report.notes.append("the package carries no ExportedProgram: its graph was not checked, only its outputs")
        if file is not None and file.program is not None and file.manifest_text is not None:
            report.problems += _carried_rank_check(file.program, file.manifest_text, str(file.path))
        if file is not None and file.unread:
            report.notes.append(f"extra files not read (they are never loaded as code): {', '.join(file.unread)}")
        if file is not None and file.passthrough:
            report.notes.append(
                "passed to torch as they are (allowed by --allow-pickle / --allow-native-code): "
                + ", ".join(file.passthrough)
            )
        if trust.allow_pickle:
            report.notes.append(
                "pickles in the file were allowed (allow_pickle): only for a file from a trusted source"
            )
        return opened

    # -- choose the reference -----------------------------------------------------------------------------------

    def choose_reference(self, opened: _Opened) -> _Chosen | None:
        """What the outputs are held to, in order of preference: the given expected outputs, ``expected_module``,
        ``expected_from``'s reference I/O, none (inputs alone), the file's own; None where there is nothing to run
        on (said in the report)."""
        inputs, reference, report = self.inputs, self.reference, self.report
        arg_inputs, embedded = inputs.arg_inputs, opened.embedded
        kwargs = dict(inputs.kwarg_inputs or {})
        device = inputs.device
        if reference.expected is not None:
            if arg_inputs is None and not kwargs:
                raise VerifyInputError("expected outputs were given without the inputs they belong to")
            report.expected_source = "given"
            tree = self.expected_tree if self.expected_tree is not None else given_tree(reference.expected)
            want = tensors_only(reference.expected, "expected outputs")
            return _Chosen(list(arg_inputs or ()), kwargs, want, tree, self.recorded, device)
        if reference.expected_module is not None:
            expected_module = reference.expected_module
            if arg_inputs is None and embedded is None:
                raise VerifyInputError("expected_module needs arg_inputs (the file embeds no inputs)")
            args = list(arg_inputs) if arg_inputs is not None else embedded.args  # type: ignore[union-attr]
            kwargs = kwargs or (embedded.kwargs if embedded is not None and arg_inputs is None else {})
            returned, recorded = run_expected_module(expected_module, args, kwargs, per_engine=reference.per_engine)
            report.expected_source = "module"
            return _Chosen(args, kwargs, tensors_only(returned, "expected outputs"), describe(returned), recorded,
                           device)  # fmt: skip
        if reference.expected_from is not None:
            other = os.fspath(reference.expected_from)
            newer, reference_program = _reference_of(other, self.trust)
            if opened.program is not None:
                _check_signature(opened.program, opened.module, opened.source, newer, other)
            report.expected_source = f"from {other}"
            return _Chosen(newer.args, newer.kwargs, newer.outputs, newer.output_tree, newer.boundaries,
                           device or capture_device(newer), reference_program)  # fmt: skip
        if arg_inputs is not None or kwargs:
            # Inputs alone: does it run on them? Its values are held to their declarations and looked at for
            # garbage; nothing is compared (UNVERIFIED).
            if reference.per_engine:
                raise VerifyInputError(
                    "--per-engine compares each engine with a reference: give --expected with --inputs, or "
                    "--expected-from"
                )
            report.notes.append(
                "ran on the given inputs, with no expected outputs: its values were held to their declarations "
                "and checked for garbage (all zeros, NaN), its outputs were not compared"
            )
            return _Chosen(list(arg_inputs or ()), kwargs, None, recorded=self.recorded, device=device)
        if embedded is not None:
            report.expected_source = "embedded"
            return _Chosen(embedded.args, embedded.kwargs, embedded.outputs, embedded.output_tree, embedded.boundaries,
                           device or capture_device(embedded))  # fmt: skip
        report.notes.append("no reference I/O: outputs were not compared (give inputs and expected outputs)")
        return None

    def runnable(self, opened: _Opened) -> Callable[..., Any] | None:
        """What runs the program: its module, or a package's AOTInductor model (native code: only where allowed);
        None where a package's program failed its checks (said)."""
        if opened.loaded is not None and opened.loaded.kind == AOTI_PACKAGE:
            if self.report.problems:
                self.report.notes.append("the package was not run: the program it carries failed the structural checks")
                return None
            return _package_model(opened.loaded, self.report, self.trust.allow_native_code)
        assert opened.module is not None  # only a package can lack its program
        return opened.module

    # -- run ----------------------------------------------------------------------------------------------------

    def _user_inputs(self) -> bool:
        return self.inputs.arg_inputs is not None and self.report.expected_source in ("given", "module", "none")

    def run(self, opened: _Opened, chosen: _Chosen, runnable: Callable[..., Any]) -> Run | None:
        """One run on the chosen inputs (checked against what the program takes where they are the user's); None
        where it raised on the file's own inputs and where was localized instead."""
        module, loaded, report = opened.module, opened.loaded, self.report
        user_inputs = self._user_inputs()
        if user_inputs and module is not None:
            check_given_inputs(module, chosen.args, chosen.kwargs, opened.source)
        progress.report("running the program on the " + ("given inputs" if user_inputs else "reference inputs"))
        try:
            with loaded.reading_ahead() if loaded is not None else contextlib.nullcontext():
                # (Not where the program calls collectives: every rank must make the same runs.)
                layouts = module is None or not collectives_of(module)
                run = run_on(runnable, chosen.args, chosen.kwargs, chosen.device, layouts=layouts,
                             run_name="on the given inputs" if user_inputs else "on the reference inputs")  # fmt: skip
        except RefusedOperatorError:
            raise  # (a call its values made unsafe to run: refused as the file's operators are, not a crash)
        except VerifyInputError as exc:
            # Inputs the file itself carries (or a run of the compiled module recorded) are not unusable input:
            # a program that raises on them is wrong, and where it raises is found boundary by boundary.
            own_inputs = chosen.recorded is not None or report.expected_source == "embedded"
            rank_file = loaded is not None and loaded.manifest_text is not None
            if (not own_inputs or rank_file or runnable is not module or module is None or chosen.want is None
                    or is_allocation_failure(exc)):  # fmt: skip
                raise
            _localize_crash(report, module, chosen, self.criteria, exc, self._repro())
            return None
        return run

    def take(self, opened: _Opened, chosen: _Chosen, runnable: Callable[..., Any], run: Run) -> list[Any]:
        """The run's outputs in the reference's order (paired by path), its problems, notes and warnings into the
        report; its outputs and its run engine by engine kept where asked for."""
        report, got = self.report, run.outputs
        if chosen.want is not None:
            pairing = by_path(run.tree, chosen.want_tree)
            report.problems += pairing.problems
            report.notes += pairing.notes
            got = pairing.ordered(run.outputs)
        report.problems.extend(run.problems)
        report.notes.extend(run.notes)
        report.warnings += run.warnings
        progress.report(f"comparing {len(got)} output{'' if len(got) == 1 else 's'}")
        if self.keep.outputs:
            self.handed.outputs = tensors_only(got, "outputs")
        if self.keep.recorded_run:
            self.handed.recorded_run = _recorded_run(opened.module, runnable, chosen.args, chosen.kwargs,
                                                     chosen.device, report.source)  # fmt: skip
        return got

    def _repro(self) -> list[tuple[str, bytes]] | None:
        return self.handed.repro if self.keep.repro else None

    # -- compare ------------------------------------------------------------------------------------------------

    def compare(self, got: list[Any], chosen: _Chosen) -> bool:
        """The outputs (paired with the reference's by path) compared one by one; whether one differs."""
        report, criteria = self.report, self.criteria
        assert chosen.want is not None
        want = chosen.want
        if len(got) != len(want):
            report.problems.append(f"the program returns {len(got)} outputs, the reference {len(want)}")
        for index, (actual, reference_output) in enumerate(zip(got, want, strict=False)):
            comparison = criteria.output(index, actual, reference_output)
            report.outputs.append(comparison)
            if comparison.problem:
                report.problems.append(comparison.problem)
        top_k = criteria.top_k
        if top_k is not None:
            say_unranked(report, top_k, criteria.min_top_k_agreement)
        return any(not o.ok for o in report.outputs)

    # -- localize -----------------------------------------------------------------------------------------------

    def localize(self, opened: _Opened, chosen: _Chosen) -> None:
        """Engine by engine against the recorded boundaries: the table and the first divergence (asked for with
        ``per_engine``, or by itself where an output differs and boundary data is at hand)."""
        per_engine, loaded = self.reference.per_engine, opened.loaded
        assert chosen.want is not None
        try:
            with loaded.reading_ahead() if loaded is not None else contextlib.nullcontext():
                _compare_boundaries(
                    self.report, opened.module, chosen, self.criteria, automatic=not per_engine,
                    packaged=loaded is not None and loaded.kind == AOTI_PACKAGE, repro=self._repro(),
                )  # fmt: skip
        except VerifyInputError as exc:
            if per_engine:
                raise
            # Asked for nothing more than outputs: their mismatch stands, with why engines could not be compared.
            self.report.notes.append(f"engine by engine comparison not possible: {exc}")

    # -- more runs ----------------------------------------------------------------------------------------------

    def more_runs(
        self,
        opened: _Opened,
        chosen: _Chosen,
        runnable: Callable[..., Any],
        run: Run,
        sightings: list[Sightings],
        *,
        rank_file: bool,
    ) -> None:
        """The runs at the ends of the declared dynamic ranges, then on random inputs within them."""
        inputs, reference, report = self.inputs, self.reference, self.report
        compared = chosen.want is not None
        expected_module = reference.expected_module if compared else None
        sample = (chosen.args, chosen.kwargs)
        range_end_runs(
            report, opened.program, runnable, sample, inputs.range_ends, inputs.seed, chosen.device, run.outputs,
            expected_module, self.criteria, sightings, rank_file=rank_file,
            kept=self.handed.range_ends if self.keep.range_ends and compared else None,
            reference_program=chosen.reference_program,
            reference_file=None if reference.expected_from is None else os.fspath(reference.expected_from),
        )  # fmt: skip
        if inputs.random_inputs:
            _random_runs(report, opened.program, runnable, sample, inputs.random_inputs, inputs.seed, chosen.device,
                         expected_module, self.criteria, sightings)  # fmt: skip


def given_tree(expected: Any) -> OutputTree | None:
    """The structure of expected outputs a caller gave: None where they are a tensor or a flat list or tuple of
    values (nothing says how a caller reads them), else how they are nested (a dict of ``torch.save``)."""
    return None if is_flat(expected) else describe(expected)


def _compare_boundaries(
    report: VerifyReport,
    module: torch.fx.GraphModule | None,
    chosen: _Chosen,
    criteria: Criteria,
    *,
    automatic: bool,
    packaged: bool,
    repro: list[tuple[str, bytes]] | None = None,
) -> None:
    """Engine by engine against the recorded boundaries: the per-boundary table and the first divergence."""
    recorded, args, kwargs, want, device = chosen.recorded, chosen.args, chosen.kwargs, chosen.want, chosen.device
    assert want is not None
    if recorded is None:
        raise VerifyInputError(
            f"{report.source}: no engine boundary data to compare with (save with embed_reference='boundaries', "
            "or TRT_INLINE_REFERENCE_IO=boundaries for torch_tensorrt.save, or give the compiled module)"
        )
    if module is None or packaged:
        # A package's engines exist only inside its compiled code; the program it carries has no weights.
        why = (
            f"{report.source} is an AOTInductor package: its engines run inside its compiled code and the program "
            "it carries holds no weights, so there are no engine boundaries to compare; compare the ExportedProgram "
            "file saved from the same module (output_format='exported_program')"
        )
        if not automatic:
            raise VerifyInputError(why)
        report.notes.append(why)
        return
    if automatic:
        report.notes.append("an output differs and boundary data is embedded: compared engine by engine")
    trace = trace_program(module, args, kwargs, device, recorded)
    _localized(report, trace, recorded, want, criteria, module, ProgramInputs(module).flatten(args, kwargs), repro)


def _recorded_run(
    module: torch.fx.GraphModule | None,
    runnable: Callable[..., Any],
    args: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    device: str | None,
    source: str,
) -> ReferenceIO:
    """This run's inputs, outputs and engine boundaries (``save_boundaries``), run again engine by engine."""
    if module is None or runnable is not module:
        raise VerifyInputError(f"{source}: an AOTInductor package's engines run inside its compiled code: "
                               "there are no engine boundaries to save")  # fmt: skip
    progress.report("recording every engine boundary")
    trace = trace_program(module, args, kwargs, device)
    if trace.crash is not None:
        raise VerifyInputError(
            f"{source}: the program raised at {trace.crash.where(trace.calls)} ({trace.crash.error})"
        )
    return ReferenceIO(
        [a.detach().cpu() for a in args], {k: v.detach().cpu() for k, v in kwargs.items()},
        tensors_only(trace.outputs, "outputs"), device or "cpu", boundaries=as_boundaries(trace),
    )  # fmt: skip


def _localized(
    report: VerifyReport,
    trace: ProgramTrace,
    recorded: list[EngineBoundary],
    want: list[torch.Tensor],
    criteria: Criteria,
    module: torch.fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    repro: list[tuple[str, bytes]] | None = None,
) -> None:
    """The trace against the compiled module's boundaries, into the report: the table and the first divergence
    (inside it, for a reference engine: the first op whose own error crosses its tolerance,
    :mod:`~trt_inline.verify.drill`)."""
    reference = BoundaryReference("the compiled module", recorded, want)
    report.boundaries, report.divergence = localize(trace, reference, criteria)
    report.problems += own_error_problems(report.boundaries)
    if report.divergence is not None:
        report.problems.append(f"first divergence: {report.divergence.where}")
    if repro is not None:
        _extract(report, trace, recorded, want, module, inputs, repro)


def _extract(
    report: VerifyReport,
    trace: ProgramTrace,
    recorded: list[EngineBoundary],
    want: list[torch.Tensor],
    module: torch.fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    repro: list[tuple[str, bytes]],
) -> None:
    """The divergent engine or fallback region as a program of its own (``extract``): appended to ``repro``."""
    index = diverged_engine(report.divergence)
    fed = diverged_value(report.divergence)
    try:
        if index is not None and index < len(trace.calls) and index < len(recorded):
            call = trace.calls[index]
            repro.append((f"engine {index} ({call.label})", engine_repro(module, call.node, recorded[index])))
            return
        if fed is not None and report.divergence is not None:
            what = report.divergence.where.split(" (feeding ")[0]
            repro.append((what, region_repro(module, fed, recorded, inputs, want)))
            return
    except VerifyInputError as exc:
        report.notes.append(f"nothing extracted: {exc}")
        return
    where = report.divergence.where if report.divergence is not None else "none"
    report.notes.append(
        f"nothing extracted: --extract writes a diverging engine or fallback region, and the divergence is {where}"
    )


def _localize_crash(
    report: VerifyReport,
    module: torch.fx.GraphModule,
    chosen: _Chosen,
    criteria: Criteria,
    failure: VerifyInputError,
    repro: list[tuple[str, bytes]] | None = None,
) -> None:
    """The program raised on its own reference inputs: the report names where, engine by engine where it can."""
    recorded, args, kwargs, want, device = chosen.recorded, chosen.args, chosen.kwargs, chosen.want, chosen.device
    assert want is not None
    cause = failure.__cause__ or failure
    report.problems.append(f"the program raises on its reference inputs ({type(cause).__name__}: {first_line(cause)})")
    progress.report("the run raised: walking the program boundary by boundary to where it did")
    try:
        trace = trace_program(module, args, kwargs, device, recorded)
    except VerifyInputError:
        return  # (the call refused its own inputs before any node ran: the problem above says how)
    if trace.crash is None:  # it ran this time (a program that raises only sometimes is wrong too)
        report.notes.append("run again node by node, the program did not raise")
        return
    if recorded is None:
        where = trace.crash.where(trace.calls)
        report.problems.append(f"it raised at {where}: {trace.crash.error}")
        report.notes.append("the file has no boundary data (embed_reference='boundaries'): engines not compared")
        return
    _localized(report, trace, recorded, want, criteria, module, ProgramInputs(module).flatten(args, kwargs), repro)


def _carried_rank_check(program: ExportedProgram, manifest_text: str, path: str) -> list[str]:
    """A rank file's own rank check against its manifest, checked in every verify (where the check is, and that
    there is one, are structural checks: :func:`~trt_inline.verify.structure.check_rank_check`)."""
    if rank_check_problem(program.graph_module) is not None:
        return []  # (said by the structural check)
    try:
        problem = rank_check_problem(program.graph_module, decode_manifest(manifest_text, path))
    except VerifyInputError as exc:
        return [str(exc)]
    return [] if problem is None else [f"{path}: {problem}"]


def _rank_file_checks(loaded: LoadedFile | None, module: torch.fx.GraphModule | None) -> bool:
    """A rank file's checks before its run; whether it is run in this process, as one rank of a live rank set.

    In a rank-set child: the manifest must describe the program, and every rank
    must be ready (:func:`trt_inline.distributed.relay.checkpoint`). In a process
    of a live rank set (``isolate=False``, a trusted file): also this process
    must be the rank it was saved as, and its collectives are pointed at this
    job's groups.
    """
    text = loaded.manifest_text if loaded is not None else None
    relayed = rank_relay.client() is not None
    refusal = None
    in_process = False
    if (
        loaded is not None
        and text is not None
        and loaded.program is not None
        and (relayed or distributed.in_rank_set())
    ):
        manifest = decode_manifest(text, str(loaded.path))
        refusal = program_mismatch(manifest, loaded.program.graph_module, str(loaded.path))
        if not relayed:
            if refusal is not None:
                raise VerifyInputError(refusal)
            distributed.refuse_foreign(manifest, str(loaded.path))
            if module is not None:
                distributed.rebind_groups(module, manifest)
            in_process = True
    rank_relay.checkpoint(text, refusal)
    return in_process


def _random_runs(
    report: VerifyReport,
    program: ExportedProgram | None,
    runnable: Callable[..., Any],
    sample: tuple[Sequence[Any], dict[str, Any]],
    count: int,
    seed: int,
    device: str | None,
    expected_module: Callable[..., Any] | None,
    criteria: Criteria,
    sightings: list[Sightings],
) -> None:
    """Runs on inputs drawn within the declared ranges: each must be accepted and give finite outputs.

    With ``expected_module`` (in this process) each run is also compared with what it returns. Each run's
    sightings are appended to ``sightings`` (for :func:`~trt_inline.verify.garbage.garbage_warnings`).
    """
    if program is None:
        raise VerifyInputError(
            "random inputs are drawn within the program's declared ranges: this package carries no ExportedProgram"
        )
    for iteration, draw in enumerate(draw_inputs(program, count, seed, sample)):
        progress.report("running on random inputs", (iteration + 1, count))
        problem = None
        try:
            collectives = isinstance(runnable, torch.nn.Module) and bool(collectives_of(runnable))
            ran = run_on(
                runnable,
                draw.args,
                draw.kwargs,
                device,
                layouts=not collectives,
                run_name=f"on random inputs {iteration}",
            )
            outputs, mode_problems = ran.outputs, ran.problems
            report.warnings += [w for w in ran.warnings if w not in report.warnings]
            if ran.sightings is not None:
                sightings.append(ran.sightings)
        except VerifyInputError as exc:
            problem = f"rejected inputs within its declared ranges: {exc}"
        else:
            bad = [str(i) for i, out in enumerate(outputs) if not _finite(out)]
            if mode_problems:
                problem = "; ".join(mode_problems)
            elif bad:
                problem = f"NaN or Inf in output {', '.join(bad)}"
            elif expected_module is not None:
                problem = module_differs(outputs, expected_module, draw.args, draw.kwargs, criteria)
        report.random_runs.append({"iteration": iteration, "sizes": draw.shapes(), "symbols": draw.symbols,
                                   "ok": problem is None, "problem": problem})  # fmt: skip
        if problem is not None:
            report.problems.append(f"random inputs {iteration} (sizes {draw.shapes()}): {problem}")
    if expected_module is not None:
        report.notes.append(f"{count} runs on random inputs (seed {seed}) were compared with expected_module")
        return
    report.notes.append(
        f"{count} runs on random inputs (seed {seed}) within the declared ranges were checked to be accepted and to "
        "give finite outputs, nothing more: one file has no reference outputs for them, so a wrong value (a fault "
        "that shows only at other sizes) passes; trt-inline diff A B --random-inputs N compares two files on them"
    )


def run_expected_module(
    module: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], *, per_engine: bool
) -> tuple[Any, Any]:
    """What ``expected_module`` returns on the inputs (run as a normal call, its buffers put back afterwards, its
    outputs apart from them), and with ``per_engine`` its engine boundaries recorded (else None)."""
    with (
        recording(module if per_engine else None) as records,
        normal_call(),
        buffers_restored(module) as restored,
    ):
        returned = restored.apart(module(*args, **kwargs))
    return returned, records if per_engine else None


def module_differs(
    outputs: Sequence[Any],
    expected_module: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    criteria: Criteria,
) -> str | None:
    """How ``outputs`` differ from what ``expected_module`` returns for the same inputs; None where they agree."""
    with normal_call(), buffers_restored(expected_module) as restored:
        want = tensors_only(restored.apart(expected_module(*args, **kwargs)), "expected outputs")
    differ = [
        c.problem
        for i, (got, ref) in enumerate(zip(outputs, want, strict=False))
        if (c := criteria.output(i, got, ref, ranked=False)).problem
    ]
    if len(outputs) != len(want):
        differ.append(f"{len(outputs)} outputs, the module {len(want)}")
    return "; ".join(p for p in differ if p) or None


def range_end_runs(
    report: VerifyReport,
    program: ExportedProgram | None,
    runnable: Callable[..., Any],
    sample: tuple[Sequence[Any], dict[str, Any]],
    mode: str,
    seed: int,
    device: str | None,
    baseline: Sequence[Any],
    expected_module: Callable[..., Any] | None,
    criteria: Criteria,
    sightings: list[Sightings],
    *,
    rank_file: bool,
    kept: list[dict[str, Any]] | None = None,
    reference_program: torch.fx.GraphModule | None = None,
    reference_file: str | None = None,
) -> None:
    """Runs at the ends of the program's declared dynamic ranges (:mod:`~trt_inline.verify.range_ends`), beside the
    run on ``sample`` whose outputs were ``baseline``.

    Each run's values are held to their declarations and its sightings appended to ``sightings``
    (:func:`~trt_inline.verify.garbage.garbage_warnings`). Its outputs are compared with ``expected_module`` (in
    this process) where given; with ``kept`` (a child whose parent has the module) its inputs and outputs are
    appended there for the parent to compare (:func:`_compare_range_ends`); with ``reference_program`` (the program
    of ``reference_file``, ``--expected-from``, opened as checked as this one) compared with what it returns for
    the same inputs (one that rejects them: a note, as ``diff`` says it); else NaN or Inf in an output that had
    none on ``sample`` is a problem.
    """
    if program is None or mode == "off" or not range_ends.is_dynamic(program):
        return  # (a package without its program has no ranges to read; a static program has no ends)
    if rank_file or (isinstance(runnable, torch.nn.Module) and collectives_of(runnable)):
        # (every rank would have to make the same runs, and a TensorRT engine's collectives are inside its plan)
        why = "the file is one rank of a rank set" if rank_file else "the program calls collectives"
        report.notes.append(f"not run at the ends of its dynamic ranges: {why}, whose ranks would all have to make "
                            "the same runs")  # fmt: skip
        return
    plan = range_ends.plan(program, sample, seed, mode)
    report.notes += plan.notes
    made: list[range_ends.End] = []
    compared_with_reference: set[int] = set()
    for index, end in enumerate(plan.ends):
        progress.report("running at the ends of the dynamic ranges", (index + 1, len(plan.ends)))
        draw = end.draw
        problem = None
        try:
            run_name = f"on the inputs at the {end.name} of its dynamic ranges"
            ran = run_on(runnable, draw.args, draw.kwargs, device, run_name=run_name)
        except RefusedOperatorError:
            raise  # (a call its values made unsafe to run: refused as the file's operators are)
        except VerifyInputError as exc:
            if is_allocation_failure(exc):  # (the limit of this process, not the program: said, not failed)
                report.notes.append(f"not run at the {end.label}: out of memory ({first_line(exc)})")
                continue
            problem = f"rejected inputs within its declared ranges: {exc}"
        else:
            report.warnings += [w for w in ran.warnings if w not in report.warnings]
            report.notes += [n for n in ran.notes if n not in report.notes]
            if ran.sightings is not None:
                sightings.append(ran.sightings)
            if ran.problems:
                problem = "; ".join(ran.problems)
            elif expected_module is not None:
                problem = module_differs(ran.outputs, expected_module, draw.args, draw.kwargs, criteria)
            elif reference_program is not None:
                try:
                    problem = module_differs(ran.outputs, reference_program, draw.args, draw.kwargs, criteria)
                except RefusedOperatorError:
                    raise
                except Exception as exc:  # (its own guard or kernel refused the size: nothing to compare with)
                    if is_allocation_failure(exc):
                        raise
                    report.notes.append(
                        f"at the {end.label}: the program of {reference_file} rejects these inputs "
                        f"({type(exc).__name__}: {first_line(exc)}): not compared"
                    )
                    problem = _new_nonfinite(ran.outputs, baseline)
                else:
                    compared_with_reference.add(index)
            elif kept is not None:
                outputs = tensors_only(ran.outputs, "outputs")
                kept.append({"index": len(report.range_end_runs), "args": draw.args, "kwargs": draw.kwargs,
                             "outputs": outputs})  # fmt: skip
            else:
                problem = _new_nonfinite(ran.outputs, baseline)
        made.append(end)
        report.range_end_runs.append({
            "end": end.name, "sizes": draw.shapes(), "symbols": draw.symbols, "ok": problem is None,
            "problem": problem, "compared": expected_module is not None or index in compared_with_reference,
        })  # fmt: skip
        if problem is not None:
            report.problems.append(f"at the {end.where}: {problem}")
    if made:
        how = (
            f"each compared with the program of {reference_file} on the same inputs"
            if reference_program is not None and compared_with_reference
            else _range_ends_checked(report.expected_source, expected_module is not None, kept is not None)
        )
        report.notes.append(plan.summary(how, made))


def _range_ends_checked(expected_source: str, compared: bool, handed_back: bool) -> str:
    """How the runs at the ends of the ranges were checked, and why not compared where they were not."""
    if compared:
        return "each compared with expected_module"
    if handed_back:
        return "each compared with expected_module in the calling process, on the inputs and outputs handed back"
    if expected_source == "embedded":
        why = "the file records outputs at its reference inputs alone"
    elif expected_source.startswith("from "):
        why = f"{expected_source.removeprefix('from ')} records outputs at its reference inputs alone"
    elif expected_source == "given":
        why = "the expected outputs given are those of the given inputs alone"
    else:
        why = "there are no expected outputs"
    return (
        "each checked against its declarations, for garbage, and for NaN or Inf where its outputs on the reference "
        f"inputs have none; not compared: {why} (trt-inline diff A B compares two saves there, expected_module a "
        "module)"
    )


def _new_nonfinite(outputs: Sequence[Any], baseline: Sequence[Any]) -> str | None:
    """NaN or Inf in an output where the same output on the reference inputs had none (an infinity may be a value,
    a mask of -inf, where it is one there too); None where there is none."""
    found = []
    for index, value in enumerate(outputs):
        if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
            continue
        before = baseline[index] if index < len(baseline) else None
        if not isinstance(before, torch.Tensor) or not (before.is_floating_point() or before.is_complex()):
            before = None
        for kind, test in (("NaN", torch.isnan), ("Inf", torch.isinf)):
            if bool(test(value).any()) and not (before is not None and bool(test(before).any())):
                found.append(f"{kind} in output {index}")
    problems = [f"{', '.join(found)}, where its outputs on the reference inputs have none"] if found else []
    if len(outputs) != len(baseline):
        problems.append(f"{len(outputs)} outputs, {len(baseline)} on the reference inputs")
    return "; ".join(problems) or None


def _finite(value: Any) -> bool:
    """No NaN or Inf in a floating-point output (anything else is finite)."""
    if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
        return True
    return bool(value.isfinite().all())


def _package_model(loaded: LoadedFile, report: VerifyReport, allow_native_code: bool) -> Callable[..., Any]:
    """A package's AOTInductor model, which only ``allow_native_code`` loads."""
    if not allow_native_code:
        raise VerifyInputError(
            f"{loaded.path} is an AOTInductor package: running it loads its shared library, native code from the "
            "file; pass --allow-native-code (allow_native_code=True) only for a file from a trusted source"
        )
    report.notes.append(
        "ran the package's AOTInductor model (allow_native_code): only for a file from a trusted source"
    )
    return load_package(loaded.path)


def capture_device(reference: ReferenceIO) -> str | None:
    """Where to run: where the reference was captured (TensorRT engines need CUDA), or where the program is."""
    if reference.device == "cpu":
        return None
    if reference.device.startswith("cuda") and not torch.cuda.is_available():
        raise VerifyInputError(
            f"the reference was captured on {reference.device} and no CUDA device is available here "
            "(pass --device to run elsewhere)"
        )
    return reference.device


def _reference_of(path: str, trust: Trust) -> tuple[ReferenceIO, torch.fx.GraphModule | None]:
    """The reference I/O embedded in another file (safety-checked like the file being verified), or a boundaries
    file's (``load_boundaries``); and that file's runnable program where it is an ExportedProgram file (what the
    runs at the ends of the dynamic ranges are compared with)."""
    with open(path, "rb") as handle:
        if is_boundaries_file(handle.read(64)):
            handle.seek(0)
            return decode_boundaries_file(handle.read(), os.fspath(path)), None
    loaded = open_trusted(path, trust)
    if loaded.reference is None:
        raise VerifyInputError(f"{Path(path)}: carries no reference I/O to check against (save it with arg_inputs)")
    runnable = loaded.module if loaded.program is not None and loaded.kind != AOTI_PACKAGE else None
    return loaded.reference, runnable


def open_trusted(path: str | os.PathLike[str], trust: Trust, *, read_ahead: bool = False) -> LoadedFile:
    """A file opened through the strict reader with what ``trust`` lets through (:func:`open_file`)."""
    return open_file(
        path, allow_pickle=trust.allow_pickle, allow_native_code=trust.allow_native_code, allow_ops=trust.allow_ops,
        read_ahead=read_ahead,
    )  # fmt: skip


def check_given_inputs(module: torch.fx.GraphModule, args: Sequence[Any], kwargs: dict[str, Any], source: str) -> None:
    """The user's inputs refused, naming the first that differs, where the program of ``source`` does not take them
    (:func:`inputs_mismatch`)."""
    unlike = inputs_mismatch(module, args, kwargs, "given")
    if unlike is not None:
        raise VerifyInputError(f"{source}: the program does not accept the given inputs: {unlike}")


def inputs_mismatch(
    module: torch.fx.GraphModule, args: Sequence[Any], kwargs: dict[str, Any], giver: str
) -> str | None:
    """How the inputs differ from what the program takes, naming the first (``input 0 (x) is float32[2, 3, 8, 8],
    given float32[2, 5, 8, 8]``); the count where they do not bind to its signature (``it takes 1 input (x), given
    2``). The inputs are flattened as the program's own call flattens them (keywords by name, containers by its
    input spec); where that raises, None: the program's own check then speaks."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    try:
        values = ProgramInputs(module).flatten(args, kwargs)
    except TypeError:  # (the arguments do not bind to its signature: say how many it takes)
        parameters = list(inspect.signature(module.forward).parameters)
        count = len(parameters)
        # (torch 2.5 names the parameters arg_0 ...: the placeholders keep the model's names where they are as many)
        names = ", ".join(n.name for n in placeholders) if len(placeholders) == count else ", ".join(parameters)
        return f"it takes {count} input{'' if count == 1 else 's'} ({names}), {giver} {len(args) + len(kwargs)}"
    except Exception:
        return None
    if len(values) != len(placeholders):
        return None
    for index, (node, value) in enumerate(zip(placeholders, values, strict=True)):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(value, torch.Tensor):
            continue
        static = all(isinstance(d, int) for d in val.shape)
        if val.dtype != value.dtype or val.dim() != value.dim() or (static and tuple(val.shape) != value.shape):
            return f"input {index} ({node.name}) is {describe_value(val)}, {giver} {describe_value(value)}"
    return None


def _check_signature(
    program: ExportedProgram,
    module: torch.fx.GraphModule | None,
    source: str,
    reference: ReferenceIO,
    reference_source: str,
) -> None:
    """One line naming the first difference between a program's inputs/outputs and another file's reference."""
    giver = f"the reference in {reference_source} gives"
    mismatch = None if module is None else inputs_mismatch(module, reference.args, reference.kwargs, giver)
    if mismatch is not None:
        raise VerifyInputError(f"{source} {mismatch.removeprefix('it ')}")
    outputs = len(program.graph_signature.user_outputs)
    if outputs != len(reference.outputs):
        raise VerifyInputError(
            f"{source} returns {outputs} outputs, the reference in {reference_source} has {len(reference.outputs)}"
        )
