"""``find_fix``: compile, hold every case to the tolerance, search where one is out of it, report.

Every compile the search asks for is one :class:`_Trials` call: counted against the budget, reported as one
progress line (:mod:`trt_inline.progress`), remembered by the set it changed (a set asked about twice is
compiled once), and the smallest set that passed so far kept as the best. A search that runs out of compiles, or
that Ctrl-C (``KeyboardInterrupt``) stops, reports that best set, marked as such.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from trt_inline import progress
from trt_inline.fixing.build_cases import HeldCase, held_cases
from trt_inline.fixing.builds import (
    Compile,
    Measured,
    compile_call,
    default_compile,
    is_tensorrt,
    measure,
    rehearsal_table,
    rehearsed,
    release_call,
    settings_with,
)
from trt_inline.fixing.candidates import TOP_LEVEL, described, matches
from trt_inline.fixing.candidates import candidates as candidates_of
from trt_inline.fixing.fix_report import (
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
from trt_inline.reference.lowered import LoweredNode
from trt_inline.verify.options import Tolerances, renamed_tolerances

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
    tolerances: Tolerances | Mapping[str, Any] | float | None = None,
    strategy: str | None = None,
    cases: str | os.PathLike[str] | Sequence[Sequence[Any]] | None = None,
    max_compiles: int | None = None,
    seed: int = 0,
    tolerance: Tolerances | Mapping[str, Any] | float | None = None,
) -> FixReport:
    """Settings that bring ``model``'s reduced-precision build within ``tolerances`` on every case.

    ``compile(model, arg_inputs, **settings)``: ``torch_tensorrt.dynamo.compile`` where TensorRT runs here, the
    reference backend otherwise (the importable release's own pipeline, else trt-inline's emulation of the
    release this torch pairs with). ``settings``: the compile settings as the user passes them, in that release's
    names (an fp16 build: ``enable_autocast=True, autocast_low_precision_type=torch.float16`` from 2.10,
    ``enabled_precisions={torch.float16}`` before); ``strategy="higher_precision"`` needs autocast (the releases'
    node-level precision control, ``autocast_excluded_nodes``, which matches module paths), ``"fallback"`` adds
    ``torch_executed_ops``; by default the first where the settings enable autocast, else the second.
    ``tolerances``: a number (``atol`` and ``rtol`` both), a dict of :class:`~trt_inline.verify.options.Tolerances`
    fields, or a ``Tolerances`` (as ``verify`` and ``diff`` take it; ``tolerance=`` is its old name); ``atol`` and
    ``rtol`` not given are :data:`DEFAULT_TOLERANCE`.
    ``cases``: a folder as ``verify --cases`` reads it, or a list of input tuples (their expected outputs are
    the model's own, in fp32); by default ``arg_inputs``. ``max_compiles``: stop there (the report holds the
    best set found by then; by default :func:`default_budget`). ``seed``: the random state each compile and run
    starts from (the search's verdicts, and so its progress lines, repeat). Ctrl-C during the search stops it:
    the report holds the best set found so far, ``outcome="interrupted"``.

    The set found is checked before it is reported: leaving out any one member puts a case out of tolerance (a
    member that is not needed is dropped), and in the build with the settings found, the nodes the set names
    are the ones the pipeline changed (a pattern or operator that reaches no node is an error).

    Raises :class:`~trt_inline.fixing.fix_report.FixError` where it cannot search (no case, a strategy the settings
    cannot express).
    """
    criteria = renamed_tolerances(tolerances, tolerance, "find_fix")
    given = dict(settings or {})
    if strategy is None:  # (keeping modules in fp32 is autocast's: where the settings have none, fallbacks)
        strategy = "higher_precision" if given.get("enable_autocast") else "fallback"
    if strategy not in STRATEGIES:
        raise FixError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    if strategy == "higher_precision" and not given.get("enable_autocast"):
        raise FixError(
            "strategy='higher_precision' keeps nodes in fp32 with autocast_excluded_nodes, which takes effect with "
            "enable_autocast=True (Torch-TensorRT 2.10+); give it in settings, or use strategy='fallback'"
        )
    if given.get("enable_autocast") and given.get("autocast_low_precision_type") is None:
        raise FixError(
            "enable_autocast=True without autocast_low_precision_type is an fp32 build (its default is None in every "
            "release that has autocast): give autocast_low_precision_type=torch.float16 (or torch.bfloat16)"
        )
    if max_compiles is not None and max_compiles < 1:
        raise FixError(f"max_compiles={max_compiles}: at least 1 (the build with the settings given)")
    build = compile or default_compile()
    held = held_cases(model, arg_inputs, cases)
    with rehearsed(build, model, arg_inputs) as trial_build:
        trials = _Trials(trial_build, model, arg_inputs, given, strategy, held, with_default_tolerance(criteria),
                         seed, max_compiles)  # fmt: skip
        return _searched(trials, build, given, strategy, held)


def _searched(
    trials: _Trials, build: Compile, given: dict[str, Any], strategy: str, held: Sequence[HeldCase]
) -> FixReport:
    """The search ``find_fix`` describes, with ``trials`` compiling; its report."""
    model, arg_inputs = trials.model, trials.arg_inputs
    report = FixReport(strategy, given)
    found: list[str] | None = None
    chosen_from: list[str] = []
    try:
        first = trials.measure_first()
        table = first.lowered if first.lowered is not None else rehearsal_table(model, arg_inputs, given)
        chosen_from = candidates_of(table, strategy)
        trials.set_candidates(len(chosen_from))
        report.candidates, report.budget = len(chosen_from), trials.budget
        if first.passes:
            report.outcome = NOTHING_TO_FIX
        elif not chosen_from:
            report.outcome = NO_FIX
            report.notes.append(f"the build runs no node in reduced precision that {strategy} can change")
        elif not trials(chosen_from):
            report.outcome = NO_FIX
            report.notes.append(_why_none_works(trials, chosen_from))
        else:
            found = search(chosen_from, trials)
            found, report.minimal = minimal(found, trials)
            report.outcome = FIXED
    except _OutOfCompiles:
        report.outcome = OUT_OF_COMPILES
        report.notes.append(f"stopped at max_compiles={trials.budget} before the search ended")
    except KeyboardInterrupt:
        report.outcome = INTERRUPTED
        report.notes.append("stopped by Ctrl-C (KeyboardInterrupt) before the search ended")
    report.compiles = trials.compiles
    report.candidates, report.budget = len(chosen_from), trials.budget
    if trials.first is None:  # (stopped before the first compile ended: nothing measured)
        return report
    report.pipeline = trials.first.pipeline
    if trials.first.narrowed:
        narrowed = ", ".join(trials.first.narrowed)
        report.notes.append(
            f"the build returns what the model returns in float32 in a narrower dtype ({narrowed}): its last engine "
            "keeps the low precision autocast gave it, as the release's do; compared widened"
        )
    if trials.first.collapsed:
        report.notes.append(
            f"out of tolerance before: {'; '.join(trials.first.collapsed)} (an error within tolerance, and no "
            "signal: verify warns of it, and fails it with --strict)"
        )
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
        table = trials.first.lowered if trials.first.lowered is not None else ()
        report.nodes = described(table, strategy, found)
        report.settings = settings_with(given, strategy, found)
        if after is not None and after.lowered is not None and trials.first.lowered is not None:
            try:
                report.notes.extend(check_reached(trials.first.lowered, after.lowered, strategy, found))
            except FixError as error:
                error.report = report  # type: ignore[attr-defined]
                raise
        elif after is not None:
            report.notes.append(
                "which nodes the settings reached is not checked on this build (its lowered graph is not visible)"
            )
    report.compile_call = compile_call(build, report.settings)
    report.release_call = "" if is_tensorrt(build) else release_call(report.settings)
    return report


def minimal(found: Sequence[str], passes: Callable[[Sequence[str]], bool]) -> tuple[list[str], bool]:
    """``found`` made 1-minimal: each member left out once, in turn, and dropped where the rest still passes, until
    leaving out any one fails. The search's own reasoning assumes that keeping more in fp32 never makes a case
    worse, which real models do not promise; this checks it. Returns the set and True (checked: it is 1-minimal,
    whether or not members were dropped)."""
    kept = list(found)
    changed = True
    while changed and len(kept) > 1:
        changed = False
        for member in list(kept):
            rest = [item for item in kept if item != member]
            if passes(rest):
                kept, changed = rest, True
                break
    return kept, True


def check_reached(
    before: Sequence[LoweredNode], after: Sequence[LoweredNode], strategy: str, found: Sequence[str]
) -> list[str]:
    """The settings found do in the pipeline what the search meant: each module path's (operator's) nodes that ran
    in reduced precision (in an engine) in the first build now run in fp32 (in PyTorch). Raises
    :class:`FixError` naming a setting that reached none of them (the release read it otherwise); returns a note
    for each that reached only some (a node missing from the new build counts as not reached)."""
    now = {node.name: node for node in after}
    what = "kept in fp32" if strategy == "higher_precision" else "run in PyTorch"
    notes = []
    for chosen in found:
        meant = [node for node in before if node.low and matches(node, strategy, chosen)]
        if strategy == "fallback":
            meant = [node for node in meant if node.in_engine]
        missed = [
            node.name for node in meant
            if node.name not in now
            or (now[node.name].low if strategy == "higher_precision" else now[node.name].in_engine)
        ]  # fmt: skip
        if not meant or len(missed) == len(meant):
            raise FixError(
                f"find_fix: the setting for {chosen or TOP_LEVEL!r} reached none of its nodes in the build it made "
                f"({', '.join(missed[:5]) or 'no node'} not {what}): the pipeline does not read it as the search meant"
            )
        if missed:
            shown = ", ".join(missed[:5]) + (f" and {len(missed) - 5} more" if len(missed) > 5 else "")
            notes.append(
                f"the setting for {chosen or TOP_LEVEL!r} reached {len(meant) - len(missed)} of its {len(meant)} "
                f"nodes: {shown} not {what} in the build it made"
            )
    return notes


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
        strategy: str, cases: Sequence[HeldCase], tolerance: Tolerances, seed: int, max_compiles: int | None,
    ) -> None:  # fmt: skip
        self.build, self.model, self.arg_inputs, self.given = build, model, arg_inputs, given
        self.strategy, self.cases, self.tolerance, self.seed = strategy, cases, tolerance, seed
        self.max_compiles = max_compiles
        self.candidates = 0
        # (until the candidates are known, the budget is what was given, or room for the first compile)
        self.budget = max_compiles if max_compiles is not None else 1
        self.compiles = 0
        self.first: Measured | None = None  # (the settings given)
        self.best: list[str] | None = None  # (the smallest set that passed)
        self._seen: dict[frozenset[str], Measured] = {}

    def measured(self, chosen: Sequence[str]) -> Measured:
        return self._seen[frozenset(chosen)]

    def measure_first(self) -> Measured:
        """The build with the settings given (the first compile, which says what the candidates are)."""
        self([])
        assert self.first is not None
        return self.first

    def set_candidates(self, count: int) -> None:
        self.candidates = count
        self.budget = self.max_compiles if self.max_compiles is not None else default_budget(count)

    def __call__(self, chosen: Sequence[str]) -> bool:
        key = frozenset(chosen)
        if key not in self._seen:
            settings = settings_with(self.given, self.strategy, chosen) if chosen else self.given
            what = (
                f"{len(chosen)} of {self.candidates} candidates {_WHAT[self.strategy]}" if chosen
                else "the settings given"
            )  # fmt: skip
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
        # (the budget is known once the first build has named the candidates)
        bound = f" (at most {self.budget})" if self.compiles > 1 else ""
        progress.report(
            f"compile {self.compiles}{bound}: {changed}: worst error "
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
    if trials.strategy == "fallback" and trials.given.get("enable_autocast"):
        return (
            f"{head}: with autocast, the release casts the graph before it partitions it, so an operator run in "
            "PyTorch keeps the dtype autocast gave it; keep modules in fp32 instead (strategy='higher_precision', "
            "autocast_excluded_nodes)"
        )
    return (
        f"{head}: the loss is not in what {trials.strategy} can change (an input out of the low precision's range "
        "where the engine reads it, or an operator that is not a candidate)"
    )
