"""Peak memory and time of save, load and verify for models of about 0.4, 1.6 and 6 GiB (reference backend, CPU).

The model is a chain of ``Linear(2048, 2048)`` layers with ``relu`` falling back
between them (24, 96 and 384 layers: one engine per layer, every weight in an
engine payload). Each step runs in a fresh process (``tests/memory_steps.py``),
which reports the step's peak resident memory above what the process held just
before it: the compiled module for a save, ``import trt_inline`` for a load; for
``verify``, the child process that loads and runs the file, above its imports.

Columns: peak extra memory in MiB, that peak as a multiple of the module's
tensor bytes (saves) or of the file's size (load, verify), seconds, and for the
larger models the seconds per byte as a multiple of the 0.4 GiB model's (the
budget for 4x the bytes is 4.5x the time: 1.125 here). The floors are what torch alone costs for the plain model:
``torch.export.save`` of its ExportedProgram, and AOTInductor compiling it.

A size is skipped, with its reason, where the machine's available memory is
short of what its steps need (about four times the model for a package).

    python benchmarks/bench_memory.py [--sizes 24,96,384] [--no-packages]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from memory_steps import measure_in_child

WIDTH = 2048
SAVE_STEPS = ("floor", "save", "save-no-retrace")
PACKAGE_STEPS = ("package-floor", "package")
READ_STEPS = ("load", "verify")
# What each step needs at its peak, in multiples of the model's bytes (building it and compiling included).
NEEDS = {
    **dict.fromkeys(("floor", "save", "save-no-retrace", "load", "verify"), 2.5),
    "package-floor": 4.0,
    "package": 4.5,
}


def available_memory() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="24,96,384", help="layer counts (of 16 MiB each), comma-separated")
    parser.add_argument("--no-packages", action="store_true", help="skip the AOTInductor steps (C++ compiles)")
    args = parser.parse_args()
    layers_list = [int(text) for text in args.sizes.split(",")]
    steps = [*SAVE_STEPS, *(() if args.no_packages else PACKAGE_STEPS), *READ_STEPS]

    header = f"{'model':>9} {'step':<16} {'peak extra MiB':>14} {'multiple':>10} {'seconds':>8}"
    print(f"{header} {'time per byte vs smallest':>26}")
    first_seconds: dict[str, float] = {}
    for layers in layers_list:
        model_bytes = layers * (WIDTH * WIDTH + WIDTH) * 4
        label = f"{model_bytes / 2**30:.1f} GiB"
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as folder:
            for step in steps:
                need = int(NEEDS[step] * model_bytes)
                if available_memory() < need:
                    why = f"{need / 2**30:.1f} GiB needed, {available_memory() / 2**30:.1f} GiB available"
                    print(f"{label:>9} {step:<16} skipped: {why}", flush=True)
                    continue
                result = measure_in_child(step, Path(folder), layers, WIDTH)
                base = result["file_bytes"] if step in READ_STEPS else result["tensor_bytes"]
                unit = "x file" if step in READ_STEPS else "x tensors"
                seconds = float(result["seconds"])
                first_seconds.setdefault(step, seconds / layers)
                growth = "" if layers == layers_list[0] else f"{seconds / layers / first_seconds[step]:.2f}x"
                peak = result["peak_extra_bytes"]
                print(
                    f"{label:>9} {step:<16} {peak / 2**20:>14.0f} {peak / base:>6.2f} {unit:<9}"
                    f"{seconds:>6.1f} {growth:>26}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
