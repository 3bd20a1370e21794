"""Verdicts as a JUnit XML report (``verify --junit FILE``, ``diff --junit FILE``): what CI systems display.

One ``<testsuite>`` per run of the command, one ``<testcase>`` per file and case (``model.pt2 [cat]``; a file on
its own reference I/O is named by the file alone). A case that fails has a ``<failure>`` per output that differs
(its error, SQNR, cosine similarity and top-k agreement), per engine boundary that differs (outside the program's
outputs, which the outputs already are), and per other problem (a structural one, the first divergence); one
that is ``UNVERIFIED`` is ``<skipped>``; one that could not be verified is an ``<error>``. The whole report text is
the case's ``<system-out>``.

Report strings come from files and child processes: ElementTree escapes markup, and the characters XML 1.0 cannot
hold at all (controls, surrogates, U+FFFE/U+FFFF) are removed. The file is written atomically.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from trt_inline.formats import atomic_write
from trt_inline.verify.cases import CaseResult
from trt_inline.verify.report import BoundaryRow, OutputComparison, VerifyReport

__all__ = ["junit_xml", "write_junit"]

# Everything outside XML 1.0's Char production: #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF].
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# An attribute holds one line of a failure: its message; the element's text holds the rest.
_MESSAGE_LIMIT = 1000


def _text(value: str, limit: int | None = None) -> str:
    clean = _NOT_XML.sub("", value)
    return clean if limit is None or len(clean) <= limit else f"{clean[:limit]}..."


def _output_failure(output: OutputComparison) -> tuple[str, str]:
    """(message, details) of an output that differs."""
    details = [output.problem or f"output {output.index} differs", output.statistics_text()]
    if (ranking := output.top_k_text()) is not None:
        details.append(ranking)
    return f"output {output.index}: {output.error_text()}, {output.sqnr_text()}", "\n".join(details)


def _boundary_failure(row: BoundaryRow) -> tuple[str, str]:
    """(message, details) of an engine boundary that differs: in the run, or its engine run alone."""
    bad = [value for value in row.values if not value.ok]
    own = [value for value in row.own or [] if not value.ok]
    parts = [f"{'value' if len(bad) == 1 else 'values'} {', '.join(str(v.index) for v in bad)} differ"] if bad else []
    if own:
        parts.append(f"its engine run alone on its recorded inputs: max abs diff {BoundaryRow.worst(own):.6g}")
    details = [
        f"{where}value {value.index}: {value.problem or value.error_text()}; {value.statistics_text()}"
        for where, values in (("", bad), ("run alone, ", own))
        for value in values
    ]
    return f"{row.boundary}: {'; '.join(parts)}", "\n".join(details)


def _details(report: VerifyReport, problem: str) -> str:
    """A problem's details; the first divergence's are its whole text: why, and what it is in the model (its
    modules and source lines, where the file records them)."""
    if report.divergence is not None and problem.startswith("first divergence"):
        return f"{problem}\n{report.divergence.to_text()}"
    return problem


def _failures(report: VerifyReport) -> list[tuple[str, str, str]]:
    """(kind, message, details) of every failure of a report: each output, boundary and other problem."""
    failures = [("output", *_output_failure(output)) for output in report.outputs if not output.ok]
    program_outputs = bool(report.outputs)  # (then the row of program outputs holds these same comparisons)
    failures += [
        ("boundary", *_boundary_failure(row))
        for row in report.boundaries
        if not (row.ok and row.own_ok)
        and not (program_outputs and row.engine is None and row.boundary == "program outputs")
    ]
    said = {output.problem for output in report.outputs if not output.ok}
    failures += [("problem", problem, _details(report, problem)) for problem in report.problems if problem not in said]
    if not failures and report.status == "FAIL":  # (a verdict never fails without a failure to show)
        failures.append(("problem", "the report failed", report.to_text()))
    return failures


def _case(result: CaseResult, classname: str) -> ET.Element:
    case = ET.Element("testcase", name=_text(result.name), classname=classname, time=f"{result.seconds:.3f}")
    report = result.report
    if report is None:
        error = ET.SubElement(case, "error", message=_text(result.error or "", _MESSAGE_LIMIT), type="error")
        error.text = _text(result.error or "")
        return case
    if report.status == "UNVERIFIED":
        why = next((note for note in report.notes if "not compared" in note), "outputs were not compared")
        ET.SubElement(case, "skipped", message=_text(why, _MESSAGE_LIMIT))
    elif report.status == "FAIL":
        for kind, message, details in _failures(report):
            failure = ET.SubElement(case, "failure", message=_text(message, _MESSAGE_LIMIT), type=kind)
            failure.text = _text(details)
    ET.SubElement(case, "system-out").text = _text(report.to_text())
    return case


def junit_xml(results: Sequence[CaseResult], suite: str) -> ET.Element:
    """The ``<testsuites>`` document of one run: one ``<testsuite>`` named ``suite``, a ``<testcase>`` per result."""
    statuses = [result.status for result in results]
    seconds = sum(result.seconds for result in results)
    counts = {
        "tests": str(len(results)),
        "failures": str(statuses.count("FAIL")),
        "errors": str(statuses.count("ERROR")),
        "skipped": str(statuses.count("UNVERIFIED")),
        "time": f"{seconds:.3f}",
    }
    root = ET.Element("testsuites", {"name": _text(suite), **counts})
    stamp = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    testsuite = ET.SubElement(root, "testsuite", {"name": _text(suite), "timestamp": stamp, **counts})
    classname = _text(suite.replace(" ", "."))
    testsuite.extend(_case(result, classname) for result in results)
    return root


def write_junit(path: str | os.PathLike[str], results: Sequence[CaseResult], suite: str) -> None:
    """Write :func:`junit_xml` of ``results`` to ``path`` (UTF-8, atomically: a CI job never reads half a file)."""
    tree = ET.ElementTree(junit_xml(results, suite))
    ET.indent(tree)
    with atomic_write(Path(path)) as tmp:
        tree.write(tmp, encoding="utf-8", xml_declaration=True)
