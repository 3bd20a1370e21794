"""``.ci/imports``: the package's import graph, its floors, and the light modules imported with or before torch.

Each case plants an import in a copy of the tree and expects the script to fail naming it; the copy as it is
passes first, so that the failure is the plant's.
"""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
from pathlib import Path

import pytest
from support.processes import REPO, new_interpreter

SCRIPT = REPO / ".ci" / "imports"
LIGHT = ("trt_inline/__init__.py", "trt_inline/autoload.py", "trt_inline/__main__.py", "trt_inline/operators.py")


def _tree(root: Path) -> Path:
    """The modules the script reads (the package), copied under ``root``."""
    shutil.copytree(REPO / "trt_inline", root / "trt_inline", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    return new_interpreter(SCRIPT, root, timeout=120)


def _plant(path: Path, code: str) -> None:
    path.write_text(path.read_text() + "\n\n" + code)


def test_the_tree_passes_and_its_light_modules_are_read(tmp_path: Path) -> None:
    done = _run(_tree(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "imports pointing up a floor (startup < core <" in done.stdout
    assert "imports of more than the standard library by light modules, when they are imported: 0" in done.stdout
    # What the light modules import when they are imported is there to be checked (not an empty set).
    for name in LIGHT:
        assert "from trt_inline" in (REPO / name).read_text(), name


@pytest.mark.parametrize(
    ("module", "code", "circle", "expected"),
    [
        # Deferred or not, a circle: rank_check reads the switches, which would read it back.
        (
            "trt_inline/switches.py",
            "def _late():\n    from trt_inline.distributed import rank_check  # noqa\n",
            ("trt_inline.distributed.rank_check", "trt_inline.switches"),
            ["  trt_inline.switches (startup) imports trt_inline.distributed.rank_check (core)"],
        ),
        # The package importing the entry point, whose operators' kernels import the package: a circle, an import up.
        (
            "trt_inline/distributed/rank_check.py",
            "from trt_inline import autoload  # noqa\n",
            ("trt_inline.distributed.rank_check", "trt_inline.operators"),
            ["  trt_inline.distributed.rank_check (core) imports trt_inline.autoload (entry points)"],
        ),
        # The entry point importing the package's work as torch imports it.
        (
            "trt_inline/autoload.py",
            "from trt_inline.reference import engine  # noqa\n",
            (),
            ["  trt_inline.autoload imports trt_inline.reference.engine when it is imported (light modules: "],
        ),
        # The package's __init__ importing torch: `import trt_inline` would.
        (
            "trt_inline/__init__.py",
            "import torch  # noqa\n",
            (),
            ["  trt_inline imports torch when it is imported (light modules: "],
        ),
        # The interpreter the command starts before torch, importing the isolation it is part of.
        (
            "trt_inline/isolation/interpreter.py",
            "from trt_inline.isolation.child import run_isolated  # noqa\n",
            ("trt_inline.isolation.child", "trt_inline.isolation.interpreter"),
            [
                "  trt_inline.isolation.interpreter (startup) imports trt_inline.isolation.child (isolation)",
                "  trt_inline.isolation.interpreter imports trt_inline.isolation.child when it is imported (light ",
            ],
        ),
    ],
    ids=[
        "switches-circle",
        "package-imports-autoload",
        "autoload-imports-at-import-torch",
        "init-imports-torch",
        "interpreter-imports-isolation",
    ],
)
def test_an_import_planted_in_a_light_module_is_found(
    tmp_path: Path, module: str, code: str, circle: tuple[str, ...], expected: list[str]
) -> None:
    root = _tree(tmp_path)
    assert _run(root).returncode == 0
    _plant(root / module, code)
    done = _run(root)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for line in expected:
        assert any(found.startswith(line) for found in lines), done.stdout
    # A circle is printed as its strongly connected component: every module on it, the planted pair among them.
    circles = [line.removeprefix("  circle: ").split(" <-> ") for line in lines if line.startswith("  circle: ")]
    assert f"import circles (every import, deferred ones too): {1 if circle else 0}" in lines, done.stdout
    if circle:
        assert len(circles) == 1 and set(circle) <= set(circles[0]), done.stdout


def _type_checking_imports(path: Path) -> dict[str, str]:
    """What ``path``'s ``if TYPE_CHECKING:`` block imports: {name bound: "module:attribute"} (a module as
    "package:module", as a lazy export of it may be written)."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module, ast.dump(statement)
                for alias in statement.names:
                    found[alias.asname or alias.name] = f"{statement.module}:{alias.name}"
    return found


def _as_written(where: str) -> str:
    """A lazy export's target as ``module:attribute``; a module export (``trt_inline.inlining.passes``) as its
    package's attribute."""
    if ":" in where:
        return where
    package, _, name = where.rpartition(".")
    return f"{package}:{name}"


@pytest.mark.parametrize("package", ["trt_inline", "trt_inline.isolation", "trt_inline.verify"])
def test_the_names_imported_on_first_use_are_the_ones_the_graph_reads(package: str) -> None:
    """A lazy export's import is a string ``.ci/imports`` cannot read: each is also in the package's
    ``if TYPE_CHECKING:`` block, which it does read (and the type checker with it), and the two say the same."""
    module = importlib.import_module(package)
    exports = {name: _as_written(where) for name, where in vars(module)["_exports"].items()}
    path = Path(module.__spec__.origin)  # (``trt_inline.verify`` is the function: the package's own file)
    assert len(exports) >= 10, exports  # (the check has something to hold)
    assert _type_checking_imports(path) == exports
