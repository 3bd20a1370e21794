"""``find_fix``: the compile settings that bring a reduced-precision build within tolerance, in the user's terms.

The builds are the reference backend's (trt-inline's own emulation of the release this torch pairs with: its
engines compute as an fp16 build does); each planted spot, inside a submodule, is found by its module path (what
the releases match ``autocast_excluded_nodes`` against) and source line, the fix is compiled, saved, loaded in a
fresh process and compared with the model; a clean model needs one compile; an input past fp16's range at the
engine's boundary says that no set can fix it; a search stopped by Ctrl-C or by its budget reports the best set
it found, and that set works; the call the report prints compiles the fix when pasted; the set reported is
checked minimal. Keeping modules in fp32 needs rule-based autocast (2.10+): those tests say so where the
release has none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from support.models import Fp16Overflow, LargeLogits, LargeMeanNorm, LongSum
from support.pairs import autocast_skip, fp16_settings
from support.processes import load_in_fresh_process
from torch import nn

import trt_inline
from trt_inline import progress
from trt_inline.fixing import FixError, FixReport
from trt_inline.fixing.script import default_settings, settings_from_json
from trt_inline.fixing.search import search

AUTOCAST = fp16_settings()
needs_autocast = pytest.mark.skipif(autocast_skip() is not None, reason=autocast_skip() or "")


class Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.a(x))


class _Squared(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        squared = (h * self.scale) ** 2
        return squared / 1e5


class TwoSpots(nn.Module):
    """Two planted spots (``big`` and ``huge``), far apart in graph order: each reads a value past fp16's range back
    into it."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.middle, self.last = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.big, self.huge = _Squared(300.0), _Squared(1000.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.middle(self.big(self.first(x))))
        for _ in range(4):
            h = torch.tanh(h * 0.9 + 0.1)
        return self.last(self.huge(h))


def _inputs() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(8, 16)


def _error(model: nn.Module, x: torch.Tensor, settings: dict[str, Any]) -> float:
    compiled = trt_inline.reference.compile(model, (x,), **settings)
    with torch.no_grad():
        return float((compiled(x) - model(x)).abs().max())


def _counting(raise_on: int | None = None) -> tuple[Any, list[int]]:
    """The reference compile, counted; raising KeyboardInterrupt on call ``raise_on`` (Ctrl-C during a compile)."""
    calls: list[int] = []

    def build(model: nn.Module, arg_inputs: Sequence[Any], **settings: Any) -> torch.nn.Module:
        calls.append(1)
        if len(calls) == raise_on:
            raise KeyboardInterrupt
        return trt_inline.reference.compile(model, arg_inputs, **settings)

    return build, calls


@needs_autocast
def test_the_planted_spot_is_found_named_and_fixed(tmp_path: Path) -> None:
    x = _inputs()
    model = Fp16Overflow().eval()
    broken = trt_inline.reference.compile(model, (x,), **AUTOCAST)
    with torch.no_grad():
        assert not broken(x).isfinite().all()  # (the fp16 build is wrong: what there is to fix)
    build, calls = _counting()
    report = trt_inline.find_fix(model, (x,), compile=build, settings=AUTOCAST)
    assert report.outcome == "fixed" and report.fixed and report.needed, report.to_text()
    assert report.compiles == len(calls)
    assert math.isinf(report.error_before) and report.error_after is not None and report.error_after < 1e-2
    assert [node.name for node in report.nodes] == ["spot"], report.to_text()
    (spot,) = report.nodes
    assert spot.module == "spot (Square)" and spot.nodes == 2 and "aten.mul.Tensor" in spot.op, spot
    assert spot.source.startswith("models.py:") and "big = h * h" in spot.source, spot
    assert report.minimal and "minimal: leaving out any one of the 1 puts a case out of tolerance" in report.to_text()
    assert report.compiles <= 4 * len(report.nodes) * math.log2(report.candidates) + 10, report.compiles
    assert report.settings == {**AUTOCAST, "autocast_excluded_nodes": ["^spot$"]}
    text = report.to_text()
    assert "big = h * h" in text and "arg_inputs  inf (out of tolerance) -> " in text, text
    assert f"compile with: {report.compile_call}" in text
    assert report.release_call.startswith("torch_tensorrt.dynamo.compile(torch.export.export(model, ")
    assert f"on TensorRT: {report.release_call}" in text and "autocast_excluded_nodes=['^spot$']" in text
    assert report.pipeline and f"built on: {report.pipeline}" in text
    assert report.before is not None and report.before.engines and report.after is not None
    fixed = trt_inline.reference.compile(model, (x,), **report.settings)
    assert {n.module for n in fixed.trt_inline_lowered if n.operator and n.floating and not n.low} == {"spot"}
    path = tmp_path / "fixed.pt2"
    trt_inline.save(fixed, path, arg_inputs=(x,))
    loaded = load_in_fresh_process(tmp_path, [path], [x])[str(path)]["outputs"][0]
    with torch.no_grad():
        assert (loaded - model(x)).abs().max() < 1e-2
    assert trt_inline.verify(path).status == "PASS"


@needs_autocast
def test_the_call_to_paste_compiles_the_fix() -> None:
    x = _inputs()
    model = Fp16Overflow().eval()
    report = trt_inline.find_fix(model, (x,), settings=AUTOCAST)
    assert report.compile_call.startswith("trt_inline.reference.compile(model, arg_inputs, enable_autocast=True, ")
    pasted = eval(report.compile_call, {"trt_inline": trt_inline, "torch": torch, "model": model, "arg_inputs": (x,)})
    with torch.no_grad():
        assert (pasted(x) - model(x)).abs().max() < 1e-2


@pytest.mark.heavy
@needs_autocast
def test_each_of_two_spots_is_found_by_its_module_path() -> None:
    x = _inputs()
    model = TwoSpots().eval()
    report = trt_inline.find_fix(model, (x,), settings=AUTOCAST)
    assert report.fixed and report.needed, report.to_text()
    assert sorted(node.name for node in report.nodes) == ["big", "huge"], report.to_text()
    assert all("squared = (h * self.scale) ** 2" in node.source for node in report.nodes), report.to_text()
    assert report.minimal
    assert report.compiles <= 4 * 2 * math.log2(report.candidates) + 10 + 2, report.compiles
    assert _error(model, x, report.settings) < 1e-2
    assert _error(model, x, AUTOCAST) > 1e-2 or math.isnan(_error(model, x, AUTOCAST))


@needs_autocast
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
    report = trt_inline.find_fix(Outer().eval(), (x,), settings=AUTOCAST)
    assert report.fixed and report.nodes, report.to_text()
    assert [node.module for node in report.nodes] == ["block (Inner)"], [n.module for n in report.nodes]
    assert report.settings["autocast_excluded_nodes"] == ["^block$"]


@needs_autocast
def test_a_clean_model_needs_one_compile() -> None:
    x = _inputs()
    build, calls = _counting()
    report = trt_inline.find_fix(Clean().eval(), (x,), compile=build, settings=AUTOCAST)
    assert report.outcome == "nothing to fix" and report.fixed and not report.needed
    assert report.compiles == 1 and len(calls) == 1
    assert report.to_text().startswith("nothing to fix: every case is within tolerance (worst error ")
    assert "; 1 compile)" in report.to_text().splitlines()[0]
    assert report.settings == AUTOCAST and report.compile_call.endswith(
        "(model, arg_inputs, enable_autocast=True, autocast_low_precision_type=torch.float16)"
    )


def test_the_fallback_strategy_offers_operators_only_and_says_what_the_release_does() -> None:
    """Operators by the name the releases compare (never getitem or size arithmetic). Where the release is weakly
    typed (enabled_precisions) a node run in PyTorch runs in fp32 and the search fixes the build; where autocast
    casts the graph before it is partitioned, it keeps its low precision, and the report says to keep modules in
    fp32 instead."""
    x = _inputs()
    model = Fp16Overflow().eval()
    report = trt_inline.find_fix(model, (x,), settings=default_settings("fallback"), strategy="fallback")
    first = trt_inline.reference.compile(model, (x,), **default_settings("fallback"))
    offered = {n.operator for n in first.trt_inline_lowered if n.low and n.in_engine}
    assert report.candidates == len(offered) and all(op.startswith("torch.ops.aten.") for op in offered), offered
    if autocast_skip() is not None:  # (weak typing: the fallback runs in fp32)
        assert report.fixed and report.needed and report.minimal, report.to_text()
        ops = report.settings["torch_executed_ops"]
        assert ops and all(op.startswith("torch.ops.aten.") for op in ops)
        assert report.before is not None and report.after is not None
        assert report.before.fallbacks is not None and report.after.fallbacks is not None
        assert report.after.fallbacks > report.before.fallbacks, report.to_text()
        assert _error(model, x, report.settings) < 1e-2
    else:
        assert report.outcome == "no fix" and not report.works, report.to_text()
        assert "keeps the dtype autocast gave it" in report.to_text() and "higher_precision" in report.to_text()


def test_what_cannot_be_searched_is_one_clear_error() -> None:
    x = _inputs()
    with pytest.raises(FixError, match="enable_autocast=True"):
        trt_inline.find_fix(
            Fp16Overflow().eval(), (x,), settings={"enabled_precisions": {torch.float16}}, strategy="higher_precision"
        )
    with pytest.raises(FixError, match="without autocast_low_precision_type is an fp32 build"):
        trt_inline.find_fix(Fp16Overflow().eval(), (x,), settings={"enable_autocast": True})
    with pytest.raises(FixError, match="strategy 'other'"):
        trt_inline.find_fix(Fp16Overflow().eval(), (x,), strategy="other")
    with pytest.raises(FixError, match="no case"):
        trt_inline.find_fix(Fp16Overflow().eval(), (x,), settings=AUTOCAST, strategy="fallback", cases=[])
    with pytest.raises(FixError, match="max_compiles=0"):
        trt_inline.find_fix(Fp16Overflow().eval(), (x,), settings=AUTOCAST, strategy="fallback", max_compiles=0)


@needs_autocast
def test_an_input_that_overflows_in_the_first_op_says_no_set_works_and_why() -> None:
    """Inputs of about 1e6: past fp16's range in the first op, which keeping nodes in fp32 cannot help alone; the
    fp32 matmul reading them rounds them to TF32, which the message names, and following it fixes the build."""
    x = _inputs() * 1e6
    report = trt_inline.find_fix(Clean().eval(), (x,), settings=AUTOCAST)
    assert report.outcome == "no fix" and not report.fixed and not report.works, report.to_text()
    assert report.compiles == 3  # (the settings given, every candidate in fp32, and that without TF32)
    text = report.to_text()
    assert text.startswith("no fix: no set of the 2 candidate modules kept in fp32 brings every case within tolerance")
    assert "lose it to TF32" in text and "add disable_tf32=True to the settings and search again" in text, text
    assert "compile with:" not in text and report.settings == AUTOCAST
    assert [case.after for case in report.cases] == [None] and report.error_after is None
    advised = trt_inline.find_fix(Clean().eval(), (x,), settings={**AUTOCAST, "disable_tf32": True})
    assert advised.fixed, advised.to_text()  # (within tolerance as given, or with a set in fp32)


@needs_autocast
def test_a_loss_outside_every_candidate_says_so() -> None:
    def off_by_one(model: nn.Module, arg_inputs: Sequence[Any], **settings: Any) -> torch.nn.Module:
        compiled = trt_inline.reference.compile(model, arg_inputs, **settings)
        return lambda *args: compiled(*args) + 1.0  # type: ignore[return-value]

    report = trt_inline.find_fix(Clean().eval(), (_inputs(),), compile=off_by_one, settings=AUTOCAST)
    assert report.outcome == "no fix" and report.compiles == 3, report.to_text()
    assert "the loss is not in what higher_precision can change" in report.to_text()
    assert report.before is not None and report.before.engines is None  # (not a partitioned module)


@needs_autocast
def test_ctrl_c_during_the_search_returns_the_best_set_found_so_far() -> None:
    x = _inputs()
    model = TwoSpots().eval()
    build, calls = _counting(raise_on=6)
    report = trt_inline.find_fix(model, (x,), compile=build, settings=AUTOCAST)
    assert len(calls) == 6 and report.compiles == 5  # (the interrupted compile did not finish)
    assert report.outcome == "interrupted" and report.interrupted and not report.fixed
    assert report.works and report.nodes, report.to_text()  # (a set that passed: every candidate at worst)
    text = report.to_text()
    assert text.startswith("interrupted after 5 compiles: the best set found so far, ") and "smaller one" in text
    assert "stopped by Ctrl-C" in text and "compile with:" in text
    assert _error(model, x, report.settings) < 1e-2  # (the best set does bring the case within tolerance)
    assert len(report.nodes) >= 2  # (both spots are needed: the complete search finds exactly those two, below)


@needs_autocast
def test_ctrl_c_before_the_first_compile_ends_reports_nothing_found() -> None:
    build, _ = _counting(raise_on=1)
    report = trt_inline.find_fix(TwoSpots().eval(), (_inputs(),), compile=build, settings=AUTOCAST)
    assert report.outcome == "interrupted" and not report.works and report.compiles == 0 and not report.cases
    assert report.to_text().startswith("interrupted after 0 compiles: no set that brings every case within")


@needs_autocast
def test_a_search_out_of_compiles_reports_its_best_set() -> None:
    x = _inputs()
    model = TwoSpots().eval()
    report = trt_inline.find_fix(model, (x,), settings=AUTOCAST, max_compiles=4)
    assert report.outcome == "out of compiles" and not report.fixed and report.compiles == 4
    assert report.works and report.nodes, report.to_text()
    assert report.to_text().startswith("out of compiles (max 4) after 4 compiles: the best set found so far")
    assert "stopped at max_compiles=4" in report.to_text()
    assert _error(model, x, report.settings) < 1e-2
    short = trt_inline.find_fix(model, (x,), settings=AUTOCAST, max_compiles=1)
    assert short.outcome == "out of compiles" and not short.works and short.compiles == 1


@needs_autocast
def test_every_case_is_reported_before_and_after() -> None:
    x = _inputs()
    model = Fp16Overflow().eval()
    cases = [(x,), (x * 0.5,), (x * 0.0,)]
    report = trt_inline.find_fix(model, (x,), settings=AUTOCAST, cases=cases)
    assert report.fixed, report.to_text()
    assert [case.name for case in report.cases] == ["case 0", "case 1", "case 2"]
    assert not report.cases[0].ok_before and all(case.ok_after for case in report.cases)
    assert report.cases[2].ok_before  # (zeros stay within fp16's range)
    for case, inputs in zip(report.cases, cases, strict=True):
        compiled = trt_inline.reference.compile(model, (x,), **report.settings)
        with torch.no_grad():
            assert case.after == pytest.approx(float((compiled(*inputs) - model(*inputs)).abs().max()), abs=1e-6)


@needs_autocast
def test_progress_is_one_line_per_compile_and_repeats_for_a_seed() -> None:
    x, model = _inputs(), Fp16Overflow().eval()
    runs: list[list[str]] = []
    reports: list[FixReport] = []
    for _ in range(2):
        lines: list[str] = []
        state = torch.random.get_rng_state()
        with progress.listening(lambda message, step, lines=lines: lines.append(message)):  # type: ignore[misc]
            reports.append(trt_inline.find_fix(model, (x,), settings=AUTOCAST, seed=3))
        assert torch.equal(torch.random.get_rng_state(), state)  # (the caller's random state is left as it was)
        runs.append(lines)
    assert len(runs[0]) == reports[0].compiles and runs[0] == runs[1]
    assert runs[0][0].startswith("compile 1: the settings given: worst error")
    every = reports[0].candidates
    assert runs[0][1].startswith(f"compile 2 (at most {reports[0].budget}): {every} of {every} candidates kept in fp32")
    assert reports[0].to_dict() == reports[1].to_dict()


@needs_autocast
def test_the_json_report_is_plain_data() -> None:
    x = _inputs()
    report = trt_inline.find_fix(Fp16Overflow().eval(), (x,), settings=AUTOCAST)
    document = json.loads(report.to_json())
    assert document["outcome"] == "fixed" and document["minimal"] is True
    assert document["settings"] == {**report.settings, "autocast_low_precision_type": "torch.float16"}
    assert document["cases"][0]["error_before"] == "inf" and document["cases"][0]["ok_after"] is True
    assert document["nodes"][0]["source"].startswith("models.py:") and document["compile_call"] == report.compile_call
    assert document["nodes"][0]["name"] == "spot" and document["nodes"][0]["nodes"] == 2
    assert document["build_before"] == {"engines": report.before.engines, "fallbacks": report.before.fallbacks}  # type: ignore[union-attr]


def test_settings_from_json_name_their_precisions() -> None:
    settings = settings_from_json('{"enabled_precisions": ["float16", "torch.float32"], "disable_tf32": true}')
    assert settings == {"enabled_precisions": {torch.float16, torch.float32}, "disable_tf32": True}
    assert settings_from_json('{"autocast_low_precision_type": "bfloat16"}') == {
        "autocast_low_precision_type": torch.bfloat16
    }
    for bad, message in (("{", "not JSON"), ("[]", "JSON object"), ('{"enabled_precisions": ["fp99"]}', "fp99")):
        with pytest.raises(FixError, match=message):
            settings_from_json(bad)


@pytest.mark.parametrize("needed", [[3], [0, 9], [2, 5, 11], [6, 7, 8], list(range(12))])
def test_the_search_finds_exactly_the_needed_candidates_within_its_budget(needed: list[int]) -> None:
    candidates = [f"n{i}" for i in range(12)]
    asked: list[frozenset[str]] = []

    def passes(chosen: Sequence[str]) -> bool:
        asked.append(frozenset(chosen))
        return all(f"n{i}" in chosen for i in needed)

    found = search(candidates, passes)
    assert found == [f"n{i}" for i in needed]
    distinct = len(set(asked))  # (the caller compiles a set once)
    assert distinct <= len(needed) * (math.ceil(math.log2(len(candidates))) + 2) + 1, distinct


def test_the_search_asks_once_per_neighbour_of_a_cluster() -> None:
    """A spot's nodes are neighbours in graph order: each after the first costs two questions, not a bisection."""
    candidates = [f"n{i}" for i in range(64)]
    asked: set[frozenset[str]] = set()

    def passes(chosen: Sequence[str]) -> bool:
        asked.add(frozenset(chosen))
        return {"n40", "n41", "n42", "n43"} <= set(chosen)

    assert search(candidates, passes) == ["n40", "n41", "n42", "n43"]
    assert len(asked) <= (math.log2(64) + 2) + 3 * 2 + 1, len(asked)


@needs_autocast
@pytest.mark.parametrize(
    ("spot", "modules"),
    [(LongSum, ["mean"]), (LargeLogits, ["logits"]), (LargeMeanNorm, ["offset", "norm"])],
    ids=["long sum", "large logits", "large mean before a LayerNorm"],
)  # fmt: skip
def test_each_kind_of_planted_spot_is_found_named_and_its_fix_verified(
    spot: type[nn.Module], modules: list[str], tmp_path: Path
) -> None:
    """The benchmark's kinds of precision-sensitive spot, each alone: the fp16 build is out of tolerance, the
    search names the spot's modules, and the fix, saved, verifies within tolerance against fp32."""
    torch.manual_seed(0)
    model, x = spot().eval(), torch.randn(8, 16)
    with torch.no_grad():
        exact = model(x)
    assert not _error(model, x, AUTOCAST) <= 1e-2  # (structure first: the fp16 build is wrong; NaN is wrong too)
    report = trt_inline.find_fix(model, (x,), settings=AUTOCAST)
    assert report.outcome == "fixed", report.to_text()
    assert [node.name for node in report.nodes] == modules, report.to_text()
    path = tmp_path / "fixed.pt2"
    trt_inline.save(trt_inline.reference.compile(model, (x,), **report.settings), path, arg_inputs=(x,))
    verdict = trt_inline.verify(path, arg_inputs=[x], expected=[exact], atol=1e-2, rtol=1e-2)
    assert verdict.ok, verdict.to_text()


def test_tolerances_are_a_number_a_dict_or_tolerances_under_verifys_name() -> None:
    """``tolerances=`` as ``verify`` and ``diff`` take it: one number (atol and rtol), a dict of its fields, or a
    ``Tolerances``; ``tolerance=``, its old name, still works with a DeprecationWarning; anything else says what
    it takes."""
    from trt_inline.verify.options import Tolerances

    x, settings = _inputs(), default_settings("fallback")
    for given in (1e-2, {"atol": 1e-2, "rtol": 1e-2}, Tolerances(atol=1e-2, rtol=1e-2)):
        report = trt_inline.find_fix(Clean().eval(), (x,), settings=settings, strategy="fallback", tolerances=given)
        assert report.outcome == "nothing to fix" and report.compiles == 1, (given, report.to_text())
    tight = trt_inline.find_fix(Fp16Overflow().eval(), (x,), settings=settings, strategy="fallback", tolerances=0.0)
    assert not tight.cases[0].ok_before  # (the number is held to: zero tolerance fails an fp16 build)
    with pytest.warns(DeprecationWarning, match=r"find_fix\(tolerance=\.\.\.\) is now tolerances="):
        old = trt_inline.find_fix(Clean().eval(), (x,), settings=settings, strategy="fallback", tolerance=1e-2)
    assert old.outcome == "nothing to fix"
    with pytest.raises(TypeError, match=r"^find_fix\(\): tolerances is a number \(atol and rtol\), a dict"):
        trt_inline.find_fix(Clean().eval(), (x,), settings=settings, tolerances="tight")
    with pytest.raises(TypeError, match=r"^find_fix\(\) got tolerances= and tolerance= \(its old name\)"):
        trt_inline.find_fix(Clean().eval(), (x,), settings=settings, tolerances=1e-2, tolerance=1e-2)


def _lowered(name: str, module: str, low: bool, block: str = "_run_on_acc_0") -> Any:
    from trt_inline.reference.lowered import LoweredNode

    dtype = "float16" if low else "float32"
    return LoweredNode(name, "torch.ops.aten.mul.Tensor", module, dtype, low, block, module, "")


def test_a_setting_that_reaches_only_some_of_its_nodes_is_said_so_and_one_that_reaches_none_is_an_error() -> None:
    """``check_reached`` on builds made up here: all reached, no note; two of three (one missing from the new
    build counts as missed), a note naming the others; none, FixError."""
    from trt_inline.fixing.runner import check_reached

    before = [_lowered("mul", "head", True), _lowered("mul_1", "head", True), _lowered("mul_2", "head", True)]
    assert check_reached(before, [_lowered(n.name, "head", False) for n in before], "higher_precision", ["head"]) == []
    partly = [_lowered("mul", "head", False), _lowered("mul_1", "head", True)]  # (mul_2 gone from the build)
    (note,) = check_reached(before, partly, "higher_precision", ["head"])
    assert "reached 1 of its 3 nodes: mul_1, mul_2 not kept in fp32" in note, note
    with pytest.raises(FixError, match=r"reached none of its nodes .*mul, mul_1, mul_2 not kept in fp32"):
        check_reached(before, before, "higher_precision", ["head"])


def test_the_minimality_check_drops_what_the_rest_passes_without() -> None:
    """A search's set is made 1-minimal even where keeping more in fp32 is not monotone: here {a, c} passes
    without b, and neither a nor c alone passes."""
    from trt_inline.fixing.runner import minimal

    def passes(kept: Sequence[str]) -> bool:
        return set(kept) in ({"a", "b", "c"}, {"a", "c"})

    assert minimal(["a", "b", "c"], passes) == (["a", "c"], True)
    assert minimal(["a"], passes) == (["a"], True)
