"""Cost of ``inline_torch_modules`` against the ``graph_copy`` floor, and within ``save``.

A chain of N linear -> relu blocks with relu falling back, partitioned the way
Torch-TensorRT partitions it: N engines ``_run_on_acc_{2i}`` alternating with N
fallbacks ``_run_on_gpu_{2i+1}`` whose placeholder is named ``getitem`` (the
seed's hazard). For each N the table gives the median time of

* ``inline``: ``inline_torch_modules`` on the graph after ``inline_trt_modules``;
* ``floor``: the same graph with one bare ``graph_copy`` per fallback (val_map
  seeded with placeholder -> argument) and nothing else;

their ratio, and the scaling of ``inline`` from N to 8N. The second table
gives ``inline`` as a fraction of a whole ``trt_inline.save``.

    python benchmarks/bench_inline.py [--sizes 125 250 500 1000 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

import trt_inline
from trt_inline.engines import is_fallback_call
from trt_inline.reference.engine import ReferenceEngine, build_engine

WIDTH = 32
BATCH = 4


def _linear_engine() -> ReferenceEngine:
    weight, bias = torch.randn(WIDTH, WIDTH) / WIDTH**0.5, torch.randn(WIDTH)

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.bias = torch.nn.Parameter(weight), torch.nn.Parameter(bias)

        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten.addmm.default(self.bias, a, torch.ops.aten.t.default(self.weight))

    return build_engine(torch.fx.symbolic_trace(Linear()), "_run_on_acc")


def _relu_fallback() -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    getitem = graph.placeholder("getitem")  # named after its producer before partitioning
    graph.output(graph.call_function(torch.ops.aten.relu.default, (getitem,)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def chain(n: int) -> torch.fx.GraphModule:
    """The partitioned module of n linear -> relu blocks, with meta["val"] everywhere."""
    mode = FakeTensorMode()
    fake = mode.from_tensor(torch.empty(BATCH, WIDTH))
    root = torch.nn.Module()
    graph = torch.fx.Graph()
    value = graph.placeholder("x")
    value.meta["val"] = fake
    engine = _linear_engine()
    for i in range(n):
        acc, gpu = f"_run_on_acc_{2 * i}", f"_run_on_gpu_{2 * i + 1}"
        root.add_module(acc, ReferenceEngine(engine.program, engine.engine, num_outputs=1, name=acc))
        fallback = _relu_fallback()
        for node in fallback.graph.nodes:
            if node.op != "output":
                node.meta["val"] = fake
        root.add_module(gpu, fallback)
        value = graph.call_module(acc, (value,))
        value.meta["val"] = [fake]
        value = graph.call_module(gpu, (value,))
        value.meta["val"] = fake
    graph.output((value,))
    return torch.fx.GraphModule(root, graph)


def graph_copy_floor(gm: torch.fx.GraphModule) -> None:
    """One positional graph_copy per fallback, nothing else: what inlining cannot beat."""
    for call_node in list(gm.graph.nodes):
        if not is_fallback_call(gm, call_node):
            continue
        submodule = gm.get_submodule(str(call_node.target))
        placeholders = [n for n in submodule.graph.nodes if n.op == "placeholder"]
        with gm.graph.inserting_before(call_node):
            gm.graph.graph_copy(submodule.graph, dict(zip(placeholders, call_node.args, strict=True)))


def median_seconds(
    prepare: Callable[[], torch.fx.GraphModule], run: Callable[[torch.fx.GraphModule], object], repeats: int
) -> float:
    samples = []
    for _ in range(repeats):
        gm = prepare()
        gc.collect()
        gc.disable()  # as timeit does: a collection of the whole heap is not the pass's cost
        try:
            start = time.perf_counter()
            run(gm)
            samples.append(time.perf_counter() - start)
        finally:
            gc.enable()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[125, 250, 500, 1000, 2000])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--save-sizes", type=int, nargs="+", default=[125, 1000])
    args = parser.parse_args()
    torch.manual_seed(0)

    inline_times: dict[int, float] = {}
    print(f"inline_torch_modules vs graph_copy floor (median of {args.repeats}, seconds)")
    print(f"{'N':>6} {'nodes':>7} {'inline':>9} {'floor':>9} {'ratio':>6}")
    for n in args.sizes:
        template = chain(n)
        trt_inline.inline_trt_modules(template)

        def prepare(template: torch.fx.GraphModule = template) -> torch.fx.GraphModule:
            return copy.deepcopy(template)

        inline = median_seconds(prepare, trt_inline.inline_torch_modules, args.repeats)
        floor = median_seconds(prepare, graph_copy_floor, args.repeats)
        inline_times[n] = inline
        nodes = len(template.graph.nodes)
        print(f"{n:>6} {nodes:>7} {inline:>9.4f} {floor:>9.4f} {inline / floor:>6.2f}")

    print("\nscaling of inline from N to 8N (linear = 8.0)")
    for n in args.sizes:
        if 8 * n in inline_times:
            print(f"  {n:>5} -> {8 * n:<5} x{inline_times[8 * n] / inline_times[n]:.2f}")

    print("\ninline_torch_modules within trt_inline.save(retrace=False) (median of 3, seconds)")
    print(f"{'N':>6} {'save':>9} {'inline':>9} {'share':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.save_sizes:
            compiled = chain(n)
            path = Path(tmp) / f"chain{n}.pt2"
            save = median_seconds(lambda c=compiled: c, lambda c, p=path: trt_inline.save(c, p, retrace=False), 3)
            prepared = chain(n)
            trt_inline.inline_trt_modules(prepared)
            inline = median_seconds(lambda p=prepared: copy.deepcopy(p), trt_inline.inline_torch_modules, 3)
            print(f"{n:>6} {save:>9.3f} {inline:>9.4f} {inline / save:>6.1%}")


if __name__ == "__main__":
    main()
