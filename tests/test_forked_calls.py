"""Work done in a child forked from the caller's process, and what comes back of it.

``trt_inline_interpreter.call_forked`` and ``ForkedServer`` (what the rehearsal on a release's pipeline runs in):
the bytes come back, the child's exception comes back as one line with its traceback beside it, a child that dies
or runs past its time is said so and reaped, and nothing the child changes reaches the caller; a server prepares
once and answers every call from that state. ``trt_inline.reference.handover``: a partitioned module described
in one process is rebuilt node for node, with its metadata and fake values over the caller's symbols, and
computes what it computed.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from models import scalar_cases

import trt_inline
from trt_inline import compat
from trt_inline.reference import handover
from trt_inline_interpreter import ForkedCallError, ForkedServer, call_forked

_STATE = {"value": "the caller's"}


def _raise() -> bytes:
    raise ValueError("broken in the child\nsecond line")


def _change_and_answer() -> bytes:
    _STATE["value"] = "the child's"
    os.environ["TRT_INLINE_TEST_CHANGED"] = "1"
    return f"{_STATE['value']} {os.getppid()}".encode()


def test_a_forked_call_answers_with_bytes_and_changes_nothing_here() -> None:
    answer = call_forked(_change_and_answer)
    assert answer == f"the child's {os.getpid()}".encode()
    assert _STATE["value"] == "the caller's" and "TRT_INLINE_TEST_CHANGED" not in os.environ


def test_the_childs_exception_comes_back_in_one_line_with_its_traceback() -> None:
    with pytest.raises(ForkedCallError) as raised:
        call_forked(_raise)
    assert raised.value.kind == "ValueError" and raised.value.message == "broken in the child"
    assert raised.value.summary == "ValueError: broken in the child"
    assert "Traceback" in raised.value.details and "_raise" in raised.value.details


def test_a_child_that_dies_or_runs_too_long_is_said_so_and_reaped() -> None:
    def die() -> bytes:
        os.kill(os.getpid(), signal.SIGKILL)
        return b""

    with pytest.raises(ForkedCallError, match=r"ended with signal 9 before it answered"):
        call_forked(die)

    def sleep() -> bytes:
        time.sleep(60)
        return b""

    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no answer within 0\.5 s"):
        call_forked(sleep, timeout=0.5)
    assert time.monotonic() - started < 30


def test_a_server_prepares_once_and_answers_each_call_from_that_state(tmp_path: os.PathLike[str]) -> None:
    log = os.path.join(tmp_path, "setups")

    def setup() -> None:
        with open(log, "a") as handle:
            handle.write("setup\n")
        _STATE["value"] = "prepared"

    def handle(request: bytes) -> bytes:
        if request == b"raise":
            raise RuntimeError("asked to")
        before = _STATE["value"]
        _STATE["value"] = "changed by a call"
        return f"{before}:{request.decode()}".encode()

    with ForkedServer(setup, handle) as server:
        assert [server.call(b"a"), server.call(b"b")] == [b"prepared:a", b"prepared:b"]
        with pytest.raises(ForkedCallError, match=r"^RuntimeError: asked to$"):
            server.call(b"raise")
        assert server.call(b"c") == b"prepared:c"
        pid = server.pid
    assert open(log).read() == "setup\n" and _STATE["value"] == "the caller's"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_server_whose_setup_fails_says_so_at_every_call() -> None:
    def setup() -> None:
        raise ImportError("no module named torch_tensorrt")

    with ForkedServer(setup, lambda request: request) as server:
        for _ in range(2):
            with pytest.raises(ForkedCallError, match=r"^ImportError: no module named torch_tensorrt$"):
                server.call(b"x")


def test_a_partitioned_module_comes_back_node_for_node_over_the_callers_symbols() -> None:
    """A module with a scalar crossing an engine boundary and a dynamic batch: described, carried as bytes, and
    rebuilt with the fake values of the exported program it came from, every node under its own name."""
    case = next(c for c in scalar_cases() if c.crossing == "input")
    exported = torch.export.export(case.model, case.inputs, dynamic_shapes=case.dynamic_shapes)
    compiled = trt_inline.reference.compile(
        exported, case.inputs, pipeline="own", torch_executed_ops=case.torch_executed_ops
    )
    symbolic = [
        node.name for module in (compiled, *compiled.children()) if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes if isinstance(node.meta.get("val"), torch.SymInt)
    ]  # fmt: skip
    assert symbolic, "no scalar value in the partition"  # (the structure: a size crosses as a value)
    fake_mode = compat.detect_fake_mode([n.meta.get("val") for n in exported.graph.nodes if n.op == "placeholder"])
    rebuilt = handover.rebuild(handover.loads(handover.dumps(handover.describe(compiled))), fake_mode, own=compiled)

    def nodes(module: torch.fx.GraphModule) -> list[tuple[str, str, str, str]]:
        return [(n.name, n.op, str(n.target), str(n.meta.get("val"))) for n in module.graph.nodes]

    assert nodes(rebuilt) == nodes(compiled)
    for name, child in compiled.named_children():
        mine = getattr(rebuilt, name)
        assert isinstance(mine, torch.fx.GraphModule) == isinstance(child, torch.fx.GraphModule), name
        if not isinstance(child, torch.fx.GraphModule):
            assert type(mine) is type(child), name
        if isinstance(child, torch.fx.GraphModule):
            assert nodes(mine) == nodes(child), name
            assert [n.meta.get("nn_module_stack") for n in mine.graph.nodes] == [
                None if n.meta.get("nn_module_stack") is None else {
                    k: (path, v if isinstance(v, str) else f"{v.__module__}.{v.__qualname__}")
                    for k, (path, v) in n.meta["nn_module_stack"].items()
                }
                for n in child.graph.nodes
            ]  # fmt: skip
    compat.set_codegen(rebuilt.graph, compat.graph_codegen(compiled.graph))
    rebuilt.recompile()
    for inputs in case.checks:
        with torch.no_grad():
            assert all(torch.equal(a, b) for a, b in zip(rebuilt(*inputs), compiled(*inputs), strict=True))


def test_the_childs_cpu_becomes_the_callers_device() -> None:
    """Tensors, values and the devices a fallback's graph names follow the inputs' device (here ``meta``, as
    ``cuda`` would where there is one)."""

    class Ramp(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + torch.arange(x.shape[-1], dtype=x.dtype, device=x.device))

    x = torch.randn(2, 3)
    exported = torch.export.export(Ramp(), (x,))
    compiled = trt_inline.reference.compile(
        exported, (x,), pipeline="own", torch_executed_ops=["aten.arange.start_step"]
    )
    fallbacks = [c for n, c in compiled.named_children() if n.startswith("_run_on_gpu")]
    assert any(torch.device("cpu") in node.kwargs.values() for f in fallbacks for node in f.graph.nodes)
    fake_mode = compat.detect_fake_mode([n.meta.get("val") for n in exported.graph.nodes if n.op == "placeholder"])
    meta = torch.device("meta")
    rebuilt = handover.rebuild(handover.describe(compiled), fake_mode, meta, own=compiled)
    for name, child in rebuilt.named_children():
        if isinstance(child, torch.fx.GraphModule):
            for node in child.graph.nodes:
                assert torch.device("cpu") not in node.kwargs.values(), (name, node)
                value = node.meta.get("val")
                if isinstance(value, torch.Tensor):
                    assert value.device == meta, (name, node.name)
        else:
            assert all(t.device == meta for t in child.buffers()), name
