"""A CPU reference backend with the module structure of ``torch_tensorrt.dynamo.compile``.

``compile`` exports the model, decomposes it to core ATen, partitions it with
``_SplitterBase`` into ``_run_on_acc_N`` / ``_run_on_gpu_N`` submodules exactly
as Torch-TensorRT's fast partitioner does, sets ``meta["val"]`` on every
accelerated call node (a list, even for one output, as ``compile_module`` does),
and replaces each accelerated block by a :class:`ReferenceEngine`. The result is
the graph Torch-TensorRT hands to its exporter, minus TensorRT: the whole
compile -> save -> load -> compare loop runs without a GPU.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Sequence
from typing import Any

import torch
import torch.fx

from trt_inline.errors import InlineError
from trt_inline.reference.engine import ReferenceEngine, build_engine
from trt_inline.reference.partition import ACC_PREFIX, FALLBACK_PREFIX, partition

__all__ = ["compile", "ReferenceEngine", "ACC_PREFIX", "FALLBACK_PREFIX"]


def compile(
    model: torch.nn.Module | torch.export.ExportedProgram,
    arg_inputs: Sequence[Any],
    *,
    torch_executed_ops: Collection[Any] = (),
    min_block_size: int = 1,
    dynamic_shapes: Any = None,
) -> torch.fx.GraphModule:
    """Compile ``model`` into engines and PyTorch fallbacks.

    Args:
        model: an ``nn.Module`` (exported here with ``arg_inputs`` and
            ``dynamic_shapes``) or an ``ExportedProgram``.
        arg_inputs: example inputs, positionally.
        torch_executed_ops: operators forced to run in PyTorch, as OpOverloads
            or strings such as ``"torch.ops.aten.relu.default"``.
        min_block_size: accelerated blocks with fewer nodes fall back.
        dynamic_shapes: as for ``torch.export.export``.

    Returns:
        A ``GraphModule`` called like the model, whose children are
        ``_run_on_acc_N`` (:class:`ReferenceEngine`) and ``_run_on_gpu_N``
        (``GraphModule``) submodules.
    """
    if isinstance(model, torch.export.ExportedProgram):
        exported = model
    else:
        exported = torch.export.export(model, tuple(arg_inputs), dynamic_shapes=dynamic_shapes)
    if not _is_core_aten(exported.graph):
        exported = exported.run_decompositions()
    flat = exported.module()
    assert isinstance(flat, torch.fx.GraphModule)
    codegen = flat.graph._codegen

    split = partition(flat, torch_executed_ops=torch_executed_ops, min_block_size=min_block_size)
    # Keep the caller's calling convention (nested inputs, dict outputs) as
    # Torch-TensorRT does after partitioning.
    split.graph._codegen = codegen
    for attr in ("_in_spec", "_out_spec"):
        if hasattr(flat, attr):
            setattr(split, attr, getattr(flat, attr))
    _copy_placeholder_meta(flat, split)

    for call_node in list(split.graph.nodes):
        if call_node.op != "call_module" or not str(call_node.target).startswith(ACC_PREFIX):
            continue
        name = str(call_node.target)
        block = getattr(split, name)
        _check_tensor_boundary(name, block)
        outputs = _output_nodes(block)
        call_node.meta["val"] = [out.meta["val"] for out in outputs]
        setattr(split, name, build_engine(block, name))
    split.recompile()
    return split


def _is_core_aten(graph: torch.fx.Graph) -> bool:
    """Whether every op is already core ATen, so that decomposing would change nothing.

    Re-tracing for decomposition is most of the cost of compiling a small model.
    """
    for node in graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if not isinstance(node.target, torch._ops.OpOverload) or torch.Tag.core not in node.target.tags:
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


def _check_tensor_boundary(name: str, block: torch.fx.GraphModule) -> None:
    for node in block.graph.nodes:
        if node.op == "placeholder" and not isinstance(node.meta.get("val"), torch.Tensor):
            raise InlineError(f"{name}: input {node.name} is not a tensor; engines take tensors only")
    for out in _output_nodes(block):
        if not isinstance(out, torch.fx.Node) or not isinstance(out.meta.get("val"), torch.Tensor):
            raise InlineError(f"{name}: output {out} is not a tensor; engines return tensors only")
