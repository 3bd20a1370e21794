"""The allow-list is data: reviewed operator names (``trt_inline/allowed_aten.txt``), read strictly.

A walk of the whole operator registry checks that nothing off the list is allowed, and that every name on the
list is allowed in some overload (a name every rule refuses is a stale or wrong entry). Files crafted as an
attacker who read the rules before the list would: an operator whose schema says it writes nothing but updates the
running statistics it is given (a call counter: honest for the runs verify makes, otherwise from the seventh call
on), and ``as_strided`` reading past a view into the caller's buffer. Both passed verify before the list; both are
refused through every door now.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support.commands import cli

import trt_inline
from trt_inline import allowed_ops
from trt_inline.archive import REFERENCE_IO_FILE, decode_reference_io
from trt_inline.archive.reference_io import encode_reference_io
from trt_inline.errors import RefusedOperatorError
from trt_inline.releases import minor


def _registry() -> dict[str, list[Any]]:
    """Every registered ATen operator name and its overloads."""
    found: dict[str, list[Any]] = {}
    for full in sorted(torch._C._dispatch_get_all_op_names()):
        namespace, _, rest = full.partition("::")
        if namespace != "aten":
            continue
        opname, _, overload = rest.partition(".")
        packet = getattr(torch.ops.aten, opname, None)
        if packet is None:
            continue
        op = getattr(packet, overload or "default", None)
        if op is not None:
            found.setdefault(f"aten::{opname}", []).append(op)
    return found


def _allowed(op: Any) -> bool:
    try:
        allowed_ops.check_target(op, allowed_ops.PER_CALL)  # each call's literals are checked later
    except RefusedOperatorError:
        return False
    return True


def test_the_whole_registry_allows_nothing_off_the_list() -> None:
    registry = _registry()
    assert len(registry) > 1000  # the walk is the whole registry, not a sample
    allowed = {name for name, ops in registry.items() if any(_allowed(op) for op in ops)}
    assert allowed <= allowed_ops.ALLOWED_ATEN, sorted(allowed - allowed_ops.ALLOWED_ATEN)
    # Every listed name this torch registers is allowed in some overload: no entry every rule refuses.
    listed_here = allowed_ops.ALLOWED_ATEN & set(registry)
    assert allowed == listed_here, sorted(listed_here - allowed)
    # A name this torch does not know is a typo or an operator of another release: none on the CI's torch.
    if minor(torch.__version__) >= (2, 13):
        assert allowed_ops.ALLOWED_ATEN <= set(registry), sorted(allowed_ops.ALLOWED_ATEN - set(registry))
    # The list is short beside what the old rules allowed (every public functional operator with tensor results).
    assert len(allowed) < len(registry) / 2


@pytest.mark.parametrize(
    "name",
    [
        "aten::is_leaf",  # autograd state
        "aten::output_nr",
        "aten::_version",  # the version counter: how many in-place writes
        "aten::is_inference",
        "aten::is_pinned",  # the allocator
        "aten::pin_memory",
        "aten::is_contiguous",  # the layout of storage
        "aten::sym_stride",
        "aten::backward",  # writes gradients into leaves, though its schema writes nothing
        "aten::empty_like",  # uninitialized memory
        "aten::rand_like",  # the global generator
        "aten::_cudnn_rnn",  # a private kernel with scratch outputs
    ],
)
def test_operators_that_report_how_a_program_runs_are_refused(name: str) -> None:
    ops = _registry().get(name)
    assert name not in allowed_ops.ALLOWED_ATEN
    if ops is None:  # not a dispatcher operator in this torch (2.5 lists no is_contiguous): a file naming it is refused
        with pytest.raises(RefusedOperatorError):
            allowed_ops.resolve(f"{name}.default")
        return
    assert not any(_allowed(op) for op in ops)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("aten::relu\n", "line 1: 'aten::relu' is before any [section]"),
        ("[pointwise]\naten::relu\naten::relu  # again\n", "line 3: 'aten::relu  # again' is listed twice"),
        ("[pointwise]\naten::relu.default\n", "line 2: 'aten::relu.default' is not aten::name"),
        ("[pointwise]\ntorch.ops.aten.relu\n", "is not aten::name"),
        ("[pointwise]\nprims::add\n", "is not aten::name"),
    ],
)
def test_the_list_is_read_strictly(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        allowed_ops.read_allow_list(text)
    assert str(info.value).startswith("allowed_aten.txt line ") and fragment in str(info.value), str(info.value)
    assert allowed_ops.read_allow_list("# notes\n[pointwise]\naten::relu  # a note\n\n") == {"aten::relu"}


def test_the_shipped_list_is_sorted_in_sections() -> None:
    """Reviewed by section: each ``[section]`` lists its names in order, so that a change is one line."""
    text = (Path(allowed_ops.__file__).parent / "allowed_aten.txt").read_text()
    sections: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.partition("#")[0].strip()
        if line.startswith("["):
            current = line
        elif line:
            sections.setdefault(current, []).append(line)
    assert len(sections) > 10
    for section, names in sections.items():
        assert names == sorted(names), section
    assert sum(map(len, sections.values())) == len(allowed_ops.ALLOWED_ATEN)


# ---------------------------------------------------------------------------
# Calls refused for their arguments
# ---------------------------------------------------------------------------


def test_batch_norm_is_allowed_only_where_it_keeps_its_statistics() -> None:
    op = torch.ops.aten.batch_norm.default
    x, w, b, mean, var = torch.randn(2, 3), torch.ones(3), torch.zeros(3), torch.zeros(3), torch.ones(3)
    allowed_ops.check_call(op, (x, w, b, mean, var, False, 0.1, 1e-5, False), {})
    with pytest.raises(RefusedOperatorError, match=r"updates the statistics it is given in place.*training=True"):
        allowed_ops.check_call(op, (x, w, b, mean, var, True, 0.1, 1e-5, False), {})
    instance = torch.ops.aten.instance_norm.default
    allowed_ops.check_call(instance, (x, w, b, None, None, True, 0.1, 1e-5, False), {})  # no statistics kept
    allowed_ops.check_call(instance, (x, w, b, mean, var, False, 0.1, 1e-5, False), {})  # eval with statistics
    with pytest.raises(RefusedOperatorError, match="use_input_stats=True, running_mean="):
        allowed_ops.check_call(instance, (x, w, b, mean, var, True, 0.1, 1e-5, False), {})


def _as_strided_sources() -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node]:
    """Sources for ``as_strided`` in a graph: ``mean(x, keepdim=True)`` (a fresh [1, 8, 1, 1]), an input of that
    shape (which a caller may pass as a view into a larger buffer), and a view of the fresh result."""
    graph = torch.fx.Graph()
    x, given = graph.placeholder("x"), graph.placeholder("given")
    x.meta["val"], given.meta["val"] = torch.empty(1, 8, 4, 4), torch.empty(1, 8, 1, 1)
    mean = graph.call_function(torch.ops.aten.mean.dim, (x, [-1, -2], True))
    mean.meta["val"] = torch.empty(1, 8, 1, 1)
    view = graph.call_function(torch.ops.aten.view.default, (mean, [1, 8, 1, 1]))
    view.meta["val"] = torch.empty(1, 8, 1, 1)
    return mean, given, view


def _unbacked_mean() -> torch.fx.Node:
    """A reduction's result whose recorded shape holds an unbacked symbol: comparing it with an int would raise."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    mean = graph.call_function(torch.ops.aten.mean.dim, (x, [-1, -2], True))
    with FakeTensorMode(shape_env=env):
        mean.meta["val"] = torch.empty(1, env.create_unbacked_symint(), 1, 1)
    return mean


def _pass_through(op: Any, *args: Any) -> torch.fx.Node:
    """A call of ``op`` on an input, in a graph: an operator whose schema does not say it returns a view, and whose
    kernel returns its input (or a view of it) all the same."""
    graph = torch.fx.Graph()
    given = graph.placeholder("given")
    given.meta["val"] = torch.empty(8)
    node = graph.call_function(op, (given, *args))
    node.meta["val"] = torch.empty(8)
    return node


def test_as_strided_is_allowed_only_as_a_restride_of_a_fresh_result() -> None:
    op = torch.ops.aten.as_strided.default
    mean, given, view = _as_strided_sources()
    allowed_ops.check_call(op, (mean, [1, 8, 1, 1], [8, 1, 8, 8]), {})  # what lowering convnext produces
    refusals = {
        "an input": ((given, [1, 8, 1, 1], [8, 1, 8, 8]), "source given is not the result of a reduction"),
        "a view": ((view, [1, 8, 1, 1], [8, 1, 8, 8]), "source view_default is not the result of a reduction"),
        # Each returns its input (a view of the caller's buffer) though its schema has no Tensor(a).
        "_unsafe_view": ((_pass_through(torch.ops.aten._unsafe_view.default, [8]), [8], [1]), "not the result"),
        "type_as": ((_pass_through(torch.ops.aten.type_as.default, given), [8], [1]), "not the result"),
        "dropout": ((_pass_through(torch.ops.aten.dropout.default, 0.0, False), [8], [1]), "not the result"),
        "einsum": ((_pass_through(torch.ops.aten.einsum.default, "i->i"), [8], [1]), "not the result"),
        "all of a 4-d input": ((given, [1, 8, 4, 4], [128, 16, 4, 1]), "reorders or skips elements"),
        "an offset": ((mean, [1, 8, 1, 1], [8, 1, 8, 8], 0), "storage_offset=0"),
        "a reorder": ((mean, [1, 8, 1, 1], [8, 2, 8, 8]), "reorders or skips elements"),
        "two long dimensions": ((mean, [2, 4, 1, 1], [4, 1, 1, 1]), "reorders or skips elements"),
        "another shape": ((mean, [1, 4, 1, 1], [4, 1, 1, 1]), "is not of the static shape [1, 4, 1, 1]"),
        "a symbolic shape": ((_unbacked_mean(), [1, 8, 1, 1], [8, 1, 8, 8]), "is not of the static shape"),
        "a computed size": ((mean, [given, 8, 1, 1], [8, 1, 8, 8]), "size=["),
    }
    for what, (args, fragment) in refusals.items():
        with pytest.raises(RefusedOperatorError, match=r"reads its source's storage rather than its values") as info:
            allowed_ops.check_call(op, args, {})
        assert fragment in str(info.value), (what, str(info.value))


def test_a_reference_program_checks_its_restride_on_the_tensor_each_run() -> None:
    dense = torch.randn(1, 8, 1, 1)
    allowed_ops.check_restride_run([1, 8, 1, 1], dense)
    skipping = torch.randn(1, 16, 1, 1)[:, ::2]  # a view reading every other element of a larger storage
    with pytest.raises(RefusedOperatorError, match=r"strides \[16, 2, 1, 1\] for size \[1, 8, 1, 1\]"):
        allowed_ops.check_restride_run([1, 8, 1, 1], skipping)
    with pytest.raises(RefusedOperatorError, match="shape"):
        allowed_ops.check_restride_run([1, 8, 1, 1], torch.randn(8))


# ---------------------------------------------------------------------------
# Crafted files: PASS before the list, refused through every door now
# ---------------------------------------------------------------------------


class _LinearBatchNorm(torch.nn.Module):
    """A linear layer, a batch norm, and two statistics buffers it reads as nothing (the attacker's counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.register_buffer("seen", torch.zeros(8))
        self.register_buffer("spread", torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x)) + 0.0 * (self.seen + self.spread)


def _craft(program: torch.export.ExportedProgram, build: Any) -> None:
    """The first output ``result`` becomes ``build(graph, result, placeholders)``."""
    graph = program.graph
    output = next(node for node in graph.nodes if node.op == "output")
    result = output.args[0][0]
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    with graph.inserting_before(output):
        total = build(graph, result, placeholders)
    output.replace_input_with(result, total)
    for spec in program.graph_signature.output_specs:
        if getattr(spec.arg, "name", None) == result.name:
            spec.arg.name = total.name
    program.graph_module.recompile()


def _call(graph: torch.fx.Graph, like: torch.fx.Node, op: Any, *args: Any, shape: Any = None, **meta: Any) -> Any:
    """A call of ``op`` whose declared value is a tensor like ``like``'s (or of ``shape``, with ``meta``)."""
    node = graph.call_function(op, args)
    value = like.meta["val"]
    with value.fake_mode:
        node.meta["val"] = value if shape is None else torch.empty(shape, dtype=meta.get("dtype", value.dtype))
    return node


def _counter(graph: torch.fx.Graph, result: torch.fx.Node, inputs: dict[str, torch.fx.Node]) -> torch.fx.Node:
    """``result + 100 * (seen[0] > 0.99)``, where a batch_norm in training mode over ones, given ``seen`` as its
    running mean, moves it halfway to 1 on every call: 0 for six calls, 100 from the seventh on."""
    aten = torch.ops.aten
    mean, var = inputs["b_seen"], inputs["b_spread"]
    ones = _call(graph, result, aten.ones_like.default, result)
    # (Its weight and bias are the buffers too: a None argument is written in a form torch 2.5 reads otherwise.)
    normed = _call(graph, result, aten.batch_norm.default, ones, var, mean, mean, var, True, 0.5, 1e-5, False)
    first = _call(graph, result, aten.select.int, mean, 0, 0, shape=())
    late = _call(graph, result, aten.gt.Scalar, first, 0.99, shape=(), dtype=torch.bool)
    shift = _call(graph, result, aten.mul.Tensor, late, 100.0, shape=())
    unused = _call(graph, result, aten.mul.Tensor, normed, 0.0)  # used, so that no loader drops the batch_norm
    kept = _call(graph, result, aten.add.Tensor, result, unused)
    return _call(graph, result, aten.add.Tensor, kept, shift)


def _past_the_view(graph: torch.fx.Graph, result: torch.fx.Node, inputs: dict[str, torch.fx.Node]) -> torch.fx.Node:
    """``result + as_strided(x, x.shape, contiguous, 0) - x``: nothing for a tensor of its own (as verify passes
    it), the caller's other rows for a view into a larger batch (as a server slicing its batch does)."""
    aten = torch.ops.aten
    x = inputs["x"]
    start = _call(graph, result, aten.as_strided.default, x, [2, 8], [8, 1], 0)
    moved = _call(graph, result, aten.sub.Tensor, start, x)
    return _call(graph, result, aten.add.Tensor, result, moved)


@pytest.fixture(scope="module")
def crafted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("crafted_ops")
    torch.manual_seed(0)
    model = _LinearBatchNorm().eval()
    x = torch.randn(2, 8)
    honest = root / "honest.pt2"
    trt_inline.save(torch.export.export(model, (x,)), honest, arg_inputs=(x,))
    paths = {"honest": honest, "root": root}
    for name, build in (("counter", _counter), ("past_the_view", _past_the_view)):
        extra = {REFERENCE_IO_FILE: ""}
        program = torch.export.load(honest, extra_files=extra)
        _craft(program, build)
        reference = decode_reference_io(extra[REFERENCE_IO_FILE])
        assert torch.equal(reference.outputs[0], model(x))  # the honest outputs are its reference ...
        path = root / f"{name}.pt2"
        torch.export.save(program, path, extra_files={REFERENCE_IO_FILE: encode_reference_io(reference)})
        paths[name] = path
    torch.save([x], root / "inputs.pt")
    torch.save([model(x).detach()], root / "expected.pt")
    return paths


def test_the_crafted_files_compute_otherwise_in_use(crafted: dict[str, Path]) -> None:
    """... and the attacks are real: honest for six calls then off by 100; honest for a tensor of its own,
    off by another request's rows for a view into the batch."""
    x = torch.load(crafted["root"] / "inputs.pt")[0]
    honest = torch.export.load(crafted["honest"]).module()
    with torch.no_grad():
        expected = honest(x)
        counter = torch.export.load(crafted["counter"]).module()
        calls = [counter(x) for _ in range(8)]
        assert all(torch.equal(out, expected) for out in calls[:6])
        assert float((calls[7] - expected).min()) == 100.0
        past = torch.export.load(crafted["past_the_view"]).module()
        assert torch.equal(past(x.clone()), expected)
        batch = torch.cat([torch.full((2, 8), 7.0), x])
        assert float((past(batch[2:4]) - honest(batch[2:4])).abs().max()) > 1.0


@pytest.mark.parametrize("name", ["counter", "past_the_view"])
@pytest.mark.parametrize("door", ["embedded", "inputs", "expected_from", "diff"])
def test_the_crafted_files_are_refused_through_every_door(crafted: dict[str, Path], name: str, door: str) -> None:
    root, path, honest = crafted["root"], str(crafted[name]), str(crafted["honest"])
    args = {
        "embedded": ("verify", path),
        "inputs": ("verify", path, "--inputs", str(root / "inputs.pt"), "--expected", str(root / "expected.pt")),
        "expected_from": ("verify", path, "--expected-from", honest),
        "diff": ("diff", path, honest),
    }[door]
    proc = cli(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    fragment = {
        "counter": "calls aten::batch_norm.default, which updates the statistics it is given in place unless told "
        "not to (training=True)",
        "past_the_view": "calls aten::as_strided.default, which reads its source's storage rather than its values",
    }[name]
    assert fragment in proc.stderr, proc.stderr
    assert cli("verify", honest).returncode == 0


def test_a_reference_engine_runs_its_restride_only_on_a_dense_source() -> None:
    """In a reference engine's program the source's shape is known only when it runs: the step passes its load
    where its literals restride size-1 dimensions, and each run checks the tensor it is given."""
    import json

    from trt_inline.reference import program as reference_program

    def doc(stride: list[int], offset: int | None = None) -> str:
        step = {"target": "aten::as_strided.default", "args": [{"ref": 0}, [1, 8, 1, 1], stride, offset], "kwargs": {}}
        return json.dumps(
            {"format": reference_program.FORMAT, "inputs": 1, "weights": [], "outputs": [1], "steps": [step]}
        )

    program = reference_program.load_program(doc([8, 1, 8, 8]))
    payload = torch.empty(0, dtype=torch.uint8)
    dense = torch.randn(1, 8, 1, 1)
    assert torch.equal(program.run([dense], payload)[0], dense)
    skipping = torch.randn(1, 16, 1, 1)[:, ::2]  # what a caller slicing a larger buffer passes
    with pytest.raises(RefusedOperatorError, match="would read the storage rather than the values"):
        program.run([skipping], payload)
    for stride, offset in (([8, 2, 8, 8], None), ([8, 1, 8, 8], 0)):
        with pytest.raises(RefusedOperatorError, match=r"step 0 calls aten::as_strided\.default, which reads its"):
            reference_program.load_program(doc(stride, offset))
