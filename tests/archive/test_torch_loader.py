"""torch's own loader on reference-backend files, in processes that never import trt_inline.

trt-inline's ``torch.backends`` entry point (``trt_inline.autoload``) defines
``trt_inline::execute_engine`` at ``import torch``, its kernels importing
``trt_inline.reference.engine`` on their first call: ``torch.export.load`` of a
file with reference engines then loads it, and its program runs, with ``import
torch`` alone. Where the entry point does not run (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``),
``import trt_inline`` defines the same operators with the package's kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from support.models import RELU, ConvBnRelu
from support.processes import new_interpreter, python_path

import trt_inline
from trt_inline import reference
from trt_inline.switches import RANK_CHECK_OP, RANK_CHECK_SCHEMA, REFERENCE_ENGINE_OP, REFERENCE_ENGINE_SCHEMA

ENGINE_OP = torch.ops.trt_inline.execute_engine.default


def _fresh(code: str, *args: object, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (``env`` added to this one's, the entry point active as installed)."""
    environment = dict(os.environ, PYTHONPATH=python_path(), **env)
    return new_interpreter("-c", textwrap.dedent(code), *map(str, args), env=environment, timeout=300)


def _outputs(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[torch.Tensor]]:
    """A reference-backend file (engines between relu fallbacks), its inputs saved beside it, and what the program
    loaded in this process (trt_inline imported) computes on them."""
    folder = tmp_path_factory.mktemp("torch_loader")
    generator = torch.Generator().manual_seed(0)
    model = ConvBnRelu().eval()
    x = torch.randn(2, 3, 8, 8, generator=generator)
    with torch.no_grad():
        compiled = reference.compile(model, (x,), torch_executed_ops=[RELU])
        path = folder / "relu_fallback.pt2"
        trt_inline.save(compiled, path, arg_inputs=(x,))
    inputs = folder / "inputs.pt"
    torch.save([x], inputs)
    program = torch.export.load(path)
    # The file is only worth testing while its program really calls the engine op.
    engine_calls = [node for node in program.graph.nodes if node.target is ENGINE_OP]
    assert len(engine_calls) == 4, program.graph
    assert all(isinstance(node.args[2], str) for node in engine_calls)  # each with its program
    expected = _outputs(program.module()(x))
    assert len(expected) == 2
    return path, inputs, expected


# Only torch's own loader: what sys.modules holds after the load and after the first run, the outputs to a file.
_LOAD_AND_RUN = """
    import json, sys, torch

    ep = torch.export.load(sys.argv[1])
    after_load = sorted(m for m in sys.modules if m.startswith("trt_inline"))
    inputs = torch.load(sys.argv[2], weights_only=True)
    out = ep.module()(*inputs)
    after_run = sorted(m for m in sys.modules if m.startswith("trt_inline"))
    torch.save(list(out), sys.argv[3])
    print(json.dumps({"after_load": after_load, "after_run": after_run}))
"""


@pytest.mark.parametrize("disable", [False, True], ids=["plugin-on", "TRT_INLINE_DISABLE=1"])
def test_torch_export_load_runs_a_reference_file_without_trt_inline(
    saved: tuple[Path, Path, list[torch.Tensor]], tmp_path: Path, disable: bool
) -> None:
    """The op is a definition, not the plugin's patch: ``TRT_INLINE_DISABLE=1`` leaves it defined."""
    path, inputs, expected = saved
    env = {"TRT_INLINE_DISABLE": "1"} if disable else {}
    done = _fresh(_LOAD_AND_RUN, path, inputs, tmp_path / "out.pt", **env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", "the loader printed warnings:\n" + done.stderr[-3000:]
    modules = json.loads(done.stdout)
    # Loading needs only the op's schema: nothing of trt-inline but the entry point and the light modules it is made
    # of (the package's __init__, the operators' definitions, the switches) is imported.
    assert modules["after_load"] == [
        "trt_inline", "trt_inline.autoload", "trt_inline.importing", "trt_inline.operators", "trt_inline.switches",
    ]  # fmt: skip
    # Running imports the reference engine, on the first call of the op's kernel.
    assert "trt_inline.reference.engine" in modules["after_run"]
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert len(out) == len(expected)
    for got, want in zip(out, expected, strict=True):
        assert torch.equal(got, want)


_LOAD_AND_EXPORT = """
    import json, sys, torch

    ep = torch.export.load(sys.argv[1])
    inputs = torch.load(sys.argv[2], weights_only=True)
    before = "trt_inline.reference.engine" in sys.modules
    again = torch.export.export(ep.module(), tuple(inputs))  # the fake kernel's first call imports the engine
    calls = sum(1 for n in again.graph.nodes if n.target is torch.ops.trt_inline.execute_engine.default)
    torch.save(list(again.module()(*inputs)), sys.argv[3])
    print(json.dumps({"before": before, "after": "trt_inline.reference.engine" in sys.modules, "calls": calls}))
"""


@pytest.mark.heavy
def test_a_loaded_reference_file_exports_again_without_trt_inline(
    saved: tuple[Path, Path, list[torch.Tensor]], tmp_path: Path
) -> None:
    """Tracing (export, AOTInductor) reaches the fake kernel first: it imports the engine as the real one does."""
    path, inputs, expected = saved
    done = _fresh(_LOAD_AND_EXPORT, path, inputs, tmp_path / "out.pt")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]
    assert json.loads(done.stdout) == {"before": False, "after": True, "calls": 4}
    for got, want in zip(torch.load(tmp_path / "out.pt", weights_only=True), expected, strict=True):
        assert torch.equal(got, want)


# Who defined each operator, its schema, whether dead-code elimination keeps the rank check; then the file run.
_DEFINITIONS = """
    import json, sys, torch
    from torch._library.custom_ops import OPDEFS

    def describe():
        engine = torch.ops.trt_inline.execute_engine.default
        check = torch.ops.trt_inline.check_ranks.default
        kernel = OPDEFS["trt_inline::execute_engine"]._init_fn
        return {
            "engine_schema": str(engine._schema), "engine_kernel": kernel.__module__,
            "check_schema": str(check._schema), "check_kept": check in torch.fx.node._side_effectful_functions,
        }

    found = {"import torch": describe() if hasattr(torch.ops.trt_inline, "execute_engine") else None}
    import trt_inline
    found["import trt_inline"] = describe()
    inputs = torch.load(sys.argv[2], weights_only=True)
    torch.save(list(torch.export.load(sys.argv[1]).module()(*inputs)), sys.argv[3])
    print(json.dumps(found))
"""


@pytest.mark.parametrize("autoload", ["1", "0"])
def test_the_entry_point_and_the_package_define_the_same_operators(
    saved: tuple[Path, Path, list[torch.Tensor]], tmp_path: Path, autoload: str
) -> None:
    """With the entry point, ``import torch`` defines them and ``import trt_inline`` keeps them; without it
    (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), ``import trt_inline`` defines them. The same definitions either way
    (:mod:`trt_inline.operators`: its kernels import the package's on their first call), and the same numbers."""
    path, inputs, expected = saved
    done = _fresh(_DEFINITIONS, path, inputs, tmp_path / "out.pt", TORCH_DEVICE_BACKEND_AUTOLOAD=autoload)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    schemas = {
        "engine_schema": REFERENCE_ENGINE_OP + REFERENCE_ENGINE_SCHEMA,
        "check_schema": RANK_CHECK_OP + RANK_CHECK_SCHEMA,
        "check_kept": True,
    }
    assert found["import trt_inline"] == {**schemas, "engine_kernel": "trt_inline.operators"}
    if autoload == "1":
        assert found["import torch"] == found["import trt_inline"]
    else:
        assert found["import torch"] is None
    for got, want in zip(torch.load(tmp_path / "out.pt", weights_only=True), expected, strict=True):
        assert torch.equal(got, want)


_BROKEN_DEFINITION = """
    import os, sys, warnings, torch

    def broken(*args, **kwargs):
        raise RuntimeError("custom ops broken")

    # As torch runs its entry points, ours among them: at the end of its own import, which is not complete yet (torch
    # was imported without them, so that this process runs ours as torch would).
    real, torch.library.custom_op = torch.library.custom_op, broken
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
    torch.__spec__._initializing = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from trt_inline import autoload

        autoload.register()
    torch.__spec__._initializing = False
    torch.library.custom_op = real
    for warning in caught:
        print(warning.category.__name__, warning.message)
    print(hasattr(torch.ops.trt_inline, "execute_engine"), hasattr(torch.ops.trt_inline, "check_ranks"))
    import trt_inline

    program = trt_inline.load(sys.argv[1])
    print(hasattr(torch.ops.trt_inline, "execute_engine"))
    inputs = torch.load(sys.argv[2], weights_only=True)
    torch.save(list(program.module()(*inputs)), sys.argv[3])
"""


def test_a_failed_definition_is_one_warning_and_trt_inline_load_defines_it(
    saved: tuple[Path, Path, list[torch.Tensor]], tmp_path: Path
) -> None:
    """``register`` never raises (an exception there would make ``import torch`` fail); the package's loader
    defines what it could not, and the file runs."""
    path, inputs, expected = saved
    done = _fresh(
        _BROKEN_DEFINITION, path, inputs, tmp_path / "out.pt", TORCH_DEVICE_BACKEND_AUTOLOAD="0", TRT_INLINE_DISABLE="1"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "RuntimeWarning trt-inline: could not define trt_inline::execute_engine (RuntimeError: custom ops broken); "
        "files that call it load once trt_inline.operators.define_all() has run (trt_inline.load runs it)",
        "False True",
        "True",
    ]
    for got, want in zip(torch.load(tmp_path / "out.pt", weights_only=True), expected, strict=True):
        assert torch.equal(got, want)


_IMPORTED_FIRST = """
    import json, sys
    import importlib.metadata as metadata

    if sys.argv[1] == "not installed":  # (the package on the import path only: torch finds no entry point of ours)
        entry_points, distribution = metadata.entry_points, metadata.distribution
        metadata.entry_points = lambda **kw: [] if kw.get("group") == "torch.backends" else entry_points(**kw)

        def distribution(name, found=distribution):
            if name == "trt-inline":
                raise metadata.PackageNotFoundError(name)
            return found(name)

        metadata.distribution = distribution
    import trt_inline

    first = sorted(m for m in sys.modules if m.startswith(("torch", "trt_inline")) and "." not in m)
    import torch

    print(json.dumps({"first": first, "defined": [hasattr(torch.ops.trt_inline, name) for name in
                                                  ("execute_engine", "check_ranks")],
                      "entry point ran": "trt_inline.autoload" in sys.modules}))
"""


@pytest.mark.parametrize(("autoload", "installed"), [("1", "installed"), ("0", "installed"), ("1", "not installed")])
def test_import_trt_inline_imports_no_torch_and_torch_then_has_the_operators(autoload: str, installed: str) -> None:
    """``import trt_inline`` first: no torch (PEP 562), and the operators defined when torch is imported after it,
    by the entry point or, where it does not run (switched off, or not installed), by the package's wait for
    torch."""
    done = _fresh(_IMPORTED_FIRST, installed, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload)
    assert done.returncode == 0, done.stderr[-3000:]
    ran = autoload == "1" and installed == "installed"
    assert json.loads(done.stdout) == {"first": ["trt_inline"], "defined": [True, True], "entry point ran": ran}


_INSIDE_TORCHS_IMPORT = """
    import sys, torch

    torch.__spec__._initializing = True   # as while torch runs its entry points: another's imports the package
    import trt_inline
    torch.__spec__._initializing = False
    print(hasattr(torch.ops.trt_inline, "execute_engine"), hasattr(torch.ops.trt_inline, "check_ranks"))
"""


@pytest.mark.parametrize("autoload", ["1", "0"])
def test_the_package_imported_inside_torchs_import_leaves_no_operator_undefined(autoload: str) -> None:
    """Imported while torch is still being imported: ours defines them where it runs (autoload on, before this), the
    package at once where it does not."""
    done = _fresh(_INSIDE_TORCHS_IMPORT, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True"]


_SUBMODULES = """
    import sys
    import trt_inline

    assert "torch" not in sys.modules
    print(trt_inline.package.__name__, trt_inline.isolation.reusing_interpreter.__name__, trt_inline.verify.__name__)
"""


def test_the_packages_submodules_are_its_attributes_after_import_trt_inline() -> None:
    """As when the package imported them all: ``trt_inline.package.load_package`` after a plain ``import trt_inline``
    (each imported on its first use), and ``trt_inline.verify`` still the function."""
    done = _fresh(_SUBMODULES)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["trt_inline.package", "reusing_interpreter", "verify"]
