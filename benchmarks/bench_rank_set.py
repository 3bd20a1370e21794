"""What verifying a tensor-parallel rank set costs against N separate single-process verifies.

    python benchmarks/bench_rank_set.py [--ranks 2 3] [--hidden 1024] [--runs 3]

For each N, a job of N ranks (``torch.distributed.run``, gloo) saves a Megatron
MLP (column-parallel up projection, row-parallel down projection, all_reduce in
a fallback) as N rank files; one process saves the unsharded model (no
collective: the single-file verify of today runs it) as a plain file of the
same total weights. Then, median of ``--runs``:

* ``verify --ranks N``: N parents, N sandboxed children, collectives relayed;
* N sequential ``trt-inline verify`` of the unsharded file (what N separate
  single-process verifies cost: each its own interpreter and sandbox).

Prints seconds and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

_SAVE = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import trt_inline
    from trt_inline import reference

    class MLP(torch.nn.Module):
        def __init__(self, hidden, rank, world):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            up, down = torch.randn(4 * hidden, hidden, generator=g), torch.randn(hidden, 4 * hidden, generator=g)
            self.up = torch.nn.Parameter(up.chunk(world, 0)[rank].clone() / hidden**0.5)
            self.down = torch.nn.Parameter(down.chunk(world, 1)[rank].clone() / hidden**0.5)
            self.world = world

        def forward(self, x):
            y = torch.relu(x @ self.up.t()) @ self.down.t()
            return (funcol.all_reduce(y, "sum", dist.group.WORLD) if self.world > 1 else y) + x

    hidden, target = int(sys.argv[1]), sys.argv[2]
    ranked = "{rank}" in target
    if ranked:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if ranked else (0, 1)
    x = torch.randn(8, hidden, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        compiled = reference.compile(MLP(hidden, rank, world).eval(), (x,))
        trt_inline.save(compiled, target, arg_inputs=(x,))
    if ranked:
        dist.destroy_process_group()
    """
)


def _seconds(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    python = sys.executable
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        script = folder / "save.py"
        script.write_text(_SAVE)
        single = folder / "single.pt2"
        _seconds([python, str(script), str(args.hidden), str(single)])
        print(f"MLP hidden {args.hidden} ({single.stat().st_size / 2**20:.1f} MiB unsharded), median of {args.runs}")
        print(f"{'ranks':>5} {'verify --ranks N s':>19} {'N single verifies s':>20} {'ratio':>6}")
        for ranks in args.ranks:
            template = folder / f"mlp{ranks}_rank{{rank}}_of_{{world_size}}.pt2"
            run = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
            _seconds([*run, str(script), str(args.hidden), str(template)])
            rank_set = statistics.median(
                _seconds([python, "-m", "trt_inline", "verify", "--ranks", str(ranks), str(template)])
                for _ in range(args.runs)
            )
            separate = statistics.median(
                sum(_seconds([python, "-m", "trt_inline", "verify", str(single)]) for _ in range(ranks))
                for _ in range(args.runs)
            )
            print(f"{ranks:>5} {rank_set:>19.2f} {separate:>20.2f} {rank_set / separate:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
