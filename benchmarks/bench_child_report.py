"""What the parent does with a child's report at the cap: read, format, write, in time and memory.

    python benchmarks/bench_child_report.py [--runs 3] [--comparisons 250000]

A sandboxed child (the tests' ``report_probe`` job) hands back a report of ``--comparisons``
comparisons (default ``MAX_COMPARISONS``: a third outputs, the rest engine boundaries with
their engines' own errors) and as many outputs for ``--save-outputs``. Timed ``--runs`` times:

* ``end to end``: ``report_of_child`` as ``verify`` calls it (the child builds and sends the
  report; this process reads it strictly and writes the outputs file);
* in this process, on the bytes the child sends: the JSON parse, the strict read
  (``VerifyReport.from_dict``), the text report, the JSON report, the strict read of the
  handed-back outputs and their ``--save-outputs`` file; their sum is the parent's share.

Prints the median of each and this process's peak resident memory (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def main() -> int:
    from trt_inline import isolation
    from trt_inline.verify.options import Isolation
    from trt_inline.verify.report import MAX_COMPARISONS, VerifyReport
    from trt_inline.verify.verifier import _handed_back, _outputs_of_child, report_of_child, save_tensors

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--comparisons", type=int, default=MAX_COMPARISONS)
    args = parser.parse_args()

    import torch
    from support import report_probe

    limits = isolation.Limits.for_file(__file__, 600, "4GiB")
    arguments = {"kind": "report", "comparisons": args.comparisons}
    document = report_probe.report_of(args.comparisons)
    header = json.dumps({"value": document}).encode()
    buffer = io.BytesIO()
    torch.save({"outputs": [torch.zeros(2) for _ in document["outputs"]]}, buffer)
    handed = buffer.getvalue()
    sizes = f"a report of {len(header) / 2**20:.1f} MiB, outputs of {len(handed) / 2**20:.1f} MiB"
    print(f"{args.comparisons} comparisons: {sizes}")

    times: dict[str, list[float]] = {}

    def timed(name: str, step: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        value = step()
        times.setdefault(name, []).append(time.perf_counter() - start)
        return value

    with tempfile.TemporaryDirectory() as folder:
        saved = Path(folder) / "outputs.pt"
        for _ in range(args.runs):
            request = report_probe.ReportRequest(arguments, keep_outputs=True)
            timed("end to end (child and parent)", lambda request=request: save_tensors(report_of_child(
                request, None, limits, where="at_cap.pt2", files=(), isolation=Isolation(),
            )[1].outputs, saved))  # fmt: skip
            parsed = timed("parse the JSON", lambda: json.loads(header))
            report = timed("read it strictly", lambda parsed=parsed: VerifyReport.from_dict(parsed["value"]))
            timed("text report", report.to_text)
            timed("JSON report", report.to_json)
            kept = timed("read the outputs strictly", lambda: _handed_back(handed, "at_cap.pt2"))
            timed("write --save-outputs", lambda kept=kept: save_tensors(_outputs_of_child(kept, "at_cap.pt2"), saved))
    parent = sum(statistics.median(values) for name, values in times.items() if not name.startswith("end"))
    for name, values in times.items():
        print(f"  {name:<32} median {statistics.median(values):6.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"  {'the parent in all':<32} median {parent:6.2f} s (the sum of the medians above)")
    print(
        f"  peak resident memory of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
