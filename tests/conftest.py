from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

import trt_inline
from trt_inline.isolation import reusing_interpreter
from trt_inline.passes import produced_value
from trt_inline.scalars import is_scalar
from trt_inline_interpreter import start_interpreter

# Hypothesis profiles for the random-graph suite (tests/test_fuzz.py): `ci` is
# derandomized so that CI is reproducible (TRT_INLINE_FUZZ_EXAMPLES sets how many:
# the version matrix runs 50 per pair); `--slow` searches far more graphs.
settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("TRT_INLINE_FUZZ_EXAMPLES", "150")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "slow",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="run the random-graph suite with 2000 random examples")
    parser.addoption(
        "--memory",
        action="store_true",
        help="run the tests at scale: the 1 GiB memory budget, child reports at the cap (.ci/run does)",
    )
    parser.addoption(
        "--packages",
        action="store_true",
        help="run the tests that compile AOTInductor packages (C++, about two minutes; .ci/run and .ci/matrix do)",
    )
    parser.addoption(
        "--tensor-parallel",
        action="store_true",
        help="run the torchrun rank-set tests (tests/test_tensor_parallel.py, about a minute; .ci/run does)",
    )
    parser.addoption(
        "--release-pipeline",
        action="store_true",
        help="run the tests on the release's own pipeline (tests/test_release_pipeline.py, 2-4 minutes; .ci/run and "
        ".ci/matrix do)",
    )
    parser.addoption(
        "--property",
        action="store_true",
        help="run the random-graph property suites (tests/test_fuzz.py, tests/test_fuzz_dynamic.py: two to three "
        "minutes; .ci/run and .ci/matrix do)",
    )
    parser.addoption(
        "--hub",
        action="store_true",
        help="run the hub models end to end (tests/test_hub_models.py: transformers installed into a cached folder, "
        "BERT and GPT-2 from configs through the commands; two to three minutes; .ci/run does)",
    )
    parser.addoption(
        "--heavy",
        action="store_true",
        help="run the heaviest end-to-end tests (9 s and more each on 2 cores: fresh interpreters, real "
        "architectures; about two minutes; .ci/run and .ci/matrix do)",
    )
    parser.addoption(
        "--docs",
        action="store_true",
        help="run the runnable code blocks of README.md and docs/ (tests/test_docs.py, 1-2 minutes; .ci/run does)",
    )


# Test files by what they cost (seconds on one worker, measured), the longest first: pytest-xdist hands
# whole files to the workers in collection order (see pytest_configure), and starting with the longest keeps
# either worker from being left with one long file at the end. (test_packages.py and test_plugin_packages.py
# cost minutes with --packages, nothing without.) The files not named here follow, in name order.
_LONGEST_FIRST = (
    "test_plugin.py", "test_fuzz.py", "test_packages.py", "test_fuzz_dynamic.py", "test_plugin_packages.py",
    "test_hostile.py", "test_doors.py", "test_verdicts.py", "test_reading.py", "test_sandbox.py", "test_verify.py",
    "test_cuda_machine.py", "test_divergence.py", "test_determinism.py", "test_structure.py", "test_quiet_lies.py",
    "test_scalars.py", "test_end_to_end.py", "test_engine_names.py", "test_rank_check.py", "test_untrusted.py",
)  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _rank(item.path.name))
    for option, marker, reason in (
        ("--memory", "memory", "tests at scale (1 GiB model, reports at the cap) run with --memory (.ci/run does)"),
        ("--tensor-parallel", "tensor_parallel", "the torchrun rank-set tests run with --tensor-parallel (.ci/run "
         "passes it)"),
        ("--packages", "packages", "the tests that compile AOTInductor packages run with --packages (.ci/run and "
         ".ci/matrix pass it)"),
        ("--docs", "docs", "the runnable code blocks of README.md and docs/ run with --docs (.ci/run passes it)"),
        ("--hub", "hub", "the hub models (transformers) run with --hub (.ci/run passes it)"),
        ("--property", "property", "the random-graph property suites run with --property (.ci/run and .ci/matrix "
         "pass it)"),
        ("--release-pipeline", "release_pipeline", "the tests on the release's own pipeline run with "
         "--release-pipeline (.ci/run and .ci/matrix pass it)"),
        ("--heavy", "heavy", "the heaviest end-to-end tests run with --heavy (.ci/run and .ci/matrix pass it)"),
    ):  # fmt: skip
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
    cuda_items = [item for item in items if "cuda" in item.keywords]
    if cuda_items and not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device, and this machine has none (.ci/cuda runs these on one)")
        for item in cuda_items:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """One block at the end: how many tests were skipped for each reason (each names where those tests run)."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if not reasons:
        return
    terminalreporter.write_sep("-", f"{sum(reasons.values())} skipped, by reason")
    for reason, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"{count:5d}  {reason}")


def _rank(name: str) -> int:
    return _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST)


def pytest_configure(config: pytest.Config) -> None:
    profile = settings.get_profile("slow" if config.getoption("--slow") else "ci")
    settings.register_profile("trt_inline", profile)
    # Dynamic-shape graphs cost a few times more each: a sixth as many as TRT_INLINE_FUZZ_EXAMPLES (50 by default;
    # the first derandomized examples are the simplest, and fewer would rarely cross an engine boundary).
    scalars = 2000 if config.getoption("--slow") else int(os.environ.get("TRT_INLINE_FUZZ_EXAMPLES", "300"))
    settings.register_profile("trt_inline_scalars", profile, max_examples=max(10, scalars // 6))
    # pytest-xdist 3.x hands out files by their number of tests (most first) unless told not to: that put the
    # longest files last. Keep the collection order of pytest_collection_modifyitems (the longest first).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


REPO = Path(__file__).resolve().parent.parent
# The suite's models are built for trt-inline's own partitioner (small blocks, min_block_size=1): where a
# Torch-TensorRT release is installed in the test environment, reference.compile(pipeline="auto") would take the
# release's pipeline instead. The tests of the release's pipeline ask for it themselves
# (tests/test_release_pipeline.py); every process a test starts inherits this.
os.environ["TRT_INLINE_PIPELINE"] = "own"


def python_path(*first: str | Path) -> str:
    """``PYTHONPATH`` for a test's own interpreter: ``first``, the repository, then what this process was given.

    Kept, not replaced: trt-inline and its dependencies may live on ``PYTHONPATH`` rather than in a venv
    (``pip install --target DIR``), and a subprocess without them cannot import pyseccomp.
    """
    given = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return os.pathsep.join(dict.fromkeys([*map(str, first), str(REPO), *given]))


# How the tests start processes of their own:
# - new_interpreter: ``python ARGS`` started anew, for what happens while an interpreter starts (``import torch``
#   and its entry points, the hash seed, what start-up prints), for the ``trt-inline`` command and the scripts as
#   users run them, and for jobs (torchrun) that are processes of their own by nature;
# - run_forked (and run_forked_each, load_runs_in_fresh_process): code that needs only a process of its own,
#   forked from a clean interpreter of this test worker that has imported torch and nothing else it would not. That
#   interpreter is the package's kind (``trt_inline_interpreter.start_interpreter``, the loop ``fork_per_job``: a job
#   over a socket, a child forked, its pid and its end reported) serving ``tests/forking.py``, which says what a
#   child does: the request's output files, folder, ``path`` and arguments, its code run as ``__main__``;
# - the package's own ``reusing_interpreter`` (the fixture below) forks the verify/inspect/diff children only: its
#   interpreter serves ``trt_inline.isolation.zygote``, whose children run the sandboxed child's entry point and
#   nothing else (what a child runs is fixed when its interpreter starts, never by a job), so no test code goes
#   through it.


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
    """The package's kind of interpreter that forks children (``trt_inline_interpreter.start_interpreter``, its loop
    ``fork_per_job``) serving the tests' module ``forking``: torch and ``preload`` imported, ``env`` its environment.
    A request is the name of a file holding it (what ``forking.run`` reads), so that the message stays short."""

    def __init__(self, preload: Sequence[str], env: dict[str, str]) -> None:
        self.said = tempfile.TemporaryFile()  # what it says itself (an import that fails, say)
        self.started = start_interpreter("forking", *preload, environment=env, output=self.said)

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


@pytest.fixture(scope="session", autouse=True)
def _processes_forked_from_one_interpreter() -> Iterator[None]:
    """Stops the worker's forking interpreters (:func:`run_forked`) when the session ends."""
    yield
    while _forking_interpreters:
        _forking_interpreters.popitem()[1].close()


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
from forking import exit_as_python_c

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


def as_list(outputs: Any) -> list[torch.Tensor]:
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def max_abs_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    assert len(a) == len(b), f"{len(a)} outputs vs {len(b)}"
    diffs = []
    for x, y in zip(a, b, strict=False):
        assert x.shape == y.shape and x.dtype == y.dtype, f"{x.shape}/{x.dtype} vs {y.shape}/{y.dtype}"
        diffs.append((x.double() - y.double()).abs().max().item() if x.numel() else 0.0)
    return max(diffs)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session", autouse=True)
def _children_forked_from_one_interpreter() -> Iterator[None]:
    """``verify``/``inspect``/``diff`` children forked from one clean interpreter per test worker.

    Each child is as isolated as a fresh interpreter (``reusing_interpreter``:
    its own session, sandbox, limits and folder); this saves starting one and
    importing torch per file. A change of a start-up variable starts a new one.
    Tests of the path the ``trt-inline`` command takes use ``fresh_children``,
    and so do the tests that run the command as a process of its own.
    """
    with reusing_interpreter():
        yield


@pytest.fixture
def fresh_children() -> Iterator[None]:
    """In this test, ``verify``/``inspect`` children start as fresh interpreters, as the ``trt-inline`` command does."""
    from trt_inline import isolation

    token = isolation.zygote._reusable.set(None)
    try:
        yield
    finally:
        isolation.zygote._reusable.reset(token)


@dataclass
class SavedSeed:
    """The seed scenario compiled once and saved with (``good``) and without (``bare``) reference I/O."""

    root: Path
    x: torch.Tensor
    compiled: torch.fx.GraphModule
    good: Path
    bare: Path


@pytest.fixture(scope="session")
def saved_seed(tmp_path_factory: pytest.TempPathFactory) -> SavedSeed:
    from models import RELU, ConvBnRelu

    import trt_inline

    root = tmp_path_factory.mktemp("saved_seed")
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    compiled = trt_inline.reference.compile(ConvBnRelu().eval(), (x,), torch_executed_ops=[RELU])
    good, bare = root / "good.pt2", root / "bare.pt2"
    trt_inline.save(compiled, good, arg_inputs=(x,))
    trt_inline.save(compiled, bare, arg_inputs=(x,), embed_reference=False)
    return SavedSeed(root, x, compiled, good, bare)


def count_scalar_crossings(compiled: torch.fx.GraphModule) -> int:
    """How many scalars an engine of ``compiled`` takes or returns."""
    return sum(
        1
        for node in compiled.graph.nodes
        if trt_inline.engines.is_accelerated_call(compiled, node)
        for value in [*node.meta["val"], *(produced_value(compiled, arg) for arg in node.args)]
        if is_scalar(value)
    )


def saved_and_loaded(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` through ``torch.export.save`` and ``load`` in memory: linted, and no submodule call left."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    loaded.graph_module.graph.lint()
    assert [n.name for n in loaded.graph.nodes if n.op == "call_module"] == []
    return loaded


def assert_loads_bitwise(
    compiled: torch.fx.GraphModule,
    program: torch.export.ExportedProgram,
    input_sets: Sequence[Sequence[torch.Tensor]],
    *,
    equal_nan: bool = False,
) -> torch.export.ExportedProgram:
    """``program`` through :func:`saved_and_loaded`: on each of ``input_sets`` its outputs are ``compiled``'s,
    bitwise (NaN equal to NaN with ``equal_nan``). Returns the loaded program."""
    loaded = saved_and_loaded(program)
    run = loaded.module()
    for inputs in input_sets:
        with torch.no_grad():
            expected, actual = compiled(*inputs), run(*inputs)
        assert len(actual) == len(expected)
        for got, want in zip(actual, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=equal_nan)
    return loaded


def engine_calls(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The calls of reference engines in ``program``'s graph, in graph order."""
    return [node for node in program.graph.nodes if node.target is torch.ops.trt_inline.execute_engine.default]


def engine_label(program: torch.export.ExportedProgram, index: int = 0) -> str:
    """The submodule engine ``index``'s call names by its engine attribute (``_run_on_acc_5`` of
    ``_run_on_acc_5_engine``), as reports name the engine."""
    lifted = {spec.arg.name: str(spec.target) for spec in program.graph_signature.input_specs if spec.target}
    label = trt_inline.engines.engine_submodule_name(engine_calls(program)[index], lifted)
    assert label is not None and label.startswith("_run_on_acc_"), label
    return label
