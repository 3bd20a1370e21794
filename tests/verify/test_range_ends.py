"""Runs at the ends of the dynamic ranges: a program wrong only at its declared maximum is caught.

The files are compiled with the reference backend (a fallback between two engines), declare a batch of
1 ... ``MAX`` and embed inputs of a batch in the middle (``EMBEDDED``). The faulty one differs from the good one
in its second engine, and only in the last row of a batch of ``MAX``: its embedded run is bit for bit right. Each
check that catches it is also run with ``range_ends="off"``, where it passes: it is the runs at the ends that see
it. Files are verified as a caller does, in the default sandboxed child, unless a test says otherwise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import trt_inline
from trt_inline import reference
from trt_inline.cli import main as cli_main
from trt_inline.errors import IsolationError, VerifyInputError
from trt_inline.verify import range_ends
from trt_inline.verify.compare import Criteria
from trt_inline.verify.pipeline import range_end_runs
from trt_inline.verify.report import VerifyReport
from trt_inline.verify.verifier import _compare_range_ends, _range_ends_of_child

MAX = 32
EMBEDDED = 8
WIDTH = 4


class LastRow(nn.Module):
    """``relu(x) * 2 + 1``, plus 1 in the rows at or past ``edge`` (none for an edge of ``MAX``): the good file's
    ``edge`` is ``MAX``, the faulty file's ``MAX - 1``, wrong in the last row of the largest batch alone."""

    def __init__(self, edge: int) -> None:
        super().__init__()
        self.edge = edge

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x)
        rows = (torch.arange(h.shape[0]) >= self.edge).unsqueeze(1).to(h.dtype)
        return h * 2.0 + 1.0 + rows


class NaNAtMax(nn.Module):
    """``x * 2``, NaN in the last row of a batch of ``MAX`` alone (the square root of -1 there, of -0 elsewhere)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = (torch.arange(x.shape[0]) >= MAX - 1).unsqueeze(1).to(x.dtype)
        return x * 2.0 + torch.sqrt(-last)


class Shared(nn.Module):
    """Inputs sharing a size: ``x`` and ``y`` of ``[batch, 4]``, ``z`` of ``[2 * batch]`` (a derived size)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x + y + z.view(x.shape[0], 2).sum(1, keepdim=True)


class GuardedShared(nn.Module):
    """:class:`Shared` with ``z.view(-1, 2)``: torch.export declares the batch 1 ... MAX and guards it ``!= 1``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x + y + z.view(-1, 2).sum(1, keepdim=True)


class Static(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2.0


def _batch(name: str = "batch", **bounds: int) -> Any:
    return torch.export.Dim(name, **bounds)


def _compiled_save(model: nn.Module, path: Path, inputs: tuple[torch.Tensor, ...], dynamic: Any) -> Path:
    compiled = reference.compile(model.eval(), inputs, dynamic_shapes=dynamic, torch_executed_ops=["aten.relu.default"])
    trt_inline.save(compiled, path, arg_inputs=list(inputs), dynamic_shapes=dynamic)
    return path


def _exported_save(model: nn.Module, path: Path, inputs: tuple[torch.Tensor, ...], dynamic: Any) -> Path:
    trt_inline.save(torch.export.export(model.eval(), inputs, dynamic_shapes=dynamic), path, arg_inputs=list(inputs))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("range_ends")
    x = torch.randn(EMBEDDED, WIDTH)
    batch = ({0: _batch(min=1, max=MAX)},)
    dim = _batch(min=1, max=MAX)
    return {
        "good": _compiled_save(LastRow(MAX), root / "good.pt2", (x,), batch),
        "faulty": _compiled_save(LastRow(MAX - 1), root / "faulty.pt2", (x,), batch),
        "nan": _exported_save(NaNAtMax(), root / "nan.pt2", (x,), batch),
        **{
            name: _exported_save(
                model,
                root / f"{name}.pt2",
                (x, torch.randn(EMBEDDED, WIDTH), torch.randn(2 * EMBEDDED)),
                ({0: dim}, {0: dim}, {0: 2 * dim}),
            )
            for name, model in (("shared", Shared()), ("guarded", GuardedShared()))
        },
        "static": _compiled_save(Static(), root / "static.pt2", (x,), None),
        "x": x,  # type: ignore[dict-item]
    }


def _ends(report: VerifyReport) -> dict[str, dict[str, Any]]:
    return {run["end"]: run for run in report.range_end_runs}


def _first_input(program: torch.export.ExportedProgram) -> torch.Tensor:
    """The declared value of the program's first user input."""
    name = program.graph_signature.user_inputs[0]
    return next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == name).meta["val"]


def _symbol(path: Path) -> str:
    """The size symbol of the file's first input's first dimension, as the report names it (``s0``, ``s77``)."""
    return str(_first_input(trt_inline.load(path)).shape[0].node.expr)


def test_the_files_declare_a_dynamic_batch_and_embed_a_middle_size(files: dict[str, Path]) -> None:
    for name in ("good", "faulty"):
        program = trt_inline.load(files[name])
        size = _first_input(program).shape[0]
        assert not isinstance(size, int), "the batch is dynamic"
        bounds = program.range_constraints[size.node.expr]
        assert (int(bounds.lower), int(bounds.upper)) == (1, MAX)
    # The faulty program differs at the maximum alone: the compiled modules agree at every other size.
    good, faulty = (trt_inline.load(files[name]).module() for name in ("good", "faulty"))
    for rows in (1, EMBEDDED, MAX - 1):
        x = torch.randn(rows, WIDTH)
        assert torch.equal(good(x), faulty(x)), rows
    x = torch.randn(MAX, WIDTH)
    assert not torch.equal(good(x), faulty(x))


def test_diff_fails_at_the_maximum_and_passes_without_the_ends(files: dict[str, Path]) -> None:
    report = trt_inline.diff(files["faulty"], files["good"])
    assert report.status == "FAIL", report.to_text()
    ends = _ends(report)
    assert ends["minimum"]["ok"] and ends["minimum"]["symbols"] == {_symbol(files["faulty"]): 1}
    assert not ends["maximum"]["ok"] and ends["maximum"]["sizes"] == [[MAX, WIDTH]] and ends["maximum"]["compared"]
    assert report.divergence is not None and report.divergence.where.startswith("engine 0 ("), report.to_text()
    assert report.boundaries_on.startswith("the maximum of its dynamic ranges")
    assert any(p.startswith("first divergence (the maximum of its dynamic ranges") for p in report.problems)
    assert all(o.ok for o in report.outputs), "the embedded inputs agree"
    off = trt_inline.diff(files["faulty"], files["good"], range_ends="off")
    assert off.status == "PASS" and not off.range_end_runs, off.to_text()


def test_expected_module_fails_at_the_maximum_in_the_child_and_in_this_process(files: dict[str, Path]) -> None:
    x, s = files["x"], _symbol(files["faulty"])
    for isolate in (True, False):
        report = trt_inline.verify(files["faulty"], expected_module=LastRow(MAX), arg_inputs=[x], isolate=isolate)
        assert report.status == "FAIL", report.to_text()
        ends = _ends(report)
        assert ends["minimum"]["ok"] and ends["minimum"]["compared"]
        assert not ends["maximum"]["ok"] and ends["maximum"]["compared"]
        assert "output 0 differs" in ends["maximum"]["problem"]
        (problem,) = report.problems
        assert problem.startswith(f"at the maximum of its dynamic ranges ({s}={MAX}; sizes [[{MAX}, {WIDTH}]])")
        assert "4 of 128 values differ, the first at [31, 0]" in problem, problem
        off = trt_inline.verify(
            files["faulty"], expected_module=LastRow(MAX), arg_inputs=[x], isolate=isolate, range_ends="off"
        )
        assert off.status == "PASS" and not off.range_end_runs, off.to_text()
    good = trt_inline.verify(files["good"], expected_module=LastRow(MAX), arg_inputs=[x])
    assert good.status == "PASS" and [run["ok"] for run in good.range_end_runs] == [True, True], good.to_text()


def test_without_a_reference_the_ends_are_checked_not_compared(files: dict[str, Path]) -> None:
    """The embedded reference holds outputs at the embedded inputs alone: at the ends the faulty file's values
    cannot be called wrong, and the report says so."""
    s = _symbol(files["faulty"])
    report = trt_inline.verify(files["faulty"])
    assert report.status == "PASS", report.to_text()
    assert [(run["end"], run["compared"]) for run in report.range_end_runs] == [("minimum", False), ("maximum", False)]
    (note,) = [n for n in report.notes if n.startswith("ran at the ends of the dynamic ranges")]
    assert f"({s} is x.shape[0]): the minimum {s}=1, the maximum {s}={MAX};" in note
    assert "not compared" in note and "trt-inline diff A B" in note
    assert f"the optimization point ({s}={EMBEDDED}) is the size of the reference inputs" in "\n".join(report.notes)


def test_expected_from_compares_the_ends_with_the_other_files_program(files: dict[str, Path]) -> None:
    """--expected-from a good save of the same model: its program runs on the same inputs at each end."""
    s = _symbol(files["faulty"])
    report = trt_inline.verify(files["faulty"], expected_from=files["good"])
    assert report.status == "FAIL", report.to_text()
    assert all(o.ok for o in report.outputs), "the embedded inputs agree"
    assert [(run["end"], run["ok"], run["compared"]) for run in report.range_end_runs] == [
        ("minimum", True, True), ("maximum", False, True)
    ]  # fmt: skip
    (problem,) = report.problems
    assert problem.startswith(f"at the maximum of its dynamic ranges ({s}={MAX}; sizes [[{MAX}, {WIDTH}]])"), problem
    assert "4 of 128 values differ, the first at [31, 0]" in problem, problem
    (note,) = [n for n in report.notes if n.startswith("ran at the ends of the dynamic ranges")]
    assert f"each compared with the program of {files['good']} on the same inputs" in note, note
    assert trt_inline.verify(files["faulty"], expected_from=files["good"], range_ends="off").status == "PASS"
    assert trt_inline.verify(files["good"], expected_from=files["good"]).status == "PASS"


def test_nan_at_the_maximum_fails_without_a_reference(files: dict[str, Path]) -> None:
    report = trt_inline.verify(files["nan"])
    assert report.status == "FAIL", report.to_text()
    (problem,) = report.problems
    assert problem.startswith(
        f"at the maximum of its dynamic ranges ({_symbol(files['nan'])}={MAX}; sizes [[{MAX}, {WIDTH}]])"
    )
    assert "NaN in output 0, where its outputs on the reference inputs have none" in problem
    assert any("output 0 has NaN on the inputs at the maximum" in w for w in report.warnings), report.warnings
    assert trt_inline.verify(files["nan"], range_ends="off").status == "PASS"


def test_inputs_sharing_a_size_run_at_consistent_sizes(files: dict[str, Path]) -> None:
    report = trt_inline.verify(files["shared"])
    assert report.status == "PASS", report.to_text()
    ends = _ends(report)
    assert ends["minimum"]["sizes"] == [[1, WIDTH], [1, WIDTH], [2]]
    assert ends["maximum"]["sizes"] == [[MAX, WIDTH], [MAX, WIDTH], [2 * MAX]]
    assert all(len(run["symbols"]) == 1 for run in report.range_end_runs)
    (note,) = [n for n in report.notes if n.startswith("ran at the ends")]
    s = _symbol(files["shared"])
    assert f"{s} is x.shape[0]; z.shape[0] is 2*{s}" in note, note


def test_a_program_whose_guard_rejects_its_declared_minimum_fails(files: dict[str, Path]) -> None:
    """torch.export writes ``batch: VR[1, MAX]`` and (torch 2.6+) a guard ``z.size()[0] // 2 != 1``: a caller's batch
    of 1, which the file declares, raises. The run at the minimum says so; the embedded run cannot. Where this
    torch writes no such guard (2.5), the batch of 1 runs and passes."""
    program = trt_inline.load(files["guarded"]).module()
    try:
        program(torch.ones(1, WIDTH), torch.ones(1, WIDTH), torch.ones(2))
        guarded = False
    except Exception:
        guarded = True
    report = trt_inline.verify(files["guarded"])
    if not guarded:
        assert report.status == "PASS" and _ends(report)["minimum"]["ok"], report.to_text()
        return
    assert report.status == "FAIL", report.to_text()
    (problem,) = report.problems
    assert problem.startswith(f"at the minimum of its dynamic ranges ({_symbol(files['guarded'])}=1; sizes ")
    assert "rejected inputs within its declared ranges" in problem and "Guard failed" in problem, problem
    assert _ends(report)["maximum"]["ok"]
    assert trt_inline.verify(files["guarded"], range_ends="off").status == "PASS"
    # diff: the guarded file against a good one fails there; a good one against it is not compared there.
    against = trt_inline.diff(files["guarded"], files["shared"])
    assert against.status == "FAIL" and not _ends(against)["minimum"]["ok"], against.to_text()
    assert "_guards_fn" in _ends(against)["minimum"]["problem"], against.to_text()  # (where the run stopped)
    reference = trt_inline.diff(files["shared"], files["guarded"])
    assert reference.status == "PASS" and list(_ends(reference)) == ["maximum"], reference.to_text()
    assert any(n.startswith("not compared at the minimum of its dynamic ranges") for n in reference.notes)


def test_a_static_program_runs_nothing_more_and_says_nothing(files: dict[str, Path]) -> None:
    report = trt_inline.verify(files["static"])
    off = trt_inline.verify(files["static"], range_ends="off")
    assert report.status == off.status == "PASS" and not report.range_end_runs
    assert report.notes[:-1] == off.notes[:-1] and not any("range" in n for n in report.notes), report.notes
    assert report.to_text().count("\n") == off.to_text().count("\n")


def test_an_optimization_point_the_file_records_runs_too(tmp_path: Path) -> None:
    """Traced at a batch of 16 (the hint its symbol carries, what Torch-TensorRT takes as opt), saved with inputs of
    8: the optimization point is a run of its own."""
    batch = _batch(min=1, max=MAX)
    program = torch.export.export(Static(), (torch.randn(16, WIDTH),), dynamic_shapes=({0: batch},))
    path = tmp_path / "opt.pt2"
    trt_inline.save(program, path, arg_inputs=[torch.randn(EMBEDDED, WIDTH)])
    report = trt_inline.verify(path, isolate=False)
    assert [(r["end"], r["sizes"]) for r in report.range_end_runs] == [
        ("minimum", [[1, WIDTH]]), ("maximum", [[MAX, WIDTH]]), ("optimization point", [[16, WIDTH]])
    ], report.to_text()  # fmt: skip


def test_an_open_range_is_capped_and_a_large_end_left_out_unless_asked(tmp_path: Path) -> None:
    x = torch.randn(EMBEDDED, WIDTH)
    open_ended = _exported_save(Static(), tmp_path / "open.pt2", (x,), ({0: _batch(min=2)},))
    report = trt_inline.verify(open_ended, isolate=False)
    s = _symbol(open_ended)
    assert _ends(report)["maximum"]["symbols"] == {s: 2 * EMBEDDED}
    assert f"{s} has no upper end in the file: its maximum was taken as {2 * EMBEDDED} (twice the reference" in (
        "\n".join(report.notes)
    )
    # 100,000 rows of 64 floats: 24.4 MiB, past 8 times the embedded 2 KiB and 4 MiB.
    wide = torch.randn(EMBEDDED, 64)
    large = _exported_save(Static(), tmp_path / "large.pt2", (wide,), ({0: _batch(min=1, max=100_000)},))
    report = trt_inline.verify(large, isolate=False)
    assert [run["end"] for run in report.range_end_runs] == ["minimum"], report.to_text()
    assert (
        f"not run at the maximum ({_symbol(large)}=100000): its inputs would take 24.4 MiB, more than 8 times the "
        "reference inputs' 2 KiB and more than 4 MiB; range_ends='all' runs it"
    ) in report.notes
    forced = trt_inline.verify(large, isolate=False, range_ends="all")
    assert [run["end"] for run in forced.range_end_runs] == ["minimum", "maximum"] and forced.ok


def test_the_json_report_holds_each_run_read_strictly(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["verify", str(files["nan"]), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert [run["end"] for run in document["range_end_runs"]] == ["minimum", "maximum"]
    assert VerifyReport.from_dict(document).range_end_runs == document["range_end_runs"]
    run = document["range_end_runs"][0]
    for change, fragment in (
        ({"end": "middle"}, "range_end_runs[0].end: not one of 'minimum', 'maximum', 'optimization point'"),
        ({"compared": 1}, "range_end_runs[0].compared: an int, not true or false"),
        ({"sizes": [[1.5]]}, "range_end_runs[0].sizes[0][0]: a float, not an integer"),
        ({"symbols": {"s0": "1"}}, "range_end_runs[0].symbols.s0: a str, not an integer"),
        ({"extra": 1}, "range_end_runs[0].extra: no such field of RangeEndRun"),
    ):
        with pytest.raises(ValueError, match=re.escape(fragment)):
            VerifyReport.from_dict({**document, "range_end_runs": [{**run, **change}]})
    with pytest.raises(ValueError, match="range_end_runs: 4 items, more than 3"):
        VerifyReport.from_dict({**document, "range_end_runs": [run] * 4})


def test_what_a_child_hands_back_for_the_module_is_checked(files: dict[str, Path]) -> None:
    x = files["x"]
    good = {"index": 0, "args": [torch.randn(MAX, WIDTH)], "kwargs": {}, "outputs": [torch.zeros(MAX, WIDTH)]}
    assert _range_ends_of_child({"range_ends": [good]}, "f.pt2") == [good]
    for bad in ([{**good, "args": ["text"]}], [{**good, "index": "0"}], [good] * 4, {"0": good}):
        with pytest.raises(IsolationError, match=r"f\.pt2: the child process handed back runs at the ends"):
            _range_ends_of_child({"range_ends": bad}, "f.pt2")
    run = {"end": "maximum", "sizes": [[MAX, WIDTH]], "symbols": {"s0": MAX}, "ok": True, "problem": None,
           "compared": False}  # fmt: skip
    unlike = (
        {**good, "args": [torch.randn(MAX, WIDTH, dtype=torch.float64)]},  # another dtype
        {**good, "args": [torch.randn(MAX)]},  # another rank
        {**good, "index": 1},  # no such run
        {**good, "args": [torch.randn(1 << 20, WIDTH)]},  # past the cost rule
        {**good, "kwargs": {"y": torch.randn(1)}},  # an input not given
    )
    for entry in unlike:
        with pytest.raises(IsolationError, match="unlike the given inputs"):
            _compare_range_ends(VerifyReport("f.pt2", range_end_runs=[dict(run)]), [entry], LastRow(MAX), ([x], {}),
                                "auto", Criteria(), where="f.pt2")  # fmt: skip
    report = VerifyReport("f.pt2", range_end_runs=[dict(run)])
    _compare_range_ends(report, [good], LastRow(MAX), ([x], {}), "auto", Criteria(), where="f.pt2")
    assert report.range_end_runs[0]["compared"] and not report.range_end_runs[0]["ok"] and report.problems


def test_a_rank_file_makes_no_runs_at_the_ends_and_says_why(files: dict[str, Path]) -> None:
    """Every rank of a set would have to make the same runs (collectives inside engines run together): none."""
    program = trt_inline.load(files["good"])
    module = program.module()
    baseline = [module(files["x"])]
    reports = {}
    for rank_file in (True, False):
        reports[rank_file] = report = VerifyReport("good.pt2", expected_source="embedded")
        range_end_runs(report, program, module, ([files["x"]], {}), "auto", 0, None, baseline, None, Criteria(), [],
                       rank_file=rank_file)  # fmt: skip
    alone = reports[False]
    assert [run["ok"] for run in alone.range_end_runs] == [True, True] and not alone.problems, alone.to_text()
    assert alone.notes[-1].startswith("ran at the ends of the dynamic ranges")
    assert not reports[True].range_end_runs and reports[True].notes == [
        "not run at the ends of its dynamic ranges: the file is one rank of a rank set, whose ranks would all have to "
        "make the same runs"
    ]


def test_an_unknown_mode_is_one_line(files: dict[str, Path]) -> None:
    with pytest.raises(VerifyInputError, match=r"^range_ends is one of auto, all, off, got 'sometimes'$"):
        trt_inline.verify(files["good"], range_ends="sometimes")
    with pytest.raises(VerifyInputError, match="range_ends is one of"):
        range_ends.plan(trt_inline.load(files["good"]), None, 0, "max")
