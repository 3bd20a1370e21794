"""The save -> load -> compare loop on real TensorRT engines (the Docker GPU job: `.ci/gpu`).

Each case compiles with ``torch_tensorrt.dynamo.compile(..., min_block_size=1,
torch_executed_ops=...)``, saves with ``torch_tensorrt.save(...,
output_format="exported_program")`` with the plugin active (no trt_inline call in
between), loads in a fresh process that imports only torch and torch_tensorrt,
checks ``lint()`` and that no ``call_module`` survived, and compares against the
in-memory TensorRT module (fp32: <= 1e-3) and the PyTorch model; then runs
``trt-inline verify`` on the file and keeps its JSON report.

Skipped, with the reason, where CUDA or torch_tensorrt is missing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from support.models import Chain, ConvBnRelu, HalfOverflow, MultiOutputBothSides, ScalarCase, TinyResNet, scalar_cases
from support.processes import REPO, load_in_fresh_process
from support.values import as_list, max_abs_diff

import trt_inline


def _why_not() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import torch_tensorrt  # noqa: F401
    except Exception as exc:  # a missing libnvinfer raises OSError
        return f"torch_tensorrt is not importable ({type(exc).__name__}: {exc})"
    return None


REASON = _why_not()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"real TensorRT engines: {REASON}")]

TRT_ATOL = 1e-3
# TensorRT may use TF32 and fused kernels; against eager PyTorch the bound is looser.
EAGER_ATOL = 5e-2


def _torch_tensorrt() -> Any:
    import torch_tensorrt

    return torch_tensorrt


def _version() -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", _torch_tensorrt().__version__)
    assert match is not None
    return int(match.group(1)), int(match.group(2))


def _keep_report(path: Path, name: str) -> dict[str, Any]:
    """verify's JSON report; the file is ours, so its TensorRT engines may be loaded (not by default)."""
    command = [sys.executable, "-m", "trt_inline.cli", "verify", str(path)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "--allow-native-code" in refused.stderr, refused.stdout + refused.stderr
    proc = subprocess.run([*command, "--allow-native-code", "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    reports = os.environ.get("TRT_INLINE_REPORTS")
    if reports:
        Path(reports).mkdir(parents=True, exist_ok=True)
        (Path(reports) / f"{name}.verify.json").write_text(proc.stdout)
    return report


def roundtrip(
    tmp_path: Path,
    name: str,
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    *,
    torch_executed_ops: Sequence[Any],
    retrace: bool = True,
    dynamic_shapes: Any = None,
    check_inputs: Sequence[Sequence[torch.Tensor]] = (),
) -> Any:
    torch_tensorrt = _torch_tensorrt()
    model = model.eval().cuda()
    inputs = tuple(t.cuda() for t in inputs)
    exported = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    compiled = torch_tensorrt.dynamo.compile(
        exported, inputs, min_block_size=1, torch_executed_ops=set(torch_executed_ops)
    )
    assert trt_inline.is_active(), "importing torch_tensorrt must have activated trt-inline"
    path = tmp_path / f"{name}.pt2"
    extra = {"dynamic_shapes": dynamic_shapes} if dynamic_shapes is not None else {}
    torch_tensorrt.save(
        compiled, str(path), output_format="exported_program", arg_inputs=list(inputs), retrace=retrace, **extra
    )
    for run_inputs in [inputs, *(tuple(t.cuda() for t in c) for c in check_inputs)]:
        results = load_in_fresh_process(tmp_path, [path], run_inputs, imports=("torch_tensorrt",))
        loaded = results[str(path)]
        assert loaded["call_modules"] == []
        with torch.no_grad():
            expected = as_list(compiled(*run_inputs))
            eager = as_list(model(*run_inputs))
        assert max_abs_diff(loaded["outputs"], expected) <= TRT_ATOL
        assert max_abs_diff(loaded["outputs"], eager) <= EAGER_ATOL
    report = _keep_report(path, name)
    assert report["ok"] and report["expected_source"] == "embedded"
    return compiled


def test_seed_scenario_relu_fallback(tmp_path: Path) -> None:
    roundtrip(
        tmp_path, "seed", ConvBnRelu(), (torch.randn(2, 3, 16, 16),), torch_executed_ops=[torch.ops.aten.relu.default]
    )


def test_resnet_residual_add_falls_back(tmp_path: Path) -> None:
    roundtrip(
        tmp_path, "resnet", TinyResNet(), (torch.randn(2, 3, 16, 16),), torch_executed_ops=[torch.ops.aten.add.Tensor]
    )


def test_convolution_falls_back(tmp_path: Path) -> None:
    roundtrip(
        tmp_path,
        "conv",
        ConvBnRelu(),
        (torch.randn(2, 3, 16, 16),),
        torch_executed_ops=[torch.ops.aten.convolution.default],
    )


def test_multi_output_engine(tmp_path: Path) -> None:
    roundtrip(
        tmp_path,
        "multi_output",
        MultiOutputBothSides(),
        (torch.randn(4, 16),),
        torch_executed_ops=[torch.ops.aten.topk.default],
    )


def test_dynamic_batch(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch", min=1, max=16)
    roundtrip(
        tmp_path,
        "dynamic",
        ConvBnRelu(),
        (torch.randn(4, 3, 16, 16),),
        torch_executed_ops=[torch.ops.aten.relu.default],
        dynamic_shapes=({0: batch},),
        check_inputs=[(torch.randn(1, 3, 16, 16),), (torch.randn(9, 3, 16, 16),)],
    )


_SCALAR_CASES = scalar_cases()


@pytest.mark.parametrize("retrace", [True, False])
@pytest.mark.parametrize("case", _SCALAR_CASES, ids=[c.name for c in _SCALAR_CASES])
def test_scalar_crossing_engine_boundaries(tmp_path: Path, case: ScalarCase, retrace: bool) -> None:
    """The scalar-boundary models on real engines, at both ends of the declared range and in between."""
    from support.scalars import scalar_crossings

    torch_tensorrt = _torch_tensorrt()
    inputs = tuple(t.cuda() for t in case.inputs)
    exported = torch.export.export(case.model.eval().cuda(), inputs, dynamic_shapes=case.dynamic_shapes)
    ops = {getattr(torch.ops.aten, name.split(".")[1]) for name in case.torch_executed_ops}
    compiled = torch_tensorrt.dynamo.compile(exported, inputs, min_block_size=1, torch_executed_ops=ops)
    crossings = [c for c in scalar_crossings(compiled) if c[0] == case.crossing]
    if not crossings:
        pytest.skip(f"Torch-TensorRT {torch_tensorrt.__version__} put no scalar {case.crossing} on an engine here")
    roundtrip(
        tmp_path,
        f"{case.name}_{retrace}",
        case.model,
        case.inputs,
        torch_executed_ops=list(ops),
        retrace=retrace,
        dynamic_shapes=case.dynamic_shapes,
        check_inputs=case.checks,
    )


def test_retrace_false(tmp_path: Path) -> None:
    roundtrip(
        tmp_path,
        "legacy",
        ConvBnRelu(),
        (torch.randn(2, 3, 16, 16),),
        torch_executed_ops=[torch.ops.aten.relu.default],
        retrace=False,
    )


def test_cross_compile_graph_is_wired_by_position(tmp_path: Path) -> None:
    """Cross-compiled engines only run on Windows: check the saved graph's wiring, not numbers."""
    torch_tensorrt = _torch_tensorrt()
    dynamo = torch_tensorrt.dynamo
    if not hasattr(dynamo, "cross_compile_for_windows"):
        pytest.skip(f"Torch-TensorRT {torch_tensorrt.__version__} has no cross_compile_for_windows")
    model, inputs = ConvBnRelu().eval().cuda(), (torch.randn(2, 3, 16, 16).cuda(),)
    compiled = dynamo.cross_compile_for_windows(
        torch.export.export(model, inputs), inputs, min_block_size=1, torch_executed_ops={torch.ops.aten.relu.default}
    )
    path = tmp_path / "cross.pt2"
    dynamo.save_cross_compiled_exported_program(compiled, str(path))
    program = torch.export.load(path)
    program.graph_module.graph.lint()
    placeholders = [
        n for n in program.graph.nodes if n.target is torch.ops.tensorrt.no_op_placeholder_for_execute_engine.default
    ]
    engines = [n for n in compiled.graph.nodes if n.op == "call_module" and str(n.target).startswith("_run_on_acc")]
    assert len(placeholders) == len(engines)
    # In the seed model each relu reads the engine right before it: the last engine node ahead of it.
    order = {node: index for index, node in enumerate(program.graph.nodes)}
    relus = [n for n in program.graph.nodes if n.target is torch.ops.aten.relu.default]
    assert relus
    for relu in relus:
        producer = relu.args[0]
        assert producer.target.__name__ == "getitem" and producer.args[0] in placeholders, relu.name
        engines_before = [p for p in placeholders if order[p] < order[relu]]
        assert producer.args[0] is engines_before[-1], f"{relu.name} reads {producer.args[0].name}"


_STOCK_SAVE = textwrap.dedent(
    """
    import sys, torch, torch_tensorrt
    sys.path.insert(0, sys.argv[2])
    from support.models import ConvBnRelu
    torch.manual_seed(0)
    model, x = ConvBnRelu().eval().cuda(), torch.randn(2, 3, 16, 16).cuda()
    compiled = torch_tensorrt.dynamo.compile(
        torch.export.export(model, (x,)), (x,), min_block_size=1, torch_executed_ops={torch.ops.aten.relu.default}
    )
    try:
        torch_tensorrt.save(compiled, sys.argv[1], output_format="exported_program", arg_inputs=[x], retrace=False)
        loaded = torch.export.load(sys.argv[1]).module()
        with torch.no_grad():
            diff = max((a - b).abs().max().item() for a, b in zip(loaded(x), compiled(x)))
        print(f"DIFF {diff}")
    except Exception as exc:
        print(f"SAVE_FAILED {type(exc).__name__}: {exc}")
    """
)


def test_stock_exporter_fails_on_the_seed_scenario(tmp_path: Path) -> None:
    """Without the plugin, versions <= 2.13 cannot save the seed scenario correctly: the plugin is what fixes it."""
    if _version() >= (2, 14):
        pytest.skip("Torch-TensorRT 2.14 wires fallback inputs by position itself")
    env = dict(os.environ, TRT_INLINE_DISABLE="1")
    proc = subprocess.run(
        [sys.executable, "-c", _STOCK_SAVE, str(tmp_path / "stock.pt2"), str(REPO / "tests")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = proc.stdout.strip().splitlines()[-1]
    if outcome.startswith("DIFF"):
        assert float(outcome.split()[1]) > TRT_ATOL, "the stock exporter saved the seed scenario correctly"
    else:
        assert outcome.startswith("SAVE_FAILED"), outcome


def test_save_keeps_one_copy_of_every_engine(tmp_path: Path) -> None:
    """transform()'s copy shares engines and weights: device memory does not grow by the engines' size.

    A chain of eight ``Linear(4096, 4096)`` (512 MiB of fp32 weights, eight
    engines) with ``relu`` falling back. Releases whose ``TorchTensorRTModule``
    has no ``__deepcopy__`` would deserialize every engine again in that copy.
    """
    import importlib
    import inspect

    from support.memory_steps import build_chain

    torch_tensorrt = _torch_tensorrt()
    model, inputs = build_chain(8, 4096)
    model, inputs = model.cuda(), tuple(t.cuda() for t in inputs)
    compiled = torch_tensorrt.dynamo.compile(
        torch.export.export(model, inputs), inputs, min_block_size=1, torch_executed_ops={torch.ops.aten.relu.default}
    )
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    torch.cuda.synchronize()
    exporter = importlib.import_module("torch_tensorrt.dynamo._exporter")
    free_before = torch.cuda.mem_get_info()[0]
    inputs_first = "inputs" in inspect.signature(exporter.transform).parameters
    flat = exporter.transform(compiled, list(inputs)) if inputs_first else exporter.transform(compiled)
    torch.cuda.synchronize()
    grown = free_before - torch.cuda.mem_get_info()[0]
    assert flat is not compiled
    assert grown <= 0.25 * weight_bytes, f"transform() took {grown / 2**20:.0f} MiB of device memory"
    del flat
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    path = tmp_path / "chain.pt2"
    torch_tensorrt.save(compiled, str(path), output_format="exported_program", arg_inputs=list(inputs))
    peak = torch.cuda.max_memory_allocated() - baseline
    assert peak <= 0.25 * weight_bytes, f"save allocated {peak / 2**20:.0f} MiB of device memory at its peak"
    results = load_in_fresh_process(tmp_path, [path], inputs, imports=("torch_tensorrt",))
    with torch.no_grad():
        expected = as_list(compiled(*inputs))
    assert max_abs_diff(results[str(path)]["outputs"], expected) <= TRT_ATOL


def _cli_json(*args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "trt_inline.cli", *args, "--json"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_per_engine_and_diff_on_tensorrt_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Boundary data through torch_tensorrt.save, replayed engine by engine; a changed fallback region is named.

    Running a TensorRT engine runs native code from the file: ``--allow-native-code``
    is required for both, as for any run of a TensorRT file.
    """
    from support.models import CrossedHalves

    torch_tensorrt = _torch_tensorrt()
    model, x = CrossedHalves().eval().cuda(), torch.randn(3, 8).cuda()
    compiled = torch_tensorrt.dynamo.compile(
        torch.export.export(model, (x,)), (x,), min_block_size=1, torch_executed_ops={torch.ops.aten.relu.default}
    )
    engines = [n for n, _ in compiled.named_children() if n.startswith("_run_on_acc_")]
    monkeypatch.setenv("TRT_INLINE_REFERENCE_IO", "boundaries")
    path = tmp_path / "halves.pt2"
    torch_tensorrt.save(compiled, str(path), output_format="exported_program", arg_inputs=[x])

    refused = subprocess.run(
        [sys.executable, "-m", "trt_inline.cli", "verify", str(path), "--per-engine"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert refused.returncode == 2 and "--allow-native-code" in refused.stderr, refused.stdout + refused.stderr
    code, report = _cli_json("verify", str(path), "--per-engine", "--allow-native-code")
    assert code == 0 and report["divergence"] is None
    assert len(report["boundaries"]) == 2 * len(engines) + 1 >= 5
    assert all(row["ok"] and row["own_ok"] for row in report["boundaries"])
    assert max(v["max_abs_diff"] for row in report["boundaries"] for v in row["own"] or []) <= TRT_ATOL

    program = torch.export.load(path)
    relus = [n for n in program.graph.nodes if n.target is torch.ops.aten.relu.default]
    relus[-1].target = torch.ops.aten.sigmoid.default
    program.graph_module.recompile()
    import zipfile

    from trt_inline.archive import REFERENCE_IO_FILE

    with zipfile.ZipFile(path) as archive:
        extra = archive.read(next(n for n in archive.namelist() if n.endswith(REFERENCE_IO_FILE))).decode()
    changed = tmp_path / "halves_sigmoid.pt2"
    torch.export.save(program, changed, extra_files={REFERENCE_IO_FILE: extra})
    code, report = _cli_json("verify", str(changed), "--allow-native-code")
    assert code == 1 and report["divergence"]["kind"] == "fallback", report
    assert relus[-1].name in report["divergence"]["nodes"], report["divergence"]
    assert all(row["own_ok"] for row in report["boundaries"])
    code, report = _cli_json("diff", str(changed), str(path), "--allow-native-code")
    assert code == 1 and relus[-1].name in report["divergence"]["nodes"], report["divergence"]
    code, report = _cli_json("diff", str(path), str(path), "--allow-native-code", "--random-inputs", "2")
    assert code == 0 and report["divergence"] is None


def test_diff_of_two_tensorrt_partitions_compares_engine_outputs_by_provenance(tmp_path: Path) -> None:
    """Two partitions of one model on TensorRT: equal within tolerance, compared where both cut, engine outputs too."""
    import zipfile

    from trt_inline.archive import REFERENCE_IO_FILE, decode_reference_io

    torch_tensorrt = _torch_tensorrt()

    model, x = Chain().eval().cuda(), torch.randn(3, 8).cuda()
    paths = []
    for name, ops in (("coarse", {torch.ops.aten.relu.default}),
                      ("fine", {torch.ops.aten.relu.default, torch.ops.aten.sigmoid.default})):  # fmt: skip
        compiled = torch_tensorrt.dynamo.compile(
            torch.export.export(model, (x,)), (x,), min_block_size=1, torch_executed_ops=ops
        )
        paths.append(tmp_path / f"{name}.pt2")
        torch_tensorrt.save(compiled, str(paths[-1]), output_format="exported_program", arg_inputs=[x])
    provenance = []
    for path in paths:
        with zipfile.ZipFile(path) as archive:
            extra = archive.read(next(n for n in archive.namelist() if n.endswith(REFERENCE_IO_FILE))).decode()
        provenance.append(decode_reference_io(extra).provenance)
    # each save recorded which exported node the engine outputs a fallback reads are
    assert all(p is not None and any(n for e in p["engines"] for n in e["outputs"]) for p in provenance), provenance
    code, report = _cli_json("diff", str(paths[0]), str(paths[1]), "--allow-native-code", "--atol", "1e-3")
    assert code == 0 and report["divergence"] is None, report
    assert any("partitioned differently" in note for note in report["notes"]), report["notes"]
    assert any(" out[" in row["boundary"] for row in report["boundaries"]), report["boundaries"]


def test_refit_of_a_loaded_trt_inline_file(tmp_path: Path) -> None:
    """``refit_module_weights`` on a program loaded from a trt-inline file: new weights, the model's new outputs.

    Refit re-partitions the new weights' program and flattens it with the
    ``inline_torch_modules`` its module bound at import (the plugin's); its
    structural match against the loaded program must hold, and the refitted
    engines must compute what the model with the new weights does.
    """
    from support.models import CrossedHalves

    torch_tensorrt = _torch_tensorrt()
    model, x = CrossedHalves().eval().cuda(), torch.randn(3, 8).cuda()
    refittable = {"immutable_weights": False} if _version() >= (2, 6) else {"make_refittable": True}
    compiled = torch_tensorrt.dynamo.compile(
        torch.export.export(model, (x,)), (x,), min_block_size=1,
        torch_executed_ops={torch.ops.aten.relu.default}, **refittable,
    )  # fmt: skip
    path = tmp_path / "refit.pt2"
    torch_tensorrt.save(compiled, str(path), output_format="exported_program", arg_inputs=[x])
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(-0.5)
        expected = as_list(model(x))
    refitted = torch_tensorrt.dynamo.refit_module_weights(
        torch.export.load(str(path)), torch.export.export(model, (x,)), arg_inputs=(x,)
    )
    with torch.no_grad():
        assert max_abs_diff(as_list(refitted(x)), expected) <= EAGER_ATOL


def test_drill_down_rebuilds_a_tensorrt_engine_as_one_engine_per_step() -> None:
    """Inside a TensorRT engine whose half-precision product overflows: its region rebuilt one engine per step."""
    from trt_inline.verify.drill import rebuild_drill_down

    torch_tensorrt = _torch_tensorrt()

    model, x = HalfOverflow().eval().cuda(), torch.full((2, 64), 2.0, dtype=torch.float16, device="cuda")

    def compile_fp16(module: torch.nn.Module, inputs: list[torch.Tensor]) -> Any:
        # Weights and inputs are half precision: the engine runs in it whatever the typing mode.
        exported = torch.export.export(module, tuple(inputs))
        return torch_tensorrt.dynamo.compile(exported, tuple(inputs), min_block_size=1)

    whole = compile_fp16(model, [x])
    engines = [n for n, _ in whole.named_children() if n.startswith("_run_on_acc_")]
    assert len(engines) == 1  # one engine: its layers are not observable
    with torch.no_grad():
        assert not bool(whole(x).isfinite().all())  # 64 * 600 * 2 = 76800 > 65504
    region = torch.export.export(model, (x,)).run_decompositions().module()
    sentence = rebuild_drill_down(region, [x], compile_fp16)
    assert "(addmm: aten.addmm.default) is the first whose engine differs" in sentence, sentence
    assert "not finite in float16" in sentence


_RANK_SET_WORKER = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch_tensorrt
    import trt_inline

    class RowColumnMLP(torch.nn.Module):
        def __init__(self, rank, world):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            up, down = torch.randn(64, 16, generator=g), torch.randn(16, 64, generator=g)
            self.up = torch.nn.Parameter(up.chunk(world, 0)[rank].clone())
            self.down = torch.nn.Parameter(down.chunk(world, 1)[rank].clone())

        def forward(self, x):
            partial = torch.relu(x @ self.up.t()) @ self.down.t()
            return torch.tanh(funcol.all_reduce(partial, "sum", dist.group.WORLD)) + x

    step, folder = sys.argv[1], sys.argv[2]
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(rank)).cuda()
    template = os.path.join(folder, "mlp_rank{rank}_of_{world_size}.pt2")
    with torch.no_grad():
        if step == "save":
            model = RowColumnMLP(rank, world).eval().cuda()
            compiled = torch_tensorrt.dynamo.compile(
                torch.export.export(model, (x,)), (x,), min_block_size=1,
                torch_executed_ops={"torch.ops._c10d_functional.all_reduce.default",
                                    "torch.ops._c10d_functional.wait_tensor.default"},
            )
            torch_tensorrt.save(compiled, template, output_format="exported_program", arg_inputs=[x], retrace=False)
            torch.save(compiled(x).cpu(), os.path.join(folder, f"expected{rank}.pt"))
        else:
            out = trt_inline.load(template.format(rank=rank, world_size=world)).module()(x)
            diff = (out.cpu() - torch.load(os.path.join(folder, f"expected{rank}.pt"))).abs().max().item()
            open(os.path.join(folder, f"diff{rank}.txt"), "w").write(str(diff))
    dist.destroy_process_group()
    """
)


@pytest.mark.skipif(
    REASON is None and torch.cuda.device_count() < 2, reason="real TensorRT engines: a rank set on NCCL needs two GPUs"
)
def test_rank_set_on_two_gpus(tmp_path: Path) -> None:
    """Two ranks on NCCL: each saves its shard with torch_tensorrt.save (the all_reduce falls back), each loads
    it in a fresh job (bitwise against its compiled module), and `verify --ranks 2` passes."""
    worker = tmp_path / "worker.py"
    worker.write_text(_RANK_SET_WORKER)
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(worker)]
    for step in ("save", "load"):
        done = subprocess.run([*run, step, str(tmp_path)], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-4000:]
    assert [float((tmp_path / f"diff{rank}.txt").read_text()) for rank in range(2)] == [0.0, 0.0]
    template = str(tmp_path / "mlp_rank{rank}_of_{world_size}.pt2")
    verify = [sys.executable, "-m", "trt_inline", "verify", "--ranks", "2", template, "--allow-native-code", "--json"]
    done = subprocess.run(verify, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert [row["status"] for row in json.loads(done.stdout)["ranks"]] == ["PASS", "PASS"]
