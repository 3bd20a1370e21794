"""Which engine diverged: a saved program with boundary data, two injected faults, and the reports that name them.

Compiles a three-engine model (relu left to PyTorch between the engines) on the
CPU reference backend, saves it with ``embed_reference="boundaries"``, then
writes two broken copies: one with a weight of the second engine moved in the
saved payload, one with the second relu (a fallback region) computing sigmoid.
Runs ``trt-inline verify --per-engine`` on each and ``trt-inline diff`` of each
against the good file, printing the reports; exits 1 unless every report names
the engine or the region that was changed.

    python examples/which_engine_diverged.py [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
from torch import nn

import trt_inline
from trt_inline.archive import REFERENCE_IO_FILE
from trt_inline.cli import main as trt_inline_cli


class CrossedHalves(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.last = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.first(x).chunk(2, dim=-1)
        c, d = self.second(torch.cat([torch.relu(a), b], -1)).chunk(2, dim=-1)
        return self.last(torch.cat([torch.relu(d), c], -1))


def _resave(good: Path, target: Path, program: torch.export.ExportedProgram) -> Path:
    """``program`` written to ``target`` with the good file's reference I/O and boundary data."""
    with zipfile.ZipFile(good) as archive:
        extra = archive.read(next(n for n in archive.namelist() if n.endswith(REFERENCE_IO_FILE))).decode()
    torch.export.save(program, target, extra_files={REFERENCE_IO_FILE: extra})
    return target


def engine_fault(good: Path, target: Path, engine: int) -> Path:
    """The first weight of engine ``engine`` moved by 0.05 in the saved payload."""
    program = torch.export.load(good)
    node = [n for n in program.graph.nodes if n.target is torch.ops.trt_inline.execute_engine.default][engine]
    weight = json.loads(node.args[2])["weights"][0]
    constant = next(s.target for s in program.graph_signature.input_specs if s.arg.name == node.args[1].name)
    program.constants[constant][weight["offset"] : weight["offset"] + weight["nbytes"]].view(torch.float32).add_(0.05)
    return _resave(good, target, program)


def fallback_fault(good: Path, target: Path) -> Path:
    """The second relu computing sigmoid."""
    program = torch.export.load(good)
    relu = [n for n in program.graph.nodes if n.target is torch.ops.aten.relu.default][1]
    relu.target = torch.ops.aten.sigmoid.default
    program.graph_module.recompile()
    return _resave(good, target, program)


def run(*args: str) -> tuple[int, str]:
    """``trt-inline ARGS`` in this process (each file is still opened in a child): exit status and output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = trt_inline_cli(list(args))
    print(f"$ trt-inline {' '.join(args)}\n{out.getvalue()}(exit {code})\n")
    return code, out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="folder for the files (default: a temporary folder)")
    args = parser.parse_args(argv)
    folder = Path(args.out or tempfile.mkdtemp(prefix="which-engine-"))
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)  # the reports name the files as given: short relative names

    torch.manual_seed(0)
    x = torch.randn(3, 8)
    compiled = trt_inline.reference.compile(
        CrossedHalves().eval(), (x,), torch_executed_ops={torch.ops.aten.relu.default}, min_block_size=1
    )
    good = Path("good.pt2")
    trt_inline.save(compiled, good, arg_inputs=[x], embed_reference="boundaries")
    engine = engine_fault(good, Path("engine_fault.pt2"), engine=1)
    region = fallback_fault(good, Path("fallback_fault.pt2"))
    print(f"files in {folder}\n")

    second = [n for n, _ in compiled.named_children() if n.startswith("_run_on_acc_")][1]
    checks = [
        (run("verify", str(engine), "--per-engine"), f"first divergence: engine 1 ({second})"),
        (run("verify", str(region), "--per-engine"), "first divergence: fallback region relu_1"),
        (run("diff", str(engine), str(good)), f"first divergence: engine 1 ({second})"),
        (run("diff", str(region), str(good)), "first divergence: fallback region relu_1"),
        (run("diff", str(good), str(good)), None),
    ]
    failed = [
        expected or "exit 0"
        for (code, output), expected in checks
        if (expected is None and code != 0) or (expected is not None and (code != 1 or expected not in output))
    ]
    if failed:
        print(f"FAILED: a report did not name {'; '.join(failed)}", file=sys.stderr)
        return 1
    print("OK: every report names what was changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
