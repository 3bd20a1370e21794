"""``find_fix``: the compile settings that bring a reduced-precision build within tolerance, in the user's terms.

The builds are the reference backend's (its engines compute as an fp16 build does); each planted spot is
found by name, module path and source line, the fix is compiled, saved, loaded in a fresh process and
compared with the model, and a clean model needs one compile.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import load_in_fresh_process
from models import Fp16Overflow
from torch import nn

import trt_inline
from trt_inline.fix import FixError, _search


class Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.a(x))


def _inputs() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(8, 16)


def test_the_planted_spot_is_found_named_and_fixed(tmp_path: Path) -> None:
    x = _inputs()
    model = Fp16Overflow().eval()
    broken = trt_inline.reference.compile(model, (x,), enable_autocast=True)
    with torch.no_grad():
        assert not broken(x).isfinite().all()  # (the fp16 build is wrong: what there is to fix)
    report = trt_inline.find_fix(model, (x,), settings={"enable_autocast": True})
    assert report.fixed and report.needed, report.to_text()
    assert math.isinf(report.error_before) and report.error_after < 1e-2
    names = [node.name for node in report.nodes]
    assert "div" in names, report.to_text()
    div = next(node for node in report.nodes if node.name == "div")
    assert div.source.startswith("models.py:") and "small = big / 1e5" in div.source, div
    assert report.compiles <= 4 * len(report.nodes) * math.log2(report.candidates) + 10, report.compiles
    assert report.settings["autocast_excluded_nodes"] == [f"^{name}$" for name in names]
    text = report.to_text()
    assert "compile with: autocast_excluded_nodes=" in text and "small = big / 1e5" in text
    fixed = trt_inline.reference.compile(model, (x,), **report.settings)
    path = tmp_path / "fixed.pt2"
    trt_inline.save(fixed, path, arg_inputs=(x,))
    loaded = load_in_fresh_process(tmp_path, [path], [x])[str(path)]["outputs"][0]
    with torch.no_grad():
        assert (loaded - model(x)).abs().max() < 1e-2
    assert trt_inline.verify(path).status == "PASS"


def test_the_module_path_is_named_where_the_node_is_inside_a_submodule() -> None:
    class Inner(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 300.0) ** 2 / 1e5

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Inner()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(x) + 1

    x = _inputs()
    report = trt_inline.find_fix(Outer().eval(), (x,), settings={"enable_autocast": True})
    assert report.fixed and report.nodes, report.to_text()
    assert any(node.module == "block (Inner)" for node in report.nodes), [n.module for n in report.nodes]


def test_a_clean_model_needs_one_compile() -> None:
    x = _inputs()
    report = trt_inline.find_fix(Clean().eval(), (x,), settings={"enable_autocast": True})
    assert report.fixed and not report.needed and report.compiles == 1
    assert report.to_text().startswith("nothing to fix: every case is within tolerance")


def test_the_fallback_strategy_names_operators() -> None:
    x = _inputs()
    report = trt_inline.find_fix(
        Fp16Overflow().eval(), (x,), settings={"enabled_precisions": {torch.float16}}, strategy="fallback"
    )
    assert report.fixed, report.to_text()
    assert report.settings["torch_executed_ops"] and all(
        op.startswith("aten.") for op in report.settings["torch_executed_ops"]
    )


def test_what_cannot_be_searched_is_one_clear_error() -> None:
    x = _inputs()
    with pytest.raises(FixError, match="enable_autocast=True"):
        trt_inline.find_fix(Fp16Overflow().eval(), (x,), settings={"enabled_precisions": {torch.float16}})
    with pytest.raises(FixError, match="strategy 'other'"):
        trt_inline.find_fix(Fp16Overflow().eval(), (x,), strategy="other")


def test_an_input_that_overflows_in_the_first_op_says_no_candidate_can_fix_it() -> None:
    """Inputs past the fp16 range: the engine's own inputs are rounded at its boundary, whatever stays in fp32."""
    x = _inputs() * 1e6
    report = trt_inline.find_fix(Clean().eval(), (x,), settings={"enable_autocast": True})
    assert not report.fixed and "not in what higher_precision can change" in report.to_text(), report.to_text()


@pytest.mark.parametrize("needed", [[3], [0, 9], [2, 5, 11], list(range(12))])
def test_the_search_finds_exactly_the_needed_candidates_within_its_budget(needed: list[int]) -> None:
    candidates = [f"n{i}" for i in range(12)]
    calls: list[int] = []

    def passes(chosen: list[str]) -> bool:
        calls.append(1)
        return all(f"n{i}" in chosen for i in needed)

    found = _search(candidates, passes)
    assert found == [f"n{i}" for i in needed]
    assert len(calls) <= len(needed) * (math.ceil(math.log2(len(candidates))) + 2) + 1, len(calls)
