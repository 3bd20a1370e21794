"""``torch_tensorrt.save`` that also embeds reference I/O, so ``trt-inline verify`` can check the file.

For ``output_format="exported_program"`` the reference I/O goes in as an extra
file (through ``extra_files`` where the release's save takes them, by rewriting
the archive otherwise: :attr:`trt_inline.releases.Release.save_extra_files`);
for ``"aot_inductor"`` the package is extended with it and with its output
kinds (:mod:`trt_inline.package`).

A rank file of a tensor-parallel save also gets its rank manifest, and (an
``exported_program`` with reference engines, or any with the wrapper's own
keyword ``embed_rank_check=True``) the rank check in its program
(:mod:`trt_inline.distributed.rank_check`): the program the stock save wrote is
read back and written again with it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.fx

from trt_inline import compat, distributed, embedding, engines, export, formats, package, releases
from trt_inline.distributed import rank_check
from trt_inline.distributed.manifest import RankManifest
from trt_inline.formats import REFERENCE_IO_ENV
from trt_inline.inlining.flat_program import in_signature_order
from trt_inline.plugin import ranges

__all__ = ["REFERENCE_IO_ENV", "sample_inputs_of_this_save", "save_with_reference_io"]


# The tensor inputs of the torch_tensorrt.save call in progress, for the exporter it calls
# (2.8 ... 2.10 hand theirs none; an AOTInductor package cannot be compiled without them).
_SAMPLE_INPUTS: contextvars.ContextVar[tuple[tuple[Any, ...], dict[str, Any]] | None] = contextvars.ContextVar(
    "trt_inline_sample_inputs", default=None
)


def sample_inputs_of_this_save() -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """(args, kwargs) given to the ``torch_tensorrt.save`` running now, if they are tensors."""
    return _SAMPLE_INPUTS.get()


def save_with_reference_io(stock_save: Callable[..., Any]) -> Callable[..., Any]:
    """``stock_save`` that also embeds reference I/O when given tensor inputs.

    Where the stock function takes ``extra_files`` (its release's record says so;
    its signature where the release is unknown), they go through it; otherwise
    the written archive is rewritten once with the extra file added.
    """
    release = releases.for_version(releases.installed_version() or "0.0")
    # Where retrace=True exports the inlined graph (2.11+), it is traced as trt_inline.save traces it.
    inlines_on_retrace = release is not None and release.retrace_inlines
    if release is not None:
        accepts_extra_files = release.save_extra_files
    else:
        accepts_extra_files = "extra_files" in inspect.signature(stock_save).parameters

    @functools.wraps(stock_save)
    def save(module: Any, file_path: str = "", **kwargs: Any) -> Any:
        # (the wrapper's own keyword: no release's save takes it)
        embed_rank_check = bool(kwargs.pop("embed_rank_check", False))
        if kwargs.get("kwarg_inputs"):  # (by name: the exporter takes the dict's order for the signature's)
            kwargs["kwarg_inputs"] = in_signature_order(module, kwargs["kwarg_inputs"])
        file_path = distributed.expand_path(file_path) if file_path else file_path
        # A rank set saves collectively: every rank must be here before the reference run's collectives.
        in_rank_set = distributed.in_rank_set()
        target = str(Path(file_path).resolve()) if file_path else None
        save_id = distributed.arrive("save", target=target) if in_rank_set else None
        extra = _reference_io_for_save(module, file_path, kwargs)
        manifest = None
        if save_id is not None and isinstance(module, torch.nn.Module):
            manifest = distributed.manifest_for(module, save_id)
            extra[distributed.MANIFEST_FILE] = manifest.encode()
        output_format = kwargs.get("output_format", formats.EXPORTED_PROGRAM)
        packaged = output_format == formats.AOT_INDUCTOR
        # The rank check goes into an exported program (a package's compiled code takes no node after the fact).
        checked = (
            manifest
            if manifest is not None
            and output_format == formats.EXPORTED_PROGRAM
            and rank_check.wanted(module, embed_rank_check)
            else None
        )
        if extra and accepts_extra_files and not packaged:
            kwargs["extra_files"] = {**(kwargs.get("extra_files") or {}), **extra}
        token = _SAMPLE_INPUTS.set(_tensor_inputs(kwargs))
        # (dynamic shapes may also come from the module's own symbolic sizes; static ones are unaffected)
        oblivious = inlines_on_retrace and kwargs.get("retrace", True)
        try:
            # Size-oblivious tracing, as trt_inline.save does (see trt_inline.export.to_exported_program):
            # otherwise a scalar an engine returns, equated with an input size, narrows Dim(min=1) to 2.
            with compat.backed_size_oblivious() if oblivious else contextlib.nullcontext():
                result = stock_save(module, file_path, **kwargs)
        finally:
            _SAMPLE_INPUTS.reset(token)
        if extra and packaged:
            package.extend_package(Path(file_path), Path(file_path), program=None, extra_files=extra)
        elif checked is not None or (extra and not accepts_extra_files):
            given = kwargs.get("extra_files") if accepts_extra_files else None
            _write_again(Path(file_path), extra, given, checked)
        legacy = not kwargs.get("retrace", True) or kwargs.get("use_legacy_exporter")
        if output_format == formats.EXECUTORCH and legacy:
            _warn_on_lowered_sizes(module, file_path)
        # Ranges are read back from an ExportedProgram file only (a package or an ExecuTorch .pte is none).
        if kwargs.get("dynamic_shapes") is not None and output_format == formats.EXPORTED_PROGRAM:
            _warn_on_narrowed_ranges(module, file_path, kwargs["dynamic_shapes"])
        return result

    save.__trt_inline_stock__ = stock_save  # type: ignore[attr-defined]
    return save


def _write_again(
    path: Path, extra: dict[str, str], given: dict[str, Any] | None, manifest: RankManifest | None
) -> None:
    """The program the stock save wrote, read back and written again with ``extra`` (where the release's save
    takes no extra files) and, with ``manifest``, the rank check; the extra files it was ``given`` kept."""
    kept = dict.fromkeys(given or {}, "")
    program = torch.export.load(path, extra_files=kept)  # (fills in each one's text)
    if manifest is not None:
        rank_check.insert_rank_check(program, manifest)
    export.write_program(program, path, {**kept, **extra})


def _warn_on_lowered_sizes(module: Any, file_path: str) -> None:
    """One warning where ExecuTorch's lowering of a legacy-exported program narrows a size an engine returns.

    ExecuTorch traces the program again to lower it. A size an engine returns is
    read back as a fresh symbol there, equated with the input size it stands
    for, and held to that size's internal range ``[2, max]``: the ``.pte``
    rejects a batch of 1 that a ``Dim(min=1)`` declares. Re-exported instead
    (``retrace=True`` without ``use_legacy_exporter``), the program carries the
    range declared for that symbol, and keeps it.
    """
    if not isinstance(module, torch.fx.GraphModule):
        return
    returned = [
        f"{node.target} output {index}"
        for node in module.graph.nodes
        if engines.is_accelerated_call(module, node)
        for index, value in enumerate(node.meta.get("val") or ())
        if isinstance(value, torch.SymInt)
    ]
    if returned:
        warnings.warn(
            f"trt-inline: {file_path}: output_format='executorch' from the legacy exporter (retrace=False or "
            "use_legacy_exporter=True): ExecuTorch traces the program again to lower it, and a size an engine returns "
            f"({', '.join(returned)}) is then held to [2, max], so the .pte rejects a size of 1 (or 0) that "
            "dynamic_shapes declares; retrace=True keeps the declared range",
            RuntimeWarning,
            stacklevel=3,
        )


def _warn_on_narrowed_ranges(module: Any, file_path: str, dynamic_shapes: Any) -> None:
    """One warning naming every declared size range the written file does not accept in full."""
    names = None
    if isinstance(module, torch.fx.GraphModule):
        names = [str(node.target) for node in module.graph.nodes if node.op == "placeholder"]
    problems = ranges.narrowed_ranges(file_path, dynamic_shapes, names)
    if problems:
        warnings.warn(
            f"trt-inline: {file_path} rejects sizes declared in dynamic_shapes ({'; '.join(problems)}); "
            "trt_inline.save(..., dynamic_shapes=...) writes a program that accepts them",
            RuntimeWarning,
            stacklevel=3,
        )


def _tensor_inputs(kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    args = tuple(kwargs.get("arg_inputs") or kwargs.get("inputs") or ())
    kwarg_inputs = dict(kwargs.get("kwarg_inputs") or {})
    values = [*args, *kwarg_inputs.values()]
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        return None  # torch_tensorrt.Input specs carry no data
    return args, kwarg_inputs


def _reference_io_for_save(module: Any, file_path: str, kwargs: dict[str, Any]) -> dict[str, str]:
    """The reference-I/O extra file for a ``torch_tensorrt.save`` call, or {} where it does not apply."""
    mode = formats.plugin_reference_mode()
    if mode is False:
        return {}
    output_format = kwargs.get("output_format", formats.EXPORTED_PROGRAM)
    if output_format not in formats.OUTPUT_FORMATS:
        return {}
    inputs = _tensor_inputs(kwargs)
    if not isinstance(module, torch.fx.GraphModule) or not file_path or inputs is None:
        return {}
    # A package's engines run inside its compiled code: no boundary of it could be compared.
    boundaries = embedding.embeds_boundaries(mode) and output_format != formats.AOT_INDUCTOR
    return embedding.reference_extra_files(
        module,
        list(inputs[0]),
        inputs[1],
        Path(file_path),
        embedding.reference_limit(None, boundaries),
        with_output_kinds=output_format == formats.AOT_INDUCTOR,
        boundaries=boundaries,
    )
