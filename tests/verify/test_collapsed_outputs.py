"""Collapsed outputs are flagged whatever the tolerance, everywhere a value is compared with a reference.

A model whose outputs are tiny (a default-initialised classifier's logits can be about 1e-9) loses them in an
fp16 build: every value underflows to 0. An absolute tolerance of 1e-4 covers that difference, so the
comparison alone passes it. Verify already warns without a reference (``output 0 is all zeros``); against a
reference, ``diff``, ``verify --expected-from``, ``--cases``, rank sets and the fix search's acceptance say it too:
a warning (a failure with ``--strict``), never "nothing to fix". An output the reference has all zeros, and a
value that merely differs within tolerance, are not flagged.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from support.commands import cli
from support.pairs import autocast_skip, fp16_settings
from torch import nn

import trt_inline
from trt_inline.verify.compare import collapse_warnings, compare_output

AUTOCAST = fp16_settings()


class Vanishing(nn.Module):
    """A Linear whose outputs (about 1e-11) fp16 cannot hold: an fp16 build returns zeros."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        with torch.no_grad():
            self.a.weight.mul_(1e-10)
            self.a.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)


def _inputs() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(8, 16)


def test_a_value_that_collapsed_within_tolerance_is_named() -> None:
    expected = torch.linspace(-1e-9, 1e-9, 8)
    zeros = compare_output(0, torch.zeros(8), expected, 1e-4, 0.0)
    assert zeros.ok and zeros.collapsed == "all zeros", zeros
    constant = compare_output(1, torch.full((8,), 3e-10), expected, 1e-4, 0.0)
    assert constant.ok and constant.collapsed == "constant", constant
    (first, second) = collapse_warnings([zeros, constant])
    assert first.startswith("output 0 is all zeros where the reference's is not: within atol 0.0001"), first
    assert second.startswith("output 1 is one value everywhere where the reference's is not"), second
    # Not collapsed: the reference collapsed alike, a value that differs within tolerance, one value, an integer.
    assert compare_output(0, torch.zeros(8), torch.zeros(8), 1e-4, 0.0).collapsed is None
    assert compare_output(0, expected * 1.5, expected, 1e-4, 0.0).collapsed is None
    assert compare_output(0, torch.zeros(1), torch.ones(1) * 1e-9, 1e-4, 0.0).collapsed is None
    assert compare_output(0, torch.zeros(4, dtype=torch.int64), torch.arange(4), 10.0, 0.0).collapsed is None
    with_nan = torch.full((8,), 3e-10)
    with_nan[0] = math.nan
    assert not compare_output(0, with_nan, expected, 1e-4, 0.0).ok  # (a NaN fails on its own: no warning needed)
    # A reference that varies by no more than rounding (one sample reduced in two orders) is no signal lost.
    assert compare_output(0, torch.full((2,), -8.030941), torch.tensor([-8.030941, -8.0309486]), 1e-4, 1e-4).collapsed \
        is None  # fmt: skip
    # Judged where neither side is NaN; a complex element is one value.
    nan_both = torch.tensor([1e-9, 2e-9, math.nan])
    assert compare_output(0, torch.tensor([0.0, 0.0, math.nan]), nan_both, 1e-4, 0.0).collapsed == "all zeros"
    assert compare_output(0, torch.full((3,), 1 + 2j), torch.tensor([1 + 2j, 1 + 3j, 2 + 2j]), 10.0, 10.0).collapsed \
        == "constant"  # fmt: skip
    # Said once: verify's own check without a reference said it of output 0 already.
    assert collapse_warnings([zeros], ["output 0 is all zeros on the reference inputs, from inputs that are not"]) == []


@pytest.fixture(scope="module")
def saves(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("collapsed")
    model, x = Vanishing().eval(), _inputs()
    files = {}
    for name, settings in (("fp32", {}), ("fp16", AUTOCAST)):
        compiled = trt_inline.reference.compile(model, (x,), **settings)
        with torch.no_grad():
            out = compiled(x)
        # The structure under test: fp32 keeps the values, fp16 loses all of them.
        assert bool(out.ne(0).any()) == (name == "fp32"), (name, out)
        files[name] = root / f"{name}.pt2"
        trt_inline.save(compiled, files[name], arg_inputs=[x])
    return files


@pytest.mark.skipif(autocast_skip() is not None, reason=autocast_skip() or "")
def test_diff_and_verify_against_a_reference_warn_and_strict_fails(saves: dict[str, Path]) -> None:
    proc = cli("diff", str(saves["fp16"]), str(saves["fp32"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr  # (within tolerance: no divergence)
    warned = [line for line in proc.stdout.splitlines() if "warning: output 0 is all zeros" in line]
    assert len(warned) == 1 and "where the reference's is not" in warned[0], proc.stdout
    same = cli("diff", str(saves["fp32"]), str(saves["fp32"]))
    assert same.returncode == 0 and "warning:" not in same.stdout, same.stdout

    proc = cli("verify", str(saves["fp16"]), "--expected-from", str(saves["fp32"]))
    assert proc.returncode == 0 and "warning: output 0 is all zeros" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stdout.count("output 0 is all zeros") == 1, proc.stdout  # (verify's own check said it: once)
    strict = cli("verify", str(saves["fp16"]), "--expected-from", str(saves["fp32"]), "--strict")
    assert strict.returncode == 1 and "output 0 is all zeros" in strict.stdout, strict.stdout + strict.stderr


@pytest.mark.skipif(autocast_skip() is not None, reason=autocast_skip() or "")
def test_the_fix_search_does_not_accept_a_collapsed_build() -> None:
    model, x = Vanishing().eval(), _inputs()
    report = trt_inline.find_fix(model, (x,), settings=AUTOCAST)
    assert report.outcome == "fixed" and report.needed, report.to_text()
    assert [node.name for node in report.nodes] == ["a"], report.to_text()
    assert (
        "out of tolerance before: case arg_inputs: output 0 is all zeros where the model's is not" in report.to_text()
    )
    fixed = trt_inline.reference.compile(model, (x,), **report.settings)
    with torch.no_grad():
        assert bool(fixed(x).ne(0).any())  # (the fix keeps the values fp16 lost)
