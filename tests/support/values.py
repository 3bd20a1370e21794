"""Values compared as the tests compare them: outputs as a list, their largest difference, every dtype torch has, raw
bytes as a tensor, and whether two tensors differ bit for bit."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


def as_list(outputs: Any) -> list[torch.Tensor]:
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def max_abs_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    assert len(a) == len(b), f"{len(a)} outputs vs {len(b)}"
    diffs = []
    for x, y in zip(a, b, strict=False):
        assert x.shape == y.shape and x.dtype == y.dtype, f"{x.shape}/{x.dtype} vs {y.shape}/{y.dtype}"
        diffs.append((x.double() - y.double()).abs().max().item() if x.numel() else 0.0)
    return max(diffs)


_NAMES = (
    "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "complex32", "complex64", "complex128", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64", "bool",
)  # fmt: skip


DTYPES = [getattr(torch, name) for name in _NAMES if isinstance(getattr(torch, name, None), torch.dtype)]


def from_bytes(data: bytes, dtype: torch.dtype) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if dtype == torch.bool:
        return (raw & 1).bool()
    return raw.view(dtype).clone()


def differ(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two one-element tensors hold different values (NaN is NaN; -0.0 is 0.0); a complex value part by
    part (a NaN real part hides no difference in the imaginary one)."""
    if a.is_floating_point() or a.is_complex():
        x, y = a.to(torch.complex128).item(), b.to(torch.complex128).item()
        pairs = ((x.real, y.real), (x.imag, y.imag))
        return any(not (math.isnan(p) and math.isnan(q)) and p != q for p, q in pairs)
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(a.view(bits) != b.view(bits))
