"""Which engine diverged: boundary data, ``verify --per-engine``, ``diff``, statistics and random inputs.

One model (``CrossedHalves``: three engines, relu left to PyTorch between them)
is compiled once and saved with boundary data; faults are then injected into the
saved files: one weight of one engine's payload, one op of one fallback region,
and the wiring the 2.13 release's ``inline_torch_modules`` gives it.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from support import pairs
from support.commands import assert_unusable, cli
from support.hostile import reference_io_text
from support.models import Chain, CrossedHalves, HalfOverflow
from support.processes import REPO, new_interpreter
from support.programs import engine_calls, engine_label

import trt_inline
from trt_inline import formats
from trt_inline.archive import REFERENCE_IO_FILE, decode_reference_io, open_file
from trt_inline.archive.reference_io import EngineBoundary, ReferenceIO, decode_boundaries_file, encode_reference_io
from trt_inline.errors import SaveError, VerifyInputError
from trt_inline.inlining.flat_program import exported_program_from_graph
from trt_inline.isolation import is_allocation_failure
from trt_inline.reference.program import load_program
from trt_inline.verify.boundaries import trace_program
from trt_inline.verify.compare import ERROR_STATS, compare_output
from trt_inline.verify.drill import drill_program, rebuild_drill_down
from trt_inline.verify.extract import region_repro
from trt_inline.verify.random_inputs import draw_inputs, size_ranges
from trt_inline.verify.report import BoundaryRow, VerifyReport

STOCK_RELEASE = "2.13.0"  # the last release whose inline_torch_modules wires fallback inputs by name


@dataclass
class Files:
    root: Path
    x: torch.Tensor
    compiled: torch.fx.GraphModule
    good: Path  # trt-inline save with boundary data
    plain: Path  # trt-inline save with reference I/O only
    # The compiled module's engines, and its fallbacks that run a relu, in graph order (the numbering
    # depends on the torch: from 2.9 an input-guard fallback comes first).
    engines: list[str]
    relu_fallbacks: list[str]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    root = tmp_path_factory.mktemp("divergence")
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    compiled = trt_inline.reference.compile(CrossedHalves().eval(), (x,), torch_executed_ops=["aten.relu.default"])
    good, plain = root / "good.pt2", root / "plain.pt2"
    trt_inline.save(compiled, good, arg_inputs=[x], embed_reference="boundaries")
    trt_inline.save(compiled, plain, arg_inputs=[x])
    engines = [n for n, _ in compiled.named_children() if n.startswith("_run_on_acc_")]
    relu_fallbacks = [
        n for n, m in compiled.named_children() if n.startswith("_run_on_gpu_") and "relu" in str(m.graph)
    ]
    assert len(engines) == 3 and len(relu_fallbacks) == 2, (engines, relu_fallbacks)
    return Files(root, x, compiled, good, plain, engines, relu_fallbacks)


def _engine_fault(files: Files, engine: int) -> Path:
    """The good file with the first weight tensor of one engine's payload moved by 0.05, its boundary data kept."""
    program = torch.export.load(files.good)
    node = engine_calls(program)[engine]
    weight = json.loads(node.args[2])["weights"][0]
    constant = next(s.target for s in program.graph_signature.input_specs if s.arg.name == node.args[1].name)
    payload = program.constants[constant]
    payload[weight["offset"] : weight["offset"] + weight["nbytes"]].view(torch.float32).add_(0.05)
    path = files.root / f"fault_engine_{engine}.pt2"
    torch.export.save(program, path, extra_files={REFERENCE_IO_FILE: reference_io_text(files.good)})
    return path


def _fallback_fault(files: Files) -> Path:
    """The good file with the second relu (a fallback region of its own) computing sigmoid instead."""
    program = torch.export.load(files.good)
    relus = [n for n in program.graph.nodes if n.target is torch.ops.aten.relu.default]
    assert [n.name for n in relus] == ["relu", "relu_1"]
    relus[1].target = torch.ops.aten.sigmoid.default
    program.graph_module.recompile()
    path = files.root / "fault_fallback.pt2"
    torch.export.save(program, path, extra_files={REFERENCE_IO_FILE: reference_io_text(files.good)})
    return path


def _stock_miswired(files: Files) -> Path:
    """The compiled module flattened by our engine pass and the 2.13 release's own ``inline_torch_modules``."""
    try:
        source = pairs.release_file(STOCK_RELEASE, "dynamo/_exporter.py")
    except pairs.Unavailable as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))
    namespace: dict[str, object] = {}
    exec(compile(pairs.extract(source, ["inline_torch_modules"]), "stock_exporter", "exec"), namespace)
    flat = trt_inline.inline_trt_modules(copy.deepcopy(files.compiled))
    flat = namespace["inline_torch_modules"](flat)  # type: ignore[operator]
    flat.graph.lint()  # the silent form: it lints, loads and runs
    flat.recompile()
    path = files.root / "stock.pt2"
    torch.export.save(exported_program_from_graph(flat, None, ((files.x,), {})), path)
    return path


# ---------------------------------------------------------------------------
# Boundary data in the file
# ---------------------------------------------------------------------------


def test_boundary_data_is_embedded_in_call_order(files: Files) -> None:
    reference = open_file(files.good).reference
    assert reference is not None and reference.boundaries is not None
    names = [b.name for b in reference.boundaries]
    assert names == files.engines
    assert reference.boundaries[2].sources == [f"{files.relu_fallbacks[1]} output 0", f"{files.engines[1]} output 1"]
    # What each engine of the compiled module really received and returned.
    engine = files.compiled.get_submodule(files.engines[0])
    with torch.no_grad():
        first, second = engine(files.x)
    assert torch.equal(reference.boundaries[0].inputs[0], files.x)
    assert torch.equal(reference.boundaries[0].outputs[0], first) and torch.equal(
        reference.boundaries[0].outputs[1], second
    )
    assert open_file(files.plain).reference.boundaries is None  # type: ignore[union-attr]


def test_an_exported_program_given_to_save_records_its_own_engine_calls(files: Files, tmp_path: Path) -> None:
    reference = open_file(files.good).reference
    assert reference is not None and reference.boundaries is not None
    path = tmp_path / "resaved.pt2"
    trt_inline.save(torch.export.load(files.good), path, arg_inputs=reference.args, embed_reference="boundaries")
    resaved = open_file(path).reference
    assert resaved is not None and resaved.boundaries is not None
    assert [b.name for b in resaved.boundaries] == files.engines
    assert resaved.boundaries[2].sources == ["relu_1", "getitem_3 = engine 1 output 1"], "in the file's own words"
    for mine, theirs in zip(resaved.boundaries, reference.boundaries, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(mine.outputs, theirs.outputs, strict=True))
    assert trt_inline.verify(path, per_engine=True, isolate=False).ok


def test_boundary_data_over_the_limit_refuses_the_save(files: Files, tmp_path: Path) -> None:
    """Asked for, boundary data is never left out quietly (it was, with a warning, and verify --per-engine then
    advised saving with it): past the limit the save is refused, naming the size and both ways on."""
    reference = open_file(files.good).reference
    assert reference is not None and reference.boundaries is not None
    limit = reference.nbytes(boundaries=False) + 16  # room for the I/O, not for the boundaries
    with pytest.raises(SaveError, match=r"engine boundary data \(embed_reference='boundaries'\) takes .* over the "
                       r"limit of .*: raise reference_limit_bytes, or save with embed_reference=True"):  # fmt: skip
        trt_inline.save(files.compiled, tmp_path / "capped.pt2", arg_inputs=[files.x], embed_reference="boundaries",
                        reference_limit_bytes=limit)  # fmt: skip
    assert not (tmp_path / "capped.pt2").exists()
    from trt_inline.embedding import DEFAULT_BOUNDARIES_LIMIT_BYTES, reference_limit

    assert reference_limit(None, True) == DEFAULT_BOUNDARIES_LIMIT_BYTES == 1 << 30  # (vit_b_16 at batch 8 fits)
    assert reference_limit(None, False) == 64 << 20 and reference_limit(5, True) == 5
    with pytest.raises(SaveError, match="embed_reference must be True, False or 'boundaries'"):
        trt_inline.save(files.compiled, tmp_path / "bad.pt2", arg_inputs=[files.x], embed_reference="layers")
    with pytest.raises(SaveError, match="'boundaries' is for ExportedProgram files"):
        trt_inline.save(files.compiled, tmp_path / "package.pt2", arg_inputs=[files.x], embed_reference="boundaries",
                        output_format="aot_inductor")  # fmt: skip
    assert not (tmp_path / "package.pt2").exists()


def test_boundary_data_holding_anything_but_tensors_is_refused() -> None:
    good = ReferenceIO([torch.ones(1)], {}, [torch.ones(1)], boundaries=[EngineBoundary("e", [torch.ones(1)], [])])
    assert decode_reference_io(encode_reference_io(good)).boundaries[0].name == "e"  # type: ignore[index]
    blob = io.BytesIO()
    record = {"name": "e", "inputs": ["not a tensor"], "outputs": [], "sources": []}
    torch.save({"version": 1, "args": [], "kwargs": {}, "outputs": [], "boundaries": [record]}, blob)
    with pytest.raises(VerifyInputError, match="engine record 0 must hold a name and lists of tensors"):
        decode_reference_io(base64.b64encode(blob.getvalue()).decode())


def test_plugin_switch_selects_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, mode in (("boundaries", "boundaries"), ("Boundaries", "boundaries"), ("0", False), ("", True)):
        monkeypatch.setenv(formats.REFERENCE_IO_ENV, value)
        assert formats.plugin_reference_mode() == mode, value


# ---------------------------------------------------------------------------
# verify --per-engine
# ---------------------------------------------------------------------------


def test_per_engine_names_the_engine_whose_weight_was_changed(files: Files) -> None:
    path = _engine_fault(files, engine=1)
    proc = cli("verify", str(path), "--per-engine")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    second = f"engine 1 ({files.engines[1]})"
    assert f"first divergence: {second}\n" in proc.stdout, proc.stdout
    assert "reads: relu, getitem_1 = engine 0 output 1" in proc.stdout
    report = json.loads(cli("verify", str(path), "--per-engine", "--json").stdout)
    assert report["divergence"]["kind"] == "engine" and report["divergence"]["where"] == second
    own = [row["own_ok"] for row in report["boundaries"] if row["own"] is not None]
    assert own == [True, False, True], "the third engine's inputs differ in the run, its own error does not"
    rows = {row["boundary"]: row for row in report["boundaries"]}
    assert rows[f"engine 2 ({files.engines[2]}) inputs"]["ok"] is False and rows[f"{second} inputs"]["ok"]
    assert max(v["max_abs_diff"] for v in rows[f"{second} outputs"]["own"]) > 0.1
    # Without --per-engine it runs by itself: an output differs and the file has boundary data.
    automatic = trt_inline.verify(path, isolate=False)
    assert automatic.divergence is not None and automatic.divergence.where == second
    assert "an output differs and boundary data is embedded: compared engine by engine" in automatic.notes


def test_per_engine_names_the_fallback_region_that_was_changed(files: Files) -> None:
    report = trt_inline.verify(_fallback_fault(files), per_engine=True, isolate=False)
    assert report.divergence is not None
    assert report.divergence.kind == "fallback"
    assert report.divergence.where == "fallback region relu_1 (feeding engine 2 in[0])"
    assert report.divergence.producers == ["getitem_2 = engine 1 output 0"] and report.divergence.nodes == ["relu_1"]
    assert f"in the compiled module it came from {files.relu_fallbacks[1]} output 0" in report.divergence.detail
    assert all(row.own_ok for row in report.boundaries), "every engine is within tolerance on its own"
    assert [row.ok for row in report.boundaries][:4] == [True] * 4


def test_per_engine_on_a_good_file_and_without_boundary_data(files: Files) -> None:
    report = trt_inline.verify(files.good, per_engine=True, isolate=False)
    assert report.ok and report.divergence is None and len(report.boundaries) == 7
    assert all(row.ok and row.own_ok for row in report.boundaries)
    # A file without boundary data, checked against the compiled module itself: its engines are recorded here.
    by_module = trt_inline.verify(files.plain, expected_module=files.compiled, arg_inputs=[files.x], per_engine=True)
    assert by_module.ok and len(by_module.boundaries) == 7, by_module.to_text()
    assert_unusable(cli("verify", str(files.plain), "--per-engine"), "no engine boundary data to compare with")


def test_boundary_data_that_does_not_fit_the_program_is_a_signature_divergence(files: Files, tmp_path: Path) -> None:
    """Recorded engines are aligned by position and checked by signature before any value is compared."""
    reference = open_file(files.good).reference
    assert reference is not None and reference.boundaries is not None
    reference.boundaries[1].inputs[0] = torch.zeros(5, 4)
    path = tmp_path / "other_boundaries.pt2"
    torch.export.save(
        torch.export.load(files.good), path, extra_files={REFERENCE_IO_FILE: encode_reference_io(reference)}
    )
    report = trt_inline.verify(path, per_engine=True, isolate=False)
    assert report.divergence is not None and report.divergence.kind == "signature", report.to_text()
    assert report.divergence.where == f"engine 1 ({files.engines[1]})"
    assert "its input 0 is [3, 4], the reference's [5, 4]" in report.divergence.detail
    assert not report.ok and report.outputs[0].ok, "the outputs agree: only the boundary data does not fit"


# ---------------------------------------------------------------------------
# diff
# ---------------------------------------------------------------------------


def test_diff_names_the_fallback_the_2_13_release_miswires(files: Files) -> None:
    stock = _stock_miswired(files)
    proc = cli("diff", str(stock), str(files.good))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "first divergence: fallback region relu_1 (feeding engine 2 in[0])" in proc.stdout, proc.stdout
    assert "reads engine 1 output 1 where the reference's reads engine 1 output 0" in proc.stdout
    assert "reads: getitem_3 = engine 1 output 1" in proc.stdout
    assert "engine 1 (execute_engine_default_1): output 0 is never read" in proc.stdout  # the structural view agrees


def test_diff_of_two_saves_of_one_module_exits_0(files: Files, tmp_path: Path) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI=true and matplotlib (in the test extra) is not installed: --plot goes untested")
        pytest.skip("--plot needs matplotlib (pip install -e '.[test]')")
    chart, outputs = tmp_path / "chart.png", tmp_path / "outputs.pt"
    proc = cli("diff", str(files.plain), str(files.good), "--save-outputs", str(outputs), "--plot", str(chart))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"PASS {files.plain} against {files.good}")
    assert proc.stdout.count("  ok") == 7 + 1 and "DIFF" not in proc.stdout
    saved = torch.load(outputs, weights_only=True)
    with torch.no_grad():
        assert torch.equal(saved["a"][0], files.compiled(files.x)) and torch.equal(saved["b"][0], saved["a"][0])
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_unusable(cli("diff", str(files.plain), str(files.good), "--plot", str(tmp_path / "chart.svg")), "as PNG")
    missing = tmp_path / "missing" / "out.pt"
    assert_unusable(cli("verify", str(files.good), "--save-outputs", str(missing)), "does not exist")


class _WithNone(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None, torch.Tensor]:
        return x + 1, None, x * 2


class _WithoutNone(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x * 2


def test_diff_of_programs_one_returning_none_is_a_fail_not_a_crash(tmp_path: Path) -> None:
    """A program returning ``None`` among its outputs, diffed against one that does not (either way round) or
    against itself: the None is a value compared like the others, never an error of the tool."""
    x = torch.randn(2, 3)
    paths = {}
    for name, model in (("none", _WithNone()), ("plain", _WithoutNone())):
        paths[name] = tmp_path / f"{name}.pt2"
        trt_inline.save(trt_inline.reference.compile(model, (x,), min_block_size=1), paths[name], arg_inputs=(x,))
    for a, b in (("plain", "none"), ("none", "plain")):
        proc = cli("diff", str(paths[a]), str(paths[b]))
        assert proc.returncode == 1 and proc.stdout.startswith("FAIL"), proc.stdout + proc.stderr
        assert "the outputs are structured otherwise" in proc.stdout and not proc.stderr, proc.stdout + proc.stderr
    report = trt_inline.diff(paths["plain"], paths["none"], isolate=False)
    assert report.outputs[1].problem == "output 1 is float32[2, 3], expected None"
    assert "  DIFF output 1  None  max abs diff inf" in report.to_text()
    same = cli("diff", str(paths["none"]), str(paths["none"]))
    assert same.returncode == 0 and same.stdout.startswith("PASS"), same.stdout + same.stderr


class _WithScalar(torch.nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x * 2, self.count


def test_diff_compares_a_python_scalar_output_as_a_value(tmp_path: Path) -> None:
    """A program returning a Python int (a count, a size): the same int is no difference, another one is."""
    x = torch.randn(2, 3)
    paths = {}
    for count in (3, 4):
        paths[count] = tmp_path / f"count_{count}.pt2"
        compiled = trt_inline.reference.compile(_WithScalar(count), (x,), min_block_size=1)
        trt_inline.save(compiled, paths[count], arg_inputs=(x,))
    same = cli("diff", str(paths[3]), str(paths[3]))
    assert same.returncode == 0 and same.stdout.startswith("PASS"), same.stdout + same.stderr
    other = trt_inline.diff(paths[4], paths[3], isolate=False)
    assert not other.ok and not other.outputs[1].ok and other.outputs[0].ok, other.to_text()


def test_diff_of_an_engine_fault_runs_each_engine_on_the_other_files_inputs(files: Files) -> None:
    report = trt_inline.diff(_engine_fault(files, engine=2), files.good, isolate=False)
    assert not report.ok and report.divergence is not None
    assert report.divergence.where == f"engine 2 ({files.engines[2]})"
    assert [row.own_ok for row in report.boundaries if row.own is not None] == [True, True, False]


# ---------------------------------------------------------------------------
# Comparison: tolerances per output, statistics, NaN / Inf
# ---------------------------------------------------------------------------


def test_statistics_and_non_finite_values() -> None:
    expected = torch.arange(100, dtype=torch.float32)
    actual = expected + torch.where(expected == 99, 5.0, 0.01)
    result = compare_output(0, actual, expected, 0.1, 0.0)
    assert not result.ok and result.max_abs_diff == pytest.approx(5.0)
    assert result.median_abs_diff == pytest.approx(0.01, abs=1e-5) and result.p99_abs_diff == pytest.approx(
        0.01, abs=1e-5
    )
    assert result.mean_abs_diff == pytest.approx((99 * 0.01 + 5) / 100, rel=1e-4)
    assert 0.99 < result.cosine_similarity < 1.0
    poisoned = expected.clone()
    poisoned[3], poisoned[4] = float("nan"), float("inf")
    nan = compare_output(0, poisoned, expected, 1e9, 1e9)
    assert not nan.ok and (nan.nan_count, nan.inf_count) == (1, 1)
    assert nan.problem == (
        "output 0 has 1 NaN and 1 Inf where the reference is finite; 2 of 100 values differ, the first at [3]: "
        "nan vs 3.0"
    )
    assert nan.median_abs_diff == 0.0 and nan.finite_count == 98, "statistics are over the finite values"
    assert nan.error_text() == "1 NaN and 1 Inf where the reference is finite", "never 'max abs diff inf'"
    assert nan.statistics_text().endswith("(over the 98 finite values)")
    all_nan = compare_output(0, torch.full((4,), float("nan")), torch.ones(4), 1e-4, 1e-4)
    assert all_nan.finite_count == 0 and "cosine" not in all_nan.statistics_text(), "no statistics of nothing"
    assert all_nan.statistics_text() == "no value is finite on both sides: no error statistics"
    report = VerifyReport("f.pt2", outputs=[all_nan], expected_source="embedded").to_text()
    assert "4 NaN where the reference is finite" in report and "max abs diff" not in report, report


def test_per_output_tolerances(files: Files) -> None:
    path = _engine_fault(files, engine=2)
    strict = cli("verify", str(path), "--atol", "1e-4")
    assert strict.returncode == 1 and "atol 0.0001" in strict.stdout
    loose = trt_inline.verify(path, atol={0: 10.0}, isolate=False)
    assert loose.outputs[0].ok and loose.outputs[0].atol == 10.0 and loose.divergence is None
    assert_unusable(cli("verify", str(path), "--atol", "outx=1"), "name an output (out0), an engine (engine2, acc_5)")
    assert_unusable(cli("verify", str(path), "--atol", "out0=big"), "'big' is not a number")
    both = cli("verify", str(path), "--atol", "out0=10", "--atol", "1e-9", "--json")
    assert json.loads(both.stdout)["outputs"][0]["atol"] == 10.0


def test_per_engine_tolerances_reach_the_boundaries(files: Files) -> None:
    path = _engine_fault(files, engine=2)
    # A loose tolerance on the output alone: the output passes, the engine's own error still fails at the default.
    output_only = trt_inline.verify(path, per_engine=True, atol={"out0": 1}, isolate=False)
    assert output_only.outputs[0].ok and not output_only.ok
    assert any(p.startswith("engine 2 (") and "own error is past tolerance" in p for p in output_only.problems)
    proc = cli("verify", str(path), "--per-engine", "--atol", "out0=1", "--atol", "engine2=1")
    assert proc.returncode == 0, proc.stdout
    label = files.engines[2]  # "_run_on_acc_N"
    for key in (label, label.removeprefix("_run_on_"), "engine02"):
        assert trt_inline.verify(path, per_engine=True, atol={"out0": 1, key: 1}, isolate=False).ok, key
    rows = trt_inline.verify(path, per_engine=True, atol={"out0": 1, "engine2": 1}, isolate=False).boundaries
    assert {row.engine: row.values[0].atol for row in rows if row.values and row.engine is not None} == {
        0: 1e-4,
        1: 1e-4,
        2: 1.0,
    }, "engine 2's tolerance reaches engine 2 only"
    with pytest.raises(VerifyInputError, match="keyed by an output"):
        trt_inline.verify(path, atol={"engine": 1}, isolate=False)


def test_check_error_stat_as_polygraphy() -> None:
    expected = torch.arange(100, dtype=torch.float64)
    actual = expected + torch.where(expected == 99, 5.0, 0.01)  # one outlier among small errors
    verdicts = {stat: compare_output(0, actual, expected, 0.1, 0.0, stat).ok for stat in ERROR_STATS}
    assert verdicts == {"elemwise": False, "max": False, "mean": True, "median": True, "p99": True}
    failing = compare_output(0, actual, expected, 0.001, 0.0, "median")
    assert failing.problem is not None and "median abs error 0.01" in failing.problem
    assert "--check-error-stat median" in failing.problem
    relative = compare_output(0, expected * 1.001, expected, 0.0, 0.01, "max")  # within rtol, never within atol
    assert relative.ok
    inf, nan = float("inf"), float("nan")
    finite_against_non_finite = torch.tensor([1.0, 2.0, 3.0, inf]), torch.tensor([1.0, inf, nan, -inf])
    for stat in ERROR_STATS:  # statistics cover finite pairs: the rest must fail by itself
        verdict = compare_output(0, *finite_against_non_finite, 1e-4, 1e-4, stat)
        assert not verdict.ok and verdict.problem is not None, stat
    assert_unusable(cli("verify", "x.pt2", "--check-error-stat", "worst"), "invalid choice")


# ---------------------------------------------------------------------------
# Random inputs within the declared ranges
# ---------------------------------------------------------------------------


class _Rows(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x.sum(-1) + y[::2] + y[1::2] + z.sum()


def _dynamic_program() -> torch.export.ExportedProgram:
    batch, free = torch.export.Dim("batch", min=2, max=7), torch.export.Dim("free", min=3)
    inputs = (torch.randn(5, 4), torch.randn(10), torch.randn(6))
    dynamic = ({0: batch}, {0: 2 * batch}, {0: free})
    return torch.export.export(_Rows(), inputs, dynamic_shapes=dynamic)


def test_random_inputs_stay_within_the_declared_ranges() -> None:
    program = _dynamic_program()
    sample = [torch.randn(5, 4), torch.randn(10), torch.randn(6)]
    assert sorted(size_ranges(program, sample).values()) == [(2, 7), (3, 12)], "no upper end: twice the sample"
    draws = draw_inputs(program, 12, seed=3, sample=sample)
    batches = [d.inputs[0].shape[0] for d in draws]
    frees = [d.inputs[2].shape[0] for d in draws]
    assert (batches[0], frees[0]) == (2, 3) and (batches[1], frees[1]) == (7, 12), "both ends are drawn"
    assert all(2 <= b <= 7 for b in batches) and all(3 <= f <= 12 for f in frees)
    assert all(d.inputs[1].shape[0] == 2 * d.inputs[0].shape[0] for d in draws), "a derived size follows its Dim"
    assert len(set(batches[2:])) > 1, "sizes between the ends vary"
    again = draw_inputs(program, 12, seed=3, sample=sample)
    assert all(
        torch.equal(a, b) for d, e in zip(draws, again, strict=True) for a, b in zip(d.inputs, e.inputs, strict=True)
    )
    other = draw_inputs(program, 12, seed=4, sample=sample)
    assert not all(torch.equal(d.inputs[0], e.inputs[0]) for d, e in zip(draws, other, strict=True))
    module = program.module()
    for draw in draws:
        module(*draw.inputs)  # the program accepts every draw


def test_verify_and_diff_on_random_inputs(files: Files, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = trt_inline.verify(files.good, random_inputs=3, seed=1, isolate=False)
    assert report.ok and [run["sizes"] for run in report.random_runs] == [[[3, 8]]] * 3  # static: the sample's sizes
    diverged = trt_inline.diff(_engine_fault(files, engine=0), files.good, random_inputs=2, isolate=False)
    assert diverged.divergence is not None and diverged.divergence.where == f"engine 0 ({files.engines[0]})"
    with pytest.raises(VerifyInputError, match="at least 1"):
        draw_inputs(torch.export.load(files.good), 0, seed=0)


def test_random_inputs_against_the_compiled_module(tmp_path: Path) -> None:
    """A dynamic batch: every draw within the saved program's range, each compared with the compiled module."""
    batch = torch.export.Dim("batch", min=2, max=6)
    x = torch.randn(4, 8)
    compiled = trt_inline.reference.compile(
        CrossedHalves().eval(), (x,), torch_executed_ops=["aten.relu.default"], dynamic_shapes=({0: batch},)
    )
    path = tmp_path / "dynamic.pt2"
    trt_inline.save(compiled, path, arg_inputs=[x], dynamic_shapes=({0: batch},), embed_reference="boundaries")
    report = trt_inline.verify(path, expected_module=compiled, random_inputs=5, seed=7, isolate=False)
    assert report.ok, report.to_text()
    rows = [run["sizes"][0][0] for run in report.random_runs]
    assert rows[:2] == [2, 6] and all(2 <= r <= 6 for r in rows), rows
    assert "5 runs on random inputs (seed 7) were compared with expected_module" in report.notes

    def off_by_one(t: torch.Tensor) -> torch.Tensor:
        return compiled(t) + 1

    wrong = trt_inline.verify(path, expected_module=off_by_one, arg_inputs=[x], random_inputs=2, isolate=False)
    assert [run["ok"] for run in wrong.random_runs] == [False, False]
    assert "random inputs 0 (sizes [[2, 8]]): output 0 differs" in "\n".join(wrong.problems)
    with pytest.raises(VerifyInputError, match="pass isolate=False"):
        trt_inline.verify(path, expected_module=compiled, arg_inputs=[x], random_inputs=2)


class _Amplifier(torch.nn.Module):
    """Two engines around a relu fallback; the second scales by 1000, so the first's small errors grow."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x) + 1.0)) * 1000.0


def test_blame_goes_to_the_engine_whose_own_small_error_a_later_engine_amplifies(tmp_path: Path) -> None:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    compiled = trt_inline.reference.compile(_Amplifier().eval(), (x,), torch_executed_ops=["aten.relu.default"])
    good = tmp_path / "good.pt2"
    trt_inline.save(compiled, good, arg_inputs=[x], embed_reference="boundaries")
    program = torch.export.load(good)
    first = engine_calls(program)[0]
    bias = next(w for w in json.loads(first.args[2])["weights"] if w["shape"] == [8])
    constant = next(s.target for s in program.graph_signature.input_specs if s.arg.name == first.args[1].name)
    program.constants[constant][bias["offset"] : bias["offset"] + bias["nbytes"]].view(torch.float32).add_(6e-5)
    path = tmp_path / "amplified.pt2"
    torch.export.save(program, path, extra_files={REFERENCE_IO_FILE: reference_io_text(good)})

    report = trt_inline.verify(path, isolate=False, per_engine=True)
    rows = {row.boundary.split(" (")[0] + " " + row.boundary.rsplit(" ", 1)[1]: row for row in report.boundaries}
    first_own, second_own = rows["engine 0 outputs"].own, rows["engine 1 outputs"].own
    assert first_own is not None and second_own is not None
    assert 0 < max(v.max_abs_diff for v in first_own) < 1e-4 and rows["engine 0 outputs"].own_ok  # within tolerance
    assert rows["engine 1 inputs"].ok and not rows["engine 1 outputs"].ok  # the first boundary past tolerance ...
    assert max(v.max_abs_diff for v in second_own) == 0  # ... of an engine that computes what it should
    assert report.divergence is not None and report.divergence.where.startswith("engine 0 (")
    detail = report.divergence.detail
    assert "amplifies it past tolerance" in detail and "whose own error is 0" in detail


def _with_program_edit(files: Files, name: str, edit: object) -> Path:
    """The good file with ``edit(program)`` applied to its graph, its boundary data kept."""
    program = torch.export.load(files.good)
    edit(program)  # type: ignore[operator]
    program.graph_module.recompile()
    path = files.root / name
    torch.export.save(program, path, extra_files={REFERENCE_IO_FILE: reference_io_text(files.good)})
    return path


def test_a_crash_after_an_engine_returns_other_shapes_names_that_engine(files: Files) -> None:
    def reorder_outputs(program: torch.export.ExportedProgram) -> None:
        node = engine_calls(program)[0]
        text = json.loads(node.args[2])
        assert text["outputs"] == [6, 7]
        text["outputs"] = [4, 6]  # the whole [3, 8] product first, then one half: other order, other shapes
        node.args = (*node.args[:2], json.dumps(text, separators=(",", ":")))

    path = _with_program_edit(files, "reordered_outputs.pt2", reorder_outputs)
    with pytest.raises(Exception, match=r"[Ss]ize|shape|expand"):
        torch.export.load(path).module()(files.x)  # the plain run fails, and says nothing of where
    proc = cli("verify", str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = f"engine 0 ({files.engines[0]})"
    assert f"first divergence: {first}\n" in proc.stdout, proc.stdout
    report = trt_inline.verify(path, isolate=False).to_dict()
    divergence = report["divergence"]
    assert (
        divergence["kind"] == "signature" and "its output 0 is [3, 8], the reference's [3, 4]" in divergence["detail"]
    )
    assert "the run then raised at " in divergence["detail"], divergence
    assert any(p.startswith("the program raises on its reference inputs") for p in report["problems"])
    # the engines the run never reached were run alone on their recorded inputs, and agree
    unreached = [row for row in report["boundaries"] if row["boundary"].endswith("(not reached)")]
    assert unreached and all(row["own_ok"] for row in unreached), report["boundaries"]


def test_a_fallback_region_that_raises_is_named_with_its_exception(files: Files) -> None:
    def break_second_relu(program: torch.export.ExportedProgram) -> None:
        relu = [n for n in program.graph.nodes if n.target is torch.ops.aten.relu.default][1]
        relu.target, relu.args = torch.ops.aten.view.default, (relu.args[0], [5, 7])  # 12 values: raises

    path = _with_program_edit(files, "raising_fallback.pt2", break_second_relu)
    report = trt_inline.verify(path, isolate=False)
    assert not report.ok and report.divergence is not None, report.to_text()
    assert report.divergence.kind == "crash" and report.divergence.where == "fallback region relu_1 (node relu_1)"
    assert "every engine before it agrees with the reference, and node relu_1 raised" in report.divergence.detail
    assert report.divergence.producers == ["getitem_2 = engine 1 output 0"]
    assert all(row.ok and row.own_ok for row in report.boundaries if "not reached" not in row.boundary)
    recorded = files.root / "raising.boundaries"
    proc = cli("verify", str(path), "--save-boundaries", str(recorded))
    assert proc.returncode == 1 and "first divergence: fallback region relu_1" in proc.stdout, proc.stdout
    assert "--save-boundaries: nothing written" in proc.stdout and not recorded.exists(), "no run to record"
    # Inputs the user gave are another matter: a program that rejects them is unusable input (exit 2).
    inputs = files.root / "inputs.pt"
    torch.save([files.x], inputs)
    assert cli("verify", str(path), "--inputs", str(inputs)).returncode == 2


def test_an_engine_that_raises_on_inputs_that_agree_is_the_divergence(files: Files) -> None:
    def bad_split(program: torch.export.ExportedProgram) -> None:
        node = engine_calls(program)[1]
        text = json.loads(node.args[2])
        split = next(step for step in text["steps"] if step["target"] == "aten::split_with_sizes.default")
        split["args"][1] = [4, 5]  # sums to 9 of 8: the engine raises whatever it is given
        node.args = (*node.args[:2], json.dumps(text, separators=(",", ":")))

    report = trt_inline.verify(_with_program_edit(files, "raising_engine.pt2", bad_split), isolate=False)
    assert report.divergence is not None and report.divergence.kind == "crash", report.to_text()
    assert report.divergence.where == f"engine 1 ({files.engines[1]})"
    detail = report.divergence.detail
    assert detail.startswith("its inputs agree with the reference and it raised RuntimeError: split_with_sizes")
    assert "running it alone on its recorded inputs raised RuntimeError" in detail
    rows = [row.boundary for row in report.boundaries]
    assert rows[:3] == [f"engine 0 ({files.engines[0]}) inputs", f"engine 0 ({files.engines[0]}) outputs",
                        f"engine 1 ({files.engines[1]}) inputs"]  # fmt: skip
    assert rows[-1] == f"engine 2 ({files.engines[2]}) outputs (not reached)"
    assert report.boundaries[-1].own_ok and report.boundaries[-1].own is not None


@pytest.mark.parametrize("where", ["engine", "fallback"])
def test_running_out_of_memory_is_the_limit_not_a_divergence(
    files: Files, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An allocation that fails in the engine-by-engine run is this process's memory limit (the child says it as
    one, exit 2, naming --memory-limit), never "first divergence: ... raised"; any other error is the divergence."""
    module = trt_inline.load(files.good).module()
    recorded = decode_reference_io(reference_io_text(files.good)).boundaries
    assert recorded is not None
    target = engine_calls(torch.export.load(files.good))[1].name if where == "engine" else "relu_1"
    stock_run_node = torch.fx.Interpreter.run_node
    for error, is_limit in (
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes"), True),
        (RuntimeError("split_with_sizes expects split_sizes to sum exactly to 8"), False),
    ):

        def run_node(self: torch.fx.Interpreter, n: torch.fx.Node, error: Exception = error) -> Any:
            if n.name == target:
                raise error
            return stock_run_node(self, n)

        monkeypatch.setattr(torch.fx.Interpreter, "run_node", run_node)
        if is_limit:
            with pytest.raises(RuntimeError, match="can't allocate memory") as raised:
                trace_program(module, [files.x], {}, None, recorded)
            assert is_allocation_failure(raised.value)
        else:
            trace = trace_program(module, [files.x], {}, None, recorded)
            assert trace.crash is not None and "split_with_sizes" in trace.crash.error, trace.crash
        monkeypatch.setattr(torch.fx.Interpreter, "run_node", stock_run_node)


def test_a_boundary_table_of_random_inputs_says_which_inputs() -> None:
    row = BoundaryRow("engine 0 (_run_on_acc_0) outputs", 0, [compare_output(0, torch.ones(2), torch.zeros(2), 0, 0)])
    report = VerifyReport("a.pt2 against b.pt2", boundaries=[row], boundaries_on="random inputs 1 (sizes [[5, 8]])")
    crossed = VerifyReport.from_dict(report.to_dict())  # as a diff's report comes from its child
    assert "engine boundaries on random inputs 1 (sizes [[5, 8]]) (max abs diff" in crossed.to_text()
    assert "engine boundaries (max abs diff" in VerifyReport("a.pt2", boundaries=[row]).to_text()


def test_boundaries_saved_on_one_run_are_the_reference_of_another(files: Files, tmp_path: Path) -> None:
    recorded = tmp_path / "good.boundaries"
    proc = cli("verify", str(files.plain), "--save-boundaries", str(recorded))  # a file without boundary data
    assert proc.returncode == 0 and recorded.read_bytes().startswith(b"trt-inline boundaries 1\n"), proc.stderr
    reference = decode_boundaries_file(recorded.read_bytes(), str(recorded))
    assert reference.boundaries is not None and [b.name for b in reference.boundaries] == files.engines
    assert torch.equal(reference.args[0], files.x)
    # Another "machine": the same program with engine 1's weight moved, checked against the recorded run.
    fault = _engine_fault(files, engine=1)
    against = json.loads(cli("verify", str(fault), "--load-boundaries", str(recorded), "--json").stdout)
    assert against["expected_source"] == f"from {recorded}" and not against["ok"]
    assert against["divergence"]["where"] == f"engine 1 ({files.engines[1]})", against["divergence"]
    assert len(against["boundaries"]) == 7, "compared boundary by boundary, without --per-engine"
    assert trt_inline.verify(files.good, load_boundaries=recorded, isolate=False).ok
    # In this process too; and refusals: a file that is not one, a .pt2 file, boundaries with --expected-from.
    here = tmp_path / "here.boundaries"
    assert trt_inline.verify(files.good, save_boundaries=here, isolate=False).ok and here.exists()
    assert trt_inline.verify(fault, load_boundaries=here, isolate=False).divergence is not None
    not_one = tmp_path / "not.boundaries"
    not_one.write_bytes(b"trt-inline boundaries 1\n!!!")
    with pytest.raises(VerifyInputError, match="not base64"):
        trt_inline.verify(files.good, load_boundaries=not_one, isolate=False)
    assert_unusable(
        cli("verify", str(files.good), "--load-boundaries", str(recorded), "--expected-from", str(files.good)),
        "--load-boundaries is the reference",
    )


def test_diff_of_two_partitions_of_one_model_compares_where_both_cut(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model, x = Chain().eval(), torch.randn(3, 8)
    coarse, fine = tmp_path / "coarse.pt2", tmp_path / "fine.pt2"
    for path, fallback in ((coarse, ["aten.relu.default"]), (fine, ["aten.relu.default", "aten.sigmoid.default"])):
        trt_inline.save(trt_inline.reference.compile(model, (x,), torch_executed_ops=fallback), path, arg_inputs=[x])
    assert [len(engine_calls(torch.export.load(p))) for p in (coarse, fine)] == [3, 4]  # the partitions differ

    # Each save recorded which exported node each engine input and output is (where a fallback of the compiled
    # module computes or reads it): layers[2]'s product (addmm_2) is engine 1's output in one, engine 2's in the
    # other; the sigmoid only one of them leaves to PyTorch is an engine input there.
    provenance = [decode_reference_io(reference_io_text(p)).provenance for p in (coarse, fine)]
    assert provenance[0] is not None and provenance[1] is not None
    assert [(e["inputs"], e["outputs"]) for e in provenance[0]["engines"]] == [
        ([""], ["addmm"]), (["relu"], ["addmm_2"]), (["relu_1"], [""])
    ], provenance[0]  # fmt: skip
    assert [(e["inputs"], e["outputs"]) for e in provenance[1]["engines"]] == [
        ([""], ["addmm"]), (["relu"], ["addmm_1"]), (["sigmoid"], ["addmm_2"]), (["relu_1"], [""])
    ], provenance[1]  # fmt: skip

    same = trt_inline.diff(coarse, fine, isolate=False)
    assert same.ok and same.divergence is None, same.to_text()
    assert any("partitioned differently: this one runs 3 engine calls" in note for note in same.notes), same.notes
    cuts = [row.boundary for row in same.boundaries]
    assert [cut.split(" (")[0] for cut in cuts] == ["addmm", "relu", "addmm_2", "relu_1", "program outputs"], cuts
    assert cuts[2] == f"addmm_2 (here engine 1 out[0]; {fine}: engine 2 out[0])"

    # The fine file with its third engine (layers[2]) changed: named at that engine's output, the finest cut.
    program = torch.export.load(fine)
    third = engine_calls(program)[2]
    weight = json.loads(third.args[2])["weights"][0]
    constant = next(s.target for s in program.graph_signature.input_specs if s.arg.name == third.args[1].name)
    program.constants[constant][weight["offset"] : weight["offset"] + weight["nbytes"]].view(torch.float32).add_(0.05)
    changed, unrecorded = tmp_path / "fine_changed.pt2", tmp_path / "fine_changed_unrecorded.pt2"
    torch.export.save(program, changed, extra_files={REFERENCE_IO_FILE: reference_io_text(fine)})
    diverged = trt_inline.diff(coarse, changed, isolate=False)
    assert diverged.divergence is not None and diverged.divergence.kind == "partition", diverged.to_text()
    assert diverged.divergence.where == "addmm_2 (engine 1 out[0])", diverged.to_text()
    assert "the last value both cut at that agrees is relu: what computes addmm_2" in diverged.divergence.detail
    assert f"in {changed}: engine 2 ({engine_label(program, 2)})" in diverged.divergence.detail
    assert cli("diff", str(coarse), str(changed)).returncode == 1
    # Without that record (a file saved by torch alone) the values are matched by the saved programs' own node
    # names, and engine outputs not at all: the finest shared cut is what both leave to PyTorch.
    torch.export.save(program, unrecorded)
    coarser = trt_inline.diff(coarse, unrecorded, isolate=False)
    assert coarser.divergence is not None and coarser.divergence.where.startswith("relu_1 (engine "), coarser.to_text()
    assert "the last value both cut at that agrees is relu: what computes relu_1" in coarser.divergence.detail
    assert any("one file did not record the exported nodes at save" in note for note in coarser.notes)


class _MaxBothWays(torch.nn.Module):
    """``max(dim)`` returning values and indices: the exported program names its getitems as a re-export does not."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        values, indices = torch.max(self.a(x).view(3, 4, 2), dim=-1)
        return self.b(values), torch.relu(values), torch.neg(indices)


def test_diff_of_partitions_matches_values_by_the_exported_node_not_the_saved_name(tmp_path: Path) -> None:
    """The saved programs name their getitems anew (engine ones counted in); the record at save names them alike."""
    torch.manual_seed(0)
    model, x = _MaxBothWays().eval(), torch.randn(3, 8)
    paths = [tmp_path / "max_in_engine.pt2", tmp_path / "max_falls_back.pt2"]
    for path, extra in zip(paths, ([], ["aten.max.dim"]), strict=True):
        compiled = trt_inline.reference.compile(
            model, (x,), torch_executed_ops=["aten.relu.default", "aten.neg.default", *extra]
        )
        trt_inline.save(compiled, path, arg_inputs=[x])
    report = trt_inline.diff(paths[0], paths[1], isolate=False)
    assert report.ok and report.divergence is None, report.to_text()
    # the values reach engine 1 of one file from engine 0's output of the other: compared, as one value
    assert report.boundaries[0].boundary == f"getitem (here engine 0 out[0]; {paths[1]}: engine 1 in[0])"
    assert report.boundaries[0].values[0].dtype == "float32"


def test_extract_writes_the_divergent_engine_as_a_repro_that_fails_alone(files: Files, tmp_path: Path) -> None:
    path = _engine_fault(files, engine=1)
    folder = tmp_path / "repro"
    proc = cli("verify", str(path), "--extract", str(folder))
    assert proc.returncode == 1 and f"engine 1 ({files.engines[1]}) extracted" in proc.stdout, proc.stdout
    repro = folder / "repro.pt2"
    program = torch.export.load(repro)
    assert len(engine_calls(program)) == 1 and len(program.graph_signature.user_inputs) == 2  # that engine alone
    alone = trt_inline.verify(repro, isolate=False).to_dict()
    assert not alone["ok"] and alone["divergence"]["where"] == f"engine 0 ({files.engines[1]})", alone
    own = next(row for row in alone["boundaries"] if row["own"])
    assert max(v["max_abs_diff"] for v in own["own"]) > 0.1  # the same fault, on the same recorded inputs
    script = new_interpreter(folder / "repro.py", cwd=REPO)
    assert script.returncode == 1, script.stdout + script.stderr
    assert f"first divergence: engine 0 ({files.engines[1]})" in script.stdout and "sandboxed" in script.stdout
    # A good file: nothing to extract, said so; a folder that cannot be one is refused before the run.
    quiet = trt_inline.verify(files.good, extract=tmp_path / "none", isolate=False)
    assert quiet.ok and "nothing extracted: nothing diverged" in quiet.notes and not (tmp_path / "none").exists()
    (tmp_path / "a_file").write_text("")
    with pytest.raises(VerifyInputError, match="exists and is not a directory"):
        trt_inline.verify(path, extract=tmp_path / "a_file", isolate=False)


class _ScaledSkip(torch.nn.Module):
    """Engine, then a fallback region reading that engine's output, the program input and a buffer, then engine."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)) * self.scale + x)


def test_extract_writes_a_diverging_fallback_region_as_a_repro_that_fails_alone(tmp_path: Path) -> None:
    torch.manual_seed(5)
    x = torch.randn(3, 8)
    fallback = ["aten.relu.default", "aten.mul.Tensor", "aten.add.Tensor"]
    compiled = trt_inline.reference.compile(_ScaledSkip().eval(), (x,), torch_executed_ops=fallback)
    good = tmp_path / "good.pt2"
    trt_inline.save(compiled, good, arg_inputs=[x], embed_reference="boundaries")
    program = torch.export.load(good)
    assert len(engine_calls(program)) == 2
    (mul,) = [n for n in program.graph.nodes if n.target is torch.ops.aten.mul.Tensor]
    mul.target = torch.ops.aten.div.Tensor  # the region between the engines now divides by the buffer
    program.graph_module.recompile()
    fault = tmp_path / "fault.pt2"
    torch.export.save(program, fault, extra_files={REFERENCE_IO_FILE: reference_io_text(good)})

    folder = tmp_path / "repro"
    proc = cli("verify", str(fault), "--extract", str(folder))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "first divergence: fallback region relu, mul, add (feeding engine 1 in[0])" in proc.stdout, proc.stdout
    assert "fallback region relu, mul, add extracted with its recorded inputs and outputs" in proc.stdout
    repro = torch.export.load(folder / "repro.pt2")  # that region alone: its ops, reading x and engine 0's output
    assert not engine_calls(repro)
    ops = [n.target for n in repro.graph.nodes if n.op == "call_function"]
    assert ops == [torch.ops.aten.relu.default, torch.ops.aten.div.Tensor, torch.ops.aten.add.Tensor], ops
    assert len(repro.graph_signature.user_inputs) == 2 and len(repro.graph_signature.inputs_to_buffers) == 1
    # The same error as at the boundary it feeds in the whole file, in a fresh sandboxed process.
    whole = trt_inline.verify(fault, isolate=False).to_dict()
    # (the engines' submodule names depend on the torch: from 2.9 an input-guard fallback comes first)
    fed = next(r for r in whole["boundaries"] if re.match(r"engine 1 \(\w+\) inputs$", r["boundary"]))
    alone = trt_inline.verify(folder / "repro.pt2").to_dict()
    assert not alone["ok"] and alone["outputs"][0]["max_abs_diff"] == fed["values"][0]["max_abs_diff"] > 0.1
    script = new_interpreter(folder / "repro.py", cwd=REPO)
    assert script.returncode == 1 and "DIFF output 0" in script.stdout, script.stdout + script.stderr
    # The good file's region, extracted by hand the same way, agrees with what was recorded.
    module = trt_inline.load(good).module()
    recorded = decode_reference_io(reference_io_text(good))
    assert recorded.boundaries is not None
    archive = region_repro(module, (1, 0), recorded.boundaries, [x], recorded.outputs)
    (tmp_path / "region.pt2").write_bytes(archive)
    assert trt_inline.verify(tmp_path / "region.pt2", isolate=False).ok


def test_drill_down_inside_a_reference_engine(files: Files, tmp_path: Path) -> None:
    # A weight moved in the payload: every op agrees with its own float64 run, so the weights are to blame.
    report = trt_inline.verify(_engine_fault(files, engine=1), isolate=False)
    assert report.divergence is not None and report.divergence.kind == "engine"
    assert report.divergence.op_drill is not None and report.divergence.op_drill.step is None
    assert "the program or its weights differ from the reference's" in report.divergence.op_drill.summary

    # Half precision that overflows: the first op past its tolerance against itself in float64 is named.
    x = torch.full((2, 64), 2.0, dtype=torch.float16)  # 64 * 600 * 2 = 76800 > 65504: inf in float16
    path = tmp_path / "wide.pt2"
    trt_inline.save(trt_inline.reference.compile(HalfOverflow().eval(), (x,), torch_executed_ops=["aten.relu.default"]),
                    path, arg_inputs=[x])  # fmt: skip
    module = trt_inline.load(path).module()
    engine = next(n for n in module.graph.nodes if n.target is torch.ops.trt_inline.execute_engine.default)
    payload, text = getattr(module, str(engine.args[1].target)), engine.args[2]
    inside = drill_program(load_program(text), payload, [x])
    assert inside.op == "aten::addmm.default", inside
    assert "Inf where the reference is finite in float16" in inside.summary, inside

    # The same region rebuilt as one engine per step (how the GPU suite looks inside a TensorRT engine).
    region = torch.export.export(HalfOverflow().eval(), (x,)).run_decompositions().module()
    rebuilt = rebuild_drill_down(region, [x], lambda step, inputs: trt_inline.reference.compile(step, inputs))
    assert "step 1 (addmm: aten.addmm.default) is the first whose engine differs" in rebuilt, rebuilt
    assert "Inf where the reference is finite in float16" in rebuilt
    small = torch.full((2, 64), 0.01, dtype=torch.float16)
    rebuilt = rebuild_drill_down(region, [small], lambda step, inputs: trt_inline.reference.compile(step, inputs))
    assert "rebuilt as 4 engines of one step each, every step agrees" in rebuilt, rebuilt

    # A cast inside the region: the float64 run does not follow it down, so the cast itself is named.
    class CastDown(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu((x * 40000.0).half()) + 1.0

    wide = torch.full((2, 4), 2.0)
    region = torch.export.export(CastDown(), (wide,)).run_decompositions().module()
    rebuilt = rebuild_drill_down(region, [wide], lambda step, inputs: trt_inline.reference.compile(step, inputs))
    assert "step 1 (_to_copy: aten._to_copy.default) is the first" in rebuilt, rebuilt
