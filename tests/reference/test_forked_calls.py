"""Work done in a child forked from the caller's process, and what comes back of it.

``isolation.interpreter.call_forked`` and ``ForkedServer`` (what the rehearsal on a release's pipeline runs in):
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
from support.models import scalar_cases

import trt_inline
from trt_inline import compat
from trt_inline.errors import ForkedCallError
from trt_inline.isolation.interpreter import ForkedServer, call_forked
from trt_inline.reference import handover
from trt_inline.releases import minor as releases_minor

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


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (absent, or a zombie waiting for a parent that is not us)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_child_never_returns_into_the_callers_code() -> None:
    """A child whose set-up fails (its output cannot be opened) ends there: it must not raise up through the
    caller's stack and go on running the caller's program (here: the rest of this test session)."""
    caller = os.getpid()
    try:
        with pytest.raises(ForkedCallError, match=r"ended with exit status 1 before it answered"):
            call_forked(lambda: b"x", output="/nonexistent/folder/log")
        with ForkedServer(lambda: None, lambda request: request, output="/nonexistent/folder/log") as server:
            with pytest.raises(ForkedCallError, match=r"server ended before it answered"):
                server.call(b"x")
    finally:
        if os.getpid() != caller:
            os._exit(99)  # (an escaped child: end it before it runs anything else)


def test_an_answer_counts_only_from_a_child_that_exited_normally() -> None:
    """A child killed while it writes leaves a prefix of its answer: that is how it ended, not a short answer."""
    from trt_inline.isolation.interpreter import _checked_answer, _decoded_answer

    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    _, killed = os.waitpid(pid, 0)
    with pytest.raises(ForkedCallError, match=r"ended with signal 9 before it answered"):
        _decoded_answer(_checked_answer(b"R" + b"x" * 100, killed))
    assert _decoded_answer(_checked_answer(b"Rwhole", 0)) == b"whole"


def test_closing_a_server_ends_the_call_in_progress_and_its_descriptors(tmp_path: os.PathLike[str]) -> None:
    """Ctrl-C (here an alarm) during a call closes the server, and with it the child answering the call; a closed
    server refuses further calls instead of writing to descriptors it no longer owns."""
    started = os.path.join(tmp_path, "started")

    def handle(request: bytes) -> bytes:
        with open(started, "w") as handle:
            handle.write(str(os.getpid()))
        time.sleep(60)
        return request

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    server = ForkedServer(lambda: None, handle)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(KeyboardInterrupt):
            server.call(b"slow")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    answering = int(open(started).read())
    deadline = time.monotonic() + 10
    while not _gone(answering) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(answering), "the child answering the call outlived the server"
    unrelated = os.path.join(tmp_path, "unrelated")
    with open(unrelated, "wb") as reused:  # (likely to get a number the server's pipes had)
        with pytest.raises(ForkedCallError, match="the forked server was closed"):
            server.call(b"secret request")
        reused.flush()
    assert open(unrelated, "rb").read() == b""


def test_the_childs_log_records_and_prints_go_to_its_output_only(tmp_path: os.PathLike[str]) -> None:
    """The caller's log handlers (a file of its own) and its replaced ``sys.stdout`` hear nothing of the child."""
    import contextlib
    import io
    import logging

    callers_log, childs_output = os.path.join(tmp_path, "app.log"), os.path.join(tmp_path, "child.log")
    handler = logging.FileHandler(callers_log)
    logging.getLogger().addHandler(handler)
    captured = io.StringIO()

    def talk() -> bytes:
        logging.getLogger("torch_tensorrt._utils").error("the child's record")
        print("the child's print")
        return b"done"

    try:
        with contextlib.redirect_stdout(captured):
            assert call_forked(talk, output=childs_output) == b"done"
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert "the child's" not in open(callers_log).read() and not captured.getvalue()
    said = open(childs_output).read()
    assert "the child's record" in said and "the child's print" in said, said


def test_a_caller_holding_many_descriptors_still_gets_its_answer() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this machine allows {hard} open files; the case needs 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if hard == resource.RLIM_INFINITY else hard, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert call_forked(lambda: b"answered") == b"answered"
        with ForkedServer(lambda: None, lambda request: request) as server:
            assert server.call(b"again") == b"again"
    finally:
        for descriptor in held:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


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


def test_a_program_copied_for_the_child_leaves_the_callers_program_where_it_was() -> None:
    """A rehearsal of a model on the GPU hands the child a CPU copy: the caller's program keeps its device (here
    the copy goes to ``meta``, which every machine has), its weights stay parameters in the copy."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    x = torch.randn(4, 3)
    program = torch.export.export(model, (x,))
    copied = compat.program_copy_on(program, torch.device("meta"))
    assert {value.device.type for value in copied.state_dict.values()} == {"meta"}
    assert all(isinstance(value, torch.nn.Parameter) for value in copied.state_dict.values())
    assert {value.device.type for value in program.state_dict.values()} == {"cpu"}
    assert torch.equal(program.module()(x), model(x))


class _HalfMore(torch.nn.Module):
    """Sizes that are torch's own functions of the batch (``FloorDiv``), crossing from an engine to a fallback."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x[: x.shape[0] // 2] * 2
        return torch.cat([x, torch.relu(half)]) + 1


def _shapes(module: torch.fx.GraphModule) -> list[str]:
    graphs = [m for m in (module, *module.children()) if isinstance(m, torch.fx.GraphModule)]
    values = [node.meta.get("val") for graph in graphs for node in graph.graph.nodes]
    return [str(value.shape) for value in values if isinstance(value, torch.Tensor)]


def test_sizes_come_back_as_the_same_expressions_not_ones_printed_alike() -> None:
    """``s//2`` is torch's ``FloorDiv``: it must come back as that, not as sympy's ``floor(s/2)``, which prints
    differently and simplifies differently."""
    x = torch.randn(6, 4)
    if releases_minor(torch.__version__) < (2, 6):
        pytest.skip(f"torch {torch.__version__}'s export keeps no size floor-divided by 2 (Dim.AUTO: KeyError; a named "
                    "Dim: a guard it cannot prove)")  # fmt: skip
    exported = torch.export.export(_HalfMore(), (x,), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    compiled = trt_inline.reference.compile(
        exported, (x,), pipeline="own", torch_executed_ops={"torch.ops.aten.relu.default"}
    )
    expressions = _shapes(compiled)
    assert any("//2" in text for text in expressions), expressions  # (the structure: a FloorDiv size)
    fake_mode = compat.detect_fake_mode([n.meta.get("val") for n in exported.graph.nodes if n.op == "placeholder"])
    rebuilt = handover.rebuild(handover.loads(handover.dumps(handover.describe(compiled))), fake_mode, own=compiled)
    again = _shapes(rebuilt)
    assert again == expressions and not any("floor(" in text for text in again), again


def test_weights_come_back_as_parameters_and_buffers_as_buffers() -> None:
    model = torch.nn.BatchNorm1d(4).eval()
    x = torch.randn(3, 4)
    exported = torch.export.export(model, (x,))
    flat = exported.module()
    fake_mode = compat.detect_fake_mode([n.meta.get("val") for n in exported.graph.nodes if n.op == "placeholder"])
    rebuilt = handover.rebuild(handover.loads(handover.dumps(handover.describe(flat))), fake_mode, own=flat)
    assert sorted(name for name, _ in rebuilt.named_parameters()) == ["bias", "weight"]
    assert {"running_mean", "running_var"} <= {name for name, _ in rebuilt.named_buffers()}
    compat.set_codegen(rebuilt.graph, compat.graph_codegen(flat.graph))
    rebuilt.recompile()
    assert torch.equal(rebuilt(x), flat(x))
