"""The inline passes on hand-built partitioned graphs: one hazard per test."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx
from support.graphs import (
    Parent,
    annotated,
    check_equivalent,
    engine,
    fallback,
    seed_collision_graph,
)
from support.values import as_list, max_abs_diff
from torch._subclasses.fake_tensor import FakeTensorMode

import trt_inline
from trt_inline.errors import InlineError

aten = torch.ops.aten


def test_fallback_placeholder_named_like_a_later_node() -> None:
    gm, inputs = seed_collision_graph()
    placeholder = next(n for n in gm.get_submodule("_run_on_gpu_1").graph.nodes if n.op == "placeholder")
    namesake = next(n for n in gm.graph.nodes if n.name == placeholder.name)
    assert namesake.args[0].target == "_run_on_acc_2", "the hazard must be present"

    flat = check_equivalent(gm, inputs)
    relu = next(n for n in flat.graph.nodes if n.target is torch.relu)
    producer = relu.args[0]
    assert producer.target is operator.getitem
    engine_call = producer.args[0]
    assert [a.name for a in engine_call.args[0]] == ["x"], "relu must read engine 0's output"


def test_fallback_placeholders_named_like_parent_inputs_in_swapped_order() -> None:
    p = Parent()
    x, y = p.input("x"), p.input("y")

    def swapped(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # names crossed on purpose
        return y - 2 * x

    out = p.call("_run_on_gpu_0", fallback(swapped), x, y)
    inputs = (torch.randn(3), torch.randn(3))
    gm = p.build(out, inputs)
    flat = check_equivalent(gm, inputs)
    with torch.no_grad():
        assert torch.equal(flat(*inputs), inputs[0] - 2 * inputs[1])


def test_fallback_reads_computed_intermediates() -> None:
    p = Parent()
    x = p.input("x")
    acc = p.call(
        "_run_on_acc_0",
        engine(lambda a: (aten.mul.Tensor(a, 2.0), aten.add.Tensor(a, 1.0)), "_run_on_acc_0"),
        x,
    )
    first, second = p.getitem(acc, 0), p.getitem(acc, 1)

    def combine(add: torch.Tensor, mul: torch.Tensor) -> torch.Tensor:  # names of the other's producer
        return add * 10 + mul

    out = p.call("_run_on_gpu_1", fallback(combine), first, second)
    inputs = (torch.randn(2, 3),)
    flat = check_equivalent(p.build(out, inputs), inputs)
    with torch.no_grad():
        assert torch.equal(flat(*inputs), inputs[0] * 2 * 10 + (inputs[0] + 1))


def test_multi_output_fallback_with_users_out_of_order() -> None:
    p = Parent()
    x = p.input("x")

    def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.relu(x), torch.sigmoid(x), x.sum(dim=0)

    gpu = p.call("_run_on_gpu_0", fallback(split), x)
    third, first = p.getitem(gpu, 2), p.getitem(gpu, 0)
    out = p.call(
        "_run_on_acc_1",
        engine(lambda a, b: aten.add.Tensor(a, b), "_run_on_acc_1"),
        first,
        third,
    )
    second = p.getitem(gpu, 1)
    inputs = (torch.randn(4, 3),)
    check_equivalent(p.build((out, second), inputs), inputs)


def test_passthrough_outputs() -> None:
    p = Parent()
    x, y = p.input("x"), p.input("y")

    def passthrough(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(a), b

    def identity(a: torch.Tensor) -> torch.Tensor:
        return a

    gpu = p.call("_run_on_gpu_0", fallback(passthrough), x, y)
    relu_x, same_y = p.getitem(gpu, 0), p.getitem(gpu, 1)
    ident = p.call("_run_on_gpu_1", fallback(identity), same_y)
    out = p.call("_run_on_acc_2", engine(lambda a, b: aten.mul.Tensor(a, b), "_run_on_acc_2"), relu_x, ident)
    inputs = (torch.randn(5), torch.randn(5))
    flat = check_equivalent(p.build(out, inputs), inputs)
    engine_call = next(
        n for n in flat.graph.nodes if n.op == "call_function" and n.target.__name__ == "execute_engine.default"
    )
    assert engine_call.args[0][1].name == "y", "a passed-through input is the call's argument itself"


class _WithState(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 3.0))
        self.offset = torch.arange(4.0)  # a plain tensor constant
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.scale + self.offset


def test_fallback_with_buffer_constant_and_nested_module(tmp_path: Path) -> None:
    p = Parent()
    x = p.input("x")
    # Parent attributes, in use, that the moved ones would collide with.
    p.root.register_buffer("_run_on_gpu_0_scale", torch.full((4,), -1.0))
    p.root.register_parameter("_run_on_gpu_0_inner", torch.nn.Parameter(torch.full((4,), 0.5)))
    parent_scale = p.graph.get_attr("_run_on_gpu_0_scale")
    parent_inner = p.graph.get_attr("_run_on_gpu_0_inner")
    first = p.call("_run_on_gpu_0", fallback(_WithState()), x)
    second = p.call("_run_on_gpu_1", fallback(_WithState()), first)
    neg = p.call("_run_on_acc_2", engine(lambda a: aten.neg.default(a), "_run_on_acc_2"), second)
    out = p.graph.call_function(torch.add, (neg, p.graph.call_function(torch.mul, (parent_scale, parent_inner))))
    inputs = (torch.randn(2, 4),)
    gm = p.build(out, inputs)
    # The nested Linear modules move to the parent under fresh names and stay calls.
    flat = check_equivalent(gm, inputs, call_modules=("_run_on_gpu_0_inner_1", "_run_on_gpu_1_inner"))
    assert torch.equal(flat.get_buffer("_run_on_gpu_0_scale"), torch.full((4,), -1.0))
    assert torch.equal(flat.get_buffer("_run_on_gpu_0_scale_1"), torch.full((4,), 3.0))
    assert torch.equal(flat.get_parameter("_run_on_gpu_0_inner"), torch.full((4,), 0.5))

    path = tmp_path / "state.pt2"
    trt_inline.save(gm, path, arg_inputs=inputs, retrace=True)
    loaded = torch.export.load(path)
    kinds = [spec.kind.name for spec in loaded.graph_signature.input_specs]
    assert kinds.count("PARAMETER") == 5 and kinds.count("BUFFER") >= 2, kinds
    with torch.no_grad():
        assert max_abs_diff(as_list(loaded.module()(*inputs)), as_list(gm(*inputs))) == 0.0

    # Without retracing, an nn.Module call cannot be written: say which node.
    with pytest.raises(trt_inline.SaveError, match=r"node inner still calls submodule '_run_on_gpu_0_inner_1'"):
        trt_inline.save(gm, tmp_path / "flat.pt2", retrace=False)


def test_fallback_with_buffer_and_constant_without_retrace(tmp_path: Path) -> None:
    class Stateful(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4))
            self.register_buffer("scale", torch.full((4,), 3.0))
            self.register_buffer("scratch", torch.ones(4), persistent=False)
            self.offset = torch.arange(4.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scaled = aten.mul.Tensor(aten.mul.Tensor(x, self.weight), self.scale)
            return aten.mul.Tensor(aten.add.Tensor(scaled, self.offset), self.scratch)

    p = Parent()
    x = p.input("x")
    stateful = fallback(Stateful())
    # GraphModule construction registers every tensor as a persistent buffer; restate it.
    stateful.register_buffer("scratch", stateful.scratch, persistent=False)
    offset = stateful._buffers.pop("offset")
    stateful.offset = offset  # and a plain tensor attribute is a buffer too; make it plain again
    first = p.call("_run_on_gpu_0", stateful, x)
    out = p.call("_run_on_acc_1", engine(lambda a: aten.neg.default(a), "_run_on_acc_1"), first)
    inputs = (torch.randn(2, 4),)
    gm = p.build(out, inputs)
    check_equivalent(gm, inputs)
    path = tmp_path / "flat.pt2"
    trt_inline.save(gm, path, retrace=False)
    loaded = torch.export.load(path)
    specs = {spec.target: (spec.kind.name, spec.persistent) for spec in loaded.graph_signature.input_specs}
    assert specs["_run_on_gpu_0_weight"] == ("PARAMETER", None)
    assert specs["_run_on_gpu_0_scale"] == ("BUFFER", True)
    assert specs["_run_on_gpu_0_scratch"] == ("BUFFER", False)
    assert specs["_run_on_gpu_0_offset"] == ("CONSTANT_TENSOR", None)
    assert specs["_run_on_acc_1_engine"] == ("BUFFER", False)
    with torch.no_grad():
        assert max_abs_diff(as_list(loaded.module()(*inputs)), as_list(gm(*inputs))) == 0.0


def test_multi_output_engine_getitems_created_out_of_index_order() -> None:
    p = Parent()
    x = p.input("x")
    acc = p.call(
        "_run_on_acc_0",
        engine(lambda a: (aten.mul.Tensor(a, 2.0), aten.sum.dim_IntList(a, [1])), "_run_on_acc_0"),
        x,
    )
    total = p.getitem(acc, 1)  # created before index 0
    doubled = p.getitem(acc, 0)
    inputs = (torch.randn(2, 4),)
    gm = p.build((doubled, total), inputs)
    trt_inline.inline_trt_modules(gm)
    assert tuple(total.meta["val"].shape) == (2,)
    assert tuple(doubled.meta["val"].shape) == (2, 4)


def test_argument_count_mismatch_names_the_submodule() -> None:
    gm, _ = seed_collision_graph()
    call = next(n for n in gm.graph.nodes if n.target == "_run_on_gpu_1")
    call.args = (*call.args, call.args[0])
    with pytest.raises(InlineError, match=r"_run_on_gpu_1: .* passes 2 arguments, the submodule has 1 placeholders"):
        trt_inline.transform(gm)


def test_unknown_accelerated_module_type() -> None:
    gm, _ = seed_collision_graph()
    gm.add_module("_run_on_acc_0", torch.nn.Identity())
    with pytest.raises(
        InlineError, match=r"_run_on_acc_0: accelerated submodule of type torch.nn.modules.linear.Identity"
    ):
        trt_inline.transform(gm)


def test_engine_call_without_meta_val() -> None:
    gm, _ = seed_collision_graph()
    del next(n for n in gm.graph.nodes if n.target == "_run_on_acc_2").meta["val"]
    with pytest.raises(InlineError, match=r"_run_on_acc_2: call node .* has no meta\['val'\]"):
        trt_inline.transform(gm)


def test_transform_leaves_its_argument_untouched() -> None:
    gm, _ = seed_collision_graph()
    before = gm.code
    trt_inline.transform(gm)
    assert gm.code == before
    assert {n for n, _ in gm.named_children()} == {"_run_on_acc_0", "_run_on_gpu_1", "_run_on_acc_2"}


def finished(p: Parent, outputs: Any) -> torch.fx.GraphModule:
    """The parent as built, without propagation: meta was set by hand, as compile_module sets it."""
    p.graph.output(outputs)
    return torch.fx.GraphModule(p.root, p.graph)


def test_scalar_engine_output_is_read_back_with_item() -> None:
    """An engine returning a size: the op returns a 0-d int64 tensor, ``item`` gives the consumers the scalar."""
    example = torch.randn(4, 5)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = mode.from_tensor
    p = Parent()
    x = p.input("x")
    x.meta["val"] = fake(example)
    sizes = engine(lambda a: (aten.mul.Tensor(a, 2.0), aten.sym_size.int(a, 0)), "_run_on_acc_0", example)
    acc0 = p.call("_run_on_acc_0", sizes, x)
    acc0.meta["val"] = [fake(example * 2), 4]  # compile_module records a scalar output as the scalar itself
    doubled, rows = p.getitem(acc0, 0), p.getitem(acc0, 1)

    def arange(n: int) -> torch.Tensor:
        return aten.arange.default(n, dtype=torch.float32)  # type: ignore[no-any-return]

    r = p.call("_run_on_gpu_1", annotated(fallback(arange), mode, 4), rows)
    combine = engine(
        lambda a, b: aten.add.Tensor(a, aten.unsqueeze.default(b, 1)), "_run_on_acc_2", example, torch.ones(4)
    )
    out = p.call("_run_on_acc_2", combine, doubled, r)
    out.meta["val"] = [fake(example)]
    gm = finished(p, out)

    flat = check_equivalent(gm, (example,))
    (item,) = [n for n in flat.graph.nodes if n.target is aten.item.default]
    getitem = item.args[0]
    engine_call = getitem.args[0]
    assert getitem.target is operator.getitem and getitem.args[1] == 1
    assert engine_call.target is torch.ops.trt_inline.execute_engine.default
    assert item.meta["val"] == 4
    assert (engine_call.meta["val"][1].dtype, engine_call.meta["val"][1].dim()) == (torch.int64, 0)
    assert (getitem.meta["val"].dtype, getitem.meta["val"].dim()) == (torch.int64, 0)
    assert list(getitem.users) == [item], "only item reads the 0-d tensor"
    assert [u.target for u in item.users if u.target is not operator.eq] == [aten.arange.default]


def test_scalar_engine_input_becomes_a_0d_tensor_in_front_of_the_engine() -> None:
    """A fallback's scalar feeding an engine first: a ``scalar_tensor`` node, int64 on the tensors' device."""
    example = torch.randn(4, 5)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = mode.from_tensor
    p = Parent()
    x = p.input("x")
    x.meta["val"] = fake(example)

    def rows_plus_one(a: torch.Tensor) -> int:
        return aten.sym_size.int(a, 0) + 1  # type: ignore[no-any-return]

    n = p.call("_run_on_gpu_0", annotated(fallback(rows_plus_one), mode, x.meta["val"]), x)
    uses = engine(
        lambda k, a: aten.add.Tensor(a, aten.sum.default(aten.arange.default(k, dtype=torch.float32))),
        "_run_on_acc_1",
        5,
        example,
    )
    out = p.call("_run_on_acc_1", uses, n, x)
    out.meta["val"] = [fake(example)]
    gm = finished(p, out)

    flat = check_equivalent(gm, (example,))
    engine_call = next(n for n in flat.graph.nodes if n.target is torch.ops.trt_inline.execute_engine.default)
    first, second = engine_call.args[0]
    assert first.target is aten.scalar_tensor.default
    assert first.kwargs == {"dtype": torch.int64, "device": torch.device("cpu")}
    assert (first.meta["val"].dtype, first.meta["val"].dim()) == (torch.int64, 0)
    assert first.args[0].target is operator.add, "the fallback's scalar, inlined, is what gets wrapped"
    assert second.name == "x"
    with torch.no_grad():
        assert torch.equal(flat(example), example + torch.arange(5, dtype=torch.float32).sum())
