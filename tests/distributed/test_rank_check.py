"""The rank check a rank file carries in its program (``trt_inline::check_ranks``), without torchrun.

The pass that inserts it, what it does with and without a process group, the
static checks verify makes instead of running it, and ``trt_inline.load``'s
override. The check against a live rank set on swapped ranks runs under torchrun
in tests/distributed/test_tensor_parallel.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support.processes import new_interpreter, python_path

import trt_inline
from trt_inline import compat, embedding, operators, package, reference
from trt_inline.distributed import rank_check
from trt_inline.distributed.manifest import (
    MANIFEST_FILE,
    RANK_CHECK_OP,
    Collective,
    Group,
    RankManifest,
    program_mismatch,
    rank_check_nodes,
    rank_check_problem,
)
from trt_inline.errors import RankSetError
from trt_inline.export import to_exported_program, write_program
from trt_inline.verify.structure import structural_problems

MANIFEST = RankManifest(rank=0, world_size=2, backend="gloo", save_id="5f0c1a2b3c4d5e6f")
CARRIED = dataclasses.replace(MANIFEST, save_id="").encode()


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        with torch.no_grad():  # the same weights in every instance
            generator = torch.Generator().manual_seed(1)
            self.linear.weight.copy_(torch.randn(4, 4, generator=generator))
            self.linear.bias.copy_(torch.randn(4, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + 1


def _inputs() -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(0))


def _engine_program() -> torch.export.ExportedProgram:
    """A flat program with a reference engine (a file that needs trt-inline to load)."""
    x = _inputs()
    with torch.no_grad():
        return to_exported_program(reference.compile(Small().eval(), (x,)), arg_inputs=(x,))


def _first_call(program: torch.export.ExportedProgram) -> torch.fx.Node:
    return next(node for node in program.graph.nodes if node.op != "placeholder")


def _save_rank_file(program: torch.export.ExportedProgram, path: Path, manifest: RankManifest = MANIFEST) -> Path:
    """``program`` written as a rank file (its manifest, reference I/O of the module), as a rank-set save would."""
    x = _inputs()
    extra = embedding.reference_extra_files(program.module(), [x], None, path, 1 << 20)
    write_program(program, path, {**extra, MANIFEST_FILE: manifest.encode()})
    return path


@contextlib.contextmanager
def live_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Within the block, an initialized process group as the operator's kernel sees it (only around runs: torch's
    own tracing would ask it for a rank); the manifests the kernel is asked to check."""
    checked: list[str] = []
    with monkeypatch.context() as patched:
        patched.setattr(dist, "is_initialized", lambda: True)
        patched.setattr(rank_check, "check_live", checked.append)
        yield checked


def test_the_pass_inserts_one_check_first_with_the_manifest() -> None:
    program = _engine_program()
    before = [node.name for node in program.graph.nodes]
    check_node = rank_check.insert_rank_check(program, MANIFEST)
    assert rank_check_nodes(program.graph_module) == [check_node]
    assert _first_call(program) is check_node
    # the manifest without the save's id: the same model saved twice gives the same graph
    assert check_node.args == (CARRIED,) and not check_node.users
    assert [node.name for node in program.graph.nodes if node is not check_node] == before
    # A program that already carries one (a loaded rank file saved again) gets the new one instead.
    other = dataclasses.replace(MANIFEST, rank=1)
    replaced = rank_check.insert_rank_check(program, other)
    assert rank_check_nodes(program.graph_module) == [replaced]
    assert replaced.args == (dataclasses.replace(other, save_id="").encode(),)


def test_the_check_survives_save_load_and_module_and_runs_once_per_call_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = _engine_program()
    x = _inputs()
    with torch.no_grad():
        expected = program.module()(x)
    rank_check.insert_rank_check(program, MANIFEST)
    path = _save_rank_file(program, tmp_path / "rank0.pt2")
    loaded = torch.export.load(path)
    assert [n.name for n in rank_check_nodes(loaded.graph_module)] == [_first_call(loaded).name]
    module = loaded.module()  # (its dead-code elimination must keep a call that returns nothing)
    first_function = next(n for n in module.graph.nodes if n.op == "call_function")
    assert rank_check_nodes(module) == [first_function]  # (torch's input guards, a call_module, may come first)
    with torch.no_grad(), live_group(monkeypatch) as checked:
        outputs = [module(x), module(x)]
    assert checked == [CARRIED] * 2  # once per run
    assert all(torch.equal(out, expected) for out in outputs)


def test_which_rank_files_carry_the_check() -> None:
    x = _inputs()
    with torch.no_grad():
        compiled = reference.compile(Small().eval(), (x,))
        plain = torch.export.export(Small().eval(), (x,))
    assert rank_check.needs_trt_inline(compiled)  # the plugin's save looks at the compiled module
    assert rank_check.needs_trt_inline(to_exported_program(compiled, arg_inputs=(x,)).graph_module)
    assert not rank_check.needs_trt_inline(plain.graph_module)  # loads without trt-inline, as TensorRT engines do
    assert (rank_check.wanted(plain.graph_module, False), rank_check.wanted(plain.graph_module, True)) == (False, True)


def test_a_file_outside_a_rank_set_is_untouched(tmp_path: Path) -> None:
    x = _inputs()
    with torch.no_grad():
        compiled = reference.compile(Small().eval(), (x,))
    for embed in (False, True):
        path = tmp_path / f"single_{embed}.pt2"
        trt_inline.save(compiled, path, arg_inputs=(x,), embed_rank_check=embed)
        assert rank_check.manifest_text_of(path) is None
        assert rank_check_nodes(torch.export.load(path).graph_module) == []


def test_without_a_process_group_the_check_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """What verify's sandboxed child sees: no process group, so the operator returns without reading anything."""
    assert not dist.is_initialized()
    called: list[str] = []
    monkeypatch.setattr(rank_check, "check_live", called.append)
    op = rank_check.rank_check_op()
    assert op(dataclasses.replace(MANIFEST, rank=1).encode()) is None
    assert op("not a manifest") is None
    assert called == []


def test_the_override_lets_the_check_through(monkeypatch: pytest.MonkeyPatch) -> None:
    op = rank_check.rank_check_op()
    with live_group(monkeypatch) as checked:
        monkeypatch.setenv("TRT_INLINE_CHECK_RANKS", "0")
        op(MANIFEST.encode())
        assert checked == []
        monkeypatch.setenv("TRT_INLINE_CHECK_RANKS", "1")
        op(MANIFEST.encode())
    assert checked == [MANIFEST.encode()]


def test_the_kernel_checks_only_with_a_process_group_and_the_switch_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """``operators.rank_check_kernel``, the operator's kernel, called directly."""
    operators.rank_check_kernel(MANIFEST.encode())  # no process group: nothing to check
    with live_group(monkeypatch) as checked:
        monkeypatch.setenv("TRT_INLINE_CHECK_RANKS", "0")
        operators.rank_check_kernel(MANIFEST.encode())
        assert checked == []
        monkeypatch.setenv("TRT_INLINE_CHECK_RANKS", "1")
        operators.rank_check_kernel(MANIFEST.encode())
    assert checked == [MANIFEST.encode()]


def test_the_operator_is_defined_once_per_process() -> None:
    assert RANK_CHECK_OP in operators._definitions  # by the entry point at import torch
    library = operators._definitions[RANK_CHECK_OP]
    assert operators.define(RANK_CHECK_OP) is False  # (a second call defines nothing, as import trt_inline did)
    assert operators._definitions[RANK_CHECK_OP] is library
    assert RANK_CHECK_OP == "trt_inline::check_ranks"
    assert rank_check.rank_check_op() in torch.fx.node._side_effectful_functions  # kept by dead-code elimination


_FRESH = """
    import os, sys, torch
    import torch.distributed as dist

    program = torch.export.load(sys.argv[1])      # the operator is defined by the entry point at import torch
    check = "trt_inline.distributed.rank_check"   # (the light modules of the entry point are imported)
    assert check not in sys.modules
    module = program.module()
    x = torch.randn(2, 4)
    module(x)                                     # no process group: nothing to check
    print("ran without a process group", check in sys.modules)
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    try:
        module(x)
        print("ran in the wrong process group")
    except Exception as exc:
        print(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
    os.environ["TRT_INLINE_CHECK_RANKS"] = "0"
    module(x)
    print("ran with TRT_INLINE_CHECK_RANKS=0")
    dist.destroy_process_group()
"""


def _fresh_run(script: str, path: Path, tmp_path: Path, **env: str) -> list[str]:
    """``script`` run on ``path`` in a fresh interpreter (``env`` added to this one's): the lines it printed."""
    environment = dict(os.environ, PYTHONPATH=python_path(), **env)
    done = new_interpreter("-c", textwrap.dedent(script), path, tmp_path / "store", env=environment, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_torch_export_load_in_a_fresh_process_finds_the_check_and_it_refuses(tmp_path: Path) -> None:
    """A file that loads without trt-inline (no engine, as TensorRT engines), carrying the check by request, in a
    process that imports only torch (TRT_INLINE_DISABLE=1: the operator is a definition, not the plugin's patch)."""
    x = _inputs()
    program = torch.export.export(Small().eval(), (x,))
    rank_check.insert_rank_check(program, MANIFEST)
    path = _save_rank_file(program, tmp_path / "plain_rank0_of_2.pt2")
    assert _fresh_run(_FRESH, path, tmp_path, TRT_INLINE_DISABLE="1") == [
        "ran without a process group False",
        "trt_inline.errors.RankSetError: the rank file running here is rank 0 of 2, but this "
        "process is rank 0 of 1: load the file saved for this rank (its own check, trt_inline::check_ranks, refused "
        "to run it; TRT_INLINE_CHECK_RANKS=0 runs it anyway)",
        "ran with TRT_INLINE_CHECK_RANKS=0",
    ]


def test_trt_inline_load_refuses_and_check_ranks_false_takes_the_check_out(tmp_path: Path) -> None:
    program = _engine_program()
    rank_check.insert_rank_check(program, MANIFEST)
    path = _save_rank_file(program, tmp_path / "rank0.pt2")
    with pytest.raises(RankSetError, match=r"is rank 0 of 2 of a tensor-parallel rank set.*check_ranks=False"):
        trt_inline.load(path)
    loaded = trt_inline.load(path, check_ranks=False)
    assert rank_check_nodes(loaded.graph_module) == []
    with torch.no_grad():
        assert torch.equal(loaded.module()(_inputs()), _engine_program().module()(_inputs()))


# ---------------------------------------------------------------------------
# What verify checks instead of running it
# ---------------------------------------------------------------------------


def _checked_program(manifest: RankManifest = MANIFEST) -> tuple[torch.export.ExportedProgram, torch.fx.Node]:
    program = _engine_program()
    return program, rank_check.insert_rank_check(program, manifest)


def _moved_after_the_engine(program: torch.export.ExportedProgram, check_node: torch.fx.Node) -> None:
    engine = next(n for n in program.graph.nodes if n.target is torch.ops.trt_inline.execute_engine.default)
    engine.append(check_node)
    program.graph_module.recompile()


def test_the_static_check_accepts_the_check_a_save_inserts() -> None:
    program, _ = _checked_program()
    assert rank_check_problem(program.graph_module) is None
    assert rank_check_problem(program.graph_module, MANIFEST) is None
    assert program_mismatch(MANIFEST, program.graph_module, "f.pt2") is None
    assert rank_check_problem(_engine_program().graph_module, MANIFEST) is None  # no check: nothing to say


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("other rank", "node check_ranks_default (trt_inline::check_ranks) carries a manifest other than the file's: "
                       "rank 1 of 2 (save 5f0c1a2b3c4d) there, rank 0 of 2 (save 5f0c1a2b3c4d) in "
                       "trt_inline_ranks.json"),
        ("other collectives", "node check_ranks_default (trt_inline::check_ranks) carries a manifest other than the "
                              "file's, of other groups or collectives: rank 0 of 2 (save 5f0c1a2b3c4d) there"),
        ("moved", "node check_ranks_default (trt_inline::check_ranks) is not the first node after the program's "
                  "inputs (execute_engine runs before it)"),
        ("twice", "nodes check_ranks_default, check_ranks_default_1 each call trt_inline::check_ranks: a rank file "
                  "calls it once, first"),
        ("garbage", "node check_ranks_default (trt_inline::check_ranks): its rank manifest (trt_inline_ranks.json) is "
                    "unusable"),
    ],
)  # fmt: skip
def test_the_static_check_names_the_node_that_differs(change: str, expected: str) -> None:
    program, check_node = _checked_program()
    if change == "other rank":
        check_node.update_arg(0, dataclasses.replace(MANIFEST, rank=1).encode())
    elif change == "other collectives":
        shifted = Collective("_c10d_functional::all_reduce.default", "0", "sum", (4, 8), "float32", "all_reduce")
        other = dataclasses.replace(MANIFEST, groups=[Group("0", (0, 1))], collectives=[shifted])
        check_node.update_arg(0, other.encode())
    elif change == "moved":
        _moved_after_the_engine(program, check_node)
    elif change == "twice":
        with program.graph.inserting_after(check_node):
            program.graph.call_function(rank_check.rank_check_op(), (MANIFEST.encode(),))
    else:
        check_node.update_arg(0, "{not json")
    problem = rank_check_problem(program.graph_module, MANIFEST)
    assert problem is not None and problem.startswith(expected), problem
    assert program_mismatch(MANIFEST, program.graph_module, "m_rank0_of_2.pt2") == f"m_rank0_of_2.pt2: {problem}"
    # Without the file's manifest (any program verify opens): all but which manifest it carries.
    structural, _ = structural_problems(program)
    assert [p for p in structural if "trt_inline::check_ranks" in p] == ([] if "other" in change else [problem])


def test_verify_allows_the_operator_and_fails_a_misplaced_check(tmp_path: Path) -> None:
    """In verify's sandboxed child (no process group) the check does nothing: the program computes as saved; where
    it stands is checked statically, a problem naming the node."""
    program, _ = _checked_program()
    good = _save_rank_file(program, tmp_path / "good.pt2")
    moved, check_node = _checked_program()
    _moved_after_the_engine(moved, check_node)
    bad = _save_rank_file(moved, tmp_path / "moved.pt2")
    report: Any = trt_inline.verify(good)
    assert report.ok and report.problems == [], report.problems
    report = trt_inline.verify(bad)
    assert not report.ok
    (problem,) = [p for p in report.problems if "check_ranks" in p]
    # (the engine call's name as the file's torch names it on load: execute_engine, or execute_engine_default)
    assert re.fullmatch(
        r"node check_ranks_default \(trt_inline::check_ranks\) is not the first node after the program's inputs "
        r"\(execute_engine(_default)? runs before it\)",
        problem,
    ), problem


_PACKAGE_RUN = """
    import os, sys, torch
    import torch.distributed as dist

    model = torch._inductor.aoti_load_package(sys.argv[1])
    check = "trt_inline.distributed.rank_check"   # (the light modules of the entry point are imported)
    x = torch.randn(2, 4)
    model(x)
    print("ran without a process group", check in sys.modules)
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    try:
        model(x)
        print("ran in the wrong process group")
    except Exception as exc:  # (from the compiled code: a RuntimeError carrying the check's own error)
        print(next(line for line in str(exc).splitlines() if "RankSetError" in line))
    os.environ["TRT_INLINE_CHECK_RANKS"] = "0"
    model(x)
    print("ran with TRT_INLINE_CHECK_RANKS=0")
    dist.destroy_process_group()
"""


@pytest.mark.packages
@pytest.mark.skipif(compat.aoti_packages() is not None, reason=f"AOTInductor packages: {compat.aoti_packages()}")
def test_an_aot_inductor_package_keeps_the_check_and_runs_it(tmp_path: Path) -> None:
    """The check inserted before AOTInductor compiles the program (``trt_inline.save(...,
    output_format="aot_inductor")`` of a rank set): its compiled code calls the operator first, in a fresh process
    that imports only torch."""
    x = _inputs()
    program = torch.export.export(Small().eval(), (x,))
    rank_check.insert_rank_check(program, MANIFEST)
    path = tmp_path / "plain_rank0_of_2.pt2"
    package.compile_package(program, path, {MANIFEST_FILE: MANIFEST.encode()})
    assert _fresh_run(_PACKAGE_RUN, path, tmp_path) == [
        "ran without a process group False",
        "RankSetError: the rank file running here is rank 0 of 2, but this process is rank 0 of 1: "
        "load the file saved for this rank (its own check, trt_inline::check_ranks, refused to run it; "
        "TRT_INLINE_CHECK_RANKS=0 runs it anyway)",
        "ran with TRT_INLINE_CHECK_RANKS=0",
    ]


def test_a_single_file_verify_holds_the_carried_manifest_to_the_files(tmp_path: Path) -> None:
    """Outside a rank set too: a check carrying another rank's manifest than the file's is a problem."""
    program, check_node = _checked_program()
    check_node.update_arg(0, dataclasses.replace(MANIFEST, rank=1).encode())
    path = _save_rank_file(program, tmp_path / "rank0.pt2")
    report = trt_inline.verify(path)
    assert [p for p in report.problems if "trt_inline::check_ranks" in p] == [
        f"{path}: node check_ranks_default (trt_inline::check_ranks) carries a manifest other than the file's: "
        "rank 1 of 2 (save 5f0c1a2b3c4d) there, rank 0 of 2 (save 5f0c1a2b3c4d) in trt_inline_ranks.json"
    ], report.to_text()
    honest, _ = _checked_program()
    assert not [p for p in trt_inline.verify(_save_rank_file(honest, tmp_path / "ok.pt2")).problems if "check" in p]
