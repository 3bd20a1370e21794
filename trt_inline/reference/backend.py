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
import operator
import warnings
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from trt_inline import compat
from trt_inline.engines import ACC_PREFIX
from trt_inline.errors import CompileError, first_line
from trt_inline.reference.engine import build_engine
from trt_inline.reference.partition import partition, resolve_ops
from trt_inline.reference.precision import PrecisionSettings, calibrate, emulate_precision, low_precision_nodes

__all__ = ["compile"]


def compile(
    model: torch.nn.Module | torch.export.ExportedProgram,
    arg_inputs: Sequence[Any],
    *,
    torch_executed_ops: Collection[Any] = (),
    min_block_size: int = 1,
    dynamic_shapes: Any = None,
    scalar_boundaries: bool = True,
    collectives_in_engines: bool = False,
    enabled_precisions: Collection[Any] = (),
    enable_autocast: bool = False,
    autocast_low_precision_type: Any = None,
    autocast_excluded_nodes: Collection[str] = (),
    autocast_excluded_ops: Collection[Any] = (),
    autocast_max_output_threshold: float | None = 512.0,
    autocast_max_depth_of_reduction: int | None = None,
    disable_tf32: bool | None = None,
) -> torch.fx.GraphModule:
    """Compile ``model`` into engines and PyTorch fallbacks.

    Args:
        model: an ``nn.Module`` (exported here with ``arg_inputs`` and
            ``dynamic_shapes``) or an ``ExportedProgram``.
        arg_inputs: example inputs, positionally.
        torch_executed_ops: operators forced to run in PyTorch, as OpOverloads
            or strings such as ``"torch.ops.aten.relu.default"``; kept from
            decomposition (as Torch-TensorRT keeps them), and an entry no node
            calls is a warning naming it.
        min_block_size: accelerated blocks with fewer nodes fall back. 1 by
            default, where Torch-TensorRT's is 5: the small models of tests and
            examples then still get engines between their fallbacks. Pass
            ``min_block_size=5`` to rehearse the partition TensorRT gets.
        dynamic_shapes: as for ``torch.export.export``.
        scalar_boundaries: let scalar-producing nodes (``sym_size``, SymInt
            arithmetic) into engines, so that scalars cross engine boundaries
            as they do with Torch-TensorRT. ``False`` keeps them in PyTorch.
        collectives_in_engines: a tensor-parallel model's collectives
            (``_c10d_functional.*``) run in PyTorch fallbacks by default, as
            with Torch-TensorRT without NCCL converters; ``True`` places them
            inside engines, as NCCL layers are.
        enabled_precisions, enable_autocast, autocast_low_precision_type,
        autocast_excluded_nodes, autocast_excluded_ops,
        autocast_max_output_threshold, autocast_max_depth_of_reduction,
        disable_tf32: Torch-TensorRT's precision settings; the engines then
            compute as a reduced-precision build does
            (:mod:`trt_inline.reference.precision`: an emulation, its numbers
            are not TensorRT's). TF32 is emulated where a precision setting is
            given and ``disable_tf32`` is not True, or where ``disable_tf32=False``
            is given alone; by default the engines compute exactly what
            PyTorch computes.

    Returns:
        A ``GraphModule`` called like the model, whose children are
        ``_run_on_acc_N`` (:class:`ReferenceEngine`) and ``_run_on_gpu_N``
        (``GraphModule``) submodules.
    """
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
            exported = compat.decompose_keeping(exported, overloads | packets)
    flat = exported.module()
    _warn_unmatched(flat.graph, overloads, packets)
    if not isinstance(flat, torch.fx.GraphModule):
        raise TypeError(f"ExportedProgram.module() returned a {type(flat).__qualname__}, expected a GraphModule")

    sample_input = pytree.tree_leaves((tuple(arg_inputs), {}))
    asked = bool(enabled_precisions) or enable_autocast or disable_tf32 is False
    precision = PrecisionSettings.from_compile_settings(
        enabled_precisions=enabled_precisions, enable_autocast=enable_autocast,
        autocast_low_precision_type=autocast_low_precision_type, autocast_excluded_nodes=autocast_excluded_nodes,
        autocast_excluded_ops=autocast_excluded_ops, autocast_max_output_threshold=autocast_max_output_threshold,
        autocast_max_depth_of_reduction=autocast_max_depth_of_reduction, disable_tf32=not asked or bool(disable_tf32),
    )  # fmt: skip
    low_nodes: set[str] = set()
    if precision.low is not None:
        needs_calibration = precision.autocast and precision.max_output_threshold is not None
        with _step(f"running {what} on the example inputs to measure each node's outputs (autocast)"):
            calibration = calibrate(flat, sample_input) if needs_calibration else {}
        low_nodes, _ = low_precision_nodes(flat.graph, precision, calibration)
    split = partition(
        flat,
        sample_input,
        torch_executed_ops=torch_executed_ops,
        min_block_size=min_block_size,
        scalar_boundaries=scalar_boundaries,
        collectives_in_engines=collectives_in_engines,
    )
    # Keep the caller's calling convention (nested inputs, dict outputs) as
    # Torch-TensorRT does after partitioning.
    compat.set_codegen(split.graph, compat.graph_codegen(flat.graph))
    for attr in ("_in_spec", "_out_spec"):
        if hasattr(flat, attr):
            setattr(split, attr, getattr(flat, attr))
    _copy_placeholder_meta(flat, split)

    for call_node in list(split.graph.nodes):
        if call_node.op != "call_module" or not str(call_node.target).startswith(ACC_PREFIX):
            continue
        name = str(call_node.target)
        block = getattr(split, name)
        call_node.meta["val"] = [out.meta["val"] for out in _output_nodes(block)]
        if precision.emulated:
            emulate_precision(block, precision, low_nodes)
        setattr(split, name, build_engine(block, name))
    split.recompile()
    return split


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


def _output_nodes(block: torch.fx.GraphModule) -> list[torch.fx.Node]:
    output = next(n for n in reversed(block.graph.nodes) if n.op == "output")
    result = output.args[0]
    return list(result) if isinstance(result, (tuple, list)) else [result]
