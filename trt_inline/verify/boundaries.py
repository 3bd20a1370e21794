"""Engine boundaries: what each engine received and returned, recorded from a compiled module or a saved program.

A partitioned program alternates engines and the regions left to PyTorch::

    x ──► engine 0 ──► getitem ──► relu ──► engine 1 ──► getitem_2 ──► OUTPUT
                   └─► getitem_1 ───────────┘
                        (relu: the fallback region feeding engine 1 in[0])

:func:`recording` hooks every engine submodule of a compiled (in-memory) module
(``_run_on_acc_N``) while it runs: the reference a save embeds. :func:`trace_program`
runs a loaded flat program node by node and keeps the same at every engine call;
given a recording, it also runs each engine alone on its recorded inputs, which
is that engine's own error rather than the one it inherits. For each engine
input it also names the fallback region that produced it (its torch nodes, their
producers and consumers in the ``inspect`` vocabulary), which is what a report
names when the error first appears there; and, in the user's terms where the file
records them, the modules an engine's steps come from and what it reads and feeds
(:mod:`trt_inline.module_paths`).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from trt_inline import engines, progress
from trt_inline.archive.reference_io import EngineBoundary
from trt_inline.engines import EngineOp, is_accelerated_call, is_engine_call
from trt_inline.errors import VerifyInputError, first_line
from trt_inline.inlining.module_state import buffers_restored
from trt_inline.isolation import is_allocation_failure
from trt_inline.module_paths import Coverage
from trt_inline.verify.checked_run import CheckedRun, running_as
from trt_inline.verify.compare import isolated_run, normal_call
from trt_inline.verify.graph_table import Region, Vocabulary

__all__ = [
    "Crash",
    "EngineCall",
    "ProgramTrace",
    "Region",
    "as_boundaries",
    "boundary_tensors",
    "provenance",
    "record_program_boundaries",
    "recording",
    "trace_program",
]


def boundary_tensors(values: Any) -> list[torch.Tensor]:
    """The leaves of an engine's inputs or outputs as CPU tensors of their own; a Python scalar as the 0-d tensor
    engines take.

    Copies: a value the run writes later (an engine updating a cache in place, a
    buffer put back after the run) must stay what it was at the boundary. ``int``
    becomes int64, ``float`` float64 and ``bool`` bool (the dtypes the engine ops
    give scalars crossing a boundary).
    """
    result = []
    for value in pytree.tree_leaves(values):
        if isinstance(value, torch.Tensor):
            result.append(value.detach().to("cpu", copy=True))
        elif isinstance(value, (bool, int, float)):
            dtype = torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else torch.float64
            result.append(torch.tensor(value, dtype=dtype))
        else:
            raise VerifyInputError(f"an engine boundary carries a {type(value).__name__}, not a tensor or a scalar")
    return result


def _source(node: Any) -> str:
    """Where an engine input comes from in a compiled module, as its graph names it."""
    if not isinstance(node, torch.fx.Node):
        return repr(node)
    if node.op == "placeholder":
        return f"input {node.target}"
    if node.op == "call_module":
        return f"{node.target} output 0"
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "call_module":
        return f"{node.args[0].target} output {node.args[1]}"
    return node.name


def provenance(module: Any) -> dict[str, Any] | None:
    """Which node of the exported program each value crossing between PyTorch and an engine is, in a compiled module.

    ``{"engines": [{"inputs": [...], "outputs": [...]}, ...], "outputs": [...]}``:
    for each engine call in graph order, the exported node each input and each
    output is; then the program's outputs. The partitioner keeps the exported
    program's node names inside a fallback, and names a submodule's placeholders
    after the nodes whose values they receive::

        _run_on_acc_1 ─► getitem_1 ─► _run_on_gpu_2(…, getitem_1)      (its placeholder: linear_1)
                                      → _run_on_acc_1 output 1 is linear_1
        _run_on_gpu_2 ─► getitem_2 ─► _run_on_acc_3(getitem_2)         (_run_on_gpu_2 returns relu)
                                      → _run_on_acc_3 input 0 is relu

    ``diff`` of two partitions of one model compares the values both name
    alike. The names of a saved program's own nodes are no such key: a
    re-export names them again, counting only the nodes left to PyTorch. "" where
    the module does not say (a program input, an engine output read only by
    engines or returned). None for a module that is not a compiled one.
    """
    if not isinstance(module, torch.fx.GraphModule):
        return None
    engine_nodes = [n for n in module.graph.nodes if is_accelerated_call(module, n)]
    if not engine_nodes:
        return None
    output_node = next(n for n in reversed(module.graph.nodes) if n.op == "output")
    return {
        "engines": [
            {"inputs": [_exported_name(module, a) for a in n.args], "outputs": _computed_nodes(module, n)}
            for n in engine_nodes
        ],
        "outputs": [_exported_name(module, value) for value in pytree.tree_leaves(output_node.args[0])],
    }


def _exported_name(module: torch.fx.GraphModule, value: Any) -> str:
    """The exported node a fallback's output is (its output's argument); "" for anything else."""
    call, index = value, None
    if isinstance(value, torch.fx.Node) and value.target is operator.getitem:
        call, index = value.args[0], value.args[1]
    if not (isinstance(call, torch.fx.Node) and call.op == "call_module") or is_accelerated_call(module, call):
        return ""
    fallback_module = module.get_submodule(str(call.target))
    if not isinstance(fallback_module, torch.fx.GraphModule):
        return ""
    result = next(n for n in reversed(fallback_module.graph.nodes) if n.op == "output").args[0]
    if isinstance(index, int) and isinstance(result, (list, tuple)):
        result = result[index] if index < len(result) else None
    if not isinstance(result, torch.fx.Node):
        return ""
    return str(result.target) if result.op == "placeholder" else result.name


def _computed_nodes(module: torch.fx.GraphModule, engine_node: torch.fx.Node) -> list[str]:
    """The exported node each output of an engine is, where a fallback reads it (its placeholder's name)."""
    getitems = [u for u in engine_node.users if u.op == "call_function" and u.target is operator.getitem]
    values = {int(u.args[1]): u for u in getitems if isinstance(u.args[1], int)} if getitems else {0: engine_node}
    computes = [""] * (max(values) + 1 if values else 0)
    for index, value in values.items():
        for user in value.users:
            fallback_module = module.get_submodule(str(user.target)) if user.op == "call_module" else None
            if not isinstance(fallback_module, torch.fx.GraphModule) or is_accelerated_call(module, user):
                continue
            placeholders = [n for n in fallback_module.graph.nodes if n.op == "placeholder"]
            position = next((p for p, arg in enumerate(user.args) if arg is value), None)
            if position is not None and position < len(placeholders):
                computes[index] = str(placeholders[position].target)
                break
    return computes


@contextlib.contextmanager
def recording(module: Any) -> Iterator[list[EngineBoundary]]:
    """While inside, every call of an engine submodule of ``module`` appends its :class:`EngineBoundary`.

    ``module`` is a compiled module (``torch_tensorrt.dynamo.compile``,
    ``trt_inline.reference.compile``): a GraphModule whose engines are
    ``call_module`` nodes. The hooks are removed on the way out, also when the
    run raises. A module without engine submodules records nothing.
    """
    records: list[EngineBoundary] = []
    handles = []
    if isinstance(module, torch.fx.GraphModule):
        for call_node in module.graph.nodes:
            if not is_accelerated_call(module, call_node):
                continue
            name = str(call_node.target)
            sources = [_source(arg) for arg in call_node.args]
            given: list[list[torch.Tensor]] = []  # the inputs as the engine got them (it may write one)

            def before(_: torch.nn.Module, inputs: Any, given: list[list[torch.Tensor]] = given) -> None:
                given.append(boundary_tensors(inputs))

            def hook(
                _: torch.nn.Module,
                inputs: Any,
                output: Any,
                name: str = name,
                sources: list[str] = sources,
                given: list[list[torch.Tensor]] = given,
            ) -> None:
                records.append(EngineBoundary(name, given.pop(), boundary_tensors(output), sources))

            engine_module = module.get_submodule(name)
            handles.append(engine_module.register_forward_pre_hook(before))
            handles.append(engine_module.register_forward_hook(hook))
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class EngineCall:
    """One engine call of a program's run."""

    index: int  # among the program's engine calls, in the order they ran
    node: str  # the engine call node
    label: str  # the engine's submodule where the file names it ("_run_on_acc_1"), else "engine <index>"
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    producers: list[str]  # each input's producer, in the inspect vocabulary
    regions: list[Region]  # each input's fallback region
    consumers: list[str]  # who reads its outputs
    alone: list[torch.Tensor] | None = None  # its outputs run alone on the recorded inputs
    alone_problem: str | None = None  # why it could not be run alone
    # The engine op and its arguments after the inputs (a reference engine's payload and program): what the drill
    # inside a divergent engine runs (:mod:`trt_inline.verify.drill`).
    op: EngineOp | None = field(default=None, compare=False, repr=False)
    engine: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    # In the user's terms, where the file records them (:mod:`trt_inline.module_paths`): the modules and source
    # lines its steps come from, and what it reads and feeds (``reads relu: 0.act (ReLU); model.py:31 ...``).
    coverage: Coverage = field(default_factory=Coverage)
    near: list[str] = field(default_factory=list)


@dataclass
class Crash:
    """Where a run raised: the node, the engine call or fallback region it belongs to, and the exception."""

    node: str
    engine: int | None  # the engine call's index, where it was an engine that raised
    region: Region | None  # the fallback region of the node, where it was a torch node
    error: str  # "RuntimeError: ...", first line only

    def where(self, calls: Sequence[EngineCall]) -> str:
        if self.engine is not None:
            return f"engine {self.engine} ({calls[self.engine].label})"
        return f"{self.region.name() if self.region and self.region.nodes else 'node'} (node {self.node})"


@dataclass
class ProgramTrace:
    calls: list[EngineCall]
    outputs: list[Any]
    output_producers: list[str]
    output_regions: list[Region]
    # Where the run raised (then ``outputs`` is empty and ``unreached`` holds the engines it did not get to).
    crash: Crash | None = None
    unreached: list[EngineCall] = field(default_factory=list)
    # Where a value the run computed disagrees with what its node declares (:mod:`trt_inline.verify.declared`):
    # at engines, then at torch's own operators.
    disagreements: list[str] = field(default_factory=list)


class _Stopped(Exception):
    """The run raised at a node: what and where is in the tracer's ``crash``."""


def as_boundaries(trace: ProgramTrace) -> list[EngineBoundary]:
    """A trace's engine calls as boundary records (one file as the reference of another)."""
    return [EngineBoundary(call.label, call.inputs, call.outputs, call.producers) for call in trace.calls]


def _label(call_node: torch.fx.Node, index: int) -> str:
    """The engine's submodule name, read from the attribute its engine is stored under, where there is one."""
    return engines.engine_submodule_name(call_node) or f"engine {index}"


def _fits(recorded: torch.Tensor, actual: Any) -> bool:
    """Whether a recorded input may stand in for the actual one: same shape, and same dtype unless a 0-d scalar."""
    if not isinstance(actual, torch.Tensor) or recorded.shape != actual.shape:
        return False
    return recorded.dim() == 0 or recorded.dtype == actual.dtype


class _Tracer(CheckedRun):
    """A checked run (:class:`~trt_inline.verify.checked_run.CheckedRun`, unsighted) that keeps every engine
    call's values, where the run stops, and, given a recording, each engine's outputs run alone."""

    def __init__(
        self, module: torch.fx.GraphModule, recorded: Sequence[EngineBoundary] | None, device: str | None = None
    ) -> None:
        super().__init__(module, device, None)
        self.recorded = recorded
        self.words = Vocabulary(module.graph)
        self.calls: list[EngineCall] = []
        self.crash: Crash | None = None
        self.engine_count = sum(1 for n in module.graph.nodes if is_engine_call(n))

    def run_node(self, n: torch.fx.Node) -> Any:
        if not is_engine_call(n):
            try:
                return super().run_node(n)
            except Exception as exc:
                if is_allocation_failure(exc):  # (this process's memory limit: said as one, never a divergence)
                    raise
                region = self.words.region(n) if n.op == "call_function" else None
                self.crash = Crash(n.name, None, region, f"{type(exc).__name__}: {first_line(exc)}")
                raise _Stopped from exc
        progress.report("running the program engine by engine", (len(self.calls) + 1, self.engine_count))
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        index = len(self.calls)
        wired = engines.engine_inputs(n)
        call = EngineCall(
            index,
            n.name,
            _label(n, index),
            boundary_tensors(args[0]),
            [],
            [self.words.producer(a) for a in wired],
            [self.words.region(a) for a in wired],
            [c for out in n.users for c in self.words.consumers(out)],
        )
        call.op, call.engine = engines.engine_op(n), tuple(args[1:])
        call.coverage, call.near = self.words.coverage(n), self.words.near(n)
        if self.recorded is not None and index < len(self.recorded):
            call.alone, call.alone_problem = self._alone(n, args, kwargs, self.recorded[index])
        self.calls.append(call)
        try:
            result = super().run_node(n)
        except Exception as exc:
            if is_allocation_failure(exc):
                raise
            self.crash = Crash(n.name, index, None, f"{type(exc).__name__}: {first_line(exc)}")
            raise _Stopped from exc
        call.outputs = boundary_tensors(result)
        return result

    def unreached(self) -> list[EngineCall]:
        """After a crash: each engine the run did not get to, run alone on its recorded inputs where there are any."""
        later = [n for n in self.graph.nodes if is_engine_call(n)][len(self.calls) :]
        result = []
        for offset, n in enumerate(later):
            index = len(self.calls) + offset
            call = EngineCall(index, n.name, _label(n, index), [], [], [], [], [], coverage=self.words.coverage(n))
            if self.recorded is not None and index < len(self.recorded):
                record = self.recorded[index]
                try:
                    if any(isinstance(a, torch.fx.Node) and a.op != "get_attr" for a in n.args[1:]):
                        raise ValueError("an engine argument computed by the program")
                    rest = [self.fetch_attr(str(a.target)) if isinstance(a, torch.fx.Node) else a for a in n.args[1:]]
                    call.inputs = list(record.inputs)
                    call.alone, call.alone_problem = self._alone(n, (record.inputs, *rest), {}, record)
                except Exception as exc:
                    if is_allocation_failure(exc):
                        raise
                    call.alone_problem = f"it could not be run alone ({type(exc).__name__}: {first_line(exc)})"
            result.append(call)
        return result

    def _alone(
        self, n: torch.fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any], record: EngineBoundary
    ) -> tuple[list[torch.Tensor] | None, str | None]:
        actual = list(args[0])
        if len(actual) != len(record.inputs) or not all(map(_fits, record.inputs, actual)):
            return None, "its recorded inputs do not fit it (another number, shape or kind of inputs)"
        # A scalar crosses as a 0-d tensor whose dtype the engine op chooses: the recorded one takes it.
        inputs = [
            r.to(device=a.device, dtype=a.dtype if r.dim() == 0 else r.dtype)
            for r, a in zip(record.inputs, actual, strict=True)
        ]
        target: Callable[..., Any] = n.target  # type: ignore[assignment]
        try:
            return boundary_tensors(target(inputs, *args[1:], **kwargs)), None
        except Exception as exc:
            if is_allocation_failure(exc):
                raise
            return None, f"running it alone on its recorded inputs raised {type(exc).__name__}: {first_line(exc)}"


def trace_program(
    module: torch.fx.GraphModule,
    args: Sequence[torch.Tensor],
    kwargs: dict[str, torch.Tensor],
    device: str | None,
    recorded: Sequence[EngineBoundary] | None = None,
) -> ProgramTrace:
    """Run a flat program (``ExportedProgram.module()``) on the inputs, keeping every engine call's values.

    Where a node raises, the run stops there and the trace says where
    (``crash``); the engines after it are each run alone on their recorded
    inputs (``unreached``), so that their own errors are still known. Runs
    like :func:`trt_inline.verify.compare.run_on`: on ``device`` if given,
    deterministically, restoring the caller's RNG state and flags.
    """
    if device is not None:
        module = module.to(device)
        args = [a.to(device) for a in args]
        kwargs = {k: v.to(device) for k, v in kwargs.items()}
    tracer = _Tracer(module, recorded, device)
    try:
        # The call a user makes (the program's own input checks, its pytree), its graph run by the tracer.
        with isolated_run(), normal_call(), buffers_restored(module) as restored, running_as(module, tracer):
            result = restored.apart(module(*args, **kwargs))
    except VerifyInputError:
        raise
    except _Stopped:
        with isolated_run(), normal_call(), buffers_restored(module):
            unreached = tracer.unreached()
        return ProgramTrace(tracer.calls, [], [], [], tracer.crash, unreached)
    except Exception as exc:
        if is_allocation_failure(exc):
            raise
        raise VerifyInputError(
            f"the program does not accept the inputs ({type(exc).__name__}: {first_line(exc)})"
        ) from exc
    output_node = next(n for n in reversed(module.graph.nodes) if n.op == "output")
    returned = pytree.tree_leaves(output_node.args[0])
    return ProgramTrace(
        tracer.calls,
        list(pytree.tree_leaves(result)),
        [tracer.words.producer(value) for value in returned],
        [tracer.words.region(value) for value in returned],
        disagreements=tracer.declared.summary() + tracer.declared.torch_warnings(),
    )


def record_program_boundaries(
    module: torch.fx.GraphModule, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[EngineBoundary]:
    """The boundaries of a flat program's run (an ExportedProgram given to a save is its own reference)."""
    return as_boundaries(trace_program(module, list(args), dict(kwargs), None))
