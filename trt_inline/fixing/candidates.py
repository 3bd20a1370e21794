"""What the search chooses among, and each choice in the user's terms.

The candidates are the floating-point nodes of the graph the compile partitions (the model exported and
decomposed to core ATen: node names as ``autocast_excluded_nodes`` matches them), in graph order; for the
``fallback`` strategy their operators (``aten.mul.Tensor``: ``torch_executed_ops`` takes operators, the finest
control the releases offer there). A node is named by its module path and source line
(:mod:`trt_inline.module_paths`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from trt_inline.fixing.report import FixedNode
from trt_inline.module_paths import node_origin

__all__ = ["candidates", "described", "partitioned_graph"]


def partitioned_graph(model: torch.nn.Module, arg_inputs: Sequence[Any]) -> torch.fx.Graph:
    """The graph the compile partitions: exported, decomposed to core ATen."""
    exported = torch.export.export(model, tuple(arg_inputs)).run_decompositions()
    graph: torch.fx.Graph = exported.graph
    return graph


def candidates(graph: torch.fx.Graph, strategy: str) -> list[str]:
    """The floating-point nodes of ``graph`` (their names), or their operators for ``fallback``, in graph order."""
    found: dict[str, None] = {}
    for node in graph.nodes:
        value = node.meta.get("val")
        if node.op != "call_function" or not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            continue
        found[node.name if strategy == "higher_precision" else str(node.target)] = None  # (aten.mul.Tensor)
    return list(found)


def described(graph: torch.fx.Graph, strategy: str, chosen: Sequence[str]) -> list[FixedNode]:
    """``chosen`` in the user's terms: each node with its module path and class and its source line; an operator
    by its name."""
    if strategy != "higher_precision":
        return [FixedNode(op, op, "", "") for op in chosen]
    nodes = {node.name: node for node in graph.nodes}
    found = []
    for name in chosen:
        origin = node_origin(nodes[name])
        found.append(FixedNode(name, str(nodes[name].target).removeprefix("aten."), origin.module, origin.source))
    return found
