"""The reference backend's reduced precision: engines that compute as an fp16/bf16/TF32 TensorRT build does.

Each test first finds the roundings in the engines' own programs (the structure), then compares numbers: what
an fp16 build loses where fp32 does not, what excluding nodes restores, and that the saved file, loaded in a
fresh process, computes exactly what the compiled module did.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import load_in_fresh_process
from models import Fp16Overflow
from torch import nn

import trt_inline
from trt_inline.reference.engine import ReferenceEngine


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
    compiled = trt_inline.reference.compile(model, (x,))
    assert _casts(compiled) == {} and any(isinstance(m, ReferenceEngine) for m in compiled.modules())
    assert _error(compiled, model, x) == 0.0


def test_an_fp16_build_overflows_where_fp32_does_not() -> None:
    model, x = _model(Fp16Overflow)
    with torch.no_grad():
        assert model(x).isfinite().all()
    fp16 = trt_inline.reference.compile(model, (x,), enabled_precisions={torch.float16, torch.float32})
    casts = _casts(fp16)
    assert casts.get("float16", 0) >= 6 and casts.get("float32", 0) == casts["float16"], casts
    with torch.no_grad():
        assert not fp16(x).isfinite().all()


def test_excluding_the_overflowing_nodes_restores_the_output() -> None:
    """Autocast's rule on the example inputs keeps the large activation in fp32, but its consumer still reads it
    in fp16 (the cast at a precision boundary overflows): excluding both nodes restores the output."""
    model, x = _model(Fp16Overflow)
    automatic = trt_inline.reference.compile(model, (x,), enable_autocast=True)
    with torch.no_grad():
        assert not automatic(x).isfinite().all()
    fixed = trt_inline.reference.compile(
        model, (x,), enable_autocast=True, autocast_excluded_nodes=["^mul_1$", "^div$"], disable_tf32=True
    )
    assert _casts(fixed).get("float16", 0) > 0  # (the rest of the model still in fp16)
    error = _error(fixed, model, x)
    assert 0 < error < 1e-2, error
    with pytest.raises(ValueError, match="take effect with enable_autocast"):
        trt_inline.reference.compile(model, (x,), autocast_excluded_nodes=["div"])


def test_autocast_rules_keep_large_outputs_and_deep_reductions_in_fp32() -> None:
    from trt_inline.reference import precision

    model, x = _model(Benign)
    exported = torch.export.export(model, (x,)).run_decompositions()
    flat = exported.module()
    settings = precision.PrecisionSettings.from_compile_settings(
        enable_autocast=True, autocast_max_output_threshold=None, autocast_max_depth_of_reduction=32,
        autocast_excluded_ops=["aten.tanh.default"],
    )  # fmt: skip
    low, kept = precision.low_precision_nodes(flat.graph, settings, {})
    assert kept["addmm"].startswith("autocast_max_depth_of_reduction (it reduces over 64 values)"), kept
    assert kept["tanh"] == "autocast_excluded_ops" and "addmm_1" in kept
    assert not low & set(kept) and low  # (the rest run in fp16)
    calibrated = precision.calibrate(flat, [x])
    threshold = precision.PrecisionSettings.from_compile_settings(
        enable_autocast=True, autocast_max_output_threshold=0.5
    )
    _, threshold_kept = precision.low_precision_nodes(flat.graph, threshold, calibrated)
    assert all(calibrated[name] > 0.5 for name in threshold_kept), (threshold_kept, calibrated)
    assert threshold_kept and all(
        reason.startswith("autocast_max_output_threshold") for reason in threshold_kept.values()
    )


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
    tf32 = trt_inline.reference.compile(model, (x,), disable_tf32=False)
    engines = [m for m in tf32.modules() if isinstance(m, ReferenceEngine)]
    steps = [s["target"] for e in engines for s in json.loads(e.program)["steps"]]
    assert steps.count("aten::bitwise_and.Scalar") == 2, steps  # (both inputs of the one matmul)
    assert not torch.equal(_tf32(x), x) and (_tf32(x) - x).abs().max() <= x.abs().max() * 2.0**-11
    with torch.no_grad():
        assert torch.equal(tf32(x), torch.tanh(_tf32(x) @ _tf32(model.w)))
        assert not torch.equal(tf32(x), model(x))
    benign, y = _model(Benign)
    assert 0 < _error(trt_inline.reference.compile(benign, (y,), disable_tf32=False), benign, y) < 1e-2


def test_bf16_loses_more_than_fp16_on_a_benign_model() -> None:
    model, x = _model(Benign)
    fp16 = trt_inline.reference.compile(model, (x,), enable_autocast=True, disable_tf32=True)
    bf16 = trt_inline.reference.compile(
        model, (x,), enable_autocast=True, autocast_low_precision_type=torch.bfloat16, disable_tf32=True
    )
    assert "bfloat16" in _casts(bf16) and "bfloat16" not in _casts(fp16)
    assert 0 < _error(fp16, model, x) < _error(bf16, model, x) < 0.1


def test_the_saved_file_computes_what_the_reduced_precision_build_did(tmp_path: Path) -> None:
    model, x = _model(Fp16Overflow)
    compiled = trt_inline.reference.compile(
        model, (x,), enable_autocast=True, autocast_excluded_nodes=["^mul_1$", "^div$"]
    )
    assert _casts(compiled).get("float16", 0) > 0
    path = tmp_path / "fp16.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,))
    loaded = load_in_fresh_process(tmp_path, [path], [x])[str(path)]["outputs"]
    with torch.no_grad():
        here = compiled(x)
    assert torch.equal(loaded[0], here) and not torch.equal(here, model(x))
    assert trt_inline.verify(path).status == "PASS"
