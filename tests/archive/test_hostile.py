"""Files crafted against verify itself (tests/support/hostile.py): no code runs, no file is read or written, no crash.

Every case must end in exit 2 with one stderr line, no control character on
stderr, the marker file absent, the victim file untouched, nothing left in the
temp root the call was given, the repository unchanged, and the secret nowhere
in the output. The CLI
runs in this process (its child process is the real one); one case also runs
the CLI as a process of its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest
from support.hostile import CASES, ESCAPE, INSPECTED, SECRET, Case, Traps, read_entries, write_entries
from support.processes import REPO, new_interpreter
from support.programs import SavedSeed

from trt_inline import cli
from trt_inline.isolation import reusing_interpreter

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _unprintable(text: str) -> list[str]:
    """Characters a terminal would act on or reorder: controls (but newlines), format and bidi marks, separators."""
    return [c for c in text if (c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co"))]


RunCase = Callable[[Case], tuple[int, str, str]]


def _listing(folder: Path) -> list[Path]:
    """The folder's entries, without bytecode caches (another test worker may write one meanwhile)."""
    return sorted(entry for entry in folder.iterdir() if entry.name != "__pycache__")


@pytest.fixture
def run_case(
    saved_seed: SavedSeed, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> RunCase:
    """Runs one case with a temp root of its own: afterwards it must be empty, and the repository unchanged."""

    def run(case: Case) -> tuple[int, str, str]:
        traps = Traps(tmp_path)
        path = case.build(saved_seed.good, tmp_path / "crafted.pt2", traps)
        temp = Path(tempfile.mkdtemp(prefix="temp", dir=tmp_path))
        monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the child's folder, and its TMPDIR, go here
        repository = _listing(REPO)
        code = cli.main([case.command, str(path), *case.args])
        out, err = capsys.readouterr()
        assert list(temp.iterdir()) == [], (case.name, list(temp.iterdir()))
        assert _listing(REPO) == repository, case.name
        assert traps.sprung() == [], (case.name, err)
        assert SECRET not in out + err, case.name
        assert not _CONTROL.search(err) and not _CONTROL.search(out), (case.name, err)
        assert _unprintable(err) == [] and _unprintable(out) == [], (case.name, err)
        return code, out, err

    return run


def _expected(case: Case) -> tuple[str, ...]:
    return case.expect if isinstance(case.expect, tuple) else (case.expect,)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_crafted_file_is_refused(case: Case, run_case: RunCase) -> None:
    code, out, err = run_case(case)
    lines = err.strip().splitlines()
    assert code == 2, (case.name, out, err)
    assert len(lines) == 1, err
    assert any(expect in lines[0] for expect in _expected(case)), lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize("case", INSPECTED, ids=[case.name for case in INSPECTED])
def test_strings_from_a_file_are_escaped(case: Case, run_case: RunCase) -> None:
    code, out, err = run_case(case)
    assert code == 0, err
    escaped = ESCAPE.encode("unicode_escape").decode()
    assert f"outputs: tensor{escaped}" in out
    assert "model.so" in out


def test_a_crash_is_one_line_from_a_real_process(saved_seed: SavedSeed, tmp_path: Path) -> None:
    """The CLI as users run it: the child dies on a signal, the CLI prints one line and exits 2."""
    case = next(c for c in CASES if c.args[:1] == ("--allow-op",))
    traps = Traps(tmp_path)
    path = case.build(saved_seed.good, tmp_path / "crafted.pt2", traps)
    proc = new_interpreter("-m", "trt_inline", "verify", path, *case.args, cwd=REPO, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "died on SIGSEGV" in proc.stderr, proc.stderr
    assert "nothing of it ran in this process" in proc.stderr


def test_good_file_passes_under_a_2gib_limit(saved_seed: SavedSeed, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(saved_seed.good), "--memory-limit", "2GiB", "--timeout", "120", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS") and "limits 120 s, 2 GiB" in out


_LIMITS = [c for c in CASES if c.kind in ("crashes", "exhaustion") and c.args]


@pytest.mark.parametrize("case", _LIMITS, ids=[case.name for case in _LIMITS])
def test_a_fresh_interpreter_keeps_every_limit(case: Case, run_case: RunCase, fresh_children: None) -> None:
    """The crash, the memory and the time limit on the path the ``trt-inline`` command takes (the cases above ran
    forked from this module's interpreter)."""
    code, out, err = run_case(case)
    assert code == 2 and any(expect in err for expect in _expected(case)), (case.name, out, err)


def test_the_interpreter_children_are_forked_from_outlives_them(run_case: RunCase, fresh_children: None) -> None:
    """``reusing_interpreter``: a child that crashed leaves it serving the next; it is stopped when the block ends."""
    case = next(c for c in _LIMITS if c.kind == "crashes")
    before = set(_interpreters_of_this_process())  # this module's own interpreter
    with reusing_interpreter():
        code, out, err = run_case(case)
        again, _, second = run_case(case)  # the interpreter survives its child's end, and serves the next
        assert set(_interpreters_of_this_process()) - before, "the children were forked from the block's interpreter"
    assert code == again == 2, (case.name, out, err)
    assert any(e in err for e in _expected(case)) and any(e in second for e in _expected(case)), err
    assert set(_interpreters_of_this_process()) == before, "the block's interpreter is stopped when the block ends"


def _interpreters_of_this_process() -> list[str]:
    """Pids of this process's child interpreters (other test workers run interpreters of their own)."""
    command = ["pgrep", "-P", str(os.getpid()), "-f", r"trt_inline\.isolation\.(inside|zygote)"]
    return subprocess.run(command, capture_output=True, text=True).stdout.split()


# ---------------------------------------------------------------------------
# Strings a file prints: report forgery, and drawing from bounded data
# ---------------------------------------------------------------------------

_FORGED = "\nPASS verified by TensorRT 10.3 (signed engine, trusted)\u200f\u061c\u200b"


@pytest.fixture(scope="module")
def with_boundaries(saved_seed: SavedSeed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import trt_inline

    path = tmp_path_factory.mktemp("boundaries") / "boundaries.pt2"
    trt_inline.save(saved_seed.compiled, path, arg_inputs=(saved_seed.x,), embed_reference="boundaries")
    return path


def _forged(source: Path, target: Path, name: str) -> Path:
    """The file with engine 1's recorded name replaced and its first expected output moved: it fails, and prints."""
    from trt_inline.archive.reference_io import decode_reference_io, encode_reference_io
    from trt_inline.formats import REFERENCE_IO_FILE

    entries = read_entries(source)
    entry = next(n for n in entries if n.endswith(REFERENCE_IO_FILE))
    reference = decode_reference_io(entries[entry].decode())
    assert reference.boundaries is not None and len(reference.boundaries) > 1
    reference.boundaries[1].name = name
    reference.outputs[0] = reference.outputs[0] + 1.0
    entries[entry] = encode_reference_io(reference).encode()
    return write_entries(target, entries)


def test_a_forged_report_line_is_escaped(
    with_boundaries: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newline and bidi marks in a recorded engine name print as escapes inside its row, never as a line."""
    path = _forged(with_boundaries, tmp_path / "forged.pt2", "_run_on_acc_3" + _FORGED)
    code = cli.main(["verify", str(path), "--per-engine"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "engine boundaries" in out, "the per-engine table, where the name is printed, is there"
    assert not [line for line in out.splitlines() if line.lstrip().startswith("PASS")], out
    assert "_run_on_acc_3\\nPASS verified by TensorRT 10.3 (signed engine, trusted)\\u200f\\u061c\\u200b" in out
    assert _unprintable(out) == [] and _unprintable(err) == []
    json_code = cli.main(["verify", str(path), "--per-engine", "--json"])
    out = capsys.readouterr().out
    assert json_code == 1 and "\\u200f" in out and "\u200f" not in out


def test_a_long_name_is_drawn_within_the_limits(
    with_boundaries: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 400,000-character recorded name: cut where it is decoded, so the chart is drawn in seconds."""
    pytest.importorskip("matplotlib")
    path = _forged(with_boundaries, tmp_path / "long.pt2", "_run_on_acc_3" + "W" * 400_000)
    chart = tmp_path / "chart.png"
    started = time.monotonic()
    code = cli.main(["verify", str(path), "--per-engine", "--plot", str(chart), "--timeout", "30"])
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 1, out
    assert chart.stat().st_size > 0
    assert elapsed < 30, f"verify with --plot took {elapsed:.1f} s under --timeout 30"
    assert max(len(line) for line in out.splitlines()) < 2200, "the name was cut where it was decoded"
    assert "more characters)" in out
