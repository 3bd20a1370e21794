"""The reference backend: engine programs, operator selection, devices, determinism."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from support.models import RELU, ConvBnRelu
from support.values import as_list, max_abs_diff

import trt_inline
from trt_inline import reference
from trt_inline.errors import CompileError, EngineFormatError, RefusedOperatorError
from trt_inline.reference.partition import resolve_ops
from trt_inline.reference.program import FORMAT, load_program


def _program(**overrides: object) -> str:
    doc: dict[str, object] = {
        "format": FORMAT,
        "inputs": 1,
        "weights": [],
        "steps": [{"target": "aten::relu.default", "args": [{"ref": 0}], "kwargs": {}}],
        "outputs": [1],
    }
    doc.update(overrides)
    return json.dumps(doc)


def test_program_runs() -> None:
    x = torch.randn(5)
    (out,) = torch.ops.trt_inline.execute_engine.default([x], torch.empty(0, dtype=torch.uint8), _program())
    assert torch.equal(out, torch.relu(x))


@pytest.mark.parametrize(
    ("program", "message"),
    [
        ("not json", "not valid JSON"),
        (json.dumps({"format": "other"}), "not in format"),
        (_program(steps=[{"target": "aten::relu.default", "args": [{"ref": 7}], "kwargs": {}}]), "dangling reference"),
        (_program(outputs=[9]), "returns a value it never computes"),
        (_program(steps=[{"target": "aten::relu.default", "args": [{"pickle": "x"}], "kwargs": {}}]), "unreadable"),
        (_program(weights=[{"dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16}]), "holds 0 bytes"),
    ],
)
def test_bad_programs_are_refused(program: str, message: str) -> None:
    with pytest.raises(EngineFormatError, match=message):
        load_program(program).run([torch.randn(3)], torch.empty(0, dtype=torch.uint8))


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("aten::no_such_op.default", "step 0 names aten::no_such_op.default, which is not registered"),
        ("builtins.eval", "step 0 names 'builtins.eval', which is not an operator name"),
        ("load_library::__call__.__call__", "step 0 names load_library::__call__.__call__, which is not a registered"),
        ("aten::from_file.default", "step 0 calls aten::from_file.default, which reads files"),
        ("aten::add_.Tensor", "step 0 calls aten::add_.Tensor, which writes to its arguments"),
    ],
)
def test_programs_may_only_call_allowed_operators(target: str, message: str) -> None:
    """A program's targets are looked up and checked against the allow-list when it is decoded."""
    program = _program(steps=[{"target": target, "args": [], "kwargs": {}}])
    with pytest.raises(RefusedOperatorError, match=re.escape(message)):
        load_program(program)


def test_torch_executed_ops_forms() -> None:
    overloads, packets = resolve_ops(
        [torch.ops.aten.relu.default, "torch.ops.aten.add.Tensor", "aten::mul.Tensor", "aten.sigmoid"]
    )
    assert overloads == {torch.ops.aten.relu.default, torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor}
    assert packets == {torch.ops.aten.sigmoid}
    with pytest.raises(ValueError, match="names no registered operator"):
        resolve_ops(["aten.no_such_op.default"])
    with pytest.raises(ValueError, match="is not an operator"):
        resolve_ops([42])


def test_min_block_size_folds_small_engines() -> None:
    x = torch.randn(2, 3, 8, 8)
    model = ConvBnRelu().eval()
    small = reference.compile(model, (x,), torch_executed_ops=[RELU], min_block_size=1)
    large = reference.compile(model, (x,), torch_executed_ops=[RELU], min_block_size=4)
    count = lambda gm: sum(isinstance(m, reference.ReferenceEngine) for m in gm.children())  # noqa: E731
    assert count(large) < count(small)
    with torch.no_grad():
        assert max_abs_diff(as_list(large(x)), as_list(small(x))) == 0.0


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="reference engines on CUDA tensors: no CUDA device on this machine"
)
def test_reference_engines_run_on_cuda(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 8, 8)
    model = ConvBnRelu().eval()
    compiled = reference.compile(model, (x,), torch_executed_ops=[RELU])
    with torch.no_grad():
        expected = as_list(compiled(x))
        on_cuda = as_list(compiled.to("cuda")(x.cuda()))
    assert all(t.is_cuda for t in on_cuda)
    assert max_abs_diff([t.cpu() for t in on_cuda], expected) <= 1e-4

    path = tmp_path / "cpu_saved.pt2"
    trt_inline.save(compiled.to("cpu"), path, arg_inputs=(x,))
    loaded = torch.export.load(path).module().to("cuda")
    with torch.no_grad():
        outputs = as_list(loaded(x.cuda()))
    assert max_abs_diff([t.cpu() for t in outputs], [t.cpu() for t in on_cuda]) == 0.0


class _Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, q, q) + 1


def test_an_attention_torch_cannot_decompose_is_kept_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's decomposition of scaled_dot_product_attention fails on some strides (transformers' GPT-2 at batch 2,
    tests/project/test_hub_models.py): the own pipeline keeps that operator whole and compiles; a failure of a program
    without it is the failure it is."""
    from trt_inline import compat

    stock = compat.decompose_keeping
    attention = torch.ops.aten.scaled_dot_product_attention.default
    kept: list[bool] = []

    def failing(exported: torch.export.ExportedProgram, keep: Any) -> Any:
        kept.append(attention in keep)
        if attention not in keep:
            raise ValueError("Cannot view a tensor with shape torch.Size([2, 16, 64]) and strides (64, 128, 1)")
        return stock(exported, keep)

    monkeypatch.setattr(compat, "decompose_keeping", failing)
    q = torch.randn(2, 4, 8, 16)
    compiled = trt_inline.reference.compile(_Attention().eval(), (q,), pipeline="own")
    assert kept == [False, True]
    with torch.no_grad():
        torch.testing.assert_close(compiled(q), _Attention()(q))
    kept.clear()
    with pytest.raises(CompileError, match="Cannot view a tensor"):
        trt_inline.reference.compile(torch.nn.Linear(16, 16).eval(), (q,), pipeline="own")
    assert kept == [False]
