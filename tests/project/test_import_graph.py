"""``.ci/imports``: the import graph of the package and of the top-level modules shipped beside it.

Each case plants an import in a copy of the tree and expects the script to fail naming it; the copy as it is
passes first, so that the failure is the plant's.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from support.processes import REPO, new_interpreter

SCRIPT = REPO / ".ci" / "imports"
TOP_LEVEL = ("trt_inline_autoload.py", "trt_inline_command.py", "trt_inline_interpreter.py", "trt_inline_switches.py")


def _tree(root: Path) -> Path:
    """The modules the script reads (the package, the top-level modules, pyproject.toml), copied under ``root``."""
    shutil.copytree(REPO / "trt_inline", root / "trt_inline", ignore=shutil.ignore_patterns("__pycache__"))
    for name in (*TOP_LEVEL, "pyproject.toml"):
        shutil.copy(REPO / name, root / name)
    return root


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    return new_interpreter(SCRIPT, root, timeout=120)


def _plant(path: Path, code: str) -> None:
    path.write_text(path.read_text() + "\n\n" + code)


def test_the_tree_passes_and_the_top_level_modules_are_read(tmp_path: Path) -> None:
    done = _run(_tree(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"(py-modules)                       {len(TOP_LEVEL)}" in done.stdout, done.stdout
    assert "imports pointing up a floor (switches < core <" in done.stdout


@pytest.mark.parametrize(
    ("module", "code", "circle", "expected"),
    [
        # Deferred or not, a circle: rank_check reads the switches, which would read it back.
        (
            "trt_inline_switches.py",
            "def _late():\n    from trt_inline.distributed import rank_check  # noqa\n",
            ("trt_inline.distributed.rank_check", "trt_inline_switches"),
            ["  trt_inline_switches (switches) imports trt_inline.distributed.rank_check (core)"],
        ),
        # The package importing the entry point, whose kernels import the package: a circle, and an import up.
        (
            "trt_inline/distributed/rank_check.py",
            "import trt_inline_autoload  # noqa\n",
            ("trt_inline.distributed.rank_check", "trt_inline_autoload"),
            ["  trt_inline.distributed.rank_check (core) imports trt_inline_autoload (entry points)"],
        ),
        # The entry point importing the package as torch imports it.
        (
            "trt_inline_autoload.py",
            "from trt_inline.reference import engine  # noqa\n",
            (),
            [
                "  trt_inline_autoload imports trt_inline.reference.engine when it is imported "
                "(import it inside a function)",
            ],
        ),
    ],
    ids=["switches-circle", "package-imports-autoload", "autoload-imports-at-import-torch"],
)
def test_an_import_planted_in_a_top_level_module_is_found(
    tmp_path: Path, module: str, code: str, circle: tuple[str, ...], expected: list[str]
) -> None:
    root = _tree(tmp_path)
    assert _run(root).returncode == 0
    _plant(root / module, code)
    done = _run(root)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for line in expected:
        assert line in lines, done.stdout
    # A circle is printed as its strongly connected component: every module on it, the planted pair among them.
    circles = [line.removeprefix("  circle: ").split(" <-> ") for line in lines if line.startswith("  circle: ")]
    assert f"import circles (every import, deferred ones too): {1 if circle else 0}" in lines, done.stdout
    if circle:
        assert len(circles) == 1 and set(circle) <= set(circles[0]), done.stdout
