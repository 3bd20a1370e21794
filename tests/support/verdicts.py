"""Crafted programs and models the verdict tests share: the files of each mode of a run (normal call, node by node,
layout), real architectures, a layout switch, a program with a checked operator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from junitparser import JUnitXml

from support.commands import cli


def modes(crafted: Path, honest: Path, root: Path, tmp_path: Path) -> dict[str, tuple[int, str]]:
    """Exit status and output of each verdict mode on ``crafted`` (``honest``: a reference file of the same
    model; ``root``: its ``inputs.pt``, ``expected.pt`` and ``cases/``)."""
    given = ("--inputs", str(root / "inputs.pt"), "--expected", str(root / "expected.pt"))
    runs = {
        "embedded": ("verify", str(crafted)),
        "inputs": ("verify", str(crafted), *given),
        "expected_from": ("verify", str(crafted), "--expected-from", str(honest)),
        "diff": ("diff", str(crafted), str(honest), "--inputs", str(root / "inputs.pt")),
        "cases": ("verify", str(crafted), "--cases", str(root / "cases"), "--junit", str(tmp_path / "cases.xml")),
    }
    found = {}
    for mode, args in runs.items():
        proc = cli(*args)
        found[mode] = (proc.returncode, proc.stdout + proc.stderr)
    suite = next(iter(JUnitXml.fromfile(str(tmp_path / "cases.xml"))))
    assert suite.tests == 1 and not next(iter(suite)).is_passed, "the one case must not pass"
    return found


def inputs_and_cases(root: Path, x: torch.Tensor, expected: Any) -> None:
    torch.save([x], root / "inputs.pt")
    torch.save(expected, root / "expected.pt")
    (root / "cases" / "one").mkdir(parents=True)
    torch.save([x], root / "cases" / "one" / "inputs.pt")
    torch.save(expected, root / "cases" / "one" / "expected.pt")


def real_models(device: str) -> list[tuple[str, torch.nn.Module, tuple[torch.Tensor, ...], Any]]:
    """The architectures the tests use and the layers models are built from, as a user exports them (eval), with
    their inputs and dynamic shapes; torchvision's classifiers where it is installed."""
    from support.models import (
        ConvBnRelu,
        EdgesFallBack,
        MultiOutputBothSides,
        TinyResNet,
        TransformerBlock,
        operator_survey,
        scalar_cases,
    )

    found: list[tuple[str, torch.nn.Module, tuple[torch.Tensor, ...], Any]] = [
        ("conv_bn_relu", ConvBnRelu(), (torch.randn(2, 3, 8, 8),), None),
        ("tiny_resnet", TinyResNet(), (torch.randn(2, 3, 8, 8),), None),
        ("edges_fall_back", EdgesFallBack(), (torch.randn(2, 3, 8, 8),), None),
        ("multi_output", MultiOutputBothSides(), (torch.randn(4, 16),), None),
        ("transformer_block", TransformerBlock(), (torch.randn(2, 5, 32),), None),
        *((case.name, case.model, case.inputs, case.dynamic_shapes) for case in scalar_cases()),
        *((name, model, inputs, None) for name, model, inputs in operator_survey()),
    ]
    try:
        import torchvision
    except ImportError:
        pass
    else:
        for name in ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit_b_16", "swin_t"):
            size = 224 if name in ("vit_b_16", "swin_t") else 64
            model = getattr(torchvision.models, name)(weights=None)
            found.append((name, model, (torch.randn(1, 3, size, size),), None))
    return [(name, m.eval().to(device), tuple(t.to(device) for t in x), dyn) for name, m, x, dyn in found]


class LayoutSwitch(torch.nn.Module):
    """``relu(x)``, unless ``sum(x)`` and ``sum(x.clone())`` round differently: then ``-x``. On a contiguous input
    (as verify passed its inputs) they never do; on a strided view into a caller's buffer they do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        contiguous = torch.ops.aten.clone.default(x, memory_format=torch.contiguous_format)
        rounding = torch.ops.aten.sum.dim_IntList(x, [1]) - torch.ops.aten.sum.dim_IntList(contiguous, [1])
        switch = torch.clamp(rounding.abs().sum() * 1e30, 0, 1)
        return x.relu() * (1 - switch) + (-x) * switch


def repeat_interleave_program(repeats: list[int]) -> torch.fx.GraphModule:
    """A program calling ``repeat_interleave(repeats, output_size=3)`` with repeats it is given as a constant."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    constant = graph.get_attr("repeats")
    interleaved = graph.call_function(torch.ops.aten.repeat_interleave.Tensor, (constant,), {"output_size": 3})
    graph.output((graph.call_function(torch.ops.aten.add.Tensor, (x, 1.0)), interleaved))
    root = torch.nn.Module()
    root.register_buffer("repeats", torch.tensor(repeats))
    return torch.fx.GraphModule(root, graph)
