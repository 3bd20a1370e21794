"""``reference.compile``: the structure of ``torch_tensorrt.dynamo.compile``, on the CPU.

``compile`` exports the model, decomposes it to core ATen, partitions it with
``_SplitterBase`` into ``_run_on_acc_N`` / ``_run_on_gpu_N`` submodules as
Torch-TensorRT's fast partitioner does, sets ``meta["val"]`` on every
accelerated call node (a list, even for one output, as ``compile_module`` does;
a scalar output is recorded as the scalar itself), and replaces each
accelerated block by a :class:`ReferenceEngine`. The result is the graph
Torch-TensorRT hands to its exporter, minus TensorRT: the whole
compile -> save -> load -> compare loop runs without a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from trt_inline import compat, releases
from trt_inline.engines import ACC_PREFIX
from trt_inline.errors import CompileError, first_line
from trt_inline.formats import PIPELINES, default_pipeline
from trt_inline.reference import release
from trt_inline.reference.engine import block_outputs, build_engine
from trt_inline.reference.lowered import LOWERED_ATTRIBUTE, lowered_nodes
from trt_inline.reference.partition import partition, resolve_ops
from trt_inline.reference.precision import (
    PrecisionSettings,
    calibrate,
    emulate_precision,
    low_precision_nodes,
    tf32_asked,
)

__all__ = ["PIPELINES", "compile", "rehearsing"]

log = logging.getLogger(__name__)


# The settings trt-inline's own partitioner and precision emulation take (with their defaults).
_OWN_DEFAULTS: dict[str, Any] = {
    "torch_executed_ops": (), "min_block_size": 1, "scalar_boundaries": True, "collectives_in_engines": False,
    "enabled_precisions": (), "enable_autocast": False, "autocast_low_precision_type": None,
    "autocast_excluded_nodes": (), "autocast_excluded_ops": (), "autocast_max_output_threshold": 512.0,
    "autocast_max_depth_of_reduction": None, "autocast_calibration_dataloader": None, "disable_tf32": None,
}  # fmt: skip


def compile(
    model: torch.nn.Module | torch.export.ExportedProgram,
    arg_inputs: Sequence[Any],
    *,
    pipeline: str = "auto",
    dynamic_shapes: Any = None,
    **settings: Any,
) -> torch.fx.GraphModule:
    """Compile ``model`` into engines and PyTorch fallbacks, as ``torch_tensorrt.dynamo.compile`` would.

    Args:
        model: an ``nn.Module`` (exported here, non-strict, with ``arg_inputs`` and ``dynamic_shapes``) or an
            ``ExportedProgram``.
        arg_inputs: example inputs, positionally.
        pipeline: ``"release"``: the importable Torch-TensorRT release's own pipeline
            (:mod:`trt_inline.reference.release`: its lowering, decompositions, autocast and partitioner, with its
            defaults, dry-run; each engine a reference engine); ``"own"``: trt-inline's own partitioner and
            precision emulation; ``"auto"`` (default): the release's where one is importable (one that needs
            another torch is an error naming both, never a silent change of pipeline), else trt-inline's own,
            and the module says so (its ``trt_inline_pipeline``, one line naming the release to install).
            ``TRT_INLINE_PIPELINE=own`` (or ``release``) makes ``"auto"`` mean that one.
        dynamic_shapes: as for ``torch.export.export``.
        settings: Torch-TensorRT's compile settings. On a release's pipeline, exactly what its
            ``dynamo.compile`` takes (anything it would ignore without a word is refused, naming it). On
            trt-inline's own: ``torch_executed_ops`` (OpOverloads or names such as ``"torch.ops.aten.relu.default"``,
            kept from decomposition as Torch-TensorRT keeps them), ``min_block_size`` (1 by default, where
            Torch-TensorRT's is 5, so that small models still get engines between their fallbacks), the precision
            settings (``enabled_precisions``, ``enable_autocast``, ``autocast_low_precision_type``,
            ``autocast_excluded_nodes`` matched against module paths, ``autocast_excluded_ops``,
            ``autocast_max_output_threshold`` and ``autocast_max_depth_of_reduction``,
            ``autocast_calibration_dataloader``, ``disable_tf32``: :mod:`trt_inline.reference.precision`), and its
            own ``scalar_boundaries`` (``False`` keeps scalar-producing nodes in PyTorch) and
            ``collectives_in_engines`` (``True`` places a tensor-parallel model's collectives in engines).

    Engines compute exactly what PyTorch computes unless a precision setting is given: then TensorRT's fp32
    accumulation is emulated, and TF32 for fp32 matmuls and convolutions unless ``disable_tf32=True`` (or where
    ``disable_tf32=False`` is given alone).

    Returns:
        A ``GraphModule`` called like the model, whose children are ``_run_on_acc_N``
        (:class:`ReferenceEngine`) and ``_run_on_gpu_N`` (``GraphModule``) submodules; its ``trt_inline_pipeline``
        says which pipeline built it.
    """
    if pipeline not in PIPELINES:
        raise ValueError(f"reference.compile: pipeline={pipeline!r}: one of {', '.join(map(repr, PIPELINES))}")
    if pipeline == "auto":
        pipeline = default_pipeline()
    what = type(model).__name__
    found = release.installed_release() if pipeline != "own" else None
    if pipeline == "release" and found is None:
        raise CompileError(
            "reference.compile: pipeline='release', but no Torch-TensorRT release is importable here: "
            + release.own_pipeline_note().rsplit(": ", 1)[1]
        )
    if found is None:
        note = release.own_pipeline_note(chosen=pipeline == "own")
        return _compile_own(model, arg_inputs, note, dynamic_shapes=dynamic_shapes, **settings)
    if isinstance(model, torch.export.ExportedProgram):
        exported = model
    else:
        with _step(f"exporting {what} (torch.export, non-strict)"):
            exported = compat.export_nonstrict(model, tuple(arg_inputs), None, dynamic_shapes)
    return release.compile_on_release(found, exported, arg_inputs, None, settings, tf32=tf32_asked(settings))


@contextlib.contextmanager
def rehearsing(
    model: torch.nn.Module, arg_inputs: Sequence[Any], *, dynamic_shapes: Any = None
) -> Iterator[Callable[..., torch.fx.GraphModule] | None]:
    """A compile of ``model`` for many settings, as :func:`compile` makes it, paying for the release's import once:
    ``build(**settings)`` on the importable release's pipeline (one export, one
    :class:`~trt_inline.reference.release.Rehearsal`); None where no release is importable (each compile is then
    trt-inline's own, which imports nothing)."""
    found = release.installed_release() if default_pipeline() != "own" else None
    if found is None:
        yield None
        return
    with _step(f"exporting {type(model).__name__} (torch.export, non-strict)"):
        exported = compat.export_nonstrict(model, tuple(arg_inputs), None, dynamic_shapes)
    with release.Rehearsal(found, exported, arg_inputs) as rehearsal:

        def build(**settings: Any) -> torch.fx.GraphModule:
            return rehearsal.compile(settings, tf32=tf32_asked(settings))

        yield build


def _check_precision_settings(given: Mapping[str, Any]) -> None:
    """The precision settings as the release this torch pairs with takes them (trt-inline's own pipeline emulates
    that release): ``enabled_precisions`` where it is weakly typed (2.5 ... 2.9), ``enable_autocast`` and
    ``autocast_*`` where it has them (2.10+); a setting it would not take is refused naming it."""
    record = releases.for_torch(torch.__version__)
    if record is None:  # (a torch no release requires yet: nothing to hold the settings to)
        return
    name = f"Torch-TensorRT {record.version} (the release torch {torch.__version__} pairs with)"
    wanted = {str(p).removeprefix("torch.") for p in given.get("enabled_precisions") or ()}
    if wanted - {"float32", "f32", "dtype.f32"} and record.precision != "weak":
        how = "without a word" if record.precision == "autocast" else "unless use_explicit_typing=False"
        raise CompileError(
            f"reference.compile: {name} ignores enabled_precisions {how}: for fp16 layers give enable_autocast=True, "
            "autocast_low_precision_type=torch.float16"
        )
    autocast = sorted(key for key in given if key.startswith(("enable_autocast", "autocast_")))
    if autocast and not record.autocast:
        raise CompileError(
            f"reference.compile: {name} has no {', '.join(autocast)} (rule-based autocast is 2.10+): for fp16 "
            "layers give enabled_precisions={torch.float16}"
        )


def _compile_own(
    model: torch.nn.Module | torch.export.ExportedProgram,
    arg_inputs: Sequence[Any],
    note: str,
    *,
    dynamic_shapes: Any,
    **given: Any,
) -> torch.fx.GraphModule:
    """trt-inline's own pipeline: export, decompose to core ATen, partition with ``_SplitterBase`` as
    Torch-TensorRT's fast partitioner is configured, emulate the precision settings."""
    unknown = sorted(set(given) - set(_OWN_DEFAULTS))
    if unknown:
        raise CompileError(
            f"reference.compile: trt-inline's own partitioner does not emulate {', '.join(unknown)} (it takes "
            f"{', '.join(_OWN_DEFAULTS)}); rehearse on a Torch-TensorRT release's pipeline for the others"
        )
    _check_precision_settings(given)
    settings = {**_OWN_DEFAULTS, **given}
    torch_executed_ops = settings["torch_executed_ops"]
    what = type(model).__name__
    overloads, packets = resolve_ops(torch_executed_ops)
    if isinstance(model, torch.export.ExportedProgram):
        exported = model
    else:
        with _step(f"exporting {what} (torch.export, non-strict)"):
            exported = compat.export_nonstrict(model, tuple(arg_inputs), None, dynamic_shapes)
    if not _is_core_aten(exported.graph):
        # The operators named to run in PyTorch are kept from decomposition, as Torch-TensorRT keeps them.
        with _step(f"decomposing {what}'s exported program to core ATen (run_decompositions)"):
            exported = _decomposed(exported, overloads | packets)
    flat = exported.module()
    _warn_unmatched(flat.graph, overloads, packets)
    if not isinstance(flat, torch.fx.GraphModule):
        raise TypeError(f"ExportedProgram.module() returned a {type(flat).__qualname__}, expected a GraphModule")

    sample_input = pytree.tree_leaves((tuple(arg_inputs), {}))
    precision = PrecisionSettings.from_compile_settings(
        enabled_precisions=settings["enabled_precisions"], enable_autocast=settings["enable_autocast"],
        autocast_low_precision_type=settings["autocast_low_precision_type"],
        autocast_excluded_nodes=settings["autocast_excluded_nodes"],
        autocast_excluded_ops=settings["autocast_excluded_ops"],
        autocast_max_output_threshold=settings["autocast_max_output_threshold"],
        autocast_max_depth_of_reduction=settings["autocast_max_depth_of_reduction"],
        disable_tf32=not tf32_asked(settings),
    )  # fmt: skip
    low_nodes: set[str] = set()
    if precision.low is not None:
        loader = settings["autocast_calibration_dataloader"]
        calibration: dict[str, torch.Tensor] = {}
        if precision.autocast and precision.max_output_threshold is not None and loader is not None:
            with _step(f"running {what} on autocast_calibration_dataloader to measure each node's values"):
                calibration = calibrate(flat, loader)
        low_nodes, _ = low_precision_nodes(flat.graph, precision, calibration)
    split = partition(
        flat,
        sample_input,
        torch_executed_ops=torch_executed_ops,
        min_block_size=settings["min_block_size"],
        scalar_boundaries=settings["scalar_boundaries"],
        collectives_in_engines=settings["collectives_in_engines"],
    )
    # Keep the caller's calling convention (nested inputs, dict outputs) as
    # Torch-TensorRT does after partitioning.
    compat.set_codegen(split.graph, compat.graph_codegen(flat.graph))
    for attr in ("_in_spec", "_out_spec"):
        if hasattr(flat, attr):
            setattr(split, attr, getattr(flat, attr))
    _copy_placeholder_meta(flat, split)
    setattr(split, LOWERED_ATTRIBUTE, lowered_nodes(split, low_nodes))

    for call_node in list(split.graph.nodes):
        if call_node.op != "call_module":
            continue
        if not str(call_node.target).startswith(ACC_PREFIX):
            # Autocast casts the graph before it is partitioned: a node left to PyTorch keeps its low precision.
            # (Weak typing, enabled_precisions, concerns the engines alone.)
            fallback = getattr(split, str(call_node.target))
            if precision.autocast and low_nodes and isinstance(fallback, torch.fx.GraphModule):
                emulate_precision(fallback, dataclasses.replace(precision, tf32=False), low_nodes)
            continue
        name = str(call_node.target)
        block = getattr(split, name)
        call_node.meta["val"] = [out.meta["val"] for out in block_outputs(block)]
        if precision.emulated:
            emulate_precision(block, precision, low_nodes)
        setattr(split, name, build_engine(block, name, note))
    split.recompile()
    setattr(split, release.PIPELINE_ATTRIBUTE, note)
    return split


def _decomposed(exported: torch.export.ExportedProgram, keep: Collection[Any]) -> torch.export.ExportedProgram:
    """``exported`` decomposed to core ATen but for ``keep``; where torch's own decomposition of
    ``scaled_dot_product_attention`` fails on the strides a model gives it (transformers' GPT-2 at batch 2: "Cannot
    view a tensor with shape ..."), with that operator kept whole (each release decomposes it with its own rule)."""
    try:
        decomposed: torch.export.ExportedProgram = compat.decompose_keeping(exported, keep)
        return decomposed
    except (ValueError, RuntimeError):
        attention = torch.ops.aten.scaled_dot_product_attention.default
        if not any(node.target is attention for node in exported.graph.nodes):
            raise
        log.info("torch's decomposition of scaled_dot_product_attention failed: kept whole")
        kept: torch.export.ExportedProgram = compat.decompose_keeping(exported, {*keep, attention})
        return kept


@contextlib.contextmanager
def _step(doing: str) -> Iterator[None]:
    """A failure of torch's inside the block as one line saying what trt-inline was doing (torch's chained)."""
    try:
        yield
    except Exception as exc:
        raise CompileError(f"reference.compile: {doing} failed: {type(exc).__name__}: {first_line(exc)}") from exc


def _warn_unmatched(graph: torch.fx.Graph, overloads: frozenset[Any], packets: frozenset[Any]) -> None:
    """A warning for each ``torch_executed_ops`` entry that no node of the graph calls: nothing falls back for it
    (the model does not call it, or calls another overload)."""
    called = {node.target for node in graph.nodes if node.op == "call_function"}
    called_packets = {getattr(target, "overloadpacket", None) for target in called}
    for op in sorted(overloads - called, key=str):
        others = sorted(str(t) for t in called if getattr(t, "overloadpacket", None) is op.overloadpacket)
        also = f" (it calls {', '.join(others)})" if others else ""
        warnings.warn(
            f"trt-inline: torch_executed_ops entry {op} matches no operator the graph calls: nothing runs in "
            f"PyTorch for it{also}",
            stacklevel=3,
        )
    for packet in sorted(packets - called_packets, key=str):
        warnings.warn(
            f"trt-inline: torch_executed_ops entry {packet} matches no operator the graph calls: nothing runs in "
            "PyTorch for it",
            stacklevel=3,
        )


def _is_core_aten(graph: torch.fx.Graph) -> bool:
    """Whether every op is already core ATen, so that decomposing would change nothing.

    Re-tracing for decomposition is most of the cost of compiling a small model.
    """
    for node in graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if not compat.is_core_aten(node.target):
            return False
    return True


def _copy_placeholder_meta(source: torch.fx.GraphModule, split: torch.fx.GraphModule) -> None:
    """split_by_tags builds fresh placeholders; give them back their fake values (by position)."""
    source_inputs = [n for n in source.graph.nodes if n.op == "placeholder"]
    split_inputs = [n for n in split.graph.nodes if n.op == "placeholder"]
    for src, dst in zip(source_inputs, split_inputs, strict=False):
        for key, value in src.meta.items():
            dst.meta.setdefault(key, value)
