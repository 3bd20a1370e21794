"""The package's shape: one engine registry, no hidden process state, logging, and its public surface."""

from __future__ import annotations

import ast
import logging
import sys
import warnings
from pathlib import Path

import pytest
import torch
from support.processes import REPO, new_interpreter, python_path
from support.programs import SavedSeed

import trt_inline
from trt_inline import cli, export, logs
from trt_inline.inlining import passes
from trt_inline.verify import verify

PACKAGE = REPO / "trt_inline"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}


def test_core_passes_never_import_the_reference_backend() -> None:
    core = ("inlining/passes.py", "engines.py", "export.py", "inlining/flat_program.py", "inlining/scalars.py",
            "formats.py", "releases.py")  # fmt: skip
    for module in (*core, "inlining/attributes.py", "compat.py", "embedding.py", "inlining/symbolic.py"):
        imported = _imports(PACKAGE / module)
        assert not [name for name in imported if name.startswith("trt_inline.reference")], module


def _dotted(node: ast.AST) -> str:
    """``torch._ops.OpOverload`` for the attribute chain of an expression ("" if it is not one)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


# Private attributes read outside compat.py that are not torch's: (file, attribute) -> what it is.
_NOT_TORCH = {
    ("isolation/inside.py", "_exit"): "os._exit: a forked child ends without running the parent's cleanups",
    ("isolation/sandbox.py", "_exit"): "os._exit: the process that waits for the job ends as the job did",
    ("plugin/adapters.py", "_expose_aliased_buffer_mutations"): "Torch-TensorRT 2.14's exporter helper it wraps",
    ("isolation/interpreter.py", "_exit"): "os._exit: a forked child ends without running the parent's cleanups",
    ("__main__.py", "_exit"): "os._exit: the command ends without the interpreter's teardown of torch's modules",
    ("__main__.py", "_run_exitfuncs"): "atexit's handlers, run before os._exit skips them",
    ("operators.py", "_initializing"): "importlib's mark on a module's spec while it executes (torch's own import)",
}


def _private_reads(source: str, where: str) -> list[str]:
    """Private torch imports, and private attributes read from anything but ``self``/``cls``, in ``source``.

    An attribute with one leading underscore (``module._buffers``, ``op._schema``,
    ``torch.ops.aten._assert_scalar``), also through ``getattr``/``hasattr``/``setattr``
    with a string, unless listed in ``_NOT_TORCH``.
    """
    found = []
    tree = ast.parse(source)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    for name in sorted(imported):
        if name.startswith("torch._") or ".passes.splitter_base" in name or "_unlift" in name:
            found.append(f"{where}: import {name}")
    for node in ast.walk(tree):
        attr = None
        if isinstance(node, ast.Attribute):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                attr = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            attr = node.args[1].value
        private = attr is not None and attr.startswith("_") and not attr.startswith("__")
        if private and (where, attr) not in _NOT_TORCH and attr != "_check":
            found.append(f"{where}:{node.lineno}: .{attr}")
    return found


def test_private_torch_apis_only_through_compat() -> None:
    """Private modules of torch, and every private attribute of any object, are reached only in compat.py."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "compat.py":
            offenders += _private_reads(path.read_text(), str(path.relative_to(PACKAGE)))
    assert offenders == []


def test_the_private_read_check_reports_what_it_looks_for() -> None:
    code = (
        "import torch._subclasses\n"
        "def f(module, op):\n"
        "    return module._buffers, getattr(op, '_schema'), torch.ops.aten._assert_scalar, self._mine, op.__name__\n"
    )
    expected = ["x.py: import torch._subclasses", "x.py:3: ._assert_scalar", "x.py:3: ._buffers", "x.py:3: ._schema"]
    assert sorted(_private_reads(code, "x.py")) == expected


def test_what_an_engine_is_is_decided_in_one_module() -> None:
    """Engine op names and the partitioner's prefixes appear as code (not prose) in engines.py only."""
    needles = ("execute_engine", "_run_on_acc", "_run_on_gpu", "no_op_placeholder")
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "engines.py":
            continue
        code = ast.parse(path.read_text())
        words = [
            n.value
            for n in ast.walk(code)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and not any(c.isspace() for c in n.value)
        ]
        # (Torch-TensorRT's loader function is named after the ops it converts: a function's name, not an op)
        decided = [w for w in words if any(n in w for n in needles) and w != "replace_execute_engine_no_op_node"]
        if path.relative_to(PACKAGE).as_posix() == "switches.py":
            # the reference engine op's name, where torch's entry point reads it (engines.py reads it from there)
            decided = [word for word in decided if word != "trt_inline::execute_engine"]
        assert decided == [], f"{path.relative_to(REPO)} decides by {decided}"


def test_import_registers_the_op_without_the_partitioner() -> None:
    code = (
        "import sys, torch, trt_inline\n"
        "print(hasattr(torch.ops.trt_inline, 'execute_engine'), 'trt_inline.reference.partition' in sys.modules,"
        " 'trt_inline.reference.backend' in sys.modules)"
    )
    proc = new_interpreter("-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False", "False"]


def test_stable_surface() -> None:
    assert (PACKAGE / "py.typed").exists()
    # exported_program_from_graph lives in flat_program; export keeps the name it was first published under.
    assert set(export.__all__) == {"exported_program_from_graph", "save", "to_exported_program", "write_program"}
    assert export.exported_program_from_graph is trt_inline.inlining.flat_program.exported_program_from_graph
    assert set(passes.__all__) == {"inline_torch_modules", "inline_trt_modules", "transform"}
    for name in trt_inline.__all__:
        assert hasattr(trt_inline, name), name
    for name in ("PatchError", "VerifyInputError"):  # still where they were first defined
        assert getattr(trt_inline, name) is getattr(
            trt_inline.plugin if name == "PatchError" else sys.modules["trt_inline.verify"], name
        )


def test_python_dash_m_runs_the_cli() -> None:
    proc = new_interpreter("-m", "trt_inline", "verify", "missing.pt2", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "trt-inline verify: missing.pt2: no such file"


@pytest.mark.parametrize("deterministic", [(False, False), (True, False), (True, True)])
def test_verify_leaves_rng_flags_and_loggers_as_they_were(
    saved_seed: SavedSeed, deterministic: tuple[bool, bool]
) -> None:
    mode, warn_only = deterministic
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    loggers = ("torch", "torch.export", "torch._export", "trt_inline")
    levels = {name: logging.getLogger(name).level for name in loggers}
    try:
        wrong_inputs = [torch.randn(2, 5, 8, 8)]
        torch.manual_seed(1234)
        torch.rand(5)
        rng = torch.get_rng_state()
        report = verify(saved_seed.good)
        assert report.ok and report.expected_source == "embedded"
        with pytest.raises(trt_inline.VerifyInputError, match="does not accept the given inputs"):
            verify(saved_seed.good, arg_inputs=wrong_inputs, expected=[torch.zeros(1)])
        # In this process: per-engine (hooks on the compiled module), random inputs, diff.
        local = verify(saved_seed.good, expected_module=saved_seed.compiled, arg_inputs=[saved_seed.x],
                       per_engine=True, random_inputs=2, isolate=False)  # fmt: skip
        assert local.ok and local.boundaries and len(local.random_runs) == 2, local.to_text()
        assert trt_inline.diff(saved_seed.good, saved_seed.bare, isolate=False).ok
        assert not any(m._forward_hooks for m in saved_seed.compiled.modules()), "recording left a hook behind"
        assert torch.equal(torch.get_rng_state(), rng), "verify reseeded the caller's RNG"
        assert torch.are_deterministic_algorithms_enabled() is mode
        assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
        assert {name: logging.getLogger(name).level for name in loggers} == levels
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def test_cli_restores_warning_filters_and_logging(saved_seed: SavedSeed, capsys: pytest.CaptureFixture[str]) -> None:
    filters, disabled = list(warnings.filters), logging.root.manager.disable
    level = logging.getLogger("trt_inline").level
    assert cli.main(["verify", str(saved_seed.good)]) == 0
    assert cli.main(["--debug", "inspect", str(saved_seed.good)]) == 0
    assert cli.main(["verify", str(saved_seed.root / "missing.pt2")]) == 2
    capsys.readouterr()
    assert warnings.filters == filters and logging.root.manager.disable == disabled
    assert logging.getLogger("trt_inline").level == level and not logging.getLogger("trt_inline").handlers


def test_passes_log_graphs_at_debug_only_when_enabled(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.graphs import seed_collision_graph

    formatted: list[int] = []
    original = logs.LazyGraph.__str__
    monkeypatch.setattr(logs.LazyGraph, "__str__", lambda self: formatted.append(1) or original(self))
    gm, _ = seed_collision_graph()
    with caplog.at_level(logging.INFO, logger="trt_inline"):
        trt_inline.transform(gm)
    assert formatted == [] and not [r for r in caplog.records if r.levelno == logging.DEBUG]

    with caplog.at_level(logging.DEBUG, logger="trt_inline"):
        trt_inline.transform(gm)
    titles = [r.getMessage().splitlines()[0] for r in caplog.records if r.name == "trt_inline.inlining.passes"]
    assert titles == [
        "before inline_trt_modules:",
        "after inline_trt_modules:",
        "before inline_torch_modules:",
        "after inline_torch_modules:",
        "after transform (flat graph):",
    ]
    assert "execute_engine" in caplog.records[-1].getMessage()
    assert formatted, "the graphs were formatted once DEBUG was on"


def test_cli_debug_shows_the_pass_log(saved_seed: SavedSeed, tmp_path: Path) -> None:
    script = (
        "import sys, torch, trt_inline\n"
        "from trt_inline import cli, logs\n"
        "from support.graphs import seed_collision_graph\n"
        "gm, _ = seed_collision_graph()\n"
        "with logs.debug_to_stderr(True):\n"
        "    trt_inline.transform(gm)\n"
    )
    env = {"PYTHONPATH": python_path(REPO / "tests"), "PATH": "/usr/bin:/bin"}
    proc = new_interpreter("-c", script, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "trt_inline.inlining.passes DEBUG: before inline_trt_modules:" in proc.stderr
