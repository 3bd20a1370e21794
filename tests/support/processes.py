"""How the tests start processes of their own: a new interpreter (``new_interpreter``), a child forked from a clean
interpreter of this worker (``run_forked``, ``run_forked_each``, ``load_runs_in_fresh_process``), the command with
stderr on a terminal; the import path they get (``python_path``, ``REPO``, ``TESTS``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trt_inline.isolation.interpreter import start_interpreter

REPO = Path(__file__).resolve().parent.parent.parent
# The tests' root: on the import path of every process a test starts, so that ``support`` imports there too.
TESTS = REPO / "tests"


def python_path(*first: str | Path) -> str:
    """``PYTHONPATH`` for a test's own interpreter: ``first``, the repository, then what this process was given.

    Kept, not replaced: trt-inline and its dependencies may live on ``PYTHONPATH`` rather than in a venv
    (``pip install --target DIR``), and a subprocess without them cannot import pyseccomp.
    """
    given = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return os.pathsep.join(dict.fromkeys([*map(str, first), str(REPO), *given]))


def new_interpreter(
    *arguments: str | Path,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 600,
    merged: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python ARGUMENTS`` (``-c CODE ...``, ``-m MODULE ...`` or a script) in a new interpreter: its exit status,
    stdout and stderr as text (stderr into stdout with ``merged``). ``env``: its whole environment (None: this
    process's). Past ``timeout`` seconds it is killed and ``subprocess.TimeoutExpired`` raised.
    """
    return subprocess.run(
        [sys.executable, *map(str, arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


# Loads each saved file in a process that has imported nothing but torch and the
# named modules, runs it on each stored input set and writes the outputs back. An
# AOTInductor package is loaded with trt_inline.package.load_package.
_LOADER = textwrap.dedent(
    """
    import importlib, sys, torch
    for name in sys.argv[3].split(","):
        importlib.import_module(name)
    input_sets_by_path = torch.load(sys.argv[1], weights_only=True)
    results = {}
    for path in sys.argv[4:]:
        input_sets = input_sets_by_path[path]
        if path.endswith(".package.pt2"):
            from trt_inline.package import load_package
            run, calls = load_package(path), []
        else:
            program = torch.export.load(path)
            program.graph_module.graph.lint()
            calls = [n.name for n in program.graph.nodes if n.op == "call_module"]
            run = program.module()
        results[path] = []
        for inputs in input_sets:
            with torch.no_grad():
                outputs = run(*inputs)
            outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
            kinds = [type(o).__name__ for o in outputs]
            outputs = [o if isinstance(o, torch.Tensor) else torch.tensor(o) for o in outputs]
            results[path].append({"outputs": outputs, "call_modules": calls, "kinds": kinds})
    torch.save(results, sys.argv[2])
    """
)


class _ForkingInterpreter:
    """The package's kind of interpreter that forks children (``isolation.interpreter.start_interpreter``, its loop
    ``fork_per_job``) serving the tests' module ``forking``: torch and ``preload`` imported, ``env`` its environment.
    A request is the name of a file holding it (what ``forking.run`` reads), so that the message stays short."""

    def __init__(self, preload: Sequence[str], env: dict[str, str]) -> None:
        self.said = tempfile.TemporaryFile()  # what it says itself (an import that fails, say)
        self.started = start_interpreter("support.forking", *preload, environment=env, output=self.said)

    def run(self, request: Path, timeout: float) -> tuple[int | None, str]:
        """Its child's exit status (None if it or the interpreter did not answer within ``timeout`` seconds), and
        what the interpreter itself said then."""
        deadline = time.monotonic() + timeout
        try:
            self.started.fork(str(request))
            self.started.forked(timeout)
            ended = self.started.ended(max(0.0, deadline - time.monotonic()))
        except (OSError, EOFError):  # it ended (it could not import, say), or gave no child in time
            ended = None
        if ended is None:  # timed out, or the interpreter ended: nothing of it may outlive the call
            self.said.seek(0)
            said = self.said.read().decode(errors="replace")
            self.close()
            return None, said
        return os.waitstatus_to_exitcode(ended[0]), ""

    def close(self) -> None:
        """Its process group killed (its children are in it, not in sessions of their own), then waited for."""
        self.started.stop()
        self.said.close()


# The worker's forking interpreters, the most recently used last (at most _KEPT are kept running).
_forking_interpreters: dict[object, _ForkingInterpreter] = {}


_KEPT = 4


def _forking_interpreter(preload: Sequence[str], env: dict[str, str]) -> _ForkingInterpreter:
    """The worker's interpreter for ``preload`` and ``env`` (started, or restarted after it ended, on demand).

    ``PYTEST_CURRENT_TEST`` (pytest sets it for each test) is no reason to start another.
    """
    variables = tuple(sorted((k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST"))
    key = (sys.executable, tuple(sys.path), tuple(preload), variables)  # (its sys.path: this worker's, then env's)
    interpreter = _forking_interpreters.pop(key, None)
    if interpreter is not None and not interpreter.started.alive():
        interpreter.close()
        interpreter = None
    if interpreter is None:
        interpreter = _ForkingInterpreter(preload, env)
    _forking_interpreters[key] = interpreter
    while len(_forking_interpreters) > _KEPT:
        _forking_interpreters.pop(next(iter(_forking_interpreters))).close()
    return interpreter


def _new_file(folder: Path, suffix: str) -> Path:
    """A new empty file in ``folder`` (its descriptor closed: the child opens it by name, each call)."""
    descriptor, name = tempfile.mkstemp(prefix="forked-", suffix=suffix, dir=folder)
    os.close(descriptor)
    return Path(name)


def run_with_stderr_on_a_terminal(*args: str | Path, timeout: float = 300) -> tuple[int, str, str]:
    """``python -m trt_inline ARGS`` as a process whose stderr is a pseudo-terminal (stdout piped), as a person
    watching progress runs it: (exit status, stdout, what the terminal showed)."""
    import pty
    import select

    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "trt_inline", *map(str, args)], stdout=subprocess.PIPE, stderr=terminal, cwd=REPO
    )
    os.close(terminal)
    seen = b""
    while True:
        ready, _, _ = select.select([controller], [], [], timeout)
        if not ready:
            break
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # (the terminal's other side closed)
            break
        if not chunk:
            break
        seen += chunk
    out = process.communicate(timeout=timeout)[0].decode()
    os.close(controller)
    return process.returncode, out, seen.decode(errors="replace")


def run_forked(
    code: str,
    arguments: Sequence[str],
    folder: Path,
    *,
    env: dict[str, str],
    preload: Sequence[str] = (),
    path: Sequence[str | Path] = (),
    merged: bool = False,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``python -c code arguments`` with ``env`` (and ``path`` first on ``sys.path``) as a process of its own: a
    child forked from a clean interpreter of this test worker that has imported only torch and ``preload``
    (nothing the code does not import first anyway) beside its loop (``forking.serve``, the package's
    ``fork_per_job``), which never runs anything itself. What a new interpreter gives the code after those
    imports, without starting one and importing torch per run; nothing of the caller's process is in it. Its
    stdout and stderr go to files in ``folder`` (one file with ``merged``: then ``stdout`` holds both). A run
    past ``timeout`` seconds ends with ``returncode`` None (and nothing of it left running).
    """
    folder.mkdir(parents=True, exist_ok=True)
    out = _new_file(folder, ".out")
    err = None if merged else _new_file(folder, ".err")
    request = _new_file(folder, ".json")  # (what forking.run reads: the message itself stays short)
    job = {"code": code, "argv": list(arguments), "path": [str(entry) for entry in path], "cwd": os.getcwd()}
    request.write_text(json.dumps({**job, "stdout": str(out), "stderr": None if err is None else str(err)}))
    status, said = _forking_interpreter(preload, env).run(request, timeout)
    stdout = out.read_text(errors="replace")
    stderr = ("" if err is None else err.read_text(errors="replace")) + said
    request.unlink()
    out.unlink()
    if err is not None:
        err.unlink()
    return subprocess.CompletedProcess(["python", "-c", code, *arguments], status, stdout, stderr)


# Runs `code` once per argument list, each time in a fork of one process that has imported the modules `code`
# imports first anyway: what a new `python -c code args` gives, without those imports per case. (For modules on a
# path of the test's own, a package built in tmp_path: the worker's interpreter cannot import them beforehand.)
_FORKS = """
import importlib, json, os, sys
import torch
from support.forking import exit_as_python_c

code, argument_lists = sys.argv[1], json.loads(sys.argv[2])
for name in sys.argv[3:]:
    importlib.import_module(name)
results = []
for arguments in argument_lists:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(write, 1)
        os.dup2(write, 2)
        exit_as_python_c(code, arguments, "<case>")
    os.close(write)
    with os.fdopen(read) as pipe:
        output = pipe.read()
    results.append([os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), output])
print(json.dumps(results))
"""


def run_forked_each(
    code: str,
    argument_lists: Sequence[Sequence[str]],
    folder: Path,
    *,
    env: dict[str, str],
    imports: Sequence[str],
    preload: Sequence[str] = (),
    path: Sequence[str | Path] = (),
) -> list[tuple[int, str]]:
    """:func:`run_forked` of ``code`` for each of ``argument_lists``, stdout and stderr together: ``[(exit status,
    output)]``. The child :func:`run_forked` forks imports ``imports`` (modules on ``path``) once, then forks a child
    of its own for each argument list.
    """
    arguments = [code, json.dumps([list(a) for a in argument_lists]), *imports]
    proc = run_forked(_FORKS, arguments, folder, env=env, preload=preload, path=path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [(status, output) for status, output in json.loads(proc.stdout.strip().splitlines()[-1])]


def load_runs_in_fresh_process(
    tmp_path: Path,
    paths: Sequence[Path],
    input_sets: Sequence[Sequence[torch.Tensor]] | dict[Path, Sequence[Sequence[torch.Tensor]]],
    imports: Sequence[str] = ("trt_inline",),
) -> dict[str, list[dict[str, Any]]]:
    """Load each file once in a fresh process that imported only torch and ``imports``; run it on every input set.

    The process is a child forked from a clean interpreter of this test worker that has imported torch and
    ``imports`` and nothing else (it never loads a file itself; :func:`run_forked`): what a new interpreter
    gives after those imports, without starting one and importing torch per call.
    ``input_sets``: the same for every file, or ``{path: input sets}``. Returns
    ``{path: [{"outputs", "call_modules", "kinds"} for each of its input sets]}``.
    """
    inputs_file = tmp_path / "inputs.pt"
    results_file = tmp_path / "results.pt"
    by_path = input_sets if isinstance(input_sets, dict) else {path: input_sets for path in paths}
    torch.save({str(path): [list(inputs) for inputs in by_path[path]] for path in paths}, inputs_file)
    results_file.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=python_path())
    argv = [str(inputs_file), str(results_file), ",".join(imports), *map(str, paths)]
    proc = run_forked(_LOADER, argv, tmp_path, env=env, preload=imports, merged=True, timeout=300)
    assert proc.returncode == 0, f"loader exit status {proc.returncode}: {(proc.stdout + proc.stderr)[-4000:]}"
    results: dict[str, list[dict[str, Any]]] = torch.load(results_file, weights_only=True)
    return results


def load_in_fresh_process(
    tmp_path: Path, paths: Sequence[Path], inputs: Sequence[torch.Tensor], imports: Sequence[str] = ("trt_inline",)
) -> dict[str, Any]:
    """:func:`load_runs_in_fresh_process` with one input set: ``{path: {"outputs", "call_modules", "kinds"}}``."""
    runs = load_runs_in_fresh_process(tmp_path, paths, [inputs], imports)
    return {path: found[0] for path, found in runs.items()}
