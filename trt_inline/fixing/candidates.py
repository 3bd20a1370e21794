"""What the search chooses among, in the names the release matches, and each choice in the user's terms.

The candidates come from the nodes the first build lowered (:mod:`trt_inline.reference.lowered`: the graph the
pipeline partitions, a release's own where one is rehearsed), and only from what a setting can change there:

* ``higher_precision`` (``autocast_excluded_nodes``): the module paths (``layer3.0.conv1``) of the nodes that
  build runs in reduced precision, first seen first. Every release matches a pattern against a node's module path
  (the innermost ``nn_module_stack`` entry), not its name, so a module path is what can be kept in fp32; ``""`` is
  the model's own ``forward`` (the ops outside every submodule).
* ``fallback`` (``torch_executed_ops``): the operators (``torch.ops.aten.div.Tensor``, the form every release
  compares) of the nodes that build runs in an engine in reduced precision. Never ``getitem``, size arithmetic or
  anything else that is no operator: a release cannot be told to run those in PyTorch.
"""

from __future__ import annotations

from collections.abc import Sequence

from trt_inline.fixing.fix_report import FixedNode
from trt_inline.reference.lowered import LoweredNode

__all__ = ["TOP_LEVEL", "candidates", "described", "matches"]

# How a report names the module path "": the model's own forward.
TOP_LEVEL = "(the model's own forward)"


def candidates(table: Sequence[LoweredNode], strategy: str) -> list[str]:
    """The module paths (``higher_precision``) or operators (``fallback``) of the nodes ``table`` computes in
    reduced precision, in graph order."""
    found: dict[str, None] = {}
    for node in table:
        if not node.low or not node.operator:
            continue
        if strategy == "higher_precision":
            found[node.module] = None
        elif node.in_engine:
            found[node.operator] = None
    return list(found)


def matches(node: LoweredNode, strategy: str, chosen: str) -> bool:
    """Whether the setting made of ``chosen`` reaches ``node``."""
    return (node.module if strategy == "higher_precision" else node.operator) == chosen


def described(table: Sequence[LoweredNode], strategy: str, chosen: Sequence[str]) -> list[FixedNode]:
    """``chosen`` in the user's terms: a module path with its class, the operators it holds that ran in reduced
    precision, and its first source line; an operator with the modules its nodes are in."""
    found = []
    for choice in chosen:
        nodes = [node for node in table if matches(node, strategy, choice) and node.low]
        operators = list(dict.fromkeys(node.operator.removeprefix("torch.ops.") for node in nodes if node.operator))
        modules = list(dict.fromkeys(node.described for node in nodes if node.described))
        source = next((node.source for node in nodes if node.source), "")
        if strategy == "higher_precision":
            name = choice or TOP_LEVEL
            found.append(FixedNode(name, ", ".join(operators), modules[0] if modules else "", source, len(nodes)))
        else:
            found.append(FixedNode(choice, choice.removeprefix("torch.ops."), ", ".join(modules), source, len(nodes)))
    return found
