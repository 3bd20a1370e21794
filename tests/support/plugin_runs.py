"""A Torch-TensorRT release's shell package (its own save path, importable here) and user processes run with it:
``release_tree``, ``run_python`` (a child forked from a clean interpreter, or a new interpreter),
``run_python_forks``."""

from __future__ import annotations

import os
import subprocess
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from support import pairs
from support.processes import (
    REPO,
    TESTS,
    new_interpreter,
    python_path,
    run_forked,
    run_forked_each,
)

RELEASE = pairs.release_for_torch()


def release_tree(
    tmp_path: Path,
    *,
    with_save: bool = True,
    stand_in_engine_op: bool = False,
    executorch: bool = False,
    cross_compile: bool = False,
    kv_cache: bool = False,
) -> Path:
    """The shell package of the release the installed torch belongs to; skip where there is none."""
    if RELEASE is None:
        pytest.skip(f"no Torch-TensorRT release requires torch {torch.__version__}")
    try:
        return pairs.package_tree(
            tmp_path / "site",
            RELEASE.version,
            with_save=with_save,
            stand_in_engine_op=stand_in_engine_op,
            executorch=executorch,
            cross_compile=cross_compile,
            kv_cache=kv_cache,
        )
    except pairs.Unavailable as exc:
        unavailable(exc)


def unavailable(exc: Exception) -> None:
    """Skip where the release's wheel cannot be had; under CI the headline feature must not go untested."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true and {exc}")
    pytest.skip(str(exc))


# What run_python's processes have imported before their code runs: torch, and torch._dynamo (which importing
# torch_tensorrt imports first; importing it changes nothing trt-inline decides). Nothing of trt-inline.
PRELOAD = ("torch._dynamo",)


def run_python(
    code: str,
    tree: Path,
    *args: str,
    disable: bool = False,
    path: Sequence[Path] = (),
    preload: tuple[str, ...] = PRELOAD,
    merged: bool = False,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -c code args`` with the shell ``tree`` (and ``path``) importable, as a user's process.

    The process is forked from a clean interpreter of this test worker that has imported only torch and
    ``preload`` (conftest.run_forked): what a new interpreter gives the code, without starting one per run.
    ``fresh``: a new interpreter (for what happens while one starts: ``import torch``). ``merged``: stderr
    into stdout.
    """
    if fresh:
        env = _environment(disable, tree, TESTS, REPO, *path)
        return new_interpreter("-c", textwrap.dedent(code), *args, env=env, merged=merged)
    env = _environment(disable, TESTS, REPO, *path)  # the tree first on sys.path, as PYTHONPATH=tree:... puts it
    return run_forked(textwrap.dedent(code), args, tree.parent, env=env, preload=preload, path=[tree], merged=merged)


def _environment(disable: bool, *path: Path) -> dict[str, str]:
    """This process's environment with ``path`` first on ``PYTHONPATH``, the plugin off only with ``disable``."""
    env = dict(os.environ)
    env.pop("TRT_INLINE_DISABLE", None)
    if disable:
        env["TRT_INLINE_DISABLE"] = "1"
    env["PYTHONPATH"] = python_path(*path)
    return env


def _preload(preload: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*PRELOAD, *preload)))


def run_python_forks(
    code: str,
    tree: Path,
    argument_lists: list[list[str]],
    *,
    preload: tuple[str, ...] = (),
    disable: bool = False,
    path: Sequence[Path] = (),
) -> list[tuple[int, str]]:
    """``run_python(code, tree, *arguments)`` for each argument list: ``[(exit status, output)]``.

    ``preload``: modules ``code`` imports before anything else, imported once before the forks (in an
    interpreter of their own where one is the tree's: torch_tensorrt, ExecuTorch).
    """
    if not any(name.partition(".")[0] in ("torch_tensorrt", "executorch") for name in preload):
        runs = [
            run_python(code, tree, *arguments, disable=disable, path=path, preload=_preload(preload), merged=True)
            for arguments in argument_lists
        ]
        return [(proc.returncode, proc.stdout) for proc in runs]
    env = _environment(disable, TESTS, REPO, *path)
    return run_forked_each(
        textwrap.dedent(code), argument_lists, tree.parent, env=env, imports=preload, preload=PRELOAD, path=[tree]
    )
