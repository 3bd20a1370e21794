"""A folder of real cases, each a pair of inputs and expected outputs, verified one by one (``verify --cases DIR``).

The layout, one folder per case (its name is the case's)::

    DIR/
      cat/inputs.pt       what --inputs reads: a tensor, a list of tensors, or {"args": [...], "kwargs": {...}}
      cat/expected.pt     what --expected reads: a tensor or a list of tensors
      dog/inputs.pt
      dog/expected.pt

Both are ``torch.save`` files read as ``--inputs`` / ``--expected`` are (:func:`load_tensor_file`:
``weights_only=True``, tensors only, on the CPU): they come from wherever the cases were collected. Other files
and hidden folders are left alone. Every case is read before any runs, so that an unusable one (a file missing,
unreadable, of another kind) is an error naming it before the first verdict.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trt_inline.archive.reader import check_path, is_saved_program
from trt_inline.errors import TrtInlineError, VerifyInputError, first_line, printable
from trt_inline.output_tree import is_flat
from trt_inline.verify.options import (
    CASES,
    CasesFields,
    Inputs,
    Isolation,
    Outputs,
    Reference,
    Tolerances,
    Trust,
    gather,
    untaken,
)
from trt_inline.verify.report import VerifyReport

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # (typing has it from 3.11)
    from typing_extensions import Unpack

__all__ = [
    "CASE_FILES",
    "Case",
    "CaseResult",
    "expected_outputs",
    "load_tensor_file",
    "read_cases",
    "split_inputs",
    "verify_cases",
    "worst_first",
]

# The two files of a case folder.
CASE_FILES = ("inputs.pt", "expected.pt")
# Worst first: an error, a failure, a run with nothing compared, a pass.
_RANK = {"ERROR": 0, "FAIL": 1, "UNVERIFIED": 2, "PASS": 3}


def load_tensor_file(path: str | os.PathLike[str], what: str) -> Any:
    """A ``torch.save`` file of tensors (``--inputs``, ``--expected``, a case's files), read with
    ``weights_only=True`` onto the CPU: no code of the file's runs. Raises :class:`VerifyInputError` naming it."""
    import torch

    if not os.path.exists(path):
        raise VerifyInputError(f"{what} file {path}: no such file")
    if os.path.isdir(path):
        raise VerifyInputError(f"{what} file {path}: is a directory")
    if is_saved_program(path):
        raise VerifyInputError(
            f"{what} file {path} is a saved program, not a torch.save file of tensors: give it as the file to "
            "verify, or as --expected-from NEW.pt2 (its embedded inputs and outputs become the reference)"
        )
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise VerifyInputError(
            f"{what} file {path} is not a tensor file readable with weights_only=True: {first_line(exc)}"
        ) from exc


def split_inputs(value: Any) -> tuple[list[Any], dict[str, Any]]:
    """An inputs file holds a tensor, a list/tuple of tensors, or {"args": [...], "kwargs": {...}}."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value], {}
    if isinstance(value, (list, tuple)):
        return list(value), {}
    if isinstance(value, dict) and set(value) <= {"args", "kwargs"}:
        args, kwargs = value.get("args", []), value.get("kwargs", {})
        if isinstance(args, (list, tuple)) and isinstance(kwargs, dict):
            return list(args), dict(kwargs)
    raise VerifyInputError('an inputs file holds a tensor, a list of tensors, or {"args": [...], "kwargs": {...}}')


def expected_outputs(value: Any) -> Any:
    """An expected-outputs file holds a tensor or a list/tuple of them (checked to be tensors by ``verify``), or
    the outputs as the program returns them (a dict, nested containers): then kept as they are, so that their
    structure is compared with the program's (:mod:`trt_inline.output_tree`)."""
    if is_flat(value):
        return list(value) if isinstance(value, list | tuple) else [value]
    return value


@dataclass
class Case:
    """One case of a folder: its name (the folder's), inputs and expected outputs."""

    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    expected: list[Any]


@dataclass
class CaseResult:
    """What verifying one file on one case found: its report, or the error that stopped it.

    ``case`` is None for a file verified on its own reference I/O (no ``--cases``); ``source`` names the file (or
    ``A against B`` for a diff).
    """

    source: str
    case: str | None
    report: VerifyReport | None
    error: str | None = None
    seconds: float = 0.0

    @property
    def status(self) -> str:
        """``ERROR`` (it could not be verified), else the report's ``PASS`` / ``FAIL`` / ``UNVERIFIED``."""
        return "ERROR" if self.report is None else self.report.status

    @property
    def worst_error(self) -> float:
        """The largest max abs diff of its outputs (inf for a NaN or Inf where the reference is finite); 0: none."""
        if self.report is None:
            return 0.0
        return max((output.max_abs_diff for output in self.report.outputs), default=0.0)

    @property
    def name(self) -> str:
        """``model.pt2 [cat]``: the file and the case."""
        return self.source if self.case is None else f"{self.source} [{self.case}]"


def worst_first(results: Sequence[CaseResult]) -> list[CaseResult]:
    """``results`` ordered ERROR, FAIL, UNVERIFIED, PASS, and within each the larger error first (then by name)."""
    return sorted(results, key=lambda r: (_RANK.get(r.status, 0), -r.worst_error, r.case or "", r.source))


def read_cases(folder: str | os.PathLike[str]) -> list[Case]:
    """Every case of ``folder`` (:mod:`this module's layout <trt_inline.verify.cases>`), by name, read.

    Raises :class:`VerifyInputError` naming the case for one that is unusable, and for a folder without cases.
    """
    root = Path(folder)
    if not root.is_dir():
        raise VerifyInputError(f"--cases {printable(str(root))}: no such folder")
    folders = sorted(entry for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if not folders:
        raise VerifyInputError(
            f"--cases {printable(str(root))} holds no case: each case is a folder of its own, "
            f"{printable(str(root))}/<case>/{CASE_FILES[0]} and {CASE_FILES[1]}"
        )
    cases = []
    for case_folder in folders:
        name = printable(case_folder.name)
        missing = [file for file in CASE_FILES if not (case_folder / file).is_file()]
        if missing:
            raise VerifyInputError(f"case {name} ({printable(str(case_folder))}) has no {' and no '.join(missing)}")
        try:
            args, kwargs = split_inputs(load_tensor_file(case_folder / CASE_FILES[0], "inputs"))
            expected = expected_outputs(load_tensor_file(case_folder / CASE_FILES[1], "expected"))
        except VerifyInputError as exc:
            raise VerifyInputError(f"case {name}: {exc}") from exc
        cases.append(Case(name, args, kwargs, expected))
    return cases


def verify_cases(
    path: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    *,
    inputs: Inputs | None = None,
    reference: Reference | None = None,
    tolerances: Tolerances | None = None,
    trust: Trust | None = None,
    isolation: Isolation | None = None,
    outputs: Outputs | None = None,
    **fields: Unpack[CasesFields],
) -> list[CaseResult]:
    """Verify the saved program ``path`` on every case of ``folder``, one :func:`~trt_inline.verify` each (its
    own child process); the results worst first (:func:`worst_first`).

    The options are :func:`~trt_inline.verify`'s groups (:mod:`trt_inline.verify.options`), or their fields as
    keywords, but for what a case gives or what writes one file (``arg_inputs``, ``kwarg_inputs``, ``expected``,
    ``expected_module``, ``expected_from``, ``load_boundaries``, the fields of
    :class:`~trt_inline.verify.options.Outputs`: a :class:`VerifyInputError`). A case that cannot be verified (the
    program refuses its inputs, the child hit a limit) is an ``ERROR`` result with the one-line error; the other
    cases still run. Raises :class:`VerifyInputError` for an unusable folder or case (:func:`read_cases`), before
    anything runs.
    """
    from trt_inline.verify.verifier import verify

    options = gather(CASES, fields, inputs=inputs, reference=reference, tolerances=tolerances, trust=trust,
                     isolation=isolation, outputs=outputs)  # fmt: skip
    given = untaken(options, CASES, fields)
    if given:
        raise VerifyInputError(f"each case gives its own inputs and expected outputs: {', '.join(given)} do not "
                               "apply with cases")  # fmt: skip
    source = os.fspath(path)
    # What is wrong with the file is wrong for every case (and the options were checked by gather): said once,
    # before any case runs.
    check_path(source)
    results = []
    for case in read_cases(folder):
        started = time.monotonic()
        try:
            report = verify(
                path,
                inputs=replace(options.inputs, arg_inputs=case.args, kwarg_inputs=case.kwargs),
                reference=replace(options.reference, expected=case.expected),
                tolerances=options.tolerances,
                trust=options.trust,
                isolation=options.isolation,
            )
        except TrtInlineError as exc:
            results.append(CaseResult(source, case.name, None, first_line(exc), time.monotonic() - started))
            continue
        results.append(CaseResult(source, case.name, report, None, time.monotonic() - started))
    return worst_first(results)
