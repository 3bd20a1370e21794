"""Registration: the real save path of the Torch-TensorRT release matching the installed torch, patched on import.

``torch_tensorrt`` cannot be imported on a CPU machine, so each test builds a
``torch_tensorrt`` package in ``tmp_path`` around the release's real
``dynamo/_exporter.py`` and the real ``save`` of its ``_compile.py``
(``tests/support/pairs.py``). A process of its own with the project installed then
calls ``torch_tensorrt.save`` as a user would (forked from a clean interpreter
that imported only torch: ``run_python``). On a torch that no release requires
(2.15), the release-bound tests skip and say so.
"""

from __future__ import annotations

import ast
import copy
import itertools
import json
import os
import re
import subprocess
import textwrap
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from support import pairs
from support.plugin_runs import (
    RELEASE,
    release_tree,
    run_python,
    run_python_forks,
    unavailable,
)
from support.processes import (
    load_in_fresh_process,
    load_runs_in_fresh_process,
    new_interpreter,
)
from support.values import as_list, max_abs_diff

import trt_inline
from trt_inline import autoload, plugin
from trt_inline.inlining import passes
from trt_inline.plugin import adapters
from trt_inline.releases import EXPORTER_NAMES_BOUND_ELSEWHERE


def _parameters(source: str, function: str) -> tuple[str, ...]:
    tree = ast.parse(source)
    found = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    return tuple(arg.arg for arg in [*found.args.args, *found.args.kwonlyargs])


def test_the_release_record_says_what_the_release_source_does() -> None:
    """The installed torch's release record (trt_inline.releases) against the release's own source."""
    if RELEASE is None:
        pytest.skip(f"no Torch-TensorRT release requires torch {torch.__version__}")
    try:
        exporter = pairs.release_file(RELEASE.version, "dynamo/_exporter.py")
        compile_source = pairs.release_file(RELEASE.version, "_compile.py")
    except pairs.Unavailable as exc:
        unavailable(exc)
    assert _parameters(exporter, "inline_trt_modules") == RELEASE.inline_trt_params
    assert ("extra_files" in _parameters(compile_source, "save")) == RELEASE.save_extra_files
    assert ('"aot_inductor"' in compile_source) == RELEASE.aot_inductor
    assert ("get_duplicate_nodes" in exporter) == RELEASE.wires_by_name
    lift = (
        ast.get_source_segment(
            exporter, next(n for n in ast.parse(exporter).body if isinstance(n, ast.FunctionDef) and n.name == "lift")
        )
        or ""
    )
    assert ("persistent" in lift) == RELEASE.lift_persistent
    stock = {n.name for n in ast.parse(exporter).body if isinstance(n, ast.FunctionDef)}
    assert set(RELEASE.replaced) - {"copy"} <= stock, set(RELEASE.replaced) - stock
    # The module global `copy` is replaced where transform deep-copies the compiled module with it.
    assert ("import copy" in exporter and "gm = copy.deepcopy(gm)" in exporter) == ("copy" in RELEASE.replaced)
    # `export` is replaced where it re-exports the inlined graph (and so where retrace=True inlines).
    export = next(n for n in ast.parse(exporter).body if isinstance(n, ast.FunctionDef) and n.name == "export")
    retraces = "torch.export.export" in (ast.get_source_segment(exporter, export) or "")
    assert retraces == ("export" in RELEASE.replaced) == RELEASE.retrace_inlines
    # The modules that bind exporter functions by name when imported: the plugin rebinds exactly these.
    for module_name, names in EXPORTER_NAMES_BOUND_ELSEWHERE.items():
        member = module_name.removeprefix("torch_tensorrt.").replace(".", "/")
        member = f"{member}/__init__.py" if module_name == "torch_tensorrt.dynamo" else f"{member}.py"
        imported = pairs.exporter_imports(pairs.release_file(RELEASE.version, member))
        if module_name.endswith("._compiler") and RELEASE.minor < (2, 6):
            names = ()  # no cross-compiling: nothing bound
        assert imported.strip() == "".join(f"from torch_tensorrt.dynamo._exporter import {n}\n" for n in names).strip()


def stock_wires_by_name() -> bool:
    return RELEASE is not None and RELEASE.wires_by_name


_SAVE_SEED = """
    import json, sys, torch
    import torch_tensorrt                             # as a user would; nothing of trt_inline imported
    import torch_tensorrt.dynamo._exporter as ex
    from support.models import ConvBnRelu

    torch.manual_seed(0)
    model, x = ConvBnRelu().eval(), torch.randn(2, 3, 8, 8)
    import os, trt_inline
    from trt_inline.archive import open_file
    compiled = trt_inline.reference.compile(model, (x,), torch_executed_ops=["aten.relu.default"])
    os.environ["TRT_INLINE_REFERENCE_IO"] = "boundaries"  # every engine's inputs and outputs too
    paths = []
    for retrace in (False, True):
        paths.append(f"{sys.argv[1]}/seed_retrace_{retrace}.pt2")
        torch_tensorrt.save(compiled, paths[-1], output_format="exported_program", arg_inputs=[x], retrace=retrace)
    with torch.no_grad():
        torch.save([list(compiled(x)), [x]], sys.argv[1] + "/expected.pt")
    names = ("inline_trt_modules", "inline_torch_modules", "lift")
    # transform's copy of the compiled module shares its tensors (no second copy of the weights).
    import inspect
    inputs_first = "inputs" in inspect.signature(ex.transform).parameters  # 2.5: transform(gm, inputs)
    flat = ex.transform(compiled, [x]) if inputs_first else ex.transform(compiled)
    storages = lambda m: {t.untyped_storage().data_ptr() for t in (*m.parameters(), *m.buffers())}
    shared = bool(storages(flat)) and storages(flat) <= storages(compiled) and flat is not compiled
    print(json.dumps({"active": trt_inline.is_active(), "paths": paths, "shared": shared,
                      "modules": {n: getattr(ex, n).__module__ for n in names},
                      "engines": [n for n, _ in compiled.named_children() if n.startswith("_run_on_acc_")],
                      "boundaries": [[b.name for b in open_file(p).reference.boundaries or []] for p in paths]}))
"""


def test_released_save_runs_our_passes(tmp_path: Path) -> None:
    """torch_tensorrt.save of the seed scenario, both retrace values: files load and match exactly."""
    tree = release_tree(tmp_path)
    proc = run_python(_SAVE_SEED, tree, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["active"] is True
    assert report["modules"]["inline_torch_modules"] == "trt_inline.inlining.passes"
    assert report["modules"]["inline_trt_modules"].startswith("trt_inline.")
    assert report["modules"]["lift"].startswith("trt_inline.")
    reports = [trt_inline.verify(path).ok for path in report["paths"]]  # the files the user's process saved
    assert reports == [True, True], "trt_inline.verify on the embedded reference I/O"
    assert report["shared"] is True, "transform's copy shares the compiled module's tensors"
    assert len(report["engines"]) >= 2 and report["boundaries"] == [report["engines"]] * 2, "TRT_INLINE_REFERENCE_IO"

    expected, inputs = torch.load(tmp_path / "expected.pt", weights_only=True)
    results = load_in_fresh_process(tmp_path, [Path(p) for p in report["paths"]], inputs)
    for path in report["paths"]:
        assert results[path]["call_modules"] == []
        assert max_abs_diff(results[path]["outputs"], expected) == 0.0, path


_SAVE_DYNAMIC = """
    import sys, torch
    import torch_tensorrt, trt_inline
    from support.models import ConvBnRelu

    batch = torch.export.Dim("batch", min=1, max=8)
    model, x = ConvBnRelu().eval(), torch.randn(4, 3, 8, 8)
    compiled = trt_inline.reference.compile(
        model, (x,), torch_executed_ops=["aten.relu.default"], dynamic_shapes=({0: batch},)
    )
    torch_tensorrt.save(compiled, sys.argv[1], arg_inputs=[x], retrace=True, dynamic_shapes=({0: batch},))
    checks = [torch.randn(n, 3, 8, 8) for n in (1, 8)]
    with torch.no_grad():
        torch.save([[list(compiled(c)) for c in checks], checks], sys.argv[1] + ".expected")
"""


def test_released_dynamic_retrace_goes_through_our_passes(tmp_path: Path) -> None:
    """From 2.11, retrace=True with dynamic shapes inlines with transform() and re-exports the flat graph."""
    tree = release_tree(tmp_path)
    if RELEASE is not None and not RELEASE.retrace_inlines:
        pytest.skip(f"Torch-TensorRT {RELEASE.version} retraces the compiled module directly, without transform()")
    path = tmp_path / "dynamic.pt2"
    proc = run_python(_SAVE_DYNAMIC, tree, str(path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected, checks = torch.load(f"{path}.expected", weights_only=True)
    runs = load_runs_in_fresh_process(tmp_path, [path], [[inputs] for inputs in checks])[str(path)]
    for want, inputs, loaded in zip(expected, checks, runs, strict=True):
        assert max_abs_diff(loaded["outputs"], want) == 0.0, inputs.shape


_SAVE_DYNAMIC_KINDS = """
    import sys, torch
    import torch_tensorrt, trt_inline
    from support.models import FlattenRows, SharedDimInputs

    seq, batch = torch.export.Dim("seq", min=2, max=16), torch.export.Dim("batch", min=1, max=8)
    cases = [  # (name, model, inputs, dynamic_shapes, fallback, retrace, checks at min, middle, max)
        ("shared_dim", SharedDimInputs(), (torch.randn(2, 6), torch.randn(2, 6)), ({1: seq}, {1: seq}),
         "aten.mul.Tensor", False, [(torch.randn(2, n), torch.randn(2, n)) for n in (2, 9, 16)]),
    ]
    if sys.argv[2] == "retrace":
        cases.append(("batch_one", FlattenRows(), (torch.randn(4, 3, 2),), ({0: batch},), "aten.view.default",
                      True, [(torch.randn(n, 3, 2),) for n in (1, 5, 8)]))
    expected = {}
    for name, model, inputs, dynamic_shapes, fallback, retrace, checks in cases:
        compiled = trt_inline.reference.compile(
            model, inputs, torch_executed_ops=[fallback], dynamic_shapes=dynamic_shapes
        )
        path = f"{sys.argv[1]}/{name}.pt2"
        extra = {"dynamic_shapes": dynamic_shapes} if retrace else {}
        torch_tensorrt.save(compiled, path, arg_inputs=list(inputs), retrace=retrace, **extra)
        with torch.no_grad():
            expected[path] = (checks, [compiled(*c) for c in checks])
    torch.save(expected, sys.argv[1] + "/expected.pt")
"""


def test_released_save_with_shared_dims_and_batch_one(tmp_path: Path) -> None:
    """Two inputs sharing a Dim through the legacy exporter; a batch Dim(min=1) through export() with a scalar.

    Stock 2.14 writes the first so that every call raises ``NameError: name 'L' is
    not defined`` (guards naming inputs its ``forward(*args)`` does not have), and
    the second so that it rejects batch 1 (``u0 >= 2``). Each is loaded in a fresh
    process and run at the minimum, a middle and the maximum of its range.
    """
    tree = release_tree(tmp_path)
    retrace = RELEASE is not None and RELEASE.retrace_inlines  # before 2.11 retrace=True ignores the passes
    proc = run_python(_SAVE_DYNAMIC_KINDS, tree, str(tmp_path), "retrace" if retrace else "legacy")
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected = torch.load(tmp_path / "expected.pt", weights_only=True)
    assert len(expected) == (2 if retrace else 1)
    paths = [Path(p) for p in expected]
    runs = load_runs_in_fresh_process(tmp_path, paths, {Path(p): checks for p, (checks, _) in expected.items()})
    for path, (checks, outputs) in expected.items():
        for inputs, want, loaded in zip(checks, outputs, runs[path], strict=True):
            assert loaded["call_modules"] == []
            assert max_abs_diff(loaded["outputs"], as_list(want)) == 0.0, (path, [t.shape for t in inputs])


def test_stock_save_fails_on_the_seed_graph_when_disabled(tmp_path: Path) -> None:
    """The suite's graphs really trigger the bug: without the plugin, releases up to 2.13 cannot save them."""
    tree = release_tree(tmp_path, stand_in_engine_op=True)
    if not stock_wires_by_name():
        pytest.skip(f"Torch-TensorRT {RELEASE and RELEASE.version} already wires fallback inputs by position")
    proc = run_python(_SAVE_SEED, tree, str(tmp_path), disable=True)
    assert proc.returncode != 0
    assert "was used before it has been defined" in proc.stderr, proc.stderr[-3000:]


_SAVE_SCALARS = """
    import inspect, json, logging.handlers, sys, torch
    import torch_tensorrt, trt_inline
    from support.models import scalar_cases

    torch_log = logging.handlers.BufferingHandler(1000)
    logging.getLogger("torch.export").addHandler(torch_log)

    parameters = inspect.signature(torch_tensorrt.save).parameters
    results = {}
    for case in scalar_cases():
        compiled = trt_inline.reference.compile(
            case.model.eval(), case.inputs, torch_executed_ops=case.torch_executed_ops,
            dynamic_shapes=case.dynamic_shapes,
        )
        # Before 2.11 save takes no dynamic_shapes: retrace=False keeps the program's own symbols.
        dynamic = {"dynamic_shapes": case.dynamic_shapes} if "dynamic_shapes" in parameters else {}
        for retrace in sys.argv[2].split(","):
            path = f"{sys.argv[1]}/{case.name}_retrace_{retrace}.pt2"
            results[path] = ""
            try:
                torch_tensorrt.save(compiled, path, arg_inputs=list(case.inputs), retrace=retrace == "True", **dynamic)
                results[path] = "saved"
                if sys.argv[3:] == ["load"]:
                    results[path] = "saved, loading fails: "
                    program = torch.export.load(path)
                    # The real op takes Tensor[]: a scalar in that list fails when the program runs.
                    results[path] = "saved, loaded, an engine input is not a tensor: "
                    for node in program.graph.nodes:
                        if str(node.target).startswith("tensorrt.execute_engine"):
                            for arg in node.args[0]:
                                val = arg.meta.get("val")
                                if not isinstance(val, torch.Tensor):
                                    raise TypeError(f"{node.name} input {arg.name} is {type(val).__name__}")
                    results[path] = "saved"
            except Exception as exc:
                root = exc
                while root.__cause__ is not None or root.__context__ is not None:
                    root = root.__cause__ or root.__context__
                results[path] += f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
                if root is not exc:  # what torch's generic message wraps
                    results[path] += f" (from {type(root).__name__}: {str(root).strip().splitlines()[0]})"
                elif torch_log.buffer:  # torch.export.load logs the cause, then raises a generic error
                    record = torch_log.buffer[-1]
                    cause = record.exc_info[1] if record.exc_info else None
                    logged = f"{type(cause).__name__}: {cause}" if cause else record.getMessage()
                    results[path] += f" (logged: {' '.join(logged.split())[:300]})"
                torch_log.buffer.clear()
        with torch.no_grad():
            expected = [[compiled(*inputs)] for inputs in case.checks]
        torch.save({"checks": case.checks, "expected": expected}, f"{sys.argv[1]}/{case.name}.expected")
    print(json.dumps(results))
"""


def test_released_save_of_scalar_boundaries(tmp_path: Path) -> None:
    """Scalars crossing engines, saved by the release's own save with the plugin active: exact at 3 sizes each.

    Releases before 2.11 cannot be asked for dynamic shapes on ``retrace=True`` (it re-exports the module
    statically), so there only ``retrace=False``, which keeps the program's own symbols, is compared.
    """
    tree = release_tree(tmp_path)
    retraces = "False,True" if RELEASE is not None and RELEASE.retrace_inlines else "False"
    proc = run_python(_SAVE_SCALARS, tree, str(tmp_path), retraces)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results.values()) == {"saved"}, results
    cases = {}
    for case_file in sorted(tmp_path.glob("*.expected")):
        data = torch.load(case_file, weights_only=True)
        paths = sorted(Path(p) for p in results if Path(p).name.startswith(case_file.stem + "_retrace_"))
        assert len(paths) == len(retraces.split(","))
        cases.update({path: data for path in paths})
    assert len(cases) == len(results)
    runs = load_runs_in_fresh_process(tmp_path, list(cases), {path: data["checks"] for path, data in cases.items()})
    for path, data in cases.items():
        for inputs, expected, loaded in zip(data["checks"], data["expected"], runs[str(path)], strict=True):
            assert max_abs_diff(loaded["outputs"], expected) == 0.0, (path.name, inputs[0].shape)


def test_stock_save_fails_on_scalar_boundaries_when_disabled(tmp_path: Path) -> None:
    """Without the plugin each scalar case fails: no file, a file that cannot be loaded, or a miswired one.

    The stock pass puts SymInts in Tensor[] and types scalar outputs as SymInts
    (``SerializeError``, or on torch versions whose serializer lets it through a
    loaded program whose engine gets a scalar in its ``Tensor[]``), and its
    program has no range for a symbol read with ``item()`` (loading fails).
    Compared on the legacy retrace=False path: it only builds, serializes and
    deserializes the graph, so the stand-in engine op (it has the name and
    schema of TensorRT's, not its kernels) is enough to reach the failure.
    """
    tree = release_tree(tmp_path, stand_in_engine_op=True)
    proc = run_python(_SAVE_SCALARS, tree, str(tmp_path), "False", "load", disable=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 3
    meant = [
        # A SymInt engine output typed as a tensor the serializer cannot describe.
        r"SerializeError: Failed serializing node execute_engine",
        # A symbol read with item() that the program gives no range: torch names it (u0) when it refuses the file.
        r"saved, loading fails: .*\bu\d+\b",
        # A torch whose serializer lets a SymInt through: the loaded engine gets a scalar in its Tensor[].
        r"saved, loaded, an engine input is not a tensor: TypeError",
    ]
    if RELEASE is not None and "transform" in RELEASE.replaced:  # 2.5: its shape analysis reads `.shape` first
        meant.append(r"AttributeError: 'int' object has no attribute 'shape'")
    for path, outcome in results.items():
        assert any(re.match(pattern, outcome) for pattern in meant), (path, outcome)


# Each of (install, uninstall, enabled) twice, in every order: the exporter's state afterwards, on import
# after the calls and with the exporter imported before them.
_CONTROLS = """
    import json, sys, torch, trt_inline
    calls = sys.argv[1].split(",")
    import_first = sys.argv[2] == "before"
    if import_first:
        import torch_tensorrt.dynamo._exporter as ex
    for call in calls:
        if call == "enabled":
            with trt_inline.enabled():
                assert trt_inline.is_active() is import_first  # active at once where the exporter is imported
        else:
            getattr(trt_inline, call)()
    import torch_tensorrt.dynamo._exporter as ex
    names = ("inline_trt_modules", "inline_torch_modules")
    print(json.dumps([getattr(ex, n).__module__ for n in names] + [trt_inline.is_active()]))
"""

_ORDERINGS = list(itertools.product(("install", "uninstall", "enabled"), repeat=2))


@pytest.mark.heavy
@pytest.mark.parametrize("when", ["before", "after"], ids=["exporter-imported-first", "exporter-imported-last"])
def test_controls_in_every_order_with_the_env_opt_out(tmp_path: Path, when: str) -> None:
    """TRT_INLINE_DISABLE=1, then two calls: the last explicit install/uninstall decides; enabled() leaves none.

    Each ordering runs in a fresh process state: a fork of one interpreter that imported only torch.
    """
    tree = release_tree(tmp_path, with_save=False)
    orderings = [[f"{a},{b}", when] for a, b in _ORDERINGS]
    # _CONTROLS imports trt_inline before anything else, and the exporter imports torch._dynamo (a second of
    # imports): importing both first in the parent changes nothing the controls decide.
    outcomes = run_python_forks(_CONTROLS, tree, orderings, preload=("trt_inline", "torch._dynamo"), disable=True)
    for (first, second), (status, output) in zip(_ORDERINGS, outcomes, strict=True):
        explicit = [c for c in (first, second) if c != "enabled"]
        expect_active = bool(explicit) and explicit[-1] == "install"
        assert status == 0, (first, second, output[-3000:])
        *modules, active = json.loads(output.strip().splitlines()[-1])
        stock = "torch_tensorrt.dynamo._exporter"
        assert active is expect_active, (first, second, when)
        assert all((m != stock) is expect_active for m in modules), (first, second, when, modules)


def test_enabled_restores_an_active_autoload(tmp_path: Path) -> None:
    tree = release_tree(tmp_path, with_save=False)
    code = """
        import torch, trt_inline
        import torch_tensorrt.dynamo._exporter as ex
        before = ex.inline_torch_modules
        with trt_inline.enabled():
            pass
        print(trt_inline.is_active(), ex.inline_torch_modules is before)
    """
    proc = run_python(code, tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "True"]


def test_uninstall_before_import_wins_over_autoload(tmp_path: Path) -> None:
    tree = release_tree(tmp_path, with_save=False)
    code = """
        import torch, trt_inline
        trt_inline.uninstall()
        import torch_tensorrt.dynamo._exporter as ex
        print(ex.inline_torch_modules.__module__, trt_inline.is_active())
    """
    proc = run_python(code, tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["torch_tensorrt.dynamo._exporter", "False"]


def test_patch_and_unpatch_are_logged_at_info(tmp_path: Path) -> None:
    tree = release_tree(tmp_path, with_save=False)
    code = """
        import logging, torch
        logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
        import torch_tensorrt.dynamo._exporter, trt_inline
        trt_inline.uninstall()
    """
    proc = run_python(code, tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("trt_inline.plugin INFO")]
    assert lines[0].startswith("trt_inline.plugin INFO patched torch_tensorrt.dynamo._exporter: ")
    assert lines[1].startswith("trt_inline.plugin INFO restored stock torch_tensorrt.dynamo._exporter: ")
    assert len(lines) == 2


_BROKEN_EXPORTER = """
def inline_trt_modules(gm, a, b, c, d):
    raise AssertionError("stock")

def inline_torch_modules(gm):
    raise AssertionError("stock")
"""


def test_unknown_exporter_warns_and_keeps_stock(tmp_path: Path) -> None:
    tree = pairs.package_tree(tmp_path / "site", "9.9.0", _BROKEN_EXPORTER)
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


_FAILING_LIFT = """
from torch_tensorrt.dynamo._exporter_stock import *  # noqa: F403
import trt_inline.plugin.adapters as adapters

def _broken_lift(gm, signature):
    raise ImportError("cannot import name 'GuardsFn' from 'torch.export._unlift'")

adapters.lift = _broken_lift
"""


def test_a_replacement_failing_its_preflight_is_left_stock(tmp_path: Path) -> None:
    """A replacement that cannot work here is not installed: one warning names it; doctor exits 1."""
    tree = release_tree(tmp_path, with_save=False)
    if not stock_wires_by_name():
        pytest.skip(f"Torch-TensorRT {RELEASE and RELEASE.version} keeps its own lift (wrapped)")
    exporter = tree / "torch_tensorrt" / "dynamo"
    (exporter / "_exporter.py").rename(exporter / "_exporter_stock.py")
    (exporter / "_exporter.py").write_text(_FAILING_LIFT)
    code = """
        import warnings, torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch_tensorrt.dynamo._exporter as ex
        import trt_inline
        refused = " | ".join(f"{k}: {v}" for k, v in trt_inline.plugin.refused_replacements().items())
        print(ex.lift.__module__, ex.inline_torch_modules.__module__, refused)
        print(*[str(w.message) for w in caught if "trt-inline" in str(w.message)], sep=chr(10))
    """
    proc = run_python(code, tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, *warned = proc.stdout.strip().splitlines()
    assert first == (
        "torch_tensorrt.dynamo._exporter_stock trt_inline.inlining.passes "
        "lift: ImportError: cannot import name 'GuardsFn' from 'torch.export._unlift'"
    )
    assert len(warned) == 1 and warned[0].startswith(
        "trt-inline: torch_tensorrt.dynamo._exporter.lift left stock: the replacement failed on a probe graph"
    )
    doctor = run_doctor(tree)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "left stock: lift" in doctor.stdout and "ImportError: cannot import name 'GuardsFn'" in doctor.stdout


def test_exporter_that_fails_to_import_does_not_break_import_torch(tmp_path: Path) -> None:
    tree = pairs.package_tree(tmp_path / "site", "2.13.0", "raise ImportError('libnvinfer.so.10: cannot open')\n")
    proc = run_python("import torch; print(torch.ones(2).sum().item())", tree, fresh=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "2.0"


def test_import_torch_loads_only_the_hook(tmp_path: Path) -> None:
    code = """
        import sys, torch
        print(json.dumps(sorted(m for m in sys.modules if m.startswith(("torch_tensorrt", "trt_inline", "wrapt")))))
    """
    proc = run_python("import json\n" + textwrap.dedent(code), tmp_path, fresh=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout)
    assert "trt_inline.autoload" in loaded, "the torch.backends entry point did not run"
    assert not [m for m in loaded if m.startswith("torch_tensorrt")]
    # The entry point and the light modules it is made of: nothing of the plugin, the passes or the backend.
    light = {"trt_inline", "trt_inline.autoload", "trt_inline.importing", "trt_inline.operators", "trt_inline.switches"}
    assert {m for m in loaded if m.startswith("trt_inline")} == light


def test_register_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import wrapt

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("hook machinery broken")

    monkeypatch.setattr(wrapt, "register_post_import_hook", broken)
    monkeypatch.delenv("TRT_INLINE_DISABLE", raising=False)
    with pytest.warns(RuntimeWarning, match="could not register its import hook"):
        autoload.register()


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
    monkeypatch.setattr(adapters, "torch_tensorrt_version", lambda: "2.13.0")
    replacements = plugin.replacements_for(_fake_exporter(params))
    assert replacements["inline_trt_modules"].__name__ == expected
    assert replacements["inline_torch_modules"] is passes.inline_torch_modules
    assert replacements["lift"] is adapters.lift


def test_replacements_for_2_14_keep_the_stock_mutation_exposure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapters, "torch_tensorrt_version", lambda: "2.14.0")
    calls: list[tuple[str, int]] = []
    exposer = lambda gm, node, module, n: calls.append((node.name, n))  # noqa: E731
    exporter = _fake_exporter(
        "gm, cross_compile_module=False, expose_aliased_mutations=True", _expose_aliased_buffer_mutations=exposer
    )
    replacements = plugin.replacements_for(exporter)
    assert replacements["lift"].__name__ == "lift" and replacements["lift"] is not adapters.lift  # stock lift, wrapped

    from support.graphs import seed_collision_graph

    gm, _ = seed_collision_graph()
    replacements["inline_trt_modules"](gm, False, True)
    assert [n for _, n in calls] == [1, 2]
    calls.clear()
    gm, _ = seed_collision_graph()
    replacements["inline_trt_modules"](gm, False, False)
    assert calls == []


def test_doctor_reports_and_exits_zero_without_torch_tensorrt() -> None:
    proc = new_interpreter("-m", "trt_inline.cli", "doctor", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "torch_tensorrt  not installed" in proc.stdout
    assert "entry point     registered (torch.backends: trt_inline = trt_inline.autoload:register)" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.heavy
def test_doctor_tells_a_rehearsal_setup_from_a_broken_install(tmp_path: Path) -> None:
    """A release that cannot import without TensorRT, on a machine without CUDA and without TensorRT, is what the
    reference backend rehearses on (exit 0, its pipeline named, the release's own import noise kept out); with
    TensorRT installed the same failure is a broken install (exit 1)."""
    package = tmp_path / "site" / "torch_tensorrt"
    package.mkdir(parents=True)
    (package / "_version.py").write_text('__version__ = "9.9.0"\n__tensorrt_version__ = "99.0"\n')
    (package / "__init__.py").write_text(
        "print('import error when try to import _TensorRTProxyModule')\n"
        "raise ImportError('Could not find libnvinfer.so.99')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    env.pop("TRT_INLINE_PIPELINE", None)
    proc = new_interpreter("-m", "trt_inline.cli", "doctor", env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "import error when try" not in proc.stdout + proc.stderr
    assert "torch_tensorrt  9.9.0, not importable (ImportError: Could not find libnvinfer.so.99)" in proc.stdout
    assert "rehearsal       Torch-TensorRT 9.9.0's own pipeline (dry run)" in proc.stdout

    (tmp_path / "site" / "tensorrt").mkdir()
    (tmp_path / "site" / "tensorrt" / "__init__.py").write_text("__version__ = '99.0'\n")
    proc = new_interpreter("-m", "trt_inline.cli", "doctor", env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tensorrt        99.0" in proc.stdout
    assert "rehearsed without TensorRT" not in proc.stdout


def run_doctor(tree: Path) -> subprocess.CompletedProcess[str]:
    """``trt-inline doctor`` (``python -m trt_inline.cli doctor``) with ``tree``'s torch_tensorrt importable and
    autoload on, as run_python runs a user's process. (test_doctor_reports_and_exits_zero_without_torch_tensorrt
    starts the command as a new interpreter.)"""
    return run_python(
        "import runpy\nrunpy.run_module('trt_inline.cli', run_name='__main__', alter_sys=True)", tree, "doctor"
    )


def test_doctor_flags_an_unsupported_exporter(tmp_path: Path) -> None:
    proc = run_doctor(pairs.package_tree(tmp_path / "site", "9.9.0", _BROKEN_EXPORTER))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "torch_tensorrt  9.9.0" in proc.stdout
    assert (
        "exporter patch  UNSUPPORTED: torch_tensorrt.dynamo._exporter.inline_trt_modules has an unknown signature"
        in proc.stdout
    )
    assert "Traceback" not in proc.stderr


def test_doctor_reports_an_active_patch(tmp_path: Path) -> None:
    proc = run_doctor(release_tree(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert RELEASE is not None
    # What the release's record lists (2.5's transform too: its shape analysis cannot type scalar engine outputs).
    expected = f"exporter patch ({RELEASE.version})  active: {', '.join([*sorted(RELEASE.replaced), 'save', 'load'])}"
    assert expected in proc.stdout


_LOAD_RANK_FILES = """
    import json, os, sys, torch
    import torch_tensorrt, trt_inline
    from pathlib import Path
    from trt_inline.distributed.manifest import RankManifest
    from trt_inline.export import write_program

    folder = Path(sys.argv[1])
    program = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    write_program(program, folder / "single.pt2")
    manifest = RankManifest(rank=1, world_size=2, backend="gloo", save_id="5f0c1a2b3c4d5e6f")
    write_program(program, folder / "rank1.pt2", {"trt_inline_ranks.json": manifest.encode()})

    def outcome(name):
        try:
            return type(torch_tensorrt.load(str(folder / name))).__name__
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    found = {"rank file": outcome("rank1.pt2"), "single file": outcome("single.pt2")}
    os.environ["TRT_INLINE_CHECK_RANKS"] = "0"
    found["rank file, TRT_INLINE_CHECK_RANKS=0"] = outcome("rank1.pt2")
    del os.environ["TRT_INLINE_CHECK_RANKS"]
    trt_inline.uninstall()
    found["uninstalled: the release's own load"] = torch_tensorrt.load is torch_tensorrt._compile.load and not hasattr(
        torch_tensorrt.load, "__trt_inline_stock__")
    found["rank file, uninstalled"] = outcome("rank1.pt2")
    trt_inline.install()
    found["rank file, installed again"] = outcome("rank1.pt2").partition(":")[0]
    print(json.dumps(found))
"""


def test_patched_torch_tensorrt_load_refuses_a_rank_file_outside_its_rank_set(tmp_path: Path) -> None:
    """The release's own ``torch_tensorrt.load``, wrapped at import as ``save`` is: a rank file's manifest is checked
    as ``trt_inline.load`` checks it (here: no process group at all); uninstall puts the stock function back."""
    proc = run_python(_LOAD_RANK_FILES, release_tree(tmp_path), str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {
        "rank file": f"RankSetError: {tmp_path / 'rank1.pt2'} is rank 1 of 2 of a tensor-parallel rank set: load it in "
        "a process group of 2 ranks (torchrun --nproc-per-node 2) (TRT_INLINE_CHECK_RANKS=0 loads it anyway)",
        "single file": "ExportedProgram",
        "rank file, TRT_INLINE_CHECK_RANKS=0": "ExportedProgram",
        "uninstalled: the release's own load": True,
        "rank file, uninstalled": "ExportedProgram",
        "rank file, installed again": "RankSetError",
    }


def test_2_5_adapter_takes_engine_shapes_from_the_outputs_map() -> None:
    from support.graphs import seed_collision_graph

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


def test_2_5_transform_types_scalar_engine_outputs_from_one_run() -> None:
    """2.5's shape analysis reads ``.shape`` of every submodule output; the replacement records values instead."""
    from support.models import scalar_cases

    case = next(c for c in scalar_cases() if c.name == "scalar_output")
    # Dynamic, so that an engine computes the size (a static compile folds it into a constant).
    compiled = trt_inline.reference.compile(
        case.model.eval(), case.inputs, torch_executed_ops=case.torch_executed_ops, dynamic_shapes=case.dynamic_shapes
    )
    calls = [n for n in compiled.graph.nodes if n.op == "call_module" and str(n.target).startswith("_run_on_acc_")]
    for node in calls:
        del node.meta["val"]  # as 2.5's compile leaves engine calls
    flat = adapters.transform_recording_engine_outputs(compiled, case.inputs)
    assert all("val" not in n.meta for n in calls), "the argument must be left untouched"
    engine_calls = [n for n in flat.graph.nodes if n.target is torch.ops.trt_inline.execute_engine.default]
    recorded = [v for n in engine_calls for v in n.meta["val"]]
    assert any(isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype == torch.int64 for v in recorded), recorded
    reads = [n for n in flat.graph.nodes if n.target is torch.ops.aten.item.default]
    rows_minus_one = case.inputs[0].shape[0] - 1  # what ScalarOut's engine returns
    assert reads and all(r.meta["val"] == rows_minus_one for r in reads), [r.meta.get("val") for r in reads]
    submodules = {name for name, _ in compiled.named_children()}
    assert not any(n.op == "call_module" and n.target in submodules for n in flat.graph.nodes)
    with torch.no_grad():  # 2.5 records the sizes of the save's inputs: compared at those
        assert max_abs_diff([flat(*case.inputs)], [compiled(*case.inputs)]) == 0.0


def test_2_5_replacements_include_transform_when_the_exporter_has_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapters, "torch_tensorrt_version", lambda: "2.5.0")
    exporter = _fake_exporter("gm, outputs_map", transform=lambda gm, inputs, kwarg_inputs=None: gm)
    replacements = plugin.replacements_for(exporter)
    assert replacements["transform"] is adapters.transform_recording_engine_outputs
    assert "transform" not in plugin.replacements_for(_fake_exporter("gm, cross_compile_module=False"))
    assert adapters.preflight(replacements) == {}


def _compile_module(with_extra_files: bool) -> str:
    """A stand-in for torch_tensorrt/_compile.py's save, with and without the extra_files parameter (2.11+)."""
    extra = "extra_files=None, " if with_extra_files else ""
    write = "extra_files=extra_files" if with_extra_files else "extra_files=None"
    return textwrap.dedent(
        f"""
        import torch, trt_inline
        __all__ = ["save"]

        def save(module, file_path="", *, {extra}output_format="exported_program", inputs=None,
                 arg_inputs=None, kwarg_inputs=None, retrace=True):
            program = trt_inline.to_exported_program(module, arg_inputs=arg_inputs or inputs, retrace=False)
            torch.export.save(program, file_path, {write})
        """
    )


_MINIMAL_EXPORTER = """
def inline_trt_modules(gm, cross_compile_module=False):
    return gm

def inline_torch_modules(gm):
    return gm
"""

_SAVE_THROUGH_TORCH_TENSORRT = """
    import sys, torch
    import torch_tensorrt, trt_inline
    from support.models import ConvBnRelu

    x = torch.randn(2, 3, 8, 8)
    compiled = trt_inline.reference.compile(ConvBnRelu().eval(), (x,), torch_executed_ops=["aten.relu.default"])
    torch_tensorrt.save(compiled, sys.argv[1], arg_inputs=[x], retrace=False)
    print("save" in trt_inline.plugin.replaced_functions())
    trt_inline.uninstall()
    print(torch_tensorrt.save.__module__, getattr(torch_tensorrt.save, "__wrapped__", None) is None)
"""


@pytest.mark.parametrize("with_extra_files", [True, False], ids=["2.11+", "before-2.11"])
def test_patched_torch_tensorrt_save_embeds_reference_io(tmp_path: Path, with_extra_files: bool) -> None:
    tree = pairs.package_tree(tmp_path / "site", "2.13.0", _MINIMAL_EXPORTER)
    (tree / "torch_tensorrt" / "_compile.py").write_text(_compile_module(with_extra_files))
    # A release whose record agrees with the save written here: 2.13 takes extra_files, 2.10 does not.
    version = "2.13.0" if with_extra_files else "2.10.0"
    (tree / "torch_tensorrt" / "__init__.py").write_text(
        f"__version__ = {version!r}\nfrom torch_tensorrt._compile import *  # noqa: F403\n"
    )
    proc = run_python(_SAVE_THROUGH_TORCH_TENSORRT, tree, str(tmp_path / "model.pt2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = proc.stdout.strip().splitlines()[-2:]
    report = trt_inline.verify(tmp_path / "model.pt2")  # the file the user's process saved
    assert f"{report.expected_source} {report.ok} {first}" == "embedded True True"
    assert second == "torch_tensorrt._compile True", "uninstall must put the stock save back"


class _SliceAndAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x[:, :4] + y


def _narrow_file(path: Path) -> None:
    """A program whose batch accepts 2 ... 8 and whose x.shape[1] is 2 * h + 2 for h in 2 ... 8."""
    b, h = torch.export.Dim("b", min=2, max=8), torch.export.Dim("h", min=2, max=8)
    program = torch.export.export(
        _SliceAndAdd(), (torch.randn(3, 6), torch.randn(3, 4)), dynamic_shapes=({0: b, 1: 2 * h + 2}, {0: b})
    )
    torch.export.save(program, path)


def test_narrowed_ranges_names_each_size_that_lost_part_of_its_range(tmp_path: Path) -> None:
    from trt_inline.plugin.ranges import narrowed_ranges

    path = tmp_path / "narrow.pt2"
    _narrow_file(path)
    b, h = torch.export.Dim("b", min=2, max=8), torch.export.Dim("h", min=2, max=8)
    assert narrowed_ranges(path, ({0: b, 1: 2 * h + 2}, {0: b})) == []
    wide_b, wide_h = torch.export.Dim("b", min=1, max=8), torch.export.Dim("h", min=1, max=9)
    assert narrowed_ranges(path, {"x": {0: wide_b, 1: 2 * wide_h + 2}, "y": {0: wide_b}}, ["x", "y"]) == [
        "x size 0: accepts 2 ... 8, declared 1 ... 8",
        "x size 1: accepts 6 ... 18, declared 4 ... 20",
        "y size 0: accepts 2 ... 8, declared 1 ... 8",
    ]
    assert narrowed_ranges(tmp_path / "missing.pt2", ({0: wide_b},)) == []


def test_patched_save_warns_once_when_the_file_rejects_declared_sizes(tmp_path: Path) -> None:
    """Never worse than stock, silently: a release path that narrows a declared range is named in one warning."""
    from trt_inline.plugin.save import save_with_reference_io

    def narrowing_save(module: Any, file_path: str = "", **kwargs: Any) -> None:
        _narrow_file(Path(file_path))

    wrapped = save_with_reference_io(narrowing_save)
    path = tmp_path / "narrow.pt2"
    batch = torch.export.Dim("b", min=1, max=8)
    with pytest.warns(
        RuntimeWarning, match=r"rejects sizes declared in dynamic_shapes \(input 0 size 0: accepts 2"
    ) as caught:
        wrapped(_SliceAndAdd(), str(path), dynamic_shapes=({0: batch}, {0: batch}))
    assert len([w for w in caught if "rejects sizes" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped(_SliceAndAdd(), str(path), dynamic_shapes=({0: torch.export.Dim("b", min=2, max=8)}, None))


def test_preflight_covers_dynamic_shapes() -> None:
    """A replacement that flattens the static probe but not shared/derived Dims with a scalar crossing is refused."""
    from trt_inline.inlining.scalars import is_scalar
    from trt_inline.plugin.adapters import preflight

    def static_only(gm: torch.fx.GraphModule, cross_compile_module: bool = False) -> torch.fx.GraphModule:
        for node in gm.graph.nodes:
            values = node.meta.get("val")
            if node.op == "call_module" and isinstance(values, list) and any(is_scalar(v) for v in values):
                raise NotImplementedError("a scalar engine output")
        return trt_inline.inline_trt_modules(gm, cross_compile_module)

    passes = {
        "inline_trt_modules": trt_inline.inline_trt_modules,
        "inline_torch_modules": trt_inline.inline_torch_modules,
    }
    assert preflight(passes) == {}
    refused = preflight({**passes, "inline_trt_modules": static_only})
    assert refused["inline_trt_modules"] == "NotImplementedError: a scalar engine output"
    assert refused["inline_torch_modules"].startswith("not tried: inline_trt_modules failed first")
