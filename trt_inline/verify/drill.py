"""Inside the first divergent engine, op by op: the first op whose own error crosses its tolerance, in the user's terms.

:mod:`~trt_inline.verify.localize` names the first engine whose inputs agree with
the reference and whose outputs do not. A reference engine
(:mod:`trt_inline.reference`) carries its program: its ops in order, each with
the module path and source line its node was traced from. The drill runs that
program on the engine's inputs in the divergent run, keeping every value, then
runs each op again alone, in float64, on the float64 versions of its own inputs
as the engine computed them: the difference is that op's own error, not the one
it inherits from the ops before it::

    in_0 ─► mul ─► _to_copy(float16) ─► _to_copy(float32) ─► div ─► … ─► out
             │          │
             │          └─ again in float64 on mul's value: 1e5 where the engine has Inf ─► named
             └─ again in float64 on in_0: agrees

Float64 is the exact reference of an op computing in a narrower floating dtype:
each floating dtype widens into it exactly, and a cast an op is asked for (a
``dtype`` argument: the store of a value in float16) is made to float64 instead.
Each op is held to the tolerance of its result's dtype
(:func:`~trt_inline.verify.compare.default_tolerance`, compared by
:func:`~trt_inline.verify.compare.compare_output`, the one comparison). An op
with no narrower floating result (indices, sizes, masks, float64 itself) has no
wider reference and is not run again; nor is one that only moves values
(``getitem``, ``as_strided``, which reads its input's storage as laid out); one
whose float64 run raises or gives other shapes is counted as not measured.

The op named is one whose own error reaches the engine's outputs: with its
float64 value put back in its place and every op after it computing in float64,
the outputs move past their tolerance (:func:`_first_that_reaches`); an op whose
error changes nothing downstream is passed over, and said::

    full(-3.4e38) ─► _to_copy(float16) = -inf ─► add ─► softmax ─► …   (exp gives 0 either way: passed over)
    mul ─► _to_copy(float16) = inf ─► … ─► out                          (out moves by inf: named)

An op without a module path of its own (a rounding a reduced-precision build
inserts) is named by the op whose value it reads (a cast of a weight, by the op
that reads it): the float16 overflow of
``big = h * h`` reads as that line. A TensorRT engine is a serialized plan
without its subgraph: there is no op-level program, and the report says so.

Where the region a TensorRT engine covers is at hand (its ATen graph, on a GPU),
:func:`rebuild_drill_down` rebuilds it as one engine per step, with the compiler
given, and compares each step's engine, run on what the steps before it compute
in float64, with the same step in float64::

    region:  in_0 ─► addmm ─► relu ─► sub ─► out       rebuilt:  [addmm] [relu] [sub]   each alone
                       ▲                                             ▲
                       └─ its engine and float64 part here: named ───┘
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from trt_inline import progress
from trt_inline.engines import REFERENCE_OP, EngineOp
from trt_inline.errors import EngineFormatError, RefusedOperatorError, VerifyInputError, first_line
from trt_inline.isolation import is_allocation_failure
from trt_inline.reference.program import EngineProgram, float64_values, load_program
from trt_inline.verify.boundaries import EngineCall, ProgramTrace
from trt_inline.verify.compare import compare_output, default_tolerance, isolated_run
from trt_inline.verify.extract import diverged_engine
from trt_inline.verify.report import Divergence, OpDrill

__all__ = [
    "OpError", "drill_call", "drill_divergence", "drill_program", "op_level_program", "own_errors",
    "rebuild_drill_down",
]  # fmt: skip

# Compiles a one-step program for its inputs into something callable on them: an engine of that step.
StepCompiler = Callable[[torch.fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]

NO_PROGRAM = "a TensorRT engine: its serialized plan carries no op-level program, so no op inside it can be named"
# Ops that only select or move values: exact in any dtype, and as_strided reads its input's storage as laid out.
_MOVES_ONLY = frozenset({"aten::as_strided.default", "aten::as_strided_copy.default"})


@dataclass(frozen=True)
class OpError:
    """One op's own error: its result against the same op run again in float64 on its inputs as computed."""

    step: int
    ok: bool
    error: str  # how it differs, where past tolerance: "16 Inf where the reference is finite in float16 (...)"
    # Its float64 result (what :func:`_first_that_reaches` puts back in its place), where past tolerance.
    exact: Any = field(default=None, compare=False, repr=False)


# The most ops past tolerance whose reach is measured (each one more run of the program).
_MAX_REACHED = 16


def drill_divergence(trace: ProgramTrace, divergence: Divergence | None) -> Divergence | None:
    """``divergence``, its :attr:`~trt_inline.verify.report.Divergence.op_drill` set where it names an engine of
    ``trace`` whose outputs diverge (kind ``"engine"``); any other divergence as it is."""
    index = diverged_engine(divergence)
    if divergence is None or divergence.kind != "engine" or index is None or index >= len(trace.calls):
        return divergence
    divergence.op_drill = drill_call(trace.calls[index])
    return divergence


def op_level_program(op: EngineOp | None, engine: Sequence[Any]) -> EngineProgram | str | None:
    """What an engine call's engine can be drilled with: the program of a reference engine (``engine``: its
    payload and program, the call's arguments after the inputs), a line saying why there is none (a TensorRT
    engine), or None for a call that runs no engine."""
    if op is REFERENCE_OP:
        if not (len(engine) >= 2 and isinstance(engine[0], torch.Tensor) and isinstance(engine[1], str)):
            return "its call carries no program to run op by op"
        try:
            return load_program(engine[1])  # (the run loaded it under the file's operator policy: cached)
        except EngineFormatError as exc:
            return f"its program does not decode ({first_line(exc)})"
    if op is not None and op.backend == "tensorrt":
        return NO_PROGRAM
    return None


def drill_call(call: EngineCall) -> OpDrill | None:
    """The op drill of one engine call of a run, on the inputs it got there; None for a call that runs no engine."""
    program = op_level_program(call.op, call.engine)
    if program is None or isinstance(program, str):
        return None if program is None else OpDrill(program)
    progress.report(f"running engine {call.index} ({call.label}) op by op against float64")
    return drill_program(program, call.engine[0], call.inputs)


def drill_program(program: EngineProgram, payload: torch.Tensor, inputs: Sequence[torch.Tensor]) -> OpDrill:
    """The first op of ``program`` whose own error on ``inputs`` crosses its tolerance, with its module path and
    source line; where none does, a line saying so. A program that cannot be run op by op is said in one line."""
    try:
        with torch.no_grad(), isolated_run():
            values = program.values([t.to(payload.device) for t in inputs], payload)
        errors = _own_errors(program, values, payload.device)
    except RefusedOperatorError:
        raise
    except Exception as exc:  # (a diagnostic after the verdict: said, never the verdict's end)
        why = "this run's memory ran out (--memory-limit raises it)" if is_allocation_failure(exc) else first_line(exc)
        return OpDrill(f"its program could not be run op by op ({type(exc).__name__}: {why})")
    names = program.step_names()
    total, measured = len(errors), sum(1 for e in errors if e is not None)
    past = [e for e in errors if e is not None and not e.ok]
    if not past:
        return OpDrill(
            f"no op's own error crosses its tolerance: each of the {measured} ops measured (of its {total}) agrees "
            "with itself run again alone in float64 on its inputs as the engine computed them; the error "
            "accumulates over many ops, or the program or its weights differ from the reference's"
        )
    first, reach, passed = _first_that_reaches(program, values, payload.device, past)
    if first is None:
        listed = ", ".join(_step_text(program, e.step, total) for e in passed[:3])
        ops = f"{len(past)} ops" if len(past) > 1 else "one op"
        return OpDrill(
            f"the own error of {ops} crosses its tolerance and reaches none of the engine's outputs: with its "
            f"float64 value put back, the outputs {reach} ({listed}{', ...' if len(passed) > 3 else ''}: "
            "a value no output depends on, as a mask's minimum becoming -inf before a softmax); the error "
            "accumulates over many ops, or the program or its weights differ from the reference's"
        )
    named = _named_by(program, first.step)
    later = len(past) - len(passed) - 1
    others = f"; {later} more after it" if later else ""
    skipped = (
        f"; passed over: {', '.join(_step_text(program, e.step, total) for e in passed[:3])}"
        f"{', ...' if len(passed) > 3 else ''}, whose own error reaches no output"
        if passed
        else ""
    )
    origin = program.step_origins()[named]
    return OpDrill(
        f"{_step_text(program, first.step, total)} is the first op whose own error crosses its tolerance and reaches "
        f"the engine's outputs: {first.error}, against itself run again alone in float64 on its inputs as the "
        f"engine computed them; {reach}{skipped}{others}",
        first.step, names[first.step], origin.module, origin.source,
    )  # fmt: skip


def _step_text(program: EngineProgram, step: int, total: int) -> str:
    """``step 4 of 9 (aten::mul.Tensor)``, with the step that names it where the build inserted it."""
    names = program.step_names()
    named = _named_by(program, step)
    text = f"step {step} of {total} ({names[step]}"
    if named < step:
        text += f", which the build inserted, on the result of step {named}, {names[named]}"
    elif named > step:
        text += f", which the build inserted, read by step {named}, {names[named]}"
    return text + ")"


def _first_that_reaches(
    program: EngineProgram, values: list[Any], device: torch.device, past: list[OpError]
) -> tuple[OpError | None, str, list[OpError]]:
    """The first op of ``past`` whose own error reaches the engine's outputs, by how much (or, where none does, by
    how much the largest moves them), and the ops passed over before it.

    An op's own error reaches the outputs where the program's outputs, going on from the engine's own values with
    every step after it computing in float64, move past their dtypes' tolerance (an integer, boolean or shape not
    the same) when its float64 value is put in its place: that op alone, nothing after it adding its own, changes
    what the engine returns. A value no output depends on (a mask's minimum becoming -inf before a softmax, where
    exp gives 0 either way) moves nothing. Where that cannot be measured (a step after it has no float64 kernel,
    or the memory runs out), or past :data:`_MAX_REACHED` ops measured, the next op is named as the first past its
    tolerance, and the text says its reach was not measured. ``values``: the engine's run (:meth:`EngineProgram.values`)
    on ``device``."""
    passed: list[OpError] = []
    largest = 0.0
    try:
        with torch.no_grad(), isolated_run():
            first = program.num_inputs + len(program.weights)
            kinds = [o.dtype if isinstance(o, torch.Tensor) else None for o in program.outputs_of(values)]
            for error in past[:_MAX_REACHED]:
                as_computed = program.outputs_after(values, error.step, values[first + error.step], device)
                exact = program.outputs_after(values, error.step, error.exact, device)
                moved, reaches = _moved(as_computed, exact, kinds)
                if reaches:
                    return error, f"with its float64 value put back, the outputs move by up to {moved:.3g}", passed
                largest = max(largest, moved)
                passed.append(error)
    except RefusedOperatorError:
        raise
    except Exception as exc:  # (a diagnostic after the verdict: said, never the verdict's end)
        why = "this run's memory ran out (--memory-limit raises it)" if is_allocation_failure(exc) else first_line(exc)
        unmeasured = past[len(passed)]
        return unmeasured, f"its reach was not measured ({type(exc).__name__}: {why[:200]})", passed
    if len(past) > _MAX_REACHED:
        return (
            past[_MAX_REACHED],
            f"its reach was not measured (the first {_MAX_REACHED} before it reach no output)",
            passed,
        )
    return None, "do not move" if largest == 0 else f"stay within tolerance (they move by up to {largest:.3g})", passed


def _moved(outputs: Sequence[Any], again: Sequence[Any], dtypes: Sequence[torch.dtype | None]) -> tuple[float, bool]:
    """How far two runs' outputs are apart (inf where one is not finite and the other not the same, or where an
    integer, a boolean or a shape differs), and whether any is past the tolerance of the output's own dtype."""
    worst, past = 0.0, False
    for got, want, dtype in zip(outputs, again, dtypes, strict=False):
        if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or dtype is None:
            continue
        if got.shape != want.shape:
            return math.inf, True
        if not got.is_floating_point() and not got.is_complex():
            if not torch.equal(got, want.to(got.dtype)):
                return math.inf, True
            continue
        if got.numel() == 0:
            continue
        wide, exact = (
            got.to(torch.complex128 if got.is_complex() else torch.float64),
            want.to(torch.complex128 if got.is_complex() else torch.float64),
        )
        same = (wide == exact) | (wide.isnan() & exact.isnan())
        difference = torch.where(same, 0.0, (wide - exact).abs()).nan_to_num(nan=math.inf)
        worst = max(worst, float(difference.max()))
        atol, rtol = default_tolerance(dtype if dtype.is_floating_point else torch.float64)
        past = past or bool((difference > atol + rtol * exact.abs().nan_to_num(posinf=0.0, neginf=0.0)).any())
    return worst, past


def own_errors(program: EngineProgram, payload: torch.Tensor, inputs: Sequence[torch.Tensor]) -> list[OpError | None]:
    """Each step's own error (None where it has no wider reference or is not measured), in program order.

    The program runs on ``inputs`` moved to the payload's device (where the engine ran); each step is then run
    again on the values it read, widened (:func:`_widened`), and its result compared with the step's own.
    """
    with torch.no_grad(), isolated_run():
        values = program.values([t.to(payload.device) for t in inputs], payload)
    return _own_errors(program, values, payload.device)


def _own_errors(program: EngineProgram, values: list[Any], device: torch.device) -> list[OpError | None]:
    """:func:`own_errors` of a run already made (``values``, as :meth:`EngineProgram.values` numbers them)."""
    names = program.step_names()
    with torch.no_grad(), isolated_run():
        first = len(values) - len(program.steps)
        errors: list[OpError | None] = []
        kept = 0
        for index, name in enumerate(names):
            value = values[first + index]
            if name in _MOVES_ONLY or program.steps[index].target is operator.getitem or not _narrow(value):
                errors.append(None)
                continue
            try:
                exact = program.run_step(index, values, device, _widened)
            except RefusedOperatorError:
                raise
            except Exception:  # (an op float64 does not run: not measured)
                errors.append(None)
                continue
            error = _compared(index, value, exact)
            if error is not None and not error.ok:
                kept += 1
                if kept > _MAX_REACHED + 1:  # (only the first ones' reach is measured: the rest hold no copy)
                    error = dataclasses.replace(error, exact=None)
            errors.append(error)
    return errors


def _named_by(program: EngineProgram, index: int) -> int:
    """The step whose module path and source line name step ``index``: itself, or for a step without any (one the
    build inserted), the nearest step before it, through what it reads, that has them; where none does (a cast of
    a weight), the first step after it that reads it and has them."""
    origins, first = program.step_origins(), program.num_inputs + len(program.weights)
    seen = index
    while not (origins[seen].module or origins[seen].source):
        steps = [value - first for value in program.step_reads(seen) if value >= first]
        if not steps:
            return _read_by(program, index)
        seen = steps[0]
    return seen


def _read_by(program: EngineProgram, index: int) -> int:
    """The first step after ``index`` that reads its value (through steps without origins) and has a module path
    or source line; ``index`` itself where none does."""
    origins, first = program.step_origins(), program.num_inputs + len(program.weights)
    pending = [index]
    while pending:
        value = first + pending.pop(0)
        for later in range(value - first + 1, len(program.steps)):
            if value in program.step_reads(later):
                if origins[later].module or origins[later].source:
                    return later
                pending.append(later)
                break
    return index


def _narrow(value: Any) -> bool:
    """Whether a step's result holds a tensor of a floating dtype narrower than float64 (its own error is
    measurable against float64)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return any(isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != torch.float64 for v in values)


def _widened(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A step's arguments in float64: every floating tensor widened (exactly), a floating ``dtype`` asked for made
    float64 (a cast to float16 becomes the value itself); a dtype given positionally (a view as another dtype,
    which reads bits) is left as it is."""
    dtype = kwargs.get("dtype")
    wider = {k: float64_values(v) for k, v in kwargs.items()}
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        wider["dtype"] = torch.float64
    return float64_values(args), wider


def _compared(index: int, value: Any, exact: Any) -> OpError | None:
    """Step ``index``'s result against its float64 run: each narrow floating tensor at its dtype's tolerance; the
    first past it decides. None where the two do not pair up (other shapes: not measured)."""
    whole = exact  # (what the drill puts back in the step's place)
    pairs = list(zip(value, exact, strict=False)) if isinstance(value, (list, tuple)) else [(value, exact)]
    if isinstance(value, (list, tuple)) and (not isinstance(exact, (list, tuple)) or len(exact) != len(value)):
        return None
    worst = None
    for got, want in pairs:
        if not (isinstance(got, torch.Tensor) and got.is_floating_point() and got.dtype != torch.float64):
            continue
        if not isinstance(want, torch.Tensor) or want.shape != got.shape or not want.is_floating_point():
            return None
        atol, rtol = default_tolerance(got.dtype)
        wide, exact = got.to(torch.float64), want.to(torch.float64)
        # Within atol + rtol * |exact| everywhere (an Inf only against the same Inf, NaN against NaN) is within for
        # compare_output too: it is asked, for its verdict and its words, only where this one pass does not settle it.
        if torch.allclose(wide, exact, rtol=rtol, atol=atol, equal_nan=True):
            worst = worst or OpError(index, True, "")
            continue
        found = compare_output(0, wide.cpu(), exact.cpu(), atol, rtol)
        text = f"{found.error_text()} in {str(got.dtype).removeprefix('torch.')} (atol {atol:g}, rtol {rtol:g})"
        if not found.ok:
            return OpError(index, False, text, whole)
        worst = worst or OpError(index, True, text)
    return worst


def rebuild_drill_down(region: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], compile_step: StepCompiler) -> str:
    """A sentence on which step of ``region`` loses precision once each step is an engine of its own.

    ``region``: the ATen graph an engine covers (``ExportedProgram.module()`` of
    the model for a one-engine compile, or an accelerated block before
    conversion), run on ``inputs``. Each ``call_function`` step becomes a program
    of one node whose inputs (values and weights) are placeholders; it is
    compiled with ``compile_step`` and run on the values the whole region
    computes in float64 at its inputs, cast to the dtypes the region runs them
    in; its result is compared with the same step in float64. The first past
    its dtype's tolerance is named. Raises :class:`VerifyInputError` naming a
    step that cannot be compiled or run alone.
    """
    at_precision = _node_values(region, inputs, upcast=False)
    in_float64 = _node_values(region, inputs, upcast=True)
    steps = [n for n in region.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    steps = [n for n in steps if _tensors(at_precision.get(n))]
    for index, node in enumerate(steps):
        program, sources = _one_step(node, at_precision)
        step_inputs = [in_float64[s].to(at_precision[s].dtype) for s in sources]
        try:
            with torch.no_grad():
                result = compile_step(program, step_inputs)(*step_inputs)
        except Exception as exc:
            raise VerifyInputError(
                f"step {index} ({node.name}: {node.target}) could not be compiled and run alone: "
                f"{type(exc).__name__}: {first_line(exc)}"
            ) from exc
        error = _past_tolerance(result, in_float64[node])
        if error is not None:
            return (
                f"rebuilt as {len(steps)} engines of one step each, step {index} ({node.name}: {node.target}) is the "
                f"first whose engine differs from the same step in float64 ({error}): precision is lost there"
            )
    return (
        f"rebuilt as {len(steps)} engines of one step each, every step agrees with the same step in float64: "
        "the region computes what its graph says at its precision"
    )


def _tensors(value: Any) -> bool:
    values = value if isinstance(value, (list, tuple)) else [value]
    return bool(values) and all(isinstance(v, torch.Tensor) for v in values)


def _node_values(region: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], *, upcast: bool) -> dict[Any, Any]:
    """Every node's value in a run of ``region``; ``upcast``: in float64 throughout.

    Upcast, every floating value (inputs, weights, each step's result) is
    float64 and a step asked for another floating dtype (a cast, a constant
    made in the graph) is asked for float64: the reference never drops to the
    region's own precision.
    """

    def wide(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(wide(v) for v in value)
        return value.double() if upcast and isinstance(value, torch.Tensor) and value.is_floating_point() else value

    values: dict[Any, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            values[n] = wide(super().run_node(n))
            return values[n]

        def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if upcast and str(target) == "aten._assert_tensor_metadata.default":
                return None  # it asserts the region's own dtypes, which this run leaves on purpose
            dtype = kwargs.get("dtype")
            if upcast and isinstance(dtype, torch.dtype) and dtype.is_floating_point:
                kwargs = {**kwargs, "dtype": torch.float64}
            return super().call_function(target, args, kwargs)

    with torch.no_grad():
        Recorder(region).run(*inputs, enable_io_processing=False)
    return values


def _one_step(node: torch.fx.Node, values: dict[Any, Any]) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """``node`` as a program of its own: each tensor it reads a placeholder, any other value a constant."""
    graph = torch.fx.Graph()
    sources: list[torch.fx.Node] = []
    placeholders: dict[torch.fx.Node, torch.fx.Node] = {}

    def wire(argument: torch.fx.Node) -> Any:
        if not isinstance(values.get(argument), torch.Tensor):
            return values.get(argument)
        if argument not in placeholders:
            placeholders[argument] = graph.placeholder(f"in_{len(sources)}")
            sources.append(argument)
        return placeholders[argument]

    args = torch.fx.map_arg(node.args, wire)
    kwargs = torch.fx.map_arg(node.kwargs, wire)
    graph.output(graph.call_function(node.target, args, kwargs))  # type: ignore[arg-type]
    return torch.fx.GraphModule(torch.nn.Module(), graph), sources


def _past_tolerance(value: Any, exact: Any) -> str | None:
    """How a step's result differs from its float64 run, where past its dtype's tolerance; else None.

    Compared by :func:`~trt_inline.verify.compare.compare_output`, the one comparison: the result widened to
    float64 (exactly) against the float64 run, at the tolerance of the result's own dtype.
    """
    pairs = list(zip(value, exact, strict=False)) if isinstance(value, (list, tuple)) else [(value, exact)]
    for got, want in pairs:
        if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.is_floating_point()):
            continue
        if got.shape != want.shape or not got.numel():
            continue
        atol, rtol = default_tolerance(got.dtype)
        found = compare_output(0, got.to(want.dtype), want, atol, rtol)
        if not found.ok:
            return f"{found.error_text()} in {str(got.dtype).removeprefix('torch.')}"
    return None
