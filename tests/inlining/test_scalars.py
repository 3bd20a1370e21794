"""Scalars crossing engine boundaries under dynamic shapes: compile -> save (both retrace values) -> fresh load.

Each model's partition must really have the crossing (checked in ``meta``), the
saved graph must carry the conversions (``scalar_tensor`` in front of an engine,
``item`` after it), and the loaded program must match the in-memory module
bitwise at the low end, the middle and the high end of the declared range, and
pass ``trt-inline verify``.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import pytest
import torch
from support import pairs
from support.commands import cli
from support.models import ScalarCase, derived_dim_case, derived_scalars_skip, scalar_cases
from support.processes import load_runs_in_fresh_process
from support.scalars import compile_case, scalar_crossings
from support.values import as_list, max_abs_diff

import trt_inline
from trt_inline import compat, engines, reference

aten = torch.ops.aten
CASES = scalar_cases()


def _conversions(program: torch.export.ExportedProgram) -> dict[str, int]:
    """How many scalars enter engines as 0-d tensors, and how many engine outputs are read back with item()."""
    into = sum(
        1
        for node in program.graph.nodes
        if engines.is_engine_call(node)
        for arg in engines.engine_inputs(node)
        if isinstance(arg, torch.fx.Node) and arg.target is aten.scalar_tensor.default
    )
    out_of = sum(
        1
        for node in program.graph.nodes
        if node.target is aten.item.default
        and node.args[0].target is operator.getitem
        and engines.is_engine_call(node.args[0].args[0])
    )
    return {"input": into, "output": out_of}


@pytest.mark.parametrize("case", [*CASES, derived_dim_case()], ids=[*(c.name for c in CASES), "derived_dim"])
def test_scalar_crossing_roundtrips_bitwise(tmp_path: Path, case: ScalarCase) -> None:
    if case.name == "derived_dim" and derived_scalars_skip() is not None:
        pytest.skip(str(derived_scalars_skip()))
    compiled = compile_case(case)
    crossings = scalar_crossings(compiled)
    assert [c for c in crossings if c[0] == case.crossing], f"no scalar {case.crossing} crossing: {crossings}"
    if case.crossing == "input":
        assert any(kind == "input" and position == 0 for kind, _, position in crossings), crossings

    if case.crossing == "output":
        # The scalar an engine returns is rows - 1: after item(), the flat graph restates that for a tracer.
        flat = trt_inline.transform(compiled)
        checks = [n for n in flat.graph.nodes if n.target is aten._assert_scalar.default]
        assert checks and all(n.args[0].target is operator.eq for n in checks), flat.code
        assert checks[0].args[0].args[0].target is aten.item.default

    paths = []
    for retrace in (True, False):
        path = tmp_path / f"{case.name}_retrace_{retrace}.pt2"
        program = trt_inline.save(
            compiled, path, arg_inputs=case.inputs, dynamic_shapes=case.dynamic_shapes, retrace=retrace
        )
        assert _conversions(program)[case.crossing] >= 1, f"retrace={retrace}: the conversion is not in the graph"
        paths.append(path)

    diffs: dict[str, list[float]] = {p.name: [] for p in paths}
    runs = load_runs_in_fresh_process(tmp_path, paths, case.checks)
    for index, inputs in enumerate(case.checks):
        with torch.no_grad():
            expected = as_list(compiled(*inputs))
            eager = as_list(case.model(*inputs))
        assert max_abs_diff(expected, eager) <= 1e-5, "the compiled module itself must match eager PyTorch"
        for path in paths:
            loaded: dict[str, Any] = runs[str(path)][index]
            assert loaded["call_modules"] == []
            diffs[path.name].append(max_abs_diff(loaded["outputs"], expected))
    assert all(d == [0.0, 0.0, 0.0] for d in diffs.values()), diffs

    for path in paths:
        proc = cli("verify", str(path))
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_tensor_only_boundaries_keep_scalars_in_pytorch() -> None:
    """``scalar_boundaries=False``: the same model, no scalar on any engine boundary."""
    case = CASES[0]
    compiled = reference.compile(
        case.model.eval(),
        case.inputs,
        torch_executed_ops=case.torch_executed_ops,
        dynamic_shapes=case.dynamic_shapes,
        scalar_boundaries=False,
    )
    assert scalar_crossings(compiled) == []
    assert any(isinstance(m, reference.ReferenceEngine) for m in compiled.children())
    with torch.no_grad():
        for inputs in case.checks:
            assert max_abs_diff(as_list(compiled(*inputs)), as_list(case.model(*inputs))) <= 1e-5


def test_settled_assertions_are_dropped_where_torch_cannot_serialize_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.6 refuses a comparison whose value is a plain bool: retrace=False drops the restated size there."""

    # Measured on each torch of the matrix: only 2.6 raises.
    assert compat.serializes_settled_conditions() == (pairs.minor(torch.__version__) != (2, 6))

    case = next(c for c in CASES if c.crossing == "output")
    compiled = compile_case(case)
    flat = trt_inline.transform(compiled)
    assert aten._assert_scalar.default in [n.target for n in flat.graph.nodes], "the settled assertion is there"
    monkeypatch.setattr(compat, "serializes_settled_conditions", lambda: False)
    path = tmp_path / "settled.pt2"
    program = trt_inline.save(compiled, path, arg_inputs=case.inputs, dynamic_shapes=case.dynamic_shapes, retrace=False)
    targets = [n.target for n in program.graph.nodes]
    assert aten._assert_scalar.default not in targets and operator.eq not in targets, program.graph_module.code
    assert _conversions(program)["output"] >= 1, "item() after the engine stays"
    runs = load_runs_in_fresh_process(tmp_path, [path], case.checks)[str(path)]
    for inputs, loaded in zip(case.checks, runs, strict=True):
        with torch.no_grad():
            expected = as_list(compiled(*inputs))
        assert max_abs_diff(loaded["outputs"], expected) == 0.0, inputs[0].shape
