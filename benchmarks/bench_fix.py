"""How ``find_fix`` searches: planted precision-sensitive spots found, the set's size, the compiles it took.

Each model is a network of filler blocks (``x/2 + tanh(W x)``: within tolerance in fp16) with planted spots
an fp16 build gets wrong, each a module of its own:

- ``OverflowNorm``: an activation past the fp16 range (about 1e5) before a normalization that brings it back;
- ``LongSum``: a sum over 4096 values (about 8e4) turned into a mean by the next node;
- ``LargeLogits``: a softmax over logits near 1000 (fp16 keeps them to 0.5, the softmax needs far less);
- ``LargeMeanNorm``: a LayerNorm over values with a mean of 100 and a spread of 0.05.

Planted networks of about 30, 130 and 310 candidate modules, and one real architecture (a stack of four
pre-LayerNorm transformer blocks built by hand with ``torch.nn``, two of them planted: a block whose attention
logits are large, one whose MLP activation leaves the fp16 range before a normalization). Every build is the
reference backend's fp16 build (``enable_autocast=True, autocast_low_precision_type=torch.float16``): on the
importable Torch-TensorRT release's own pipeline (its autocast, its partitioner; ``--site FOLDER`` puts one
first on the path), else trt-inline's emulation. The candidates are module paths, what the releases match
``autocast_excluded_nodes`` against. For each model it prints:

- whether each planted spot is in the set ``find_fix`` found (its module, or one inside it, is);
- the set's size against the minimal set: on the smallest model found exhaustively (every candidate left out
  of all the others once: those without which no set passes are in every set that passes; if they pass
  together they are the one minimal set), elsewhere the planted set (the modules each spot's design says need
  fp32, checked to pass) as the bound;
- its compiles against the bound 4·k·log2(n) + 10 for k spots among n candidates;
- beside it a prefix bisection in the style of Polygraphy's ``debug precision``: bisect on the length of the
  prefix of candidates kept in fp32 until the case passes; the prefix it reports and its compiles.

    python benchmarks/bench_fix.py [--smallest] [--site FOLDER]

``--smallest``: the smallest model alone, without the exhaustive minimum (what CI runs: no figure asserted).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

import trt_inline
from trt_inline.fixing.build_cases import held_cases
from trt_inline.fixing.builds import Compile, measure, rehearsed, settings_with
from trt_inline.fixing.candidates import candidates
from trt_inline.fixing.runner import with_default_tolerance

SETTINGS = {"enable_autocast": True, "autocast_low_precision_type": torch.float16}
WIDTH = 32
BATCH = 16


class Filler(nn.Module):
    """Within tolerance in fp16: a residual block that carries an error from before it on (neither damped nor
    grown), its values within a few units."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.proj(x)) * 0.1


class OverflowNorm(nn.Module):
    """``(1000 W x)^2`` reaches about 1e6 (fp32 by autocast's output threshold); the normalization that follows
    reads it in fp16, where it is inf."""

    needs = ("",)  # (its own operators: the activation, its mean and the division)

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = (self.proj(x) * 1000.0) ** 2
        scale = act.mean(-1, keepdim=True) + 1.0
        return x + act / scale * 0.1


class LongSum(nn.Module):
    """A sum over 4096 values of about 20 (about 8e4, fp32 by the threshold); the mean that follows reads it in
    fp16, where it is inf."""

    needs = ("",)

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4096)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = (self.up(x) + 20.0).sum(-1, keepdim=True)
        return x + (total / 4096.0 - 20.0) * 0.25


class LargeLogits(nn.Module):
    """Logits near 1000 with a spread of a few units: fp16 keeps them to 0.5, and the softmax reads them so."""

    needs = ("",)

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.proj(x) * 8.0 + 1000.0
        return x + self.mix(torch.softmax(logits, dim=-1)) * 8.0


class LargeMeanNorm(nn.Module):
    """Values of 100 ± 0.05, stored in fp16 (to 1/16) before a LayerNorm divides by their spread."""

    needs = ("", "norm")  # (the values, and the LayerNorm that reads them)

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = self.proj(x) * 0.05 + 100.0
        return x + self.norm(values) * 0.5


SPOTS: tuple[type[nn.Module], ...] = (OverflowNorm, LongSum, LargeLogits, LargeMeanNorm)


class Planted(nn.Module):
    """``blocks`` filler blocks with the spots placed evenly among them."""

    def __init__(self, blocks: int) -> None:
        super().__init__()
        every = max(1, blocks // (len(SPOTS) + 1))
        layers: list[nn.Module] = []
        spots = list(SPOTS)
        for index in range(blocks):
            layers.append(Filler())
            if (index + 1) % every == 0 and spots:
                layers.append(spots.pop(0)())
        layers += [spot() for spot in spots]
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(WIDTH, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


class Attention(nn.Module):
    """Multi-head self-attention; ``position_bias`` adds a learned bias to every logit (planted: near 1000)."""

    def __init__(self, width: int, heads: int, tokens: int, position_bias: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(width, width) for _ in range(4))
        self.bias = nn.Parameter(torch.randn(tokens, tokens) + position_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = (
            layer(x).view(batch, tokens, self.heads, width // self.heads).transpose(1, 2)
            for layer in (self.q, self.k, self.v)
        )
        logits = q @ k.transpose(-2, -1) / math.sqrt(width // self.heads) + self.bias
        mixed = (torch.softmax(logits, dim=-1) @ v).transpose(1, 2).reshape(batch, tokens, width)
        return self.out(mixed)


class MLP(nn.Module):
    """``fc2(act(fc1 x))``; ``squared`` (planted): a squared ReLU of 400 times its input, about 1e5, normalized
    by its mean before ``fc2``."""

    def __init__(self, width: int, squared: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.squared = squared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.squared:
            return self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        act = torch.relu(self.fc1(x) * 400.0) ** 2
        return self.fc2(act / (act.mean(-1, keepdim=True) + 1.0))


class Block(nn.Module):
    """A pre-LayerNorm transformer block."""

    def __init__(self, width: int, heads: int, tokens: int, position_bias: float = 0.0, squared: bool = False) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads, tokens, position_bias)
        self.mlp = MLP(width, squared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Four blocks; block 1's attention logits are large, block 3's MLP activation leaves the fp16 range."""

    def __init__(self, width: int = 32, heads: int = 4, tokens: int = 16) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            Block(width, heads, tokens), Block(width, heads, tokens, position_bias=1000.0),
            Block(width, heads, tokens), Block(width, heads, tokens, squared=True),
        )  # fmt: skip
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.blocks(x)))


# A planted spot: its module path, and the modules its design says need fp32 (paths inside it; "" itself).
Spot = tuple[str, tuple[str, ...]]


@dataclass
class Case:
    name: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    spots: list[Spot]
    exhaustive: bool = False


def planted(blocks: int, exhaustive: bool = False) -> Case:
    torch.manual_seed(0)
    model = Planted(blocks).eval()
    spots = [(f"layers.{index}", layer.needs) for index, layer in enumerate(model.layers) if hasattr(layer, "needs")]
    return Case(f"planted, {blocks} filler blocks", model, (torch.randn(BATCH, WIDTH),), spots, exhaustive)


def transformer() -> Case:
    torch.manual_seed(0)
    spots = [("blocks.1.attn", ("",)), ("blocks.3.mlp", ("",))]
    return Case("transformer, 4 blocks", Transformer().eval(), (torch.randn(2, 16, 32),), spots)


class Builds:
    """``passes(chosen)`` as find_fix asks it (the same compile, tolerance and seed), counted."""

    def __init__(self, case: Case, names: Sequence[str], build: Compile) -> None:
        self.case, self.names, self.build, self.compiles = case, names, build, 0
        self.held = held_cases(case.model, case.inputs, None)
        self.tolerance = with_default_tolerance(None)

    def __call__(self, chosen: Sequence[str]) -> bool:
        self.compiles += 1
        settings = settings_with(SETTINGS, "higher_precision", chosen)
        return measure(self.build, self.case.model, self.case.inputs, settings, self.held, self.tolerance, 0).passes


def prefix_bisection(builds: Builds) -> int:
    """Polygraphy's ``debug precision`` in outline: the shortest prefix of the candidates, in graph order, that
    passes kept in fp32, by bisection on its length (the empty prefix and the whole are checked first)."""
    names = builds.names
    if builds([]) or not builds(names):
        return 0
    low, high = 1, len(names)
    while low < high:
        middle = (low + high) // 2
        if builds(names[:middle]):
            high = middle
        else:
            low = middle + 1
    return low


def minimal_set(builds: Builds, found: Sequence[str]) -> tuple[int, str]:
    """The size of the smallest set that passes, found exhaustively: a candidate without which the others do not
    pass is in every set that passes; if those pass together they are the one minimal set, else supersets of
    them are tried by size up to the size of ``found``."""
    names = builds.names
    essential = [name for name in names if not builds([other for other in names if other != name])]
    if builds(essential):
        return len(essential), "exhaustive"
    rest = [name for name in names if name not in essential]
    for extra in range(1, len(found) - len(essential)):
        if extra > 2:
            return len(found), f"at least {len(essential)} (exhaustive up to +2)"
        for added in itertools.combinations(rest, extra):
            if builds([*essential, *added]):
                return len(essential) + extra, "exhaustive"
    return len(found), "exhaustive"


def inside(path: str, spot: str) -> bool:
    """Whether the module path ``path`` is the spot's module or one inside it."""
    return path == spot or path.startswith(spot + ".")


def planted_set(names: Sequence[str], spots: Sequence[Spot]) -> list[str]:
    """The candidates each spot's design says need fp32: its module's own, and the modules inside it it names."""
    wanted = {f"{path}.{inner}" if inner else path for path, needs in spots for inner in needs}
    return [name for name in names if name in wanted]


@dataclass
class Row:
    case: Case
    n: int  # candidates
    needed: list[bool]  # each spot: without its planted nodes, the others' do not pass
    found: list[bool]  # each spot: a node of its module is in the set
    report: trt_inline.FixReport
    seconds: float
    minimal: int
    how: str  # how the minimal set is known
    prefix: int  # the prefix bisection's nodes in fp32
    prefix_compiles: int

    @property
    def k(self) -> int:
        return len(self.case.spots)

    @property
    def bound(self) -> float:
        return 4 * self.k * math.log2(self.n) + 10


def run(case: Case) -> Row:
    with rehearsed(trt_inline.reference.compile, case.model, case.inputs) as build:
        table = build(case.model, case.inputs, **SETTINGS).trt_inline_lowered  # type: ignore[attr-defined]
        names = candidates(table, "higher_precision")
        started = time.perf_counter()
        report = trt_inline.find_fix(case.model, case.inputs, settings=SETTINGS)
        seconds = time.perf_counter() - started
        chosen = [node.name for node in report.nodes]
        found = [any(inside(name, path) for name in chosen) for path, _ in case.spots]
        builds = Builds(case, names, build)
        bound_set = planted_set(names, case.spots)
        bound_passes = builds(bound_set)
        needed = [not builds([name for name in bound_set if not inside(name, path)]) for path, _ in case.spots]
        if case.exhaustive:
            minimal, how = minimal_set(builds, sorted(chosen))
        else:
            minimal, how = len(bound_set), "planted set" + ("" if bound_passes else ", which does not pass")
        baseline = Builds(case, names, build)
        prefix = prefix_bisection(baseline)
    return Row(case, len(names), needed, found, report, seconds, minimal, how, prefix, baseline.compiles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smallest", action="store_true", help="the smallest model alone, no exhaustive minimum (CI)")
    parser.add_argument("--site", help="a folder holding a Torch-TensorRT release's package, put first on sys.path")
    args = parser.parse_args()
    if args.site:
        sys.path.insert(0, args.site)
    warnings.simplefilter("ignore")  # (torch's deprecation warnings, once per compile)
    cases = [planted(3, exhaustive=not args.smallest)]
    if not args.smallest:
        cases += [planted(33), planted(93), transformer()]
    rows = []
    probe = trt_inline.reference.compile(Filler(), (torch.randn(2, WIDTH),))
    print(f"torch {torch.__version__}; built on: {probe.trt_inline_pipeline}")
    for case in cases:
        row = run(case)
        rows.append(row)
        print(
            f"{case.name}: {row.n} candidates, {row.k} spots; find_fix: {row.report.outcome}, {row.seconds:.1f} s, "
            f"{row.report.compiles} compiles, minimal checked: {row.report.minimal}"
        )
        for (path, _), hit, needed in zip(case.spots, row.found, row.needed, strict=True):
            print(f"  spot {path}: {'in the set' if hit else 'MISSED'}{'' if needed else ' (not needed here)'}")
        for node in row.report.nodes:
            print(f"    {node.describe()}")
    print()
    print(
        "| model | candidates n | spots k (needed) | spots in the set | set size | minimal set | compiles | "
        "bound 4·k·log2(n)+10 | prefix bisection: nodes in fp32 | its compiles |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row.case.name} | {row.n} | {row.k} ({sum(row.needed)}) | {sum(row.found)} of {row.k} | "
            f"{len(row.report.nodes)} | {row.minimal} ({row.how}) | {row.report.compiles} | {row.bound:.0f} | "
            f"{row.prefix} | {row.prefix_compiles} |"
        )


if __name__ == "__main__":
    main()
