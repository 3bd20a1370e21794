"""Running a program on reference inputs and comparing its outputs, leaving no process state behind."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from trt_inline import compat
from trt_inline.engines import engine_submodule_key
from trt_inline.errors import RankSetError, RefusedOperatorError, VerifyInputError, first_line
from trt_inline.inlining.module_state import buffers_restored
from trt_inline.output_tree import OutputTree, describe, values
from trt_inline.verify.checked_run import CheckedRun, checking, run_checks
from trt_inline.verify.garbage import Sightings
from trt_inline.verify.report import OutputComparison, VerifyReport, describe_value

__all__ = [
    "ERROR_STATS",
    "boundary_tolerance",
    "collapse_warnings",
    "compare_output",
    "default_tolerance",
    "exactly_as",
    "identical",
    "LAYOUT_RUN",
    "RUN_MODES",
    "Run",
    "isolated_run",
    "modes_disagree",
    "normal_call",
    "ranked",
    "run_on",
    "tolerance_for",
    "tolerance_key",
    "top_k_agreement",
]

# How a value passes (Polygraphy's --check-error-stat): every element within atol + rtol * |reference|
# ("elemwise"), or one statistic of the absolute error within atol or of the relative error within rtol.
ERROR_STATS = ("elemwise", "max", "mean", "median", "p99")

_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for a dtype: exact for integers and booleans."""
    return _TOLERANCES.get(dtype, (0.0, 0.0))


def tolerance_key(key: object) -> str:
    """What a per-value tolerance is keyed by, normalized: an output (``0``, ``out0`` -> ``"0"``), an engine call
    (``engine2``), an engine by its submodule (``acc_5``, ``_run_on_acc_5`` -> ``"_run_on_acc_5"``), or ``"*"``.

    Raises :class:`VerifyInputError` for anything else.
    """
    text = str(key)
    if text == "*":
        return text
    if _is_index(text.removeprefix("out")):
        return str(int(text.removeprefix("out")))  # "out02" is output 2, as the lookups name it
    if text.startswith("engine") and _is_index(text.removeprefix("engine")):
        return f"engine{int(text.removeprefix('engine'))}"
    submodule = engine_submodule_key(text)
    if submodule is not None:
        return submodule
    raise VerifyInputError(
        f"a tolerance is keyed by an output (0, out0), an engine (engine2, acc_5, _run_on_acc_5) or '*', got {key!r}"
    )


def _is_index(text: str) -> bool:
    return text.isascii() and text.isdigit()


def tolerance_for(tolerance: float | Mapping[str, float] | None, index: int) -> float | None:
    """The tolerance of output ``index``: one for all, or per output (``{"0": 1e-3, "*": 1e-4}``); None: per dtype."""
    if isinstance(tolerance, Mapping):
        return tolerance.get(str(index), tolerance.get("*"))
    return tolerance


def boundary_tolerance(tolerance: float | Mapping[str, float] | None, engine: int, label: str) -> float | None:
    """The tolerance at engine call ``engine`` (submodule ``label``): keyed ``engine2``, then by label, then ``*``."""
    if isinstance(tolerance, Mapping):
        for key in (f"engine{engine}", label, "*"):
            if key in tolerance:
                return tolerance[key]
        return None
    return tolerance


@contextlib.contextmanager
def isolated_run() -> Iterator[None]:
    """The run as any run would be; the caller's RNG state exactly as before afterwards.

    No global setting is changed for the run (no deterministic-algorithm mode,
    which fills fresh memory with NaN, no fixed seed): a program must not be
    able to tell a verification from a normal run. The operators whose results
    could tell (uninitialized memory, the global random state) are refused in
    files from strangers (:mod:`trt_inline.allowed_ops`). Whatever a run draws
    from the global generators (an operator a trusted file was allowed) is
    undone on the way out, on the CPU and every CUDA device, also when it raises.

    CUDA is never started here (a CPU run on a CUDA machine stays on the CPU): the CUDA generators
    are saved where CUDA already runs, and where the run itself started it they are put back to
    their first state, as they were before anything drew from them.
    """
    started = compat.cuda_started()
    devices = list(range(torch.cuda.device_count())) if started else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        if not started and compat.cuda_started():
            torch.cuda.manual_seed_all(torch.cuda.initial_seed())


@contextlib.contextmanager
def normal_call() -> Iterator[None]:
    """The grad mode a call of ``torch.export.load(f).module()(x)`` runs in by default: on.

    Every run verify makes of a program is in it (a program must not be able to tell a verification from
    a normal call by the grad mode), and :func:`run_on` runs it a second time under inference mode.
    """
    with torch.enable_grad():
        yield


# The modes :func:`run_on` runs a program in, and requires bit-identical outputs between: a normal call,
# and how a server runs it.
RUN_MODES: tuple[tuple[str, Callable[[], contextlib.AbstractContextManager[Any]]], ...] = (
    ("as a normal call (grad mode on)", normal_call),
    ("under torch.inference_mode()", torch.inference_mode),
)


@dataclass
class Run:
    """What :func:`run_on` found: the normal call's flat outputs, the outputs another mode changed, and notes."""

    outputs: list[Any]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # What the normal call's engine and program outputs looked like (a GraphModule's run only).
    sightings: Sightings | None = None
    # Where torch's own operators return other than they declare (:meth:`DeclaredValues.torch_warnings`).
    warnings: list[str] = field(default_factory=list)
    # How a caller reads the normal call's outputs (:mod:`trt_inline.output_tree`).
    tree: OutputTree | None = None


# The run :func:`run_on` adds where asked: the inputs as a caller may pass them (views into larger buffers, every
# other element of their storage) with fewer intra-op threads. Reductions then add in another order, so a program
# that amplifies rounding into a switch ("does sum(x) equal sum(x.clone())?") is caught computing otherwise.
LAYOUT_RUN = "on inputs that are strided views into larger buffers, with half the intra-op threads (at least one)"


def laid_out_otherwise(value: Any) -> Any:
    """``value``'s values in another layout: a view of every other element of a buffer twice its size, at offset 1
    (a dense tensor; anything else as it is)."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.is_quantized:
        return value
    buffer = torch.zeros((*value.shape, 2), dtype=value.dtype, device=value.device)
    view = buffer[..., 1]
    with torch.no_grad():
        view.copy_(value)
    return view


def run_on(
    module: Callable[..., Any],
    args: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    device: str | None,
    *,
    layouts: bool = False,
    run_name: str = "on the reference inputs",
    checked: bool = True,
) -> Run:
    """Run ``module`` on the inputs (moved to ``device`` if given) in :func:`isolated_run`, once in each of
    :data:`RUN_MODES`, and require the same bits from each.

    Where a mode changes an output, the normal call runs again: a program that does not repeat itself bit for
    bit within one mode (CUDA kernels built on atomics, such as ``index_add`` or ``scatter_add``) has its modes
    held to its dtype's tolerance instead, and a note says so; one that does repeat itself is named.

    ``layouts``: also run as :data:`LAYOUT_RUN` says, and require its outputs within each dtype's tolerance of
    the normal call's; a program that raises there and not on contiguous inputs has a problem too (it could pass
    verify and refuse the inputs a caller passes). Not where the program calls collectives: every rank must make
    the same runs.

    The normal call of a GraphModule is a :func:`~trt_inline.verify.checked_run.checking` call: every value it
    computes is held to its node's declaration (a disagreement is a problem naming the engine or node, the output
    and both accounts), and its engine and program outputs are sighted (``run_name``, :mod:`.garbage`);
    ``checked=False``: the generated code (a caller that has made a checked call on these inputs already).
    """
    if device is not None:
        if isinstance(module, torch.nn.Module):
            module = module.to(device)
        args = [a.to(device) for a in args]
        kwargs = {k: v.to(device) for k, v in kwargs.items()}

    checks: list[CheckedRun] = []
    trees: list[OutputTree] = []

    def once(
        mode: Callable[[], contextlib.AbstractContextManager[Any]],
        args: Sequence[Any] = args,
        kwargs: dict[str, Any] = kwargs,
        *,
        checked: bool = False,
        label: str = "",
    ) -> list[Any]:
        try:
            with (
                isolated_run(),
                mode(),
                buffers_restored(module) as restored,  # from the state it was given
                # (every run holds each checked operator to its run checks: the first checks every value too)
                checking(module, device, run_name) if checked else run_checks(module) as check,
            ):
                outputs = restored.apart(module(*args, **kwargs))
                if check is not None:
                    checks.append(check)
                if checked:
                    trees.append(describe(outputs))
        except RankSetError:
            raise  # (a rank set stopped the run: its message names what it is)
        except RefusedOperatorError as exc:  # (a check refused a call: which run, then the operator and argument)
            mode_name = label or dict((m, n) for n, m in RUN_MODES).get(mode, "")
            raise RefusedOperatorError(f"its run {run_name} {mode_name}: {exc}".replace("  ", " ")) from None
        except Exception as exc:
            raise VerifyInputError(
                f"the program does not accept the {run_name.removeprefix('on the ')} ({type(exc).__name__}: "
                f"{first_line(exc)})"
            ) from exc
        # Detached: a grad-mode run's autograd graph (its saved activations) is freed before the next run.
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in values(outputs)]

    normal_name, normal = RUN_MODES[0]
    run = Run(once(normal, checked=checked))
    run.tree = trees[0] if trees else None
    if checks:
        run.problems += checks[0].declared.summary()
        run.warnings += checks[0].declared.torch_warnings()
        checks[0].see_program(pytree.tree_leaves((args, kwargs)), run.outputs)  # (every input, nested ones too)
        run.sightings = checks[0].sightings
    for name, mode in RUN_MODES[1:]:
        other = once(mode)
        disagree = modes_disagree(run.outputs, other, normal_name, name)
        if disagree and modes_disagree(run.outputs, once(normal), normal_name, normal_name):
            run.notes.append(
                "the program does not give the same bits twice in one mode (kernels built on atomics do not): "
                f"its runs {normal_name} and {name} were compared within its dtypes' tolerances"
            )
            disagree = modes_disagree(run.outputs, once(mode), normal_name, name, exact=False)
        elif disagree and (recurrent := mode_dependent_calls(module)):
            run.notes.append(
                f"the program calls {', '.join(recurrent)}, whose CPU kernel computes otherwise with autograd on "
                f"(torch's own): its runs {normal_name} and {name} were compared within its dtypes' tolerances"
            )
            disagree = modes_disagree(run.outputs, other, normal_name, name, exact=False)
        run.problems += disagree
    if layouts:
        problems, note = _layout_run(once, run, normal, [laid_out_otherwise(a) for a in args],
                                     {k: laid_out_otherwise(v) for k, v in kwargs.items()},
                                     engine_precision(module))  # fmt: skip
        run.problems += problems
        run.notes += [note] if note else []
    return run


def engine_precision(module: Any) -> torch.dtype | None:
    """The reduced precision the reference engines of ``module``'s graph compute in (float16 where any does, else
    bfloat16); None where none does (or the engines are not reference engines: a TensorRT plan does not say)."""
    from trt_inline.engines import REFERENCE_OP, engine_op
    from trt_inline.reference.program import load_program

    graph = getattr(module, "graph", None)
    found: set[torch.dtype] = set()
    for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
        text = node.args[2] if engine_op(node) is REFERENCE_OP and len(node.args) > 2 else None
        if isinstance(text, str):
            found |= load_program(text).reduced_precisions()
    # (float16 where any engine says so: bfloat16's wider tolerance only where no engine computes in float16)
    return torch.float16 if torch.float16 in found else (torch.bfloat16 if found else None)


# Operators whose CPU kernel takes another path where autograd records them (the recurrent layers: a composite
# of differentiable steps, against a fused kernel under no_grad or inference mode), which differ in the last bits.
_MODE_DEPENDENT = frozenset({"aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu"})


def mode_dependent_calls(module: Any) -> list[str]:
    """The operators of :data:`_MODE_DEPENDENT` a program's graph (or a graph of its submodules) calls, by name."""
    if not isinstance(module, torch.nn.Module):
        return []
    found: dict[str, None] = {}
    for submodule in module.modules():
        graph = getattr(submodule, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            name = compat.op_schema_name(node.target) if node.op == "call_function" else None
            if name in _MODE_DEPENDENT:
                found[name] = None
    return sorted(found)


def _layout_run(
    once: Callable[..., list[Any]],
    run: Run,
    normal: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    precision: torch.dtype | None = None,
) -> tuple[list[str], str | None]:
    """The problems of a run :data:`LAYOUT_RUN` against the normal call's outputs, within each dtype's tolerance,
    and a note where they were held to ``precision``'s instead.

    Engines that compute in ``precision`` (float16, bfloat16) round each value they store to it, and a sum made
    in another order by fewer threads can round the other way: one unit in the last place of float16 is 1e-3
    relative, past float32's tolerance. Their outputs are compared within ``precision``'s tolerance (a program
    that computes otherwise on this run is still named: a switch, a wrong index, a value past it)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(max(1, threads // 2))  # (fewer: no thread the limits did not see start)
        laid = once(normal, args, kwargs, label=LAYOUT_RUN)
    except RefusedOperatorError:
        raise  # (a call out of range: the file is refused, whichever run met it)
    except VerifyInputError as exc:
        return [f"the program raises on its inputs as strided views into larger buffers, where it runs on them "
                f"contiguous ({first_line(exc)[:200]})"], None  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    problems = modes_disagree(run.outputs, laid, RUN_MODES[0][0], LAYOUT_RUN, exact=False)
    if not problems or precision is None:
        return problems, None
    rtol = default_tolerance(precision)[1]
    held = modes_disagree(run.outputs, laid, RUN_MODES[0][0], LAYOUT_RUN, exact=False, at=precision)
    name = str(precision).removeprefix("torch.")
    return held, (
        f"its run {LAYOUT_RUN} was compared within {name}'s relative tolerance (rtol {rtol:g}; each output's own "
        f"atol): its engines (as their programs say) compute in {name}, whose roundings a sum made by fewer "
        "threads can move"
    )


def modes_disagree(
    first: Sequence[Any],
    other: Sequence[Any],
    first_mode: str,
    other_mode: str,
    *,
    exact: bool = True,
    at: torch.dtype | None = None,
) -> list[str]:
    """Where two runs of one program on the same inputs differ in any bit (``exact=False``: past each dtype's
    tolerance, or ``at``'s where that is wider): a program that reads how it is run."""
    if len(first) != len(other):
        return [f"the program returns {len(first)} outputs run {first_mode} and {len(other)} run {other_mode}"]
    problems = []
    why: str | None
    for index, (value, again) in enumerate(zip(first, other, strict=True)):
        if isinstance(value, torch.Tensor):
            if isinstance(again, torch.Tensor) and identical(again, value):
                continue
            atol = rtol = 0.0 if exact else None
            if not exact and at is not None and value.is_floating_point() and value.dtype != torch.float64:
                # (rounding is relative: the relative tolerance only, the absolute one the output's own)
                atol, rtol = default_tolerance(value.dtype)
                rtol = max(rtol, default_tolerance(at)[1])
            found = compare_output(index, again, value, atol, rtol)
            why = found.problem.removeprefix(f"output {index} differs: ") if found.problem else None
            why = why or (None if not exact else "the same values in other bits (a NaN's)")
        else:
            why = None if _same_scalar(value, again) else f"{again!r} vs {value!r}"
        if why is not None:
            problems.append(f"output {index} differs between a run {first_mode} and a run {other_mode}: {why}")
    return problems


@dataclass(frozen=True)
class Criteria:
    """When a value is close enough: the tolerances normalized once (one for every value, or per output or engine:
    :func:`tolerance_for`), the statistic held to them (:data:`ERROR_STATS`), and the top-k agreement of logits.
    Every comparison a verification makes takes this one value (``Tolerances.criteria()``), as does the fix
    search."""

    atol: float | Mapping[str, float] | None = None
    rtol: float | Mapping[str, float] | None = None
    stat: str = "elemwise"
    top_k: int | None = None
    min_top_k_agreement: float | None = None

    def output(self, index: int, actual: Any, expected: torch.Tensor, *, ranked: bool = True) -> OutputComparison:
        """Output ``index`` against its reference (:func:`compare_output`); ``ranked``: with its top-k agreement."""
        return compare_output(
            index, actual, expected, tolerance_for(self.atol, index), tolerance_for(self.rtol, index), self.stat,
            top_k=self.top_k if ranked else None,
            min_top_k_agreement=self.min_top_k_agreement if ranked else None,
        )  # fmt: skip


def compare_output(
    index: int,
    actual: Any,
    expected: torch.Tensor,
    atol: float | None,
    rtol: float | None,
    stat: str = "elemwise",
    *,
    top_k: int | None = None,
    min_top_k_agreement: float | None = None,
) -> OutputComparison:
    """One output against its reference: max abs / rel diff, and whether it is within tolerance (``stat``:
    :data:`ERROR_STATS`). Every comparison of values (outputs, engine boundaries, random runs, ``diff``, the
    drill-down) is this one. Besides the error statistics it measures the SQNR and the cosine similarity of the
    values finite on both sides, and with ``top_k`` how often both rank the same top classes
    (:func:`top_k_agreement`, :func:`ranked`; below ``min_top_k_agreement`` the output fails).

    Nothing is converted into a value that compares equal when the original does not (:func:`_widened`):
    floating values are compared in float64, into which every floating dtype widens exactly; complex values part
    by part, each part a floating value of its own (a NaN matches a NaN only in the same part at the same place,
    and a difference in either part is a difference; the largest of each part reported); integers and booleans
    by their exact values (a difference is at least 1, however large the values); quantized values by their
    scale, zero point and integer representation. A value that differs is never reported as max abs diff 0.
    """
    if isinstance(expected, (bool, int, float)):  # (a scalar output of diff's reference program: its 0-d tensor)
        expected = torch.tensor(expected, dtype=torch.float64 if isinstance(expected, float) else None)
    if not isinstance(expected, torch.Tensor):  # (a None output: diff's reference program may return one)
        if actual is None and expected is None:
            return OutputComparison(index, [], "None", 0.0, 0.0, 0.0, 0.0, True)
        return OutputComparison(
            index, [], describe_value(expected), float("inf"), float("inf"), 0.0, 0.0, False,
            f"output {index} is {describe_value(actual)}, expected {describe_value(expected)}",
        )  # fmt: skip
    default_atol, default_rtol = default_tolerance(expected.dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    shape, dtype = list(expected.shape), str(expected.dtype).removeprefix("torch.")

    def mismatch(problem: str) -> OutputComparison:
        return OutputComparison(index, shape, dtype, float("inf"), float("inf"), atol, rtol, False, problem)

    if isinstance(actual, (bool, int, float)):
        # A scalar output, against its 0-d reference: only a scalar of the reference's kind (0.7 is no int64 0,
        # 7 no True), compared with the reference widened, never rounded (2049.0 is no float16 2048).
        pair = _scalar_pair(actual, expected)
        if pair is None:
            return mismatch(
                f"output {index} is the {type(actual).__name__} {actual!r}, expected {describe_value(expected)}"
            )
        actual, expected = pair
    if actual is None:
        return mismatch(f"output {index} is None, expected {describe_value(expected)}")
    if not isinstance(actual, torch.Tensor):
        return mismatch(f"output {index} is a {type(actual).__name__}")
    actual = actual.detach().cpu()
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return mismatch(f"output {index} is {describe_value(actual)}, expected {describe_value(expected)}")
    if expected.numel() == 0:
        return OutputComparison(index, shape, dtype, 0.0, 0.0, atol, rtol, True)
    if expected.is_quantized:
        why = _quantization_differs(actual, expected)
        if why is not None:
            return mismatch(f"output {index} is quantized differently: {why}")
        actual, expected = actual.int_repr(), expected.int_repr()
    collapsed = _collapsed(actual, expected) if expected.is_floating_point() or expected.is_complex() else None
    parts = expected.is_complex()
    if parts:  # (each part a value of its own, in a last dimension of 2: what follows compares reals)
        actual, expected = torch.view_as_real(actual), torch.view_as_real(expected)
    a, e, same = _widened(actual, expected)
    integral = not (expected.is_floating_point() or expected.is_complex())
    a, e = (a.double(), e.double()) if integral else (a, e)  # for the statistics only: `same` decided equality
    diff = (a - e).abs()
    # A difference never rounds to 0: integers differ by at least 1 (float64 loses the low bits past 2**53), and
    # -0.0 against 0.0 differs by the smallest float64 there is.
    smallest = 1.0 if integral else math.ulp(0.0)
    diff = torch.where(same, torch.zeros_like(diff), diff.clamp_min(smallest))
    finite_reference = e.isfinite()
    nan_count = int((a.isnan() & ~e.isnan()).sum())
    inf_count = int((a.isinf() & finite_reference).sum())
    # Statistics over the values where both sides are finite: one NaN must not hide how close the rest is.
    both_finite = a.isfinite() & finite_reference
    worst, mean, median, p99, cosine = _statistics(diff[both_finite], _real(a[both_finite]), _real(e[both_finite]))
    sqnr = _sqnr_db(diff[both_finite], a[both_finite], e[both_finite])
    max_abs = float("inf") if nan_count or inf_count else worst
    relative = torch.where(
        same, 0.0, (diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)).nan_to_num(float("inf"))
    )
    max_rel = float(relative.max())
    if stat == "elemwise":
        within = bool((same | (diff <= atol + rtol * e.abs())).all())
        how = f"max abs diff {max_abs:.6g}, max rel diff {max_rel:.6g}"
    else:
        which = ERROR_STATS.index(stat) - 1  # max, mean, median, p99: _statistics' order
        absolute_stat = (worst, mean, median, p99)[which]
        relative_stat = _statistics(relative[both_finite], _real(a[both_finite]), _real(e[both_finite]))[which]
        within = absolute_stat <= atol or relative_stat <= rtol
        how = f"{stat} abs error {absolute_stat:.6g}, {stat} rel error {relative_stat:.6g}"
    if parts:
        differing = both_finite & ~same
        real, imaginary = (float(diff[..., p][differing[..., p]].amax()) if bool(differing[..., p].any()) else 0.0
                           for p in (0, 1))  # fmt: skip
        how += f" (real part {real:.6g}, imaginary part {imaginary:.6g})"
    # Where the reference is NaN or Inf and this value is not the same (finite, or the other Inf): the
    # statistics are over finite pairs only, so these must fail on their own.
    unmatched = int((~both_finite & ~same).sum()) - nan_count - inf_count
    ok = nan_count == 0 and inf_count == 0 and unmatched == 0 and within
    problem = None
    if nan_count or inf_count:
        counts = " and ".join(f"{n} {kind}" for n, kind in ((nan_count, "NaN"), (inf_count, "Inf")) if n)
        problem = f"output {index} has {counts} where the reference is finite"
    elif unmatched:
        problem = f"output {index} has {unmatched} values where the reference is NaN or Inf and it is not the same"
    elif not ok:
        problem = f"output {index} differs: {how} (atol {atol:g}, rtol {rtol:g}"
        problem += ")" if stat == "elemwise" else f", --check-error-stat {stat})"
    if problem is not None:
        problem += _first_difference(actual, expected, same)
    finite_count = int(both_finite.sum())
    comparison = OutputComparison(
        index, shape, dtype, max_abs, max_rel, atol, rtol, ok, problem, mean, median, p99, cosine, nan_count,
        inf_count, finite_count, sqnr, collapsed=collapsed,
    )  # fmt: skip
    return comparison if top_k is None else ranked(comparison, actual, expected, top_k, min_top_k_agreement)


def _collapsed(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """``"all zeros"`` or ``"constant"`` where ``actual`` (floating or complex, each complex element one value) is and
    ``expected`` is not: a build that lost its signal, which a tolerance as wide as the values would pass (an fp16
    underflow to 0). Judged where neither is NaN; the reference counts as constant where its values spread by no
    more than ten times its dtype's relative tolerance (a batch of one sample, reduced in two orders)."""
    wide = torch.complex128 if expected.is_complex() else torch.float64
    a, e = actual.to(wide).reshape(-1), expected.to(wide).reshape(-1)
    kept = ~(a.isnan() | e.isnan())
    a, e = a[kept], e[kept]
    if a.numel() < 2:
        return None
    if not bool(a.ne(0).any()) and bool(e.ne(0).any()):
        return "all zeros"
    finite = e[e.isfinite()]
    if finite.numel():
        spread, scale = float((finite - finite[0]).abs().max()), float(finite.abs().max())
        varies = spread > 10 * default_tolerance(expected.dtype)[1] * scale
    else:  # (every value an infinity)
        varies = not bool(e.eq(e[0]).all())
    return "constant" if varies and bool(a.eq(a[0]).all()) else None


def collapse_warnings(outputs: Sequence[OutputComparison], said: Sequence[str] = ()) -> list[str]:
    """A warning for each output within tolerance that collapsed where its reference did not (``collapsed``),
    unless ``said`` (the report's warnings) already says it of that output (verify's own check without a
    reference: ``output 0 is all zeros ...``, or this one in an earlier run)."""
    warnings = []
    for comparison in outputs:
        if comparison.collapsed is None or not comparison.ok:
            continue  # (past tolerance, it is a problem already)
        name = f"output {comparison.index}"
        if any(line.startswith(f"{name} is all zeros") or line.startswith(f"{name} is the same") for line in said):
            continue
        what = "all zeros" if comparison.collapsed == "all zeros" else "one value everywhere"
        warning = (
            f"{name} is {what} where the reference's is not: within atol {comparison.atol:g}, rtol "
            f"{comparison.rtol:g}, but the values carry no signal (cosine similarity "
            f"{comparison.cosine_similarity:.6f})"
        )
        if warning not in said:
            warnings.append(warning)
    return warnings


def top_k_agreement(actual: Any, expected: torch.Tensor, k: int) -> tuple[int, int, int | None] | None:
    """How often ``actual`` ranks the same top ``k`` classes as ``expected`` (logits): (rows, rows that agree, the
    first row that does not or None).

    Rows are the leading dimensions flattened (row-major), classes the last dimension. A row agrees where the
    *sets* of the ``k`` largest indices are equal: the order within the top ``k`` is not compared (a top-5 hit does
    not depend on it). Values are ranked in float64, which holds every floating dtype exactly; NaN ranks above
    every number, as :func:`torch.topk` ranks it. None where it does not apply: not a floating tensor of the
    reference's dtype and shape with a last dimension of at least ``k``, or no rows.
    """
    if (
        not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor)
        or not expected.is_floating_point() or expected.is_quantized
        or actual.dtype != expected.dtype or actual.shape != expected.shape or expected.dim() == 0
        or expected.shape[-1] < k or expected.numel() == 0
    ):  # fmt: skip
        return None

    def top(value: torch.Tensor) -> torch.Tensor:
        rows = value.detach().cpu().to(torch.float64).reshape(-1, value.shape[-1])
        return rows.topk(k, dim=-1).indices.sort(dim=-1).values  # sorted: sets compared, not rankings

    agree = (top(actual) == top(expected)).all(dim=-1)
    rows, agreeing = agree.numel(), int(agree.sum())
    return rows, agreeing, None if agreeing == rows else int((~agree).nonzero()[0, 0])


def say_unranked(report: VerifyReport, k: int, minimum: float | None) -> None:
    """Where ``--top-k k`` ranked none of ``report``'s outputs (none is floating point with at least ``k`` values in
    its last dimension), say so: a note, or a problem where a floor was asked for (``minimum``) and nothing was held
    to it (no pass)."""
    if any(output.top_k is not None for output in report.outputs):
        return
    line = f"--top-k {k}: no output was ranked (none is floating point with at least {k} values in its last dimension)"
    (report.notes if minimum is None else report.problems).append(line)


def ranked(
    comparison: OutputComparison, actual: Any, expected: torch.Tensor, k: int, minimum: float | None = None
) -> OutputComparison:
    """``comparison`` with its top-``k`` agreement (:func:`top_k_agreement`): it fails, with a problem saying so,
    where fewer than ``minimum`` (a fraction) of its rows agree. Reported only without ``minimum``: a top-k that
    differs where the values are within tolerance is a tie broken otherwise, rarely a fault of its own."""
    found = top_k_agreement(actual, expected, k)
    if found is None:
        return comparison
    rows, agreeing, first = found
    comparison.top_k, comparison.top_k_rows = k, rows
    comparison.top_k_agreement, comparison.top_k_first_disagreement = agreeing / rows, first
    if minimum is not None and comparison.top_k_agreement < minimum:
        why = (
            f"its top-{k} indices agree in {agreeing} of {rows} rows ({agreeing / rows:.6g}), fewer than "
            f"--min-top-k-agreement {minimum:g}; the first row that does not is {first}"
        )
        comparison.ok = False
        comparison.problem = (
            f"{comparison.problem}; {why}" if comparison.problem else f"output {comparison.index}: {why}"
        )
    return comparison


# Integer dtypes by width, for comparing bit patterns: equal bits are equal values for an integer.
_SIGNED_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _widened(actual: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both values in a dtype that holds every value of theirs exactly, and where they are the same value.

    Floating dtypes (float64 and narrower, float8 included) widen to float64 exactly: each value of a
    narrower IEEE format is a float64 value. Complex widens to complex128. Integers and booleans are
    compared by their bits (equal bits are the same integer) and kept, widened to int64 where that is
    exact, for the size of a difference. NaN is the same as NaN, an infinity as the same infinity.
    """
    if expected.is_floating_point() or expected.is_complex():
        wide = torch.complex128 if expected.is_complex() else torch.float64
        if torch.finfo(expected.dtype).bits > 64:
            raise VerifyInputError(f"values of {expected.dtype} do not widen exactly to {wide}")
        a, e = actual.to(wide), expected.to(wide)
        # The same bits, or both NaN: -0.0 is not 0.0 (1 / x tells them apart).
        same = _same_bits(actual, expected) | (a.isnan() & e.isnan())
        return a, e, same
    same = _same_bits(actual, expected)
    if expected.dtype == torch.uint64:  # past int64: its values, as float64, only size the difference
        return _uint64_sized(actual), _uint64_sized(expected), same
    return actual.to(torch.int64), expected.to(torch.int64), same


def _uint64_sized(value: torch.Tensor) -> torch.Tensor:
    """uint64 values as float64 (read through int64 bits: torch has few uint64 kernels), to size a difference."""
    signed = value.view(torch.int64)
    return signed.double() + (signed < 0) * 2.0**64


def _same_scalar(value: Any, again: Any) -> bool:
    """Two Python values the same: of one type and equal, -0.0 apart from 0.0, NaN the same as NaN."""
    if type(value) is not type(again):
        return False
    if isinstance(value, float):
        if math.isnan(value) or math.isnan(again):
            return math.isnan(value) and math.isnan(again)
        return value == again and math.copysign(1.0, value) == math.copysign(1.0, again)
    return bool(value == again)


def _bits(value: torch.Tensor) -> torch.Tensor:
    """A value's bits as integers of its width (complex: its real and imaginary parts, in the last dimension)."""
    if value.is_complex():
        value = torch.view_as_real(value.to(torch.complex64) if value.element_size() < 8 else value)
    return value.contiguous().view(_SIGNED_OF_WIDTH[value.element_size()])


def _same_bits(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Where two values of one dtype and shape hold the same bits."""
    same = _bits(actual) == _bits(expected)
    return same.all(-1) if actual.is_complex() else same


def identical(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether two tensors are the same in every bit: dtype, shape, quantization and values (a NaN's too)."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    if expected.is_quantized:
        if _quantization_differs(actual, expected) is not None:
            return False
        actual, expected = actual.int_repr(), expected.int_repr()
    return bool(_same_bits(actual.detach().cpu(), expected.detach().cpu()).all())


def _scalar_pair(value: bool | int | float, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A Python scalar and its 0-d reference as two tensors compared without rounding either; None where the
    scalar is not of the reference's kind (0.7 is no int64 0, 7 no ``True``, ``True`` no int).

    A float is compared in float64 with the reference widened to it (exactly), an int in int64 (or the
    reference's own dtype past it), a bool as a bool.
    """
    floating = expected.is_floating_point()
    integral = not floating and not expected.is_complex() and expected.dtype != torch.bool
    if isinstance(value, bool):
        kind = expected.dtype == torch.bool
    else:
        kind = integral if isinstance(value, int) else floating
    if expected.dim() != 0 or not kind:
        return None
    wide = torch.float64 if floating else torch.int64 if integral and expected.dtype != torch.uint64 else expected.dtype
    try:
        converted = torch.tensor(value, dtype=wide)
    except (RuntimeError, OverflowError, ValueError):  # past the dtype's range
        return None
    return converted, expected.to(wide)


def exactly_as(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``value`` in ``dtype`` where that changes none of its values (an engine's int32 scalar as int64); else None."""
    converted = value.to(dtype)
    return converted if identical(converted.to(value.dtype), value) else None


def _quantization_differs(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """How two quantized tensors' schemes, scales or zero points differ; None where they are the same."""
    if actual.qscheme() != expected.qscheme():
        return f"scheme {actual.qscheme()} vs {expected.qscheme()}"
    if expected.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        if actual.q_scale() != expected.q_scale():
            return f"scale {actual.q_scale()!r} vs {expected.q_scale()!r}"
        if actual.q_zero_point() != expected.q_zero_point():
            return f"zero point {actual.q_zero_point()!r} vs {expected.q_zero_point()!r}"
        return None
    if actual.q_per_channel_axis() != expected.q_per_channel_axis():
        return f"channel axis {actual.q_per_channel_axis()} vs {expected.q_per_channel_axis()}"
    channels: list[tuple[torch.Tensor, torch.Tensor, str]] = [
        (actual.q_per_channel_scales(), expected.q_per_channel_scales(), "scales"),
        (actual.q_per_channel_zero_points(), expected.q_per_channel_zero_points(), "zero points"),
    ]
    for got, want, what in channels:
        if got.shape != want.shape or got.dtype != want.dtype or not bool(_widened(got, want)[2].all()):
            return f"per-channel {what} differ"
    return None


def _real(value: torch.Tensor) -> torch.Tensor:
    """A complex value as pairs of reals (for norms and dot products); any other as it is."""
    return torch.view_as_real(value) if value.is_complex() else value


def _first_difference(actual: torch.Tensor, expected: torch.Tensor, same: torch.Tensor) -> str:
    """``; 3 of 64 values differ, the first at [0, 5]: 9007199254740993 vs 9007199254740992``."""
    differing = ~same
    count = int(differing.sum())
    if count == 0:
        return ""
    position = [int(i) for i in differing.nonzero()[0]]
    where = tuple(position)
    got, want = actual[where].item(), expected[where].item()
    return f"; {count} of {same.numel()} values differ, the first at {position}: {got!r} vs {want!r}"


def _sqnr_db(diff: torch.Tensor, actual: torch.Tensor, expected: torch.Tensor) -> float | None:
    """``10 * log10(sum(|expected|**2) / sum(diff**2))`` in dB over the values given (those finite on both sides);
    None where there are none.

    +inf where no value differs; -inf where the reference is all zeros and the value is not (no signal, only
    error). Each sum is of its terms divided by its largest term, the scales added back as logarithms: neither sum
    overflows (values near float64's largest) nor underflows to 0, so a difference of one subnormal (``diff`` is
    never 0 where the values differ) is a finite SQNR, never +inf.
    """
    if diff.numel() == 0:
        return None
    magnitude = expected.abs()
    error_scale, signal_scale = float(diff.max()), float(magnitude.max())
    if error_scale == 0.0:
        return math.inf
    if signal_scale == 0.0:
        return -math.inf
    if math.isinf(error_scale) or math.isinf(signal_scale):
        # A difference (or complex magnitude) of finite values past float64's range: halved, every one is within
        # it, and the ratio is the same.
        return _sqnr_db((actual / 2 - expected / 2).abs(), actual / 2, expected / 2)
    error = float((diff / error_scale).square().sum())
    signal = float((magnitude / signal_scale).square().sum())
    return 10 * math.log10(signal / error) + 20 * (math.log10(signal_scale) - math.log10(error_scale))


def _statistics(
    diff: torch.Tensor, actual: torch.Tensor, expected: torch.Tensor
) -> tuple[float, float, float, float, float]:
    """(max, mean, median, p99) of the absolute error, and the cosine similarity of the two values."""
    if diff.numel() == 0:
        return 0.0, 0.0, 0.0, 0.0, 1.0
    flat = diff.reshape(-1)
    # kthvalue, not quantile: quantile refuses tensors above 16M elements.
    median = float(flat.kthvalue(max(1, (flat.numel() + 1) // 2)).values)
    p99 = float(flat.kthvalue(max(1, min(flat.numel(), -(-99 * flat.numel() // 100)))).values)
    norms = float(actual.norm()) * float(expected.norm())
    if norms == 0.0:
        cosine = 1.0 if float(actual.abs().max()) == float(expected.abs().max()) == 0.0 else 0.0
    else:
        cosine = float((actual.reshape(-1) @ expected.reshape(-1)) / norms)
    return float(flat.max()), float(flat.mean()), median, p99, cosine
