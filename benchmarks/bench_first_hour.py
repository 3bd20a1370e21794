"""What a new user's first hour costs: verify against a plain load, run and compare, on six models.

For each model — a ResNet, a MobileNetV3, a ViT, a 2-layer BERT, a 2-layer GPT-2 and an LSTM classifier
(torchvision's and transformers' where they are importable, hand-built equivalents of the same shape
otherwise), random weights, batch 1 — compiled with the reference backend (``relu`` and ``gelu`` left to
PyTorch), saved with its engine boundaries, this times, back to back, in fresh processes each:

- ``load+run``: ``trt_inline.load`` + one run + a comparison with the saved outputs (what a user would write);
- ``verify``: ``trt-inline verify FILE`` (sandboxed child, every check, the same comparison);
- ``per-engine``: ``trt-inline verify FILE --per-engine``;
- ``inspect``: ``trt-inline inspect FILE``;
- ``refusal``: ``trt-inline verify`` of a path that does not exist;
- ``import torch``: ``python -c "import torch"`` (the floor every command pays).

It prints the medians, the ratios the targets are stated in (verify / load+run, per-engine / verify,
inspect and refusal minus ``import torch``), and for one model where verify's time goes: each phase
``--progress`` reports, with the time it started (the child's phases arrive through the parent).

    python benchmarks/bench_first_hour.py [--repeats 3] [--models resnet,lstm] [--smallest]

``--smallest``: one repeat, the two smallest models, no phase profile (what CI runs: no figure asserted).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import trt_inline

PYTHON = sys.executable
# What the `trt-inline` script runs (its entry point, which starts the child's interpreter before importing torch).
TRT_INLINE = [PYTHON, "-m", "trt_inline"]
_LOAD_RUN = """
import sys, torch, trt_inline
program = trt_inline.load(sys.argv[1])
inputs, expected = torch.load(sys.argv[2])
with torch.no_grad():
    got = program.module()(*inputs)
got = got if isinstance(got, (list, tuple)) else [got]
worst = max(float((g - e).abs().max()) for g, e in zip(got, expected))
assert worst <= 1e-4, worst
"""


def _resnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    try:
        import torchvision  # type: ignore[import-not-found]

        return torchvision.models.resnet18().eval(), (torch.randn(1, 3, 224, 224),)
    except ImportError:
        pass

    class Block(nn.Module):
        def __init__(self, channels: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(channels // stride, channels, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(channels)
            self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(channels)
            self.down = nn.Conv2d(channels // stride, channels, 1, stride, bias=False) if stride > 1 else nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + self.down(x))

    layers: list[nn.Module] = [
        nn.Conv2d(3, 32, 7, 2, 3, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    for channels, stride in ((32, 1), (32, 1), (64, 2), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1)):
        layers.append(Block(channels, stride))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 1000)]
    return nn.Sequential(*layers).eval(), (torch.randn(1, 3, 224, 224),)


def _mobilenet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    try:
        import torchvision

        return torchvision.models.mobilenet_v3_small().eval(), (torch.randn(1, 3, 224, 224),)
    except ImportError:
        pass

    def block(cin: int, cout: int, stride: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.Hardswish(),
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
        )  # fmt: skip

    layers = [nn.Conv2d(3, 16, 3, 2, 1), nn.Hardswish()]
    for cin, cout, stride in ((16, 24, 2), (24, 40, 2), (40, 48, 1), (48, 96, 2), (96, 96, 1)):
        layers.append(block(cin, cout, stride))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(96, 1000)]
    return nn.Sequential(*layers).eval(), (torch.randn(1, 3, 224, 224),)


class _Encoder(nn.Module):
    """Token (or patch) embedding, two transformer encoder layers (GELU), a head: BERT's and ViT's shape."""

    def __init__(self, patches: bool, causal: bool = False) -> None:
        super().__init__()
        self.patches, self.causal = patches, causal
        self.embed = nn.Conv2d(3, 192, 16, 16) if patches else nn.Embedding(1000, 192)
        self.position = nn.Parameter(torch.randn(1, 197 if patches else 64, 192) * 0.02)
        layer = nn.TransformerEncoderLayer(192, 4, 768, activation="gelu", batch_first=True, dropout=0.0)
        self.layers = nn.ModuleList([layer, nn.TransformerEncoderLayer(192, 4, 768, activation="gelu",
                                                                       batch_first=True, dropout=0.0)])  # fmt: skip
        self.cls = nn.Parameter(torch.zeros(1, 1, 192))
        self.head = nn.Linear(192, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.patches:
            h = self.embed(x).flatten(2).transpose(1, 2)
            h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1)
        else:
            h = self.embed(x)
        h = h + self.position[:, : h.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(h.shape[1]) if self.causal else None
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=self.causal)
        return self.head(h[:, 0] if self.patches else h)


def _vit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _Encoder(patches=True).eval(), (torch.randn(1, 3, 224, 224),)


def _bert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _Encoder(patches=False).eval(), (torch.randint(0, 1000, (1, 64)),)


def _gpt2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _Encoder(patches=False, causal=True).eval(), (torch.randint(0, 1000, (1, 64)),)


class _LstmClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 128)
        self.lstm = nn.LSTM(128, 256, num_layers=2, batch_first=True)
        self.head = nn.Linear(256, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(torch.relu(out[:, -1]))


def _lstm() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _LstmClassifier().eval(), (torch.randint(0, 1000, (1, 32)),)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "resnet": _resnet, "mobilenet_v3": _mobilenet, "vit": _vit, "bert_2l": _bert, "gpt2_2l": _gpt2, "lstm": _lstm,
}  # fmt: skip
SMALLEST = ("lstm", "mobilenet_v3")


def save_model(name: str, folder: Path) -> tuple[Path, Path, int]:
    """The model compiled with the reference backend and saved with its boundaries; its inputs and outputs."""
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    with warnings.catch_warnings():  # (a model without gelu: that entry matches nothing, as it says)
        warnings.simplefilter("ignore")
        compiled = trt_inline.reference.compile(
            model, inputs, torch_executed_ops=["aten.relu.default", "aten.gelu.default"], min_block_size=1
        )
    engines = sum(1 for child in compiled.named_children() if child[0].startswith("_run_on_acc_"))
    path = folder / f"{name}.pt2"
    trt_inline.save(compiled, path, arg_inputs=inputs, embed_reference="boundaries")
    with torch.no_grad():
        out = compiled(*inputs)
    expected = folder / f"{name}.io.pt"
    torch.save((inputs, list(out) if isinstance(out, (list, tuple)) else [out]), expected)
    return path, expected, engines


def seconds(command: list[str], expect: tuple[int, ...] = (0,)) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - start
    if proc.returncode not in expect:
        raise SystemExit(f"{' '.join(command)}: exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return elapsed


def phases(path: Path) -> list[tuple[float, str]]:
    """verify --progress of one file: (seconds since the command started, phase) per line as it arrived."""
    start = time.perf_counter()
    proc = subprocess.Popen([*TRT_INLINE, "verify", str(path), "--progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stderr is not None
    seen = [(time.perf_counter() - start, line.rstrip()) for line in proc.stderr]
    proc.wait()
    return [*seen, (time.perf_counter() - start, "(exit)")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--smallest", action="store_true", help="one repeat of the two smallest models (CI)")
    args = parser.parse_args()
    names = list(SMALLEST) if args.smallest else args.models.split(",")
    repeats = 1 if args.smallest else args.repeats
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}; medians of {repeats} run(s), seconds")
    floor = statistics.median(seconds([PYTHON, "-c", "import torch"]) for _ in range(repeats))
    print(f"import torch: {floor:.2f} s")
    header = f"{'model':<14}{'engines':>8}{'load+run':>10}{'verify':>9}{'ratio':>7}{'per-eng':>9}{'ratio':>7}" \
             f"{'inspect':>9}{'-floor':>8}{'refusal':>9}{'-floor':>8}"  # fmt: skip
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in names:
            path, io, engines = save_model(name, folder)
            timed: dict[str, list[float]] = {k: [] for k in ("load", "verify", "per", "inspect", "refusal")}
            for _ in range(repeats):  # back to back, so that each pair sees the same load on the machine
                timed["load"].append(seconds([PYTHON, "-c", _LOAD_RUN, str(path), str(io)]))
                timed["verify"].append(seconds([*TRT_INLINE, "verify", str(path)]))
                timed["per"].append(seconds([*TRT_INLINE, "verify", str(path), "--per-engine"]))
                timed["inspect"].append(seconds([*TRT_INLINE, "inspect", str(path)]))
                timed["refusal"].append(seconds([*TRT_INLINE, "verify", str(folder / "missing.pt2")], expect=(2,)))
            m = {key: statistics.median(values) for key, values in timed.items()}
            print(f"{name:<14}{engines:>8}{m['load']:>10.2f}{m['verify']:>9.2f}{m['verify'] / m['load']:>7.2f}"
                  f"{m['per']:>9.2f}{m['per'] / m['verify']:>7.2f}{m['inspect']:>9.2f}{m['inspect'] - floor:>8.2f}"
                  f"{m['refusal']:>9.2f}{m['refusal'] - floor:>8.2f}")  # fmt: skip
        if not args.smallest:
            name = names[0]
            print(f"\nwhere verify's time goes ({name}; seconds since the command started, each phase as reported):")
            for at, line in phases(folder / f"{name}.pt2"):
                print(f"  {at:7.2f}  {line[:110]}")


if __name__ == "__main__":
    main()
