"""Running a program on reference inputs and comparing its outputs, leaving no process state behind."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from trt_inline.errors import VerifyInputError, first_line
from trt_inline.verify.report import OutputComparison, describe_value

__all__ = ["compare_output", "default_tolerance", "isolated_run", "run_on"]

_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for a dtype: exact for integers and booleans."""
    return _TOLERANCES.get(dtype, (0.0, 0.0))


@contextlib.contextmanager
def isolated_run() -> Iterator[None]:
    """Deterministic algorithms and a fixed seed inside; the caller's RNG and flags exactly as before after.

    A max-diff check must be reproducible run to run, so verification runs with
    ``torch.use_deterministic_algorithms(True, warn_only=True)`` and seed 0, and
    restores the caller's global RNG state (CPU and every CUDA device) and the
    deterministic flags on the way out, also when the run raises.
    """
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    mode = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=devices):
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            torch.manual_seed(0)
            yield
        finally:
            torch.use_deterministic_algorithms(mode, warn_only=warn_only)


def run_on(
    module: Callable[..., Any],
    args: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    device: str | None,
) -> list[Any]:
    """Run ``module`` on the inputs (moved to ``device`` if given) in :func:`isolated_run`; flat outputs."""
    if device is not None:
        if isinstance(module, torch.nn.Module):
            module = module.to(device)
        args = [a.to(device) for a in args]
        kwargs = {k: v.to(device) for k, v in kwargs.items()}
    try:
        with isolated_run(), torch.no_grad():
            outputs = module(*args, **kwargs)
    except Exception as exc:
        raise VerifyInputError(
            f"the program does not accept the reference inputs ({type(exc).__name__}: {first_line(exc)})"
        ) from exc
    return list(pytree.tree_leaves(outputs))


def compare_output(
    index: int, actual: Any, expected: torch.Tensor, atol: float | None, rtol: float | None
) -> OutputComparison:
    """One output against its reference: max abs / rel diff, and whether it is within tolerance."""
    default_atol, default_rtol = default_tolerance(expected.dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    shape, dtype = list(expected.shape), str(expected.dtype).removeprefix("torch.")

    def mismatch(problem: str) -> OutputComparison:
        return OutputComparison(index, shape, dtype, float("inf"), float("inf"), atol, rtol, False, problem)

    if isinstance(actual, (bool, int, float)) and expected.dim() == 0:
        actual = torch.tensor(actual, dtype=expected.dtype)  # a scalar output, kept as a 0-d tensor
    if not isinstance(actual, torch.Tensor):
        return mismatch(f"output {index} is a {type(actual).__name__}")
    actual = actual.detach().cpu()
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return mismatch(f"output {index} is {describe_value(actual)}, expected {describe_value(expected)}")
    if expected.numel() == 0:
        return OutputComparison(index, shape, dtype, 0.0, 0.0, atol, rtol, True)
    a, e = actual.double(), expected.double()
    diff = (a - e).abs()
    nan_mismatch = bool((a.isnan() != e.isnan()).any())
    diff = torch.where(a.isnan() & e.isnan(), torch.zeros_like(diff), diff)
    max_abs = float(diff.max())
    max_rel = float((diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)).max())
    ok = not nan_mismatch and bool((diff <= atol + rtol * e.abs()).all())
    problem = None
    if not ok:
        problem = f"output {index} differs: max abs diff {max_abs:.6g}, max rel diff {max_rel:.6g}"
        problem += f" (atol {atol:g}, rtol {rtol:g})"
    return OutputComparison(index, shape, dtype, max_abs, max_rel, atol, rtol, ok, problem)
