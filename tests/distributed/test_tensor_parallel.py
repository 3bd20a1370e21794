"""Tensor-parallel rank sets under torchrun (gloo on CPU): save, load and verify, 2 and 3 ranks.

Each job is ``python -m torch.distributed.run`` on tests/support/tensor_parallel.py or on ``trt-inline verify``:
fresh processes, as users run them. About a minute in all: these run with ``--tensor-parallel``
(``.ci/run`` passes it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from support.plugin_runs import release_tree
from support.processes import TESTS, new_interpreter, python_path

from trt_inline.archive.reader import read_file
from trt_inline.distributed.manifest import (
    MANIFEST_FILE,
    RANK_CHECK_OP,
    RankManifest,
    decode_manifest,
    rank_check_nodes,
    rank_check_problem,
)

pytestmark = pytest.mark.tensor_parallel

WORKER = TESTS / "support" / "tensor_parallel.py"


def _torchrun(
    ranks: int, *command: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    run = ("-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}")
    return new_interpreter(*run, *command, timeout=timeout, env=environment)


def _step(ranks: int, step: str, folder: Path) -> None:
    done = _torchrun(ranks, str(WORKER), step, str(folder))
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank sets saved by a 2-rank job, and what a fresh 2-rank job found loading them."""
    folder = tmp_path_factory.mktemp("two_ranks")
    _step(2, "save", folder)
    _step(2, "load", folder)
    return folder


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory, two: Path) -> Path:
    """The same from 3-rank jobs, with a subgroup model; the 2-rank files beside them (another world size)."""
    folder = tmp_path_factory.mktemp("three_ranks")
    _step(3, "save", folder)
    for rank in range(2):
        shutil.copy(two / f"mlp_rank{rank}_of_2.pt2", folder)
    _step(3, "load", folder)
    return folder


@pytest.fixture(scope="module")
def swapped(tmp_path_factory: pytest.TempPathFactory, two: Path) -> Path:
    """What a fresh 2-rank job, with the release's ``torch_tensorrt`` shell importable and the plugin on, found
    loading the 2-rank sets on swapped ranks, then on their own."""
    tree = release_tree(tmp_path_factory.mktemp("shell"))
    done = _torchrun(
        2, str(WORKER), "swapped", str(two), env={"PYTHONPATH": python_path(tree), "TRT_INLINE_DISABLE": "0"}
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return two


def _manifest(path: Path) -> RankManifest:
    text = read_file(path).extra_text(MANIFEST_FILE)
    assert text is not None, f"{path} carries no rank manifest"
    return decode_manifest(text, str(path))


def _verify(ranks: int, template: Path, *options: str) -> tuple[int, dict[str, Any], float]:
    start = time.monotonic()
    done = new_interpreter(
        "-m", "trt_inline", "verify", "--ranks", str(ranks), template, "--json", *options, timeout=300
    )
    elapsed = time.monotonic() - start
    assert done.stdout, done.stderr[-4000:]
    return done.returncode, json.loads(done.stdout), elapsed


def test_files_record_the_rank_set(two: Path, three: Path) -> None:
    ids = set()
    for rank in range(2):
        manifest = _manifest(two / f"mlp_rank{rank}_of_2.pt2")
        assert (manifest.rank, manifest.world_size, manifest.backend) == (rank, 2, "gloo")
        assert [(g.name, g.ranks) for g in manifest.groups] == [("0", (0, 1))]
        mlp_ops = [c.op for c in manifest.collectives]
        assert mlp_ops == ["_c10d_functional::all_reduce.default", "_c10d_functional::wait_tensor.default"]
        assert manifest.collectives[0].reduce_op == "sum" and manifest.collectives[0].shape == (4, 8)
        assert "step" not in manifest.collectives[0].where  # a fallback's collective, in the flat graph
        ids.add(manifest.save_id)
    assert len(ids) == 1  # one save of the rank set
    gather_scatter = ["all_gather_into_tensor.default", "reduce_scatter_tensor.default"]
    for model, ops, inside in (("seq_in_engines", gather_scatter, True), ("seq", gather_scatter, False),
                               ("mlp_in_engines", ["all_reduce.default"], True)):  # fmt: skip
        manifest = _manifest(two / f"{model}_rank0_of_2.pt2")
        assert [c.op.split("::")[1] for c in manifest.collectives if c.group is not None] == ops, model
        # Inside an engine (a reference engine's steps, as NCCL layers are) or in a fallback (the flat graph):
        assert all((" step " in c.where) is inside for c in manifest.collectives), model
    plugin = [_manifest(two / f"plugin_rank{rank}_of_2.pt2") for rank in range(2)]
    assert [(m.rank, [c.op for c in m.collectives]) for m in plugin] == [(r, mlp_ops) for r in range(2)]
    assert plugin[0].save_id == plugin[1].save_id != manifest.save_id
    groups = {rank: _manifest(three / f"subgroup_rank{rank}_of_3.pt2").groups for rank in range(3)}
    assert [g.ranks for g in groups[0]] == [(0, 1)] and [g.ranks for g in groups[2]] == [(2,)]


def test_every_rank_loads_its_file_bitwise_in_a_fresh_job(two: Path, three: Path) -> None:
    for folder, world in ((two, 2), (three, 3)):
        for rank in range(world):
            found = json.loads((folder / f"load_rank{rank}.json").read_text())
            models = ["mlp", "mlp_dynamic", "mlp_in_engines", "seq", "seq_in_engines", "plugin"]
            models += ["subgroup"] if world == 3 else []
            assert {model: found[model] for model in models} == dict.fromkeys(models, 0.0), found
            assert found["mlp_dynamic batch 1"] == found["seq batch 1"] == [1, 8]  # the declared range holds
            assert found["verify isolate=False"] is True


def test_another_ranks_or_world_sizes_file_is_refused(two: Path, three: Path) -> None:
    found = json.loads((two / "load_rank0.json").read_text())
    assert found["other rank"].startswith("RankSetError: ")
    assert "is rank 1 of 2" in found["other rank"] and "this process is rank 0 of 2" in found["other rank"]
    assert "check_ranks=False" in found["other rank"]
    found = json.loads((three / "load_rank2.json").read_text())
    assert "is rank 0 of 2" in found["other world"] and "rank 2 of 3" in found["other world"]


def test_a_save_on_one_rank_fails_fast_naming_the_missing_rank(two: Path) -> None:
    message, seconds = json.loads((two / "lonely_rank0.json").read_text())
    assert message.startswith("RankSetError: save on rank 0 of 2: rank(s) 1 did not call it within 3 s"), message
    assert seconds < 15  # bounded by TRT_INLINE_ARRIVAL_TIMEOUT=3, not by gloo's collective timeout


def test_verify_of_a_good_rank_set_passes(two: Path, three: Path) -> None:
    code, report, _ = _verify(2, two / "mlp_rank{rank}_of_{world_size}.pt2", "--per-engine")
    assert [row["status"] for row in report["ranks"]] == ["PASS", "PASS"]
    assert all(row["report"]["boundaries"] for row in report["ranks"])  # engine by engine, collectives relayed
    assert code == 0
    for model in ("seq_in_engines", "seq"):
        code, report, _ = _verify(2, two / f"{model}_rank{{rank}}_of_{{world_size}}.pt2")
        assert (code, [row["status"] for row in report["ranks"]]) == (0, ["PASS", "PASS"]), model
    code, report, _ = _verify(3, three / "subgroup_rank{rank}_of_{world_size}.pt2")
    assert (code, [row["status"] for row in report["ranks"]]) == (0, ["PASS"] * 3)
    sandboxed = report["ranks"][0]["report"]["notes"][-1]
    assert "sandboxed: " in sandboxed and "seccomp" in sandboxed  # each rank's child under the usual sandbox


def test_verify_names_the_rank_and_engine_that_diverged(two: Path) -> None:
    code, report, _ = _verify(2, two / "perturbed_rank{rank}_of_{world_size}.pt2")
    first, second = report["ranks"]
    assert second["status"] == "FAIL" and "engine 0 (_run_on_acc_1): its own error" in second["summary"]
    assert first["status"] == "FAIL"
    assert first["summary"] == (
        "another rank sent different data through a collective: rank 1's engine 0 (_run_on_acc_1) diverged"
    )
    assert code == 1


def test_a_hostile_rank_file_stops_every_rank_before_anything_runs(two: Path, tmp_path: Path) -> None:
    shutil.copy(two / "mlp_rank0_of_2.pt2", tmp_path / "m_rank0_of_2.pt2")
    (tmp_path / "m_rank1_of_2.pt2").write_bytes(os.urandom(4096))
    code, report, seconds = _verify(2, tmp_path / "m_rank{rank}_of_{world_size}.pt2")
    first, second = report["ranks"]
    assert second["status"] == "ERROR" and "not a zip archive" in second["error"]
    assert first["status"] == "ERROR" and "rank 1 refused its file, so no rank ran" in first["error"]
    assert first["report"] is None  # rank 0's child never ran its program
    assert code == 2 and seconds < 60


def test_rank_files_whose_collectives_differ_are_refused(two: Path, tmp_path: Path) -> None:
    shutil.copy(two / "mlp_rank0_of_2.pt2", tmp_path / "m_rank0_of_2.pt2")
    shutil.copy(two / "seq_in_engines_rank1_of_2.pt2", tmp_path / "m_rank1_of_2.pt2")
    code, report, _ = _verify(2, tmp_path / "m_rank{rank}_of_{world_size}.pt2")
    assert code == 2
    for row in report["ranks"]:
        assert "the rank files call different collectives on the group of ranks [0, 1]" in row["error"]


def test_the_torchrun_form_gives_the_same_report(two: Path) -> None:
    done = _torchrun(2, "-m", "trt_inline", "verify", str(two / "mlp_rank{rank}_of_{world_size}.pt2"), "--json")
    report = json.loads(done.stdout)  # rank 0 prints the report of the set, the other ranks nothing
    assert [row["status"] for row in report["ranks"]] == ["PASS", "PASS"] and done.returncode == 0


def test_single_file_commands_on_a_rank_file(two: Path) -> None:
    path = two / "mlp_rank0_of_2.pt2"
    done = new_interpreter("-m", "trt_inline", "verify", path)
    assert done.returncode == 2 and "a collective of a tensor-parallel rank set" in done.stderr
    assert "verify --ranks N" in done.stderr
    done = new_interpreter("-m", "trt_inline", "inspect", path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("rank 0 of 2 of a tensor-parallel rank set (backend gloo")
    assert "[sum on group '0': ranks 0, 1]" in done.stdout


@pytest.mark.parametrize(
    ("variant", "rank0", "rank1"),
    [
        # The manifest of the honest program: rank 1's child finds it does not describe its program, nothing runs.
        (
            "oversized",
            "rank 1 refused its file, so no rank ran",
            "its rank manifest does not describe its program: collective 0 is _c10d_functional::all_reduce.default "
            "on group '0' of float32[8, 8] in the program and _c10d_functional::all_reduce.default on group '0' of "
            "float32[4, 8] in the manifest",
        ),
        # Its own size declared: the manifests disagree, nothing runs.
        ("declared", "collective 0 is _c10d_functional::all_reduce.default (sum) of float32[4, 8]", "float32[8, 8]"),
    ],
)
def test_a_rank_file_sending_another_size_is_one_ranks_error(two: Path, variant: str, rank0: str, rank1: str) -> None:
    """A rank file whose all_reduce sends twice the rows of the other rank's made gloo abort rank 0's trusted
    parent (SIGABRT, no report). Now it is an error line on each rank, naming the rank and the collective, before
    anything runs. (Where shapes are dynamic, the parents compare what their children send before each collective:
    tests/distributed/test_rank_manifest.py's descriptor tests.)"""
    code, report, seconds = _verify(2, two / f"{variant}_rank{{rank}}_of_{{world_size}}.pt2")
    first, second = report["ranks"]
    assert first["status"] == second["status"] == "ERROR", report
    assert rank0 in first["error"], first["error"]
    assert rank1 in second["error"], second["error"]
    assert code == 2 and seconds < 120


def test_the_torchrun_form_survives_a_rank_file_of_another_size(two: Path) -> None:
    """Under torchrun the parent of rank 0 is the user's own process: it prints the set's report and exits 2."""
    done = _torchrun(2, "-m", "trt_inline", "verify", str(two / "declared_rank{rank}_of_{world_size}.pt2"), "--json")
    report = json.loads(done.stdout)
    assert [row["status"] for row in report["ranks"]] == ["ERROR", "ERROR"]
    assert "of float32[8, 8] at all_reduce on rank 1; nothing ran" in report["ranks"][0]["error"]
    # Each rank's process exits 2 (torchrun's own status is 1 when any does); none died on a signal.
    assert done.returncode == 1 and "exitcode  : 2" in done.stderr, done.stderr[-3000:]
    assert "Signal" not in done.stderr and "SIGABRT" not in done.stderr and "EnforceNotMet" not in done.stderr


def test_rank_files_carry_their_own_check_where_they_need_trt_inline_anyway(two: Path) -> None:
    """Reference engines (trt_inline.save, and torch_tensorrt.save through the plugin): always; a file that loads
    without trt-inline (no engine here, TensorRT engines on a GPU): only with embed_rank_check=True."""
    carried = {"mlp": True, "seq_in_engines": True, "plugin": True, "plain": False, "plain_checked": True}
    for model, carries in carried.items():
        for rank in range(2):
            path = two / f"{model}_rank{rank}_of_2.pt2"
            program = torch.export.load(path)
            check_nodes = rank_check_nodes(program.graph_module)
            assert len(check_nodes) == int(carries), (model, rank, program.graph)
            if carries:
                first = next(n for n in program.graph.nodes if n.op != "placeholder")
                assert check_nodes[0] is first and str(check_nodes[0].target) == "trt_inline.check_ranks.default"
                # the file's manifest but for the save's id, which the check does not carry (the same graph every save)
                carried = decode_manifest(check_nodes[0].args[0], str(path))
                assert carried.save_id == "" and carried == dataclasses.replace(_manifest(path), save_id="")
            assert rank_check_problem(program.graph_module, _manifest(path)) is None


def test_a_rank_set_on_swapped_ranks_is_refused_by_the_loaders_users_call(swapped: Path) -> None:
    """Issue 42: ``torch.export.load`` and ``torch_tensorrt.load`` (Torch-TensorRT's tensor-parallel examples) ran
    rank 0's file on rank 1 without a word. With the plugin, the release's own ``torch_tensorrt.load`` refuses every
    rank file on the wrong rank; ``torch.export.load`` of a file carrying the check loads it, and its first run
    refuses. The files on their own ranks still compute bit for bit."""
    for rank in range(2):
        found = json.loads((swapped / f"swapped_rank{rank}.json").read_text())
        other = 1 - rank
        assert found["load wrapped"] is True
        # As it was: a file without the check, through the release's own load or torch.export.load, runs wrong.
        for before in ("plain swapped stock torch_tensorrt.load", "plain swapped torch.export.load"):
            assert isinstance(found[before], float) and found[before] > 0.01, (before, found[before])
        for model in ("mlp", "plain", "plain_checked"):  # refused at load, by the manifest every rank file carries
            message = found[f"{model} swapped torch_tensorrt.load"]
            path = swapped / f"{model}_rank{other}_of_2.pt2"
            assert message.startswith(f"RankSetError: {path} is rank {other} of 2 (save "), message
            assert f"but this process is rank {rank} of 2: load the file saved for this rank" in message
            assert message.endswith("(TRT_INLINE_CHECK_RANKS=0 loads it anyway)")
        for model in ("mlp", "plain_checked"):  # refused when its program starts, by the check it carries
            message = found[f"{model} swapped torch.export.load"]
            # (the check it carries names no save: the graph is the same for every save of the model)
            assert message.startswith(f"RankSetError: the rank file running here is rank {other} of 2, but"), message
            assert f"but this process is rank {rank} of 2: load the file saved for this rank" in message
            assert message.endswith(
                f"(its own check, {RANK_CHECK_OP}, refused to run it; TRT_INLINE_CHECK_RANKS=0 runs it anyway)"
            )
        for model in ("mlp", "plain", "plain_checked"):  # the right files, through both loaders: bit for bit
            assert found[f"{model} own torch_tensorrt.load"] == found[f"{model} own torch.export.load"] == 0.0, found
