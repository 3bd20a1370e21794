"""What a CUDA machine needs, guarded on every machine; and the CUDA lane (``cuda`` marker, ``.ci/cuda``).

Each CPU test guards one thing that broke on a GPU machine and fails without its fix:
nothing asks torch about CUDA before the sandbox is entered (entering forks, and torch
refuses CUDA in a process forked after it started); the sandbox lets the CUDA driver name
its threads (driver 570+ fails with error 304 where it cannot); the child knows its user
name (torch before 2.13 raises KeyError naming its cache folder without one); reference
payloads copied to another device are cached by identity (a weak-keyed dictionary compares
tensors by value); attention and dropout that cannot draw are allowed. The tests marked
``cuda`` run the whole loop on a CUDA device and are skipped, with the reason, elsewhere.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from support.models import RELU, ConvBnRelu, ScalarCase, TransformerBlock, scalar_cases
from support.processes import REPO, TESTS, load_runs_in_fresh_process, new_interpreter, python_path
from support.programs import SavedSeed
from support.scalars import scalar_crossings
from support.values import as_list, max_abs_diff

import trt_inline
from trt_inline import allowed_ops, reference
from trt_inline.errors import RefusedOperatorError
from trt_inline.isolation import Limits, interpreter, run_isolated, sandbox
from trt_inline.reference import program as reference_program

_WALLS = sandbox.status().missing
needs_sandbox = pytest.mark.skipif(bool(_WALLS), reason=f"this system cannot set up the sandbox: {_WALLS}")
GELU = "torch.ops.aten.gelu.default"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return new_interpreter("-c", code, env=dict(os.environ, PYTHONPATH=python_path(TESTS)), timeout=300)


# ---------------------------------------------------------------------------
# Before the sandbox: nothing starts CUDA
# ---------------------------------------------------------------------------


@pytest.mark.heavy
@needs_sandbox
@pytest.mark.parametrize("native_code", [False, True], ids=["default", "allow-native-code"])
def test_nothing_asks_torch_about_cuda_before_the_sandbox(saved_seed: SavedSeed, native_code: bool) -> None:
    """The interpreter that forks children and a child up to ``sandbox.enter`` make no call that starts CUDA."""
    good = str(saved_seed.good)
    proc = _python(f"from support import cuda_probe; cuda_probe.record_child_start({good!r}, {native_code})")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["outcome"] == "ran", found
    calls: list[str] = found["calls"]
    assert "enter" in calls, calls
    before = calls[: calls.index("enter")]
    assert before == [], f"asked torch about CUDA before entering the sandbox: {before}"


def test_cuda_devices_are_seen_without_starting_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Devices are the driver's control file; CUDA_VISIBLE_DEVICES empty or -1 hides them."""
    present = {"/dev/nvidiactl"}
    monkeypatch.setattr(sandbox.os.path, "exists", lambda path: path in present)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert sandbox.cuda_devices_visible()
    for hidden in ("", " ", "-1", "-1,0"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not sandbox.cuda_devices_visible(), hidden
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert sandbox.cuda_devices_visible()
    present.clear()
    assert not sandbox.cuda_devices_visible()


# ---------------------------------------------------------------------------
# Inside the sandbox: what the CUDA driver does while it starts
# ---------------------------------------------------------------------------

_NAME_THREADS = """
import json, os, sys, tempfile
from pathlib import Path
from trt_inline.isolation import sandbox
from support import cuda_probe
parent = os.getppid()
private = Path(tempfile.mkdtemp())
sandbox.enter(sandbox.Policy(private, devices={devices}))
print(json.dumps(cuda_probe.thread_names({{"parent": parent}}, None)))
"""


@needs_sandbox
def test_the_sandbox_lets_the_cuda_driver_name_its_own_threads() -> None:
    """With devices, a new thread of the child renames itself (the driver does, or fails with error 304);
    the parent's threads stay out of reach; without devices, nothing in procfs is writable."""
    with_devices = _python(_NAME_THREADS.format(devices=True))
    assert with_devices.returncode == 0, with_devices.stderr[-3000:]
    found = json.loads(with_devices.stdout.strip().splitlines()[-1])
    assert found["own thread"] == "SUCCEEDED", found
    assert found["parent's thread"].startswith("blocked"), found
    assert found["parent's limits"].startswith("blocked"), found  # no PID namespace here: seccomp holds it

    without = _python(_NAME_THREADS.format(devices=False))
    assert without.returncode == 0, without.stderr[-3000:]
    found = json.loads(without.stdout.strip().splitlines()[-1])
    assert found["own thread"].startswith("blocked"), found
    assert found["parent's thread"].startswith("blocked"), found


@needs_sandbox
def test_the_child_has_the_callers_user_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """getpass.getuser() in the sandbox (where /etc/passwd is hidden) gives the caller's name, not a KeyError."""
    for variable in ("USER", "LOGNAME", "LNAME", "USERNAME"):
        monkeypatch.delenv(variable, raising=False)  # as under a service manager: the name only in the passwd file
    from support import cuda_probe

    interpreter.user_name.cache_clear()
    try:
        seen = run_isolated(cuda_probe.UserNameRequest(), None, Limits(120, 2 << 30), where="probe").value
    finally:
        interpreter.user_name.cache_clear()
    assert seen == {"user": getpass.getuser()}, seen


# ---------------------------------------------------------------------------
# The reference backend across devices
# ---------------------------------------------------------------------------


def test_payload_copies_on_another_device_are_kept_by_identity() -> None:
    """Engines whose payload sits on one device and inputs on another copy it once (the second call used to
    compare two references to the payload with the tensor's own ==, which raises)."""
    payload = torch.arange(64, dtype=torch.uint8)
    meta = torch.device("meta")
    first = reference_program._payload_on(payload, meta)
    second = reference_program._payload_on(payload, meta)
    assert second is first and first.device == meta
    assert id(payload) in reference_program._device_copies
    key = id(payload)
    del payload, first, second
    assert key not in reference_program._device_copies


# ---------------------------------------------------------------------------
# Random operators: refused only when the call draws
# ---------------------------------------------------------------------------


def _gated(name: str) -> tuple[Any, str, object]:
    """The OpOverload ``name`` names, and the argument (with its quiet value) that says whether a call draws."""
    ((argument, quiet),) = allowed_ops.DRAWS_ONLY_WHEN[name]
    namespace, _, rest = name.partition("::")
    if not hasattr(getattr(torch.ops, namespace), rest):
        pytest.skip(f"torch {torch.__version__} has no {name}")
    packet = getattr(getattr(torch.ops, namespace), rest)
    return getattr(packet, packet.overloads()[0]), argument, quiet


@pytest.mark.parametrize("name", sorted(allowed_ops.DRAWS_ONLY_WHEN))
def test_random_operators_pass_only_when_the_call_cannot_draw(name: str) -> None:
    op, argument, quiet = _gated(name)
    graph = torch.fx.Graph()
    value = graph.placeholder("x")  # a value the graph computes: never taken as quiet
    drawing = 0.1 if isinstance(quiet, float) else True
    allowed_ops.check_call(op, (), {argument: quiet})
    for given in (drawing, value, None, float("nan"), 1e-30) if isinstance(quiet, float) else (drawing, value, None):
        with pytest.raises(RefusedOperatorError, match="depends on the global random state"):
            allowed_ops.check_call(op, (), {argument: given})
    with pytest.raises(RefusedOperatorError, match="depends on the global random state"):
        allowed_ops.check_target(op)  # no call to look at: refused as before
    if "generator" in [a.name for a in op._schema.arguments]:
        with pytest.raises(RefusedOperatorError, match="an explicit generator"):
            allowed_ops.check_call(op, (), {argument: quiet, "generator": torch.Generator()})


def test_attention_lowerings_in_engine_programs() -> None:
    """Each attention kernel scaled_dot_product_attention lowers to (CPU, CUDA efficient/flash/cuDNN) in a
    reference program: allowed with dropout_p 0.0, refused with 0.1, naming the step and the argument."""
    lowerings = [name for name, gate in allowed_ops.DRAWS_ONLY_WHEN.items() if gate[0][0] == "dropout_p"]
    assert "aten::_scaled_dot_product_efficient_attention" in lowerings
    for name in lowerings:
        op = getattr(torch.ops.aten, name.partition("::")[2]).default
        position = [a.name for a in op._schema.arguments].index("dropout_p")
        refs: list[Any] = [{"ref": 0}, {"ref": 0}, {"ref": 0}, *[None] * (position - 3)]
        # The attention output itself, as a program reads it (a kernel of several outputs through getitem).
        several = len(op._schema.returns) > 1
        read = [{"target": "operator.getitem", "args": [{"ref": 1}, 0], "kwargs": {}}] if several else []
        for dropout, allowed in ((0.0, True), (0.1, False)):
            doc = {
                "format": reference_program.FORMAT, "inputs": 1, "weights": [], "outputs": [1 + len(read)],
                "steps": [{"target": f"{name}.default", "args": [*refs, dropout], "kwargs": {}}, *read],
            }  # fmt: skip
            text = json.dumps(doc)
            if allowed:
                reference_program.load_program(text)
            else:
                with pytest.raises(RefusedOperatorError, match=r"step 0 calls .*dropout_p=0\.1"):
                    reference_program.load_program(text)


def test_attention_outputs_that_hold_no_values_are_never_read() -> None:
    """The CUDA attention kernels leave their random seed and offset uninitialized where they draw nothing: a
    graph or an engine program may read their output and log-sum-exp (and sequence lengths), nothing else."""
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention.default
    allowed_ops.check_reads(efficient, [0, 1, 0])
    for reads in ([2], [3], [0, None]):
        with pytest.raises(RefusedOperatorError, match="uninitialized memory where it draws nothing"):
            allowed_ops.check_reads(efficient, reads)
    allowed_ops.check_reads(torch.ops.aten._scaled_dot_product_flash_attention.default, [0, 4, 5])
    with pytest.raises(RefusedOperatorError, match="its output 6 of"):
        allowed_ops.check_reads(torch.ops.aten._scaled_dot_product_flash_attention.default, [6])
    allowed_ops.check_reads(torch.ops.aten.relu.default, [None])  # (no such outputs)

    def program(index: int) -> str:
        attention = {"target": "aten::_scaled_dot_product_efficient_attention.default",
                     "args": [{"ref": 0}, {"ref": 0}, {"ref": 0}, None, False, 0.0], "kwargs": {}}  # fmt: skip
        read = {"target": "operator.getitem", "args": [{"ref": 1}, index], "kwargs": {}}
        doc = {
            "format": reference_program.FORMAT,
            "inputs": 1,
            "weights": [],
            "outputs": [2],
            "steps": [attention, read],
        }
        return json.dumps(doc)

    reference_program.load_program(program(0))
    with pytest.raises(RefusedOperatorError, match=r"step 0 reads its output 2 of"):
        reference_program.load_program(program(2))


def test_a_transformer_block_saves_loads_and_verifies(tmp_path: Path) -> None:
    """Pre-norm attention block, gelu in PyTorch: saved, loaded in a fresh process bit for bit, verified."""
    model = TransformerBlock().eval()
    x = torch.randn(2, 5, 32)
    compiled = reference.compile(model, (x,), torch_executed_ops=[GELU])
    kinds = {type(m).__name__ for _, m in compiled.named_children()}
    assert "ReferenceEngine" in kinds and "GraphModule" in kinds
    path = tmp_path / "block.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,))
    with torch.no_grad():
        expected = as_list(compiled(x))
        assert max_abs_diff(expected, as_list(model(x))) <= 1e-5
    loaded = load_runs_in_fresh_process(tmp_path, [path], [(x,)])[str(path)][0]
    assert max_abs_diff(loaded["outputs"], expected) == 0.0
    report = trt_inline.verify(path)
    assert report.ok, report.to_text()


def test_dropout_that_draws_is_refused_at_save(tmp_path: Path) -> None:
    """A block whose dropout runs in training mode draws at every call: the reference backend's save refuses it."""
    model = TransformerBlock(dropout=0.1).eval()
    model.drop.train()
    x = torch.randn(2, 5, 32)
    with pytest.raises(RefusedOperatorError, match=r"global random state \(train=True"):
        compiled = reference.compile(model, (x,), torch_executed_ops=[GELU])
        trt_inline.save(compiled, tmp_path / "drawing.pt2", arg_inputs=(x,))


# ---------------------------------------------------------------------------
# The CUDA lane: the whole loop on a CUDA device (.ci/cuda)
# ---------------------------------------------------------------------------

cuda = pytest.mark.cuda


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return new_interpreter("-m", "trt_inline", *args, env=dict(os.environ, PYTHONPATH=python_path()), cwd=REPO)


@cuda
def test_doctor_says_cuda_runs_in_the_sandbox() -> None:
    proc = _cli("doctor")
    line = next((line for line in proc.stdout.splitlines() if line.startswith("CUDA in sandbox")), "")
    assert "works" in line, proc.stdout + proc.stderr


@cuda
@pytest.mark.parametrize("args", [(), ("--device", "cuda"), ("--device", "cuda", "--per-engine")])
def test_a_cpu_file_verifies_on_a_cuda_machine_in_the_sandbox(saved_seed: SavedSeed, args: tuple[str, ...]) -> None:
    proc = _cli("verify", str(saved_seed.good), *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("PASS") and "seccomp" in proc.stdout


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("retrace", [True, False], ids=["retrace", "no-retrace"])
def test_the_reference_backend_on_cuda(tmp_path: Path, dtype: torch.dtype, retrace: bool) -> None:
    """Compiled, saved, loaded in a fresh process and verified in the sandbox, all on CUDA, bit for bit."""
    model = ConvBnRelu().eval().to("cuda", dtype)
    x = torch.randn(2, 3, 8, 8, device="cuda", dtype=dtype)
    compiled = reference.compile(model, (x,), torch_executed_ops=[RELU])
    path = tmp_path / "cuda.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,), retrace=retrace)
    with torch.no_grad():
        expected = as_list(compiled(x))
    assert all(t.is_cuda for t in expected)
    loaded = load_runs_in_fresh_process(tmp_path, [path], [(x,)])[str(path)][0]
    assert all(t.is_cuda for t in loaded["outputs"])
    assert max_abs_diff(loaded["outputs"], expected) == 0.0
    proc = _cli("verify", str(path))
    assert proc.returncode == 0 and "max abs diff 0 " in proc.stdout, proc.stdout + proc.stderr


@cuda
def test_a_cuda_file_verifies_on_the_cpu(tmp_path: Path) -> None:
    """Saved on the GPU, every engine a reference engine: verifies with --device cpu (a CPU CI's check)."""
    model = ConvBnRelu().eval().to("cuda")
    x = torch.randn(2, 3, 8, 8, device="cuda")
    path = tmp_path / "cuda.pt2"
    trt_inline.save(reference.compile(model, (x,), torch_executed_ops=[RELU]), path, arg_inputs=(x,))
    # Another device computes otherwise within rounding (CUDA convolutions in TF32 by default): 1e-2.
    proc = _cli("verify", str(path), "--device", "cpu", "--atol", "1e-2", "--rtol", "1e-2")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@cuda
def test_a_transformer_block_on_cuda(tmp_path: Path) -> None:
    """Attention lowers to a CUDA kernel that takes dropout_p: with 0.0 it is saved and verified."""
    model = TransformerBlock().eval().to("cuda")
    x = torch.randn(2, 5, 32, device="cuda")
    compiled = reference.compile(model, (x,), torch_executed_ops=[GELU])
    path = tmp_path / "block.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,))
    proc = _cli("verify", str(path), "--random-inputs", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------
# Device placement on load
# ---------------------------------------------------------------------------


def _skip_without_device_moves() -> None:
    try:
        from torch.export.passes import move_to_device_pass  # noqa: F401
    except ImportError:
        pytest.skip(f"torch {torch.__version__} has no torch.export.passes.move_to_device_pass")


def test_load_places_the_program_on_the_device_asked_for(saved_seed: SavedSeed) -> None:
    """``trt_inline.load(path, device=...)``: weights, constants and the engines' payloads move; the program
    runs there (the meta device stands in for a second device on a machine that has one)."""
    _skip_without_device_moves()
    on_cpu = trt_inline.load(saved_seed.good)
    state = {**on_cpu.state_dict, **on_cpu.constants}
    assert state and all(t.device.type == "cpu" for t in state.values() if isinstance(t, torch.Tensor))
    moved = trt_inline.load(saved_seed.good, device="meta")
    tensors = [t for t in {**moved.state_dict, **moved.constants}.values() if isinstance(t, torch.Tensor)]
    assert len(tensors) == len(state) and all(t.device.type == "meta" for t in tensors)
    with torch.no_grad():
        outputs = as_list(moved.module()(saved_seed.x.to("meta")))
        expected = as_list(on_cpu.module()(saved_seed.x))
    assert [(o.device.type, o.shape, o.dtype) for o in outputs] == [("meta", e.shape, e.dtype) for e in expected]
    with pytest.raises(trt_inline.VerifyInputError, match="is not a device"):
        trt_inline.load(saved_seed.good, device="nowhere:7")
    with pytest.raises(trt_inline.VerifyInputError, match="device 'cuda:7' is not available here"):
        trt_inline.load(saved_seed.good, device="cuda:7")  # (no such device on a CPU or one-GPU machine)


@cuda
def test_load_places_a_cpu_file_on_cuda(saved_seed: SavedSeed) -> None:
    moved = trt_inline.load(saved_seed.good, device="cuda")
    with torch.no_grad():
        outputs = as_list(moved.module()(saved_seed.x.cuda()))
        expected = as_list(saved_seed.compiled(saved_seed.x))
    assert all(o.is_cuda for o in outputs)
    assert max_abs_diff([o.cpu() for o in outputs], expected) <= 1e-2  # CUDA's TF32 convolutions against the CPU


@cuda
@pytest.mark.parametrize("case", scalar_cases(), ids=lambda case: case.name)
def test_scalars_crossing_engine_boundaries_on_cuda(tmp_path: Path, case: ScalarCase) -> None:
    """Dynamic sizes, a scalar crossing an engine boundary, on CUDA: bitwise at both ends of the range."""
    model = case.model.eval().to("cuda")
    on_cuda = lambda inputs: tuple(t.to("cuda") for t in inputs)  # noqa: E731
    compiled = reference.compile(
        model, on_cuda(case.inputs), torch_executed_ops=case.torch_executed_ops, dynamic_shapes=case.dynamic_shapes
    )
    assert [c for c in scalar_crossings(compiled) if c[0] == case.crossing], "no scalar crossing"
    paths = []
    for retrace in (True, False):
        path = tmp_path / f"{case.name}_{retrace}.pt2"
        trt_inline.save(
            compiled, path, arg_inputs=on_cuda(case.inputs), dynamic_shapes=case.dynamic_shapes, retrace=retrace
        )
        paths.append(path)
    checks = [on_cuda(inputs) for inputs in case.checks]
    runs = load_runs_in_fresh_process(tmp_path, paths, checks)
    for index, inputs in enumerate(checks):
        with torch.no_grad():
            expected = as_list(compiled(*inputs))
        for path in paths:
            assert max_abs_diff(runs[str(path)][index]["outputs"], expected) == 0.0, (path.name, index)
    for path in paths:
        proc = _cli("verify", str(path))
        assert proc.returncode == 0, proc.stdout + proc.stderr


@cuda
@pytest.mark.packages
def test_an_aot_inductor_package_for_cuda(tmp_path: Path) -> None:
    """The reference backend's program compiled by AOTInductor for CUDA: loaded in a fresh process, bitwise."""
    model = ConvBnRelu().eval().to("cuda")
    x = torch.randn(2, 3, 8, 8, device="cuda")
    compiled = reference.compile(model, (x,), torch_executed_ops=[RELU])
    path = tmp_path / "cuda.package.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,), output_format="aot_inductor")
    with torch.no_grad():
        expected = as_list(compiled(x))
    loaded = load_runs_in_fresh_process(tmp_path, [path], [(x,)])[str(path)][0]
    assert max_abs_diff([o.to("cuda") for o in loaded["outputs"]], expected) <= 1e-3  # AOTInductor's own kernels
    proc = _cli("verify", str(path), "--allow-native-code")
    assert proc.returncode == 0, proc.stdout + proc.stderr


_LOAD_ON_CUDA = """
import json, sys, torch, trt_inline
def anonymous():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))
torch.ones(1, device="cuda").add_(1).cpu()  # CUDA's context and a first copy: what any use of CUDA costs once
trt_inline.load(sys.argv[1])  # what the first load of any file costs once (imports, the deserializer's caches)
before = anonymous()
program = trt_inline.load(sys.argv[1], device="cuda")
after = anonymous()
on_cuda = all(t.is_cuda for t in program.state_dict.values())
print(json.dumps({"anonymous": after - before, "on_cuda": on_cuda}))
"""


@cuda
def test_load_onto_cuda_keeps_no_host_copy_of_the_weights(tmp_path: Path) -> None:
    """Weights go from the file mapping to the device: host anonymous memory at most 0.25x the weights plus the
    largest tensor."""
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(32))).eval()
    x = torch.randn(4, 1024)
    path = tmp_path / "weights.pt2"
    trt_inline.save(torch.export.export(model, (x,)), path, arg_inputs=(x,), embed_reference=False)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    proc = _python(_LOAD_ON_CUDA.replace("sys.argv[1]", repr(str(path))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["on_cuda"], found
    assert found["anonymous"] <= weights // 4 + largest, (found, weights)


def test_an_engine_of_scalars_only_lives_on_the_programs_device() -> None:
    """An engine that takes and returns only scalars gets its 0-d tensors on the program's device (a CUDA program's
    on CUDA), never on a default device: the meta device stands in for a second device."""
    from trt_inline.inlining import passes

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2, 3, device="meta")
    graph.output(x)
    program = torch.fx.GraphModule(torch.nn.Module(), graph)
    device = passes._program_device(program)
    assert device == torch.device("meta")
    assert passes._Boundary.of([5], [7], device).device == torch.device("meta")
    assert passes._Boundary.of([torch.empty(1)], [7], device).device == torch.device("cpu")  # a tensor's decides


@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_reduced_precision_and_a_small_fix_search_on_cuda(dtype: torch.dtype) -> None:
    """The reference backend's reduced-precision emulation runs on CUDA: the fp16 build of an activation past the
    fp16 range is wrong where fp32 is not, and find_fix, compiling on CUDA, names the node that brings it back."""
    from support.models import Fp16Overflow
    from support.pairs import autocast_skip, fp16_settings

    torch.manual_seed(0)
    model = Fp16Overflow().eval().to("cuda")
    x = torch.randn(4, 16, device="cuda")
    with torch.no_grad():
        exact = model(x)
        settings = (
            {**fp16_settings(), "autocast_low_precision_type": dtype}
            if autocast_skip() is None
            else {"enabled_precisions": {dtype}}
        )
        built = reference.compile(model, (x,), **settings, disable_tf32=True)
        low = built(x)
    assert low.is_cuda and exact.isfinite().all()
    if dtype == torch.float16:
        assert not low.isfinite().all(), low  # past 65504 in float16: what there is to fix
        if autocast_skip() is None:  # (keeping a module in fp32 is rule-based autocast's: 2.10+)
            report = trt_inline.find_fix(model, (x,), settings={**fp16_settings(), "disable_tf32": True})
            assert report.outcome == "fixed" and [node.name for node in report.nodes] == ["spot"], report.to_text()
    else:  # bfloat16 has float32's range: only its 8 bits of mantissa, a small error, finite
        assert low.isfinite().all() and 0 < float((low - exact).abs().max()) < 1.0
