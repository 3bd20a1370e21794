"""Registration: the real ``_exporter.py`` of released Torch-TensorRT versions, patched on import.

``torch_tensorrt`` cannot be imported on a CPU machine, so each test builds a
minimal importable ``torch_tensorrt`` package in ``tmp_path``: the released
``dynamo/_exporter.py`` (downloaded with pip once and cached) plus the two tiny
modules it imports from. A subprocess with the project installed then imports
it the way ``torch_tensorrt.save`` does.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import torch
from conftest import REPO, load_in_fresh_process, max_abs_diff

import trt_inline
import trt_inline_autoload
from trt_inline import passes, plugin
from trt_inline.plugin import adapters

TESTS = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("TRT_INLINE_TEST_CACHE", Path.home() / ".cache" / "trt-inline-tests"))


def released_exporter(version: str) -> str:
    """Source of ``torch_tensorrt/dynamo/_exporter.py`` of a release; skip when it cannot be fetched."""
    cached = CACHE / version / "_exporter.py"
    if not cached.exists():
        download = CACHE / version / "wheel"
        download.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
             f"torch-tensorrt=={version}", "-d", str(download)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        wheels = sorted(download.glob("torch_tensorrt-*.whl"))
        if proc.returncode != 0 or not wheels:
            reason = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            pytest.skip(f"cannot download torch-tensorrt=={version} to read its exporter: {reason}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            cached.write_bytes(wheel.read("torch_tensorrt/dynamo/_exporter.py"))
        for wheel_file in wheels:
            wheel_file.unlink()
    return cached.read_text()


def package_tree(root: Path, version: str, exporter_source: str) -> Path:
    """A ``torch_tensorrt`` package holding ``exporter_source`` and what it imports."""
    package = root / "torch_tensorrt"
    (package / "dynamo" / "runtime").mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (package / "_features.py").write_text(
        "from types import SimpleNamespace\nENABLED_FEATURES = SimpleNamespace(torch_tensorrt_runtime=False)\n"
    )
    (package / "dynamo" / "__init__.py").write_text("")
    (package / "dynamo" / "runtime" / "__init__.py").write_text("")
    (package / "dynamo" / "runtime" / "_TorchTensorRTModule.py").write_text("ENGINE_IDX = 3\nNAME_IDX = 1\n")
    (package / "dynamo" / "_exporter.py").write_text(exporter_source)
    return root


def run_python(code: str, tree: Path, *args: str, disable: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(TESTS), str(REPO)]))
    env.pop("TRT_INLINE_DISABLE", None)
    if disable:
        env["TRT_INLINE_DISABLE"] = "1"
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, env=env, timeout=300
    )


_SEED_THROUGH_STOCK_EXPORT = """
    import json, sys, torch
    import torch_tensorrt.dynamo._exporter as ex   # imported as torch_tensorrt.save would; nothing else
    import trt_inline
    from models import ConvBnRelu

    torch.manual_seed(0)
    model, x = ConvBnRelu().eval(), torch.randn(2, 3, 8, 8)
    compiled = trt_inline.reference.compile(model, (x,), torch_executed_ops=["aten.relu.default"])
    flat = ex.transform(compiled)
    flat.graph.lint()
    paths = []
    for legacy in (True, False):                    # retrace=False path, and torch.export of the flat graph
        program = ex.export(compiled, arg_inputs=[x], use_legacy_exporter=legacy)
        paths.append(sys.argv[1] + f"/stock_export_legacy_{legacy}.pt2")
        torch.export.save(program, paths[-1])
    with torch.no_grad():
        torch.save([list(compiled(x)), [x]], sys.argv[1] + "/expected.pt")
    names = ("inline_trt_modules", "inline_torch_modules", "lift")
    print(json.dumps({"active": trt_inline.is_active(), "paths": paths,
                      "modules": {n: getattr(ex, n).__module__ for n in names}}))
"""


@pytest.mark.parametrize("version", ["2.13.0", "2.14.0"])
def test_released_exporter_runs_our_passes(tmp_path: Path, version: str) -> None:
    tree = package_tree(tmp_path / "site", version, released_exporter(version))
    proc = run_python(_SEED_THROUGH_STOCK_EXPORT, tree, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["active"] is True
    assert report["modules"]["inline_torch_modules"] == "trt_inline.passes"
    assert report["modules"]["inline_trt_modules"].startswith("trt_inline.")
    assert report["modules"]["lift"].startswith("trt_inline.")

    expected, inputs = torch.load(tmp_path / "expected.pt", weights_only=True)
    results = load_in_fresh_process(tmp_path, [Path(p) for p in report["paths"]], inputs)
    for path in report["paths"]:
        assert results[path]["call_modules"] == []
        assert max_abs_diff(results[path]["outputs"], expected) == 0.0, path


_STOCK_SECOND_PASS = """
    import copy, torch
    import torch_tensorrt.dynamo._exporter as ex
    import trt_inline
    from models import ConvBnRelu

    x = torch.randn(2, 3, 8, 8)
    compiled = trt_inline.reference.compile(ConvBnRelu().eval(), (x,), torch_executed_ops=["aten.relu.default"])
    assert ex.inline_torch_modules.__module__ == "torch_tensorrt.dynamo._exporter"
    gm = ex.inline_torch_modules(trt_inline.inline_trt_modules(copy.deepcopy(compiled)))
    gm.graph.lint()
"""


def test_stock_pass_fails_on_the_seed_graph_when_disabled(tmp_path: Path) -> None:
    """The suite's graphs really trigger the bug: without the plugin, 2.13 cannot save them."""
    tree = package_tree(tmp_path / "site", "2.13.0", released_exporter("2.13.0"))
    proc = run_python(_STOCK_SECOND_PASS, tree, disable=True)
    assert proc.returncode != 0
    assert "Argument 'getitem' of Node 'relu' was used before it has been defined" in proc.stderr


_CONTROLS = """
    import torch, trt_inline
    import torch_tensorrt.dynamo._exporter as ex
    names = ("inline_trt_modules", "inline_torch_modules", "lift")
    stock = {n: getattr(ex, n) for n in names}
    assert all(f.__module__ == "torch_tensorrt.dynamo._exporter" for f in stock.values()), "disabled by env"
    assert not trt_inline.is_active()
    trt_inline.install(); trt_inline.install()
    assert trt_inline.is_active() and all(getattr(ex, n) is not stock[n] for n in names)
    trt_inline.uninstall(); trt_inline.uninstall()
    assert not trt_inline.is_active() and all(getattr(ex, n) is stock[n] for n in names)
    with trt_inline.enabled():
        assert trt_inline.is_active()
    assert all(getattr(ex, n) is stock[n] for n in names)
    print("ok")
"""


def test_env_var_disables_and_explicit_controls_restore_stock_functions(tmp_path: Path) -> None:
    tree = package_tree(tmp_path / "site", "2.13.0", released_exporter("2.13.0"))
    proc = run_python(_CONTROLS, tree, disable=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"


_UNINSTALL_BEFORE_IMPORT = """
    import torch, trt_inline
    trt_inline.uninstall()
    import torch_tensorrt.dynamo._exporter as ex
    print(ex.inline_torch_modules.__module__, trt_inline.is_active())
"""


def test_uninstall_before_import_wins_over_autoload(tmp_path: Path) -> None:
    tree = package_tree(tmp_path / "site", "2.13.0", released_exporter("2.13.0"))
    proc = run_python(_UNINSTALL_BEFORE_IMPORT, tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["torch_tensorrt.dynamo._exporter", "False"]


_BROKEN_EXPORTER = """
def inline_trt_modules(gm, a, b, c, d):
    raise AssertionError("stock")

def inline_torch_modules(gm):
    raise AssertionError("stock")
"""


def test_unknown_exporter_warns_and_keeps_stock(tmp_path: Path) -> None:
    tree = package_tree(tmp_path / "site", "9.9.0", _BROKEN_EXPORTER)
    code = """
        import torch
        import torch_tensorrt.dynamo._exporter as ex
        print(ex.inline_torch_modules.__module__)
    """
    proc = run_python(code, tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "torch_tensorrt.dynamo._exporter"
    assert "trt-inline: could not patch torch_tensorrt.dynamo._exporter" in proc.stderr
    assert "unknown signature (gm, a, b, c, d)" in proc.stderr


def test_exporter_that_fails_to_import_does_not_break_import_torch(tmp_path: Path) -> None:
    tree = package_tree(tmp_path / "site", "2.13.0", "raise ImportError('libnvinfer.so.10: cannot open')\n")
    proc = run_python("import torch; print(torch.ones(2).sum().item())", tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "2.0"


def test_import_torch_loads_only_the_hook(tmp_path: Path) -> None:
    code = """
        import sys, torch
        print(json.dumps(sorted(m for m in sys.modules if m.startswith(("torch_tensorrt", "trt_inline", "wrapt")))))
    """
    proc = run_python("import json\n" + textwrap.dedent(code), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout)
    assert "trt_inline_autoload" in loaded, "the torch.backends entry point did not run"
    assert not [m for m in loaded if m.startswith("torch_tensorrt") or m.startswith("trt_inline.")]
    assert "trt_inline" not in loaded


def test_register_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import wrapt

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("hook machinery broken")

    monkeypatch.setattr(wrapt, "register_post_import_hook", broken)
    monkeypatch.delenv("TRT_INLINE_DISABLE", raising=False)
    with pytest.warns(RuntimeWarning, match="could not register its import hook"):
        trt_inline_autoload.register()


def _fake_exporter(params: str, **extra: object) -> ModuleType:
    module = ModuleType("fake_exporter")
    exec(
        f"def inline_trt_modules({params}): pass\ndef inline_torch_modules(gm): pass\ndef lift(gm, sig): pass",
        module.__dict__,
    )
    module.__dict__.update(extra)
    return module


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ("gm, outputs_map", "inline_trt_modules_with_outputs_map"),  # 2.5
        ("gm, cross_compile_flag=False", "inline_trt_modules"),  # 2.6
        ("gm, cross_compile_module=False", "inline_trt_modules"),  # 2.7 ... 2.13
    ],
)
def test_replacements_by_signature(params: str, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapters, "torch_tensorrt_version", lambda: (2, 13))
    replacements = plugin.replacements_for(_fake_exporter(params))
    assert replacements["inline_trt_modules"].__name__ == expected
    assert replacements["inline_torch_modules"] is passes.inline_torch_modules
    assert replacements["lift"] is adapters.lift


def test_replacements_for_2_14_keep_the_stock_mutation_exposure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapters, "torch_tensorrt_version", lambda: (2, 14))
    calls: list[tuple[str, int]] = []
    exposer = lambda gm, node, module, n: calls.append((node.name, n))  # noqa: E731
    exporter = _fake_exporter(
        "gm, cross_compile_module=False, expose_aliased_mutations=True", _expose_aliased_buffer_mutations=exposer
    )
    replacements = plugin.replacements_for(exporter)
    assert replacements["lift"].__name__ == "lift" and replacements["lift"] is not adapters.lift  # stock lift, wrapped

    from test_passes import seed_collision_graph

    gm, _ = seed_collision_graph()
    replacements["inline_trt_modules"](gm, False, True)
    assert [n for _, n in calls] == [1, 2]
    calls.clear()
    gm, _ = seed_collision_graph()
    replacements["inline_trt_modules"](gm, False, False)
    assert calls == []


def test_doctor_reports_and_exits_zero_without_torch_tensorrt() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trt_inline.cli", "doctor"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "torch_tensorrt  not installed" in proc.stdout
    assert "entry point     registered (torch.backends: trt_inline = trt_inline_autoload:register)" in proc.stdout
    assert "Traceback" not in proc.stderr


def run_doctor(tree: Path) -> subprocess.CompletedProcess[str]:
    """``trt-inline doctor`` with ``tree``'s torch_tensorrt importable and autoload on."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("TRT_INLINE_DISABLE", None)
    return subprocess.run(
        [sys.executable, "-m", "trt_inline.cli", "doctor"], capture_output=True, text=True, env=env, timeout=120
    )


def test_doctor_flags_an_unsupported_exporter(tmp_path: Path) -> None:
    proc = run_doctor(package_tree(tmp_path / "site", "9.9.0", _BROKEN_EXPORTER))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "torch_tensorrt  9.9.0" in proc.stdout
    assert (
        "exporter patch  UNSUPPORTED: torch_tensorrt.dynamo._exporter.inline_trt_modules has an unknown signature"
        in proc.stdout
    )
    assert "Traceback" not in proc.stderr


def test_doctor_reports_an_active_patch(tmp_path: Path) -> None:
    proc = run_doctor(package_tree(tmp_path / "site", "2.13.0", released_exporter("2.13.0")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exporter patch (2.13)  active: inline_torch_modules, inline_trt_modules, lift" in proc.stdout


def test_2_5_adapter_takes_engine_shapes_from_the_outputs_map() -> None:
    from test_passes import seed_collision_graph

    gm, inputs = seed_collision_graph()
    for node in gm.graph.nodes:
        if node.op == "call_module" and str(node.target).startswith("_run_on_acc_"):
            del node.meta["val"]
    outputs_map = {"_run_on_acc_0": [(4, 5)], "_run_on_acc_2": [(4, 5), (4, 5)]}
    # These hand-built engines were traced without fake values, so they record no output dtypes.
    with pytest.warns(RuntimeWarning, match="_run_on_acc_0 does not record its output dtypes"):
        adapters.inline_trt_modules_with_outputs_map(gm, outputs_map)
    engine_calls = [n for n in gm.graph.nodes if n.target is torch.ops.trt_inline.execute_engine.default]
    assert [[tuple(v.shape) for v in n.meta["val"]] for n in engine_calls] == [[(4, 5)], [(4, 5), (4, 5)]]
    gm = passes.inline_torch_modules(gm)
    gm.graph.lint()
    gm.recompile()
    with torch.no_grad():
        first, second = gm(*inputs)
    assert torch.equal(first, torch.relu(inputs[0] * 3.0) + 1.0)
    assert torch.equal(second, torch.relu(inputs[0] * 3.0) - 5.0)


class _HalfModel(torch.nn.Module):
    """fp16 engines on both sides of an fp16 fallback, one engine with two outputs."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(x * 2.0 + 1.0)
        a, b = (y - 0.5).chunk(2, dim=-1)
        return a * b, b + 3.0


def test_2_5_adapter_types_engine_outputs_from_the_engine() -> None:
    """Torch-TensorRT 2.5 gives shapes only; dtype and device must come from the engine, not float32."""
    x = torch.randn(4, 6, dtype=torch.float16)
    compiled = trt_inline.reference.compile(_HalfModel().eval(), (x,), torch_executed_ops=["aten.relu.default"])
    calls = [n for n in compiled.graph.nodes if n.op == "call_module" and str(n.target).startswith("_run_on_acc_")]
    assert len(calls) >= 2 and any(len(n.meta["val"]) == 2 for n in calls), "needs a multi-output engine"
    outputs_map = {}
    for node in calls:
        outputs_map[str(node.target)] = [tuple(v.shape) for v in node.meta.pop("val")]
    flat = adapters.inline_trt_modules_with_outputs_map(copy.deepcopy(compiled), outputs_map)
    engine_calls = [n for n in flat.graph.nodes if n.target is torch.ops.trt_inline.execute_engine.default]
    dtypes = {v.dtype for n in engine_calls for v in n.meta["val"]}
    devices = {v.device.type for n in engine_calls for v in n.meta["val"]}
    assert dtypes == {torch.float16} and devices == {"cpu"}
    getitems = [u for n in engine_calls for u in n.users]
    assert {u.meta["val"].dtype for u in getitems} == {torch.float16}
    flat = passes.inline_torch_modules(flat)
    flat.graph.lint()
    flat.recompile()
    with torch.no_grad():
        assert [t.dtype for t in flat(x)] == [torch.float16, torch.float16]
        assert max_abs_diff(list(flat(x)), list(compiled(x))) == 0.0


def _compile_module(with_extra_files: bool) -> str:
    """A stand-in for torch_tensorrt/_compile.py: save() through the (patched) exporter, as the real one does."""
    extra = "extra_files=None, " if with_extra_files else ""
    write = "extra_files=extra_files" if with_extra_files else "extra_files=None"
    return textwrap.dedent(
        f"""
        import torch
        __all__ = ["save"]

        def save(module, file_path="", *, {extra}output_format="exported_program", inputs=None,
                 arg_inputs=None, kwarg_inputs=None, retrace=True):
            from torch_tensorrt.dynamo._exporter import export
            program = export(module, arg_inputs=arg_inputs or inputs, use_legacy_exporter=not retrace)
            torch.export.save(program, file_path, {write})
        """
    )


_SAVE_THROUGH_TORCH_TENSORRT = """
    import sys, torch
    import torch_tensorrt, trt_inline
    from models import ConvBnRelu

    x = torch.randn(2, 3, 8, 8)
    compiled = trt_inline.reference.compile(ConvBnRelu().eval(), (x,), torch_executed_ops=["aten.relu.default"])
    torch_tensorrt.save(compiled, sys.argv[1], arg_inputs=[x], retrace=False)
    report = trt_inline.verify(sys.argv[1])
    print(report.reference, report.ok, " ".join(trt_inline.plugin.replaced_functions()))
    trt_inline.uninstall()
    print(torch_tensorrt.save.__module__, getattr(torch_tensorrt.save, "__wrapped__", None) is None)
"""


@pytest.mark.parametrize("with_extra_files", [True, False], ids=["2.12+", "before-2.12"])
def test_patched_torch_tensorrt_save_embeds_reference_io(tmp_path: Path, with_extra_files: bool) -> None:
    tree = package_tree(tmp_path / "site", "2.13.0", released_exporter("2.13.0"))
    (tree / "torch_tensorrt" / "_compile.py").write_text(_compile_module(with_extra_files))
    (tree / "torch_tensorrt" / "__init__.py").write_text(
        "__version__ = '2.13.0'\nfrom torch_tensorrt._compile import *  # noqa: F403\n"
    )
    proc = run_python(_SAVE_THROUGH_TORCH_TENSORRT, tree, str(tmp_path / "model.pt2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = proc.stdout.strip().splitlines()[-2:]
    assert first == "embedded True inline_torch_modules inline_trt_modules lift save"
    assert second == "torch_tensorrt._compile True", "uninstall must put the stock save back"
