"""``trt-inline fix --out FILE``: the build with the settings found compiled, saved and verified against the model
in fp32 (the save is :func:`trt_inline.save`, the verdict :func:`trt_inline.verify`'s)."""

from __future__ import annotations

from typing import Any

import torch

from trt_inline import export, progress
from trt_inline.fixing.builds import default_compile
from trt_inline.fixing.fix_report import FixReport, plain
from trt_inline.verify import verify
from trt_inline.verify.options import Tolerances

__all__ = ["save_verified"]


def save_verified(
    report: FixReport,
    module: torch.nn.Module,
    arg_inputs: tuple[Any, ...],
    tolerance: Tolerances,
    *,
    out: str,
    seed: int,
) -> tuple[dict[str, Any], str]:
    """The build with the report's settings compiled (from ``seed``), saved to ``out``, and verified against the
    model in fp32 within ``tolerance``: what ``--json`` says of it, and the line the text ends with."""
    if not report.works or report.interrupted:
        why = "the search was interrupted" if report.interrupted else "no set that works was found"
        return {"path": out, "status": None, "worst_error": None}, f"--out {out}: not written ({why})"
    progress.report(f"compiling with the settings found and saving the build to {out}")
    torch.manual_seed(seed)
    compiled = default_compile()(module, arg_inputs, **report.settings)
    export.save(compiled, out, arg_inputs=arg_inputs)
    with torch.no_grad():
        expected = module(*arg_inputs)
    verdict = verify(out, arg_inputs=list(arg_inputs), expected=expected, tolerances=tolerance)
    worst = max((output.max_abs_diff for output in verdict.outputs), default=0.0)
    line = f"{verdict.status} {out}: saved, and verified against the model in fp32 (worst error {worst:.3g})"
    return {"path": out, "status": verdict.status, "worst_error": plain(worst)}, line
