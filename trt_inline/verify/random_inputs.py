"""Random inputs within a program's declared dynamic ranges, reproducible with a seed.

Each size symbol of the program's inputs (``s0`` for a ``Dim("batch", min=1, max=8)``)
is drawn within its range (``ExportedProgram.range_constraints``): the first
draw takes every symbol at its minimum, the second at its maximum, later ones
uniformly in between. A derived size (``2*s0``) follows its symbol. A range
without an upper end is drawn up to twice the sample's size (or its minimum plus
16 without a sample). Values follow the sample inputs: floating point with their
mean and spread, integers within their minimum and maximum, booleans at random.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from trt_inline import compat
from trt_inline.errors import VerifyInputError

__all__ = [
    "Draw",
    "draw_at",
    "draw_inputs",
    "flat_sample",
    "range_bound",
    "shapes_at",
    "size_ranges",
    "user_input_values",
]

_UNBOUNDED_SPAN = 16
_NO_END = 1 << 62


@dataclass
class Draw:
    """One set of random inputs, and the value each size symbol was given.

    ``inputs``: one per program input, in the program's order; ``args`` / ``kwargs``: the same as a call passes
    them (the program's input spec: its keyword inputs by name, nested inputs nested).
    """

    inputs: list[torch.Tensor]
    symbols: dict[str, int]
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def shapes(self) -> list[list[int]]:
        return [list(t.shape) for t in self.inputs]


def user_input_values(program: ExportedProgram) -> list[torch.Tensor]:
    """The declared value (``meta["val"]``) of each user input of the program, in its order."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    values = []
    for name in program.graph_signature.user_inputs:
        val = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(val, torch.Tensor):
            raise VerifyInputError(f"random inputs: program input {name} is not a tensor (a {type(val).__name__})")
        values.append(val)
    return values


def size_ranges(
    program: ExportedProgram, sample: Sequence[torch.Tensor | None] | None = None
) -> dict[sympy.Symbol, tuple[int, int]]:
    """Each size symbol of the program's inputs and the (min, max) it is drawn in."""
    values = user_input_values(program)
    sample_sizes: dict[sympy.Symbol, int] = {}
    symbols: set[sympy.Symbol] = set()
    for index, val in enumerate(values):
        for dim, size in enumerate(val.shape):
            if isinstance(size, int):
                continue
            expr = size.node.expr
            symbols |= expr.free_symbols
            given = sample[index] if sample is not None and index < len(sample) else None
            if isinstance(expr, sympy.Symbol) and given is not None and dim < given.dim():
                sample_sizes[expr] = int(given.shape[dim])
    ranges: dict[sympy.Symbol, tuple[int, int]] = {}
    for symbol in sorted(symbols, key=str):
        bounds = program.range_constraints.get(symbol)
        lower = range_bound(bounds.lower if bounds is not None else None) or 0
        upper = range_bound(bounds.upper if bounds is not None else None)
        if upper is None:
            upper = max(lower, 2 * sample_sizes[symbol]) if symbol in sample_sizes else lower + _UNBOUNDED_SPAN
        ranges[symbol] = (lower, upper)
    return ranges


def range_bound(value: object) -> int | None:
    """A range's end as an int; None for no end (``int_oo``, or the ``sys.maxsize`` older releases write)."""
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return None if abs(number) >= _NO_END else number


def _values(
    like: torch.Tensor, shape: list[int], sample: torch.Tensor | None, generator: torch.Generator
) -> torch.Tensor:
    dtype = like.dtype
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) < 0.5
    if dtype.is_floating_point:
        mean, std = 0.0, 1.0
        if sample is not None and sample.numel() > 1 and sample.dtype.is_floating_point:
            mean, std = float(sample.double().mean()), float(sample.double().std()) or 1.0
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * std + mean).to(dtype)
    if dtype.is_complex:
        return torch.randn(shape, generator=generator, dtype=dtype)
    low, high = 0, 9
    if sample is not None and sample.numel() > 0:
        low, high = int(sample.min()), int(sample.max())
    return torch.randint(low, high + 1, shape, generator=generator).to(dtype)


def _call_form(program: ExportedProgram, flat: list[torch.Tensor]) -> tuple[list[Any], dict[str, Any]]:
    """One value per program input as a call passes them: by the program's input spec."""
    in_spec = program.call_spec.in_spec
    if in_spec is None:
        return list(flat), {}
    args, kwargs = pytree.tree_unflatten(flat, in_spec)
    return list(args), dict(kwargs)


def _flat_sample(program: ExportedProgram, sample: tuple[Sequence[Any], dict[str, Any]]) -> list[torch.Tensor | None]:
    """The sample call's inputs, one per program input (the sizes and value ranges drawn around)."""
    in_spec = program.call_spec.in_spec
    try:
        leaves = compat.flatten_by_spec((list(sample[0]), dict(sample[1])), in_spec) if in_spec is not None else []
    except Exception:  # (inputs of another structure: the draw goes by the declarations alone)
        leaves = []
    return [leaf if isinstance(leaf, torch.Tensor) else None for leaf in leaves]


def flat_sample(
    program: ExportedProgram,
    sample: tuple[Sequence[Any], dict[str, Any]] | Sequence[torch.Tensor] | None,
) -> list[torch.Tensor | None] | None:
    """A sample call's inputs, one per program input: from its ``(args, kwargs)``, or one tensor per program input;
    None without a sample."""
    if isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[1], dict):
        return _flat_sample(program, (sample[0], sample[1]))
    if sample is not None:
        return [value if isinstance(value, torch.Tensor) else None for value in sample]
    return None


def shapes_at(program: ExportedProgram, chosen: dict[sympy.Symbol, int]) -> list[list[int]]:
    """Each program input's shape with every size symbol at the value ``chosen`` gives it (a derived size follows
    its symbol)."""
    return [
        [size if isinstance(size, int) else int(size.node.expr.subs(chosen)) for size in val.shape]
        for val in user_input_values(program)
    ]


def draw_at(
    program: ExportedProgram,
    chosen: dict[sympy.Symbol, int],
    generator: torch.Generator,
    sample: list[torch.Tensor | None] | None,
) -> Draw:
    """One set of inputs with every size symbol at the value ``chosen`` gives it, the values drawn from ``generator``
    around the sample's (:func:`flat_sample`)."""
    inputs = []
    for index, (val, shape) in enumerate(zip(user_input_values(program), shapes_at(program, chosen), strict=True)):
        reference = sample[index] if sample is not None and index < len(sample) else None
        inputs.append(_values(val, shape, reference, generator))
    args, kwargs = _call_form(program, inputs)
    return Draw(inputs, {str(s): v for s, v in chosen.items()}, args, kwargs)


def draw_inputs(
    program: ExportedProgram,
    count: int,
    seed: int,
    sample: tuple[Sequence[Any], dict[str, Any]] | Sequence[torch.Tensor] | None = None,
) -> list[Draw]:
    """``count`` sets of inputs within the program's declared ranges, around a sample call's inputs where given:
    its ``(args, kwargs)``, or one tensor per program input."""
    if count < 1:
        raise VerifyInputError(f"random inputs: the number of draws must be at least 1, got {count}")
    flat = flat_sample(program, sample)
    ranges = size_ranges(program, flat)
    generator = torch.Generator().manual_seed(seed)
    draws = []
    for iteration in range(count):
        chosen: dict[sympy.Symbol, int] = {}
        for symbol, (lower, upper) in ranges.items():
            if iteration == 0:
                chosen[symbol] = lower
            elif iteration == 1:
                chosen[symbol] = upper
            else:
                chosen[symbol] = int(torch.randint(lower, upper + 1, (1,), generator=generator))
        draws.append(draw_at(program, chosen, generator, flat))
    return draws
