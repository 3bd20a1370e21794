"""Verification: good files pass, miswired files fail naming the output, unusable input exits 2."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import operator
import os
import pickle
import re
import runpy
from pathlib import Path

import pytest
import torch
from support.commands import assert_unusable, cli, miswire
from support.hostile import tampered_reference_io, torchscript_archive, truncated
from support.models import RELU, ConvBnRelu
from support.processes import REPO, new_interpreter, python_path
from support.programs import SavedSeed

import trt_inline
from trt_inline import reference
from trt_inline.archive import decode_reference_io, load_exported_program
from trt_inline.errors import VerifyInputError
from trt_inline.verify import structural_problems, verify


@pytest.fixture(scope="module")
def saved(saved_seed: SavedSeed) -> dict[str, Path]:
    """The seed files, a miswired copy, and tensor files for --inputs/--expected."""
    root = saved_seed.root
    with torch.no_grad():
        expected = list(saved_seed.compiled(saved_seed.x))
    torch.save([saved_seed.x], root / "inputs.pt")
    torch.save(expected, root / "expected.pt")
    torch.save([torch.randn(2, 5, 8, 8)], root / "wrong_inputs.pt")
    miswired = miswire(saved_seed.good, root / "miswired.pt2")
    return {"good": saved_seed.good, "bare": saved_seed.bare, "miswired": miswired, "root": root}


def test_good_file_verifies_with_only_its_path(saved: dict[str, Path]) -> None:
    proc = cli("verify", str(saved["good"]), process=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"PASS {saved['good']} (expected outputs: embedded)")
    assert proc.stdout.count("max abs diff 0 ") == 2


def test_json_report(saved: dict[str, Path]) -> None:
    proc = cli("verify", str(saved["good"]), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["expected_source"] == "embedded"
    assert [o["max_abs_diff"] for o in report["outputs"]] == [0.0, 0.0]


def test_miswired_file_fails_and_names_the_output(saved: dict[str, Path]) -> None:
    report = verify(saved["miswired"])
    assert not report.ok
    assert [o.index for o in report.outputs if not o.ok] == [0, 1]
    assert report.outputs[0].max_abs_diff > 1e-3
    proc = cli("verify", str(saved["miswired"]))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "problem: output 0 differs: max abs diff" in proc.stdout


def test_reference_module_and_given_tensors(saved: dict[str, Path]) -> None:
    x = torch.load(saved["root"] / "inputs.pt", weights_only=True)
    expected = torch.load(saved["root"] / "expected.pt", weights_only=True)
    assert verify(saved["bare"], arg_inputs=x, expected=expected).ok
    assert not verify(saved["bare"], arg_inputs=x, expected=[e + 1 for e in expected]).ok
    program = load_exported_program(saved["good"]).program
    assert verify(saved["miswired"], expected_module=program.module(), arg_inputs=x).ok is False
    assert verify(saved["miswired"], expected_module=program.module(), isolate=False).ok is False


def test_file_without_reference_io(saved: dict[str, Path]) -> None:
    report = verify(saved["bare"])
    assert not report.compared and not report.problems and not report.ok
    unverified = cli("verify", str(saved["bare"]))  # (UNVERIFIED: its own exit status, what to give on stderr)
    assert unverified.returncode == 3 and unverified.stdout.startswith("UNVERIFIED "), unverified.stdout
    assert unverified.stderr.count("\n") == 1, unverified.stderr
    assert "comparing outputs needs --inputs FILE --expected FILE" in unverified.stderr
    root = saved["root"]
    proc = cli(
        "verify", str(saved["bare"]), "--inputs", str(root / "inputs.pt"), "--expected", str(root / "expected.pt")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "expected outputs: given" in proc.stdout


@pytest.mark.heavy
def test_bad_inputs_exit_2_with_one_line_across_a_process(saved: dict[str, Path], tmp_path: Path) -> None:
    """The full table is in process (tests/commands/test_bad_inputs.py, and the cases below); here the real process
    boundary.

    One refusal in the CLI process itself and one in the child that opens the file.
    """
    marker = tmp_path / "exploited"
    for args, fragment in [
        ([str(truncated(saved["good"], tmp_path / "most.pt2", 0.98))], "not a zip archive"),
        ([str(torchscript_archive(tmp_path / "script.pt"))], "a TorchScript archive"),
    ]:
        assert_unusable(cli("verify", *args), fragment)
    tampered = tampered_reference_io(saved["good"], tmp_path / "tampered.pt2", marker)
    cases = [
        ([str(tmp_path / "missing.pt2")], "no such file"),
        ([str(tampered)], "embedded reference I/O refused"),
    ]
    for args, fragment in cases:
        assert_unusable(cli("verify", *args, process=True), fragment)
    assert not marker.exists(), "the tampered payload was unpickled"


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = cli("--debug", "verify", str(tmp_path / "missing.pt2"))
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr


def test_reference_io_refuses_non_tensor_payloads() -> None:
    buffer = io.BytesIO()
    torch.save({"version": 1, "args": [torch.ones(1)], "kwargs": {}, "outputs": [torch.ones(1)]}, buffer)
    good = base64.b64encode(buffer.getvalue()).decode()
    assert torch.equal(decode_reference_io(good).outputs[0], torch.ones(1))
    with pytest.raises(VerifyInputError, match="not base64"):
        decode_reference_io("***")
    with pytest.raises(VerifyInputError, match="refused"):
        decode_reference_io(base64.b64encode(pickle.dumps(print)).decode())


def test_structural_checks_name_the_node(saved: dict[str, Path]) -> None:
    program = load_exported_program(saved["good"]).program
    assert structural_problems(program)[0] == []

    getitem = next(n for n in program.graph.nodes if n.target is operator.getitem)
    getitem.args = (getitem.args[0], 5)
    engine = next(n for n in program.graph.nodes if n.target is torch.ops.trt_inline.execute_engine.default)
    engine.args = ((*engine.args[0], engine.args[0][0]), *engine.args[1:])
    problems = structural_problems(program)[0]
    assert f"{getitem.name} reads output 5 of {engine.name}, which has 1" in problems
    assert f"engine {engine.name}: 2 inputs wired, the engine takes 1" in problems


def test_save_size_cap_leaves_reference_out_with_a_warning(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 8, 8)
    compiled = reference.compile(ConvBnRelu().eval(), (x,), torch_executed_ops=[RELU])
    with pytest.warns(UserWarning, match=r"reference I/O not embedded .* over the limit of 0\.0 MiB"):
        trt_inline.save(compiled, tmp_path / "capped.pt2", arg_inputs=(x,), reference_limit_bytes=100)
    assert verify(tmp_path / "capped.pt2").expected_source == "none"


def test_inspect_shows_wiring_by_position(saved: dict[str, Path]) -> None:
    proc = cli("inspect", str(saved["good"]))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("engine 3") for line in lines)
    assert "  in[1]" in proc.stdout and "<- getitem_3 = engine 2 output 1" in proc.stdout
    assert "relu.default(getitem = engine 0 output 0)" in proc.stdout
    # The miswired relu reads engine 0; the engine it should have read became dead and was pruned.
    miswired = cli("inspect", str(saved["miswired"])).stdout
    assert "relu_1 float32[2, 8, 8, 8] relu.default(getitem = engine 0 output 0)" in re.sub(" +", " ", miswired)
    assert not any(line.startswith("engine 3") for line in miswired.splitlines())


@pytest.mark.heavy
def test_verify_saved_model_example(saved: dict[str, Path]) -> None:
    """The example as a CI job runs it (a process of its own), then its verdict on a miswired file (its ``main`` in
    this process: the file is opened in a child either way)."""
    script = REPO / "examples" / "verify_saved_model.py"
    env = dict(os.environ, PYTHONPATH=python_path())
    good = new_interpreter(script, saved["good"], env=env)
    assert good.returncode == 0 and "PASS" in good.stdout, good.stderr
    example = runpy.run_path(str(script))  # as a module: its __main__ block does not run
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = example["main"]([str(saved["miswired"])])
    assert code == 1 and "output 0 differs" in out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("guard", "refused"),
    [
        ("L['x'].size()[1] != max(1, L['x'].size()[1] // 2)", None),  # a derived Dim's guard, as torch prints it
        ("min(L['x'].size()[0], 8) >= abs(-2)", None),
        ("L['x'].size()[1] != torch.sym_max(1, L['x'].size()[1] // 2)", None),  # the same, as torch 2.14 prints it
        ("__import__('os').system('true')", "reading .system"),
        ("max.__self__", "reading .__self__"),
        ("open('/etc/passwd') and max(1, 2)", "naming 'open'"),
    ],
)
def test_guards_may_call_max_min_abs_and_nothing_else(guard: str, refused: str | None) -> None:
    from trt_inline.archive.program_checks import check_guard

    problem = check_guard(guard)
    assert (problem is None) if refused is None else (problem is not None and refused in problem), problem
