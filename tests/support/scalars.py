"""Scalars at engine boundaries as the tests find them in a compiled module, and a scalar case compiled."""

from __future__ import annotations

import torch

from support.models import ScalarCase
from trt_inline import engines, reference
from trt_inline.inlining.passes import produced_value
from trt_inline.inlining.scalars import is_scalar


def scalar_crossings(compiled: torch.fx.GraphModule) -> list[tuple[str, str, int]]:
    """("output" | "input", engine, position) of every scalar on an engine boundary of a compiled module."""
    found = []
    for node in compiled.graph.nodes:
        if not engines.is_accelerated_call(compiled, node):
            continue
        found += [("output", str(node.target), i) for i, val in enumerate(node.meta["val"]) if is_scalar(val)]
        found += [
            ("input", str(node.target), i)
            for i, arg in enumerate(node.args)
            if is_scalar(produced_value(compiled, arg))
        ]
    return found


def compile_case(case: ScalarCase) -> torch.fx.GraphModule:
    return reference.compile(
        case.model.eval(),
        case.inputs,
        torch_executed_ops=case.torch_executed_ops,
        dynamic_shapes=case.dynamic_shapes,
    )
