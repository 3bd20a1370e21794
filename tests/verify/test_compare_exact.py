"""Comparisons that never convert a value into one that compares equal when it does not, in every dtype.

``compare_output`` is the one comparison behind outputs, engine boundaries, random runs
and ``diff``. Property tests over every dtype this torch has: two values that differ are
never reported equal (at zero tolerance: not ok, a nonzero max abs diff, the first
difference named), and a value is always equal to itself.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.values import DTYPES, differ, from_bytes

from trt_inline.verify.compare import compare_output


@settings(max_examples=400, deadline=None)
@given(dtype=st.sampled_from(DTYPES), data=st.data())
def test_values_that_differ_are_never_reported_equal(dtype: torch.dtype, data: st.DataObject) -> None:
    size = torch.empty(0, dtype=dtype).element_size()
    count = data.draw(st.integers(1, 8))
    expected = from_bytes(data.draw(st.binary(min_size=size * count, max_size=size * count)), dtype)
    actual = expected.clone()
    position = data.draw(st.integers(0, count - 1))
    replacement = from_bytes(data.draw(st.binary(min_size=size, max_size=size)), dtype)
    actual[position] = replacement[0]
    same = compare_output(0, expected.clone(), expected, 0.0, 0.0)
    assert same.ok and same.problem is None, same
    if not differ(actual[position : position + 1], expected[position : position + 1]):
        return
    found = compare_output(0, actual, expected, 0.0, 0.0)
    assert not found.ok, (dtype, actual, expected, found)
    assert found.problem is not None
    assert found.max_abs_diff != 0.0 or found.nan_count or found.inf_count or "NaN or Inf" in found.problem
    assert f"the first at [{position}" in found.problem, found.problem  # (a complex value: then its part)


def test_a_complex_value_differing_only_in_its_imaginary_part() -> None:
    expected = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64)
    actual = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    found = compare_output(0, actual, expected, None, None)
    assert not found.ok and found.max_abs_diff == 8.0, found
    assert "real part 0, imaginary part 8" in str(found.problem), found.problem


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.complex32], ids=str)
def test_a_nan_in_one_part_hides_no_difference_in_the_other(dtype: torch.dtype) -> None:
    """A NaN matches a NaN only in the same part at the same place: an imaginary part changed where the real part
    is NaN is a difference (held to the tolerance like any other: at zero, any change fails; a NaN where the
    reference's part is a number fails at every tolerance); the same value again is not."""
    nan = float("nan")
    expected = torch.tensor([complex(nan, 1.0), complex(2.0, nan), 3 + 4j]).to(dtype)
    actual = expected.clone()
    actual[0] = complex(nan, 7.0)
    found = compare_output(0, actual, expected, 0.0, 0.0)
    assert not found.ok and found.max_abs_diff == 6.0 and "imaginary part 6" in str(found.problem), found
    assert "the first at [0, 1]: 7.0 vs 1.0" in str(found.problem), found.problem
    for changed, position in ((complex(nan, nan), 0), (complex(nan, nan), 1), (complex(nan, 4.0), 2)):
        actual = expected.clone()
        actual[position] = changed
        found = compare_output(0, actual, expected, 1e9, 1e9)
        assert not found.ok, (changed, found)
    same = compare_output(0, expected.clone(), expected, 0.0, 0.0)
    assert same.ok and same.max_abs_diff == 0.0 and same.max_rel_diff == 0.0, same


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


class _Complex(torch.nn.Module):
    """A complex output whose real part is NaN where ``x`` is positive; ``shift`` changes its imaginary part there
    only (what a caller reading ``.imag`` gets)."""

    def __init__(self, shift: float = 0.0) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        real = torch.where(x > 0, torch.full_like(x, float("nan")), x)
        return torch.complex(real, x * 2 + torch.where(x > 0, self.shift, 0.0))


def test_a_file_changing_the_imaginary_part_behind_a_nan_fails_verify_and_diff(tmp_path: Any) -> None:
    """The crafted pair, through the command line: ``verify`` against the honest outputs (``--expected``, zero
    tolerance) and ``diff`` of the two files both exit 1 (verify naming the imaginary part); the honest file
    against its own outputs passes."""
    from support.commands import cli

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    honest, shifted = tmp_path / "honest.pt2", tmp_path / "shifted.pt2"
    torch.export.save(torch.export.export(_Complex(), (x,)), honest)
    torch.export.save(torch.export.export(_Complex(5.0), (x,)), shifted)
    assert bool(_Complex()(x).real.isnan().any())  # (the structure: NaN real parts, where the change hides)
    torch.save([x], tmp_path / "inputs.pt")
    torch.save([_Complex()(x)], tmp_path / "expected.pt")
    exact = ("--atol", "0", "--rtol", "0")
    given = ("--inputs", str(tmp_path / "inputs.pt"), "--expected", str(tmp_path / "expected.pt"), *exact)
    failed = cli("verify", str(shifted), *given)
    assert failed.returncode == 1 and "imaginary part 5" in failed.stdout, failed.stdout + failed.stderr
    assert cli("verify", str(honest), *given).returncode == 0
    differs = cli("diff", str(honest), str(shifted), "--inputs", str(tmp_path / "inputs.pt"), *exact)
    assert differs.returncode == 1, differs.stdout + differs.stderr
    assert "DIFF output 0  complex64[4, 8]  max abs diff 5" in differs.stdout, differs.stdout
