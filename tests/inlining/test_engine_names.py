"""Engines named by Torch-TensorRT's newer partitioners: the passes, verify, inspect and per-engine replay.

The global and fast partitioners name an engine ``_run_on_acc_3``; the
hierarchical one puts the backend first (``_run_on_acc_tensorrt_3``), and the
resource partitioner splits an engine into ``_run_on_acc_3_resource_split_0``,
``_run_on_acc_3_resource_split_1`` ... A compiled reference module's engines are
renamed into each form, saved with
boundary data, verified in a fresh sandboxed process, inspected, and replayed
engine by engine after one engine's weight is changed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support.commands import cli
from support.hostile import reference_io_text
from support.models import CrossedHalves

import trt_inline
from trt_inline import engines
from trt_inline.archive import REFERENCE_IO_FILE

ENGINE_OP = torch.ops.trt_inline.execute_engine.default


@pytest.mark.parametrize(
    ("attribute", "is_engine"),
    [
        ("_run_on_acc_0_engine", True),
        ("_run_on_acc_12_engine_1", True),
        ("_run_on_acc_tensorrt_3_engine", True),
        ("_run_on_acc_inductor2_0_engine", True),
        ("_run_on_acc_2_resource_split_1_engine", True),
        ("_run_on_acc_tensorrt_2_resource_split_10_engine_2", True),
        ("_run_on_gpu_0_engine", False),
        ("_run_on_acc__engine", False),
        ("_run_on_acc_0_resource_split_engine", False),
        ("_run_on_acc_0_engine\n", False),  # `$` would have matched before the newline
        ("_run_on_acc_\u0663_engine", False),  # an Arabic-Indic three is a digit to `\d`
        ("_run_on_acc_0_engine.weight", False),
        ("_run_on_acc_tensorrt_engine", False),
    ],
)
def test_engine_attribute_names(attribute: str, is_engine: bool) -> None:
    assert engines.is_engine_attribute(attribute) is is_engine


def _renamed(compiled: torch.fx.GraphModule, names: list[str]) -> torch.fx.GraphModule:
    """Each engine submodule (in graph order) under the next of ``names``; the call nodes follow."""
    calls = [n for n in compiled.graph.nodes if n.op == "call_module" and str(n.target).startswith("_run_on_acc_")]
    assert len(calls) == len(names), [str(n.target) for n in calls]
    for call_node, name in zip(calls, names, strict=True):
        compiled.add_submodule(name, compiled.get_submodule(str(call_node.target)))
        compiled.delete_submodule(str(call_node.target))
        call_node.target = name
    compiled.recompile()
    return compiled


def _hierarchical(compiled: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``_run_on_acc_N`` -> ``_run_on_acc_tensorrt_N``: the hierarchical partitioner puts the backend first."""
    calls = [str(n.target) for n in compiled.graph.nodes if str(n.target).startswith("_run_on_acc_")]
    return _renamed(compiled, [name.replace("_run_on_acc_", "_run_on_acc_tensorrt_") for name in calls])


def _resource_split(compiled: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The names the resource partitioner gives the parts of the engines it splits.

    The first two engines are named as the two parts of one split engine, the
    third as the only part of another (the numbering reads nothing else).
    """
    return _renamed(
        compiled, ["_run_on_acc_0_resource_split_0", "_run_on_acc_0_resource_split_1", "_run_on_acc_4_resource_split_0"]
    )


@dataclass
class Saved:
    form: str
    x: torch.Tensor
    compiled: torch.fx.GraphModule
    path: Path
    engine_names: list[str]


FORMS: dict[str, Callable[[torch.fx.GraphModule], torch.fx.GraphModule]] = {
    "hierarchical": _hierarchical,
    "resource split": _resource_split,
}


@pytest.fixture(scope="module", params=sorted(FORMS))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Saved:
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    compiled = trt_inline.reference.compile(CrossedHalves().eval(), (x,), torch_executed_ops=["aten.relu.default"])
    compiled = FORMS[request.param](compiled)
    names = [n for n, _ in compiled.named_children() if n.startswith("_run_on_acc_")]
    pattern = {"hierarchical": r"_run_on_acc_tensorrt_\d+", "resource split": r"_run_on_acc_\d+_resource_split_\d+"}
    assert len(names) == 3 and all(re.fullmatch(pattern[request.param], n) for n in names), names
    path = tmp_path_factory.mktemp("engine_names") / f"{request.param.replace(' ', '_')}.pt2"
    trt_inline.save(compiled, path, arg_inputs=[x], embed_reference="boundaries")
    return Saved(request.param, x, compiled, path, names)


def test_the_flat_graph_keeps_each_engine_under_its_submodule_name(saved: Saved) -> None:
    program = torch.export.load(saved.path)
    calls = [n for n in program.graph.nodes if n.target is ENGINE_OP]
    constants = [s.target for s in program.graph_signature.input_specs if s.arg.name in {c.args[1].name for c in calls}]
    assert constants == [f"{name}_engine" for name in saved.engine_names], constants
    assert all(engines.is_engine_attribute(str(target)) for target in constants)
    # Loaded in this process it computes what the compiled module does, bit for bit.
    assert torch.equal(program.module()(saved.x), saved.compiled(saved.x))


def test_verify_in_a_fresh_process_and_inspect_name_the_engines(saved: Saved) -> None:
    proc = cli("verify", str(saved.path), "--per-engine", process=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"PASS {saved.path}"), proc.stdout
    for index, name in enumerate(saved.engine_names):
        assert f"engine {index} ({name})" in proc.stdout, proc.stdout
    inspected = cli("inspect", str(saved.path))
    assert inspected.returncode == 0, inspected.stderr
    for index, name in enumerate(saved.engine_names):
        row = rf"^engine {index} +execute_engine\S* +\S+ \({name}\)$"
        assert re.search(row, inspected.stdout, re.M), inspected.stdout


def test_per_engine_replay_names_the_changed_engine(saved: Saved, tmp_path: Path) -> None:
    program = torch.export.load(saved.path)
    call = [n for n in program.graph.nodes if n.target is ENGINE_OP][1]
    weight = json.loads(call.args[2])["weights"][0]
    constant = next(s.target for s in program.graph_signature.input_specs if s.arg.name == call.args[1].name)
    assert constant == f"{saved.engine_names[1]}_engine"
    payload = program.constants[constant]
    payload[weight["offset"] : weight["offset"] + weight["nbytes"]].view(torch.float32).add_(0.05)
    faulty = tmp_path / "fault.pt2"
    torch.export.save(program, faulty, extra_files={REFERENCE_IO_FILE: reference_io_text(saved.path)})
    proc = cli("verify", str(faulty), "--per-engine")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"first divergence: engine 1 ({saved.engine_names[1]})\n" in proc.stdout, proc.stdout
