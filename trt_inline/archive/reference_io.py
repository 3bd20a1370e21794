"""Reference I/O: sample inputs and the in-memory module's outputs, carried inside a saved file.

Stored as one extra file of the archive (``trt_inline_reference_io.b64``): base64
of a ``torch.save`` blob holding plain tensors, strings and lists only, read back
by the strict reader (:mod:`trt_inline.archive.pickles`), so reading it never
unpickles anything. ``trt_inline.save`` (and the patched ``torch_tensorrt.save``) write it;
verification reads it.

Boundary data (``embed_reference="boundaries"``) adds, per engine call of the
compiled module in the order it ran, the engine's inputs and outputs
(:class:`EngineBoundary`, recorded by :mod:`trt_inline.verify.boundaries`): what
``verify --per-engine`` replays each engine on and compares every boundary with.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trt_inline.archive.pickles import read_torch_save
from trt_inline.archive.views import BytesView
from trt_inline.errors import UnsafeArchiveError, VerifyInputError, first_line
from trt_inline.formats import REFERENCE_IO_FILE
from trt_inline.inlining.scalars import kinds_of
from trt_inline.output_tree import OutputTree, describe, values

__all__ = [
    "REFERENCE_IO_FILE",
    "EngineBoundary",
    "ReferenceIO",
    "capture_reference_io",
    "decode_boundaries",
    "decode_boundaries_file",
    "decode_reference_io",
    "encode_boundaries_file",
    "encode_reference_io",
    "is_boundaries_file",
    "plain_boundaries",
    "reference_from_payload",
    "reference_payload",
    "tensors_only",
]

_VERSION = 1
_DEVICE = re.compile(r"^(cpu|cuda(:[0-9]+)?)$")


@dataclass
class EngineBoundary:
    """One engine call of the compiled module: its inputs and outputs as it ran on the sample inputs."""

    # The engine's submodule in the compiled module ("_run_on_acc_1").
    name: str
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    # Where each input came from in the compiled module: "input x", "_run_on_gpu_2 output 0".
    sources: list[str] = field(default_factory=list)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.inputs, *self.outputs))


@dataclass
class ReferenceIO:
    args: list[torch.Tensor]
    kwargs: dict[str, torch.Tensor]
    outputs: list[torch.Tensor]
    # Where the inputs were when captured: verify runs there by default (TensorRT engines need CUDA).
    device: str = "cpu"
    # What each output was before it was kept as a tensor: "tensor", or "int"/"float"/"bool" for a scalar.
    output_kinds: list[str] = field(default_factory=list)
    # Every engine call's inputs and outputs, in the order they ran; None where not recorded.
    boundaries: list[EngineBoundary] | None = None
    # Which exported node each value between PyTorch and an engine is: {"engines": [{"inputs": [...],
    # "outputs": [...]}, ...], "outputs": [...]} ("" where unknown); None where not recorded
    # (trt_inline.verify.boundaries.provenance).
    provenance: dict[str, Any] | None = None
    # How a caller reads the outputs (dict keys, nesting, None): None for a file saved before it was kept.
    output_tree: OutputTree | None = None

    def nbytes(self, *, boundaries: bool = True) -> int:
        tensors = [*self.args, *self.kwargs.values(), *self.outputs]
        size = sum(t.numel() * t.element_size() for t in tensors)
        return size + (sum(b.nbytes() for b in self.boundaries or ()) if boundaries else 0)


def tensors_only(outputs: Any, what: str) -> list[torch.Tensor]:
    """The values of ``outputs`` as CPU tensors, ``None`` left out (:func:`trt_inline.output_tree.values`: it is
    structure); Python numbers (a scalar output) become 0-d tensors."""
    leaves = values(outputs)
    bad = [type(v).__name__ for v in leaves if not isinstance(v, (torch.Tensor, bool, int, float))]
    if bad:
        raise VerifyInputError(f"{what} must be tensors, got {', '.join(sorted(set(bad)))}")
    return [v.detach().cpu() if isinstance(v, torch.Tensor) else torch.tensor(v) for v in leaves]


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
        tensors_only(outputs, "outputs"),
        device=str(flat[0].device) if flat else "cpu",
        output_kinds=kinds_of(values(outputs)),
        output_tree=describe(outputs),
    )


def encode_reference_io(reference: ReferenceIO) -> str:
    """The extra-file text holding ``reference``."""
    buffer = io.BytesIO()
    torch.save(reference_payload(reference), buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_reference_io(text: str) -> ReferenceIO:
    """Read reference I/O back with the strict reader (:mod:`trt_inline.archive.pickles`): plain tensors only.

    Every string in it (names, sources, kinds, the device) is escaped as it is decoded.
    """
    try:
        blob = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise VerifyInputError(f"embedded reference I/O is not base64: {first_line(exc)}") from exc
    try:
        payload = read_torch_save(BytesView(blob), REFERENCE_IO_FILE)
    except UnsafeArchiveError as exc:
        raise VerifyInputError(
            f"embedded reference I/O refused: it holds something other than plain tensors ({exc})"
        ) from None
    return reference_from_payload(payload)


def reference_from_payload(payload: Any) -> ReferenceIO:
    """Reference I/O from what the strict reader gave for :func:`encode_reference_io`'s ``torch.save``: checked."""
    if not isinstance(payload, dict) or payload.get("version") != _VERSION:
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
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise VerifyInputError("embedded reference I/O names no valid device")
    kinds = payload.get("output_kinds", [])
    kinds = [str(kind) for kind in kinds] if isinstance(kinds, list) else []
    boundaries = decode_boundaries(payload.get("boundaries"))
    provenance = payload.get("provenance")
    if provenance is not None and not _is_provenance(provenance):
        raise VerifyInputError("embedded reference I/O: its provenance must be lists of node names")
    tree = payload.get("output_tree")
    try:
        output_tree = None if tree is None else OutputTree.from_plain(tree, len(outputs), "embedded reference I/O")
    except ValueError as exc:
        raise VerifyInputError(str(exc)) from None
    return ReferenceIO(
        list(args), {str(k): v for k, v in kwargs.items()}, list(outputs), device, kinds, boundaries, provenance,
        output_tree,
    )  # fmt: skip


def _is_provenance(value: Any) -> bool:
    """Whether ``value`` has the shape :func:`trt_inline.verify.boundaries.provenance` gives (strings in lists)."""

    def names(entry: Any) -> bool:
        return isinstance(entry, list) and all(isinstance(name, str) for name in entry)

    engines = value.get("engines") if isinstance(value, dict) else None
    return (
        isinstance(engines, list)
        and names(value.get("outputs"))
        and all(isinstance(e, dict) and names(e.get("inputs")) and names(e.get("outputs")) for e in engines)
    )


def reference_payload(reference: ReferenceIO) -> dict[str, Any]:
    """What :func:`encode_reference_io` saves: tensors, strings and lists only."""
    return {
        "version": _VERSION,
        "args": [t.detach().cpu() for t in reference.args],
        "kwargs": {k: v.detach().cpu() for k, v in reference.kwargs.items()},
        "outputs": [t.detach().cpu() for t in reference.outputs],
        "device": reference.device,
        "output_kinds": list(reference.output_kinds),
        **({} if reference.boundaries is None else {"boundaries": plain_boundaries(reference.boundaries)}),
        **({} if reference.provenance is None else {"provenance": reference.provenance}),
        **({} if reference.output_tree is None else {"output_tree": reference.output_tree.to_plain()}),
    }


# A boundaries file (verify --save-boundaries): this line, then the reference I/O as a file embeds it.
_BOUNDARIES_HEADER = b"trt-inline boundaries 1\n"


def encode_boundaries_file(reference: ReferenceIO) -> bytes:
    """A run's inputs, outputs and every engine boundary, as ``--load-boundaries`` reads them."""
    return _BOUNDARIES_HEADER + encode_reference_io(reference).encode("ascii") + b"\n"


def is_boundaries_file(start: bytes) -> bool:
    """Whether a file beginning with ``start`` is a boundaries file (rather than a ``.pt2`` archive)."""
    return start.startswith(_BOUNDARIES_HEADER)


def decode_boundaries_file(data: bytes, source: str) -> ReferenceIO:
    """What :func:`encode_boundaries_file` wrote, read strictly (plain tensors only); it must hold boundaries."""
    if not data.startswith(_BOUNDARIES_HEADER):
        raise VerifyInputError(f"{source}: not a boundaries file (trt-inline verify --save-boundaries writes them)")
    try:
        text = data[len(_BOUNDARIES_HEADER) :].strip().decode("ascii")
    except UnicodeDecodeError:
        raise VerifyInputError(f"{source}: a boundaries file holds base64 text after its first line") from None
    try:
        reference = decode_reference_io(text)
    except VerifyInputError as exc:
        raise VerifyInputError(f"{source}: {exc}") from None
    if not reference.boundaries:
        raise VerifyInputError(f"{source}: holds no engine boundaries")
    return reference


def plain_boundaries(records: Sequence[EngineBoundary]) -> list[dict[str, Any]]:
    """Boundary records as dicts of CPU tensors, strings and lists: how they are stored and cross processes."""
    return [
        {
            "name": b.name,
            "inputs": [t.detach().cpu() for t in b.inputs],
            "outputs": [t.detach().cpu() for t in b.outputs],
            "sources": list(b.sources),
        }
        for b in records
    ]


def decode_boundaries(value: Any) -> list[EngineBoundary] | None:
    """The records :func:`plain_boundaries` gave, checked to be what it writes (refused otherwise); None for None."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise VerifyInputError("embedded boundary data must be a list of engine records")
    boundaries = []
    for index, entry in enumerate(value):
        name, inputs, outputs, sources = (entry.get(k) for k in ("name", "inputs", "outputs", "sources"))
        if not (
            isinstance(name, str)
            and isinstance(inputs, list)
            and isinstance(outputs, list)
            and isinstance(sources, list)
            and all(isinstance(t, torch.Tensor) for t in [*inputs, *outputs])
            and all(isinstance(s, str) for s in sources)
        ):
            raise VerifyInputError(
                f"embedded boundary data: engine record {index} must hold a name and lists of tensors"
            )
        boundaries.append(EngineBoundary(name, list(inputs), list(outputs), list(sources)))
    return boundaries
