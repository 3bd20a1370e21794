"""What a rehearsal on a Torch-TensorRT release's own pipeline costs against trt-inline's own.

For each model of the first-hour benchmark (``bench_first_hour.MODELS``), the median of ``--repeats`` runs of:

- ``own``: ``reference.compile(model, inputs, pipeline="own")`` (export, core ATen decompositions, trt-inline's
  partitioner, reference engines);
- ``release``: ``reference.compile(model, inputs, pipeline="release")`` (export here, then a child forked for
  the release's import and its dry run, the module handed back);
- ``rehearsal, next``: one more compile in a :class:`~trt_inline.reference.release.Rehearsal` that already made
  one (the release imported once: what each compile of ``find_fix``'s search costs after the first);

and the engines and fallbacks each pipeline made. The release must be importable (``pip install --no-deps
torch-tensorrt==X`` and its pure-Python requirements, or ``--site FOLDER`` holding them). Figures are printed,
not asserted.

    python benchmarks/bench_rehearsal.py [--repeats 3] [--models resnet,lstm] [--site FOLDER]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_first_hour import MODELS  # noqa: E402

import trt_inline  # noqa: E402
from trt_inline.reference.release import Rehearsal, installed_release  # noqa: E402

warnings.filterwarnings("ignore")


def timed(function: object) -> tuple[float, object]:
    started = time.perf_counter()
    result = function()  # type: ignore[operator]
    return time.perf_counter() - started, result


def shape(module: torch.nn.Module) -> str:
    names = [name for name, _ in module.named_children()]
    return f"{sum(n.startswith('_run_on_acc') for n in names)}/{sum(n.startswith('_run_on_gpu') for n in names)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--site", help="a folder holding the release's package, put first on sys.path")
    args = parser.parse_args()
    if args.site:
        sys.path.insert(0, args.site)
    release = installed_release()
    if release is None:
        raise SystemExit("no Torch-TensorRT release is importable: pip install --no-deps torch-tensorrt==X, or --site")
    print(f"torch {torch.__version__}, {release.name}, {torch.get_num_threads()} threads, medians of {args.repeats}")
    print("| model | own (s) | release (s) | ratio | rehearsal, next (s) | engines/fallbacks own | release |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for name in args.models.split(","):
        model, inputs = MODELS[name]()
        own, rel, nxt = [], [], []
        own_shape = rel_shape = ""
        for _ in range(args.repeats):
            seconds, compiled = timed(functools.partial(trt_inline.reference.compile, model, inputs, pipeline="own"))
            own.append(seconds)
            own_shape = shape(compiled)  # type: ignore[arg-type]
            seconds, compiled = timed(
                functools.partial(trt_inline.reference.compile, model, inputs, pipeline="release")
            )
            rel.append(seconds)
            rel_shape = shape(compiled)  # type: ignore[arg-type]
            with Rehearsal(release, torch.export.export(model, inputs), inputs) as rehearsal:
                rehearsal.compile({}, tf32=False)
                seconds, _ = timed(functools.partial(rehearsal.compile, {}, tf32=False))
                nxt.append(seconds)
        o, r, n = statistics.median(own), statistics.median(rel), statistics.median(nxt)
        print(f"| {name} | {o:.2f} | {r:.2f} | {r / o:.2f} | {n:.2f} | {own_shape} | {rel_shape} |")


if __name__ == "__main__":
    main()
