"""From finding to fixing: the compile settings that bring a reduced-precision build within tolerance.

:func:`find_fix` compiles a model with the user's settings (``torch_tensorrt.dynamo.compile`` where TensorRT
runs here, the reference backend otherwise, whose engines compute as a reduced-precision build does:
:mod:`trt_inline.reference.precision`), compares every case with the model's own fp32 outputs, and where a
case is out of tolerance searches for a small set of nodes that, kept in fp32
(``strategy="higher_precision"``: ``autocast_excluded_nodes``) or run in PyTorch (``strategy="fallback"``:
``torch_executed_ops``, by operator, the finest control the releases offer there), brings every case within
it. It answers in the user's terms: the settings to pass, and each node with its module path and source line.

The search (:func:`_search`) finds the essential candidates one at a time, each by a binary search over the
candidates in graph order (the first prefix that, added to what was found, passes), then drops any found one
the rest make unnecessary: with k nodes among n candidates it compiles about k·(log2 n + 2) times, against
the n a prefix bisection in the style of Polygraphy's ``debug precision`` needs to report a prefix it cannot
shrink. Its one assumption: keeping more nodes in fp32 never makes a case worse.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from trt_inline import progress
from trt_inline.errors import TrtInlineError, VerifyInputError
from trt_inline.verify.compare import compare_output, tolerance_for
from trt_inline.verify.options import Tolerances, normalize_tolerance

__all__ = ["FixError", "FixReport", "FixedNode", "find_fix"]

STRATEGIES = ("higher_precision", "fallback")


class FixError(TrtInlineError, ValueError):
    """``find_fix`` cannot search: no case to hold the build to, a strategy the settings cannot express, or even
    every candidate in fp32 is out of tolerance."""


@dataclass(frozen=True)
class FixedNode:
    """A node the fix keeps in fp32 (or an operator it runs in PyTorch), in the user's terms."""

    name: str
    op: str
    module: str  # "stage2.0.conv (Linear)", or "" where the graph does not record it
    source: str  # "model.py:41 in forward: h = self.conv(x)", or ""

    def describe(self) -> str:
        where = "; ".join(part for part in (self.module, self.source) if part)
        head = self.name if self.name == self.op else f"{self.name} ({self.op})"
        return head + (f": {where}" if where else "")


@dataclass
class FixReport:
    """What :func:`find_fix` found: the settings to compile with, what they change, what it cost."""

    strategy: str
    settings: dict[str, Any]
    nodes: list[FixedNode] = field(default_factory=list)
    compiles: int = 0
    error_before: float = 0.0
    error_after: float = 0.0
    fixed: bool = True
    candidates: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def needed(self) -> bool:
        """Whether the settings given were out of tolerance (something had to change)."""
        return bool(self.nodes)

    def to_text(self) -> str:
        if not self.needed and self.fixed:
            head = f"nothing to fix: every case is within tolerance (worst error {self.error_before:.3g}; 1 compile)"
            return "\n".join([head, *self.notes])
        if not self.fixed:
            return "\n".join([f"no fix found ({self.strategy}): {self.notes[0] if self.notes else ''}",
                              *self.notes[1:]])  # fmt: skip
        what = "kept in fp32" if self.strategy == "higher_precision" else "run in PyTorch"
        lines = [
            f"fixed: {len(self.nodes)} of {self.candidates} candidate "
            f"{'nodes' if self.strategy == 'higher_precision' else 'operators'} {what} bring every case within "
            f"tolerance (worst error {self.error_before:.3g} -> {self.error_after:.3g}; {self.compiles} compiles)",
        ]
        lines += [f"  {node.describe()}" for node in self.nodes]
        key = "autocast_excluded_nodes" if self.strategy == "higher_precision" else "torch_executed_ops"
        lines.append(f"compile with: {key}={self.settings[key]!r}")
        return "\n".join([*lines, *self.notes])


def find_fix(
    model: torch.nn.Module,
    arg_inputs: Sequence[Any],
    *,
    compile: Callable[..., torch.nn.Module] | None = None,
    settings: Mapping[str, Any] | None = None,
    tolerance: Tolerances | None = None,
    strategy: str = "higher_precision",
    cases: str | os.PathLike[str] | Sequence[Sequence[Any]] | None = None,
    max_compiles: int | None = None,
    seed: int = 0,
) -> FixReport:
    """Settings that bring ``model``'s reduced-precision build within ``tolerance`` on every case.

    ``compile(model, arg_inputs, **settings)``: ``torch_tensorrt.dynamo.compile`` where TensorRT runs here, the
    reference backend otherwise. ``settings``: the compile settings as the user passes them
    (``enable_autocast=True``, ``enabled_precisions=...``); ``strategy="higher_precision"`` needs autocast (the
    node-level precision control: ``autocast_excluded_nodes``), ``"fallback"`` adds ``torch_executed_ops``.
    ``tolerance``: verify's (:class:`~trt_inline.verify.options.Tolerances`: ``atol``/``rtol`` per output,
    ``check_error_stat``, ``top_k``); by default 1e-2 relative and absolute. ``cases``: a folder as ``verify
    --cases`` reads it, or a list of input tuples (their expected outputs are the model's own, in fp32); by
    default ``arg_inputs``. ``max_compiles``: stop there (the report says what was found by then). ``seed``:
    the random state each compile and run starts from (the search's verdicts repeat).
    """
    if strategy not in STRATEGIES:
        raise FixError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    given = dict(settings or {})
    if strategy == "higher_precision" and not given.get("enable_autocast"):
        raise FixError(
            "strategy='higher_precision' keeps nodes in fp32 with autocast_excluded_nodes, which takes effect with "
            "enable_autocast=True (Torch-TensorRT 2.10+); give it in settings, or use strategy='fallback'"
        )
    tolerance = tolerance or Tolerances(atol=1e-2, rtol=1e-2)
    build = compile or _default_compile()
    checked = _cases(model, arg_inputs, cases)
    graph = _graph(model, arg_inputs)
    candidates = _candidates(graph, strategy)
    report = FixReport(strategy, given, candidates=len(candidates))
    budget = max_compiles if max_compiles is not None else 4 * max(1, len(candidates)) + 10

    def passes(chosen: Sequence[str]) -> bool:
        if report.compiles >= budget:
            raise _OutOfCompiles()
        report.compiles += 1
        progress.report(f"compiling with {len(chosen)} of {len(candidates)} candidates changed", (report.compiles,
                                                                                                  budget))  # fmt: skip
        worst = _worst(build, model, arg_inputs, _with(given, strategy, chosen), checked, tolerance, seed)
        if not chosen:
            report.error_before = worst[0]
        report.error_after = worst[0]
        return worst[1]

    try:
        if passes([]):
            report.error_after = report.error_before
            return report
        if not passes(candidates):
            report.fixed = False
            report.notes.append(
                f"even with every one of the {len(candidates)} candidates changed a case is out of tolerance (worst "
                f"error {report.error_after:.3g}): the loss is not in what {strategy} can change"
            )
            return report
        chosen = _search(candidates, passes)
        passes(chosen)  # (the report's figures are those of the fix itself)
    except _OutOfCompiles:
        report.fixed = False
        report.notes.append(f"stopped at max_compiles={budget} before a fix was found")
        return report
    nodes = {n.name: n for n in graph.nodes}
    if strategy == "higher_precision":
        report.nodes = [_described(nodes[name]) for name in chosen]
    else:
        report.nodes = [FixedNode(op, op, "", "") for op in chosen]
    report.settings = _with(given, strategy, chosen)
    return report


class _OutOfCompiles(Exception):
    pass


def _search(candidates: Sequence[str], passes: Callable[[Sequence[str]], bool]) -> list[str]:
    """A small set of ``candidates`` for which ``passes`` holds (it holds for all of them, not for none).

    Each round finds, by binary search, the shortest prefix of the candidates left that passes together with
    what was found; its last element is needed (without it the prefix does not pass), so it is kept and the
    search goes on in the prefix before it, until what was found passes alone. Then any found element whose
    removal still passes is dropped.
    """
    found: list[str] = []
    rest = list(candidates)
    while not passes(found):
        low, high = 1, len(rest)
        while low < high:
            middle = (low + high) // 2
            if passes(found + rest[:middle]):
                high = middle
            else:
                low = middle + 1
        found.append(rest[low - 1])
        rest = rest[: low - 1]
    for element in list(found):
        if len(found) > 1 and passes([f for f in found if f != element]):
            found.remove(element)
    order = {name: i for i, name in enumerate(candidates)}
    return sorted(found, key=order.__getitem__)


def _with(given: Mapping[str, Any], strategy: str, chosen: Sequence[str]) -> dict[str, Any]:
    settings = dict(given)
    if strategy == "higher_precision":
        settings["autocast_excluded_nodes"] = [*settings.get("autocast_excluded_nodes", ()),
                                               *(f"^{re.escape(name)}$" for name in chosen)]  # fmt: skip
    else:
        settings["torch_executed_ops"] = [*settings.get("torch_executed_ops", ()), *chosen]
    return settings


def _default_compile() -> Callable[..., torch.nn.Module]:
    """``torch_tensorrt.dynamo.compile`` where it imports and CUDA runs; else the reference backend."""
    if torch.cuda.is_available():
        try:
            import torch_tensorrt  # type: ignore[import-not-found]

            def compile_with_tensorrt(model: torch.nn.Module, arg_inputs: Sequence[Any], **settings: Any) -> Any:
                program = torch.export.export(model, tuple(arg_inputs))
                return torch_tensorrt.dynamo.compile(program, arg_inputs=list(arg_inputs), **settings)

            return compile_with_tensorrt
        except Exception:  # (not installed, or not importable here: the reference backend rehearses it)
            pass
    from trt_inline.reference import compile as reference_compile

    return reference_compile


def _cases(
    model: torch.nn.Module, arg_inputs: Sequence[Any], cases: str | os.PathLike[str] | Sequence[Sequence[Any]] | None
) -> list[tuple[list[Any], dict[str, Any], list[torch.Tensor]]]:
    """(args, kwargs, expected outputs) per case: a folder's, or inputs run through the model in fp32."""
    if isinstance(cases, (str, os.PathLike)):
        from trt_inline.verify.cases import read_cases

        return [(case.args, case.kwargs, list(case.expected)) for case in read_cases(cases)]
    found: list[tuple[list[Any], dict[str, Any], list[torch.Tensor]]] = []
    for inputs in cases if cases is not None else [arg_inputs]:
        with torch.no_grad():
            out = model(*inputs)
        found.append((list(inputs), {}, _flat(out)))
    if not found:
        raise FixError("no case to hold the build to")
    return found


def _flat(value: Any) -> list[torch.Tensor]:
    leaves = pytree.tree_leaves(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _worst(
    build: Callable[..., torch.nn.Module],
    model: torch.nn.Module,
    arg_inputs: Sequence[Any],
    settings: Mapping[str, Any],
    cases: Sequence[tuple[list[Any], dict[str, Any], list[torch.Tensor]]],
    tolerance: Tolerances,
    seed: int,
) -> tuple[float, bool]:
    """(the worst max abs error over every case and output, whether every one is within tolerance)."""
    torch.manual_seed(seed)
    compiled = build(model, arg_inputs, **settings)
    worst, ok = 0.0, True
    atol, rtol = normalize_tolerance(tolerance.atol), normalize_tolerance(tolerance.rtol)
    for args, kwargs, expected in cases:
        with torch.no_grad():
            got = _flat(compiled(*args, **kwargs))
        if len(got) != len(expected):
            raise VerifyInputError(f"the compiled model returns {len(got)} outputs, the case {len(expected)}")
        for index, (actual, want) in enumerate(zip(got, expected, strict=True)):
            comparison = compare_output(
                index, actual, want, tolerance_for(atol, index), tolerance_for(rtol, index),
                tolerance.check_error_stat, top_k=tolerance.top_k,
                min_top_k_agreement=tolerance.min_top_k_agreement,
            )  # fmt: skip
            error = comparison.max_abs_diff if math.isfinite(comparison.max_abs_diff) else math.inf
            worst = max(worst, error)
            ok = ok and comparison.ok
    return worst, ok


def _graph(model: torch.nn.Module, arg_inputs: Sequence[Any]) -> torch.fx.Graph:
    """The graph the compile partitions: exported, decomposed to core ATen (node names as the settings name them)."""
    exported = torch.export.export(model, tuple(arg_inputs)).run_decompositions()
    graph: torch.fx.Graph = exported.graph
    return graph


def _candidates(graph: torch.fx.Graph, strategy: str) -> list[str]:
    """What the search chooses among, in graph order: the floating-point nodes (their names), or their
    operators (``aten.mul.Tensor``) for ``fallback``."""
    found: list[str] = []
    for node in graph.nodes:
        value = node.meta.get("val")
        if node.op != "call_function" or not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            continue
        name = node.name if strategy == "higher_precision" else str(node.target)  # (an OpOverload: aten.mul.Tensor)
        if name not in found:
            found.append(name)
    return found


def _described(node: torch.fx.Node) -> FixedNode:
    """A node in the user's terms: its module path and class (``nn_module_stack``), its source line."""
    stack = node.meta.get("nn_module_stack") or {}
    module = ""
    if stack:
        path, kind = list(stack.values())[-1]
        cls = kind.__name__ if isinstance(kind, type) else str(kind).rsplit(".", 1)[-1].strip("'>")
        path = str(path).removeprefix("L__self__").strip(".")
        module = f"{path} ({cls})" if path else f"{cls} (the model itself)"
    trace = str(node.meta.get("stack_trace") or "").strip().splitlines()
    source = ""
    for index in range(len(trace) - 1, -1, -1):
        match = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', trace[index])
        if match:
            code = trace[index + 1].strip() if index + 1 < len(trace) else ""
            source = f"{os.path.basename(match.group(1))}:{match.group(2)} in {match.group(3)}: {code}".rstrip(": ")
            break
    op = str(node.target).removeprefix("aten.")
    return FixedNode(node.name, op, module, source)
