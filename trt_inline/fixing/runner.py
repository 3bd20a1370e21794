"""``find_fix``: compile, hold every case to the tolerance, search where one is out of it, report.

Every compile the search asks for is one :class:`_Trials` call: counted against the budget, reported as one
progress line (:mod:`trt_inline.progress`), remembered by the set it changed (a set asked about twice is
compiled once), and the smallest set that passed so far kept as the best. A search that runs out of compiles, or
that Ctrl-C (``KeyboardInterrupt``) stops, reports that best set, marked as such.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from trt_inline import progress
from trt_inline.fixing.builds import Compile, Measured, compile_call, default_compile, measure, settings_with
from trt_inline.fixing.candidates import candidates as candidates_of
from trt_inline.fixing.candidates import described, partitioned_graph
from trt_inline.fixing.cases import HeldCase, held_cases
from trt_inline.fixing.report import (
    FIXED,
    INTERRUPTED,
    NO_FIX,
    NOTHING_TO_FIX,
    OUT_OF_COMPILES,
    CaseError,
    FixError,
    FixReport,
)
from trt_inline.fixing.search import search
from trt_inline.verify.options import Tolerances

__all__ = ["DEFAULT_TOLERANCE", "STRATEGIES", "default_budget", "find_fix", "with_default_tolerance"]

STRATEGIES = ("higher_precision", "fallback")
# The tolerance where none is given, absolute and relative: a reduced-precision build is held to less than an fp32
# one (verify's default, per dtype, would hold an fp16 build to fp32's).
DEFAULT_TOLERANCE = 1e-2
# What each strategy does to the set the search chooses, as the report's first line says it.
_WHAT = {"higher_precision": "kept in fp32", "fallback": "run in PyTorch"}


def default_budget(candidates: int) -> int:
    """The compiles a search may make unless told: room for every candidate needed, and the checks around it."""
    return 4 * max(1, candidates) + 10


def find_fix(
    model: torch.nn.Module,
    arg_inputs: Sequence[Any],
    *,
    compile: Compile | None = None,
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
    ``check_error_stat``, ``top_k``); ``atol`` and ``rtol`` not given are :data:`DEFAULT_TOLERANCE`.
    ``cases``: a folder as ``verify --cases`` reads it, or a list of input tuples (their expected outputs are
    the model's own, in fp32); by default ``arg_inputs``. ``max_compiles``: stop there (the report holds the
    best set found by then; by default :func:`default_budget`). ``seed``: the random state each compile and run
    starts from (the search's verdicts, and so its progress lines, repeat). Ctrl-C during the search stops it:
    the report holds the best set found so far, ``outcome="interrupted"``.

    Raises :class:`~trt_inline.fixing.report.FixError` where it cannot search (no case, a strategy the settings
    cannot express).
    """
    if strategy not in STRATEGIES:
        raise FixError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    given = dict(settings or {})
    if strategy == "higher_precision" and not given.get("enable_autocast"):
        raise FixError(
            "strategy='higher_precision' keeps nodes in fp32 with autocast_excluded_nodes, which takes effect with "
            "enable_autocast=True (Torch-TensorRT 2.10+); give it in settings, or use strategy='fallback'"
        )
    if max_compiles is not None and max_compiles < 1:
        raise FixError(f"max_compiles={max_compiles}: at least 1 (the build with the settings given)")
    build = compile or default_compile()
    held = held_cases(model, arg_inputs, cases)
    graph = partitioned_graph(model, arg_inputs)
    chosen_from = candidates_of(graph, strategy)
    budget = max_compiles if max_compiles is not None else default_budget(len(chosen_from))
    trials = _Trials(build, model, arg_inputs, given, strategy, held, with_default_tolerance(tolerance), seed,
                     len(chosen_from), budget)  # fmt: skip
    report = FixReport(strategy, given, candidates=len(chosen_from), budget=budget)
    found: list[str] | None = None
    try:
        if trials([]):
            report.outcome = NOTHING_TO_FIX
        elif not trials(chosen_from):
            report.outcome = NO_FIX
            report.notes.append(_why_none_works(trials, chosen_from))
        else:
            found = search(chosen_from, trials)
            report.outcome = FIXED
    except _OutOfCompiles:
        report.outcome = OUT_OF_COMPILES
        report.notes.append(f"stopped at max_compiles={budget} before the search ended")
    except KeyboardInterrupt:
        report.outcome = INTERRUPTED
        report.notes.append("stopped by Ctrl-C (KeyboardInterrupt) before the search ended")
    report.compiles = trials.compiles
    if trials.first is None:  # (stopped before the first compile ended: nothing measured)
        return report
    if found is None and trials.best is not None and report.outcome in (OUT_OF_COMPILES, INTERRUPTED):
        order = {name: index for index, name in enumerate(chosen_from)}
        found = sorted(trials.best, key=order.__getitem__)
    after = trials.measured(found) if found is not None else None
    if report.outcome == NOTHING_TO_FIX:
        after = trials.first
    report.cases = [
        CaseError(case.name, trials.first.errors[index], None if after is None else after.errors[index],
                  trials.first.ok[index], None if after is None else after.ok[index])
        for index, case in enumerate(held)
    ]  # fmt: skip
    report.before, report.after = trials.first.shape, None if after is None else after.shape
    if found:
        report.nodes = described(graph, strategy, found)
        report.settings = settings_with(given, strategy, found)
    report.compile_call = compile_call(build, report.settings)
    return report


def with_default_tolerance(tolerance: Tolerances | None) -> Tolerances:
    """``tolerance`` with :data:`DEFAULT_TOLERANCE` for ``atol`` and ``rtol`` where it gives none."""
    given = tolerance or Tolerances()
    return dataclasses.replace(
        given,
        atol=DEFAULT_TOLERANCE if given.atol is None else given.atol,
        rtol=DEFAULT_TOLERANCE if given.rtol is None else given.rtol,
    )


class _OutOfCompiles(Exception):
    pass


class _Trials:
    """``passes(chosen)`` for the search: one compile per set (remembered), within the budget, reported."""

    def __init__(
        self, build: Compile, model: torch.nn.Module, arg_inputs: Sequence[Any], given: Mapping[str, Any],
        strategy: str, cases: Sequence[HeldCase], tolerance: Tolerances, seed: int, candidates: int, budget: int,
    ) -> None:  # fmt: skip
        self.build, self.model, self.arg_inputs, self.given = build, model, arg_inputs, given
        self.strategy, self.cases, self.tolerance, self.seed = strategy, cases, tolerance, seed
        self.candidates, self.budget = candidates, budget
        self.compiles = 0
        self.first: Measured | None = None  # (the settings given)
        self.best: list[str] | None = None  # (the smallest set that passed)
        self._seen: dict[frozenset[str], Measured] = {}

    def measured(self, chosen: Sequence[str]) -> Measured:
        return self._seen[frozenset(chosen)]

    def __call__(self, chosen: Sequence[str]) -> bool:
        key = frozenset(chosen)
        if key not in self._seen:
            settings = settings_with(self.given, self.strategy, chosen) if chosen else self.given
            what = f"{len(chosen)} of {self.candidates} candidates {_WHAT[self.strategy]}"
            self._seen[key] = self.compile(settings, what)
            if not chosen:
                self.first = self._seen[key]
        result = self._seen[key]
        if result.passes and (self.best is None or len(chosen) <= len(self.best)):
            self.best = list(chosen)
        return result.passes

    def compile(self, settings: Mapping[str, Any], changed: str) -> Measured:
        """One compile with ``settings`` (``changed``: what they change, for its progress line), counted."""
        if self.compiles >= self.budget:
            raise _OutOfCompiles()
        result = measure(self.build, self.model, self.arg_inputs, settings, self.cases, self.tolerance, self.seed)
        self.compiles += 1  # (one that Ctrl-C stopped is not counted: it was not made)
        progress.report(
            f"compile {self.compiles} (at most {self.budget}): {changed}: worst error "
            f"{result.worst:.3g}, " + ("every case within tolerance" if result.passes else "out of tolerance")
        )
        return result


def _why_none_works(trials: _Trials, everything: Sequence[str]) -> str:
    """Why no set works, where one more compile can tell: the TF32 inputs of the fp32 matmuls and convolutions
    (what ``disable_tf32=True`` turns off), else a loss outside what the strategy changes."""
    head = (
        f"even with every one of the {len(everything)} candidates {_WHAT[trials.strategy]} a case is out of "
        f"tolerance (worst error {trials.measured(everything).worst:.3g})"
    )
    if trials.strategy == "higher_precision" and not trials.given.get("disable_tf32"):
        without_tf32 = {**settings_with(trials.given, trials.strategy, everything), "disable_tf32": True}
        what = f"all {len(everything)} candidates {_WHAT[trials.strategy]}, disable_tf32=True"
        if trials.compile(without_tf32, what).passes:
            return (
                f"{head}, and within it with disable_tf32=True as well: the fp32 matmuls and convolutions lose it "
                "to TF32 (an input too large or too finely balanced for 10 mantissa bits); add disable_tf32=True "
                "to the settings and search again"
            )
    return (
        f"{head}: the loss is not in what {trials.strategy} can change (an input out of the low precision's range "
        "where the engine reads it, or an operator that is not a candidate)"
    )
