from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from support.processes import (
    _forking_interpreters,
)
from support.programs import (
    SavedSeed,
)

import trt_inline
from trt_inline.isolation import reusing_interpreter

# Hypothesis profiles for the random-graph suite (tests/inlining/test_fuzz.py): `ci` is
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
        help="run the torchrun rank-set tests (tests/distributed/test_tensor_parallel.py, about a minute; .ci/run "
        "does)",
    )
    parser.addoption(
        "--release-pipeline",
        action="store_true",
        help="run the tests on the release's own pipeline (tests/reference/test_release_pipeline.py, 2-4 minutes; "
        ".ci/run and "
        ".ci/matrix do)",
    )
    parser.addoption(
        "--property",
        action="store_true",
        help="run the random-graph property suites (tests/inlining/test_fuzz.py, tests/inlining/test_fuzz_dynamic.py: "
        "two to three "
        "minutes; .ci/run and .ci/matrix do)",
    )
    parser.addoption(
        "--hub",
        action="store_true",
        help="run the hub models end to end (tests/project/test_hub_models.py: transformers installed into a cached "
        "folder, "
        "BERT and GPT-2 from configs through the commands; two to three minutes; .ci/run does)",
    )
    parser.addoption(
        "--heavy",
        action="store_true",
        help="run the heaviest end-to-end tests (8 s and more each on 2 cores: fresh interpreters, real "
        "architectures; about two minutes; .ci/run and .ci/matrix do)",
    )
    parser.addoption(
        "--docs",
        action="store_true",
        help="run the runnable code blocks of README.md and docs/ (tests/project/test_docs.py, 1-2 minutes; .ci/run "
        "does)",
    )


# Test files by what they cost (seconds on one worker, measured), the longest first: pytest-xdist hands
# whole files to the workers in collection order (see pytest_configure), and starting with the longest keeps
# either worker from being left with one long file at the end. (test_packages.py and test_plugin_packages.py
# cost minutes with --packages, nothing without.) The files not named here follow, in name order.
_LONGEST_FIRST = (
    "test_plugin.py", "test_fuzz.py", "test_packages.py", "test_fuzz_dynamic.py", "test_plugin_packages.py",
    "test_hostile.py", "test_plugin_doors.py", "test_verdicts.py", "test_reading.py", "test_sandbox.py",
    "test_verify.py", "test_cuda_machine.py", "test_localize.py", "test_determinism.py", "test_structure.py",
    "test_declared_and_garbage.py",
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


# The suite's models are built for trt-inline's own partitioner (small blocks, min_block_size=1): where a
# Torch-TensorRT release is installed in the test environment, reference.compile(pipeline="auto") would take the
# release's pipeline instead. The tests of the release's pipeline ask for it themselves
# (tests/reference/test_release_pipeline.py); every process a test starts inherits this.
os.environ["TRT_INLINE_PIPELINE"] = "own"


# How the tests start processes of their own:
# - new_interpreter: ``python ARGS`` started anew, for what happens while an interpreter starts (``import torch``
#   and its entry points, the hash seed, what start-up prints), for the ``trt-inline`` command and the scripts as
#   users run them, and for jobs (torchrun) that are processes of their own by nature;
# - run_forked (and run_forked_each, load_runs_in_fresh_process): code that needs only a process of its own,
#   forked from a clean interpreter of this test worker that has imported torch and nothing else it would not. That
#   interpreter is the package's kind (``isolation.interpreter.start_interpreter``, the loop ``fork_per_job``: a job
#   over a socket, a child forked, its pid and its end reported) serving ``tests/support/forking.py``, which says what a
#   child does: the request's output files, folder, ``path`` and arguments, its code run as ``__main__``;
# - the package's own ``reusing_interpreter`` (the fixture below) forks the verify/inspect/diff children only: its
#   interpreter serves ``trt_inline.isolation.zygote``, whose children run the sandboxed child's entry point and
#   nothing else (what a child runs is fixed when its interpreter starts, never by a job), so no test code goes
#   through it.


@pytest.fixture(scope="session", autouse=True)
def _processes_forked_from_one_interpreter() -> Iterator[None]:
    """Stops the worker's forking interpreters (:func:`run_forked`) when the session ends."""
    yield
    while _forking_interpreters:
        _forking_interpreters.popitem()[1].close()


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


@pytest.fixture(scope="session")
def saved_seed(tmp_path_factory: pytest.TempPathFactory) -> SavedSeed:
    from support.models import RELU, ConvBnRelu

    root = tmp_path_factory.mktemp("saved_seed")
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    compiled = trt_inline.reference.compile(ConvBnRelu().eval(), (x,), torch_executed_ops=[RELU])
    good, bare = root / "good.pt2", root / "bare.pt2"
    trt_inline.save(compiled, good, arg_inputs=(x,))
    trt_inline.save(compiled, bare, arg_inputs=(x,), embed_reference=False)
    return SavedSeed(root, x, compiled, good, bare)
