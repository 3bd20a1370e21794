"""One build with a set changed, measured: the compile used, its settings, its error per case, its partition.

:func:`default_compile` is ``torch_tensorrt.dynamo.compile`` where it imports and CUDA runs, the reference
backend otherwise (on the importable release's own pipeline, or trt-inline's own emulation of the release this
torch pairs with: :mod:`trt_inline.reference`). :func:`settings_with` adds a set to the user's settings
(``autocast_excluded_nodes``, each module path anchored and escaped, or ``torch_executed_ops``, each operator by
the name the releases compare), :func:`compile_call` writes them as the call to paste, and :func:`measure`
compiles with them and compares every case.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from trt_inline.engines import is_accelerated_call, is_fallback_call
from trt_inline.errors import VerifyInputError
from trt_inline.fixing.build_cases import HeldCase, flat_tensors
from trt_inline.fixing.fix_report import BuildShape, settings_arguments
from trt_inline.reference.lowered import LOWERED_ATTRIBUTE, LoweredNode
from trt_inline.reference.release import PIPELINE_ATTRIBUTE
from trt_inline.verify.options import Tolerances

__all__ = [
    "Compile", "Measured", "compile_call", "default_compile", "is_tensorrt", "measure", "pattern", "rehearsal_table",
    "rehearsed", "release_call", "settings_with",
]  # fmt: skip

Compile = Callable[..., torch.nn.Module]
# How the call to paste names each compile this module picks (any other by its module and name).
_TENSORRT_CALL = "torch_tensorrt.dynamo.compile"
_REFERENCE_CALL = "trt_inline.reference.compile"


@dataclass(frozen=True)
class Measured:
    """A build's worst max abs error per case (inf for a NaN or Inf where the expected value is finite), whether
    each case is within tolerance, its partition, the nodes it lowered (None where the compile does not say:
    :mod:`trt_inline.reference.lowered`) and which pipeline built it (``""`` where it does not say)."""

    errors: tuple[float, ...]
    ok: tuple[bool, ...]
    shape: BuildShape
    lowered: tuple[LoweredNode, ...] | None = None
    pipeline: str = ""
    # Outputs the build returns in a narrower floating dtype than the model (``"output 0 is float16"``), compared
    # widened to the model's.
    narrowed: tuple[str, ...] = ()
    # Outputs within tolerance that collapsed where the model's did not (``"case x: output 0 is all zeros"``): out
    # of tolerance all the same (:func:`~trt_inline.verify.compare.collapse_warnings`).
    collapsed: tuple[str, ...] = ()

    @property
    def passes(self) -> bool:
        return all(self.ok)

    @property
    def worst(self) -> float:
        return max(self.errors, default=0.0)


def default_compile() -> Compile:
    """``torch_tensorrt.dynamo.compile`` where it imports and CUDA runs; else the reference backend."""
    if torch.cuda.is_available():
        try:
            import torch_tensorrt  # type: ignore[import-not-found]  # noqa: F401

            return _tensorrt_compile
        except Exception:  # (not installed, or not importable here: the reference backend rehearses it)
            pass
    from trt_inline.reference import compile as reference_compile

    return reference_compile


def is_tensorrt(build: Compile) -> bool:
    """Whether ``build`` is Torch-TensorRT's own compile (TensorRT engines), not a rehearsal."""
    return build is _tensorrt_compile


def _tensorrt_compile(model: torch.nn.Module, arg_inputs: Sequence[Any], **settings: Any) -> Any:
    import torch_tensorrt

    program = torch.export.export(model, tuple(arg_inputs))
    return torch_tensorrt.dynamo.compile(program, arg_inputs=list(arg_inputs), **settings)


def compile_call(build: Compile, settings: Mapping[str, Any]) -> str:
    """The call that compiles the model as ``build`` did with ``settings``, to paste into the user's code."""
    keywords = settings_arguments(settings)
    tail = f", {keywords}" if keywords else ""
    if build is _tensorrt_compile:
        return release_call(settings)
    from trt_inline.reference import compile as reference_compile

    if build is reference_compile:
        name = _REFERENCE_CALL
    else:
        name = ".".join(part for part in (getattr(build, "__module__", ""), getattr(build, "__qualname__", "")) if part)
    return f"{name or 'compile'}(model, arg_inputs{tail})"


@contextlib.contextmanager
def rehearsed(build: Compile, model: torch.nn.Module, arg_inputs: Sequence[Any]) -> Iterator[Compile]:
    """``build`` as the search calls it, once per set: where it is the reference backend on a release's pipeline,
    one export and one rehearsal for every compile (:func:`trt_inline.reference.backend.rehearsing`: the release is
    imported once, not per compile); any other build as it is."""
    from trt_inline.reference import compile as reference_compile
    from trt_inline.reference.backend import rehearsing

    if build is not reference_compile:
        yield build
        return
    with rehearsing(model, arg_inputs) as session:
        if session is None:
            yield build
            return

        def rehearsed_build(compiled_model: torch.nn.Module, inputs: Sequence[Any], **settings: Any) -> torch.nn.Module:
            return session(**settings)

        yield rehearsed_build


def rehearsal_table(
    model: torch.nn.Module, arg_inputs: Sequence[Any], settings: Mapping[str, Any]
) -> tuple[LoweredNode, ...]:
    """The nodes a build with ``settings`` lowers, from the reference backend (the release's own pipeline where
    it imports): where the build itself (TensorRT's) does not say which nodes it lowered and how."""
    from trt_inline.reference import compile as reference_compile

    compiled = reference_compile(model, arg_inputs, **settings)
    table: tuple[LoweredNode, ...] = getattr(compiled, LOWERED_ATTRIBUTE)
    return table


def release_call(settings: Mapping[str, Any]) -> str:
    """The call that compiles the model on TensorRT with ``settings``: ``torch_tensorrt.dynamo.compile(...)``."""
    keywords = settings_arguments(settings)
    tail = f", {keywords}" if keywords else ""
    return f"{_TENSORRT_CALL}(torch.export.export(model, tuple(arg_inputs)), arg_inputs=list(arg_inputs){tail})"


def settings_with(given: Mapping[str, Any], strategy: str, chosen: Sequence[str]) -> dict[str, Any]:
    """``given`` with ``chosen`` kept in fp32 (``autocast_excluded_nodes``: each module path anchored and escaped,
    ``^layer3\\.0\\.conv1$``, as the releases ``re.match`` it against a node's module path) or run in PyTorch
    (``torch_executed_ops``: ``torch.ops.aten.div.Tensor``), after what ``given`` names there already."""
    settings = dict(given)
    if strategy == "higher_precision":
        settings["autocast_excluded_nodes"] = [*settings.get("autocast_excluded_nodes", ()),
                                               *(pattern(path) for path in chosen)]  # fmt: skip
    else:
        settings["torch_executed_ops"] = [*settings.get("torch_executed_ops", ()), *chosen]
    return settings


def pattern(path: str) -> str:
    """The ``autocast_excluded_nodes`` pattern that matches the module path ``path`` alone."""
    return f"^{re.escape(path)}$"


def measure(
    build: Compile,
    model: torch.nn.Module,
    arg_inputs: Sequence[Any],
    settings: Mapping[str, Any],
    cases: Sequence[HeldCase],
    tolerance: Tolerances,
    seed: int,
) -> Measured:
    """Compile ``model`` with ``settings`` and run every case, from the random state ``seed`` (the verdicts
    repeat)."""
    with torch.random.fork_rng():  # (the caller's random state is left as it was)
        torch.manual_seed(seed)
        return _measured(build(model, arg_inputs, **settings), cases, tolerance)


def _measured(compiled: torch.nn.Module, cases: Sequence[HeldCase], tolerance: Tolerances) -> Measured:
    """Every case run through ``compiled`` and compared with its expected outputs."""
    criteria = tolerance.criteria()  # (verify's comparison: the same value every verdict of it takes)
    errors, oks = [], []
    narrowed: set[str] = set()
    collapsed: list[str] = []
    for case in cases:
        with torch.no_grad():
            got = flat_tensors(compiled(*case.args, **case.kwargs))
        if len(got) != len(case.expected):
            raise VerifyInputError(
                f"case {case.name}: the compiled model returns {len(got)} outputs, the case expects "
                f"{len(case.expected)}"
            )
        worst, ok = 0.0, True
        for index, (actual, want) in enumerate(zip(got, case.expected, strict=True)):
            if _narrower(actual, want):  # (an engine that autocast left in fp16 returns fp16: read it back exactly)
                narrowed.add(f"output {index} is {str(actual.dtype).removeprefix('torch.')}")
                actual = actual.to(want.dtype)
            comparison = criteria.output(index, actual, want)
            error = comparison.max_abs_diff if math.isfinite(comparison.max_abs_diff) else math.inf
            worst, ok = max(worst, error), ok and comparison.ok
            if comparison.ok and comparison.collapsed is not None:  # (no build to accept, however wide the tolerance)
                ok = False
                what = "all zeros" if comparison.collapsed == "all zeros" else "one value everywhere"
                collapsed.append(f"case {case.name}: output {index} is {what} where the model's is not")
        errors.append(worst)
        oks.append(ok)
    lowered = getattr(compiled, LOWERED_ATTRIBUTE, None)
    return Measured(
        tuple(errors), tuple(oks), shape_of(compiled), lowered, str(getattr(compiled, PIPELINE_ATTRIBUTE, "")),
        tuple(sorted(narrowed)), tuple(collapsed),
    )  # fmt: skip


def _narrower(actual: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether ``actual`` is a floating-point tensor of fewer bits than the expected one: a value every expected
    dtype holds exactly, compared there (a build's output left in fp16 against the model's fp32)."""
    return (
        actual.dtype != want.dtype and actual.is_floating_point() and want.is_floating_point()
        and not actual.is_complex() and not want.is_complex() and actual.element_size() < want.element_size()
        and torch.promote_types(actual.dtype, want.dtype) == want.dtype
    )  # fmt: skip


def shape_of(compiled: torch.nn.Module) -> BuildShape:
    """The engines and fallbacks a compiled module calls (None where it is no partitioned ``GraphModule``)."""
    if not isinstance(compiled, torch.fx.GraphModule):
        return BuildShape(None, None)
    calls = [node for node in compiled.graph.nodes if node.op == "call_module"]
    engines = sum(1 for node in calls if is_accelerated_call(compiled, node))
    fallbacks = sum(1 for node in calls if is_fallback_call(compiled, node))
    return BuildShape(engines, fallbacks)
