"""A call's arguments reach a program's placeholders as its generated forward flattens them, in every run."""

from __future__ import annotations

import torch

from trt_inline.verify.boundaries import trace_program
from trt_inline.verify.checked_run import ProgramInputs, checking


class _Asymmetric(torch.nn.Module):
    """Swapping any two of its inputs changes its result."""

    def forward(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], *, scale: torch.Tensor) -> torch.Tensor:
        return (x * 2 - inputs["a"]) * 3 + inputs["b"] * scale


def _program() -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    x, a, b, scale = (torch.full((2, 3), float(v)) for v in (1, 10, 100, 1000))
    exported = torch.export.export(_Asymmetric(), (x, {"a": a, "b": b}), {"scale": scale})
    return exported.module(), (x, a, b, scale)


def test_dict_keys_and_keywords_in_the_callers_order_reach_the_right_placeholders() -> None:
    module, (x, a, b, scale) = _program()
    expected = _Asymmetric()(x, {"a": a, "b": b}, scale=scale)
    placeholders = [n.name for n in module.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 4, placeholders  # (the structure under test: four flat inputs)
    swapped = {"b": b, "a": a}  # the caller's key order, not the exported one
    flat = ProgramInputs(module).flatten((x, swapped), {"scale": scale})
    assert [float(t[0, 0]) for t in flat] == [1.0, 10.0, 100.0, 1000.0]

    trace = trace_program(module, [x], {"inputs": swapped, "scale": scale}, None)
    assert trace.crash is None
    assert torch.equal(trace.outputs[0], expected), (trace.outputs[0], expected)

    with checking(module, None, "the test") as check:
        returned = module(x, swapped, scale=scale)
    assert check is not None and check.declared.summary() == []
    assert torch.equal(returned, expected)
