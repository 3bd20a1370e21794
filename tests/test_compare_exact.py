"""Comparisons that never convert a value into one that compares equal when it does not, in every dtype.

``compare_output`` is the one comparison behind outputs, engine boundaries, random runs
and ``diff``. Property tests over every dtype this torch has: two values that differ are
never reported equal (at zero tolerance: not ok, a nonzero max abs diff, the first
difference named), and a value is always equal to itself.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trt_inline.verify.compare import compare_output

_NAMES = (
    "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "complex32", "complex64", "complex128", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64", "bool",
)  # fmt: skip
DTYPES = [getattr(torch, name) for name in _NAMES if isinstance(getattr(torch, name, None), torch.dtype)]


def _from_bytes(data: bytes, dtype: torch.dtype) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if dtype == torch.bool:
        return (raw & 1).bool()
    return raw.view(dtype).clone()


def _differ(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two one-element tensors hold different values (NaN is NaN; -0.0 is 0.0)."""
    if a.is_floating_point() or a.is_complex():
        x, y = a.to(torch.complex128).item(), b.to(torch.complex128).item()
        same_nan = (math.isnan(x.real) or math.isnan(x.imag)) and (math.isnan(y.real) or math.isnan(y.imag))
        return not same_nan and x != y
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(a.view(bits) != b.view(bits))


@settings(max_examples=400, deadline=None)
@given(dtype=st.sampled_from(DTYPES), data=st.data())
def test_values_that_differ_are_never_reported_equal(dtype: torch.dtype, data: st.DataObject) -> None:
    size = torch.empty(0, dtype=dtype).element_size()
    count = data.draw(st.integers(1, 8))
    expected = _from_bytes(data.draw(st.binary(min_size=size * count, max_size=size * count)), dtype)
    actual = expected.clone()
    position = data.draw(st.integers(0, count - 1))
    replacement = _from_bytes(data.draw(st.binary(min_size=size, max_size=size)), dtype)
    actual[position] = replacement[0]
    same = compare_output(0, expected.clone(), expected, 0.0, 0.0)
    assert same.ok and same.problem is None, same
    if not _differ(actual[position : position + 1], expected[position : position + 1]):
        return
    found = compare_output(0, actual, expected, 0.0, 0.0)
    assert not found.ok, (dtype, actual, expected, found)
    assert found.problem is not None
    assert found.max_abs_diff != 0.0 or found.nan_count or found.inf_count or "NaN or Inf" in found.problem
    assert f"the first at [{position}]" in found.problem, found.problem


def test_a_complex_value_differing_only_in_its_imaginary_part() -> None:
    expected = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64)
    actual = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    found = compare_output(0, actual, expected, None, None)
    assert not found.ok and found.max_abs_diff == 8.0, found
    assert "real part 0, imaginary part 8" in str(found.problem), found.problem


@pytest.mark.parametrize(
    ("dtype", "got", "want"),
    [
        (torch.int64, 2**53 + 1, 2**53),
        (torch.int64, -(2**63), 2**63 - 1),
        (torch.uint64, 2**64 - 1, 2**64 - 2) if hasattr(torch, "uint64") else (torch.int64, 1, 0),
    ],
)
def test_integers_past_float64_precision_differ(dtype: torch.dtype, got: int, want: int) -> None:
    """float64 holds integers exactly up to 2**53 only: 2**53 + 1 and 2**53 are one float64."""
    bits = torch.int64
    as_tensor = lambda value: torch.tensor([value - 2**64 if value >= 2**63 else value], dtype=bits).view(dtype)  # noqa: E731
    found = compare_output(0, as_tensor(got), as_tensor(want), None, None)
    assert not found.ok and found.max_abs_diff >= 1.0, found
    assert "1 of 1 values differ" in str(found.problem), found.problem


def test_quantized_values_are_compared_by_scale_and_representation() -> None:
    values = torch.tensor([0.5, -1.0, 2.0])
    expected = torch.quantize_per_tensor(values, 0.1, 3, torch.qint8)
    assert compare_output(0, expected.clone(), expected, None, None).ok
    other_scale = torch.quantize_per_tensor(values, 0.2, 3, torch.qint8)
    found = compare_output(0, other_scale, expected, None, None)
    assert not found.ok and "scale 0.2 vs 0.1" in str(found.problem), found.problem
    moved = torch.quantize_per_tensor(torch.tensor([0.5, -1.0, 2.1]), 0.1, 3, torch.qint8)
    found = compare_output(0, moved, expected, None, None)
    assert not found.ok and "the first at [2]" in str(found.problem), found.problem
