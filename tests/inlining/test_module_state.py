"""Runs that leave a module as they found it: buffers a forward writes (a KV cache, a counter) put back."""

from __future__ import annotations

import copy
import logging
import warnings
from pathlib import Path

import pytest
import torch
from support.models import RELU, ReturnsCache, RunningCache

import trt_inline
from trt_inline import compat, reference
from trt_inline.inlining import module_state
from trt_inline.inlining.module_state import _buffers_it_may_write, buffers_restored


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


def test_a_compiled_module_that_writes_no_buffer_copies_none(tmp_path: Path) -> None:
    """Engine payloads are never copied; graphs with buffers but no writing op (a fallback reading one, the
    loaded program's input guard) and no buffer handed to an engine pay nothing."""

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("scale", torch.full((4,), 2.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x) * self.scale)

    torch.manual_seed(0)
    x = torch.randn(3, 4)
    compiled = reference.compile(Scaled().eval(), (x,), torch_executed_ops=[RELU, "aten.mul.Tensor"])
    trt_inline.save(compiled, tmp_path / "scaled.pt2", arg_inputs=(x,))
    loaded = torch.export.load(tmp_path / "scaled.pt2").module()
    for module in (compiled, loaded):
        names = [name for name, _ in module.named_buffers()]
        assert any(name.endswith("engine") for name in names)
        assert any(name.endswith("scale") for name in names), "a buffer outside the engines is there"
        assert _buffers_it_may_write(module) == []
    if compat.guard_call_types():  # torch 2.9+: the loaded program calls its input guard
        assert any(n.op == "call_module" and n.target == "_guards_fn" for n in loaded.graph.nodes)
    stateful = reference.compile(RunningCache().eval(), (torch.randn(3, 4),), torch_executed_ops=[RELU])
    assert [name.rsplit(".", 1)[-1] for name in _buffers_it_may_write(stateful)] == ["cache"]


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


class _Awkward(torch.nn.Module):
    """Buffers a plain copy cannot put back: resized in place, registered by the run, written in inference mode;
    and buffers whose bits cannot be viewed (sparse, quantized), which the run leaves alone."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("resized", torch.zeros(1, 4))
        with torch.inference_mode():
            self.register_buffer("frozen", torch.zeros(2))
        self.register_buffer("sparse", torch.eye(2).to_sparse())
        with warnings.catch_warnings():  # (quantized tensors are deprecated, not gone)
            warnings.simplefilter("ignore")
            self.register_buffer("quantized", torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.resized.resize_(2, 4).fill_(1.0)
        if "lazy" not in self._buffers:
            self.register_buffer("lazy", torch.zeros(2))
        self.lazy.add_(1.0)
        with torch.inference_mode():
            self.frozen.add_(1.0)
        return x + self.lazy.sum() + self.resized.sum()


def test_resized_registered_and_inference_buffers_come_back_and_runs_repeat() -> None:
    module = _Awkward()
    sparse, quantized = module.sparse, module.quantized
    results = []
    for _ in range(2):
        with torch.no_grad(), buffers_restored(module) as restored:
            results.append(restored.apart(module(torch.zeros(1))))
            assert module.resized.shape == (2, 4) and "lazy" in module._buffers and module.frozen.sum() == 2
        assert module.resized.shape == (1, 4) and not module.resized.any()
        assert "lazy" not in module._buffers, "a buffer the run registered is removed"
        assert module.frozen.is_inference() and not module.frozen.any()
        assert module.sparse is sparse and module.quantized is quantized
    assert results[0].item() == results[1].item() == 10.0  # the second run starts where the first did


def test_an_output_that_is_the_buffer_keeps_what_the_run_gave_it() -> None:
    torch.manual_seed(0)
    module, x = ReturnsCache().eval(), torch.randn(3, 4)
    with torch.no_grad(), buffers_restored(module) as restored:
        y, cache = module(x)
        assert cache is module.cache  # the output is the buffer itself
        kept = restored.apart((y, cache))
    assert not module.cache.any(), "the buffer is put back"
    assert kept[0] is y and torch.equal(kept[1], y), "the output keeps the value the run gave it"


def test_graphs_that_write_through_methods_or_eager_submodules_are_put_back() -> None:
    """A graph writing a buffer with `call_method add_`, and one calling an eager submodule (batch norm in
    training): each alone makes its buffers copied and put back."""
    for kind in ("method", "eager submodule"):
        root = torch.nn.Module()
        root.register_buffer("count", torch.zeros(1))
        root.norm = torch.nn.BatchNorm1d(4).train()
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        if kind == "method":
            graph.call_method("add_", (graph.get_attr("count"), 1))
            graph.output(x)
        else:
            graph.output(graph.call_module("norm", (x,)))
        traced = torch.fx.GraphModule(root, graph)
        before = {name: buffer.clone() for name, buffer in traced.named_buffers()}
        with torch.no_grad(), buffers_restored(traced):
            traced(torch.randn(5, 4))
            changed = [name for name, buffer in traced.named_buffers() if not torch.equal(buffer, before[name])]
            assert changed == (
                ["count"] if kind == "method" else ["norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]
            ), changed
        for name, buffer in traced.named_buffers():
            assert torch.equal(buffer, before[name]), (kind, name)


def test_buffers_registered_filled_or_grown_by_the_run_and_shared_ones() -> None:
    """A buffer a run registers on a module that had none, one it fills where it was None, one it grows into new
    memory and returns (kept as the run gave it), and one two modules share that the run rebinds in one."""

    class Odd(torch.nn.Module):
        def __init__(self, shared: torch.Tensor) -> None:
            super().__init__()
            self.inner = torch.nn.Module()
            self.register_buffer("empty", None)
            self.register_buffer("grown", torch.zeros(1, 4))
            self.register_buffer("shared", shared)
            self.inner.register_buffer("shared", shared)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if "stats" not in self.inner._buffers:
                self.inner.register_buffer("stats", torch.zeros(1))
            self.inner.stats.add_(1.0)
            self.empty = x.clone() if self.empty is None else self.empty + x
            self.inner.shared = self.inner.shared + 1.0
            self.grown.resize_(64, 4).fill_(1.0)
            return self.grown

    module = Odd(torch.zeros(2))
    shared, grown = module.shared, module.grown
    for _ in range(2):
        with torch.no_grad(), buffers_restored(module) as restored:
            returned = module(torch.ones(1))
            assert returned is module.grown and returned.data_ptr() != 0
            kept = restored.apart(returned)
        assert kept.shape == (64, 4) and bool(kept.eq(1.0).all()), "the output keeps what the run gave it"
        assert "stats" not in module.inner._buffers and module.empty is None
        assert module.inner.shared is shared and module.shared is shared and not shared.any()
        assert module.grown is grown and grown.shape == (1, 4) and not grown.any()


def test_a_failed_put_back_is_raised_after_the_others_and_never_hides_the_blocks_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = module_state._same_bits

    def refusing(tensor: torch.Tensor, value: torch.Tensor) -> bool:
        if tensor is module.cache:
            raise RuntimeError("cannot compare the cache")
        return real(tensor, value)

    monkeypatch.setattr(module_state, "_same_bits", refusing)
    module = _Eager()
    signed = _bits(module.signed)
    with pytest.raises(RuntimeError, match="cannot compare the cache"), torch.no_grad(), buffers_restored(module):
        module(torch.ones(3))
    assert _bits(module.signed) == signed, "the other buffers are still put back"
    with caplog.at_level(logging.WARNING, logger="trt_inline"):
        with pytest.raises(KeyError, match="the block's own"), torch.no_grad(), buffers_restored(module):
            module(torch.ones(3))
            raise KeyError("the block's own")
    assert "could not be put back after the run failed: cannot compare the cache" in caplog.text


def _tampered(source: Path, target: Path) -> None:
    """``source`` with its program writing 100 times the new value into the buffer it returns.

    The write is an in-place ``copy_`` in the graph (recent torch) or the value of
    a buffer-mutation output (torch 2.5): either way the new value is scaled.
    """
    from trt_inline.archive.reference_io import REFERENCE_IO_FILE

    extra = {REFERENCE_IO_FILE: ""}
    program = torch.export.load(source, extra_files=extra)
    graph = program.graph
    write = next((n for n in graph.nodes if n.target == torch.ops.aten.copy_.default), None)
    if write is not None:
        with graph.inserting_before(write):
            scaled = graph.call_function(torch.ops.aten.mul.Tensor, (write.args[1], 100.0))
        scaled.meta = dict(write.args[1].meta)
        write.replace_input_with(write.args[1], scaled)
    else:
        mutated = next(s for s in program.graph_signature.output_specs if s.kind.name == "BUFFER_MUTATION")
        value = next(n for n in graph.nodes if n.name == mutated.arg.name)
        with graph.inserting_after(value):
            scaled = graph.call_function(torch.ops.aten.mul.Tensor, (value, 100.0))
        scaled.meta = dict(value.meta)
        value.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
        scaled.name = value.name  # the signature names the mutation's value
        value.name = f"{value.name}_unscaled"
    program.graph_module.recompile()
    torch.export.save(program, target, extra_files=extra)


def test_verify_compares_an_output_that_is_a_buffer_the_program_updates(tmp_path: Path) -> None:
    """Putting the buffer back after a run must not reset the output that is that buffer (the save's reference,
    verify's run, an expected module's run): else a file writing anything into it passes."""
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    eager = ReturnsCache().eval()
    compiled = reference.compile(copy.deepcopy(eager), (x,), torch_executed_ops=[RELU])
    caches = [buffer for name, buffer in compiled.named_buffers() if name.endswith(".cache")]
    assert len(caches) == 1 and not caches[0].any(), "compiling leaves the cache as it found it"
    good, bad = tmp_path / "cache.pt2", tmp_path / "tampered.pt2"
    trt_inline.save(compiled, good, arg_inputs=(x,))
    _tampered(good, bad)
    with torch.no_grad():
        want = copy.deepcopy(eager)(x)[1]
        returned = [torch.export.load(path).module()(x)[1] for path in (good, bad)]
    assert want.any() and torch.allclose(returned[0], want), "the good file returns the updated cache"
    assert not torch.allclose(returned[1], want), "the tampered file's returned cache differs under torch"
    assert trt_inline.verify(good, allow_ops=["aten::copy_"]).ok
    assert trt_inline.verify(good, expected_module=eager, arg_inputs=(x,), allow_ops=["aten::copy_"]).ok
    assert not eager.cache.any(), "verify leaves the expected module as it found it"
    report = trt_inline.verify(bad, allow_ops=["aten::copy_"])
    assert not report.ok and "output 1" in report.to_text(), report.to_text()
