"""The reference backend's reduced precision: engines that compute as an fp16/bf16/TF32 TensorRT build does.

Each test first finds the roundings in the engines' own programs (the structure), then compares numbers: what
an fp16 build loses where fp32 does not, what excluding a module restores, and that the saved file, loaded in a
fresh process, computes exactly what the compiled module did. The settings are read as the release this torch
pairs with reads them (trt-inline's own pipeline emulates it): ``autocast_excluded_nodes`` matched against
module paths, ``enable_autocast=True`` alone an fp32 build, the autocast threshold measured on calibration data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.models import Fp16Overflow
from support.pairs import autocast_skip, fp16_settings
from support.processes import load_in_fresh_process
from torch import nn

import trt_inline
from trt_inline.errors import CompileError
from trt_inline.reference.engine import ReferenceEngine

OWN = {"pipeline": "own"}
needs_autocast = pytest.mark.skipif(autocast_skip() is not None, reason=autocast_skip() or "")


class Benign(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def _model(cls: type[nn.Module]) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return cls().eval(), torch.randn(8, 64 if cls is Benign else 16)


def _casts(compiled: torch.fx.GraphModule) -> dict[str, int]:
    """How many steps of each engine program cast to each dtype (``_to_copy`` steps), summed over the engines."""
    found: dict[str, int] = {}
    for module in compiled.modules():
        if isinstance(module, ReferenceEngine):
            for step in json.loads(module.program)["steps"]:
                if step["target"] == "aten::_to_copy.default":
                    dtype = step["kwargs"]["dtype"]["dtype"]
                    found[dtype] = found.get(dtype, 0) + 1
    return found


def _error(compiled: torch.fx.GraphModule, model: nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float((compiled(x) - model(x)).abs().max())


def test_by_default_the_engines_compute_exactly_what_pytorch_does() -> None:
    model, x = _model(Fp16Overflow)
    compiled = trt_inline.reference.compile(model, (x,), **OWN)
    assert _casts(compiled) == {} and any(isinstance(m, ReferenceEngine) for m in compiled.modules())
    assert _error(compiled, model, x) == 0.0
    assert compiled.trt_inline_pipeline.startswith("trt-inline's own partitioner") and "pipeline='own'" in (
        compiled.trt_inline_pipeline
    )


def test_an_fp16_build_overflows_where_fp32_does_not() -> None:
    model, x = _model(Fp16Overflow)
    with torch.no_grad():
        assert model(x).isfinite().all()
    fp16 = trt_inline.reference.compile(model, (x,), **fp16_settings(), **OWN)
    casts = _casts(fp16)
    assert casts.get("float16", 0) >= 6 and casts.get("float32", 0) == casts["float16"], casts
    assert all(node.low for node in fp16.trt_inline_lowered if node.floating and node.operator), [
        n for n in fp16.trt_inline_lowered if not n.low
    ]
    with torch.no_grad():
        assert not fp16(x).isfinite().all()


@needs_autocast
def test_autocast_without_a_low_type_is_an_fp32_build_as_in_the_release() -> None:
    """``enable_autocast=True`` alone: ``autocast_low_precision_type`` defaults to None, "no low precision"."""
    model, x = _model(Fp16Overflow)
    compiled = trt_inline.reference.compile(model, (x,), enable_autocast=True, **OWN)
    assert not any(node.low for node in compiled.trt_inline_lowered)
    assert _casts(compiled).get("float16", 0) == 0 and _error(compiled, model, x) < 1e-2


@needs_autocast
def test_excluding_the_overflowing_module_by_its_path_restores_the_output() -> None:
    """The overflow is inside the submodule ``spot``: a pattern on its module path keeps its nodes in fp32, as the
    release's rule matches it; a pattern on a node name (``^div$``) matches nothing, as in the release."""
    model, x = _model(Fp16Overflow)
    fixed = trt_inline.reference.compile(
        model, (x,), **fp16_settings(), autocast_excluded_nodes=["^spot$"], disable_tf32=True, **OWN
    )
    kept = [node for node in fixed.trt_inline_lowered if node.operator and not node.low]
    assert kept and {node.module for node in kept} == {"spot"}, kept
    assert _casts(fixed).get("float16", 0) > 0  # (the rest of the model still in fp16)
    error = _error(fixed, model, x)
    assert 0 < error < 1e-2, error
    by_name = trt_inline.reference.compile(model, (x,), **fp16_settings(), autocast_excluded_nodes=["^div$"], **OWN)
    assert all(node.low for node in by_name.trt_inline_lowered if node.operator and node.floating)
    with pytest.raises(ValueError, match="take effect with enable_autocast"):
        trt_inline.reference.compile(model, (x,), autocast_excluded_nodes=["spot"], **OWN)


@needs_autocast
def test_autocast_rules_read_calibration_data_as_the_release_does() -> None:
    """The threshold holds a node's inputs and its users' outputs, and the depth of reduction a convolution's or
    matmul's, on ``autocast_calibration_dataloader``'s batches; without them neither rule applies."""
    from trt_inline.reference import precision

    model, x = _model(Benign)
    flat = torch.export.export(model, (x,)).run_decompositions().module()
    rules = precision.PrecisionSettings.from_compile_settings(
        enable_autocast=True, autocast_low_precision_type=torch.float16, autocast_max_output_threshold=0.5,
        autocast_excluded_ops=["torch.ops.aten.tanh.default"],
    )  # fmt: skip
    low, kept = precision.low_precision_nodes(flat.graph, rules, {})
    assert kept == {"tanh": "autocast_excluded_ops"} and "addmm" in low, kept  # (no calibration: no threshold)
    calibrated = precision.calibrate(flat, [(x,), (x * 2,)])
    low, kept = precision.low_precision_nodes(flat.graph, rules, calibrated)
    over = {name for name, value in calibrated.items() if value.numel() and float(value.max()) > 0.5}
    assert over and all(reason.startswith(("autocast_max_output_threshold", "autocast_excluded_ops"))
                        for reason in kept.values()), kept  # fmt: skip
    for name, reason in kept.items():
        if reason.startswith("autocast_max_output_threshold"):
            node = next(n for n in flat.graph.nodes if n.name == name)
            assert {n.name for n in (*node.all_input_nodes, *node.users)} & over, (name, reason)
    matmul = torch.export.export(MatMul().eval(), (torch.randn(8, 64),)).run_decompositions().module()
    deep = precision.PrecisionSettings.from_compile_settings(
        enable_autocast=True, autocast_low_precision_type=torch.float16, autocast_max_depth_of_reduction=32
    )
    _, depth_kept = precision.low_precision_nodes(matmul.graph, deep, {})
    assert depth_kept == {}  # (the release reads the shapes from the calibration data)
    _, depth_kept = precision.low_precision_nodes(matmul.graph, deep, precision.calibrate(matmul, [torch.randn(8, 64)]))
    assert list(depth_kept.values()) == ["autocast_max_depth_of_reduction (it reduces over 64 values)"], depth_kept


def _tf32(value: torch.Tensor) -> torch.Tensor:
    """Ten mantissa bits, rounded to nearest (finite values)."""
    return ((value.view(torch.int32) + (1 << 12)) & -(1 << 13)).view(torch.float32)


class MatMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w)


def test_tf32_rounds_matmul_inputs_to_ten_mantissa_bits() -> None:
    torch.manual_seed(0)
    model, x = MatMul().eval(), torch.randn(8, 64)
    tf32 = trt_inline.reference.compile(model, (x,), disable_tf32=False, **OWN)
    engines = [m for m in tf32.modules() if isinstance(m, ReferenceEngine)]
    steps = [s["target"] for e in engines for s in json.loads(e.program)["steps"]]
    assert steps.count("aten::bitwise_and.Scalar") == 2, steps  # (both inputs of the one matmul)
    assert not torch.equal(_tf32(x), x) and (_tf32(x) - x).abs().max() <= x.abs().max() * 2.0**-11
    with torch.no_grad():
        assert torch.equal(tf32(x), torch.tanh(_tf32(x) @ _tf32(model.w)))
        assert not torch.equal(tf32(x), model(x))
    benign, y = _model(Benign)
    assert 0 < _error(trt_inline.reference.compile(benign, (y,), disable_tf32=False, **OWN), benign, y) < 1e-2


@needs_autocast
def test_bf16_loses_more_than_fp16_on_a_benign_model() -> None:
    model, x = _model(Benign)
    fp16 = trt_inline.reference.compile(model, (x,), **fp16_settings(), disable_tf32=True, **OWN)
    bf16 = trt_inline.reference.compile(
        model, (x,), enable_autocast=True, autocast_low_precision_type=torch.bfloat16, disable_tf32=True, **OWN
    )
    assert "bfloat16" in _casts(bf16) and "bfloat16" not in _casts(fp16)
    assert 0 < _error(fp16, model, x) < _error(bf16, model, x) < 0.1


def test_settings_the_paired_release_does_not_take_are_refused_naming_it() -> None:
    """trt-inline's own pipeline emulates the release this torch pairs with: what it would ignore is refused."""
    model, x = _model(Benign)
    if autocast_skip() is None:  # (2.10+: enabled_precisions is ignored, or needs use_explicit_typing=False)
        with pytest.raises(CompileError, match=r"Torch-TensorRT 2\.\d+\.\d+ .* enabled_precisions"):
            trt_inline.reference.compile(model, (x,), enabled_precisions={torch.float16}, **OWN)
    else:
        with pytest.raises(CompileError, match=r"has no enable_autocast.*rule-based autocast is 2\.10\+"):
            trt_inline.reference.compile(model, (x,), enable_autocast=True, **OWN)
    with pytest.raises(CompileError, match="does not emulate use_fast_partitioner"):
        trt_inline.reference.compile(model, (x,), use_fast_partitioner=False, **OWN)


def test_the_saved_file_computes_what_the_reduced_precision_build_did(tmp_path: Path) -> None:
    model, x = _model(Benign)
    compiled = trt_inline.reference.compile(model, (x,), **fp16_settings(), **OWN)
    assert _casts(compiled).get("float16", 0) > 0
    path = tmp_path / "fp16.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,))
    loaded = load_in_fresh_process(tmp_path, [path], [x])[str(path)]["outputs"]
    with torch.no_grad():
        here = compiled(x)
    assert torch.equal(loaded[0], here) and not torch.equal(here, model(x))
    assert trt_inline.verify(path).status == "PASS"
