"""Inside a diverging reference engine: its program's steps against the same steps in float64.

A reference engine (:mod:`trt_inline.reference`) is a program of ATen steps over
its weights. Run on the inputs the compiled module recorded for it, each step's
result is compared with that of the same steps run eagerly with every floating
input and weight in float64; the first step past its dtype's tolerance is where
precision is lost (a half-precision product that overflows, a sum that cancels)::

    in_0 ─► step 0 permute ─► step 1 addmm ─► step 2 split ─► out
                                  ▲
                                  └─ float32 and float64 part here: named

Where every step agrees with its float64 run, the engine computes what its
program says to the precision it runs at: what differs from the compiled module
is the program or its weights. The CPU stand-in for comparing every layer of a
TensorRT engine (Polygraphy's ``--mark all``), which needs the GPU.

A TensorRT engine's layers cannot be observed from its plan: :func:`rebuild_drill_down`
rebuilds the region an engine covers (its ATen graph) as one engine per step,
with the compiler given (``torch_tensorrt.dynamo.compile`` on a GPU), and
compares each step's engine, run on what the steps before it compute in float64,
with the same step in float64::

    region:  in_0 ─► addmm ─► relu ─► sub ─► out       rebuilt:  [addmm] [relu] [sub]   each alone
                       ▲                                             ▲
                       └─ its engine and float64 part here: named ───┘
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from trt_inline.engines import REFERENCE_OP, engine_op
from trt_inline.errors import VerifyInputError, first_line
from trt_inline.reference.program import load_program
from trt_inline.verify.compare import compare_output, default_tolerance

__all__ = ["drill_down", "rebuild_drill_down"]

# Compiles a one-step program for its inputs into something callable on them: an engine of that step.
StepCompiler = Callable[[torch.fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]


def drill_down(module: torch.fx.GraphModule, engine_node_name: str, inputs: Sequence[torch.Tensor]) -> str | None:
    """A sentence on where inside reference engine ``engine_node_name`` precision is lost; None for another kind."""
    node = next((n for n in module.graph.nodes if n.name == engine_node_name), None)
    if node is None or engine_op(node) is not REFERENCE_OP or len(node.args) < 3:
        return None
    payload_node, text = node.args[1], node.args[2]
    if not isinstance(payload_node, torch.fx.Node) or payload_node.op != "get_attr" or not isinstance(text, str):
        return None
    program = load_program(text)
    payload = getattr(module, str(payload_node.target))
    with torch.no_grad():
        at_precision = program.step_values(list(inputs), payload, upcast=False)
        in_float64 = program.step_values(list(inputs), payload, upcast=True)
    names = program.step_names()
    for index, (value, exact) in enumerate(zip(at_precision, in_float64, strict=True)):
        error = _past_tolerance(value, exact)
        if error is not None:
            return (
                f"inside it, step {index} ({names[index]}) of its {len(names)} is the first whose result differs "
                f"from the same steps run in float64 ({error}): precision is lost there"
            )
    return (
        f"inside it, each of its {len(names)} steps agrees with the same steps run in float64: it computes what "
        "its program says, so its program or its weights differ from the compiled module's"
    )


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
