"""The reference backend: engine programs, operator selection, devices, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import as_list, max_abs_diff
from models import RELU, ConvBnRelu

import trt_inline
from trt_inline import reference
from trt_inline.errors import EngineFormatError
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
        (_program(steps=[{"target": "aten::no_such_op.default", "args": [], "kwargs": {}}]), "not registered"),
        (_program(steps=[{"target": "builtins.eval", "args": [], "kwargs": {}}]), "invalid target"),
        (_program(steps=[{"target": "aten::relu.default", "args": [{"ref": 7}], "kwargs": {}}]), "dangling reference"),
        (_program(outputs=[9]), "returns a value it never computes"),
        (_program(steps=[{"target": "aten::relu.default", "args": [{"pickle": "x"}], "kwargs": {}}]), "unreadable"),
        (_program(weights=[{"dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16}]), "holds 0 bytes"),
    ],
)
def test_bad_programs_are_refused(program: str, message: str) -> None:
    with pytest.raises(EngineFormatError, match=message):
        load_program(program).run([torch.randn(3)], torch.empty(0, dtype=torch.uint8))


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
