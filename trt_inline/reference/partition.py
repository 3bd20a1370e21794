"""Partitioning for the reference backend.

The split is made by ``torch.fx.passes.splitter_base._SplitterBase``, the class
Torch-TensorRT's fast partitioner builds on, with the same settings that matter
for graph structure: accelerated blocks are named ``_run_on_acc_N``, the others
``_run_on_gpu_N``, blocks smaller than ``min_block_size`` fall back, and a
multi-output block is read in the parent through ``getitem`` nodes named
``getitem``, ``getitem_1``, ... by FX. That naming is what made the stock
exporter wire fallback inputs to the wrong tensor, so reproducing it exactly is
the point of this module.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import torch
import torch.fx
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.splitter_base import FxNetAccNodesFinder, Subgraph, _SplitterBase
from torch.fx.passes.tools_common import FxNetAccFusionsFinder

from trt_inline.reference.engine import can_encode_args, encodable_target

__all__ = ["ReferenceOperatorSupport", "partition", "resolve_ops"]

ACC_PREFIX = "_run_on_acc_"
FALLBACK_PREFIX = "_run_on_gpu_"


def resolve_ops(ops: Iterable[Any]) -> tuple[frozenset[torch._ops.OpOverload], frozenset[Any]]:
    """Split ``torch_executed_ops`` into OpOverloads and OpOverloadPackets.

    Accepts OpOverloads, packets (all overloads) and strings such as
    ``"torch.ops.aten.relu.default"``, ``"aten.relu.default"``, ``"aten::relu.default"``
    or ``"aten.relu"``.
    """
    overloads: set[torch._ops.OpOverload] = set()
    packets: set[Any] = set()
    for op in ops:
        if isinstance(op, str):
            op = _op_from_string(op)
        if isinstance(op, torch._ops.OpOverload):
            overloads.add(op)
        elif isinstance(op, torch._ops.OpOverloadPacket):
            packets.add(op)
        else:
            raise ValueError(
                f"torch_executed_ops entry {op!r} is not an operator: give an OpOverload "
                "such as torch.ops.aten.relu.default or its name as a string"
            )
    return frozenset(overloads), frozenset(packets)


def _op_from_string(name: str) -> Any:
    text = name.strip().removeprefix("torch.ops.").replace("::", ".")
    parts = text.split(".")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"torch_executed_ops entry {name!r} is not an operator name like 'aten.relu.default'")
    obj: Any = torch.ops
    try:
        for part in parts:
            obj = getattr(obj, part)
    except (AttributeError, RuntimeError) as exc:
        raise ValueError(f"torch_executed_ops entry {name!r} names no registered operator") from exc
    return obj


def _is_tensor_value(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _is_tensor_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, torch.Tensor) for v in value)


class ReferenceOperatorSupport(OperatorSupportBase):  # type: ignore[misc]
    """Decides which nodes the reference backend places in an engine.

    A node is accelerated when it calls an ATen OpOverload (or unpacks one with
    ``getitem``) that is not in ``torch_executed_ops``, reads and produces only
    tensors, and has arguments a program can store. Everything else (symbolic
    integer arithmetic, assertions, ``call_module`` such as ``_guards_fn``, higher
    order ops) runs in PyTorch. Keeping integers out of engines is what makes
    every engine boundary carry tensors only.
    """

    def __init__(self, torch_executed_ops: Collection[Any] = ()) -> None:
        super().__init__()
        self._overloads, self._packets = resolve_ops(torch_executed_ops)

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node) -> bool:
        if node.op != "call_function" or encodable_target(node.target) is None:
            return False
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if target in self._overloads or target.overloadpacket in self._packets:
                return False
        value = node.meta.get("val")
        if not (_is_tensor_value(value) or _is_tensor_sequence(value)):
            return False
        for arg in node.all_input_nodes:
            arg_value = arg.meta.get("val")
            if arg.op == "get_attr":
                continue
            if _is_tensor_value(arg_value):
                continue
            # getitem unpacks a multi-output op; it follows its producer.
            if not (_is_tensor_sequence(arg_value) and self.is_node_supported(submodules, arg)):
                return False
        return can_encode_args(node)


class ReferencePartitioner(_SplitterBase):  # type: ignore[misc]
    """``_SplitterBase`` configured as Torch-TensorRT's fast partitioner is.

    The base constructor runs ``ShapeProp`` on sample inputs; an exported graph
    already carries ``meta["val"]`` on every node, so this one does not.
    """

    def __init__(
        self,
        module: torch.fx.GraphModule,
        operator_support: OperatorSupportBase,
        min_block_size: int,
    ) -> None:
        self.module = module
        self.operator_support = operator_support
        self.min_block_size = min_block_size
        self.acc_nodes = FxNetAccNodesFinder(module, operator_support, allow_non_tensor=True)()
        self.fusions = FxNetAccFusionsFinder(module, self.acc_nodes)()
        self._merge_overlapping_fusions()
        self.deps = self.find_deps()
        self.update_deps_for_fusions()
        self.non_acc_submodule_name = FALLBACK_PREFIX
        self._node_submodule_map: dict[str, str] = {}
        self._return_tuple = False
        self.tags: list[str] = []

    def remove_small_acc_subgraphs(self, subgraphs: list[Subgraph]) -> list[Subgraph]:
        """Fold accelerated blocks below ``min_block_size`` into the fallback before them."""
        result: list[Subgraph] = []
        for subgraph in subgraphs:
            if subgraph.is_acc and len(subgraph.nodes) < self.min_block_size:
                subgraph.is_acc = False
            if result and not result[-1].is_acc and not subgraph.is_acc:
                result[-1].nodes.extend(subgraph.nodes)
            else:
                result.append(subgraph)
        return result

    def partition(self) -> torch.fx.GraphModule:
        subgraphs = self.remove_small_acc_subgraphs(self.put_nodes_into_subgraphs())
        self.tag(subgraphs)
        return self.split(remove_tag=True)


def partition(
    gm: torch.fx.GraphModule,
    *,
    torch_executed_ops: Collection[Any] = (),
    min_block_size: int = 1,
) -> torch.fx.GraphModule:
    """Split ``gm`` into ``_run_on_acc_N`` and ``_run_on_gpu_N`` submodules."""
    if min_block_size < 1:
        raise ValueError(f"min_block_size must be at least 1, got {min_block_size}")
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    support = ReferenceOperatorSupport(torch_executed_ops)
    return ReferencePartitioner(gm, support, min_block_size).partition()
