"""What holding every value to its declaration costs: a checked call against a plain call of the same program.

Verify's normal call runs the graph node by node (:mod:`trt_inline.verify.checked_run`): each value against its
node's ``meta["val"]``, each engine and program output sighted for the garbage checks. For three programs (the
test suite's TinyResNet compiled into reference engines; a stack of small transformer blocks, many small nodes:
the per-node cost at its worst; the same stack at a larger width) this prints the median time of a plain call and
of a checked call, their ratio, and the node count.

    python benchmarks/bench_checked_run.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

import trt_inline
from trt_inline.verify.checked_run import checking

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_save_load import median_seconds
from support.models import RELU, TinyResNet, TransformerBlock

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


class Stack(nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(TransformerBlock() for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    cases = [
        ("TinyResNet, reference engines", TinyResNet().eval(), (torch.randn(8, 3, 32, 32),), True),
        ("12 transformer blocks, 2x5x32", Stack(12).eval(), (torch.randn(2, 5, 32),), False),
        ("12 transformer blocks, 32x64x32", Stack(12).eval(), (torch.randn(32, 64, 32),), False),
    ]
    print(f"{'program':<34} {'nodes':>6} {'plain':>10} {'checked':>10} {'ratio':>6}")
    for name, model, inputs, compiled in cases:
        if compiled:
            module_compiled = trt_inline.reference.compile(model, inputs, torch_executed_ops=[RELU])
            program = trt_inline.export.to_exported_program(module_compiled, arg_inputs=inputs)
        else:
            program = torch.export.export(model, inputs)
        module = program.module()

        def checked(module: torch.nn.Module = module, inputs: tuple[torch.Tensor, ...] = inputs) -> None:
            with checking(module, None, "bench") as check:
                module(*inputs)
            assert check is not None and not check.declared.summary()

        checked()  # (warm: the first call of each pays for what is built once)
        with torch.no_grad():
            module(*inputs)
            plain = median_seconds(lambda module=module, inputs=inputs: module(*inputs), args.repeats)
            held = median_seconds(checked, args.repeats)
        nodes = len(module.graph.nodes)
        print(f"{name:<34} {nodes:>6} {plain * 1e3:>8.2f}ms {held * 1e3:>8.2f}ms {held / plain:>6.2f}")


if __name__ == "__main__":
    main()
