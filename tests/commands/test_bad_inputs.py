"""Broken files and misuse: each gets its exit code and message, never an unhandled exception or a traceback.

The CLI runs in-process here (``trt_inline.cli.main``), so the table stays fast;
``test_verify.py`` checks the same contract across a real process boundary.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support.hostile import tampered_reference_io, torchscript_archive, truncated
from support.models import ConvBnRelu
from support.programs import SavedSeed

import trt_inline
from trt_inline import cli, reference


@dataclass
class Files:
    root: Path
    good: Path
    bare: Path
    x: torch.Tensor
    compiled: torch.fx.GraphModule

    def data(self, name: str, value: object) -> str:
        path = self.root / name
        torch.save(value, path)
        return str(path)

    def written(self, name: str, content: bytes) -> str:
        path = self.root / name
        path.write_bytes(content)
        return str(path)


@pytest.fixture(scope="module")
def files(saved_seed: SavedSeed) -> Files:
    return Files(saved_seed.root, saved_seed.good, saved_seed.bare, saved_seed.x, saved_seed.compiled)


def _truncated(fraction: float) -> Callable[[Files], list[str]]:
    return lambda f: [str(truncated(f.good, f.root / f"truncated_{fraction}.pt2", fraction))]


def _zip_not_a_program(f: Files) -> list[str]:
    path = f.root / "other.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/notes.txt", "not a model")
    return [str(path)]


def _torchscript(f: Files) -> list[str]:
    return [str(torchscript_archive(f.root / "script.pt"))]


def _tampered(f: Files) -> list[str]:
    return [str(tampered_reference_io(f.good, f.root / "tampered.pt2", f.root / "exploited"))]


def _with_inputs(name: str, inputs: Callable[[Files], object]) -> Callable[[Files], list[str]]:
    def make(f: Files) -> list[str]:
        with torch.no_grad():
            expected = list(f.compiled(f.x))
        return [
            str(f.good),
            "--inputs",
            f.data(f"{name}_in.pt", inputs(f)),
            "--expected",
            f.data(f"{name}_out.pt", expected),
        ]

    return make


# (case, arguments after "verify", exit code, fragment of the one stderr line)
VERIFY_CASES: list[tuple[str, Callable[[Files], list[str]], int, str]] = [
    ("missing path", lambda f: [str(f.root / "nope.pt2")], 2, "no such file"),
    ("directory", lambda f: [str(f.root)], 2, "is a directory"),
    ("empty file", lambda f: [f.written("empty.pt2", b"")], 2, "empty file"),
    ("random bytes", lambda f: [f.written("random.pt2", os.urandom(8192))], 2, "not a zip archive"),
    ("truncated 10%", _truncated(0.1), 2, "not a zip archive"),
    ("truncated 50%", _truncated(0.5), 2, "not a zip archive"),
    ("truncated 90%", _truncated(0.9), 2, "not a zip archive"),
    ("truncated 99.9%", _truncated(0.999), 2, "not a zip archive"),
    ("zip that is not a program", _zip_not_a_program, 2, "a zip archive without an ExportedProgram"),
    ("TorchScript archive", _torchscript, 2, "a TorchScript archive"),
    ("no reference I/O", lambda f: [str(f.bare)], 3, "comparing outputs needs --inputs FILE --expected FILE"),
    ("tampered reference I/O", _tampered, 2, "embedded reference I/O refused"),
    ("inputs without expected", lambda f: [str(f.good), "--inputs", f.data("in.pt", [f.x])], 3, "give the expected"),
    ("expected without inputs", lambda f: [str(f.good), "--expected", f.data("out.pt", [f.x])], 2, "needs --inputs"),
    (
        "inputs file missing",
        lambda f: [str(f.good), "--inputs", "missing.pt", "--expected", "missing.pt"],
        2,
        "no such file",
    ),
    (
        "inputs not tensors",
        lambda f: [str(f.good), "--inputs", f.data("s.pt", "x"), "--expected", f.data("e.pt", [f.x])],
        2,
        "an inputs file holds",
    ),
    (
        "wrong number of inputs",
        _with_inputs("two", lambda f: [f.x, f.x]),
        2,
        "does not accept the given inputs: it takes 1 input (x), given 2",
    ),
    (
        "wrong shape",
        _with_inputs("shape", lambda f: [torch.randn(2, 5, 8, 8)]),
        2,
        "does not accept the given inputs: input 0 (x) is float32[2, 3, 8, 8], given float32[2, 5, 8, 8]",
    ),
    (
        "wrong dtype",
        _with_inputs("dtype", lambda f: [f.x.to(torch.int64)]),
        2,
        "does not accept the given inputs: input 0 (x) is float32[2, 3, 8, 8], given int64[2, 3, 8, 8]",
    ),
    (
        "wrong expected outputs",
        lambda f: [str(f.good), "--inputs", f.data("i.pt", [f.x]), "--expected", f.data("o.pt", [f.x])],
        1,
        "",
    ),
]


@pytest.mark.parametrize(("case", "make_args", "code", "fragment"), VERIFY_CASES, ids=[c[0] for c in VERIFY_CASES])
def test_verify_bad_input(
    files: Files,
    case: str,
    make_args: Callable[[Files], list[str]],
    code: int,
    fragment: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(files.root)
    args = make_args(files)
    capsys.readouterr()
    assert cli.main(["verify", *args]) == code, case
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    if code in (2, 3):  # (unusable input; UNVERIFIED: nothing compared, what to give said on stderr)
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0], captured.err
        assert code == 2 or lines[0].startswith("trt-inline verify: UNVERIFIED: "), lines
    else:
        assert "problem: output 0 is float32[2, 4, 8, 8], expected float32[2, 3, 8, 8]" in captured.out
        assert "problem: the program returns 2 outputs, the reference 1" in captured.out
    assert not (files.root / "exploited.txt").exists()


def test_inspect_bad_input(files: Files, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", files.written("junk.pt2", b"junk")]) == 2
    junk = files.root / "junk.pt2"
    message = "not a zip archive (truncated, or not written by torch.export.save)"
    assert capsys.readouterr().err.strip() == f"trt-inline inspect: {junk}: {message}"


# Misuse of the API: (case, call, exception, message fragment)
API_CASES: list[tuple[str, Callable[[Files], object], type[Exception], str]] = [
    (
        "save a module that was never compiled",
        lambda f: trt_inline.save(ConvBnRelu(), f.root / "plain.pt2", arg_inputs=(f.x,)),
        trt_inline.SaveError,
        "takes the GraphModule returned by torch_tensorrt.dynamo.compile",
    ),
    (
        "retrace without inputs",
        lambda f: trt_inline.save(f.compiled, f.root / "r.pt2"),
        trt_inline.SaveError,
        "retrace=True re-exports the inlined graph and needs arg_inputs",
    ),
    (
        "save into a missing directory",
        lambda f: trt_inline.save(f.compiled, f.root / "no" / "where.pt2", arg_inputs=(f.x,)),
        trt_inline.SaveError,
        "does not exist",
    ),
    (
        "expected outputs without inputs",
        lambda f: trt_inline.verify(f.good, expected=[f.x]),
        trt_inline.VerifyInputError,
        "without the inputs they belong to",
    ),
    (
        "unknown fallback op name",
        lambda f: reference.compile(ConvBnRelu(), (f.x,), torch_executed_ops=["aten.relux.default"]),
        ValueError,
        "names no registered operator",
    ),
    ("min_block_size 0", lambda f: reference.compile(ConvBnRelu(), (f.x,), min_block_size=0), ValueError, "at least 1"),
]


@pytest.mark.parametrize(("case", "call", "error", "fragment"), API_CASES, ids=[c[0] for c in API_CASES])
def test_api_misuse(
    files: Files, case: str, call: Callable[[Files], object], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        call(files)
