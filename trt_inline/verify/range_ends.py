"""Runs at the ends of a program's dynamic ranges: every size at its declared minimum, at its maximum, and at the
optimization point where the file records one.

An engine is built for a range of sizes (TensorRT: an optimization profile's min, opt and max for each dynamic
dimension), and a dynamic program is most often wrong at the ends of its ranges, where the reference inputs (a size
in the middle) never go. :func:`plan` chooses the sizes and draws the inputs; ``verify``
(:mod:`trt_inline.verify.verifier`) and ``diff`` (:mod:`trt_inline.verify.diff`) run them.

What a file records, and where:

* each size symbol's range: ``ExportedProgram.range_constraints`` (``s0: VR[1, 64]``). A range with no upper end
  (``int_oo``, or the ``sys.maxsize`` older releases write) has no maximum to run at: it is capped as
  :func:`~trt_inline.verify.random_inputs.size_ranges` caps it (twice the reference inputs' size, else its minimum
  plus 16), and a note says so;
* the optimization point: the size the program was traced at, the hint each symbol carries on its inputs'
  ``meta["val"]``. Torch-TensorRT takes it as ``opt`` when it builds engines from an exported program's inputs, and
  a program compiled from ``Input(min_shape=, opt_shape=, max_shape=)`` is traced at ``opt_shape``. A TensorRT
  plan's own profile is inside the plan (native code) and is not read; nothing else in a file records one;
* a derived size (``2*s0``) follows its symbol, and inputs sharing a symbol share its value: each set is made by
  :func:`~trt_inline.verify.random_inputs.draw_at`, its values drawn as random inputs' are (seeded, around the
  reference inputs).

The cost: each end is one more run of the program (in each of its run modes), at most three. By default
(``"auto"``) an end runs when its inputs take at most :data:`GROWTH` times the bytes of the reference inputs, or at
most :data:`SMALL_BYTES`; a larger one is not run, and a note says so (``"all"`` runs it). An end at the reference
inputs' own sizes is the run already compared, and is not run again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram

from trt_inline.errors import VerifyInputError
from trt_inline.formats import format_size
from trt_inline.verify.random_inputs import (
    Draw,
    draw_at,
    flat_sample,
    range_bound,
    shapes_at,
    size_ranges,
    user_input_values,
)
from trt_inline.verify.report import RANGE_END_NAMES, RangeEnd

__all__ = ["GROWTH", "MODES", "SMALL_BYTES", "End", "Plan", "is_dynamic", "modes_checked", "plan"]

# What ``range_ends`` may say: the ends that fit the cost rule, every end, none.
MODES = ("auto", "all", "off")
# The cost rule of "auto": an end whose inputs take more than GROWTH times the reference inputs' bytes, and more
# than SMALL_BYTES, is not run (its run would be that much larger than the run it accompanies).
GROWTH = 8
SMALL_BYTES = 4 << 20
_MINIMUM, _MAXIMUM, _OPT = RANGE_END_NAMES
# How many places a note names for the symbols (a language model's inputs share a few symbols many times).
_PLACES_SHOWN = 6


def modes_checked(mode: object) -> str:
    """``mode`` if it is one of :data:`MODES`."""
    if mode not in MODES:
        raise VerifyInputError(f"range_ends is one of {', '.join(MODES)}, got {mode!r}")
    return str(mode)


@dataclass(frozen=True)
class End:
    """One set of inputs at an end of the ranges: which end, and the inputs (with each symbol's value)."""

    name: RangeEnd
    draw: Draw

    @property
    def assignment(self) -> str:
        """``s0=64, s1=8``."""
        return _assignment(self.draw.symbols)

    @property
    def label(self) -> str:
        """``maximum of its dynamic ranges (s0=64)``."""
        return f"{self.name} of its dynamic ranges ({self.assignment})"

    @property
    def where(self) -> str:
        """``maximum of its dynamic ranges (s0=64; sizes [[64, 4]])``: the label and the inputs' sizes."""
        return f"{self.name} of its dynamic ranges ({self.assignment}; sizes {self.draw.shapes()})"


@dataclass
class Plan:
    """The ends to run, and what a report says of the others (not run, capped)."""

    ends: list[End] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    places: str = ""  # where each symbol is: "s0 is x.shape[0]; y.shape[0] is 2*s0"

    def summary(self, how: str, ran: Sequence[End] | None = None) -> str:
        """The note of the runs made (``ran``, default every end planned): which sizes ran, where the symbols are,
        and ``how`` they were checked."""
        sizes = ", ".join(f"the {end.name} {end.assignment}" for end in (self.ends if ran is None else ran))
        return f"ran at the ends of the dynamic ranges ({self.places}): {sizes}; {how}"


def _assignment(symbols: dict[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in symbols.items())


def plan(
    program: ExportedProgram,
    sample: tuple[Sequence[Any], dict[str, Any]] | Sequence[torch.Tensor] | None,
    seed: int,
    mode: str,
) -> Plan:
    """The ends of ``program``'s dynamic ranges to run beside a run on ``sample`` (its ``(args, kwargs)``): every
    symbol at its minimum, at its maximum, at the optimization point the file records, each once, but the sample's
    own sizes, and by ``mode`` (:data:`MODES`). A program without dynamic sizes has none, and nothing to say."""
    result = Plan()
    if modes_checked(mode) == "off":
        return result
    flat = flat_sample(program, sample)
    ranges = size_ranges(program, flat)
    if not ranges:
        return result
    result.places = _places(program)
    given = _sample_symbols(program, flat)
    for symbol, (_, upper) in ranges.items():
        bounds = program.range_constraints.get(symbol)
        if range_bound(bounds.upper if bounds is not None else None) is None:
            why = "twice the reference inputs' size" if symbol in given else "its minimum plus 16"
            result.notes.append(f"{symbol} has no upper end in the file: its maximum was taken as {upper} ({why})")
    candidates = [(_MINIMUM, {s: low for s, (low, _) in ranges.items()}),
                  (_MAXIMUM, {s: high for s, (_, high) in ranges.items()})]  # fmt: skip
    hints = _hints(program)
    opt = {s: hints[s] for s, (low, high) in ranges.items() if s in hints and low <= hints[s] <= high}
    if len(opt) == len(ranges):
        candidates.append((_OPT, opt))
    else:
        missing = ", ".join(str(s) for s in ranges if s not in opt)
        result.notes.append(f"not run at an optimization point: the file records none within the range of {missing}")
    baseline = sum(t.numel() * t.element_size() for t in flat or () if t is not None)
    budget = max(GROWTH * baseline, SMALL_BYTES)
    generator = torch.Generator().manual_seed(seed)
    made: list[dict[sympy.Symbol, int]] = []
    for name, chosen in candidates:
        if chosen in made:  # (an end that is another: min == max, opt at an end)
            continue
        made.append(chosen)
        assignment = _assignment({str(s): v for s, v in chosen.items()})
        if chosen == given:
            result.notes.append(f"the {name} ({assignment}) is the size of the reference inputs: compared in that run")
            continue
        size = _input_bytes(program, chosen)
        if mode == "auto" and size > budget:
            result.notes.append(
                f"not run at the {name} ({assignment}): its inputs would take {format_size(size)}, more than "
                f"{GROWTH} times the reference inputs' {format_size(baseline)} and more than "
                f"{format_size(SMALL_BYTES)}; range_ends='all' runs it"
            )
            continue
        try:
            draw = draw_at(program, chosen, generator, flat)
        except (RuntimeError, MemoryError) as exc:  # (a declared maximum too large to allocate here)
            result.notes.append(f"not run at the {name} ({assignment}): its inputs could not be made "
                                f"({type(exc).__name__}, {format_size(size)})")  # fmt: skip
            continue
        result.ends.append(End(name, draw))
    return result


def _input_bytes(program: ExportedProgram, chosen: dict[sympy.Symbol, int]) -> int:
    """What the inputs with every symbol at ``chosen`` take, computed from the sizes (nothing allocated)."""
    values = user_input_values(program)
    shapes = shapes_at(program, chosen)
    return sum(math.prod(shape) * val.element_size() for val, shape in zip(values, shapes, strict=True))


def _symbol_dims(program: ExportedProgram) -> list[tuple[int, int, Any]]:
    """(input, dimension, size) of every size of the program's inputs that is not a number (a ``SymInt``)."""
    return [
        (index, dim, size)
        for index, val in enumerate(user_input_values(program))
        for dim, size in enumerate(val.shape)
        if not isinstance(size, int)
    ]


def _sample_symbols(program: ExportedProgram, flat: list[torch.Tensor | None] | None) -> dict[sympy.Symbol, int]:
    """Each symbol's value in the sample's sizes, read where an input's size is the symbol itself."""
    given: dict[sympy.Symbol, int] = {}
    for index, dim, size in _symbol_dims(program):
        tensor = flat[index] if flat is not None and index < len(flat) else None
        expr = size.node.expr
        if isinstance(expr, sympy.Symbol) and tensor is not None and dim < tensor.dim():
            given.setdefault(expr, int(tensor.shape[dim]))
    return given


def _hints(program: ExportedProgram) -> dict[sympy.Symbol, int]:
    """The size each symbol was traced at (its hint), read where an input's size is the symbol itself."""
    hints: dict[sympy.Symbol, int] = {}
    for _, _, size in _symbol_dims(program):
        expr = size.node.expr
        try:
            hint = size.node.hint
            if isinstance(expr, sympy.Symbol) and hint is not None:
                hints.setdefault(expr, int(hint))
        except (AttributeError, TypeError, ValueError):
            continue  # (a torch whose sizes carry no hint: no optimization point)
    return hints


def _places(program: ExportedProgram) -> str:
    """Where each symbol is among the inputs: the first size that is the symbol itself, every derived size."""
    names = list(program.graph_signature.user_inputs)
    places: list[str] = []
    seen: set[sympy.Symbol] = set()
    for index, dim, size in _symbol_dims(program):
        expr = size.node.expr
        where = f"{names[index] if index < len(names) else f'input {index}'}.shape[{dim}]"
        if isinstance(expr, sympy.Symbol):
            if expr not in seen:
                seen.add(expr)
                places.append(f"{expr} is {where}")
        else:
            places.append(f"{where} is {expr}")
    shown = "; ".join(places[:_PLACES_SHOWN])
    return shown + (f"; {len(places) - _PLACES_SHOWN} more" if len(places) > _PLACES_SHOWN else "")


def is_dynamic(program: ExportedProgram) -> bool:
    """Whether any input of ``program`` has a size that is not a number."""
    return bool(_symbol_dims(program))
