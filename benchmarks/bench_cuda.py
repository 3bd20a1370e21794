"""What verification costs on a CUDA device: ``trt-inline verify`` against loading, running and comparing by hand.

    python benchmarks/bench_cuda.py [--runs 3] [--models resnet50,vit_blocks] [--device cuda]

For each model (torchvision's resnet50, untrained; a ViT-B/16-sized stack of 12
pre-norm transformer blocks, width 768, 12 heads, 197 tokens), on CUDA through the
reference backend (one activation in PyTorch, the rest in engines): compiles and
saves it with its reference I/O, then times, ``--runs`` times each, in a fresh process:

* ``verify``: ``trt-inline verify FILE``: a sandboxed child loads the file, runs it
  on the embedded inputs on CUDA and compares;
* ``by hand``: ``torch.export.load`` + ``module()`` + one run + one comparison with
  the embedded outputs, no sandbox (what a user would otherwise write).

It prints the median of each, their ratio (the goal: verify within 1.5x of by hand),
the sandbox's start with CUDA (a child that starts CUDA inside the walls and does
nothing else), and the peak GPU memory of the by-hand run. Needs a CUDA device
(``--device cpu`` runs the same loop on the CPU, to check the benchmark itself);
torchvision for resnet50 (the ViT stack needs nothing but torch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from support.models import TransformerBlock  # noqa: E402

_BY_HAND = """
import json, sys, time, torch
import trt_inline
from trt_inline.archive import load_exported_program
started = time.perf_counter()
program = torch.export.load(sys.argv[1])
reference = load_exported_program(sys.argv[1]).reference   # the embedded inputs and outputs
module = program.module()
args = [a.to(reference.device) for a in reference.args]   # kept on the CPU in the file
with torch.no_grad():
    outputs = module(*args)
outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
diff = max(float((a.double() - b.to(a.device).double()).abs().max()) for a, b in zip(outputs, reference.outputs))
cuda = torch.cuda.is_initialized()
if cuda:
    torch.cuda.synchronize()
print(json.dumps({"seconds": time.perf_counter() - started, "diff": diff,
                  "peak_gpu": torch.cuda.max_memory_allocated() if cuda else 0}))
"""


class ViTBlocks(nn.Module):
    """A ViT-B/16-sized encoder: 12 pre-norm blocks, width 768, 12 heads (no patch embedding)."""

    def __init__(self, depth: int = 12, width: int = 768, heads: int = 12) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(TransformerBlock(width, heads) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def _model(name: str) -> tuple[nn.Module, torch.Tensor, str] | None:
    """The model, its input and the operator that falls back; None where torchvision is missing."""
    if name == "resnet50":
        try:
            import torchvision
        except ImportError:
            return None

        return torchvision.models.resnet50(weights=None), torch.randn(8, 3, 224, 224), "torch.ops.aten.relu.default"
    if name == "vit_blocks":
        return ViTBlocks(), torch.randn(8, 197, 768), "torch.ops.aten.gelu.default"
    raise SystemExit(f"unknown model {name!r}: resnet50 or vit_blocks")


def _timed(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({done.returncode}): {done.stdout}{done.stderr}")
    return seconds, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default="resnet50,vit_blocks")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device on this machine: nothing to measure")
        return 0

    import trt_inline
    from trt_inline import reference
    from trt_inline.isolation import Limits, SandboxRequest, run_isolated

    card = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "CPU"
    print(f"device: {card}; torch {torch.__version__}; median of {args.runs} runs")
    starts = []
    for _ in range(args.runs):
        started = time.perf_counter()
        result = run_isolated(SandboxRequest(), None, Limits(300, 2 << 30), where="sandbox")
        starts.append(time.perf_counter() - started)
    print(
        f"sandboxed child (starting CUDA where there is one): {statistics.median(starts):.2f} s "
        f"(CUDA inside: {result.value.cuda})"
    )
    print(f"{'model':<12} {'file MiB':>9} {'verify s':>9} {'by hand s':>10} {'ratio':>6} {'peak GPU MiB':>13}")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            found = _model(name)
            if found is None:
                print(f"{name:<12} skipped: torchvision is not installed")
                continue
            model, x, fallback = found
            model, x = model.eval().to(args.device), x.to(args.device)
            compiled = reference.compile(model, (x,), torch_executed_ops=[fallback])
            path = Path(scratch) / f"{name}.pt2"
            trt_inline.save(compiled, path, arg_inputs=(x,))
            del compiled, model
            verify_times, hand_times, peaks = [], [], []
            for _ in range(args.runs):
                seconds, out = _timed([sys.executable, "-m", "trt_inline", "verify", str(path)])
                assert out.startswith("PASS"), out
                verify_times.append(seconds)
                seconds, out = _timed([sys.executable, "-c", _BY_HAND, str(path)])
                found = json.loads(out.strip().splitlines()[-1])
                hand_times.append(seconds)
                peaks.append(found["peak_gpu"] / (1 << 20))
            verify_s, hand_s = statistics.median(verify_times), statistics.median(hand_times)
            print(
                f"{name:<12} {path.stat().st_size / (1 << 20):>9.0f} {verify_s:>9.2f} {hand_s:>10.2f} "
                f"{verify_s / hand_s:>6.2f} {statistics.median(peaks):>13.0f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
