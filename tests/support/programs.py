"""Saved programs as the tests hold them: the seed scenario's files, a program through save and load, bitwise
against its compiled module, its engine calls and their labels, the scalars crossing its engine boundaries."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import trt_inline
from trt_inline.inlining.passes import produced_value
from trt_inline.inlining.scalars import is_scalar


@dataclass
class SavedSeed:
    """The seed scenario compiled once and saved with (``good``) and without (``bare``) reference I/O."""

    root: Path
    x: torch.Tensor
    compiled: torch.fx.GraphModule
    good: Path
    bare: Path


def count_scalar_crossings(compiled: torch.fx.GraphModule) -> int:
    """How many scalars an engine of ``compiled`` takes or returns."""
    return sum(
        1
        for node in compiled.graph.nodes
        if trt_inline.engines.is_accelerated_call(compiled, node)
        for value in [*node.meta["val"], *(produced_value(compiled, arg) for arg in node.args)]
        if is_scalar(value)
    )


def saved_and_loaded(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` through ``torch.export.save`` and ``load`` in memory: linted, and no submodule call left."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    loaded.graph_module.graph.lint()
    assert [n.name for n in loaded.graph.nodes if n.op == "call_module"] == []
    return loaded


def assert_loads_bitwise(
    compiled: torch.fx.GraphModule,
    program: torch.export.ExportedProgram,
    input_sets: Sequence[Sequence[torch.Tensor]],
    *,
    equal_nan: bool = False,
) -> torch.export.ExportedProgram:
    """``program`` through :func:`saved_and_loaded`: on each of ``input_sets`` its outputs are ``compiled``'s,
    bitwise (NaN equal to NaN with ``equal_nan``). Returns the loaded program."""
    loaded = saved_and_loaded(program)
    run = loaded.module()
    for inputs in input_sets:
        with torch.no_grad():
            expected, actual = compiled(*inputs), run(*inputs)
        assert len(actual) == len(expected)
        for got, want in zip(actual, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=equal_nan)
    return loaded


def engine_calls(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The calls of reference engines in ``program``'s graph, in graph order."""
    return [node for node in program.graph.nodes if node.target is torch.ops.trt_inline.execute_engine.default]


def engine_label(program: torch.export.ExportedProgram, index: int = 0) -> str:
    """The submodule engine ``index``'s call names by its engine attribute (``_run_on_acc_5`` of
    ``_run_on_acc_5_engine``), as reports name the engine."""
    lifted = {spec.arg.name: str(spec.target) for spec in program.graph_signature.input_specs if spec.target}
    label = trt_inline.engines.engine_submodule_name(engine_calls(program)[index], lifted)
    assert label is not None and label.startswith("_run_on_acc_"), label
    return label
