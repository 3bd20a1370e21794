"""Partitioned graphs built by hand (``Parent``: engines and fallbacks wired as a partitioner wires them), the seed
graph whose fallback placeholder is named like a later node, and the check that an inlined graph computes the same."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

import trt_inline
from support.values import as_list, max_abs_diff
from trt_inline.reference.engine import ReferenceEngine, build_engine


def engine(fn: Callable[..., Any], name: str, *examples: Any) -> ReferenceEngine:
    """An engine computing ``fn`` (written with aten ops); with ``examples``, it records its inputs and outputs."""
    block = torch.fx.symbolic_trace(fn)
    if examples:
        _ScalarFakeTensorProp(block, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*examples)
    return build_engine(block, name)


aten = torch.ops.aten


class _ScalarFakeTensorProp(FakeTensorProp):
    """Also records Python scalars in ``meta["val"]``, as export does (older FakeTensorProp records tensors only)."""

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, (bool, int, float)) and n.meta.get("val") is None:
            n.meta["val"] = result
        return result


def fallback(module: torch.nn.Module | Callable[..., Any]) -> torch.fx.GraphModule:
    """A fallback GraphModule; its placeholder names are ``fn``'s parameter names."""
    return torch.fx.symbolic_trace(module)


class Parent:
    """Builds a partitioned parent graph node by node, names under our control."""

    def __init__(self) -> None:
        self.root = torch.nn.Module()
        self.graph = torch.fx.Graph()

    def input(self, name: str) -> torch.fx.Node:
        return self.graph.placeholder(name)

    def call(self, target: str, module: torch.nn.Module, *args: torch.fx.Node) -> torch.fx.Node:
        self.root.add_module(target, module)
        return self.graph.call_module(target, args)

    def getitem(self, node: torch.fx.Node, index: int) -> torch.fx.Node:
        return self.graph.call_function(operator.getitem, (node, index))

    def build(self, outputs: Any, inputs: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
        self.graph.output(outputs)
        gm = torch.fx.GraphModule(self.root, self.graph)
        # Fake values on every node; engine calls get a list, as compile_module sets it.
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        FakeTensorProp(gm, mode).propagate(*inputs)
        calls = [(n, gm.get_submodule(str(n.target))) for n in gm.graph.nodes if n.op == "call_module"]
        for node, submodule in calls:
            if isinstance(submodule, torch.fx.GraphModule):
                FakeTensorProp(submodule, mode).propagate_dont_convert_inputs(*(a.meta["val"] for a in node.args))
        for node, submodule in calls:
            if isinstance(submodule, ReferenceEngine):
                val = node.meta["val"]
                node.meta["val"] = list(val) if isinstance(val, (tuple, list)) else [val]
        return gm


def check_equivalent(
    gm: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...], call_modules: tuple[str, ...] = ()
) -> torch.fx.GraphModule:
    """transform(gm) lints, calls no submodule but ``call_modules``, and computes exactly what gm computes."""
    flat = trt_inline.transform(gm)
    flat.graph.lint()
    assert tuple(str(n.target) for n in flat.graph.nodes if n.op == "call_module") == call_modules
    with torch.no_grad():
        assert max_abs_diff(as_list(flat(*inputs)), as_list(gm(*inputs))) == 0.0
    return flat


def seed_collision_graph() -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """x -> acc0 -> gpu1(placeholder 'getitem') -> acc2 -> getitem, getitem_1 (the seed)."""
    p = Parent()
    x = p.input("x")
    acc0 = p.call("_run_on_acc_0", engine(lambda a: aten.mul.Tensor(a, 3.0), "_run_on_acc_0"), x)

    def relu_fallback(getitem: torch.Tensor) -> torch.Tensor:
        return torch.relu(getitem)

    gpu1 = p.call("_run_on_gpu_1", fallback(relu_fallback), acc0)
    acc2 = p.call(
        "_run_on_acc_2",
        engine(lambda a: (aten.add.Tensor(a, 1.0), aten.sub.Tensor(a, 5.0)), "_run_on_acc_2"),
        gpu1,
    )
    out = (p.getitem(acc2, 0), p.getitem(acc2, 1))
    inputs = (torch.randn(4, 5),)
    return p.build(out, inputs), inputs


def annotated(module: torch.fx.GraphModule, mode: FakeTensorMode, *examples: Any) -> torch.fx.GraphModule:
    """A fallback with fake values (of the parent's fake mode) on its nodes, as the partitioner leaves them."""
    _ScalarFakeTensorProp(module, mode).propagate_dont_convert_inputs(*examples)
    return module
