"""AOTInductor packages: compile -> package -> load in a fresh process -> bitwise against the in-memory module.

Compiling a package takes seconds on a small machine, so each is built once per
module (``packages``) and shared by the assertions on it.
"""

from __future__ import annotations

import base64
import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from support.commands import assert_unusable, cli
from support.hostile import Plant, entry_named, rewrite, sample_inputs_entry, torch_saved
from support.models import (
    RELU,
    ConvBnRelu,
    ExpandedIds,
    MultiOutputBothSides,
    RowsAndValues,
    TinyResNet,
    scalar_cases,
)
from support.processes import load_runs_in_fresh_process
from support.scalars import scalar_crossings
from support.values import as_list, max_abs_diff

import trt_inline
from trt_inline import compat, reference
from trt_inline.archive import REFERENCE_IO_FILE
from trt_inline.errors import VerifyInputError

WHY_NOT = compat.aoti_packages()
pytestmark = [
    pytest.mark.packages,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"AOTInductor packages: {WHY_NOT}"),
]

NATIVE = "--allow-native-code"


@dataclass
class Package:
    name: str
    path: Path
    compiled: torch.fx.GraphModule
    checks: list[tuple[torch.Tensor, ...]]
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def _tensors(values: Any) -> list[torch.Tensor]:
    return [v if isinstance(v, torch.Tensor) else torch.tensor(v) for v in as_list(values)]


def _package(
    root: Path, name: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], **options: Any
) -> Package:
    checks = options.pop("checks", [inputs])
    dynamic_shapes = options.get("dynamic_shapes")
    compiled = reference.compile(model.eval(), inputs, **options)
    path = root / f"{name}.package.pt2"
    started = time.monotonic()
    trt_inline.save(compiled, path, arg_inputs=inputs, dynamic_shapes=dynamic_shapes, output_format="aot_inductor")
    return Package(name, path, compiled, checks, time.monotonic() - started)


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Package]:
    root = tmp_path_factory.mktemp("packages")
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=8)
    scalar = scalar_cases()[0]
    built = [
        _package(root, "seed", ConvBnRelu(), (torch.randn(2, 3, 8, 8),), torch_executed_ops=[RELU]),
        _package(root, "residual", TinyResNet(), (torch.randn(2, 3, 8, 8),), torch_executed_ops=["aten.add.Tensor"]),
        _package(root, "multi_output", MultiOutputBothSides(), (torch.randn(4, 16),), torch_executed_ops=["aten.topk"]),
        _package(
            root,
            "dynamic_batch",
            ConvBnRelu(),
            (torch.randn(4, 3, 8, 8),),
            torch_executed_ops=[RELU],
            dynamic_shapes=({0: batch},),
            checks=[(torch.randn(1, 3, 8, 8),), (torch.randn(8, 3, 8, 8),)],
        ),
        _package(
            root,
            "scalar_crossing",
            scalar.model,
            scalar.inputs,
            torch_executed_ops=scalar.torch_executed_ops,
            dynamic_shapes=scalar.dynamic_shapes,
            checks=scalar.checks,
        ),
        _package(
            root,
            "scalar_output",
            RowsAndValues(),
            (torch.randn(5, 3),),
            torch_executed_ops=["aten.mul.Tensor"],
            dynamic_shapes=({0: torch.export.Dim("rows", min=2, max=9)},),
            checks=[(torch.randn(2, 3),), (torch.randn(9, 3),)],
        ),
        _package(
            root,
            "expanded_view",
            ExpandedIds(),
            (torch.randint(0, 50, (4, 6)),),
            torch_executed_ops=["aten.embedding.default"],
            dynamic_shapes=({0: batch, 1: torch.export.Dim("seq", min=2, max=16)},),
            checks=[(torch.randint(0, 50, (1, 2)),), (torch.randint(0, 50, (8, 16)),), (torch.randint(0, 50, (3, 5)),)],
        ),
    ]
    for package in built:
        package.extra["size"] = package.path.stat().st_size
    # Every package loaded and run on its checks in one fresh process (a package's library loads once).
    runs = load_runs_in_fresh_process(root, [p.path for p in built], {p.path: p.checks for p in built})
    for package in built:
        package.extra["loaded"] = runs[str(package.path)]
    return {p.name: p for p in built}


NAMES = [
    "seed",
    "residual",
    "multi_output",
    "dynamic_batch",
    "scalar_crossing",
    "scalar_output",
    "expanded_view",
]


@pytest.mark.parametrize("name", NAMES)
def test_package_roundtrips_bitwise_in_a_fresh_process(packages: dict[str, Package], name: str) -> None:
    package = packages[name]
    for inputs, loaded in zip(package.checks, package.extra["loaded"], strict=True):
        with torch.no_grad():
            expected = as_list(package.compiled(*inputs))
        assert loaded["kinds"] == [type(e).__name__ for e in expected], "outputs keep their kinds (int stays int)"
        assert max_abs_diff(loaded["outputs"], _tensors(expected)) == 0.0, (name, [t.shape for t in inputs])
    proc = cli("verify", str(package.path), NATIVE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"PASS {package.path} (expected outputs: embedded)" in proc.stdout


def test_structures_are_really_there(packages: dict[str, Package]) -> None:
    """Each package's module has the structure its test is about."""
    multi = packages["multi_output"].compiled
    assert any(len(n.meta.get("val", [])) > 1 for n in multi.graph.nodes if n.op == "call_module"), "multi-output"
    assert [c for c in scalar_crossings(packages["scalar_crossing"].compiled) if c[0] == "output"]
    assert [c for c in scalar_crossings(packages["scalar_output"].compiled) if c[0] == "output"]
    with torch.no_grad():
        _, rows = packages["scalar_output"].compiled(torch.randn(6, 3))
    assert isinstance(rows, int) and rows == 5, "the compiled module returns a Python int"
    engine_outputs: list[torch.Tensor] = []
    expanded = packages["expanded_view"].compiled
    for module in expanded.modules():
        if isinstance(module, reference.ReferenceEngine):
            module.register_forward_hook(lambda _m, _i, out: engine_outputs.extend(as_list(out)))
    with torch.no_grad():
        expanded(torch.randint(0, 50, (3, 5)))
    ids = [t for t in engine_outputs if t.dtype == torch.int64 and t.dim() == 2]
    assert ids and (ids[0] == ids[0][:1]).all(), "an engine computes the expand the embedding reads"
    assert all(t.is_contiguous() for t in engine_outputs), "engines return contiguous outputs, as TensorRT's do"


def test_raw_aoti_loader_returns_the_scalar_as_a_tensor(packages: dict[str, Package]) -> None:
    """Why load_package exists: the stock loader hands back the scalar output as a tensor."""
    model = compat.aoti_load_package(str(packages["scalar_output"].path))
    _, rows = model(torch.randn(6, 3))
    assert isinstance(rows, torch.Tensor) and int(rows.reshape(-1)[0]) == 5
    _, rows = trt_inline.package.load_package(packages["scalar_output"].path)(torch.randn(6, 3))
    assert isinstance(rows, int) and rows == 5


def test_verify_and_inspect_never_load_native_code_unasked(packages: dict[str, Package], tmp_path: Path) -> None:
    """Without --allow-native-code verify refuses to run a package; inspect reads it without loading it."""
    broken = rewrite(
        packages["seed"].path,
        tmp_path / "broken_library.pt2",
        lambda entries: entries.update({n: b"not a shared library" for n in entries if n.endswith(".so")}),
    )
    assert_unusable(cli("verify", str(broken)), "is an AOTInductor package: running it loads its shared library")
    proc = cli("inspect", str(broken))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("AOTInductor package: model model;")
    assert "graph of the ExportedProgram the package was compiled from:" in proc.stdout
    assert "engine 3" in proc.stdout and "relu.default(getitem = engine 0 output 0)" in proc.stdout


def test_per_engine_and_diff_refuse_a_package(packages: dict[str, Package]) -> None:
    """A package's engines run inside its compiled code; the program it carries has no weights to replay."""
    package = packages["seed"]
    with pytest.raises(VerifyInputError, match="no engine boundaries to compare"):
        trt_inline.verify(package.path, expected_module=package.compiled, arg_inputs=package.checks[0],
                          per_engine=True, allow_native_code=True, isolate=False)  # fmt: skip
    assert_unusable(cli("diff", str(package.path), str(package.path)), "is an AOTInductor package: its engines run")


def test_altered_expected_outputs_fail_naming_the_output(packages: dict[str, Package], tmp_path: Path) -> None:
    def alter(entries: dict[str, bytes]) -> None:
        name = entry_named(entries, REFERENCE_IO_FILE)
        payload = torch.load(io.BytesIO(base64.b64decode(entries[name])), weights_only=True)
        payload["outputs"][1] = payload["outputs"][1] + 1.0
        entries[name] = base64.b64encode(torch_saved(payload))

    altered = rewrite(packages["seed"].path, tmp_path / "altered.pt2", alter)
    proc = cli("verify", str(altered), NATIVE)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "problem: output 1 differs: max abs diff 1" in proc.stdout
    assert "ok   output 0" in proc.stdout


def test_planted_pickle_in_a_package_is_refused(packages: dict[str, Package], tmp_path: Path) -> None:
    marker = tmp_path / "marker"

    def plant(entries: dict[str, bytes]) -> None:
        name = sample_inputs_entry(entries)
        entries[name] = torch_saved(Plant(marker))

    planted = rewrite(packages["seed"].path, tmp_path / "planted.pt2", plant)
    for command in (["verify", str(planted), NATIVE], ["inspect", str(planted)]):
        assert_unusable(cli(*command), "data/sample_inputs/model.pt: refused: it calls posix.system")
    assert not marker.exists()


def test_print_package_figures(packages: dict[str, Package]) -> None:
    """Compile time and size of each package (pytest -s shows them; the closing notes quote them)."""
    for package in packages.values():
        assert package.extra["size"] > 0
        print(f"{package.name:<16} compile+save {package.seconds:6.1f} s  {package.extra['size'] / 1024:8.1f} KiB")
