"""``verify``: its request (:class:`VerifyRequest`), the caller's side (the option groups, the expected module run
here, the child, what it hands back written: :func:`report_of_child`, which ``diff`` and rank sets read their
children with too) and the child's job (:func:`verify_job`); one verification's steps are
:class:`~trt_inline.verify.pipeline.Verification`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from trt_inline import distributed
from trt_inline.archive.output_types import stood_in_note
from trt_inline.archive.pickles import read_torch_save
from trt_inline.archive.reader import check_path
from trt_inline.archive.reference_io import (
    ReferenceIO,
    decode_boundaries,
    encode_boundaries_file,
    plain_boundaries,
    reference_from_payload,
    reference_payload,
    tensors_only,
)
from trt_inline.archive.views import BytesView
from trt_inline.distributed import relay as rank_relay
from trt_inline.errors import IsolationError, VerifyInputError, printable
from trt_inline.formats import atomic_write, format_size
from trt_inline.isolation import Limits, job, run_isolated
from trt_inline.output_tree import OutputTree, describe
from trt_inline.verify import range_ends
from trt_inline.verify.compare import Criteria, collapse_warnings
from trt_inline.verify.extract import repro_folder, write_repro
from trt_inline.verify.options import (
    VERIFY,
    Inputs,
    Isolation,
    Options,
    Outputs,
    Reference,
    Tolerances,
    Trust,
    VerifyFields,
    error_stat_checked,
    for_child,
    gather,
    normalize_tolerance,
    top_k_checked,
)
from trt_inline.verify.pipeline import Handed, Keep, Verification, given_tree, module_differs, run_expected_module
from trt_inline.verify.report import RANGE_END_NAMES, VerifyReport

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # (typing has it from 3.11)
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from trt_inline.distributed.relay import RelayServer

__all__ = [
    "ChildVerification",
    "VerifyRequest",
    "error_stat_checked",
    "normalize_tolerance",
    "report_of_child",
    "save_target",
    "save_tensors",
    "top_k_checked",
    "verify",
    "verify_job",
]


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

    def keep(self) -> Keep:
        """What the child hands back besides its report."""
        return Keep(outputs=self.keep_outputs, recorded_run=self.keep_reference, repro=self.extract,
                    range_ends=self.keep_range_ends)  # fmt: skip


def save_target(path: str | os.PathLike[str], flag: str = "--save-outputs") -> Path:
    """Where ``save_outputs`` (or another ``flag``'s file) goes, refused if its directory does not exist (checked
    once, before the run: the writers below take the target as checked)."""
    target = Path(path)
    if not target.parent.is_dir():
        raise VerifyInputError(f"{flag}: directory {target.parent} does not exist")
    return target


def save_tensors(tensors: object, path: str | os.PathLike[str]) -> None:
    """``torch.save`` of plain tensors (readable with ``weights_only=True``), written atomically."""
    with atomic_write(Path(path)) as tmp:
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

    The options come in six frozen groups, each field declared once with its type, default and help
    (:mod:`trt_inline.verify.options`: :class:`~trt_inline.verify.options.Inputs` what the program runs on,
    :class:`~trt_inline.verify.options.Reference` what its outputs are held to,
    :class:`~trt_inline.verify.options.Tolerances` how close, :class:`~trt_inline.verify.options.Trust` what a
    file may do, :class:`~trt_inline.verify.options.Isolation` the child process and its limits,
    :class:`~trt_inline.verify.options.Outputs` the files written). Every field may also be given as a keyword
    of its own: ``verify(path, atol=1e-3, random_inputs=2)``; a group given with one of its own fields as a
    keyword is a :class:`TypeError`. :func:`trt_inline.diff`, rank sets and ``--cases`` take the same groups.

    The expected outputs are, in order of preference: ``expected`` for ``arg_inputs``; what
    ``expected_module`` returns; the reference I/O of the file ``expected_from`` (or a boundaries file,
    ``load_boundaries``); none, with ``arg_inputs`` alone (it runs, nothing is compared: UNVERIFIED); the
    reference I/O the file embeds. ``report.expected_source`` says which, ``report.compared`` whether any.
    The steps (open, reference, run, compare, localize, more runs) are those of
    :class:`~trt_inline.verify.pipeline.Verification`: where an output differs and boundary data is at hand, or
    with ``per_engine``, ``report.divergence`` names the first engine or fallback region past tolerance. Every
    run is also held to what the graph declares (:mod:`trt_inline.verify.declared`), and what looks like
    garbage is a warning (:mod:`trt_inline.verify.garbage`; ``strict`` makes it a problem).

    Files are checked before loading (:mod:`trt_inline.archive.loading`) and, by default, loaded and run in a
    sandboxed child process (:mod:`trt_inline.isolation`) within a time and a memory limit: a crash there is
    an error here, never a crash of the caller. ``isolate=False`` (and an ExportedProgram given directly) runs
    in this process, for a file from a trusted source. With isolation, ``expected_module`` runs here, on
    ``arg_inputs``, which it then needs. The run leaves the caller's RNG state and deterministic-algorithm
    flags as they were.

    Raises :class:`VerifyInputError` for unusable input (not a loadable ExportedProgram file, inputs the
    program cannot take, a refused file, a limit the child hit: :class:`IsolationError`).
    """
    options = gather(VERIFY, fields, inputs=inputs, reference=reference, tolerances=tolerances, trust=trust,
                     isolation=isolation, outputs=outputs)  # fmt: skip
    inputs, reference, tolerances = options.inputs, options.reference, options.tolerances
    trust, isolation, outputs = options.trust, options.isolation, options.outputs
    extract = outputs.extract
    if reference.load_boundaries is not None:
        if any(given is not None for given in (reference.expected_from, reference.expected, reference.expected_module)):
            raise VerifyInputError("load_boundaries is the reference: give it without expected, expected_module "
                                   "or expected_from")  # fmt: skip
        # A boundaries file is read where a reference file is (expected_from), and compared engine by engine.
        reference = replace(reference, expected_from=reference.load_boundaries, per_engine=True)
        options = replace(options, reference=reference)
    _check_targets(outputs)
    if isinstance(path_or_program, ExportedProgram) or not isolation.isolate:
        # In this process a rank file's collectives run on the caller's own process group (a trusted file).
        keep = Keep(outputs=outputs.save_outputs is not None, recorded_run=outputs.save_boundaries is not None,
                    repro=extract is not None)  # fmt: skip
        verification = Verification(inputs, reference, tolerances, trust, keep, collectives=distributed.in_rank_set())
        report, handed = verification(path_or_program)
        _write_handed(report, handed, outputs, trust)
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
        returned, recorded = run_expected_module(
            expected_module, arg_inputs, dict(inputs.kwarg_inputs or {}), per_engine=reference.per_engine
        )
        expected, expected_tree = tensors_only(returned, "expected outputs"), describe(returned)
        label = "module"
    limits = Limits.for_file(path, isolation.timeout, isolation.memory_limit)
    if expected is not None and label is None:
        expected_tree, expected = given_tree(expected), tensors_only(expected, "expected outputs")
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
    report, handed = report_of_child(
        request, tensors, limits, where=path, files=files, isolation=isolation, read_ahead=path
    )
    if handed.range_ends and expected_module is not None and arg_inputs is not None:
        _compare_range_ends(
            report, handed.range_ends, expected_module, (arg_inputs, inputs.kwarg_inputs or {}), inputs.range_ends,
            tolerances.criteria(), where=path,
        )  # fmt: skip
    _write_handed(report, handed, outputs, trust)
    return strictly(report, tolerances.strict)


def _check_targets(outputs: Outputs) -> None:
    """Each file or folder the run will write, refused now where it cannot be written (once: before the run, which
    may be long, and before any child starts)."""
    if outputs.save_outputs is not None:
        save_target(outputs.save_outputs)
    if outputs.save_boundaries is not None:
        save_target(outputs.save_boundaries, "--save-boundaries")
    if outputs.extract is not None:
        repro_folder(outputs.extract)


def _write_handed(report: VerifyReport, handed: Handed, outputs: Outputs, trust: Trust) -> None:
    """What the verification handed back written where ``outputs`` asks (the targets checked before the run)."""
    if outputs.save_outputs is not None and handed.outputs is not None:
        save_tensors(handed.outputs, outputs.save_outputs)
    if outputs.save_boundaries is not None:
        _save_boundaries_or_say(report, handed.recorded_run, outputs.save_boundaries)
    if outputs.extract is not None:
        _write_extract(report, handed.repro, outputs.extract, trust.allow_native_code)


def strictly(report: VerifyReport, strict: bool) -> VerifyReport:
    """``report`` with a warning for each output that collapsed where its reference did not
    (:func:`~trt_inline.verify.compare.collapse_warnings`), its warnings made problems where ``strict``
    (``--strict``)."""
    report.warnings += collapse_warnings(report.outputs, report.warnings)
    if strict:
        report.problems += [f"{warning} (--strict)" for warning in report.warnings]
        report.warnings = []
    return report


class ChildVerification(Protocol):
    """A request whose job answers with a :class:`VerifyReport` (``verify``'s, ``diff``'s), and says what its child
    hands back besides."""

    def keep(self) -> Keep: ...


def report_of_child(
    request: ChildVerification,
    tensors: Any,
    limits: Limits,
    *,
    where: str,
    files: tuple[str, ...],
    isolation: Isolation,
    relay: RelayServer | None = None,
    read_ahead: str | None = None,
) -> tuple[VerifyReport, Handed]:
    """The report of a ``verify`` or ``diff`` job run in a child on ``request``, with what the child cost, and what
    it handed back as the request asked.

    The child's report is untrusted: it is read strictly, as the job declares its response
    (:meth:`VerifyReport.from_dict`: each field of its type, strings escaped and cut, at most ``MAX_COMPARISONS``
    comparisons), and what it hands back besides is read once by the strict reader, each part taken from it by its
    own check (plain tensors only). ``read_ahead``: the file whose weights the job reads, read ahead by this
    process (:func:`run_isolated`); ``relay``: the child is one rank of a rank set.
    """
    result = run_isolated(
        request, tensors, limits, where=where, files=files, sandbox=isolation.sandbox, debug=isolation.debug,
        relay=relay, read_ahead=read_ahead,
    )  # fmt: skip
    report = result.value
    # (what the job declares it answers with: a request whose job declares anything else is refused, never trusted)
    if not isinstance(report, VerifyReport):
        raise IsolationError(f"{where}: the child's job does not answer with a report")
    back = _handed_back(result.tensors, where)
    keep = request.keep()
    handed = Handed(
        outputs=_outputs_of_child(back, where) if keep.outputs else None,
        recorded_run=_reference_of_child(back, where) if keep.recorded_run else None,
        repro=_repro_of_child(back, where) if keep.repro else [],
        range_ends=_range_ends_of_child(back, where) if keep.range_ends else [],
    )
    report.child_peak_extra_bytes = max(0, result.peak_rss - result.base_rss)
    report.child_peak_anonymous_bytes, report.child_peak_file_bytes = result.peak_anonymous, result.peak_file
    walls = f"sandboxed: {result.sandbox}" if result.sandbox else "WITHOUT the OS sandbox (--no-sandbox)"
    if isolation.verbose:
        report.notes.append(
            f"loaded and run in a child process ({walls}; limits {limits.describe()}; its peak resident memory "
            f"{format_size(result.peak_rss)}, {format_size(report.child_peak_extra_bytes)} above its imports: "
            f"{format_size(result.peak_anonymous)} anonymous, {format_size(result.peak_file)} mapped from files)"
        )
    else:
        report.notes.append(f"run in a child process ({walls}; peak memory {format_size(result.peak_rss)})")
    return report, handed


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
    criteria: Criteria,
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
        problem = module_differs(entry["outputs"], expected_module, args, kwargs, criteria)
        run = report.range_end_runs[index]
        run.update(compared=True, ok=bool(run["ok"]) and problem is None, problem=problem or run.get("problem"))
        if problem is not None:
            symbols = ", ".join(f"{name}={value}" for name, value in run["symbols"].items())
            report.problems.append(f"at the {run['end']} of its dynamic ranges ({symbols}; sizes {run['sizes']}): "
                                   f"{problem}")  # fmt: skip


def _write_extract(
    report: VerifyReport, repro: list[tuple[str, bytes]], folder: str | os.PathLike[str], native_code: bool
) -> None:
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
    with atomic_write(Path(path)) as tmp:
        tmp.write_bytes(encode_boundaries_file(reference))


@job(VerifyRequest, response=VerifyReport)
def verify_job(request: VerifyRequest, tensors: dict[str, Any]) -> Any:
    """:func:`verify` inside the child process (the job :mod:`trt_inline.isolation.inside` runs), its tensors put
    back into the groups they travelled apart from.

    Returns the report, and what the request asked to have handed back (the parent writes or compares it).
    """
    keep = request.keep()
    verification = Verification(
        replace(request.inputs, arg_inputs=tensors["args"], kwarg_inputs=tensors["kwargs"]),
        replace(request.reference, expected=tensors["expected"]),
        request.tolerances,
        request.trust,
        keep,
        recorded=decode_boundaries(tensors.get("boundaries")),
        expected_tree=_tree_argument(request.expected_tree, tensors["expected"]),
        collectives=rank_relay.client() is not None,
    )
    report, handed = verification(request.path)
    if request.label:
        report.expected_source = request.label
    report.notes += [note] if (note := stood_in_note()) else []
    if keep == Keep():
        return report.to_dict()
    back: dict[str, Any] = {"outputs": handed.outputs or []}
    if handed.range_ends:
        back["range_ends"] = handed.range_ends
    if handed.recorded_run is not None:
        back["reference"] = reference_payload(handed.recorded_run)
    if handed.repro:
        back["repro"] = [
            {"what": what, "archive": torch.frombuffer(bytearray(archive), dtype=torch.uint8)}
            for what, archive in handed.repro
        ]
    return report.to_dict(), back


def _tree_argument(tree: OutputTree | None, expected: Sequence[Any] | None) -> OutputTree | None:
    """The expected outputs' structure the parent sent, checked against the values it sent with it."""
    if tree is None or expected is None:
        return None
    if len(tree.paths) != len(expected):
        raise VerifyInputError(
            f"the expected outputs: an output structure must be a string and one path per output ({len(expected)})"
        )
    return tree
