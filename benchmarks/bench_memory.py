"""Peak memory and time of save, load, verify and inspect, from 0.4 GiB models to a file larger than RAM.

The model is a chain of ``Linear(2048, 2048)`` layers with ``relu`` falling back
between them (24, 96 and 384 layers: one engine per layer, every weight in an
engine payload). Each step runs in a fresh process (``tests/support/memory_steps.py``),
which reports the step's peak resident memory above what the process held just
before it (the compiled module for a save; the imports for a load; for
``verify`` and ``inspect``, the child process that opens the file, above its
imports), and of it the peaks of anonymous memory (the process's own) and of
file-backed memory (weights mapped from the file, which the kernel can drop and
read again), sampled every few milliseconds.

Columns: peak extra memory, anonymous and file-backed in MiB, the anonymous
peak as a multiple of the module's tensor bytes (saves) or of the file's size
(reads), seconds, and for the larger models the seconds per byte as a multiple
of the smallest's. ``load`` is ``trt_inline.load`` (mapped), ``load-stock``
``torch.export.load`` of the same file; the floors are torch alone on the plain
model. A size is skipped, with its reason, where the machine's available memory
is short of what its steps need.

``--larger-than-ram`` then builds a file of 1.5 times the machine's memory (36
GiB on a 24 GiB machine) without ever holding it: the linear layers fall back to
PyTorch with their weights mapped from a sparse file (zeros the disk never
stores), so the save streams them from the mapping to the archive. It
inspects and verifies that file with progress, and prints the wall time next to
the disk's read rate (measured on the file itself, first, with the page cache
dropped for it). It checks the free disk space first and says so when it is short.

    python benchmarks/bench_memory.py [--sizes 24,96,384] [--no-packages] [--larger-than-ram]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.memory_steps import measure_in_child

WIDTH = 2048
SAVE_STEPS = ("floor", "save", "save-no-retrace")
PACKAGE_STEPS = ("package-floor", "package")
READ_STEPS = ("load-floor", "load-stock", "load", "verify", "verify-per-engine", "inspect")
# What each step needs at its peak, in multiples of the model's bytes (building it and compiling included).
NEEDS = {
    **dict.fromkeys((*SAVE_STEPS, *READ_STEPS), 2.5),
    "package-floor": 4.0,
    "package": 4.5,
}


def _meminfo(field: str) -> int:
    """A ``/proc/meminfo`` figure in bytes (this process imports no torch, so not trt_inline's reader)."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


def available_memory() -> int:
    return _meminfo("MemAvailable")


def total_memory() -> int:
    return _meminfo("MemTotal")


def _row(label: str, step: str, result: dict[str, float], base: float, unit: str, growth: str) -> str:
    mib = 1 << 20
    return (
        f"{label:>9} {step:<18} {result['peak_extra_bytes'] / mib:>9.0f} {result['peak_anonymous_bytes'] / mib:>9.0f} "
        f"{result['peak_file_bytes'] / mib:>9.0f} {result['peak_anonymous_bytes'] / base:>6.2f} {unit:<9}"
        f"{float(result['seconds']):>7.1f} {growth:>10}"
    )


def chains(layers_list: list[int], packages: bool) -> None:
    steps = [*SAVE_STEPS, *(PACKAGE_STEPS if packages else ()), *READ_STEPS]
    print(
        f"{'model':>9} {'step':<18} {'peak MiB':>9} {'anon MiB':>9} {'file MiB':>9} {'anon multiple':<16}"
        f"{'seconds':>7} {'per byte':>10}"
    )
    first_seconds: dict[str, float] = {}
    for layers in layers_list:
        model_bytes = layers * (WIDTH * WIDTH + WIDTH) * 4
        label = f"{model_bytes / 2**30:.1f} GiB"
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as folder:
            for step in steps:
                need = int(NEEDS[step] * model_bytes)
                if available_memory() < need:
                    why = f"{need / 2**30:.1f} GiB needed, {available_memory() / 2**30:.1f} GiB available"
                    print(f"{label:>9} {step:<18} skipped: {why}", flush=True)
                    continue
                result = measure_in_child(step, Path(folder), layers, WIDTH)
                base = result["file_bytes"] if step in READ_STEPS else result["tensor_bytes"]
                unit = "x file" if step in READ_STEPS else "x tensors"
                seconds = float(result["seconds"])
                first_seconds.setdefault(step, seconds / layers)
                growth = "" if layers == layers_list[0] else f"{seconds / layers / first_seconds[step]:.2f}x"
                print(_row(label, step, result, base, unit, growth), flush=True)


# The larger-than-RAM run: one process builds and saves (weights mapped from a sparse file), then the CLI reads.
_BUILD = """
import mmap, sys, time, warnings, torch, trt_inline
source, target, layers, width = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
per_layer = width * width + width
with open(source, "rb") as handle:  # shared and read-only: no commit charge, pages the kernel can drop
    mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
warnings.simplefilter("ignore")
weights = torch.frombuffer(mapping, dtype=torch.float32, count=layers * per_layer)
class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width, device="meta") for _ in range(layers))
        for index, layer in enumerate(self.layers):
            block = weights[index * per_layer : (index + 1) * per_layer]
            layer.weight = torch.nn.Parameter(block[: width * width].view(width, width), requires_grad=False)
            layer.bias = torch.nn.Parameter(block[width * width :], requires_grad=False)
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) + 1.0
        return x
x = torch.ones(4, width)
started = time.perf_counter()
model = Chain().eval()
compiled = trt_inline.reference.compile(model, (x,), torch_executed_ops={"torch.ops.aten.linear.default",
    "torch.ops.aten.addmm.default", "torch.ops.aten.mm.default", "torch.ops.aten.t.default",
    "torch.ops.aten.permute.default"})
trt_inline.save(compiled, target, arg_inputs=(x,), retrace=False)
print(f"{time.perf_counter() - started:.1f}")
"""


def _read_rate(path: Path, sample: int = 1 << 62) -> float:
    """Bytes per second reading ``path`` from disk (its page cache dropped first), over its first ``sample`` bytes
    (by default all of it: a sample of a file just written may come from a cache below the machine's own)."""
    with open(path, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        started = time.perf_counter()
        done = 0
        while done < sample:
            chunk = handle.read(16 << 20)
            if not chunk:
                break
            done += len(chunk)
        rate = done / (time.perf_counter() - started)
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return rate


def larger_than_ram(folder: Path, reuse: bool = False) -> int:
    ram = total_memory()
    layers = int(1.5 * ram / ((WIDTH * WIDTH + WIDTH) * 4)) + 1
    model_bytes = layers * (WIDTH * WIDTH + WIDTH) * 4
    free = shutil.disk_usage(folder).free
    target = folder / "larger_than_ram.pt2"
    reuse = reuse and target.is_file()
    print(f"\nlarger than RAM: {layers} layers, {model_bytes / 2**30:.1f} GiB of weights, {ram / 2**30:.1f} GiB of RAM")
    if free < model_bytes * 1.1 and not reuse:
        print(
            f"skipped: {model_bytes * 1.1 / 2**30:.1f} GiB of free disk needed in {folder}, {free / 2**30:.1f} GiB free"
        )
        return 1
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    if reuse:
        print(f"reusing {target} (built by an earlier run)")
    else:
        source = folder / "weights.bin"
        with open(source, "wb") as handle:
            handle.truncate(model_bytes)  # sparse: reads give zeros, the disk stores nothing
        command = [sys.executable, "-c", _BUILD, str(source), str(target), str(layers), str(WIDTH)]
        built = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        source.unlink()
        if built.returncode != 0:
            print(f"building the file failed:\n{built.stderr[-3000:]}")
            return 1
        seconds = float(built.stdout.split()[-1])
        print(f"built and saved {target.stat().st_size / 2**30:.1f} GiB in {seconds:.0f} s (weights never in memory)")
    size = target.stat().st_size
    # The disk's rate moves from one minute to the next here: each command is set against a read just before it.
    for command in (["inspect", str(target)], *[["verify", str(target), "--timeout", "3600"]] * 2):
        rate = _read_rate(target)
        print(f"\nthe disk reads this file at {rate / 2**20:.0f} MiB/s: reading it once took {size / rate:.0f} s")
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "trt_inline", *command, "--progress"], capture_output=True, text=True, env=env
        )
        seconds = time.perf_counter() - started
        tail = [line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL", "  note: loaded"))]
        progress = [line for line in done.stderr.splitlines() if line.startswith("trt-inline: [")]
        reads = seconds / (size / rate)
        print(
            f"\n$ trt-inline {command[0]} ({seconds:.0f} s, {reads:.2f}x one read of the file; exit {done.returncode})"
        )
        for line in progress + tail:
            print(f"  {line}")
        if done.returncode != 0:
            print(done.stderr[-2000:])
    rate = _read_rate(target)
    print(f"\nand after: the disk reads this file at {rate / 2**20:.0f} MiB/s ({size / rate:.0f} s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="24,96,384", help="layer counts (of 16 MiB each), comma-separated")
    parser.add_argument("--no-packages", action="store_true", help="skip the AOTInductor steps (C++ compiles)")
    parser.add_argument("--larger-than-ram", action="store_true", help="also build, inspect and verify a file 1.5x RAM")
    parser.add_argument(
        "--folder", type=Path, default=None, help="where the larger-than-RAM file goes (default: a temporary folder)"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="keep the larger-than-RAM file in --folder, and use it if it is there"
    )
    args = parser.parse_args()
    if args.reuse and args.folder is None:
        parser.error("--reuse needs --folder")
    if args.sizes:
        chains([int(text) for text in args.sizes.split(",")], not args.no_packages)
    if args.larger_than_ram and args.reuse:
        return larger_than_ram(args.folder, reuse=True)
    if args.larger_than_ram:
        with tempfile.TemporaryDirectory(prefix="bench-memory-big-", dir=args.folder) as folder:
            return larger_than_ram(Path(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
