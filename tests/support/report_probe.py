"""Jobs that hand back what a hostile child could: a report at (or past) the parent's caps, or malformed.

Reachable only from the tests and ``benchmarks/bench_child_report.py``, which run :func:`report` (a job registered
for :class:`ReportRequest`) in a child. The child computes nothing: it builds the report a file's
code could make it send, so that the parent's side (reading, formatting, writing) is what is measured.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from trt_inline.codec import wire
from trt_inline.isolation import job
from trt_inline.verify.options import Trust
from trt_inline.verify.pipeline import Keep
from trt_inline.verify.report import VerifyReport


def comparison(index: int) -> dict[str, Any]:
    return {
        "index": index, "shape": [2, 3, 8, 8], "dtype": "float32", "max_abs_diff": 1e-5, "max_rel_diff": 2e-5,
        "atol": 1e-4, "rtol": 1e-4, "ok": True, "problem": None, "mean_abs_diff": 1e-6, "median_abs_diff": 1e-6,
        "p99_abs_diff": 1e-5, "cosine_similarity": 0.999999, "nan_count": 0, "inf_count": 0, "finite_count": 384,
    }  # fmt: skip


def report_of(comparisons: int) -> dict[str, Any]:
    """A report of ``comparisons`` comparisons: a third outputs, the rest engine boundaries (values and own)."""
    outputs = comparisons // 3
    engines = (comparisons - outputs) // 2
    document = VerifyReport(source="at_cap.pt2", expected_source="embedded").to_dict()
    document["outputs"] = [comparison(i) for i in range(outputs + (comparisons - outputs) % 2)]
    document["boundaries"] = [
        {"boundary": f"engine {i} (_run_on_acc_{i}) outputs", "engine": i, "values": [comparison(0)],
         "own": [comparison(0)], "own_problem": None}
        for i in range(engines)
    ]  # fmt: skip
    return document


@dataclass(frozen=True)
class ReportRequest:
    """What the probe is to hand back (plain data: a test's), what it may do, and whether it hands back outputs."""

    arguments: dict[str, Any] = field(default_factory=dict, metadata=wire(unread=True))
    trust: Trust = field(default_factory=Trust)
    keep_outputs: bool = False

    def keep(self) -> Keep:
        return Keep(outputs=self.keep_outputs)


@job(ReportRequest, response=VerifyReport)
def report(request: ReportRequest, tensors: Any) -> Any:
    """``kind``: ``report`` (``comparisons`` of them, and as many outputs handed back for ``--save-outputs``),
    ``nested`` (a report nested a hundred thousand deep, written raw), ``mistyped`` (a diff given as text),
    ``answer`` (``answer``, written raw as the child's whole answer)."""
    arguments = request.arguments
    kind = arguments["kind"]
    if kind == "answer":  # an answer as code in the child could write it in place of the one the child writes
        with open(3, "wb", closefd=False) as out:
            out.write(json.dumps(arguments["answer"]).encode() + b"\n")
        os._exit(0)
    if kind == "nested":
        depth = 100_000
        raw = b'{"value": ' + b"[" * depth + b"]" * depth + b"}\n"
        with open(3, "wb", closefd=False) as out:
            out.write(raw)
        os._exit(0)
    document = report_of(int(arguments.get("comparisons", 3)))
    if kind == "mistyped":
        document["outputs"][0]["max_abs_diff"] = "0"
    if request.keep_outputs:
        return document, {"outputs": [torch.zeros(2) for _ in document["outputs"]]}
    return document


def json_size(comparisons: int) -> int:
    return len(json.dumps(report_of(comparisons)))
