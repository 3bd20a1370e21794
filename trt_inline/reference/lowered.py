"""The nodes a build lowered, as the pipeline left them: each node's operator, module path, dtype and block.

A compiled module of the reference backend carries this table (:data:`LOWERED_ATTRIBUTE`), made from its
partition before the accelerated blocks become engines: what the fix search chooses among (module paths for
``autocast_excluded_nodes``, operators for ``autocast_excluded_ops`` and ``torch_executed_ops``, in the names the
pipeline's graph has) and what it checks a fix against (the nodes a pattern keeps in fp32 are the ones it meant).
On a release's pipeline the dtypes are the ones its autocast chose; on trt-inline's own, a node emulated in
reduced precision is marked ``low`` (its graph keeps fp32).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
import torch.fx

from trt_inline import compat
from trt_inline.engines import ACC_PREFIX
from trt_inline.module_paths import node_origin

__all__ = ["LOWERED_ATTRIBUTE", "LoweredNode", "lowered_nodes", "module_path", "operator_name"]

# Where a compiled module keeps its table (a tuple of LoweredNode).
LOWERED_ATTRIBUTE = "trt_inline_lowered"
_LOW = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class LoweredNode:
    """One operator call of a build.

    ``operator``: its name as the releases compare it (``torch.ops.aten.linear.default``), or ``""`` for what is no
    operator (``getitem``, size arithmetic); ``module``: its module path (``layer3.0.conv1``; ``""`` at the model's
    top level), what ``autocast_excluded_nodes`` is matched against; ``dtype``: its result's (its first result's
    where it has several; ``""`` where it gives no tensor); ``low``: computed in fp16 or bf16; ``block``: the
    ``_run_on_acc_N`` or ``_run_on_gpu_N`` it runs in; ``described`` and ``source``: its module path and class, and
    its source line, for reports.
    """

    name: str
    operator: str
    module: str
    dtype: str
    low: bool
    block: str
    described: str
    source: str

    @property
    def in_engine(self) -> bool:
        return self.block.startswith(ACC_PREFIX)

    @property
    def floating(self) -> bool:
        return self.dtype in ("float32", "float16", "bfloat16", "float64")


def operator_name(target: object) -> str:
    """``torch.ops.aten.linear.default`` for an OpOverload (the form ``torch_executed_ops`` and
    ``autocast_excluded_ops`` match), ``""`` for anything else."""
    if not isinstance(target, compat.OpOverload):
        return ""
    schema = compat.op_schema_name(target) or ""
    namespace, _, name = schema.partition("::")
    return f"torch.ops.{namespace}.{name}.{compat.op_overload_name(target)}"


def lowered_nodes(partitioned: torch.fx.GraphModule, low: Collection[str] | None = None) -> tuple[LoweredNode, ...]:
    """The operator calls of ``partitioned``'s blocks (before they become engines), in block order then graph order.
    ``low``: the names of the nodes emulated in reduced precision (trt-inline's own pipeline); None: a node is low
    where its dtype is (a release's pipeline, whose autocast changed the dtypes)."""
    found: list[LoweredNode] = []
    for block_name, block in partitioned.named_children():
        if not isinstance(block, torch.fx.GraphModule):
            continue
        for node in block.graph.nodes:
            if node.op != "call_function":
                continue
            value = node.meta.get("val")
            tensors = [value] if isinstance(value, torch.Tensor) else _tensors_of(value)
            dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else ""
            is_low = node.name in low if low is not None else any(t.dtype in _LOW for t in tensors)
            origin = node_origin(node)
            found.append(
                LoweredNode(
                    node.name, operator_name(node.target), module_path(node), dtype, is_low, block_name,
                    origin.module, origin.source,
                )
            )  # fmt: skip
    return tuple(found)


def _tensors_of(value: object) -> list[torch.Tensor]:
    """The tensors of an operator's several results (``native_layer_norm``'s three): their first's dtype stands for
    the node's, and any in fp16 or bf16 makes it a reduced-precision node."""
    if isinstance(value, (tuple, list)):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


def module_path(node: torch.fx.Node) -> str:
    """The path of the module a node was traced in: its innermost ``nn_module_stack`` entry's (``layer3.0.conv1``;
    ``""`` at the model's top level), what the releases match ``autocast_excluded_nodes`` against
    (``DisabledNodeNameRegexRule``)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    entry = stack[next(reversed(stack))]
    return str(entry[0]) if isinstance(entry, Sequence) and not isinstance(entry, str) and entry else ""
