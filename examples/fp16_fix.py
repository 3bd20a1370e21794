"""A model whose fp16 build is wrong, found and fixed end to end: compile, see it fail, search, save the fix.

    python examples/fp16_fix.py [--out DIR]
    trt-inline fix examples/fp16_fix.py [--out fixed.pt2]     (the same search as a command: model(), settings)

The model computes a squared activation (up to about 1e6, past fp16's largest value 65504) and scales it back
down, inside a residual block. Compiled as an fp16 build (``enable_autocast=True,
autocast_low_precision_type=torch.float16``: Torch-TensorRT 2.10+'s names; ``enable_autocast`` alone is fp32
there) it returns NaN where PyTorch's fp32 does not. ``trt_inline.find_fix`` searches for the modules to keep
in fp32 (``autocast_excluded_nodes``, which the releases match against module paths) and names them by module
path and source line; the model compiled with the settings it returns is saved, verified, and compared with
PyTorch. On a machine with TensorRT and CUDA the builds are Torch-TensorRT's; elsewhere the reference
backend's: the importable release's own pipeline (its autocast, its partitioner) with engines that compute as
an fp16 build does (an emulation: the kind of error, not TensorRT's numbers), or trt-inline's emulation of
that release where none is importable. Exit 0 when the fix holds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

import trt_inline


class Energy(nn.Module):
    """A block whose intermediate value leaves the fp16 range: ``(1000 h)^2 / 1e6``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x) * 1000.0
        energy = h * h
        return x + energy / 1e6


class Model(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Linear(width, width)
        self.block = Energy(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.block(torch.tanh(self.stem(x)))))


# The compile settings (an fp16 build in Torch-TensorRT 2.10+'s names), and the model with its example inputs: what
# `trt-inline fix` reads from this script.
settings = {"enable_autocast": True, "autocast_low_precision_type": torch.float16}


def model() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Model().eval(), (torch.randn(16, 32),)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for fixed.pt2 (default: a temporary one)")
    args = parser.parse_args(argv)
    module, (x,) = model()

    broken = trt_inline.reference.compile(module, (x,), **settings)
    with torch.no_grad():
        wrong = broken(x)
    print(f"fp16 build: finite outputs: {bool(wrong.isfinite().all())}")
    print(f"built on: {broken.trt_inline_pipeline}")

    report = trt_inline.find_fix(module, (x,), settings=settings)
    print(report.to_text())
    if not report.fixed:
        return 1

    fixed = trt_inline.reference.compile(module, (x,), **report.settings)
    folder = Path(args.out) if args.out else Path(tempfile.mkdtemp())
    path = folder / "fixed.pt2"
    trt_inline.save(fixed, path, arg_inputs=(x,))
    verdict = trt_inline.verify(path)
    with torch.no_grad():
        error = float((trt_inline.load(path).module()(x) - module(x)).abs().max())
    print(f"{verdict.status} {path}; max abs diff, loaded fix vs PyTorch fp32: {error:.3g}")
    return 0 if verdict.status == "PASS" and error < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
