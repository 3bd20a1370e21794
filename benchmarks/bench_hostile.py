"""Hostile files against verify: each case's exit code, stderr line, wall time and peak memory.

    python benchmarks/bench_hostile.py [--out DIR]

Builds every crafted file of ``tests/support/hostile.py`` from a freshly saved good
file, runs ``python -m trt_inline verify`` (or ``inspect``) on it as a user
would, and prints one row per case. Peak memory is the largest resident set of
the CLI process and the child process that loads the file (read from the
rusage of a wrapper process that runs only that command).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

_WRAPPER = (
    "import json, resource, subprocess, sys; "
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "print(json.dumps({'rc': p.returncode, 'stderr': p.stderr, 'stdout': p.stdout, "
    "'peak_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))"
)


def good_file(folder: Path) -> Path:
    import warnings

    import torch
    from support.models import RELU, ConvBnRelu

    import trt_inline

    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    compiled = trt_inline.reference.compile(ConvBnRelu().eval(), (x,), torch_executed_ops=[RELU])
    good = folder / "good.pt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecation notices, not ours
        trt_inline.save(compiled, good, arg_inputs=(x,))
    return good


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="keep the crafted files here (default: a temporary folder)")
    args = parser.parse_args()
    from support.hostile import CASES, INSPECTED, SECRET, Traps

    with tempfile.TemporaryDirectory() as scratch:
        root = args.out or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        good = good_file(root)
        print(f"{'case':<48} {'rc':>3} {'peak MiB':>9} {'s':>6}  safe  stderr")
        for index, case in enumerate((*CASES, *INSPECTED)):
            folder = root / f"case_{index:02d}"
            folder.mkdir(exist_ok=True)
            traps = Traps(folder)
            path = case.build(good, folder / "crafted.pt2", traps)
            command = [sys.executable, "-m", "trt_inline", case.command, str(path), *case.args]
            start = time.perf_counter()
            wrapped = subprocess.run(
                [sys.executable, "-c", _WRAPPER, *command], capture_output=True, text=True, cwd=folder
            )
            seconds = time.perf_counter() - start
            result = json.loads(wrapped.stdout)
            leaked = SECRET in result["stderr"] + result["stdout"]
            safe = "yes" if not traps.sprung() and not leaked and "\x1b" not in result["stderr"] else "NO"
            line = result["stderr"].strip() or result["stdout"].strip().splitlines()[1]
            line = line.replace(str(path), "FILE")
            peak = result["peak_kib"] / 1024
            print(f"{case.name:<48} {result['rc']:>3} {peak:>9.0f} {seconds:>6.1f}  {safe:<4}  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
