"""End-to-end cost of a save, of a load, and of running what was loaded (reference backend, CPU).

For the seed scenario (conv-bn-relu, relu falling back) and a ResNet-style
model (residual add falling back): median ``trt_inline.save`` time for both
``retrace`` values, file size, median ``torch.export.load`` time, and the
latency of the loaded program against the in-memory compiled module (median of
the ratios of alternating pairs of calls; target <= 1.01). Then, for the same
models, the AOTInductor package (``output_format="aot_inductor"``): compile and
save time, size, load time, and its latency against the in-memory module and
against the loaded ExportedProgram, as paired ratios. The models are the test suite's.

    python benchmarks/bench_save_load.py [--repeats 5] [--runs 1000] [--no-packages]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import trt_inline
from trt_inline import reference

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.models import ConvBnRelu, TinyResNet

# torch's own deprecation notice from deep-copying pytree specs; nothing to act on here.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


def median_seconds(function: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def latency_ratio(first: Callable[[], object], second: Callable[[], object], runs: int) -> tuple[float, float, float]:
    """Medians of ``first`` and ``second`` timed in alternating pairs, and the median of the pair ratios.

    Pairing cancels the drift of a shared machine: both calls of a pair see the same load.
    """
    pairs: list[tuple[float, float]] = []
    with torch.no_grad():
        for _ in range(20):
            first(), second()
        for run in range(runs):
            # Alternate which call goes first, so that cache warmth favours neither.
            order = (first, second) if run % 2 == 0 else (second, first)
            start = time.perf_counter()
            order[0]()
            middle = time.perf_counter()
            order[1]()
            end = time.perf_counter()
            pair = (middle - start, end - middle)
            pairs.append(pair if run % 2 == 0 else (pair[1], pair[0]))
    ratio = statistics.median(b / a for a, b in pairs)
    return statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs), ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--no-packages", action="store_true", help="skip the AOTInductor packages (C++ compiles)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # latency comparisons on a shared 2-core machine

    scenarios = {
        "seed conv-bn-relu": (ConvBnRelu(16).eval(), torch.randn(4, 3, 32, 32), ["aten.relu.default"]),
        "resnet-style": (TinyResNet(16).eval(), torch.randn(4, 3, 32, 32), ["aten.add.Tensor"]),
    }
    print(f"median of {args.repeats} saves/loads; latency: {args.runs} alternating pairs, 1 thread")
    print("ratio: median over pairs of loaded / in-memory time")
    print(
        f"{'model':<18} {'retrace':<7} {'save s':>7} {'size KiB':>9} {'load s':>7} "
        f"{'in-mem ms':>9} {'loaded ms':>9} {'ratio':>6}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, x, fallback_ops) in scenarios.items():
            compiled = reference.compile(model, (x,), torch_executed_ops=fallback_ops)
            for retrace in (True, False):
                path = Path(tmp) / f"{name.replace(' ', '_')}_{retrace}.pt2"
                print(measure(name, compiled, x, retrace, path, args.repeats, args.runs))
        if args.no_packages:
            return
        print("\nAOTInductor packages (retrace=True); compile: one compile, after any inductor cache of earlier runs")
        print("vs in-mem / vs program: median over pairs of package / in-memory and package / loaded-program time")
        print(
            f"{'model':<18} {'compile s':>9} {'size KiB':>9} {'load s':>7} {'package ms':>10} "
            f"{'vs in-mem':>9} {'vs program':>10}"
        )
        for name, (model, x, fallback_ops) in scenarios.items():
            compiled = reference.compile(model, (x,), torch_executed_ops=fallback_ops)
            print(measure_package(name, compiled, x, Path(tmp), args.repeats, args.runs))


def measure(
    name: str, compiled: torch.fx.GraphModule, x: torch.Tensor, retrace: bool, path: Path, repeats: int, runs: int
) -> str:
    """One table row: save, size, load, and latency of the loaded program against the compiled module."""
    save = median_seconds(lambda: trt_inline.save(compiled, path, arg_inputs=(x,), retrace=retrace), repeats)
    load = median_seconds(lambda: torch.export.load(path), repeats)
    loaded = torch.export.load(path).module()
    in_memory, from_file, ratio = latency_ratio(lambda: compiled(x), lambda: loaded(x), runs)
    return (
        f"{name:<18} {retrace!s:<7} {save:>7.3f} {path.stat().st_size / 1024:>9.1f} {load:>7.3f} "
        f"{in_memory * 1e3:>9.3f} {from_file * 1e3:>9.3f} {ratio:>6.3f}"
    )


def measure_package(
    name: str, compiled: torch.fx.GraphModule, x: torch.Tensor, folder: Path, repeats: int, runs: int
) -> str:
    """One table row for the AOTInductor package of ``compiled``."""
    stem = name.replace(" ", "_")
    program_path, package_path = folder / f"{stem}_program.pt2", folder / f"{stem}_package.pt2"
    trt_inline.save(compiled, program_path, arg_inputs=(x,))
    start = time.perf_counter()
    trt_inline.save(compiled, package_path, arg_inputs=(x,), output_format="aot_inductor")
    compile_seconds = time.perf_counter() - start
    load = median_seconds(lambda: trt_inline.package.load_package(package_path), repeats)
    package = trt_inline.package.load_package(package_path)
    program = torch.export.load(program_path).module()
    _, package_seconds, vs_memory = latency_ratio(lambda: compiled(x), lambda: package(x), runs)
    _, _, vs_program = latency_ratio(lambda: program(x), lambda: package(x), runs)
    return (
        f"{name:<18} {compile_seconds:>9.1f} {package_path.stat().st_size / 1024:>9.1f} {load:>7.3f} "
        f"{package_seconds * 1e3:>10.3f} {vs_memory:>9.3f} {vs_program:>10.3f}"
    )


if __name__ == "__main__":
    main()
