"""What the OS sandbox costs per file: a verify with and without it, on a fresh interpreter and forked.

    python benchmarks/bench_sandbox.py [--runs 7]

Saves the seed model, then verifies it ``--runs`` times in each of four ways (a
fresh interpreter per file as the ``trt-inline`` command does, or children forked
from one clean interpreter as ``reusing_interpreter`` does; sandboxed or with
``sandbox=False``) and prints the median wall time of one verify and the child's
peak resident memory above its imports. A second table times the sandbox's own
set-up inside the child (namespaces, Landlock, seccomp) with a job that does nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hostile import good_file  # noqa: E402 - the same good file bench_hostile crafts from


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    import contextlib

    import trt_inline
    from trt_inline.isolation import Limits, SandboxRequest, reusing_interpreter, run_isolated, sandbox

    missing = sandbox.status().missing
    if missing:
        print(f"the sandbox cannot be set up here: {', '.join(missing)}")
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        good = good_file(Path(scratch))
        print(f"verify of {good.name} ({good.stat().st_size / 1024:.0f} KiB), median of {args.runs}")
        print(f"{'children':<10} {'sandbox':<8} {'seconds':>8} {'peak above imports MiB':>23}")
        times: dict[tuple[str, bool], float] = {}
        for mode in ("fresh", "forked"):
            for walls in (False, True):
                block = reusing_interpreter() if mode == "forked" else contextlib.nullcontext()
                seconds, extra = [], []
                with block:
                    if mode == "forked":
                        trt_inline.verify(good, sandbox=walls)  # starts the interpreter the rest fork from
                    for _ in range(args.runs):
                        started = time.perf_counter()
                        report = trt_inline.verify(good, sandbox=walls)
                        seconds.append(time.perf_counter() - started)
                        extra.append((report.child_peak_extra_bytes or 0) / (1 << 20))
                        assert report.ok, report.to_text()
                times[mode, walls] = statistics.median(seconds)
                peak = statistics.median(extra)
                print(f"{mode:<10} {'on' if walls else 'off':<8} {times[mode, walls]:>8.3f} {peak:>23.1f}")
        for mode in ("fresh", "forked"):
            print(f"sandbox cost, {mode}: {times[mode, True] - times[mode, False]:+.3f} s per file "
                  f"({times[mode, True] / times[mode, False]:.2f}x)")  # fmt: skip

        print("\nset-up alone (a job that does nothing), forked children, median of", args.runs)
        with reusing_interpreter():
            for label, namespaces in (("Landlock + seccomp", False), ("+ namespaces", True)):
                run_isolated(SandboxRequest(), None, Limits(60, 2 << 30), where="bench", namespaces=namespaces)
                seconds = []
                for _ in range(args.runs):
                    started = time.perf_counter()
                    run_isolated(SandboxRequest(), None, Limits(60, 2 << 30), where="bench", namespaces=namespaces)
                    seconds.append(time.perf_counter() - started)
                unsandboxed = []
                for _ in range(args.runs):
                    started = time.perf_counter()
                    run_isolated(SandboxRequest(), None, Limits(60, 2 << 30), where="bench", sandbox=False)
                    unsandboxed.append(time.perf_counter() - started)
                cost = statistics.median(seconds) - statistics.median(unsandboxed)
                with_s, without_s = statistics.median(seconds), statistics.median(unsandboxed)
                print(f"  {label:<22} {with_s:.3f} s (without: {without_s:.3f} s; {cost * 1000:+.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
