"""Inside a diverging reference engine: its program's steps against the same steps in float64.

A reference engine (:mod:`trt_inline.reference`) is a program of ATen steps over
its weights. Run on the inputs the compiled module recorded for it, each step's
result is compared with that of the same steps run eagerly with every floating
input and weight in float64; the first step past its dtype's tolerance is where
precision is lost (a half-precision product that overflows, a sum that cancels)::

    in_0 ─► step 0 permute ─► step 1 addmm ─► step 2 split ─► out
                                  ▲
                                  └─ float32 and float64 part here: named

Where every step agrees with its float64 run, the engine computes what its
program says to the precision it runs at: what differs from the compiled module
is the program or its weights. The CPU stand-in for comparing every layer of a
TensorRT engine (Polygraphy's ``--mark all``), which needs the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from trt_inline.engines import REFERENCE_OP, engine_op
from trt_inline.reference.program import load_program
from trt_inline.verify.compare import default_tolerance

__all__ = ["drill_down"]


def drill_down(module: torch.fx.GraphModule, engine_node_name: str, inputs: Sequence[torch.Tensor]) -> str | None:
    """A sentence on where inside reference engine ``engine_node_name`` precision is lost; None for another kind."""
    node = next((n for n in module.graph.nodes if n.name == engine_node_name), None)
    if node is None or engine_op(node) is not REFERENCE_OP or len(node.args) < 3:
        return None
    payload_node, text = node.args[1], node.args[2]
    if not isinstance(payload_node, torch.fx.Node) or payload_node.op != "get_attr" or not isinstance(text, str):
        return None
    program = load_program(text)
    payload = getattr(module, str(payload_node.target))
    with torch.no_grad():
        at_precision = program.step_values(list(inputs), payload, upcast=False)
        in_float64 = program.step_values(list(inputs), payload, upcast=True)
    names = program.step_names()
    for index, (value, exact) in enumerate(zip(at_precision, in_float64, strict=True)):
        error = _past_tolerance(value, exact)
        if error is not None:
            return (
                f"inside it, step {index} ({names[index]}) of its {len(names)} is the first whose result differs "
                f"from the same steps run in float64 ({error}): precision is lost there"
            )
    return (
        f"inside it, each of its {len(names)} steps agrees with the same steps run in float64: it computes what "
        "its program says, so its program or its weights differ from the compiled module's"
    )


def _past_tolerance(value: Any, exact: Any) -> str | None:
    """How a step's result differs from its float64 run, where past its dtype's tolerance; else None."""
    pairs = list(zip(value, exact, strict=False)) if isinstance(value, (list, tuple)) else [(value, exact)]
    for got, want in pairs:
        if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.is_floating_point()):
            continue
        if got.shape != want.shape or not got.numel():
            continue
        atol, rtol = default_tolerance(got.dtype)
        a, e = got.double(), want.double()
        if not bool(a.isfinite().all()) and bool(e.isfinite().all()):
            return f"{int((~a.isfinite()).sum())} values not finite in {str(got.dtype).removeprefix('torch.')}"
        difference = (a - e).abs().nan_to_num(0.0)
        if bool((difference > atol + rtol * e.abs()).any()):
            return f"max abs diff {float(difference.max()):.6g} in {str(got.dtype).removeprefix('torch.')}"
    return None
