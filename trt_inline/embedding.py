"""What a save embeds so that the file can be checked later, and when it leaves it out.

Reference I/O (the sample inputs and the compiled module's outputs for them, the
expected outputs) goes into the file as an extra entry encoded by
:mod:`trt_inline.archive.reference_io`; an AOTInductor package also records what
kind of value each output is. With ``boundaries=True`` (``embed_reference="boundaries"``)
the same run also records every engine call's inputs and outputs
(:mod:`trt_inline.verify.boundaries`), for ``trt-inline verify --per-engine``.
Above a size limit the reference I/O is left out, with a warning that says how to
verify without it; boundary data asked for is never left out: past its limit (1 GiB
by default, what ViT-B/16 needs at batch 8) the save is refused, naming the size.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.fx

from trt_inline import engines, package
from trt_inline.archive.reference_io import REFERENCE_IO_FILE, capture_reference_io, encode_reference_io
from trt_inline.errors import SaveError, VerifyInputError
from trt_inline.formats import BOUNDARIES, PACKAGE_INFO_FILE
from trt_inline.inlining.module_state import buffers_restored
from trt_inline.verify.boundaries import provenance, record_program_boundaries, recording

__all__ = [
    "DEFAULT_BOUNDARIES_LIMIT_BYTES", "DEFAULT_REFERENCE_LIMIT_BYTES", "embeds_boundaries", "reference_extra_files",
    "reference_limit",
]  # fmt: skip

DEFAULT_REFERENCE_LIMIT_BYTES = 64 << 20
# With boundary data asked for (embed_reference="boundaries"): every engine's inputs and outputs, which an ordinary
# model's take hundreds of MiB of (vit_b_16: 70.4 MiB at batch 1).
DEFAULT_BOUNDARIES_LIMIT_BYTES = 1 << 30


def reference_limit(limit: int | None, boundaries: bool) -> int:
    """The limit on what a save embeds: the one given, else the default for what was asked for."""
    if limit is not None:
        return limit
    return DEFAULT_BOUNDARIES_LIMIT_BYTES if boundaries else DEFAULT_REFERENCE_LIMIT_BYTES


def embeds_boundaries(embed_reference: bool | str) -> bool:
    """Whether ``embed_reference`` asks for boundary data: ``True``/``False``, or ``"boundaries"``."""
    if isinstance(embed_reference, bool):
        return False
    if embed_reference == BOUNDARIES:
        return True
    raise SaveError(f"embed_reference must be True, False or {BOUNDARIES!r}, got {embed_reference!r}")


def _is_flat(module: Any) -> bool:
    """A flat program's module (engines as op calls), rather than a compiled one (engines as submodules)."""
    return isinstance(module, torch.fx.GraphModule) and any(engines.is_engine_call(n) for n in module.graph.nodes)


def reference_extra_files(
    module: Any,
    arg_inputs: Sequence[Any] | None,
    kwarg_inputs: dict[str, Any] | None,
    target: Path,
    limit: int,
    *,
    with_output_kinds: bool = False,
    boundaries: bool = False,
) -> dict[str, str]:
    """The extra file carrying reference I/O, or nothing (with a warning saying why).

    ``with_output_kinds`` adds a package's output-kinds file, as the sample run saw them;
    ``boundaries`` every engine call's inputs and outputs.
    """
    args = list(arg_inputs or ())
    try:
        # Each run starts from the module's buffers (a KV cache, a counter) as the save found them, and leaves them
        # so: the stock save runs nothing.
        with buffers_restored(module) as restored, recording(module if boundaries else None) as records:
            reference_io = capture_reference_io(lambda *a, **k: restored.apart(module(*a, **k)), args, kwarg_inputs)
        if boundaries:
            if not records and _is_flat(module):  # (its trace puts the buffers back itself)
                records = record_program_boundaries(module, args, dict(kwarg_inputs or {}))
            reference_io.boundaries = records
        reference_io.provenance = provenance(module)
    except VerifyInputError as exc:
        warnings.warn(f"trt-inline: reference I/O not embedded in {target}: {exc}", stacklevel=3)
        return {}
    if reference_io.boundaries is not None and reference_io.nbytes() > limit:
        # Asked for, and not silently left out: verify --per-engine would then advise to save with it.
        raise SaveError(
            f"{target}: engine boundary data (embed_reference='boundaries') takes "
            f"{reference_io.nbytes() / 2**20:.1f} MiB with the reference I/O, over the limit of "
            f"{limit / 2**20:.1f} MiB: raise reference_limit_bytes, or save with embed_reference=True (no boundary "
            "data; verify --per-engine then compares with the compiled module)"
        )
    size = reference_io.nbytes()
    if size > limit:
        warnings.warn(
            f"trt-inline: reference I/O not embedded in {target}: the sample inputs and outputs take "
            f"{size / 2**20:.1f} MiB, over the limit of {limit / 2**20:.1f} MiB "
            "(reference_limit_bytes); raise it, or verify with --inputs/--expected",
            stacklevel=3,
        )
        return {}
    extra = {REFERENCE_IO_FILE: encode_reference_io(reference_io)}
    if with_output_kinds:
        extra[PACKAGE_INFO_FILE] = package.package_info(reference_io.output_kinds)
    return extra
