"""Outputs that look like outputs and are garbage: checks that need no reference.

An engine built for another GPU, a refit that left its weights empty, an
execution context whose collectives have no communicator: each returns tensors
of the declared shape and dtype, with no exception, and values that mean
nothing. Without reference outputs verify cannot call them wrong, but some
garbage has a shape of its own::

    run 0:  x0 ──► engine 0 ──► [0, 0, 0, …]        all zeros (floating)
    run 1:  x1 ──► engine 0 ──► [nan, …]            NaN from inputs without NaN
    run 2:  x2 ──► engine 0 ──► [c, c, c, …]        the same in every run, its inputs differing
            [[a], [b], [c]] ──► engine 0 ──► [[r], [r], [r]]
                                             every row (sample) the same, its input rows differing

:class:`Sightings` keeps, for one run, what each engine output and program
output looked like (a fingerprint and four flags, never the values), and what
its inputs looked like; :func:`garbage_warnings` reads every run's sightings.
Only floating values are judged (an integer output such as a shape or an
index is often legitimately constant), only values that depend on the
program's inputs, and never where the inputs explain it (zero inputs, NaN in
the inputs, inputs that do not differ).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Sighting", "Sightings", "garbage_warnings", "sighted", "sights"]

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# Odd 64-bit multipliers for the two halves of a fingerprint (any fixed odd constants will do).
_WEIGHT = 0x5851F42D4C957F2D
_SALT = 0x14057B7EF767814F


_WEIGHED = 1 << 20
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _weights(count: int, start: int, device: torch.device) -> torch.Tensor:
    """Position weights for elements ``start`` to ``start + count`` (below :data:`_WEIGHED`), kept per device."""
    weights = _WEIGHTS.get(device)
    if weights is None:
        weights = torch.arange(1, _WEIGHED + 1, dtype=torch.int64, device=device) * _WEIGHT + _SALT
        _WEIGHTS[device] = weights
    return weights[start : start + count]


@dataclass(frozen=True)
class Sighting:
    """What one value looked like in one run."""

    fingerprint: tuple[Any, ...]  # dtype, shape and two position-weighted sums of its bits
    floating: bool
    zero: bool  # every element exactly 0 (and there is one)
    nonfinite: bool  # a NaN (an infinity is a value: a mask of -inf before a softmax)
    rows: int | None  # the leading dimension where it is at least 2 (a batch), else None
    rows_same: bool  # every row equal to the first (only where ``rows``)
    single: bool  # one element


def _bits(flat: torch.Tensor) -> torch.Tensor:
    """A flat, contiguous piece of a value as integers of its width (complex: its real and imaginary parts)."""
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return flat.view(_INT_OF_WIDTH[flat.element_size()])


# Elements read per pass: every check goes through a value a piece at a time, so what it costs beside the
# value is bounded (a few times this many bytes), not a multiple of the value (logits, caches).
_PIECE = 1 << 22


def sighted(value: torch.Tensor) -> Sighting | None:
    """``value``'s :class:`Sighting`; None for a tensor there is nothing to say of (sparse, nested, empty, or of a
    dtype torch has no kernels to look at: bits, sub-byte integers)."""
    if value.layout != torch.strided or value.numel() == 0 or value.element_size() not in (1, 2, 4, 8, 16):
        return None
    try:
        return _sighted(value)
    except (RuntimeError, NotImplementedError, TypeError):
        return None  # (nothing said of it is better than a run that fails for the looking)


def _sighted(value: torch.Tensor) -> Sighting:
    value = value.detach()
    if value.is_quantized:
        value = value.int_repr()
    floating = value.is_floating_point() or value.is_complex()
    flat = value.reshape(-1)  # (a view where the value is contiguous, as engine outputs are)
    # Two sums of its bits: one of every element, one weighted by position over the first _WEIGHED (a
    # permutation changes it). Integer overflow wraps.
    plain = weighed = nonzero = 0
    finite = True
    for start in range(0, flat.numel(), _PIECE):
        piece = flat[start : start + _PIECE]
        bits = _bits(piece)
        plain += int(bits.sum(dtype=torch.int64))
        if start < _WEIGHED:
            head = bits[: _WEIGHED - start].to(torch.int64)
            weighed += int((head * _weights(head.numel(), start, head.device)).sum())
        if floating:
            # (float8 has no kernels for these: widened exactly, a piece at a time)
            piece = piece.float() if piece.element_size() == 1 else piece
            nonzero += int(piece.count_nonzero())
            finite = finite and not bool(piece.isnan().any())
    fingerprint = (value.dtype, tuple(value.shape), weighed % (1 << 64), plain % (1 << 64))
    rows = int(value.shape[0]) if value.dim() >= 1 and value.shape[0] >= 2 else None
    return Sighting(
        fingerprint, floating, floating and nonzero == 0, not finite, rows, rows is not None and _rows_same(value),
        value.numel() == 1,
    )  # fmt: skip


def _rows_same(value: torch.Tensor) -> bool:
    """Whether every row of ``value`` equals its first, compared a block of rows at a time."""
    per_row = max(1, value[0].numel())
    block = max(1, _PIECE // per_row)
    first = value[:1]
    for start in range(1, value.shape[0], block):
        if not bool((value[start : start + block] == first).all()):
            return False
    return True


@dataclass
class Site:
    """One engine's outputs, or the program's, in one run: each value's sighting and its inputs'."""

    outputs: list[Sighting | None]
    inputs: list[Sighting | None]


@dataclass
class Sightings:
    """One run's sites, by name (``engine 1 (_run_on_acc_3)``, ``the program``)."""

    run: str  # "on the reference inputs", "on random inputs 2"
    sites: dict[str, Site] = field(default_factory=dict)

    def see(self, name: str, inputs: list[Sighting | None], outputs: list[Sighting | None]) -> None:
        self.sites[name] = Site(outputs, inputs)


def sights(values: Sequence[Any]) -> list[Sighting | None]:
    """Each value's :class:`Sighting` (None for anything but a tensor)."""
    return [sighted(v) if isinstance(v, torch.Tensor) else None for v in values]


def _value_name(site: str, index: int) -> str:
    return f"output {index}" if site == "the program" else f"{site} out[{index}]"


def garbage_warnings(runs: Sequence[Sightings]) -> list[str]:
    """What the runs' sightings show, one warning per value and kind, in the order the values ran."""
    warnings: list[str] = []
    names = list(dict.fromkeys(name for run in runs for name in run.sites))
    for name in names:
        appearances = [(run.run, run.sites[name]) for run in runs if name in run.sites]
        count = max(len(site.outputs) for _, site in appearances)
        for index in range(count):
            warnings += _value_warnings(_value_name(name, index), index, appearances)
    return warnings


def _value_warnings(name: str, index: int, appearances: list[tuple[str, Site]]) -> list[str]:
    found: dict[str, str] = {}
    for run, site in appearances:
        seen = site.outputs[index] if index < len(site.outputs) else None
        if seen is None or not seen.floating:
            continue
        inputs = [s for s in site.inputs if s is not None]
        # (One value that is 0, or stays put, is no sign: a loss of a value against itself is.)
        if seen.zero and not seen.single and "zero" not in found and any(not s.zero for s in inputs):
            found["zero"] = f"{name} is all zeros {run}, from inputs that are not"
        if seen.nonfinite and "nonfinite" not in found and not any(s.nonfinite for s in inputs):
            found["nonfinite"] = f"{name} has NaN {run}, from inputs without NaN"
        batch = seen.rows
        if (
            seen.rows_same
            and not seen.zero
            and "rows" not in found
            and any(s.rows == batch and not s.rows_same for s in inputs)
        ):
            found["rows"] = (
                f"{name} has the same values in each of its {batch} rows {run}, where the rows of its inputs differ"
            )
    sightings = [(site.outputs[index] if index < len(site.outputs) else None, site) for _, site in appearances]
    if len(sightings) >= 2 and all(s is not None and s.floating and not s.single for s, _ in sightings):
        first = sightings[0][0]
        assert first is not None
        same_output = all(s is not None and s.fingerprint == first.fingerprint for s, _ in sightings)
        input_prints = {tuple(i.fingerprint if i is not None else None for i in site.inputs) for _, site in sightings}
        if same_output and len(input_prints) > 1:
            found["constant"] = f"{name} is the same in all {len(sightings)} runs, where its inputs differ"
    return list(found.values())
