"""What a parent does with a child's report is bounded: read strictly, at most MAX_COMPARISONS comparisons, a
report no larger than a sixteenth of the child's memory limit, nothing the child sends raising anything but one
line naming the file.

The child here is :mod:`report_probe`, registered as a job for the length of a test: it sends what code that ran in
the child could (reports at the cap and past it, nested, mistyped). The two at the cap take most of a minute: they
run with ``--memory`` (.ci/run). ``benchmarks/bench_child_report.py`` times the parent's side at the cap.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from support.report_probe import ReportRequest, comparison, report_of

from trt_inline import isolation
from trt_inline.errors import IsolationError, VerifyInputError
from trt_inline.verify.options import Isolation
from trt_inline.verify.report import MAX_COMPARISONS, VerifyReport
from trt_inline.verify.verifier import report_of_child, save_tensors


@pytest.fixture
def probe() -> None:
    """(The probe's job is registered where it is defined: importing report_probe did.)"""


def _from_child(arguments: dict[str, Any], *, memory: str = "2GiB", save_outputs: Path | None = None) -> VerifyReport:
    limits = isolation.Limits.for_file(__file__, 120, memory)
    request = ReportRequest(arguments, keep_outputs=save_outputs is not None)
    report, handed = report_of_child(request, None, limits, where="at_cap.pt2", files=(), isolation=Isolation())
    if save_outputs is not None:
        save_tensors(handed.outputs, save_outputs)
    return report


@pytest.mark.memory
def test_a_report_at_the_cap_is_read_formatted_and_written(probe: None, tmp_path: Path) -> None:
    """A child's report of MAX_COMPARISONS comparisons (a third outputs, the rest boundaries): every one read back,
    the text and JSON made, every output it hands back written for --save-outputs."""
    saved = tmp_path / "outputs.pt"
    report = _from_child({"kind": "report", "comparisons": MAX_COMPARISONS}, save_outputs=saved)
    counted = len(report.outputs) + sum(len(row.values) + len(row.own or ()) for row in report.boundaries)
    assert counted == MAX_COMPARISONS and report.ok
    assert report.to_text().count("\n") > 2 * len(report.outputs) + len(report.boundaries)
    assert len(json.loads(report.to_json())["outputs"]) == len(report.outputs)
    assert len(torch.load(saved, weights_only=True)) == len(report.outputs)


@pytest.mark.memory
def test_a_report_past_the_cap_is_one_line(probe: None) -> None:
    with pytest.raises(IsolationError, match=f"malformed report .*more than {MAX_COMPARISONS} comparisons"):
        _from_child({"kind": "report", "comparisons": MAX_COMPARISONS + 1})


def test_a_report_past_a_sixteenth_of_the_memory_limit_is_refused_unread(probe: None) -> None:
    """At 512 MiB of memory the report may be 32 MiB: one of a hundred thousand comparisons (about 34 MiB) is
    refused before it is parsed, naming the limit that raises it."""
    with pytest.raises(IsolationError, match=r"report is 3\d\.\d+ MiB, more than 32 MiB .*--memory-limit raises it"):
        _from_child({"kind": "report", "comparisons": 100_000}, memory="512MiB")


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [("nested", "exited with status 0 and no result"), ("mistyped", "outputs[0].max_abs_diff: a str, not a number")],
)
def test_a_malformed_report_is_one_line(probe: None, kind: str, fragment: str) -> None:
    with pytest.raises(IsolationError) as info:
        _from_child({"kind": kind})
    message = str(info.value)
    assert message.startswith("at_cap.pt2: ") and fragment in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("answer", "error", "fragment"),
    [
        ({"value": None, "peak_rss": "lots"}, IsolationError, "malformed answer (peak_rss: a str, not an integer)"),
        ({"value": None, "base_rss": -1}, IsolationError, "malformed answer (base_rss: -1, not at least 0)"),
        ({"value": None, "exit": 0}, IsolationError, "malformed answer (exit: no such field of Answer)"),
        ({"error": ["IsolationError"], "message": "m"}, IsolationError, "malformed answer (error: a list, not text"),
        # (an error of a kind the parent does not know is unusable input, its message escaped on one line)
        ({"error": "SystemExit", "message": "\x1b[2Jgone\nPASS"}, VerifyInputError, "at_cap.pt2: \\x1b[2Jgone\\nPASS"),
    ],
)
def test_the_answer_around_a_report_is_read_strictly(
    probe: None, answer: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    """What the child answers with around its report (its memory figures, the sandbox, an error) is read by the one
    decoder of messages too: anything but an answer is one line naming the file, never a figure or a crash."""
    with pytest.raises(error) as info:
        _from_child({"kind": "answer", "answer": answer})
    message = str(info.value)
    assert type(info.value) is error and message.startswith("at_cap.pt2: ") and fragment in message, message
    assert "\n" not in message and "\x1b" not in message


def _run(**change: Any) -> dict[str, Any]:
    """A random run as a child writes one, with ``change``."""
    return {"iteration": 0, "sizes": [[1]], "symbols": {}, "ok": True, "problem": None, **change}


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda d: d["outputs"][0].update(ok="yes"), "outputs[0].ok: a str, not true or false"),
        (lambda d: d["outputs"][0].update(index=True), "outputs[0].index: true or false, not an integer"),
        (lambda d: d["outputs"][0].update(shape=[1] * 65), "outputs[0].shape: 65 items, more than 64"),
        (lambda d: d["outputs"][0].update(extra=1), "outputs[0].extra: no such field of OutputComparison"),
        (lambda d: d.update(problems=[["nested"]]), "problems[0]: a list, not text"),
        (lambda d: d["boundaries"][0].update(engine=2**70), "boundaries[0].engine: an integer of more than 64 bits"),
        (
            lambda d: d.update(divergence={"kind": "engine", "where": 1, "detail": ""}),
            "divergence.where: an int, not text",
        ),
        (lambda d: d.update(random_runs=[_run(ok=1)]), "random_runs[0].ok: an int, not true or false"),
        (lambda d: d.update(random_runs=[_run(sizes=[[]] * 257)]), "random_runs[0].sizes: 257 items, more than 256"),
        (lambda d: d.update(random_runs=[_run(sizes=[[1] * 65])]), "random_runs[0].sizes[0]: 65 items, more than 64"),
        (
            lambda d: d.update(notes=[""] * 10_001, random_runs=[_run()] * 10_001),
            "random_runs: 10001 items, more than 10000",
        ),
    ],
)
def test_each_field_is_read_as_its_type(change: Any, fragment: str) -> None:
    document = report_of(9)
    change(document)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        VerifyReport.from_dict(document)


def test_strings_are_escaped_and_cut() -> None:
    document = report_of(3)
    document["problems"] = ["\x1b[2Jcleared " + "x" * 5000]
    document["outputs"][0]["problem"] = "\r\nforged line"
    report = VerifyReport.from_dict(document)
    assert "\x1b" not in report.problems[0] and len(report.problems[0]) < 2100
    assert "\n" not in (report.outputs[0].problem or "")
    assert json.loads(report.to_json())["problems"] == report.problems  # what it writes is what it read
    assert comparison(0)["finite_count"] == report.outputs[0].finite_count
