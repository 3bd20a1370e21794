"""The ``trt-inline`` command as tests run it (in this process, or as a process of its own), the check of an
unusable-input exit, and a miswired file."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from pathlib import Path

import torch

from support.processes import new_interpreter, python_path
from trt_inline.archive import REFERENCE_IO_FILE
from trt_inline.cli import main as cli_main


def miswire(source: Path, target: Path) -> Path:
    """Loadable but wrong: the second relu reads the first engine's output (same shape and dtype)."""
    extra = {REFERENCE_IO_FILE: ""}
    program = torch.export.load(source, extra_files=extra)
    relus = [n for n in program.graph.nodes if n.target is torch.ops.aten.relu.default]
    first_input, second_input = relus[0].args[0], relus[1].args[0]
    assert first_input.meta["val"].shape == second_input.meta["val"].shape
    relus[1].replace_input_with(second_input, first_input)
    program.graph.eliminate_dead_code()
    program.graph_module.recompile()
    program.graph.lint()
    torch.export.save(program, target, extra_files=extra)
    return target


def cli(*args: str, env: dict[str, str] | None = None, process: bool = False) -> subprocess.CompletedProcess[str]:
    """The CLI: in this process (its own child process still loads the file), or, with ``env`` or
    ``process=True``, as a process of its own. Every ``verify`` runs under a 2 GiB memory limit."""
    if args[:1] == ("verify",) and "--memory-limit" not in args:
        args = (*args, "--memory-limit", "2GiB")
    if env is None and not process:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli_main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                code = int(exc.code or 0)
        return subprocess.CompletedProcess(["trt-inline", *args], code, out.getvalue(), err.getvalue())
    run_env = {**os.environ, "PYTHONPATH": python_path(), **(env or {})}
    return new_interpreter("-m", "trt_inline.cli", *args, env=run_env, timeout=300)


def assert_unusable(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
