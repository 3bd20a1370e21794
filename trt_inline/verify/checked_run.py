"""A call of a flat program that also checks each value it computes, as the call a user makes.

The program is called as ``module(*args, **kwargs)`` (its forward hooks, its
input checks, its pytree of inputs and outputs all as in any call); only its
``forward`` runs node by node (:class:`torch.fx.Interpreter`) for the length of
the call, which computes each node with the same operator on the same
arguments as the generated code does::

    module(*args, **kwargs) ─► hooks ─► forward ─► placeholder x ─► relu ─► engine 0 ─► … ─► outputs
                                                   │               │       │
                                                   declared and returned compared at every node
                                                   (DeclaredValues); engine and program outputs sighted
                                                   for the checks that need no reference (Sightings)
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from trt_inline import allowed_ops, compat
from trt_inline.verify.declared import DeclaredValues
from trt_inline.verify.garbage import Sightings, sights

__all__ = ["CheckedRun", "ProgramInputs", "RunChecks", "checking", "run_checks", "running_as"]


# Operators whose values depend on their tensor arguments' sizes only (``zeros_like(x)``, ``x.new_ones(3)``,
# ``x.shape[0]``): what they compute from an input is as constant as a constant.
_SIZES_ONLY = ("new_zeros", "new_ones", "new_full", "new_empty", "sym_size", "sym_numel", "sym_stride", "size",
               "numel")  # fmt: skip


def _sizes_only(node: torch.fx.Node) -> bool:
    name = getattr(node.target, "__name__", str(node.target)).partition(".")[0]
    return node.op == "call_function" and (name.endswith("_like") or name in _SIZES_ONLY)


def _depends_on_inputs(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes whose values depend on the values of a user input (a constant's value is no sign of garbage)."""
    found: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder" or (not _sizes_only(node) and any(a in found for a in node.all_input_nodes)):
            found.add(node)
    return found


class RunChecks(torch.fx.Interpreter):
    """Runs a GraphModule's graph as its generated code does (each node the same operator on the same arguments),
    each call first held to the checks of the values it is given (:func:`allowed_ops.check_run`): what every run
    of a file's program makes, not its first alone (a program whose values differ between runs must not hand a
    checked operator out-of-range arguments where no one looks)."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=True)
        # An operator's own exception as the generated code raises it (no node's stack trace added).
        self.extra_traceback = False

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        allowed_ops.check_run(target, args, kwargs)
        return super().call_function(target, args, kwargs)


class CheckedRun(RunChecks):
    """Runs a GraphModule's graph, checking each value against its declaration and sighting engine outputs.

    ``run``: the run's name in garbage warnings; None runs without sighting (a trace engine by engine, whose
    values the checked call has sighted already). The per-engine trace
    (:func:`~trt_inline.verify.boundaries.trace_program`) is this class with engine calls recorded.
    """

    def __init__(self, module: torch.fx.GraphModule, moved_to: str | None, run: str | None) -> None:
        super().__init__(module)
        self.declared = DeclaredValues(module, moved_to)
        self.sightings = Sightings(run or "")
        self.sighting = run is not None
        self.depends = _depends_on_inputs(module.graph) if self.sighting else set()
        self.engine_names = dict(self.declared.names)  # (engine call -> "engine 2 (_run_on_acc_5)")

    def run_node(self, n: torch.fx.Node) -> Any:
        site = self.engine_names.get(n) if n in self.depends else None
        if site is not None:
            args, _ = self.fetch_args_kwargs_from_env(n)
            before = sights(pytree.tree_leaves(args[0]) if args else [])  # (before the call: it may write one)
        result = super().run_node(n)
        self.declared.check(n, result)
        if site is not None:
            self.sightings.see(site, before, sights(pytree.tree_leaves(result)))
        return result

    def see_program(self, inputs: list[Any], outputs: list[Any]) -> None:
        """The program's own outputs, against its inputs (those that depend on no input are not judged)."""
        output_node = next(n for n in reversed(self.graph.nodes) if n.op == "output")
        returned = pytree.tree_leaves(output_node.args[0])
        judged = [
            value if isinstance(node, torch.fx.Node) and node in self.depends else None
            for node, value in zip(returned, outputs, strict=False)
        ]
        self.sightings.see("the program", sights(inputs), sights(judged))


class ProgramInputs:
    """How a call's arguments become a GraphModule's placeholders: as its generated ``forward`` flattens them.

    Its first parameters positionally, the rest by name, and every container's leaves in the order of the
    program's input spec (a dict's keys as exported, never the caller's order). Read from ``module`` before
    anything replaces its ``forward``.
    """

    def __init__(self, module: torch.fx.GraphModule) -> None:
        self.signature = inspect.Signature(list(inspect.signature(module.forward).parameters.values()))
        self.specs = compat.pytree_specs(module.graph)

    def flatten(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
        bound = self.signature.bind(*args, **kwargs)
        values = list(bound.arguments.values())
        positional = None if self.specs is None else compat.positional_count(self.specs[0])
        keys = None if self.specs is None else compat.keyword_keys(self.specs[0])
        if self.specs is None or positional is None or keys is None:
            return values  # (a graph of flat inputs: its input processing is the identity)
        # The spec's keys paired with the parameters after the positional ones by position, as the generated code
        # pairs them (a file whose parameter names are in another order computes what that pairing gives).
        structured = (values[:positional], dict(zip(keys, values[positional:], strict=False)))
        return list(compat.flatten_by_spec(structured, self.specs[0]))

    def outputs(self, returned: Any) -> Any:
        """The graph's flat outputs as the call returns them."""
        return returned if self.specs is None else pytree.tree_unflatten(list(returned), self.specs[1])


@contextlib.contextmanager
def running_as(module: torch.fx.GraphModule, interpreter: torch.fx.Interpreter) -> Iterator[None]:
    """While inside, a call of ``module`` runs its graph through ``interpreter``: the call a user makes (its
    hooks, the exported program's input checks, its pytree of inputs and outputs), only ``forward`` replaced."""
    inputs = ProgramInputs(module)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return inputs.outputs(interpreter.run(*inputs.flatten(args, kwargs), enable_io_processing=False))

    module.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.forward


@contextlib.contextmanager
def run_checks(module: Any) -> Iterator[None]:
    """While inside, a call of ``module`` runs its own generated code, every call of an operator that
    :func:`allowed_ops.check_run` checks first held to its checks on the values it is given (in every graph of the
    module: the program's, a higher-order operator's branches).

    Before (the generated code)::

        repeat_interleave = torch.ops.aten.repeat_interleave.Tensor(repeats, output_size = 3)

    Inside::

        repeat_interleave = checked_repeat_interleave_tensor(repeats, output_size = 3)

    where ``checked_...`` checks the values and then calls the same operator: the same kernels compute the same
    values, and the input processing is the generated code's own (an interpreter's would be a second
    implementation of it, and a file could make the two disagree). Put back on leaving.
    """
    graphs = [m for m in module.modules() if isinstance(m, torch.fx.GraphModule)] if isinstance(
        module, torch.nn.Module) else []  # fmt: skip
    replaced: list[tuple[torch.fx.GraphModule, torch.fx.Node, Any]] = []
    try:
        for graph_module in graphs:
            nodes = [
                n for n in graph_module.graph.nodes if n.op == "call_function" and allowed_ops.checks_runs(n.target)
            ]
            for node in nodes:
                replaced.append((graph_module, node, node.target))
                node.target = _checked_call(node.target)
            if nodes:
                graph_module.recompile()
        yield
    finally:
        for _, node, target in replaced:
            node.target = target
        for graph_module in {id(g): g for g, _, _ in replaced}.values():
            graph_module.recompile()


def _checked_call(target: Any) -> Callable[..., Any]:
    """``target`` called after :func:`allowed_ops.check_run` on its arguments."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        allowed_ops.check_run(target, args, kwargs)
        return target(*args, **kwargs)

    checked.__name__ = checked.__qualname__ = "checked_" + re.sub(r"\W", "_", str(target))
    return checked


@contextlib.contextmanager
def checking(module: Any, moved_to: str | None, run: str) -> Iterator[CheckedRun | None]:
    """While inside, a call of ``module`` (a GraphModule) runs as a :class:`CheckedRun`; None for other modules."""
    if not isinstance(module, torch.fx.GraphModule):
        yield None
        return
    checked = CheckedRun(module, moved_to, run)
    with running_as(module, checked):
        yield checked
