"""``trt-inline fix SCRIPT``: find_fix from the user's script, as a command.

One planted model end to end as a user runs it (a new interpreter, stderr a terminal): its spot named by module
path and source line, one progress line per compile, the fix saved with ``--out`` and verified, then loaded in
a fresh process and compared with the model in fp32. The rest in this process: both forms of the script,
``--json``, ``--cases``, the exit statuses (1: no set works; 130: Ctrl-C), and each unusable input as one line
on stderr and exit 2.
"""

from __future__ import annotations

import json
import re
import runpy
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from support.pairs import autocast_skip, fp16_settings
from support.processes import REPO, load_in_fresh_process, new_interpreter, run_with_stderr_on_a_terminal

from trt_inline import cli
from trt_inline.fixing import runner

needs_autocast = pytest.mark.skipif(autocast_skip() is not None, reason=autocast_skip() or "")

SPOT = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Energy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            big = (self.proj(x) * 300.0) ** 2
            return x + big / 1e5


    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Energy()
            self.head = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.block(x)))


    torch.manual_seed(0)
    model = Model().eval()
    arg_inputs = (torch.randn(8, 16),)
    """
)
# The same model as model(), with settings of its own, and a main block that must not run.
FACTORY = SPOT.replace(
    "torch.manual_seed(0)\nmodel = Model().eval()\narg_inputs = (torch.randn(8, 16),)\n",
    textwrap.dedent(
        """
        def model():
            torch.manual_seed(0)
            return Model().eval(), (torch.randn(8, 16),)


        settings = {"enable_autocast": True, "autocast_low_precision_type": torch.float16,
                    "autocast_max_output_threshold": 512.0}

        if __name__ == "__main__":
            raise SystemExit("the main block ran")
        """
    ),
)
CLEAN = "import torch\nmodel = torch.nn.Linear(4, 4).eval()\narg_inputs = torch.randn(2, 4)\n"


def _script(folder: Path, text: str, name: str = "spot.py") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _fix(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """``trt-inline fix ARGS`` in this process: (status, stdout, stderr)."""
    try:
        code = cli.main(["fix", *map(str, args)])
    except SystemExit as exited:  # (argparse's usage errors, and --help)
        code = int(exited.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.heavy
@needs_autocast
def test_the_spot_is_named_and_the_fix_saved_and_verified(tmp_path: Path) -> None:
    script, out = _script(tmp_path, SPOT), tmp_path / "fixed.pt2"
    code, stdout, stderr = run_with_stderr_on_a_terminal("fix", script, "--out", out)
    assert code == 0, stdout + stderr
    head = stdout.splitlines()[0]
    found = re.match(r"fixed: (\d+) of (\d+) candidate modules kept in fp32 .*; (\d+) compiles\)$", head)
    assert found is not None, stdout
    assert "  block (Energy): 4 nodes (aten.mul.Tensor, " in stdout, stdout
    assert "; spot.py:12 in forward: big = (self.proj(x) * 300.0) ** 2" in stdout, stdout
    assert "compile with: trt_inline.reference.compile(model, arg_inputs, enable_autocast=True, " in stdout
    assert "autocast_excluded_nodes=['^block$']" in stdout
    # The report is printed before the build is saved; the save's line ends it.
    assert stdout.index("compile with:") < stdout.index(f"PASS {out}")
    assert f"PASS {out}: saved, and verified against the model in fp32" in stdout.splitlines()[-1]
    # One progress line per compile, on the terminal, numbered.
    progress = re.findall(r"compile (\d+)(?: \(at most \d+\))?: ", stderr)
    assert progress == [str(k) for k in range(1, int(found.group(3)) + 1)], stderr
    # The saved fix, loaded in a process of its own, is within tolerance of the model in fp32.
    names = runpy.run_path(str(script))
    model, arg_inputs = names["model"], names["arg_inputs"]
    loaded = load_in_fresh_process(tmp_path, [out], list(arg_inputs))[str(out)]["outputs"][0]
    with torch.no_grad():
        expected = model(*arg_inputs)
        assert (loaded - expected).abs().max() < 1e-2
        broken = __import__("trt_inline").reference.compile(model, arg_inputs, **fp16_settings())
        assert not broken(*arg_inputs).isfinite().all()  # (what there was to fix)


@needs_autocast
def test_a_script_defining_model_as_a_function_with_its_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _fix(capsys, _script(tmp_path, FACTORY), "--json", "--seed", "1")
    assert code == 0, out + err
    document = json.loads(out)
    assert document["outcome"] == "fixed" and document["settings"]["autocast_max_output_threshold"] == 512.0
    assert [node["source"] for node in document["nodes"]] == [
        "spot.py:12 in forward: big = (self.proj(x) * 300.0) ** 2"
    ]
    assert [node["name"] for node in document["nodes"]] == ["block"] and document["minimal"] is True
    assert document["cases"][0]["error_before"] == "inf" and document["cases"][0]["ok_after"] is True
    assert document["compiles"] >= 3 and document["build_after"]["engines"] >= 1 and err == ""


@needs_autocast
def test_a_clean_model_has_nothing_to_fix_in_one_compile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _fix(capsys, _script(tmp_path, CLEAN), "--atol", "1e-2", "--rtol", "0.05")
    assert code == 0, out + err
    assert out.startswith("nothing to fix: every case is within tolerance") and "; 1 compile)" in out


@needs_autocast
def test_every_case_of_a_folder_is_held_to(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = runpy.run_path(str(_script(tmp_path, SPOT)))
    model, (x,) = names["model"], names["arg_inputs"]
    for name, inputs in (("small", x * 0.01), ("large", x)):
        (tmp_path / "cases" / name).mkdir(parents=True)
        torch.save([inputs], tmp_path / "cases" / name / "inputs.pt")
        with torch.no_grad():
            torch.save(model(inputs), tmp_path / "cases" / name / "expected.pt")
    code, out, err = _fix(capsys, tmp_path / "spot.py", "--cases", tmp_path / "cases")
    assert code == 0, out + err
    assert re.search(r"^  large  inf \(out of tolerance\) -> \S+ \(within tolerance\)$", out, flags=re.MULTILINE), out
    assert re.search(r"^  small  \S+ \(within tolerance\) -> \S+ \(within tolerance\)$", out, flags=re.MULTILINE), out


@needs_autocast
def test_no_set_that_works_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = CLEAN.replace("torch.randn(2, 4)", "torch.randn(2, 4) * 1e6")
    code, out, err = _fix(capsys, _script(tmp_path, big), "--out", tmp_path / "fixed.pt2")
    assert code == 1, out + err
    assert out.startswith("no fix: ") and "disable_tf32=True" in out, out
    assert out.splitlines()[-1] == f"--out {tmp_path / 'fixed.pt2'}: not written (no set that works was found)"
    assert not (tmp_path / "fixed.pt2").exists()


@needs_autocast
def test_ctrl_c_prints_the_best_set_and_exits_130(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trt_inline import reference

    calls: list[int] = []

    def interrupted_on_the_fourth(model: Any, arg_inputs: Any, **settings: Any) -> Any:
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return reference.compile(model, arg_inputs, **settings)

    monkeypatch.setattr(runner, "default_compile", lambda: interrupted_on_the_fourth)
    code, out, err = _fix(capsys, _script(tmp_path, SPOT), "--json")
    assert code == 130, out + err
    document = json.loads(out)
    assert document["outcome"] == "interrupted" and document["works"] and document["compiles"] == 3
    assert (
        document["nodes"]
        and "interrupted_on_the_fourth(model, arg_inputs, enable_autocast=True, " in (document["compile_call"])
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "script missing.py: no such file"),
        (["{folder}"], "is a directory, not a Python script"),
        (["{empty}"], "defines no model: define model() returning (module, arg_inputs)"),
        (["{half}"], "defines model but not arg_inputs"),
        (["{raises}"], "raised ValueError: broken"),
        (["{spot}", "--settings", "{bad"], "--settings {bad: not JSON"),
        (["{spot}", "--settings", "[1]"], "--settings: a JSON object of compile settings, got list"),
        (["{spot}", "--settings", '{"enabled_precisions": "float16"}'], "enabled_precisions is a list"),
        (
            ["{spot}", "--settings", '{"enabled_precisions": ["float16"]}', "--strategy", "higher_precision"],
            "takes effect with enable_autocast=True",
        ),
        (["{spot}", "--max-compiles", "0"], "--max-compiles 0: at least 1"),
        (["{spot}", "--out", "/no/such/folder/fixed.pt2"], "--out: directory /no/such/folder does not exist"),
        (["{spot}", "--cases", "/no/such/cases"], "--cases /no/such/cases: no such folder"),
        (["{spot}", "--atol", "out0=x"], "is not a number"),
        (["{spot}", "--strategy", "other"], "invalid choice: 'other'"),
    ],
)
def test_unusable_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    files = {
        "folder": tmp_path,
        "empty": _script(tmp_path, "x = 1\n", "empty.py"),
        "half": _script(tmp_path, "import torch\nmodel = torch.nn.Linear(2, 2)\n", "half.py"),
        "raises": _script(tmp_path, "raise ValueError('broken')\n", "raises.py"),
        "spot": _script(tmp_path, SPOT),
    }
    given = [arg.format(**files) if arg.startswith("{") and arg[1:-1] in files else arg for arg in args]
    code, out, err = _fix(capsys, *given)
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and err.startswith("trt-inline fix: ") and message in err, err


@needs_autocast
def test_a_failed_save_is_said_after_the_report_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set found is printed first; a save that then fails says so in one line after it (exit 2)."""
    import trt_inline.export

    def failing_save(*args: Any, **kwargs: Any) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(trt_inline.export, "save", failing_save)
    out = tmp_path / "fixed.pt2"
    code, stdout, stderr = _fix(capsys, _script(tmp_path, SPOT), "--out", out)
    assert code == 2, stdout + stderr
    assert stdout.startswith("fixed: ") and "compile with:" in stdout and "autocast_excluded_nodes" in stdout, stdout
    assert stdout.splitlines()[-1] == f"--out {out}: not written (OSError: No space left on device)", stdout
    assert not out.exists()


def test_a_missing_script_in_a_new_interpreter_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = new_interpreter("-m", "trt_inline", "fix", tmp_path / "missing.py", cwd=REPO, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"trt-inline fix: script {tmp_path / 'missing.py'}: no such file\n"


def test_help_states_the_script_convention_and_the_exit_statuses(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = _fix(capsys, "--help")
    text = " ".join(out.split())
    assert code == 0
    for part in (
        "SCRIPT is your own Python script, run in this process",
        "model(), a function returning (module, arg_inputs)",
        "model (the nn.Module) and arg_inputs",
        "Exit 0: fixed, or nothing to fix",
        "130: Ctrl-C stopped the search",
        "--atol [KEY=]TOL",
        "--check-error-stat",
        "--top-k K",
        "--max-compiles N",
        "--out FILE.pt2",
    ):
        assert part in text, part
    assert "--strict" not in text
