"""The rehearsal is the release's: ``reference.compile`` on a Torch-TensorRT release's own pipeline, against that
release's own dry run.

The release is the one the installed torch pairs with, installed as a machine without TensorRT installs it
(``pip install --no-deps torch-tensorrt==X`` and its pure-Python requirements, into a cached folder put first on
``sys.path``: :func:`releases.release_site`). For each model of :func:`models.release_survey` (the first-hour
benchmark's architectures, the examples' models, the fix benchmark's planted spots), in fp32 and in the release's
fp16 build, the module ``reference.compile`` returns is held to the release's own dry run
(:meth:`Rehearsal.dry_run`: the partitioned module exactly as ``torch_tensorrt.dynamo.compile(..., dryrun=True)``
returns it, each accelerated block the ``GraphModule`` the release would hand to TensorRT): the same engines and
fallbacks in the same order, the same nodes (names, operators, module paths, dtypes) in each, every engine's
program holding that block's operators, and the same outputs (bitwise in fp32; in fp16 the same non-finite values
and the engines' fp32 accumulation within fp16's rounding). The fixes the search writes are held to the release
too: compiled by its own pipeline, the modules they name are the ones its classifier keeps in fp32, and the build
is within tolerance. And what the rehearsal does to the caller's process: nothing (it runs in a forked child).

Marked ``release_pipeline``: 2-4 minutes on one worker, so they run with ``--release-pipeline`` in a step of their
own (``.ci/run``; ``.ci/matrix`` passes it on every pair).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.models import Fp16Overflow, LargeMeanNorm, LongSum, release_survey
from support.pairs import fp16_settings, release_for_torch, release_site_or_skip

import trt_inline
from trt_inline.errors import CompileError
from trt_inline.reference.backend import rehearsing
from trt_inline.reference.engine import ReferenceEngine
from trt_inline.reference.lowered import lowered_nodes
from trt_inline.reference.program import encodable_target
from trt_inline.reference.release import INSTALL, PIPELINE_ATTRIBUTE, Rehearsal, installed_release
from trt_inline.releases import minor as releases_minor

pytestmark = pytest.mark.release_pipeline
RELEASE = release_for_torch()
# Where a release's own dry run fails, measured (each is the release's own code: its autocast, rule_based_autocast.py,
# casts every tensor argument of a reduced-precision node, an Embedding's indices too, and sets the value of an
# operator of several results with .to(); 2.7.0 to 2.10.0's decompositions view a transposed attention projection).
_INDICES = "'indices' to have one of the following scalar types: Long, Int; but got torch."  # (HalfTensor, float16)
_TUPLE, _LIST = "'tuple' object has no attribute 'to'", "'list' object has no attribute 'to'"
_VIEW = "Cannot view a tensor with shape torch.Size([16, 2, 4, 8]) and strides (8, 512, 128, 1)"
_AUTOCAST_FAILS = {("lstm", "fp16"): _TUPLE, ("relu_fallback", "fp16"): _LIST}
_VIEWS = {(model, precision): _VIEW for model in ("vit", "bert", "gpt2") for precision in ("fp32", "fp16")}
_EMBEDDINGS = {("bert", "fp16"): _INDICES, ("gpt2", "fp16"): _INDICES}
# Where the release's dry run compiles and the module it returns fails when run (2.11 and 2.12 cast an Embedding's
# indices too, but first meet them when the block runs; 2.13 on, its pipeline runs it): the rehearsal fails alike.
RELEASE_RUN_FAILS: dict[str, dict[tuple[str, str], str]] = {"2.11.0": _EMBEDDINGS, "2.12.1": _EMBEDDINGS}
RELEASE_FAILS: dict[str, dict[tuple[str, str], str]] = {
    "2.5.0": {},
    "2.6.1": {},
    "2.7.0": _VIEWS,
    "2.8.0": _VIEWS,
    "2.9.0": _VIEWS,
    "2.10.0": {**_VIEWS, **_AUTOCAST_FAILS},
    "2.11.0": _AUTOCAST_FAILS,
    "2.12.1": _AUTOCAST_FAILS,
    "2.13.0": {**_EMBEDDINGS, **_AUTOCAST_FAILS},
    "2.14.0": {**_EMBEDDINGS, **_AUTOCAST_FAILS},
}
SURVEY = {name: (model, inputs, settings) for name, model, inputs, settings in release_survey()}


@pytest.fixture(scope="module")
def site() -> Iterator[Path]:
    """The release's package first on ``sys.path`` for this module's tests (never imported here: only found)."""
    if RELEASE is None:
        pytest.skip(f"no Torch-TensorRT release requires torch {torch.__version__}")
    folder = release_site_or_skip(RELEASE.version)
    # (torch's own modules the release's import pulls in, imported here once rather than in every forked child:
    # what the child then imports is the release itself)
    importlib.import_module("torch._dynamo")
    importlib.import_module("torch._inductor.compile_fx")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRT_INLINE_PIPELINE", "auto")  # (tests/conftest.py asks for trt-inline's own elsewhere)
        patch.syspath_prepend(str(folder))
        importlib.invalidate_caches()
        found = installed_release()
        assert found is not None and found.version == RELEASE.version, found
        yield folder
    importlib.invalidate_caches()


def _blocks(module: torch.nn.Module) -> list[tuple[str, str]]:
    return [(name, type(child).__name__) for name, child in module.named_children()]


def _graph(module: torch.fx.GraphModule) -> list[tuple[str, str, str]]:
    return [(node.name, node.op, str(node.target)) for node in module.graph.nodes]


def _operators_of_block(block: torch.fx.GraphModule) -> list[str]:
    return [str(encodable_target(node.target)) for node in block.graph.nodes if node.op == "call_function"]


def _operators_of_engine(engine: ReferenceEngine) -> list[str]:
    return [step["target"] for step in json.loads(engine.program)["steps"]]


def _outputs(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [value for value in torch.utils._pytree.tree_leaves(module(*inputs)) if isinstance(value, torch.Tensor)]


@pytest.mark.parametrize("name", list(SURVEY))
def test_the_rehearsal_is_the_release_dry_run_with_reference_engines(site: Path, name: str) -> None:
    model, inputs, settings = SURVEY[name]
    exported = torch.export.export(model, inputs)
    fp16 = {**settings, **fp16_settings()}
    fails = RELEASE_FAILS.get(RELEASE.version, {})  # type: ignore[union-attr]
    with Rehearsal(installed_release(), exported, inputs) as rehearsal:  # type: ignore[arg-type]
        for precision, given in (("fp32", settings), ("fp16", fp16)):
            expected_failure = fails.get((name, precision))
            try:
                dry = rehearsal.dry_run(given)
            except CompileError as failed:  # (the release's own pipeline fails: so does the rehearsal, saying so)
                assert expected_failure is not None and expected_failure in str(failed), (name, precision, str(failed))
                with pytest.raises(CompileError, match=re.escape(expected_failure)):
                    rehearsal.compile(given, tf32=False)
                continue
            assert expected_failure is None, f"{name} {precision}: the release's dry run no longer fails"
            ours = rehearsal.compile(given, tf32=False)
            # The structure first: the release partitioned it, with engines where it would build TensorRT's.
            engines = [child for child in ours.children() if isinstance(child, ReferenceEngine)]
            assert engines, (name, _blocks(ours))
            assert getattr(ours, PIPELINE_ATTRIBUTE).startswith(f"Torch-TensorRT {RELEASE.version}'s own pipeline")  # type: ignore[union-attr]
            # The same engines and fallbacks, in the same order, called the same way.
            assert [n for n, _ in _blocks(ours)] == [n for n, _ in _blocks(dry)], (name, _blocks(ours), _blocks(dry))
            assert _graph(ours) == _graph(dry), name
            for block_name, block in dry.named_children():
                mine = getattr(ours, block_name)
                if isinstance(mine, ReferenceEngine):
                    assert isinstance(block, torch.fx.GraphModule)
                    # Each engine holds that block's operators (and the casts of TensorRT's fp32 accumulation).
                    held = [op for op in _operators_of_engine(mine) if op != "aten::_to_copy.default"]
                    assert held == [op for op in _operators_of_block(block) if op != "aten::_to_copy.default"], (
                        name,
                        block_name,
                    )
                else:
                    assert _graph(mine) == _graph(block), (name, block_name)
            # The same nodes: names, operators, module paths, the dtype the release chose for each, the block.
            assert ours.trt_inline_lowered == lowered_nodes(dry), name  # type: ignore[attr-defined]
            # The same outputs: in fp32 to its rounding (an engine holds its weights contiguous, where the
            # release's folded ones may be transposed views: another kernel path; bitwise on torch 2.13 and 2.14);
            # in fp16 the same non-finite values, and close.
            fails_when_run = RELEASE_RUN_FAILS.get(RELEASE.version, {}).get((name, precision))  # type: ignore[union-attr]
            if fails_when_run is not None:
                for module in (dry, ours):
                    with pytest.raises(Exception, match=re.escape(fails_when_run)):
                        _outputs(module, inputs)
                continue
            mine_out, release_out = _outputs(ours, inputs), _outputs(dry, inputs)
            assert [t.dtype for t in mine_out] == [t.dtype for t in release_out], name
            for a, b in zip(mine_out, release_out, strict=True):
                if precision == "fp32":
                    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
                else:
                    assert torch.equal(a.isfinite(), b.isfinite()), name
                    torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2, equal_nan=True)
            if precision == "fp16" and RELEASE.autocast:  # type: ignore[union-attr]
                assert any(node.low for node in ours.trt_inline_lowered), name  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("model", "modules"),
    [(Fp16Overflow, ["spot"]), (LongSum, ["mean"]), (LargeMeanNorm, ["offset", "norm"])],
    ids=["fp16 overflow", "long sum", "large mean before a LayerNorm"],
)
def test_a_fix_found_on_the_release_pipeline_is_one_the_release_reads(
    site: Path, model: type[torch.nn.Module], modules: list[str]
) -> None:
    """The planted spots: the search (one rehearsal for all its compiles) names each spot's modules; compiled by
    the release's own pipeline, the patterns it writes keep exactly those modules' nodes in fp32, and the release's
    dry-run build is within tolerance where the build with the settings given is not."""
    if not RELEASE.autocast:  # type: ignore[union-attr]
        pytest.skip(f"Torch-TensorRT {RELEASE.version} has no rule-based autocast")  # type: ignore[union-attr]
    torch.manual_seed(0)
    network, x = model().eval(), torch.randn(8, 16)
    report = trt_inline.find_fix(network, (x,), settings=fp16_settings())
    assert report.outcome == "fixed" and report.minimal, report.to_text()
    assert [node.name for node in report.nodes] == modules, report.to_text()
    assert report.pipeline.startswith(f"Torch-TensorRT {RELEASE.version}'s own pipeline")  # type: ignore[union-attr]
    assert f"autocast_excluded_nodes={[f'^{m}$' for m in modules]!r}" in report.release_call
    with torch.no_grad():
        exact = network(x)
    with Rehearsal(installed_release(), torch.export.export(network, (x,)), (x,)) as rehearsal:  # type: ignore[arg-type]
        given, fixed = rehearsal.dry_run(fp16_settings()), rehearsal.dry_run(report.settings)
    # (the casts autocast inserts carry the module of the value they cast: they are not what a pattern kept)
    computing = [n for n in lowered_nodes(fixed) if n.operator and n.floating and "_to_copy" not in n.operator]
    assert {node.module for node in computing if not node.low} == set(modules), computing
    assert all(node.low for node in lowered_nodes(given) if node.operator and node.floating)
    with torch.no_grad():
        assert not torch.allclose(given(x).float(), exact, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(fixed(x).float(), exact, atol=1e-2, rtol=1e-2)


def test_settings_the_release_would_ignore_are_refused_naming_it(site: Path) -> None:
    model, inputs, _ = SURVEY["norm_mlp"]
    with pytest.raises(CompileError, match=rf"Torch-TensorRT {RELEASE.version}'s dynamo.compile does not read "):  # type: ignore[union-attr]
        trt_inline.reference.compile(model, inputs, no_such_setting=True)
    with pytest.raises(CompileError, match="belong to trt-inline's own partitioner"):
        trt_inline.reference.compile(model, inputs, scalar_boundaries=False)
    if RELEASE.precision == "autocast":  # type: ignore[union-attr]
        with pytest.raises(CompileError, match=r"does not read enabled_precisions .*enable_autocast=True"):
            trt_inline.reference.compile(model, inputs, enabled_precisions={torch.float16})


def test_the_rehearsal_leaves_the_callers_process_as_it_was(site: Path) -> None:
    """Whatever the release's import does, and whatever stands in for TensorRT and CUDA, ends with the child."""
    from torch._dynamo.backends.registry import _BACKENDS  # (read to compare, nothing more)

    def state() -> dict[str, Any]:
        return {
            "modules": {m for m in sys.modules if m.split(".")[0] in ("torch_tensorrt", "tensorrt", "dllist")},
            "cuda": {name: getattr(torch.cuda, name) for name in dir(torch.cuda) if not name.startswith("__")},
            "properties": hasattr(torch._C, "_CudaDeviceProperties"),
            "ops": {name for name in torch._C._dispatch_get_all_op_names() if name.startswith("tensorrt::")},
            "backends": set(_BACKENDS),
            "isfile": os.path.isfile,
            "root handlers": list(logging.getLogger().handlers),
            "threads": torch.get_num_threads(),
        }

    before = state()
    model, inputs, settings = SURVEY["relu_fallback"]
    compiled = trt_inline.reference.compile(model, inputs, **settings)
    assert any(isinstance(child, ReferenceEngine) for child in compiled.children())
    assert state() == before and not before["modules"] and not before["ops"]


# Where a release's converters take the fused collectives into TensorRT engines (TensorRT-LLM's NCCL plugin),
# measured: the rehearsal says so, as reference engines do not hold collectives.
_COLLECTIVES_IN_ENGINES = {"2.10.0"}
# Where the release's own fusion pass breaks the graph, measured: 2.6's creates the fused reduce_scatter call at the
# graph's end (no ``inserting_after``, as its all_gather has), and its lint fails; the rehearsal says so.
_FUSION_FAILS = {"2.6.1"}


def test_a_tensor_parallel_model_runs_its_collectives_where_the_release_put_them(site: Path, tmp_path: Path) -> None:
    """The release's lowering (2.6+) fuses collectives with their waits into a call of its own (a Python function
    to 2.12, ``tensorrt::fused_nccl_*`` from 2.13: ``all_gather`` and ``reduce_scatter``, 2.13+ also
    ``all_reduce``), which exists only where it is imported: the rehearsal hands back the two calls each stands
    for, and the module computes the model's values (a 1-rank gloo group); where the release puts them in an
    engine, it says so in one line."""
    import torch.distributed as dist
    from support.tensor_parallel import RowColumnMLP, SequenceParallelMLP, inputs

    from trt_inline.reference.lowered import LOWERED_ATTRIBUTE

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for model in (SequenceParallelMLP(0, 1).eval(), RowColumnMLP(0, 1).eval()):
            x = inputs(0)
            exported = torch.export.export(model, (x,))
            if RELEASE.version in _FUSION_FAILS and isinstance(model, SequenceParallelMLP):  # type: ignore[union-attr]
                with pytest.raises(
                    CompileError, match=r"'tensorrt_fused_nccl_reduce_scatter_op' of Node .* used before it has"
                ):
                    trt_inline.reference.compile(exported, (x,), min_block_size=1)
                continue
            if RELEASE.version in _COLLECTIVES_IN_ENGINES and isinstance(model, SequenceParallelMLP):  # type: ignore[union-attr]
                with pytest.raises(
                    CompileError, match=r"puts the collective .* in engine _run_on_acc_\d+, to run on Te"
                ):
                    trt_inline.reference.compile(exported, (x,), min_block_size=1)
                continue
            compiled = trt_inline.reference.compile(exported, (x,), min_block_size=1)
            lowered = getattr(compiled, LOWERED_ATTRIBUTE)
            if releases_minor(RELEASE.version) >= (2, 6) and isinstance(model, SequenceParallelMLP):  # type: ignore[union-attr]
                fused = [node.name for node in lowered if "fused_nccl" in node.name or "fused_nccl" in node.operator]
                assert len(fused) == 2, [node.name for node in lowered]  # (the structure: the release fused them)
            targets = [
                str(node.target) for child in compiled.children() if isinstance(child, torch.fx.GraphModule)
                for node in child.graph.nodes if node.op == "call_function"
            ]  # fmt: skip
            assert targets and all(target.startswith("_c10d_functional.") for target in targets), targets
            assert targets.count("_c10d_functional.wait_tensor.default") == len(targets) // 2, targets
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    finally:
        dist.destroy_process_group()


def test_without_a_release_the_module_says_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """No release on the path: trt-inline's own pipeline, and one line saying so, naming the release to install."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p) / "torch_tensorrt").is_dir()])
    monkeypatch.setenv("TRT_INLINE_PIPELINE", "auto")
    importlib.invalidate_caches()
    if installed_release() is not None:
        pytest.skip("a Torch-TensorRT release is installed in this environment")
    model, inputs, _ = SURVEY["norm_mlp"]
    compiled = trt_inline.reference.compile(model, inputs)
    note = getattr(compiled, PIPELINE_ATTRIBUTE)
    version = RELEASE.version if RELEASE is not None else "X"
    assert note.startswith("trt-inline's own partitioner") and INSTALL.format(version=version) in note, note
    with pytest.raises(
        CompileError, match=r"pipeline='release', but no Torch-TensorRT release is importable here: to "
    ):
        trt_inline.reference.compile(model, inputs, pipeline="release")
    with rehearsing(model, inputs) as session:
        assert session is None  # (nothing to import once: each compile is trt-inline's own)


def test_a_build_on_the_release_pipeline_saves_loads_in_a_fresh_process_and_verifies(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The seed scenario on the release's own pipeline, end to end: saved with trt-inline's passes, loaded in a
    process of its own (bitwise the compiled module), verified in the sandbox, and ``inspect`` saying what built
    it."""
    from support.processes import load_in_fresh_process

    from trt_inline import cli

    model, inputs, settings = SURVEY["relu_fallback"]
    compiled = trt_inline.reference.compile(model, inputs, **settings)
    fallbacks = [name for name, _ in compiled.named_children() if name.startswith("_run_on_gpu")]
    assert len(fallbacks) == 3 and any(isinstance(c, ReferenceEngine) for c in compiled.children())
    path = tmp_path / "seed.pt2"
    trt_inline.save(compiled, path, arg_inputs=inputs)
    loaded = load_in_fresh_process(tmp_path, [path], list(inputs))[str(path)]["outputs"]
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(loaded, compiled(*inputs), strict=True))
    assert trt_inline.verify(path).status == "PASS"
    capsys.readouterr()
    assert cli.main(["inspect", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert f"built on: {compiled.trt_inline_pipeline}" in table, table[-3:]
