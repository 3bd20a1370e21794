"""compile (reference backend) -> save (both retrace values) -> load in a fresh process -> compare."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from support.models import RELU, ConvBnRelu, EdgesFallBack, MultiOutputBothSides, RunningCache, TinyResNet
from support.processes import load_runs_in_fresh_process
from support.values import as_list, max_abs_diff

import trt_inline
from trt_inline import reference
from trt_inline.engines import is_fallback_call

EAGER_ATOL = 1e-4


def _roundtrip(
    tmp_path: Path,
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    *,
    torch_executed_ops: Sequence[Any],
    dynamic_shapes: Any = None,
    check_inputs: Sequence[Sequence[torch.Tensor]] = (),
) -> torch.fx.GraphModule:
    model = model.eval()
    compiled = reference.compile(model, inputs, torch_executed_ops=torch_executed_ops, dynamic_shapes=dynamic_shapes)
    kinds = {type(m).__name__ for _, m in compiled.named_children()}
    assert "ReferenceEngine" in kinds and "GraphModule" in kinds, "scenario must mix engines and fallbacks"

    paths = []
    for retrace in (True, False):
        path = tmp_path / f"model_retrace_{retrace}.pt2"
        trt_inline.save(compiled, path, arg_inputs=inputs, dynamic_shapes=dynamic_shapes, retrace=retrace)
        paths.append(path)

    input_sets = [inputs, *check_inputs]
    runs = load_runs_in_fresh_process(tmp_path, paths, input_sets)
    for index, run_inputs in enumerate(input_sets):
        with torch.no_grad():
            expected = as_list(compiled(*run_inputs))
            eager = as_list(model(*run_inputs))
        assert max_abs_diff(expected, eager) <= EAGER_ATOL
        for path in paths:
            loaded = runs[str(path)][index]
            assert loaded["call_modules"] == [], f"{path.name}: call_module survived"
            assert max_abs_diff(loaded["outputs"], expected) == 0.0, path.name
            assert max_abs_diff(loaded["outputs"], eager) <= EAGER_ATOL, path.name
    return compiled


def _name_hazards(compiled: torch.fx.GraphModule) -> list[tuple[str, str, str]]:
    """Fallback inputs whose placeholder name belongs to a *different* parent node.

    Computed on the graph the stock exporter's second pass sees (after engine
    inlining). Each hit is a place where name matching wires the wrong tensor.
    """
    gm = trt_inline.inline_trt_modules(copy.deepcopy(compiled))
    by_name = {n.name: n for n in gm.graph.nodes}
    hazards = []
    for call_node in gm.graph.nodes:
        if not is_fallback_call(gm, call_node):
            continue
        placeholders = [n for n in gm.get_submodule(str(call_node.target)).graph.nodes if n.op == "placeholder"]
        for placeholder, arg in zip(placeholders, call_node.args, strict=False):
            namesake = by_name.get(placeholder.name)
            if namesake is not None and namesake is not arg:
                hazards.append((str(call_node.target), placeholder.name, arg.name))
    return hazards


def test_seed_scenario_relu_fallback(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 8, 8)
    compiled = _roundtrip(tmp_path, ConvBnRelu(), (x,), torch_executed_ops=[RELU])
    # The regression keeps its bite only while the graph really has the hazard.
    hazards = _name_hazards(compiled)
    assert any(placeholder == "getitem" for _, placeholder, _ in hazards), hazards
    engines = [n for n, m in compiled.named_children() if isinstance(m, reference.ReferenceEngine)]
    assert any(len(compiled.get_submodule(n).program) and compiled.get_submodule(n).num_outputs > 1 for n in engines)


def test_save_leaves_a_buffer_the_module_updates_as_it_found_it(tmp_path: Path) -> None:
    """The save's sample run (reference I/O, boundaries) puts back a buffer the forward writes (a cache).

    The stock save runs nothing: a save must neither advance the module's state
    by a call nor write the advanced state into the file.
    """
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    compiled = reference.compile(RunningCache().eval(), (x,), torch_executed_ops=[RELU])
    (cache_name,) = [name for name, _ in compiled.named_buffers() if name.endswith("cache")]
    initial = compiled.get_buffer(cache_name).clone()
    with torch.no_grad():
        compiled(x)  # a call from the initial state moves the cache: the save must not make one
    assert not torch.equal(compiled.get_buffer(cache_name), initial)
    compiled.get_buffer(cache_name).copy_(initial)
    path = tmp_path / "cache.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,), embed_reference="boundaries")
    assert torch.equal(compiled.get_buffer(cache_name), initial)
    saved = {k: v for k, v in torch.export.load(path).state_dict.items() if k.endswith("cache")}
    assert len(saved) == 1 and torch.equal(next(iter(saved.values())), initial), saved
    assert trt_inline.verify(path, allow_ops=["aten::copy_"]).ok  # the cache update writes its argument


def test_resnet_residual_add_falls_back(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 8, 8)
    _roundtrip(tmp_path, TinyResNet(), (x,), torch_executed_ops=["torch.ops.aten.add.Tensor"])


def test_first_and_last_op_fall_back(tmp_path: Path) -> None:
    x = torch.randn(1, 3, 6, 6)
    compiled = _roundtrip(
        tmp_path,
        EdgesFallBack(),
        (x,),
        torch_executed_ops=[torch.ops.aten.relu.default, "aten.sigmoid.default"],
    )
    nodes = [n for n in compiled.graph.nodes if n.op == "call_module"]
    placeholder = next(n for n in compiled.graph.nodes if n.op == "placeholder")
    engine_calls = [n for n in nodes if isinstance(compiled.get_submodule(str(n.target)), reference.ReferenceEngine)]
    assert any(placeholder in n.args for n in engine_calls), "an engine must read the graph input directly"
    fallback_calls = [n for n in nodes if is_fallback_call(compiled, n)]
    assert "relu" in str(compiled.get_submodule(str(fallback_calls[0].target)).graph)
    assert "sigmoid" in str(compiled.get_submodule(str(fallback_calls[-1].target)).graph)


def test_convolution_falls_back_with_parameters(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 8, 8)
    compiled = _roundtrip(tmp_path, ConvBnRelu(), (x,), torch_executed_ops=["aten.convolution.default"])
    fallback_params = [
        name
        for name, module in compiled.named_children()
        if isinstance(module, torch.fx.GraphModule) and any(True for _ in module.parameters())
    ]
    assert fallback_params, "fallback modules must own the conv weights"


def test_multi_output_ops_on_both_sides(tmp_path: Path) -> None:
    x = torch.randn(4, 16)
    compiled = _roundtrip(tmp_path, MultiOutputBothSides(), (x,), torch_executed_ops=["aten.topk.default"])
    multi_fallbacks = [n for n in compiled.graph.nodes if is_fallback_call(compiled, n) and len(n.users) > 1]
    assert multi_fallbacks, "topk must leave a multi-output fallback"


def test_dynamic_batch(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch", min=1, max=16)
    x = torch.randn(4, 3, 8, 8)
    _roundtrip(
        tmp_path,
        ConvBnRelu(),
        (x,),
        torch_executed_ops=[RELU],
        dynamic_shapes=({0: batch},),
        check_inputs=[(torch.randn(1, 3, 8, 8),), (torch.randn(7, 3, 8, 8),)],
    )


def test_saved_graph_lints_and_has_no_submodule_calls(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 8, 8)
    compiled = reference.compile(ConvBnRelu().eval(), (x,), torch_executed_ops=[RELU])
    for retrace in (True, False):
        program = trt_inline.save(compiled, tmp_path / f"m{retrace}.pt2", arg_inputs=(x,), retrace=retrace)
        program.graph_module.graph.lint()
        assert not [n for n in program.graph.nodes if n.op == "call_module"]
        engines = [n for n in program.graph.nodes if n.target is torch.ops.trt_inline.execute_engine.default]
        assert len(engines) == 4


@pytest.mark.parametrize("retrace", [True, False])
def test_save_is_deterministic(tmp_path: Path, retrace: bool) -> None:
    x = torch.randn(2, 3, 8, 8)
    compiled = reference.compile(ConvBnRelu().eval(), (x,), torch_executed_ops=[RELU])
    first = trt_inline.save(compiled, tmp_path / "a.pt2", arg_inputs=(x,), retrace=retrace)
    second = trt_inline.save(compiled, tmp_path / "b.pt2", arg_inputs=(x,), retrace=retrace)
    assert first.graph_module.code == second.graph_module.code
    assert str(first.graph_signature) == str(second.graph_signature)
