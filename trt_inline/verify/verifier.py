"""``verify``: structural checks, then a run on reference inputs compared output by output."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from trt_inline import allowed_ops, distributed, progress
from trt_inline.archive.loading import AOTI_PACKAGE, LoadedFile, open_file
from trt_inline.archive.pickles import read_torch_save
from trt_inline.archive.reader import check_path
from trt_inline.archive.reference_io import (
    EngineBoundary,
    ReferenceIO,
    decode_boundaries,
    decode_boundaries_file,
    encode_boundaries_file,
    is_boundaries_file,
    plain_boundaries,
    reference_from_payload,
    reference_payload,
    tensors_only,
)
from trt_inline.archive.views import BytesView
from trt_inline.distributed import relay as rank_relay
from trt_inline.distributed.manifest import collectives_of, decode_manifest, program_mismatch, rank_check_problem
from trt_inline.errors import IsolationError, RefusedOperatorError, VerifyInputError, first_line, printable
from trt_inline.formats import atomic_write, format_size
from trt_inline.isolation import Limits, is_allocation_failure, run_isolated
from trt_inline.module_state import buffers_restored
from trt_inline.output_tree import OutputTree, describe, is_flat, paired_by_path, structure_problems
from trt_inline.package import load_package
from trt_inline.verify import range_ends
from trt_inline.verify.boundaries import ProgramTrace, as_boundaries, recording, trace_program
from trt_inline.verify.checked_run import ProgramInputs
from trt_inline.verify.compare import (
    compare_output,
    normal_call,
    run_on,
    tolerance_for,
)
from trt_inline.verify.drill import drill_down
from trt_inline.verify.extract import (
    diverged_engine,
    diverged_value,
    engine_repro,
    region_repro,
    repro_folder,
    write_repro,
)
from trt_inline.verify.garbage import Sightings, garbage_warnings
from trt_inline.verify.jobs import DiffRequest, InspectRequest, InspectResponse, VerifyRequest
from trt_inline.verify.localize import Reference as BoundaryReference
from trt_inline.verify.localize import Tolerance, localize, own_error_problems
from trt_inline.verify.options import (
    VERIFY,
    Inputs,
    Isolation,
    Outputs,
    Reference,
    Tolerances,
    Trust,
    VerifyFields,
    error_stat_checked,
    gather,
    normalize_tolerance,
    top_k_checked,
)
from trt_inline.verify.random_inputs import draw_inputs
from trt_inline.verify.report import RANGE_END_NAMES, VerifyReport, describe_value
from trt_inline.verify.structure import structural_problems

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # (typing has it from 3.11)
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from trt_inline.distributed.relay import RelayServer

__all__ = [
    "capture_device",
    "error_stat_checked",
    "inspect_job",
    "normalize_tolerance",
    "report_of_child",
    "save_target",
    "save_tensors",
    "top_k_checked",
    "verify",
    "verify_job",
]


def save_target(path: str | os.PathLike[str], flag: str = "--save-outputs") -> Path:
    """Where ``save_outputs`` (or another ``flag``'s file) goes, refused if its directory does not exist
    (checked again before the run)."""
    target = Path(path)
    if not target.parent.is_dir():
        raise VerifyInputError(f"{flag}: directory {target.parent} does not exist")
    return target


def save_tensors(tensors: object, path: str | os.PathLike[str]) -> None:
    """``torch.save`` of plain tensors (readable with ``weights_only=True``), written atomically."""
    with atomic_write(save_target(path)) as tmp:
        torch.save(tensors, tmp)


def verify(
    path_or_program: str | os.PathLike[str] | ExportedProgram,
    *,
    inputs: Inputs | None = None,
    reference: Reference | None = None,
    tolerances: Tolerances | None = None,
    trust: Trust | None = None,
    isolation: Isolation | None = None,
    outputs: Outputs | None = None,
    **fields: Unpack[VerifyFields],
) -> VerifyReport:
    """Check a saved program's structure and compare its outputs with the expected outputs.

    The options come in six frozen groups (:mod:`trt_inline.verify.options`, where each field's type,
    default and help text are declared): ``inputs`` (:class:`~trt_inline.verify.options.Inputs`: what the
    program runs on, and where), ``reference`` (:class:`~trt_inline.verify.options.Reference`: what its
    outputs are compared with), ``tolerances`` (:class:`~trt_inline.verify.options.Tolerances`: how close, and
    what fails), ``trust`` (:class:`~trt_inline.verify.options.Trust`: what a file may do), ``isolation``
    (:class:`~trt_inline.verify.options.Isolation`: the child process and its limits) and ``outputs``
    (:class:`~trt_inline.verify.options.Outputs`: the files written). :func:`trt_inline.diff`, rank sets and
    ``--cases`` take the same groups. Every field may also be given as a keyword of its own:
    ``verify(path, atol=1e-3, random_inputs=2)`` is ``verify(path, tolerances=Tolerances(atol=1e-3),
    inputs=Inputs(random_inputs=2))``; a group given with one of its own fields as a keyword is a
    :class:`TypeError`.

    The expected outputs are, in order of preference: ``expected`` for
    ``arg_inputs``; what ``expected_module`` returns for ``arg_inputs`` (or for the
    embedded inputs); the reference I/O embedded in the file ``expected_from``
    (a newer save of the same module, checked against this file); the reference
    I/O embedded in the file itself. Without any, only the structure is checked
    and ``report.compared`` is false; ``report.expected_source`` says which.
    ``atol`` / ``rtol``: one for every value, or per output (``{0: 1e-3}``), per
    engine (``{"engine2": 1e-2}``, ``{"acc_5": 1e-2}``: its inputs and outputs), and
    ``"*"`` for the others; by default per dtype. ``check_error_stat``: how a value
    passes, as Polygraphy's option of that name: ``"elemwise"`` (every element
    within ``atol + rtol * |reference|``), or ``"max"``, ``"mean"``, ``"median"``,
    ``"p99"`` (that statistic of the absolute error within ``atol``, or of the
    relative error within ``rtol``). Every value compared also has its SQNR and cosine similarity reported.
    ``top_k``: for each floating output whose last dimension has at least ``top_k`` classes (logits), the fraction
    of its rows (the leading dimensions flattened) whose top-``top_k`` indices are the same set as the reference's,
    and the first row that does not (:func:`~trt_inline.verify.compare.top_k_agreement`); reported, and a problem
    only where the fraction is below ``min_top_k_agreement``.

    ``per_engine``: compare engine by engine against the boundary data the file
    embeds (``embed_reference="boundaries"``) or, with ``expected_module`` (a
    compiled module), against its engines as they run here: each engine alone on
    its recorded inputs (its own error), then every boundary of the whole run;
    ``report.divergence`` names the first engine or fallback region past
    tolerance and ``report.boundaries`` holds the per-boundary table. This runs
    by itself when an output differs and boundary data is at hand.
    ``random_inputs``: that many more runs on inputs drawn within the program's
    declared dynamic ranges (``seed``), each checked to be accepted and to give
    finite outputs. ``range_ends``: runs at the ends of those ranges (every size at
    its minimum, its maximum, the optimization point the file records), ``"auto"``
    (the default: within a cost rule), ``"all"`` or ``"off"``
    (:mod:`trt_inline.verify.range_ends`); compared with ``expected_module`` where it is
    given, else held to the checks that need no reference. ``save_outputs``: the program's outputs on the reference
    inputs, written with ``torch.save`` (plain tensors). ``save_boundaries``:
    this run's inputs, outputs and every engine boundary, written as a
    boundaries file; ``load_boundaries``: such a file (from another machine,
    another TensorRT) as the reference, compared engine by engine. ``extract``:
    a folder to write the first divergent engine or fallback region to as a program of its own
    (``repro.pt2``, with its recorded inputs and outputs, and ``repro.py``).

    Every run is also held to what the graph declares (:mod:`trt_inline.verify.declared`: each engine's and
    node's outputs, their rank, sizes, dtype, device, tensor or scalar): a disagreement is a problem. What
    looks like garbage without a reference (:mod:`trt_inline.verify.garbage`: all zeros, NaN or Inf, the same
    in every run or every row of a batch) is a warning (``report.warnings``); ``strict=True`` fails on those too.

    Files are checked before loading (:mod:`trt_inline.archive.loading`): one
    whose pickles need more than plain tensors and Torch-TensorRT engines is
    refused unless ``allow_pickle=True``. An AOTInductor package is checked
    through the ExportedProgram it carries (if any) and only run, which loads
    its shared library, with ``allow_native_code=True``; so are TensorRT engines
    (a TensorRT plan is native code). The graph and every reference engine may
    call only allowed operators (:mod:`trt_inline.allowed_ops`; ``allow_ops``
    adds some for a trusted file). The run leaves the caller's RNG state and
    deterministic-algorithm flags as they were.

    A file is loaded and run in a sandboxed child process
    (:mod:`trt_inline.isolation`, :mod:`trt_inline.isolation.sandbox`) stopped
    after ``timeout`` seconds (default 3600) or past ``memory_limit`` (bytes or
    ``"2GiB"``; default 2 GiB and half the file's size, at most 80% of the memory available); a crash there is an
    error here, never a crash of the caller. Where the OS sandbox cannot be set
    up, that is an :class:`IsolationError` unless ``sandbox=False``.
    ``isolate=False`` loads in this process (for a file from a trusted source);
    so does an ExportedProgram given directly; in a process group of several
    ranks its collectives then run on that group (a rank set is verified in
    sandboxed children by :mod:`trt_inline.distributed.rank_set`). With isolation,
    ``expected_module`` runs here, on ``arg_inputs``, which it then needs.

    Raises :class:`VerifyInputError` for unusable input (not a loadable
    ExportedProgram file, inputs the program cannot take, a refused file, a
    limit the child hit: :class:`IsolationError`).
    """
    options = gather(VERIFY, fields, inputs=inputs, reference=reference, tolerances=tolerances, trust=trust,
                     isolation=isolation, outputs=outputs)  # fmt: skip
    inputs, reference, tolerances = options.inputs, options.reference, options.tolerances
    trust, isolation, outputs = options.trust, options.isolation, options.outputs
    extract = outputs.extract
    repro: list[Any] | None = [] if extract is not None else None  # (what, archive) of the engine or region extracted
    if reference.load_boundaries is not None:
        if any(given is not None for given in (reference.expected_from, reference.expected, reference.expected_module)):
            raise VerifyInputError("load_boundaries is the reference: give it without expected, expected_module "
                                   "or expected_from")  # fmt: skip
        # A boundaries file is read where a reference file is (expected_from), and compared engine by engine.
        reference = replace(reference, expected_from=reference.load_boundaries, per_engine=True)
        options = replace(options, reference=reference)
    if outputs.save_boundaries is not None:
        save_target(outputs.save_boundaries, "--save-boundaries")
    if extract is not None:
        repro_folder(extract)
    if isinstance(path_or_program, ExportedProgram) or not isolation.isolate:
        # In this process a rank file's collectives run on the caller's own process group (a trusted file).
        collectives = distributed.in_rank_set()
        kept_reference: list[ReferenceIO] | None = [] if outputs.save_boundaries is not None else None
        with allowed_ops.allowing(trust.allow_ops, native_code=trust.allow_native_code, collectives=collectives):
            report = _verify_here(
                path_or_program, inputs, reference, tolerances, trust, save_outputs=outputs.save_outputs,
                kept_reference=kept_reference, repro=repro,
            )  # fmt: skip
        if outputs.save_boundaries is not None:
            _save_boundaries_or_say(report, kept_reference[0] if kept_reference else None, outputs.save_boundaries)
        if extract is not None:
            _write_extract(report, repro or [], extract, trust.allow_native_code)
        return strictly(report, tolerances.strict)
    path = os.fspath(path_or_program)
    check_path(path)  # (said at once, before a child starts: the child reads the file again, strictly)
    label: Literal["module"] | None = None
    recorded = None
    expected_tree: OutputTree | None = None
    expected, expected_module, arg_inputs = reference.expected, reference.expected_module, inputs.arg_inputs
    if expected_module is not None:
        if arg_inputs is None:
            raise VerifyInputError(
                "expected_module runs in this process and the file in a child: give arg_inputs with it"
            )
        if inputs.random_inputs:
            raise VerifyInputError(
                "random inputs are drawn from the file's declared ranges in the child that opens it, where "
                "expected_module cannot run: pass isolate=False (a trusted file), or compare two files with diff"
            )
        with (
            recording(expected_module if reference.per_engine else None) as records,
            normal_call(),
            buffers_restored(expected_module) as restored,
        ):
            returned = restored.apart(expected_module(*arg_inputs, **(inputs.kwarg_inputs or {})))
            expected, expected_tree = tensors_only(returned, "expected outputs"), describe(returned)
        recorded = records if reference.per_engine else None
        label = "module"
    limits = Limits.for_file(path, isolation.timeout, isolation.memory_limit)
    if expected is not None and label is None:
        expected_tree, expected = _given_tree(expected), tensors_only(expected, "expected outputs")
    # (with expected_module, which runs here, the child hands back its runs at the ends of the ranges to compare)
    request = VerifyRequest.of(path, options, label=label, expected_tree=expected_tree)
    tensors = {
        "args": None if arg_inputs is None else list(arg_inputs),
        "kwargs": inputs.kwarg_inputs,
        "expected": None if expected is None else list(expected),
        "boundaries": None if recorded is None else plain_boundaries(recorded),
    }
    expected_from = reference.expected_from
    files = (path,) if expected_from is None else (path, os.fspath(expected_from))
    if outputs.save_outputs is not None:
        save_target(outputs.save_outputs)
    kept_ends: list[dict[str, Any]] | None = [] if label == "module" else None
    report = report_of_child(
        "verify", request, tensors, limits, where=path, files=files, sandbox=isolation.sandbox,
        debug=isolation.debug, verbose=isolation.verbose, save_outputs=outputs.save_outputs,
        save_boundaries=outputs.save_boundaries,
        repro=repro, read_ahead=path, range_ends=kept_ends,
    )  # fmt: skip
    if kept_ends and expected_module is not None and arg_inputs is not None:
        _compare_range_ends(
            report, kept_ends, expected_module, (arg_inputs, inputs.kwarg_inputs or {}), inputs.range_ends,
            normalize_tolerance(tolerances.atol), normalize_tolerance(tolerances.rtol), tolerances.check_error_stat,
            where=path,
        )  # fmt: skip
    if extract is not None:
        _write_extract(report, repro or [], extract, trust.allow_native_code)
    return strictly(report, tolerances.strict)


def strictly(report: VerifyReport, strict: bool) -> VerifyReport:
    """``report``, its warnings made problems where ``strict`` (``--strict``)."""
    if strict:
        report.problems += [f"{warning} (--strict)" for warning in report.warnings]
        report.warnings = []
    return report


def report_of_child(
    job: str,
    request: VerifyRequest | DiffRequest | dict[str, Any],
    tensors: Any,
    limits: Limits,
    *,
    where: str,
    files: tuple[str, ...],
    sandbox: bool,
    debug: bool,
    save_outputs: str | os.PathLike[str] | None = None,
    save_boundaries: str | os.PathLike[str] | None = None,
    repro: list[Any] | None = None,
    verbose: bool = False,
    relay: RelayServer | None = None,
    read_ahead: str | None = None,
    range_ends: list[dict[str, Any]] | None = None,
) -> VerifyReport:
    """The report a ``verify`` or ``diff`` job gives in a child process on ``request``, with what the child cost.

    ``request``: the job's (:mod:`trt_inline.verify.jobs`), or plain data for a job that takes plain data (told
    ``keep_outputs`` where ``save_outputs`` is given). ``read_ahead``: the file whose weights the job reads, read
    ahead by this process (:func:`run_isolated`).
    ``range_ends``: receives the runs at the ends of the ranges the child handed back (``keep_range_ends``).

    The child's report is untrusted: it is read strictly here (:meth:`VerifyReport.from_dict`: each field of its
    type, strings escaped and cut, at most ``MAX_COMPARISONS`` comparisons), and the outputs it hands back
    for ``save_outputs`` are read by the strict reader, plain tensors only.
    """
    if isinstance(request, dict):
        request, trust = {**request, "keep_outputs": save_outputs is not None}, Trust()
    else:
        trust = request.trust
    result = run_isolated(
        job, request, tensors, limits, where=where, files=files, sandbox=sandbox, imports=trust.allow_pickle,
        native_code=trust.allow_native_code, debug=debug, relay=relay, read_ahead=read_ahead,
    )  # fmt: skip
    try:
        report = VerifyReport.from_dict(result.value)  # read strictly: types, escaped strings, bounded counts
    except (KeyError, TypeError, ValueError) as exc:
        raise IsolationError(f"{where}: the child process gave a malformed report ({first_line(exc)})") from None
    handed = _handed_back(result.tensors, where)  # read once, whatever is taken from it
    if save_outputs is not None:
        save_tensors(_outputs_of_child(handed, where), save_outputs)
    if save_boundaries is not None:
        _save_boundaries_or_say(report, _reference_of_child(handed, where), save_boundaries)
    if repro is not None:
        repro.extend(_repro_of_child(handed, where))
    if range_ends is not None:
        range_ends.extend(_range_ends_of_child(handed, where))
    report.child_peak_extra_bytes = max(0, result.peak_rss - result.base_rss)
    report.child_peak_anonymous_bytes, report.child_peak_file_bytes = result.peak_anonymous, result.peak_file
    walls = f"sandboxed: {result.sandbox}" if result.sandbox else "WITHOUT the OS sandbox (--no-sandbox)"
    if verbose:
        report.notes.append(
            f"loaded and run in a child process ({walls}; limits {limits.describe()}; its peak resident memory "
            f"{format_size(result.peak_rss)}, {format_size(report.child_peak_extra_bytes)} above its imports: "
            f"{format_size(result.peak_anonymous)} anonymous, {format_size(result.peak_file)} mapped from files)"
        )
    else:
        report.notes.append(f"run in a child process ({walls}; peak memory {format_size(result.peak_rss)})")
    return report


def _handed_back(data: bytes, where: str) -> dict[str, Any]:
    """What a child handed back besides its report (outputs, a recorded run, a repro), read strictly; {} if nothing."""
    if not data:
        return {}
    try:
        value = read_torch_save(BytesView(data), f"{where}: what the child handed back")
    except VerifyInputError as exc:
        raise IsolationError(str(exc)) from None
    if not isinstance(value, dict):
        raise IsolationError(f"{where}: the child process handed back something other than a dict")
    return value


def _outputs_of_child(handed: dict[str, Any], where: str) -> Any:
    """The outputs a child handed back: plain tensors (in lists or dicts); refused otherwise."""
    outputs = handed.get("outputs")
    leaves = outputs if isinstance(outputs, list) else list(outputs.values()) if isinstance(outputs, dict) else None
    if leaves is None or not all(
        isinstance(t, torch.Tensor) or (isinstance(t, list) and all(isinstance(x, torch.Tensor) for x in t))
        for t in leaves
    ):
        raise IsolationError(f"{where}: the child process handed back outputs that are not tensors")
    return outputs


def _save_boundaries_or_say(report: VerifyReport, run: ReferenceIO | None, path: str | os.PathLike[str]) -> None:
    if run is None:
        report.notes.append(f"--save-boundaries: nothing written to {path}: no run of the program was recorded")
    else:
        save_boundaries_file(run, path)


def _reference_of_child(handed: dict[str, Any], where: str) -> ReferenceIO | None:
    """The run a child recorded for ``save_boundaries`` (None: it recorded none), checked: plain tensors."""
    if "reference" not in handed:
        return None
    try:
        return reference_from_payload(handed["reference"])
    except VerifyInputError as exc:
        raise IsolationError(f"{where}: the child process handed back boundaries that are not plain ({exc})") from None


def _repro_of_child(handed: dict[str, Any], where: str) -> list[tuple[str, bytes]]:
    """The engine or region a child extracted (``extract``): (what, archive bytes), checked."""
    entries = handed.get("repro", [])
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("what"), str) and isinstance(e.get("archive"), torch.Tensor)
        and e["archive"].dtype == torch.uint8 and e["archive"].dim() == 1
        for e in entries
    ):  # fmt: skip
        raise IsolationError(f"{where}: the child process handed back a repro that is not an archive")
    return [(printable(e["what"]), e["archive"].numpy().tobytes()) for e in entries]


def _range_ends_of_child(handed: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The runs at the ends of the ranges a child handed back (``keep_range_ends``): each the index of its run in
    the report, its inputs and its outputs, plain tensors; refused otherwise."""
    entries = handed.get("range_ends", [])

    def plain(entry: Any) -> bool:
        if not isinstance(entry, dict) or set(entry) != {"index", "args", "kwargs", "outputs"}:
            return False
        args, kwargs, outputs = entry["args"], entry["kwargs"], entry["outputs"]
        return (
            type(entry["index"]) is int and isinstance(args, list) and isinstance(kwargs, dict)
            and all(isinstance(k, str) for k in kwargs) and isinstance(outputs, list)
            and all(isinstance(t, torch.Tensor) for t in (*pytree.tree_leaves((args, kwargs)), *outputs))
        )  # fmt: skip

    if not isinstance(entries, list) or len(entries) > len(RANGE_END_NAMES) or not all(map(plain, entries)):
        raise IsolationError(f"{where}: the child process handed back runs at the ends of the ranges that are not "
                             "plain tensors")  # fmt: skip
    return entries


def _compare_range_ends(
    report: VerifyReport,
    entries: list[dict[str, Any]],
    expected_module: Callable[..., Any],
    given: tuple[Sequence[Any], dict[str, Any]],
    mode: str,
    atol: Tolerance,
    rtol: Tolerance,
    stat: str,
    *,
    where: str,
) -> None:
    """The child's runs at the ends of the ranges compared with ``expected_module``'s outputs on the same inputs,
    into the report. The inputs come from the child: each must be tensors like the ``given`` inputs (as many, the
    same dtypes and ranks, on their devices) and, by default, within the cost rule of
    :mod:`~trt_inline.verify.range_ends`; else the child misbehaved (:class:`IsolationError`)."""
    given_bytes = sum(t.numel() * t.element_size() for t in pytree.tree_leaves(given) if isinstance(t, torch.Tensor))
    budget = max(range_ends.GROWTH * given_bytes, range_ends.SMALL_BYTES) if mode == "auto" else None
    seen: set[int] = set()
    for entry in entries:
        leaves, spec = pytree.tree_flatten((entry["args"], entry["kwargs"]))
        index = entry["index"]
        # (keywords in the order the child's call has them)
        same_keywords = set(entry["kwargs"]) == set(given[1])
        ordered = {key: given[1][key] for key in entry["kwargs"]} if same_keywords else {}
        given_leaves = pytree.tree_leaves((list(given[0]), ordered))
        alike = (
            same_keywords
            and len(leaves) == len(given_leaves)
            and all(
                isinstance(want, torch.Tensor) and got.dtype == want.dtype and got.dim() == want.dim()
                for got, want in zip(leaves, given_leaves, strict=False)
            )
        )
        size = sum(t.numel() * t.element_size() for t in leaves)
        if not alike or not 0 <= index < len(report.range_end_runs) or index in seen or (budget and size > budget):
            raise IsolationError(f"{where}: the child process handed back inputs at the ends of the ranges unlike "
                                 "the given inputs")  # fmt: skip
        seen.add(index)
        moved = [got.to(want.device) for got, want in zip(leaves, given_leaves, strict=True)]
        args, kwargs = pytree.tree_unflatten(moved, spec)
        problem = _module_differs(entry["outputs"], expected_module, args, kwargs, atol, rtol, stat)
        run = report.range_end_runs[index]
        run.update(compared=True, ok=bool(run["ok"]) and problem is None, problem=problem or run.get("problem"))
        if problem is not None:
            symbols = ", ".join(f"{name}={value}" for name, value in run["symbols"].items())
            report.problems.append(f"at the {run['end']} of its dynamic ranges ({symbols}; sizes {run['sizes']}): "
                                   f"{problem}")  # fmt: skip


def _write_extract(report: VerifyReport, repro: list[Any], folder: str | os.PathLike[str], native_code: bool) -> None:
    """Write what ``extract`` found (or say why nothing) into the report's notes."""
    if not repro:
        if report.divergence is None and not any(note.startswith("nothing extracted") for note in report.notes):
            report.notes.append("nothing extracted: nothing diverged")
        return
    what, archive = repro[0]
    written = write_repro(folder, what, archive, report.source, native_code)
    report.notes.append(
        f"{what} extracted with its recorded inputs and outputs: trt-inline verify {written[0]}"
        f"{' --allow-native-code' if native_code else ''} reproduces it alone; python {written[1]} too"
    )


def save_boundaries_file(reference: ReferenceIO, path: str | os.PathLike[str]) -> None:
    """A boundaries file (``--save-boundaries``), written atomically."""
    with atomic_write(save_target(path, "--save-boundaries")) as tmp:
        tmp.write_bytes(encode_boundaries_file(reference))


def verify_job(request: VerifyRequest, tensors: dict[str, Any]) -> Any:
    """:func:`verify` inside the child process (the job :mod:`trt_inline.isolation.inside` runs), its tensors put
    back into the groups they travelled apart from.

    Returns the report, and with ``keep_outputs`` the outputs too (the parent writes them).
    """
    kept: list[Any] | None = [] if request.keep_outputs else None
    kept_reference: list[ReferenceIO] | None = [] if request.keep_reference else None
    repro: list[Any] | None = [] if request.extract else None
    kept_ends: list[dict[str, Any]] | None = [] if request.keep_range_ends else None
    trust = request.trust
    with allowed_ops.allowing(
        trust.allow_ops, native_code=trust.allow_native_code, collectives=rank_relay.client() is not None
    ):
        report = _verify_here(
            request.path,
            replace(request.inputs, arg_inputs=tensors["args"], kwarg_inputs=tensors["kwargs"]),
            replace(request.reference, expected=tensors["expected"]),
            request.tolerances,
            trust,
            expected_tree=_tree_argument(request.expected_tree, tensors["expected"]),
            recorded=decode_boundaries(tensors.get("boundaries")),
            kept=kept,
            kept_reference=kept_reference,
            repro=repro,
            kept_range_ends=kept_ends,
        )
    if request.label:
        report.expected_source = request.label
    if kept is not None or kept_reference or repro or kept_ends:
        handed: dict[str, Any] = {"outputs": kept or []}
        if kept_ends:
            handed["range_ends"] = kept_ends
        if kept_reference:
            handed["reference"] = reference_payload(kept_reference[0])
        if repro:
            handed["repro"] = [
                {"what": what, "archive": torch.frombuffer(bytearray(archive), dtype=torch.uint8)}
                for what, archive in repro
            ]
        return report.to_dict(), handed
    return report.to_dict()


def inspect_job(request: InspectRequest, tensors: Any) -> InspectResponse:
    """The ``inspect`` table of a file, line by line, and what its TensorRT engines need, inside the child process
    (its program loaded without weights; its engines' infos read as data first, nothing deserialized)."""
    from trt_inline.archive.engine_info import read_engine_infos
    from trt_inline.verify.engine_needs import engine_lines
    from trt_inline.verify.graph_table import describe_file

    path, trust = request.path, request.trust
    _, engines = read_engine_infos(path, allow_pickle=trust.allow_pickle)
    needs = engine_lines(engines)
    if engines and not trust.allow_native_code:
        return InspectResponse([*needs, "engines and fallbacks are shown with --allow-native-code: loading the "
                                "program deserializes its TensorRT engines (native code; only for a file from a "
                                "trusted source)"], engines)  # fmt: skip
    # Collectives, and ATen operators verify refuses for what they compute, are shown, not run: inspect runs
    # nothing. What verify would refuse is said first.
    with allowed_ops.allowing((), collectives=True), allowed_ops.showing_refusals() as refused:
        try:
            loaded = open_file(
                path,
                allow_pickle=trust.allow_pickle,
                allow_native_code=trust.allow_native_code,
                allow_ops=trust.allow_ops,
                weights=False,
            )
        except VerifyInputError as exc:  # (its engines' needs are still worth showing: why it does not load here)
            if not engines:
                raise
            return InspectResponse([*needs, f"the program was not loaded here: {first_line(exc)}"], engines)
        table = describe_file(loaded).split("\n")
    warnings = [f"warning: verify refuses this file: a node or engine step {why}" for why in dict.fromkeys(refused)]
    return InspectResponse(warnings + table + needs, engines)


def _verify_here(
    path_or_program: str | os.PathLike[str] | ExportedProgram,
    inputs: Inputs,
    reference: Reference,
    tolerances: Tolerances,
    trust: Trust,
    *,
    save_outputs: str | os.PathLike[str] | None = None,
    recorded: list[EngineBoundary] | None = None,
    kept: list[Any] | None = None,
    kept_reference: list[ReferenceIO] | None = None,
    repro: list[Any] | None = None,
    expected_tree: OutputTree | None = None,
    kept_range_ends: list[dict[str, Any]] | None = None,
) -> VerifyReport:
    """:func:`verify` in this process, with the groups it was given (in a child: as sent, its tensors put back);
    ``kept`` receives the outputs, ``kept_reference`` the run with its boundaries, ``repro`` the divergent engine
    or region as a program of its own (for the parent to write), ``kept_range_ends`` the runs at the ends of the
    ranges (for the parent to compare with its module)."""
    arg_inputs, kwarg_inputs, device = inputs.arg_inputs, inputs.kwarg_inputs, inputs.device
    random_inputs, seed, range_ends = inputs.random_inputs, inputs.seed, inputs.range_ends
    expected, expected_module, expected_from = reference.expected, reference.expected_module, reference.expected_from
    per_engine = reference.per_engine
    atol, rtol = normalize_tolerance(tolerances.atol), normalize_tolerance(tolerances.rtol)
    stat, top_k, min_top_k_agreement = tolerances.check_error_stat, tolerances.top_k, tolerances.min_top_k_agreement
    allow_pickle, allow_native_code = trust.allow_pickle, trust.allow_native_code
    with contextlib.ExitStack() as cleanup:
        loaded: LoadedFile | None = None
        program: ExportedProgram | None
        module: torch.fx.GraphModule | None = None
        if isinstance(path_or_program, ExportedProgram):
            program, embedded, source = path_or_program, None, "<ExportedProgram>"
            module = program.module()
        else:
            loaded = open_file(
                path_or_program,
                allow_pickle=allow_pickle,
                allow_native_code=allow_native_code,
                allow_ops=sorted(allowed_ops.allowed_now()),
                read_ahead=True,
            )
            cleanup.callback(loaded.stop_reading_ahead)
            program, embedded, source = loaded.program, loaded.reference, os.fspath(path_or_program)
            module = loaded.module if loaded.program is not None and loaded.kind != AOTI_PACKAGE else None
        report = VerifyReport(source=source, allow_pickle=allow_pickle)
        if program is not None:
            report.problems, report.notes = structural_problems(program)
        else:
            report.notes.append("the package carries no ExportedProgram: its graph was not checked, only its outputs")
        if loaded is not None and loaded.program is not None and loaded.manifest_text is not None:
            report.problems += _carried_rank_check(loaded.program, loaded.manifest_text, str(loaded.path))
        if loaded is not None and loaded.unread:
            report.notes.append(f"extra files not read (they are never loaded as code): {', '.join(loaded.unread)}")
        if loaded is not None and loaded.passthrough:
            report.notes.append(
                "passed to torch as they are (allowed by --allow-pickle / --allow-native-code): "
                + ", ".join(loaded.passthrough)
            )
        if allow_pickle:
            report.notes.append(
                "pickles in the file were allowed (allow_pickle): only for a file from a trusted source"
            )

        kwargs = dict(kwarg_inputs or {})
        want_tree: OutputTree | None = None
        reference_program: torch.fx.GraphModule | None = None  # (--expected-from's own program: the ends' reference)
        if expected is not None:
            if arg_inputs is None and not kwargs:
                raise VerifyInputError("expected outputs were given without the inputs they belong to")
            args, want = list(arg_inputs or ()), tensors_only(expected, "expected outputs")
            want_tree = expected_tree if expected_tree is not None else _given_tree(expected)
            report.expected_source = "given"
        elif expected_module is not None:
            if arg_inputs is None and embedded is None:
                raise VerifyInputError("expected_module needs arg_inputs (the file embeds no inputs)")
            args = list(arg_inputs) if arg_inputs is not None else embedded.args  # type: ignore[union-attr]
            kwargs = kwargs or (embedded.kwargs if embedded is not None and arg_inputs is None else {})
            with (
                recording(expected_module if per_engine else None) as records,
                normal_call(),
                buffers_restored(expected_module) as restored,
            ):
                returned = restored.apart(expected_module(*args, **kwargs))
                want, want_tree = tensors_only(returned, "expected outputs"), describe(returned)
            recorded = records if per_engine else None
            report.expected_source = "module"
        elif expected_from is not None:
            newer, reference_program = _reference_of(expected_from, allow_pickle, allow_native_code)
            if program is not None:
                _check_signature(program, module, source, newer, os.fspath(expected_from))
            args, kwargs, want, want_tree = newer.args, newer.kwargs, newer.outputs, newer.output_tree
            recorded = newer.boundaries
            report.expected_source = f"from {os.fspath(expected_from)}"
            device = device or capture_device(newer)
        elif arg_inputs is not None or kwargs:
            # Inputs alone: does it run on them? Its values are held to their declarations and looked at for
            # garbage; nothing is compared (UNVERIFIED).
            if per_engine:
                raise VerifyInputError(
                    "--per-engine compares each engine with a reference: give --expected with --inputs, or "
                    "--expected-from"
                )
            args, want = list(arg_inputs or ()), None
            report.notes.append(
                "ran on the given inputs, with no expected outputs: its values were held to their declarations "
                "and checked for garbage (all zeros, NaN), its outputs were not compared"
            )
        elif embedded is not None:
            args, kwargs, want, report.expected_source = embedded.args, embedded.kwargs, embedded.outputs, "embedded"
            want_tree = embedded.output_tree
            recorded = embedded.boundaries
            device = device or capture_device(embedded)
        else:
            report.notes.append("no reference I/O: outputs were not compared (give inputs and expected outputs)")
            return report

        if loaded is not None and loaded.kind == AOTI_PACKAGE:
            if report.problems:
                report.notes.append("the package was not run: the program it carries failed the structural checks")
                return report
            runnable = _package_model(loaded, report, allow_native_code)
        else:
            assert module is not None  # only a package can lack its program
            runnable = module
        # One rank of a rank set: every rank's checks are done before any collective runs.
        in_process_rank_file = _rank_file_checks(loaded, module)
        user_inputs = arg_inputs is not None and report.expected_source in ("given", "module", "none")
        if user_inputs and module is not None:
            unlike = _inputs_mismatch(module, args, kwargs, "given")
            if unlike is not None:
                raise VerifyInputError(f"{source}: the program does not accept the given inputs: {unlike}")
        progress.report("running the program on the " + ("given inputs" if user_inputs else "reference inputs"))
        try:
            with loaded.reading_ahead() if loaded is not None else contextlib.nullcontext():
                # (Not where the program calls collectives: every rank must make the same runs.)
                layouts = module is None or not collectives_of(module)
                run = run_on(runnable, args, kwargs, device, layouts=layouts,
                             run_name="on the given inputs" if user_inputs else "on the reference inputs")  # fmt: skip
        except RefusedOperatorError:
            raise  # (a call its values made unsafe to run: refused as the file's operators are, not a crash)
        except VerifyInputError as exc:
            # Inputs the file itself carries (or a run of the compiled module recorded) are not unusable input:
            # a program that raises on them is wrong, and where it raises is found boundary by boundary.
            own_inputs = recorded is not None or report.expected_source == "embedded"
            rank_file = loaded is not None and loaded.manifest_text is not None
            if (not own_inputs or rank_file or runnable is not module or module is None or want is None
                    or is_allocation_failure(exc)):  # fmt: skip
                raise
            _localize_crash(report, module, recorded, args, kwargs, want, device, atol, rtol, stat, exc, repro)
            return report
        got = run.outputs if want is None else _by_path(report, run.outputs, run.tree, want_tree)
        report.problems.extend(run.problems)
        report.notes.extend(run.notes)
        sightings = [run.sightings] if run.sightings is not None else []
        report.warnings += run.warnings
        progress.report(f"comparing {len(got)} output{'' if len(got) == 1 else 's'}")
        if save_outputs is not None:
            save_tensors(tensors_only(got, "outputs"), save_outputs)
        if kept is not None:
            kept.extend(tensors_only(got, "outputs"))
        if kept_reference is not None:
            kept_reference.append(_recorded_run(module, runnable, args, kwargs, device, report.source))
        rank_file = (
            in_process_rank_file
            or rank_relay.client() is not None
            or (loaded is not None and loaded.manifest_text is not None)
        )
        if want is None:  # (inputs alone: nothing to compare with)
            _range_end_runs(report, program, runnable, (args, kwargs), range_ends, seed, device, run.outputs, None,
                            atol, rtol, stat, sightings, rank_file=rank_file)  # fmt: skip
            if random_inputs:
                _random_runs(report, program, runnable, (args, kwargs), random_inputs, seed, device, None, atol, rtol,
                             stat, sightings)  # fmt: skip
            report.warnings += garbage_warnings(sightings)
            return report
        if len(got) != len(want):
            report.problems.append(f"the program returns {len(got)} outputs, the reference {len(want)}")
        for index, (actual, reference_output) in enumerate(zip(got, want, strict=False)):
            comparison = compare_output(
                index, actual, reference_output, tolerance_for(atol, index), tolerance_for(rtol, index), stat,
                top_k=top_k, min_top_k_agreement=min_top_k_agreement,
            )  # fmt: skip
            report.outputs.append(comparison)
            if comparison.problem:
                report.problems.append(comparison.problem)
        if top_k is not None and not any(output.top_k is not None for output in report.outputs):
            unranked = (f"--top-k {top_k}: no output was ranked (none is floating point with at least {top_k} "
                        "values in its last dimension)")  # fmt: skip
            # (a floor asked for and nothing held to it: no pass)
            (report.notes if min_top_k_agreement is None else report.problems).append(unranked)
        mismatch = any(not o.ok for o in report.outputs)
        # (every rank of a rank set takes this branch or none does: its replays run collectives)
        if rank_relay.any_rank(per_engine or (mismatch and recorded is not None), in_process=in_process_rank_file):
            packaged = loaded is not None and loaded.kind == AOTI_PACKAGE
            try:
                with loaded.reading_ahead() if loaded is not None else contextlib.nullcontext():
                    _compare_boundaries(
                        report, module, recorded, args, kwargs, want, device, atol, rtol, stat,
                        automatic=not per_engine, packaged=packaged, repro=repro,
                    )  # fmt: skip
            except VerifyInputError as exc:
                if per_engine:
                    raise
                # Asked for nothing more than outputs: their mismatch stands, with why engines could not be compared.
                report.notes.append(f"engine by engine comparison not possible: {exc}")
        _range_end_runs(report, program, runnable, (args, kwargs), range_ends, seed, device, run.outputs,
                        expected_module, atol, rtol, stat, sightings, rank_file=rank_file,
                        kept=kept_range_ends, reference_program=reference_program,
                        reference_file=None if expected_from is None else os.fspath(expected_from))  # fmt: skip
        if random_inputs:
            _random_runs(
                report, program, runnable, (args, kwargs), random_inputs, seed, device, expected_module, atol, rtol,
                stat,
                sightings,
            )  # fmt: skip
        report.warnings += garbage_warnings(sightings)
        return report


def _given_tree(expected: Any) -> OutputTree | None:
    """The structure of expected outputs a caller gave: None where they are a tensor or a flat list or tuple of
    values (nothing says how a caller reads them), else how they are nested (a dict of ``torch.save``)."""
    return None if is_flat(expected) else describe(expected)


def _tree_argument(tree: OutputTree | None, expected: Sequence[Any] | None) -> OutputTree | None:
    """The expected outputs' structure the parent sent, checked against the values it sent with it."""
    if tree is None or expected is None:
        return None
    if len(tree.paths) != len(expected):
        raise VerifyInputError(
            f"the expected outputs: an output structure must be a string and one path per output ({len(expected)})"
        )
    return tree


def _by_path(report: VerifyReport, got: list[Any], tree: OutputTree | None, want: OutputTree | None) -> list[Any]:
    """The program's output values in the reference's order, paired by path (:mod:`trt_inline.output_tree`), its
    structure held to the reference's (a problem naming the path); where the reference is a flat list of values, a
    note that names were not checked."""
    if tree is None:
        return got
    if want is None:
        if tree.named:
            report.notes.append(
                "output names were not checked: the reference is a flat list of values, and the program returns "
                f"{tree.structure[:120]}"
            )
        return got
    report.problems += structure_problems(tree, want)
    order = paired_by_path(tree, want)
    return got if order is None else [got[index] for index in order]


def _compare_boundaries(
    report: VerifyReport,
    module: torch.fx.GraphModule | None,
    recorded: list[EngineBoundary] | None,
    args: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    want: list[torch.Tensor],
    device: str | None,
    atol: Tolerance,
    rtol: Tolerance,
    stat: str,
    *,
    automatic: bool,
    packaged: bool,
    repro: list[Any] | None = None,
) -> None:
    """Engine by engine against the recorded boundaries: the per-boundary table and the first divergence."""
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
    _localized(
        report, trace, recorded, want, atol, rtol, stat, module, ProgramInputs(module).flatten(args, kwargs), repro
    )


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
    atol: Tolerance,
    rtol: Tolerance,
    stat: str,
    module: torch.fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    repro: list[Any] | None = None,
) -> None:
    """The trace against the compiled module's boundaries, into the report: the table and the first divergence
    (inside it, for a reference engine: the first of its steps that loses precision)."""
    reference = BoundaryReference("the compiled module", recorded, want)
    report.boundaries, report.divergence = localize(trace, reference, atol, rtol, stat)
    report.problems += own_error_problems(report.boundaries)
    if report.divergence is not None:
        report.problems.append(f"first divergence: {report.divergence.where}")
    index = diverged_engine(report.divergence)
    if report.divergence is not None and report.divergence.kind == "engine" and index is not None:
        if index < len(trace.calls) and index < len(recorded):
            inside = drill_down(module, trace.calls[index].node, recorded[index].inputs)
            if inside is not None:
                report.divergence.detail += f"; {inside}"
    if repro is not None:
        _extract(report, trace, recorded, want, module, inputs, repro)


def _extract(
    report: VerifyReport,
    trace: ProgramTrace,
    recorded: list[EngineBoundary],
    want: list[torch.Tensor],
    module: torch.fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    repro: list[Any],
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
    recorded: list[EngineBoundary] | None,
    args: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    want: list[torch.Tensor],
    device: str | None,
    atol: Tolerance,
    rtol: Tolerance,
    stat: str,
    failure: VerifyInputError,
    repro: list[Any] | None = None,
) -> None:
    """The program raised on its own reference inputs: the report names where, engine by engine where it can."""
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
    _localized(
        report, trace, recorded, want, atol, rtol, stat, module, ProgramInputs(module).flatten(args, kwargs), repro
    )


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
    atol: Tolerance,
    rtol: Tolerance,
    stat: str,
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
                problem = _module_differs(outputs, expected_module, draw.args, draw.kwargs, atol, rtol, stat)
        run = {"iteration": iteration, "sizes": draw.shapes(), "symbols": draw.symbols}
        report.random_runs.append({**run, "ok": problem is None, "problem": problem})
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


def _module_differs(
    outputs: Sequence[Any],
    expected_module: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    atol: Tolerance,
    rtol: Tolerance,
    stat: str,
) -> str | None:
    """How ``outputs`` differ from what ``expected_module`` returns for the same inputs; None where they agree."""
    with normal_call(), buffers_restored(expected_module) as restored:
        want = tensors_only(restored.apart(expected_module(*args, **kwargs)), "expected outputs")
    differ = [
        c.problem
        for i, (got, ref) in enumerate(zip(outputs, want, strict=False))
        if (c := compare_output(i, got, ref, tolerance_for(atol, i), tolerance_for(rtol, i), stat)).problem
    ]
    if len(outputs) != len(want):
        differ.append(f"{len(outputs)} outputs, the module {len(want)}")
    return "; ".join(p for p in differ if p) or None


def _range_end_runs(
    report: VerifyReport,
    program: ExportedProgram | None,
    runnable: Callable[..., Any],
    sample: tuple[Sequence[Any], dict[str, Any]],
    mode: str,
    seed: int,
    device: str | None,
    baseline: Sequence[Any],
    expected_module: Callable[..., Any] | None,
    atol: Tolerance,
    rtol: Tolerance,
    stat: str,
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
                problem = _module_differs(ran.outputs, expected_module, draw.args, draw.kwargs, atol, rtol, stat)
            elif reference_program is not None:
                try:
                    problem = _module_differs(ran.outputs, reference_program, draw.args, draw.kwargs, atol, rtol, stat)
                except RefusedOperatorError:
                    raise
                except Exception as exc:  # (its own guard or kernel refused the size: nothing to compare with)
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


def _reference_of(
    path: str | os.PathLike[str], allow_pickle: bool, allow_native_code: bool
) -> tuple[ReferenceIO, torch.fx.GraphModule | None]:
    """The reference I/O embedded in another file (safety-checked like the file being verified), or a boundaries
    file's (``load_boundaries``); and that file's runnable program where it is an ExportedProgram file (what the
    runs at the ends of the dynamic ranges are compared with)."""
    with open(path, "rb") as handle:
        if is_boundaries_file(handle.read(64)):
            handle.seek(0)
            return decode_boundaries_file(handle.read(), os.fspath(path)), None
    loaded = open_file(path, allow_pickle=allow_pickle, allow_native_code=allow_native_code)
    if loaded.reference is None:
        raise VerifyInputError(f"{Path(path)}: carries no reference I/O to check against (save it with arg_inputs)")
    runnable = loaded.module if loaded.program is not None and loaded.kind != AOTI_PACKAGE else None
    return loaded.reference, runnable


def _inputs_mismatch(
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
    mismatch = None if module is None else _inputs_mismatch(module, reference.args, reference.kwargs, giver)
    if mismatch is not None:
        raise VerifyInputError(f"{source} {mismatch.removeprefix('it ')}")
    outputs = len(program.graph_signature.user_outputs)
    if outputs != len(reference.outputs):
        raise VerifyInputError(
            f"{source} returns {outputs} outputs, the reference in {reference_source} has {len(reference.outputs)}"
        )
