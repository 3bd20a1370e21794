"""Scalars at engine boundaries: what counts as one, the dtype it travels in, and both conversions.

An engine op takes and returns ``Tensor[]`` (TensorRT's does, and the reference
engine's copies it), so a scalar that crosses an engine boundary (a SymInt,
SymFloat or SymBool under dynamic shapes, a Python number otherwise) travels
as a 0-d tensor::

    producer ── scalar ──> to_tensor (0-d, dtype_of(scalar)) ──> engine op
    engine op ──> 0-d tensor ──> to_scalar (item()) ── scalar ──> consumer

The passes write both conversions into the flat graph
(:func:`trt_inline.inlining.passes.inline_trt_modules`), the reference engine performs
them at run time, and an AOTInductor package, which returns every output as a
tensor, applies :func:`to_scalar` to the outputs its recorded :func:`kind_of`
says are scalars. This module is the one place that says how.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["SCALAR_TYPES", "dtype_of", "is_scalar", "kind_of", "kinds_of", "to_scalar", "to_tensor"]

SCALAR_TYPES = (torch.SymBool, torch.SymInt, torch.SymFloat, bool, int, float)


def is_scalar(value: Any) -> bool:
    """A Python or symbolic scalar (what ``meta["val"]`` holds for a SymInt, SymFloat or SymBool node)."""
    return isinstance(value, SCALAR_TYPES)


def dtype_of(value: Any) -> torch.dtype:
    """The dtype a scalar travels in across an engine boundary: bool, int64 or float64."""
    if isinstance(value, (torch.SymBool, bool)):  # bool first: it is an int subclass
        return torch.bool
    if isinstance(value, (torch.SymInt, int)):
        return torch.int64
    return torch.float64


def to_tensor(value: Any, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A scalar as the 0-d tensor an engine takes (a tensor is returned as it is)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.scalar_tensor(value, dtype=dtype or dtype_of(value), device=device)


def to_scalar(tensor: torch.Tensor) -> Any:
    """The Python (or, while tracing, symbolic) scalar a 0-d engine output stands for."""
    return tensor.item()


# Output kinds, as an AOTInductor package records them: a signature argument is named by its class.
_KIND_BY_ARGUMENT = {"SymBoolArgument": "bool", "SymIntArgument": "int", "SymFloatArgument": "float"}


def kind_of(value: Any) -> str:
    """``"bool"``, ``"int"``, ``"float"`` or ``"tensor"``: a value, or a graph signature's output argument."""
    if is_scalar(value):
        return {torch.bool: "bool", torch.int64: "int", torch.float64: "float"}[dtype_of(value)]
    return _KIND_BY_ARGUMENT.get(type(value).__name__, "tensor")


def kinds_of(values: Sequence[Any]) -> list[str]:
    """:func:`kind_of` of each value."""
    return [kind_of(value) for value in values]
