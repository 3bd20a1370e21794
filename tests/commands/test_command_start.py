"""What a new user trips on first: unusable paths said at once, in the user's words, before any child starts."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.commands import assert_unusable, cli
from support.processes import REPO, new_interpreter, python_path
from support.programs import SavedSeed

from trt_inline import isolation


@pytest.fixture
def no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any child process started fails the test: the refusal must come first."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a child process was started for an unusable path")

    for name in ("trt_inline.verify.verifier", "trt_inline.verify.diff"):
        monkeypatch.setattr(importlib.import_module(name), "report_of_child", refuse)
    monkeypatch.setattr(isolation, "run_isolated", refuse)


def _unusable(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    folder = tmp_path / "out"
    folder.mkdir()
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    checkpoint = tmp_path / "checkpoint.pt"
    torch.save({"weight": torch.ones(2)}, checkpoint)
    return {
        "missing": (tmp_path / "missing.pt2", "missing.pt2: no such file"),
        "directory": (folder, "out: is a directory"),
        "text": (text, "notes.txt: not a zip archive"),
        "checkpoint": (checkpoint, "checkpoint.pt: a torch.save file (tensors or a checkpoint), not a saved program"),
    }


@pytest.mark.parametrize("what", ["missing", "directory", "text", "checkpoint"])
def test_an_unusable_path_is_one_line_before_any_child_starts(
    what: str, tmp_path: Path, saved_seed: SavedSeed, no_child: None
) -> None:
    path, fragment = _unusable(tmp_path)[what]
    assert_unusable(cli("verify", str(path)), fragment)
    assert_unusable(cli("inspect", str(path)), fragment)
    assert_unusable(cli("diff", str(path), str(saved_seed.good)), fragment)
    assert_unusable(cli("diff", str(saved_seed.good), str(path)), fragment)


def test_a_torch_save_file_says_what_to_use_instead(tmp_path: Path, no_child: None) -> None:
    path, _ = _unusable(tmp_path)["checkpoint"]
    line = cli("verify", str(path)).stderr.strip()
    assert "trt_inline.save" in line and "--inputs/--expected" in line, line


def test_the_cli_refusal_costs_little_more_than_importing_torch(tmp_path: Path) -> None:
    """The refusal of a missing path comes from the calling process, right after its imports (no child): its
    report names no child. (Time is measured by benchmarks/, not asserted here.)"""
    env = {"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"}
    proc = new_interpreter("-m", "trt_inline", "verify", tmp_path / "missing.pt2", cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("missing.pt2: no such file"), proc.stderr


def test_a_closed_pipe_ends_the_command_without_a_traceback(saved_seed: SavedSeed) -> None:
    """``trt-inline verify f | head -1``: the reader leaves; no traceback, and the status of a program a closed
    pipe stopped (141), never a verdict's."""
    process = subprocess.Popen(
        [sys.executable, "-m", "trt_inline", "verify", str(saved_seed.good)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
        env={"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # (before it writes anything: it is still opening the file)
    err = process.stderr.read().decode()
    assert process.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_commands_that_fork_a_child_start_its_interpreter_first() -> None:
    from trt_inline.__main__ import forks_a_child

    for argv in (["verify", "f.pt2"], ["--debug", "inspect", "f.pt2"], ["diff", "a", "b"], ["doctor"]):
        assert forks_a_child(argv), argv
    for argv in ([], ["check", "f.pt2"], ["verify", "--help"], ["-h"], ["verify", "f.pt2", "--ranks", "2"],
                 ["verify", "--he"], ["verify", "--rank", "2", "f.pt2"], ["verify", "--ra=2", "f.pt2"]):  # fmt: skip
        assert not forks_a_child(argv), argv


# The `trt-inline` command as a module (the script runs the same main: test_the_command_starts_..._before_torch).
COMMAND = ("-m", "trt_inline")


@pytest.mark.heavy
def test_the_command_starts_the_childs_interpreter_before_torch() -> None:
    """``main`` (the ``trt-inline`` script's, and ``python -m trt_inline``'s: the same function) starts the child's
    interpreter before it imports torch; importing the package starts nothing and imports no torch."""
    probe = (
        "import sys\n"
        "import trt_inline.__main__ as command\n"
        "seen = []\n"
        "command.start_for = lambda argv: seen.append(('torch' in sys.modules, list(argv)))\n"
        "command.exit_with = lambda code: print(seen, code) or sys.exit(0)\n"
        "assert 'torch' not in sys.modules and seen == []\n"
        "sys.argv = ['trt-inline', 'inspect', 'missing.pt2']\n"
        "command.main()\n"
    )
    proc = new_interpreter("-c", probe, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "[(False, ['inspect', 'missing.pt2'])] 2", proc.stdout + proc.stderr


def _processes_marked(mark: str) -> list[int]:
    """The processes whose environment holds ``TRT_INLINE_TEST_MARK=mark`` (a child interpreter keeps it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"TRT_INLINE_TEST_MARK={mark}".encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_the_command_forks_its_child_from_the_interpreter_it_started_first(saved_seed: SavedSeed) -> None:
    """The verdict is the same, the child is forked from the interpreter started before this process imported
    torch (its environment is the one a child gets: no second one started), and nothing outlives the command."""
    mark = f"fork-{id(saved_seed)}"
    env = {"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin", "TRT_INLINE_TEST_MARK": mark}
    proc = new_interpreter(*COMMAND, "--debug", "verify", saved_seed.good, cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("PASS"), proc.stdout + proc.stderr
    assert "forking the child from the interpreter started before this process imported torch" in proc.stderr
    assert "starting another" not in proc.stderr, proc.stderr
    assert _processes_marked(mark) == []


def test_a_refusal_stops_the_interpreter_started_for_nothing(tmp_path: Path) -> None:
    mark = f"refusal-{tmp_path.name}"
    env = {"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin", "TRT_INLINE_TEST_MARK": mark}
    proc = new_interpreter(*COMMAND, "verify", tmp_path / "missing.pt2", cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("missing.pt2: no such file"), proc.stderr
    assert _processes_marked(mark) == []


def test_the_command_ends_on_a_closed_pipe_with_its_status(saved_seed: SavedSeed) -> None:
    """Its end skips the interpreter's teardown: the status and stderr are still those of a closed pipe."""
    process = subprocess.Popen(
        [sys.executable, *COMMAND, "verify", str(saved_seed.good)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
        env={"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# (stdin and stdout: the pair a socket of the interpreter would be given first, the case that breaks it)
@pytest.mark.heavy
@pytest.mark.parametrize("closed", ["stdin and stdout"])
def test_the_command_with_a_standard_descriptor_closed_ends_as_the_module_does(
    saved_seed: SavedSeed, closed: str, tmp_path: Path
) -> None:
    """Started with stdin, stdout or stderr closed, the command forks its child all the same (the interpreter's end
    of the socket is never one of them), and the script ends as ``python -m trt_inline`` does: the same status and
    line."""
    redirect = {"stdout": ">&-", "stdin and stdout": "<&- >&-", "stdin and stderr": "<&- 2>&-"}[closed]
    env = {"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"}
    script_path = Path(sys.executable).parent / "trt-inline"  # (the script pip installs beside the interpreter)
    assert script_path.is_file(), f"{script_path}: the trt-inline script is not installed"
    ends = []
    for name, command in (("script", f'"{script_path}"'), ("module", f'"{sys.executable}" -m trt_inline')):
        err = tmp_path / f"{name}.txt"
        errors = "" if "stderr" in closed else f' 2>"{err}"'
        script = f'{command} verify "{saved_seed.good}" {redirect}{errors}; echo "status $?"'
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        line = err.read_text().strip().splitlines()[-1] if err.exists() else ""
        assert "BrokenPipe" not in line and "Traceback" not in line, line
        ends.append((done.stdout.strip(), line))
    assert ends[0] == ends[1], ends


def test_diff_names_the_file_once_and_says_what_its_program_takes(saved_seed: SavedSeed, tmp_path: Path) -> None:
    """``diff A B --inputs`` with inputs neither takes: the file named once (was "A: B: its program raised at node
    (node _guards_fn)"), and what the program takes against what was given, as verify says it."""
    x = saved_seed.x
    wrong = tmp_path / "wrong.pt"
    torch.save([torch.randn(x.shape[0] + 3, *x.shape[1:])], wrong)
    good = str(saved_seed.good)
    proc = cli("diff", good, good, "--inputs", str(wrong))
    assert_unusable(proc, f"{good}: the program does not accept the given inputs: input 0")
    assert proc.stderr.count(good) == 1 and "given float32[" in proc.stderr, proc.stderr


def test_a_saved_program_given_as_inputs_is_named_as_one(saved_seed: SavedSeed, tmp_path: Path) -> None:
    """A ``.pt2`` where a tensor file goes: said in one line, with where it goes instead (was torch's miniz text)."""
    good = str(saved_seed.good)
    proc = cli("verify", good, "--inputs", good, "--expected", good)
    assert_unusable(proc, f"inputs file {good} is a saved program, not a torch.save file of tensors")
    assert "--expected-from" in proc.stderr
    assert_unusable(cli("verify", good, "--inputs", str(tmp_path), "--expected", good), "is a directory")


def test_inputs_alone_run_the_program_with_the_checks_that_need_no_reference(tmp_path: Path) -> None:
    """``--inputs`` without ``--expected``: does it run on my input? It runs, its values are held to their
    declarations and looked at for garbage; nothing is compared, so UNVERIFIED (exit 3), said on stderr."""
    from support.models import Garbage

    import trt_inline

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    compiled = trt_inline.reference.compile(Garbage("zeros").eval(), (x,), torch_executed_ops=["aten.relu.default"])
    path = tmp_path / "zeros.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,), embed_reference=False)
    torch.save([torch.randn(4, 8)], tmp_path / "mine.pt")
    proc = cli("verify", str(path), "--inputs", str(tmp_path / "mine.pt"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"UNVERIFIED {path}"), proc.stdout
    assert "note: ran on the given inputs, with no expected outputs" in proc.stdout
    assert "out[0] is all zeros on the given inputs, from inputs that are not" in proc.stdout, proc.stdout
    assert "output names were not checked" not in proc.stdout
    assert proc.stderr.strip() == (
        f"trt-inline verify: UNVERIFIED: {path} ran on the inputs in {tmp_path / 'mine.pt'}, with nothing to "
        "compare its outputs with: give the expected outputs with --expected FILE"
    )
    torch.save([torch.randn(4, 9)], tmp_path / "wide.pt")
    assert_unusable(
        cli("verify", str(path), "--inputs", str(tmp_path / "wide.pt")),
        "does not accept the given inputs: input 0 (x) is float32[4, 8], given float32[4, 9]",
    )


class _Chain(torch.nn.Module):
    """Eleven engines (a linear each), a relu left to PyTorch between each two."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(10))
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        for layer in self.layers:  # (not a slice of it: torch 2.5's export cannot trace one)
            x = torch.relu(layer(x))
        return {"logits": self.head(x), "hidden": x}


def test_inspect_keeps_its_columns_at_any_engine_count_and_sums_up(tmp_path: Path) -> None:
    import trt_inline

    x = torch.randn(2, 4)
    compiled = trt_inline.reference.compile(_Chain().eval(), (x,), torch_executed_ops=["aten.relu.default"])
    path = tmp_path / "chain.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,))
    proc = cli("inspect", str(path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.rstrip("\n").split("\n")
    assert any(line.startswith("engine 10 ") for line in lines), proc.stdout  # (was "engine 10execute_engine_10")
    header, rows = lines[0], lines[1:-2]
    column = header.index("wiring")
    assert all(row[column - 1] == " " and row[column] != " " for row in rows if len(row) > column), proc.stdout
    assert any(row.split()[:3] == ["output", "0", "out['logits']"] for row in rows), proc.stdout
    # (a reference engine keeps its weights in one payload)
    assert lines[-2].startswith("11 engines, 10 ops left to PyTorch, 1 input, 2 outputs, 11 weights ("), lines[-2]
    # (and says which pipeline built it: here trt-inline's own, asked for by the suite)
    assert lines[-1].startswith("built on: trt-inline's own partitioner and precision emulation"), lines[-1]


def test_the_child_process_note_is_short_unless_verbose(saved_seed: SavedSeed) -> None:
    short = cli("verify", str(saved_seed.good))
    note = next(line for line in short.stdout.splitlines() if "child process" in line)
    assert note.startswith("  note: run in a child process (sandboxed: ") and "; peak memory " in note, note
    assert "limits" not in note and len(note) < 160, note
    verbose = cli("verify", str(saved_seed.good), "--verbose")
    note = next(line for line in verbose.stdout.splitlines() if "child process" in line)
    assert "limits 3600 s, 2 GiB; its peak resident memory" in note and "mapped from files" in note, note


def test_an_operator_named_to_run_in_pytorch_is_kept_from_decomposition(tmp_path: Path) -> None:
    """``torch_executed_ops=["aten.hardswish.default"]``: before, decomposition turned hardswish into other ops
    and nothing fell back, silently; now it falls back as itself, and an entry nothing calls is a warning."""
    import warnings

    import trt_inline

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Hardswish(), torch.nn.Linear(4, 4)).eval()
    x = torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        compiled = trt_inline.reference.compile(model, (x,), torch_executed_ops=["aten.hardswish.default"])
    fallbacks = [m for name, m in compiled.named_children() if name.startswith("_run_on_gpu")]
    called = [n.target for m in fallbacks for n in m.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.hardswish.default in called, called
    path = tmp_path / "hardswish.pt2"
    trt_inline.save(compiled, path, arg_inputs=(x,))
    assert cli("verify", str(path)).returncode == 0
    with pytest.warns(UserWarning, match="torch_executed_ops entry aten.gelu.default matches no operator the graph"):
        trt_inline.reference.compile(model, (x,), torch_executed_ops=["aten.gelu.default"])


class _DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x  # (export cannot trace a branch on a value)


def test_a_compile_failure_says_what_trt_inline_was_doing() -> None:
    """Torch's failure inside reference.compile: one line saying the step and the module, torch's exception chained
    (was its traceback alone, about 100 lines, with no word of what trt-inline was doing)."""
    import trt_inline

    with pytest.raises(trt_inline.CompileError) as failed:
        trt_inline.reference.compile(_DataDependent(), (torch.randn(3),))
    message = str(failed.value)
    assert message.startswith("reference.compile: exporting _DataDependent (torch.export, non-strict) failed: "), (
        message
    )
    assert "\n" not in message and failed.value.__cause__ is not None
