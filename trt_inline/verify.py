"""Verification of saved ExportedPrograms: does it load, is its graph sound, does it compute the same.

``verify`` runs, in order:

1. loading, with the file classified first so that garbage, truncated files,
   TorchScript archives and foreign zips are told apart (``VerifyInputError``);
2. structural checks on the graph: ``lint()``, use before definition, unused
   user inputs, ``get_attr`` targets, engine input counts (and, for reference
   engines, input dtypes and static dims), ``getitem`` indices and their
   ``meta["val"]`` against the producer's;
3. a run on reference inputs, compared output by output against reference
   outputs: the ones ``trt_inline.save`` embedded in the file, a reference module,
   or given tensors. Tolerances default per dtype.

Reference I/O is stored as an extra file of the archive: base64 of a
``torch.save`` blob, read back with ``torch.load(weights_only=True)``, so reading
it never unpickles arbitrary objects.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import operator
import os
import pickle
import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from trt_inline.attributes import resolve_attribute
from trt_inline.errors import TrtInlineError, first_line
from trt_inline.reference.engine import load_program

__all__ = [
    "REFERENCE_IO_FILE",
    "OutputComparison",
    "ReferenceIO",
    "VerifyInputError",
    "VerifyReport",
    "capture_reference_io",
    "decode_reference_io",
    "describe_value",
    "default_tolerance",
    "encode_reference_io",
    "load_exported_program",
    "structural_problems",
    "verify",
]

REFERENCE_IO_FILE = "trt_inline_reference_io.b64"
_REFERENCE_IO_VERSION = 1


class VerifyInputError(TrtInlineError, ValueError):
    """The input to verification is unusable: not an ExportedProgram file, no reference data, wrong inputs."""


# ---------------------------------------------------------------------------
# Reference I/O
# ---------------------------------------------------------------------------


@dataclass
class ReferenceIO:
    args: list[torch.Tensor]
    kwargs: dict[str, torch.Tensor]
    outputs: list[torch.Tensor]
    # Where the inputs were when captured: verify runs there by default (TensorRT engines need CUDA).
    device: str = "cpu"

    def nbytes(self) -> int:
        tensors = [*self.args, *self.kwargs.values(), *self.outputs]
        return sum(t.numel() * t.element_size() for t in tensors)


def _tensors_only(values: Any, what: str) -> list[torch.Tensor]:
    leaves = pytree.tree_leaves(values)
    bad = [type(v).__name__ for v in leaves if not isinstance(v, torch.Tensor)]
    if bad:
        raise VerifyInputError(f"{what} must be tensors, got {', '.join(sorted(set(bad)))}")
    return [t.detach().cpu() for t in leaves]


def capture_reference_io(
    module: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any] | None = None
) -> ReferenceIO:
    """Run ``module`` on the sample inputs and keep inputs and outputs (on the CPU)."""
    kwargs = kwargs or {}
    flat = [*args, *kwargs.values()]
    if not all(isinstance(value, torch.Tensor) for value in flat):
        raise VerifyInputError("reference I/O can only be kept for inputs that are tensors, not nested structures")
    with torch.no_grad():
        outputs = module(*args, **kwargs)
    return ReferenceIO(
        [a.detach().cpu() for a in args],
        {k: v.detach().cpu() for k, v in kwargs.items()},
        _tensors_only(outputs, "outputs"),
        device=str(flat[0].device) if flat else "cpu",
    )


def encode_reference_io(reference: ReferenceIO) -> str:
    """The extra-file text holding ``reference``."""
    buffer = io.BytesIO()
    torch.save(
        {
            "version": _REFERENCE_IO_VERSION,
            "args": [t.detach().cpu() for t in reference.args],
            "kwargs": {k: v.detach().cpu() for k, v in reference.kwargs.items()},
            "outputs": [t.detach().cpu() for t in reference.outputs],
            "device": reference.device,
        },
        buffer,
    )
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_reference_io(text: str) -> ReferenceIO:
    """Read reference I/O back; refuses anything but plain tensors (no arbitrary unpickling)."""
    try:
        blob = base64.b64decode(text.encode("ascii"), validate=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about the pickle protocol before refusing
            payload = torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise VerifyInputError(f"embedded reference I/O is not base64: {exc}") from exc
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise VerifyInputError(
            "embedded reference I/O refused: it holds something other than plain tensors "
            f"(read with torch.load(weights_only=True), which raised {type(exc).__name__})"
        ) from exc
    if not isinstance(payload, dict) or payload.get("version") != _REFERENCE_IO_VERSION:
        raise VerifyInputError("embedded reference I/O has an unknown layout")
    args, kwargs, outputs = payload.get("args"), payload.get("kwargs"), payload.get("outputs")
    if not (
        isinstance(args, list)
        and isinstance(kwargs, dict)
        and isinstance(outputs, list)
        and all(isinstance(t, torch.Tensor) for t in [*args, *kwargs.values(), *outputs])
    ):
        raise VerifyInputError("embedded reference I/O must hold lists of tensors")
    device = payload.get("device", "cpu")
    if not isinstance(device, str):
        raise VerifyInputError("embedded reference I/O names no valid device")
    return ReferenceIO(list(args), {str(k): v for k, v in kwargs.items()}, list(outputs), device)


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _zip_end_is_intact(file: Path) -> bool:
    """Whether the last end-of-archive record ends exactly at the end of the file.

    A truncated ``.pt2`` can still look like a zip: it embeds zips of its own
    (``torch.save`` blobs) whose end records ``zipfile`` finds instead.
    """
    size = file.stat().st_size
    with open(file, "rb") as handle:
        handle.seek(max(0, size - (1 << 16) - 22))
        tail = handle.read()
    position = tail.rfind(b"PK\x05\x06")
    if position < 0 or len(tail) - position < 22:
        return False
    comment_length = int.from_bytes(tail[position + 20 : position + 22], "little")
    return position + 22 + comment_length == len(tail)


def load_exported_program(path: str | os.PathLike[str]) -> tuple[ExportedProgram, ReferenceIO | None]:
    """Load an ExportedProgram file and its embedded reference I/O, classifying unusable files."""
    import trt_inline.reference  # noqa: F401  - registers the reference engine op for deserialisation

    file = Path(path)
    if not file.exists():
        raise VerifyInputError(f"{file}: no such file")
    if file.is_dir():
        raise VerifyInputError(f"{file}: is a directory")
    if file.stat().st_size == 0:
        raise VerifyInputError(f"{file}: empty file")
    if not zipfile.is_zipfile(file) or not _zip_end_is_intact(file):
        raise VerifyInputError(f"{file}: not a zip archive (truncated, or not written by torch.export.save)")
    try:
        with zipfile.ZipFile(file) as archive:
            names = archive.namelist()
            bad_member = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise VerifyInputError(f"{file}: damaged zip archive ({exc})") from exc
    if bad_member is not None:
        raise VerifyInputError(f"{file}: damaged zip archive (bad CRC in {bad_member})")
    if not any(
        name.endswith("/models/model.json") or name.endswith("/serialized_exported_program.json") for name in names
    ):
        if any(name.endswith("/code/__torch__.py") or name.endswith("/constants.pkl") for name in names):
            raise VerifyInputError(
                f"{file}: a TorchScript archive; verify reads ExportedProgram files (torch.export.save)"
            )
        raise VerifyInputError(f"{file}: a zip archive without an ExportedProgram in it")

    extra: dict[str, Any] = {REFERENCE_IO_FILE: ""}
    import logging

    logger = logging.getLogger("torch.export")
    previous = logger.level
    logger.setLevel(logging.ERROR)  # torch logs a traceback for every failed attempt; we report one line
    try:
        program = torch.export.load(file, extra_files=extra)
    except Exception as exc:
        first = first_line(exc)
        raise VerifyInputError(
            f"{file}: cannot be loaded by torch {torch.__version__} ({type(exc).__name__}: {first})"
        ) from exc
    finally:
        logger.setLevel(previous)
    text = extra.get(REFERENCE_IO_FILE) or ""
    if not text:
        return program, None
    try:
        return program, decode_reference_io(text)
    except VerifyInputError as exc:
        raise VerifyInputError(f"{file}: {exc}") from exc


# ---------------------------------------------------------------------------
# Structure
# ---------------------------------------------------------------------------


def _values(node: Any) -> list[Any] | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return list(val) if isinstance(val, (list, tuple)) else None


def _same_meta(a: Any, b: Any) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return True  # nothing to compare
    if a.dtype != b.dtype or a.dim() != b.dim():
        return False
    return all(not (isinstance(x, int) and isinstance(y, int)) or x == y for x, y in zip(a.shape, b.shape, strict=True))


def _engine_problems(node: torch.fx.Node) -> list[str]:
    problems: list[str] = []
    if node.target is torch.ops.trt_inline.execute_engine.default:
        wired, _, text = node.args
        inputs = list(wired) if isinstance(wired, (list, tuple)) else [wired]
        try:
            program = load_program(str(text))
        except TrtInlineError as exc:
            return [f"engine {node.name}: unreadable program ({exc})"]
        if len(inputs) != program.num_inputs:
            problems.append(f"engine {node.name}: {len(inputs)} inputs wired, the engine takes {program.num_inputs}")
        for index, (arg, spec) in enumerate(zip(inputs, program.input_specs, strict=False)):
            if spec is None or not isinstance(arg, torch.fx.Node) or not isinstance(arg.meta.get("val"), torch.Tensor):
                continue
            val = arg.meta["val"]
            dtype, dims = spec
            if (
                val.dtype != dtype
                or val.dim() != len(dims)
                or any(d is not None and isinstance(v, int) and v != d for v, d in zip(val.shape, dims, strict=False))
            ):
                problems.append(
                    f"engine {node.name}: input {index} is {arg.name} ({describe_value(val)}), "
                    f"the engine expects {str(dtype).removeprefix('torch.')}{list(dims)}"
                )
        vals = _values(node)
        if vals is not None and len(vals) != len(program.outputs):
            problems.append(
                f"engine {node.name}: meta lists {len(vals)} outputs, the engine has {len(program.outputs)}"
            )
    return problems


def describe_value(val: Any) -> str:
    """``float32[2, 3, 8, 8]`` for a tensor (fake or real), the type's name otherwise."""
    if isinstance(val, torch.Tensor):
        return f"{str(val.dtype).removeprefix('torch.')}{list(val.shape)}"
    return type(val).__name__


def _output_count(producer: torch.fx.Node) -> int | None:
    if producer.target is torch.ops.trt_inline.execute_engine.default:
        try:
            return len(load_program(str(producer.args[2])).outputs)
        except TrtInlineError:
            return None
    vals = _values(producer)
    return len(vals) if vals is not None else None


def structural_problems(program: ExportedProgram) -> tuple[list[str], list[str]]:
    """(problems, notes) of a program's graph. Problems fail verification; notes do not."""
    gm = program.graph_module
    graph = program.graph
    problems: list[str] = []
    notes: list[str] = []
    try:
        graph.lint()
    except Exception as exc:
        problems.append(f"lint: {first_line(exc)}")

    defined: set[torch.fx.Node] = set()
    for node in graph.nodes:
        for arg in node.all_input_nodes:
            if arg not in defined:
                problems.append(f"node {node.name} uses {arg.name} before it is defined")
        defined.add(node)

    user_inputs = set(program.graph_signature.user_inputs)
    for node in graph.nodes:
        if node.op == "placeholder" and not node.users:
            if node.name in user_inputs:
                problems.append(f"user input {node.name} is never used")
            else:
                notes.append(f"lifted input {node.name} is never used")
        elif node.op == "get_attr":
            try:
                resolve_attribute(gm, str(node.target))
            except AttributeError:
                problems.append(f"get_attr {node.name} names {node.target!r}, which the module does not have")
        elif node.op == "call_module":
            problems.append(f"node {node.name} calls submodule {node.target!r}; an ExportedProgram may not")
        elif node.op == "call_function":
            problems.extend(_engine_problems(node))
            if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
                producer, index = node.args[0], node.args[1]
                count = _output_count(producer)
                if count is not None and isinstance(index, int) and not -count <= index < count:
                    problems.append(f"{node.name} reads output {index} of {producer.name}, which has {count}")
                    continue
                vals = _values(producer)
                if vals is not None and isinstance(index, int) and -len(vals) <= index < len(vals):
                    if not _same_meta(node.meta.get("val"), vals[index]):
                        problems.append(
                            f"{node.name}: meta {describe_value(node.meta.get('val'))} disagrees with output {index} "
                            f"of {producer.name} ({describe_value(vals[index])})"
                        )
    if any(n.op == "call_function" and str(n.target).startswith("tensorrt.") for n in graph.nodes):
        notes.append("TensorRT engine inputs are not checked without the TensorRT runtime")
    return problems, notes


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------

_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for a dtype: exact for integers and booleans."""
    return _TOLERANCES.get(dtype, (0.0, 0.0))


@dataclass
class OutputComparison:
    index: int
    shape: list[int]
    dtype: str
    max_abs_diff: float
    max_rel_diff: float
    atol: float
    rtol: float
    ok: bool
    problem: str | None = None


@dataclass
class VerifyReport:
    """What :func:`verify` found. ``ok`` means every structural check passed *and* outputs were compared and agree."""

    source: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    outputs: list[OutputComparison] = field(default_factory=list)
    reference: str = "none"

    @property
    def compared(self) -> bool:
        return self.reference != "none"

    @property
    def ok(self) -> bool:
        return not self.problems and self.compared and all(o.ok for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        result = asdict(self)
        result.update(ok=self.ok, compared=self.compared)
        return result

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def _compare(
    index: int, actual: Any, expected: torch.Tensor, atol: float | None, rtol: float | None
) -> OutputComparison:
    default_atol, default_rtol = default_tolerance(expected.dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    shape, dtype = list(expected.shape), str(expected.dtype).removeprefix("torch.")
    if not isinstance(actual, torch.Tensor):
        return OutputComparison(
            index,
            shape,
            dtype,
            float("inf"),
            float("inf"),
            atol,
            rtol,
            False,
            f"output {index} is a {type(actual).__name__}",
        )
    actual = actual.detach().cpu()
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        mismatch = f"output {index} is {describe_value(actual)}, expected {describe_value(expected)}"
        return OutputComparison(index, shape, dtype, float("inf"), float("inf"), atol, rtol, False, mismatch)
    if expected.numel() == 0:
        return OutputComparison(index, shape, dtype, 0.0, 0.0, atol, rtol, True)
    a, e = actual.double(), expected.double()
    diff = (a - e).abs()
    nan_mismatch = bool((a.isnan() != e.isnan()).any())
    diff = torch.where(a.isnan() & e.isnan(), torch.zeros_like(diff), diff)
    max_abs = float(diff.max())
    max_rel = float((diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)).max())
    ok = not nan_mismatch and bool((diff <= atol + rtol * e.abs()).all())
    differs = None
    if not ok:
        differs = f"output {index} differs: max abs diff {max_abs:.6g}, max rel diff {max_rel:.6g}"
        differs += f" (atol {atol:g}, rtol {rtol:g})"
    return OutputComparison(index, shape, dtype, max_abs, max_rel, atol, rtol, ok, differs)


def _run(
    program: ExportedProgram, args: Sequence[torch.Tensor], kwargs: dict[str, torch.Tensor], device: str | None
) -> list[Any]:
    module = program.module()
    if device is not None:
        module = module.to(device)
        args = [a.to(device) for a in args]
        kwargs = {k: v.to(device) for k, v in kwargs.items()}
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(0)
    try:
        with torch.no_grad():
            outputs = module(*args, **kwargs)
    except Exception as exc:
        first = first_line(exc)
        raise VerifyInputError(
            f"the program does not accept the reference inputs ({type(exc).__name__}: {first})"
        ) from exc
    finally:
        torch.use_deterministic_algorithms(deterministic)
    return list(pytree.tree_leaves(outputs))


def verify(
    path_or_program: str | os.PathLike[str] | ExportedProgram,
    *,
    reference: Callable[..., Any] | None = None,
    arg_inputs: Sequence[torch.Tensor] | None = None,
    kwarg_inputs: dict[str, torch.Tensor] | None = None,
    expected: Sequence[torch.Tensor] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    device: str | None = None,
) -> VerifyReport:
    """Check a saved program's structure and compare its outputs with a reference.

    The reference is, in order of preference: ``expected`` outputs for
    ``arg_inputs``; a ``reference`` module run on ``arg_inputs`` (or on the
    embedded inputs); the reference I/O embedded by ``trt_inline.save``.
    Without any, only the structure is checked and ``report.compared`` is false.

    Raises :class:`VerifyInputError` for unusable input (not a loadable
    ExportedProgram file, inputs the program cannot take).
    """
    if isinstance(path_or_program, ExportedProgram):
        program, embedded, source = path_or_program, None, "<ExportedProgram>"
    else:
        program, embedded = load_exported_program(path_or_program)
        source = os.fspath(path_or_program)
    report = VerifyReport(source=source)
    report.problems, report.notes = structural_problems(program)

    kwargs = dict(kwarg_inputs or {})
    if expected is not None:
        if arg_inputs is None and not kwargs:
            raise VerifyInputError("expected outputs were given without the inputs they belong to")
        args, want, report.reference = list(arg_inputs or ()), _tensors_only(expected, "expected outputs"), "given"
    elif reference is not None:
        if arg_inputs is None and embedded is None:
            raise VerifyInputError("a reference module needs arg_inputs (the file embeds no inputs)")
        args = list(arg_inputs) if arg_inputs is not None else embedded.args  # type: ignore[union-attr]
        kwargs = kwargs or (embedded.kwargs if embedded is not None and arg_inputs is None else {})
        with torch.no_grad():
            want = _tensors_only(reference(*args, **kwargs), "reference outputs")
        report.reference = "module"
    elif embedded is not None:
        args, kwargs, want, report.reference = embedded.args, embedded.kwargs, embedded.outputs, "embedded"
        if device is None and embedded.device != "cpu":
            if not torch.cuda.is_available() and embedded.device.startswith("cuda"):
                raise VerifyInputError(
                    f"the reference was captured on {embedded.device} and no CUDA device is available here "
                    "(pass --device to run elsewhere)"
                )
            device = embedded.device
    else:
        report.notes.append("no reference I/O: outputs were not compared (give inputs and expected outputs)")
        return report

    got = _run(program, args, kwargs, device)
    if len(got) != len(want):
        report.problems.append(f"the program returns {len(got)} outputs, the reference {len(want)}")
    for index, (actual, reference_output) in enumerate(zip(got, want, strict=False)):
        comparison = _compare(index, actual, reference_output, atol, rtol)
        report.outputs.append(comparison)
        if comparison.problem:
            report.problems.append(comparison.problem)
    return report
