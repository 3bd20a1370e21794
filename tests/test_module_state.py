"""Runs that leave a module as they found it: buffers a forward writes (a KV cache, a counter) put back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from models import RELU, CrossedHalves, RunningCache

import trt_inline
from trt_inline import reference
from trt_inline.module_state import _buffers_it_may_write, buffers_restored


class _Eager(torch.nn.Module):
    """Writes its buffers every way a forward can: in place, rebound, NaN payloads and signed zeros."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(3))
        self.register_buffer("grown", torch.zeros(1))
        self.register_buffer("signed", torch.tensor([0.0, float("nan")]))
        with torch.inference_mode():
            self.register_buffer("frozen", torch.tensor([float("nan"), 1.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.add_(x)
        self.grown = torch.cat([self.grown, x[:1]])  # rebound: a new tensor under the same name
        self.signed.copy_(torch.tensor([-0.0, float("-nan")]))
        return self.cache.sum() + self.grown.sum()


def _bits(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().view(torch.uint8).numpy().tobytes()


def test_each_way_a_forward_writes_a_buffer_is_put_back() -> None:
    module = _Eager()
    before = {name: (buffer, _bits(buffer)) for name, buffer in module.named_buffers()}
    with torch.no_grad(), buffers_restored(module):
        module(torch.ones(3))
        assert module.grown is not before["grown"][0] and _bits(module.signed) != before["signed"][1]
    for name, (buffer, bits) in before.items():
        assert module.get_buffer(name) is buffer, name  # the tensor itself, not a copy
        assert _bits(buffer) == bits, name  # bit for bit: -0.0 and the NaN payload too


def test_an_error_in_the_block_is_the_one_raised_and_the_buffers_still_come_back() -> None:
    module = _Eager()
    cache = module.cache.clone()
    with pytest.raises(KeyError, match="the block's own"), torch.no_grad(), buffers_restored(module):
        module(torch.ones(3))
        raise KeyError("the block's own")
    assert torch.equal(module.cache, cache)


def test_a_compiled_module_that_writes_no_buffer_copies_none() -> None:
    """Engine payloads are never copied; a graph with no writing op and no buffer handed to an engine pays nothing."""
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    compiled = reference.compile(CrossedHalves().eval(), (x,), torch_executed_ops=[RELU])
    assert any(name.endswith("engine") for name, _ in compiled.named_buffers())
    assert _buffers_it_may_write(compiled) == []
    stateful = reference.compile(RunningCache().eval(), (torch.randn(3, 4),), torch_executed_ops=[RELU])
    assert [name for _, name, _ in _buffers_it_may_write(stateful)] == ["cache"]


def test_per_engine_verify_of_a_program_that_updates_a_buffer(tmp_path: Path) -> None:
    """Each run of a verify (the program, then its engines replayed) starts from the file's own state."""
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    compiled = reference.compile(RunningCache().eval(), (x,), torch_executed_ops=[RELU])
    path = tmp_path / "cache.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,), embed_reference="boundaries")
    report = trt_inline.verify(path, per_engine=True, allow_ops=["aten::copy_"])
    assert report.ok, report
    program = torch.export.load(path)  # the boundaries came from the same call as the outputs
    trt_inline.save(program, tmp_path / "again.pt2", arg_inputs=(x,), embed_reference="boundaries")
    assert trt_inline.verify(tmp_path / "again.pt2", per_engine=True, allow_ops=["aten::copy_"]).ok
