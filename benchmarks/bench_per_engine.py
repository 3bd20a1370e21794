"""What the engine-by-engine comparison costs (reference backend, CPU).

For chains of ``Linear(width, width)`` with ``relu`` falling back (as the memory
benchmark's, one engine per layer), with a batch of ``--rows`` rows: the median
time of ``trt_inline.save`` with reference I/O and with boundary data
(``embed_reference="boundaries"``), the bytes the boundary data adds to the
file, and the median time of ``trt_inline.verify`` (in a child process, the CLI's
path), of ``verify(..., per_engine=True)`` and of ``diff`` of two saves, each
with its ratio to the plain verify.

    python benchmarks/bench_per_engine.py [--layers 8 32 128] [--width 512] [--rows 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

import trt_inline
from trt_inline.archive import REFERENCE_IO_FILE
from trt_inline.isolation import reusing_interpreter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.memory_steps import build_chain

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


def median_seconds(function: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def reference_bytes(path: Path) -> int:
    with zipfile.ZipFile(path) as archive:
        return next(i.file_size for i in archive.infolist() if i.filename.endswith(REFERENCE_IO_FILE))


def measure(
    compiled: torch.fx.GraphModule, x: torch.Tensor, plain: Path, bounded: Path, engines: int, repeats: int
) -> str:
    """One row of the table."""
    save = median_seconds(lambda: trt_inline.save(compiled, plain, arg_inputs=[x]), repeats)
    save_bounded = median_seconds(
        lambda: trt_inline.save(compiled, bounded, arg_inputs=[x], embed_reference="boundaries"), repeats
    )
    added = reference_bytes(bounded) - reference_bytes(plain)
    verify = median_seconds(lambda: trt_inline.verify(bounded), repeats)
    per_engine = median_seconds(lambda: trt_inline.verify(bounded, per_engine=True), repeats)
    diff = median_seconds(lambda: trt_inline.diff(plain, bounded), repeats)
    if not (trt_inline.verify(bounded, per_engine=True).ok and trt_inline.diff(plain, bounded).ok):
        raise SystemExit(f"the {engines}-engine chain did not verify")
    return (
        f"{engines:>7} {save:>7.2f} {save_bounded:>9.2f} {added / 2**20:>10.2f} {verify:>8.2f} "
        f"{per_engine:>12.2f} {per_engine / verify:>5.2f}x {diff:>7.2f} {diff / verify:>5.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}; median of {args.repeats}; Linear({args.width}, {args.width}) chains, "
          f"{args.rows} rows, relu falling back")  # fmt: skip
    header = (
        f"{'engines':>7} {'save s':>7} {'+bound. s':>9} {'bound. MiB':>10} {'verify s':>8} "
        f"{'per-engine s':>12} {'ratio':>6} {'diff s':>7} {'ratio':>6}"
    )
    print(header)
    with tempfile.TemporaryDirectory() as folder, reusing_interpreter():
        root = Path(folder)
        for layers in args.layers:
            model, _ = build_chain(layers, args.width)
            x = torch.randn(args.rows, args.width)
            compiled = trt_inline.reference.compile(model, (x,), torch_executed_ops=["aten.relu.default"])
            plain, bounded = root / f"plain_{layers}.pt2", root / f"bounded_{layers}.pt2"
            print(measure(compiled, x, plain, bounded, layers, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
