"""Verdicts that hold: operators that report how a program is run are refused, the verify run is a normal
call, and a program that reads how it is run is caught.

A file crafted as an attacker who read the verifier would: its program adds
``is_leaf(h)`` to its output, which is 1 where the run records no autograd graph (a
run under ``torch.no_grad()``, as verify's used to be) and 0 in a normal call of
``torch.export.load(f).module()`` (grad mode on, its weights requiring grad). It embeds
the outputs of the no-grad run as its reference, so that a verify under ``no_grad``
passes it while every normal call computes something else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support.commands import cli
from support.verdicts import LayoutSwitch, real_models

import trt_inline
from trt_inline import allowed_ops
from trt_inline.archive import REFERENCE_IO_FILE, decode_reference_io
from trt_inline.archive.program_checks import output_reads
from trt_inline.archive.reference_io import encode_reference_io
from trt_inline.errors import RefusedOperatorError
from trt_inline.verify.compare import LAYOUT_RUN, RUN_MODES, compare_output, laid_out_otherwise, modes_disagree, run_on


def _add_to_first_output(program: torch.export.ExportedProgram, op: Any, value: Any) -> None:
    """The program's first output ``result`` becomes ``result + op(result)``; ``value``: ``op``'s declared result
    (None: a tensor like ``result``)."""
    graph = program.graph
    output = next(node for node in graph.nodes if node.op == "output")
    result = output.args[0][0]
    with graph.inserting_before(output):
        added = graph.call_function(op, (result,))
        added.meta["val"] = result.meta["val"] if value is None else value
        total = graph.call_function(torch.ops.aten.add.Tensor, (result, added))
        total.meta["val"] = result.meta["val"]
    output.replace_input_with(result, total)
    for spec in program.graph_signature.output_specs:
        if getattr(spec.arg, "name", None) == result.name:
            spec.arg.name = total.name
    program.graph_module.recompile()


@pytest.fixture(scope="module")
def grad_mode_reader(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grad_mode_reader")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).eval()
    x = torch.randn(2, 8)
    honest = root / "honest.pt2"
    trt_inline.save(torch.export.export(model, (x,)), honest, arg_inputs=(x,))

    extra = {REFERENCE_IO_FILE: ""}
    program = torch.export.load(honest, extra_files=extra)
    _add_to_first_output(program, torch.ops.aten.is_leaf.default, True)
    with torch.no_grad():
        quiet = program.module()(x)
    reference = decode_reference_io(extra[REFERENCE_IO_FILE])
    reference.outputs = [quiet.detach()]
    crafted = root / "crafted.pt2"
    torch.export.save(program, crafted, extra_files={REFERENCE_IO_FILE: encode_reference_io(reference)})
    wide = torch.nn.Linear(600, 600).eval()  # 1.4 MiB of weights: 16 MiB is too little to run it
    x600 = torch.randn(2, 600)
    trt_inline.save(torch.export.export(wide, (x600,)), root / "wide.pt2", arg_inputs=(x600,))
    torch.save([x], root / "inputs.pt")
    torch.save([quiet.detach()], root / "expected.pt")
    return {"honest": honest, "crafted": crafted, "root": root}


def test_the_crafted_file_computes_otherwise_in_a_normal_call(grad_mode_reader: dict[str, Path]) -> None:
    """The attack is real: the same file, the same inputs, a normal call and a no-grad call differ by 1."""
    program = torch.export.load(grad_mode_reader["crafted"])
    assert any(n.target is torch.ops.aten.is_leaf.default for n in program.graph.nodes)
    x = torch.load(grad_mode_reader["root"] / "inputs.pt")[0]
    normal = program.module()(x)
    with torch.no_grad():
        quiet = program.module()(x)
    assert float((quiet - normal).abs().max()) == 1.0


@pytest.mark.parametrize("against", ["embedded", "inputs"])
def test_verify_runs_as_a_normal_call_and_fails_the_crafted_file(
    grad_mode_reader: dict[str, Path], against: str
) -> None:
    root = grad_mode_reader["root"]
    given = ["--inputs", str(root / "inputs.pt"), "--expected", str(root / "expected.pt")]
    crafted = [str(grad_mode_reader["crafted"]), *(given if against == "inputs" else [])]
    # is_leaf returns a bool, not a tensor: refused for what it could report ...
    proc = cli("verify", *crafted)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "calls aten::is_leaf.default, whose result is not a tensor" in proc.stderr, proc.stderr
    # ... and where a trusted file's reader of state is allowed, the run as a normal call still catches it.
    proc = cli("verify", *crafted, "--allow-op", "aten::is_leaf")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "output 0 differs" in proc.stdout
    # The honest file passes.
    proc = cli("verify", str(grad_mode_reader["honest"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_program_whose_modes_disagree_is_named() -> None:
    """run_on runs in each mode and names the output that a second mode (inference mode) changed."""
    assert [name for name, _ in RUN_MODES] == ["as a normal call (grad mode on)", "under torch.inference_mode()"]
    weight = torch.nn.Parameter(torch.ones(3))

    def reads_its_mode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x * weight
        return h, h + float(torch.ops.aten.is_leaf.default(h))

    run = run_on(reads_its_mode, [torch.ones(3)], {}, None)
    outputs, problems = run.outputs, run.problems
    assert run.notes == []
    assert not outputs[1].requires_grad and float(outputs[1][0]) == 1.0  # the normal call's outputs, detached
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        "output 1 differs between a run as a normal call (grad mode on) and a run under torch.inference_mode()"
    ), problems


@pytest.mark.parametrize("limit", ["1M", "16M"])
def test_a_memory_limit_too_small_is_named_as_one(
    grad_mode_reader: dict[str, Path], limit: str, monkeypatch: pytest.MonkeyPatch, fresh_children: None
) -> None:
    """However the child fails under a tiny limit (a thread that cannot start, native code exiting), the one
    line says it ran out of its memory limit and that --memory-limit raises it."""
    # CUDA hidden: where the child may use CUDA its limit is watched on resident memory instead (named alike).
    # trt-inline's main in this process; its child a fresh interpreter, as the command starts it.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    wide = str(grad_mode_reader["root"] / "wide.pt2")
    proc = cli("verify", wide, "--memory-limit", limit)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and f"memory limit of {limit[:-1]} MiB" in line, line
    assert "--memory-limit raises it" in line, line


def test_inspect_warns_of_what_verify_refuses(grad_mode_reader: dict[str, Path], tmp_path: Path) -> None:
    """A node drawing from the global RNG: inspect shows the table with a warning line first, running nothing;
    verify refuses the file."""
    program = torch.export.load(grad_mode_reader["honest"])
    _add_to_first_output(program, torch.ops.aten.rand_like.default, None)
    path = tmp_path / "noisy.pt2"
    torch.export.save(program, path)

    proc = cli("inspect", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(
        "warning: verify refuses this file: a node or engine step calls aten::rand_like.default, whose result "
        "depends on the global random state"
    ), lines[0]
    assert sum(line.startswith("warning:") for line in lines) == 1, proc.stdout
    assert any("rand_like" in line for line in lines[1:]), proc.stdout  # the table shows the node
    proc = cli("verify", str(path))
    assert proc.returncode == 2 and "calls aten::rand_like.default" in proc.stderr, proc.stdout + proc.stderr
    clean = cli("inspect", str(grad_mode_reader["honest"]))
    assert clean.returncode == 0 and "warning:" not in clean.stdout, clean.stdout


def _every_call_allowed(device: str) -> set[str]:
    """Check every call of every real model's program, as exported and lowered to core ATen; the operators seen.

    As exported, a layer built in place (``ReLU(inplace=True)``) calls ``relu_``: refused as a write (a saved
    program is lowered, where it is ``relu``), and its functional form must be on the list.
    """
    refused, seen = [], set()
    for name, model, inputs, dynamic_shapes in real_models(device):
        exported = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
        for program in (exported, exported.run_decompositions()):  # as exported, and lowered to core ATen
            for node in program.graph.nodes:
                if node.op != "call_function":
                    continue
                seen.add(allowed_ops.qualified_name(node.target).partition(".")[0])
                try:
                    allowed_ops.check_call(node.target, node.args, node.kwargs)
                    allowed_ops.check_reads(node.target, output_reads(node))
                except Exception as exc:
                    functional = allowed_ops.qualified_name(node.target).partition(".")[0].removesuffix("_")
                    if program is exported and "writes to its arguments" in str(exc):
                        if functional in allowed_ops.ALLOWED_ATEN:
                            continue
                    refused.append(f"{name}: {exc}")
    assert refused == [], "\n".join(dict.fromkeys(refused))
    return seen


@pytest.mark.heavy
def test_every_operator_real_models_export_to_is_allowed() -> None:
    """The allow-list refuses nothing a real model in eval mode exports to, on the CPU (as exported and lowered
    to core ATen): every common layer and tensor function, residual blocks, attention, recurrent layers, scalars
    under dynamic shapes."""
    seen = _every_call_allowed("cpu")
    # The walk is wide: convolutions to attention, recurrent layers, losses and FFTs (about 250 operators).
    assert len(seen) > 200 and {"aten::conv2d", "aten::lstm", "aten::_fft_r2c", "aten::embedding_bag"} <= seen


@pytest.mark.cuda
def test_every_operator_real_models_export_to_on_cuda_is_allowed() -> None:
    """The same on CUDA, where attention lowers to CUDA kernels (and torchvision's models where installed)."""
    _every_call_allowed("cuda")


class _ReadsPastItsInput(torch.nn.Module):
    """segment_reduce told to skip its checks (``unsafe=True``) reads 64 values past a 4-value input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(x.shape[0], x.shape[0] + 65, dtype=torch.int64)
        return torch.ops.aten.segment_reduce.default(x, "max", offsets=offsets, unsafe=True)


def test_an_operator_told_to_skip_its_checks_is_refused(tmp_path: Path) -> None:
    x = torch.zeros(4, dtype=torch.float64)
    path = tmp_path / "reads_past.pt2"
    trt_inline.save(torch.export.export(_ReadsPastItsInput(), (x,)), path, arg_inputs=(x,))
    assert any(n.target is torch.ops.aten.segment_reduce.default for n in torch.export.load(path).graph.nodes)
    proc = cli("verify", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "calls aten::segment_reduce.default, which can skip the checks of its inputs" in proc.stderr
    assert "(unsafe=True; offsets=" in proc.stderr  # (each literal that keeps it checked, missing: both here)
    graph = torch.fx.Graph()
    computed = graph.placeholder("flag")
    isin = torch.ops.aten.isin.Tensor_Tensor
    allowed_ops.check_call(isin, (computed, computed), {})  # its checks kept (the default)
    for flag in (True, computed):
        with pytest.raises(RefusedOperatorError, match="skip the checks"):
            allowed_ops.check_call(isin, (computed, computed), {"assume_unique": flag})
    with pytest.raises(RefusedOperatorError, match="uninitialized memory"):
        allowed_ops.check_call(torch.ops.aten.resize.default, (computed, [4096]), {})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.7, torch.tensor(0)),  # a float is no int64
        (7, torch.tensor(True)),  # an int is no bool
        (True, torch.tensor(1)),  # nor a bool an int
        (2**70, torch.tensor(0)),
    ],
)
def test_a_scalar_output_is_never_converted_into_its_reference(value: Any, expected: torch.Tensor) -> None:
    found = compare_output(1, value, expected, None, None)
    assert not found.ok and found.problem is not None and found.problem.startswith("output 1 is the"), found


def test_a_float_output_is_compared_without_rounding() -> None:
    """A Python float against its float16 or float32 reference: the reference is widened, the float never rounded
    (2049 does not exist in float16: it is not 2048 at zero tolerance), and a float equal to its own float32
    reference within tolerance passes."""
    found = compare_output(0, 2049.0, torch.tensor(2048.0, dtype=torch.float16), 0.0, 0.0)
    assert not found.ok and found.max_abs_diff == 1.0, found
    assert compare_output(0, 0.1, torch.tensor(0.1), None, None).ok  # float32 0.1 is 0.1 within float32's tolerance


def test_signed_zeros_and_nan_bits_differ() -> None:
    """-0.0 is not 0.0 at zero tolerance (1 / x tells them apart); two runs differing in a NaN's bits disagree."""
    zeros, negative = torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0])
    found = compare_output(0, negative, zeros, 0.0, 0.0)
    assert not found.ok and found.max_abs_diff > 0.0 and "1 of 2 values differ, the first at [0]" in str(found.problem)
    assert compare_output(0, negative, zeros, None, None).ok  # within the default tolerance
    nan = torch.tensor([float("nan")])
    other_nan = nan.view(torch.int32).bitwise_xor(1).view(torch.float32)
    assert compare_output(0, other_nan, nan, 0.0, 0.0).ok  # NaN is NaN as a value ...
    assert modes_disagree([nan], [other_nan], "one way", "another")  # ... but two runs must match bit for bit
    assert modes_disagree([nan], [nan.clone()], "one way", "another") == []


def test_a_program_that_does_not_repeat_itself_is_held_to_its_tolerance() -> None:
    """Kernels built on atomics (CUDA's index_add, scatter_add) change the last bits from run to run in one mode:
    such a program is not blamed for reading its mode; its modes are compared within tolerance, with a note."""
    calls = [0]

    def jitters(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return x + calls[0] * 1e-9

    run = run_on(jitters, [torch.ones(3, dtype=torch.float64)], {}, None)
    assert calls[0] == 4 and run.problems == [], run  # normal, inference, normal again, inference again
    assert len(run.notes) == 1 and "does not give the same bits twice in one mode" in run.notes[0]

    def drifts(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return x + calls[0]

    run = run_on(drifts, [torch.ones(3)], {}, None)
    assert run.problems and run.problems[0].startswith("output 0 differs between a run as a normal call"), run


@pytest.fixture(scope="module")
def layout_switch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layout_switch")
    torch.manual_seed(0)
    x = torch.randn(64, 1024)
    path = root / "switch.pt2"
    trt_inline.save(torch.export.export(LayoutSwitch(), (x,)), path, arg_inputs=(x,))
    torch.save([x], root / "inputs.pt")
    torch.save([x.relu()], root / "expected.pt")
    honest = root / "honest.pt2"
    trt_inline.save(torch.export.export(torch.nn.ReLU(), (x,)), honest, arg_inputs=(x,))
    return {"switch": path, "honest": honest, "root": root}


def test_the_layout_switch_computes_otherwise_on_a_view(layout_switch: dict[str, Path]) -> None:
    module = torch.export.load(layout_switch["switch"]).module()
    x = torch.load(layout_switch["root"] / "inputs.pt")[0]
    assert torch.equal(module(x), x.relu())
    view = laid_out_otherwise(x)
    assert torch.equal(view, x) and not torch.equal(module(view), x.relu())


@pytest.mark.parametrize("door", ["embedded", "inputs", "expected_from"])
def test_verify_runs_inputs_laid_out_as_a_caller_may(layout_switch: dict[str, Path], door: str) -> None:
    """PASS before (every run on contiguous inputs); now the run on strided views differs past tolerance: exit 1."""
    root, path = layout_switch["root"], str(layout_switch["switch"])
    given = {
        "embedded": (),
        "inputs": ("--inputs", str(root / "inputs.pt"), "--expected", str(root / "expected.pt")),
        "expected_from": ("--expected-from", str(layout_switch["honest"])),
    }[door]
    proc = cli("verify", path, *given)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"output 0 differs between a run as a normal call (grad mode on) and a run {LAYOUT_RUN}" in proc.stdout
    assert cli("verify", str(layout_switch["honest"])).returncode == 0


def test_a_program_that_raises_only_on_strided_inputs_has_a_problem() -> None:
    """A program that runs on contiguous inputs and raises on strided views of the same values would pass verify
    and refuse what a caller passes (a switch may raise on purpose): a problem. Exported views of such inputs work:
    every dimension is strided alike, so their dimensions merge."""

    def needs_contiguous(x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            raise RuntimeError("expects a contiguous input")
        return torch.ops.aten.view.default(x, [-1]) * 2

    assert torch.ops.aten.view.default(laid_out_otherwise(torch.randn(4, 8)), [-1]).shape == (32,)
    run = run_on(needs_contiguous, [torch.randn(4, 8)], {}, None, layouts=True)
    assert len(run.problems) == 1 and "raises on its inputs as strided views" in run.problems[0], run.problems
    assert "expects a contiguous input" in run.problems[0]
    assert run_on(lambda x: x * 2, [torch.randn(4, 8)], {}, None, layouts=True).problems == []


def test_a_recurrent_layers_kernel_is_held_to_its_tolerance_across_modes_and_no_more() -> None:
    """torch's LSTM computes otherwise with autograd on (its last bits on CPUs without AVX-512): a program calling
    it has its normal and inference-mode runs compared within the dtype's tolerance, said in a note; a program
    that also reads the grad mode and changes an output by more is still a problem."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 8, num_layers=2, batch_first=True, bidirectional=True).eval()
    x = torch.randn(2, 5, 32)
    program = torch.export.export(lstm, (x,)).module()
    run = run_on(program, [x], {}, None, checked=False)
    assert run.problems == [], run.problems
    with torch.enable_grad():
        plain = lstm(x)[0]
    with torch.inference_mode():
        inferred = lstm(x)[0]
    if not torch.equal(plain, inferred):  # (this CPU's kernels differ: the note says why the runs were compared so)
        assert any("calls aten::lstm, whose CPU kernel computes otherwise with autograd on" in n for n in run.notes)

    class ReadsGradMode(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = program

        def forward(self, value: torch.Tensor) -> Any:
            out = self.inner(value)
            return (out[0] + (1.0 if torch.is_grad_enabled() else 0.0), *out[1:])

    run = run_on(ReadsGradMode(), [x], {}, None, checked=False)
    assert (
        run.problems
        and "output 0 differs between a run as a normal call (grad mode on) and a run under " in (run.problems[0])
    )
