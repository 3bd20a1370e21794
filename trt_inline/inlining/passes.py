"""The two inline passes and ``transform``, wiring every input by position.

A partitioned module looks like this (``_run_on_acc_N`` are engines,
``_run_on_gpu_N`` are PyTorch fallbacks; names are FX's)::

    x -> _run_on_acc_0 ---------------> _run_on_gpu_1(getitem=...) -> _run_on_acc_2 -> getitem, getitem_1

The fallback's placeholder is called ``getitem`` because that was the name of
its producer *before* partitioning; in the parent, ``getitem`` is now a
different node (an output of the later engine). Matching placeholders to parent
nodes by name wires the fallback to that later node: ``lint()`` fails with
"used before it has been defined", or the file loads and computes with the
wrong tensor. Every pass here ties a submodule input to its producer through
the one fact that survives renaming: its position in ``call_node.args``.

Nothing here iterates a set or a dict of nodes to decide an order: nodes are
visited in graph order, inputs in argument order, outputs by their index.

Like other FX passes, the two inline passes edit ``gm.graph`` and leave
``gm.recompile()`` to the caller (``transform`` does it once, after dropping the
absorbed submodules): recompiling a GraphModule regenerates the code of every
GraphModule child too, which would cost the passes far more than the inlining.
Until then ``gm`` keeps running its previous, equivalent code.
"""

from __future__ import annotations

import copy
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from trt_inline import compat, engines
from trt_inline.engines import emit_engine_call, is_accelerated_call, is_fallback_call, unique_attr_name
from trt_inline.errors import InlineError
from trt_inline.inlining import scalars, symbolic
from trt_inline.inlining.attributes import resolve_attribute
from trt_inline.logs import log_graph

__all__ = ["inline_torch_modules", "inline_trt_modules", "transform"]

log = logging.getLogger(__name__)


def _getitem_users(call_node: torch.fx.Node, count: int, what: str) -> list[tuple[torch.fx.Node, int]]:
    """The ``getitem(call_node, i)`` users of a ``count``-output call, each with its own index.

    Anything else reading the call (or an index out of range) is an error naming
    the submodule: a multi-output submodule is only ever read through getitems.
    """
    result = []
    for user in list(call_node.users):
        index = user.args[1] if user.op == "call_function" and user.target is operator.getitem else None
        if not isinstance(index, int) or not -count <= index < count:
            raise InlineError(
                f"{call_node.target}: {count}-output {what} is used by {user.name} ({user.op} "
                f"{user.target}), expected getitem nodes with an index below {count}"
            )
        result.append((user, index))
    return result


# Called after each engine call is inlined with (engine op node, engine module, number of outputs).
EngineHook = Callable[[torch.fx.Node, torch.nn.Module, int], None]

aten = torch.ops.aten


def inline_trt_modules(gm: torch.fx.GraphModule, cross_compile_module: bool = False) -> torch.fx.GraphModule:
    """Replace every engine ``call_module`` by the engine op, in place.

    Before::

        %acc = call_module[_run_on_acc_0](%a, %b)          # one output
        %acc2 = call_module[_run_on_acc_2](%c)             # two outputs
        %getitem_1 = getitem(%acc2, 1)
        %getitem = getitem(%acc2, 0)

    After::

        %_run_on_acc_0_engine = get_attr[_run_on_acc_0_engine]
        %execute_engine = execute_engine([%a, %b], %_run_on_acc_0_engine)
        %getitem_2 = getitem(%execute_engine, 0)           # new, meta["val"] = val[0]
        %execute_engine_1 = execute_engine([%c], ...)
        %getitem_1 = getitem(%execute_engine_1, 1)         # kept, meta["val"] = val[1]
        %getitem = getitem(%execute_engine_1, 0)           # kept, meta["val"] = val[0]

    The engine's inputs are the call's arguments in order. A multi-output
    engine keeps the partitioner's ``getitem`` nodes; each takes ``meta["val"]``
    from its own index argument, whatever order the users were created in.

    Engine ops take and return ``Tensor[]``, so scalars crossing the boundary
    (SymInt, SymFloat, SymBool under dynamic shapes) are converted on both
    sides::

        %n = sym_size(%x, 0)
        %acc = call_module[_run_on_acc_1](%n, %x)          # meta["val"] = [s0 - 1, ...]
        %r = arange(%acc)                                  # traced against a SymInt

    becomes::

        %scalar_tensor = scalar_tensor(%n, dtype=int64, device=<x's>)
        %execute_engine = execute_engine([%scalar_tensor, %x], ...)
        %getitem = getitem(%execute_engine, 0)             # a 0-d int64 tensor
        %item = item(%getitem)                             # meta["val"] = s0 - 1
        %r = arange(%item)
    """
    return inline_engines(gm, cross_compile_module=cross_compile_module)


def inline_engines(
    gm: torch.fx.GraphModule, *, cross_compile_module: bool = False, on_engine: EngineHook | None = None
) -> torch.fx.GraphModule:
    """``inline_trt_modules`` with a hook per engine (Torch-TensorRT 2.14 exposes KV-cache mutations there)."""
    log_graph(log, "before inline_trt_modules", gm)
    sizes = _InputSizes.of(gm)
    program_device = _program_device(gm)
    for call_node in list(gm.graph.nodes):
        if not is_accelerated_call(gm, call_node):
            continue
        name = str(call_node.target)
        vals = call_node.meta.get("val")
        if not isinstance(vals, (list, tuple)) or not vals:
            raise InlineError(
                f"{name}: call node {call_node.name} has no meta['val'] listing the engine's output "
                "values; it is set by torch_tensorrt's compile_module (or trt_inline.reference.compile)"
            )
        if call_node.kwargs:
            raise InlineError(f"{name}: engine called with keyword arguments {sorted(call_node.kwargs)}")
        module = gm.get_submodule(name)
        args = [(arg, produced_value(gm, arg)) for arg in call_node.args]
        boundary = _Boundary.of([value for _, value in args], vals, program_device)
        inputs = [_as_engine_input(gm, call_node, arg, value, boundary) for arg, value in args]
        engine_call = emit_engine_call(gm, call_node, module, inputs, cross_compile_module=cross_compile_module)
        engine_call.meta["val"] = [boundary.engine_value(val) for val in vals]

        if len(vals) == 1:
            with gm.graph.inserting_after(engine_call):
                output = gm.graph.call_function(operator.getitem, (engine_call, 0))
            output.meta["val"] = engine_call.meta["val"][0]
            call_node.replace_all_uses_with(output)
            _restore_scalar(gm, output, vals[0], sizes, f"{name} output 0")
        else:
            users = _getitem_users(call_node, len(vals), "engine")
            call_node.replace_all_uses_with(engine_call)
            for user, index in users:
                user.meta["val"] = engine_call.meta["val"][index]
                _restore_scalar(gm, user, vals[index], sizes, f"{name} output {index}")
        gm.graph.erase_node(call_node)
        if on_engine is not None:
            on_engine(engine_call, module, len(vals))
    log_graph(log, "after inline_trt_modules", gm)
    return gm


def _program_device(gm: torch.fx.GraphModule) -> torch.device:
    """The device of the program's first tensor input (its first parameter or buffer where it takes none)."""
    for node in gm.graph.nodes:
        if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor):
            return torch.device(node.meta["val"].device)
    for tensor in (*gm.parameters(), *gm.buffers()):
        return tensor.device
    return torch.device("cpu")


@dataclass(frozen=True)
class _Boundary:
    """Where an engine's boundary values live: the device of its first tensor input, and the fake mode."""

    device: torch.device
    fake_mode: Any

    @staticmethod
    def of(input_values: Sequence[Any], vals: Sequence[Any], program_device: torch.device) -> _Boundary:
        """``program_device``: where an engine that takes and returns only scalars lives (the program's inputs'
        device, never a default: a CUDA program's scalar engine on the CPU is a device placement bug)."""
        tensors = [value for value in [*input_values, *vals] if isinstance(value, torch.Tensor)]
        device = tensors[0].device if tensors else program_device
        return _Boundary(device, compat.detect_fake_mode(tensors))

    def engine_value(self, value: Any) -> Any:
        """What the engine op itself produces for a value: a scalar becomes a 0-d tensor."""
        if not scalars.is_scalar(value):
            return value
        if self.fake_mode is None:
            return torch.empty((), dtype=scalars.dtype_of(value), device="meta")
        with self.fake_mode:
            return torch.empty((), dtype=scalars.dtype_of(value), device=self.device)


def produced_value(gm: torch.fx.GraphModule, arg: Any) -> Any:
    """The (fake) value ``arg`` carries: its ``meta["val"]``, or what the submodule producing it says.

    The partitioner sets ``meta["val"]`` on engine calls only; a fallback's
    output is described by the fallback's own graph (its output node's value,
    or output ``i`` of it for ``getitem(call, i)``). A literal is its own value.
    """
    if not isinstance(arg, torch.fx.Node):
        return arg
    if "val" in arg.meta:
        return arg.meta["val"]
    call, index = arg, None
    if arg.op == "call_function" and arg.target is operator.getitem and isinstance(arg.args[0], torch.fx.Node):
        call, index = arg.args[0], arg.args[1]
    if call.op != "call_module":
        return None
    module = gm.get_submodule(str(call.target))
    if not isinstance(module, torch.fx.GraphModule):
        return None
    result = next(n for n in reversed(module.graph.nodes) if n.op == "output").args[0]
    if index is not None and isinstance(result, (list, tuple)) and isinstance(index, int):
        result = result[index]
    return result.meta.get("val") if isinstance(result, torch.fx.Node) else result


def _as_engine_input(
    gm: torch.fx.GraphModule, call_node: torch.fx.Node, arg: Any, value: Any, boundary: _Boundary
) -> Any:
    """``arg`` as the engine op takes it: a tensor as it is, a scalar as a new 0-d tensor in front of the call."""
    if not scalars.is_scalar(value):
        return arg
    kwargs: dict[str, Any] = {"dtype": scalars.dtype_of(value), "device": boundary.device}
    with gm.graph.inserting_before(call_node):
        tensor = gm.graph.call_function(aten.scalar_tensor.default, (arg,), kwargs)
    tensor.meta["val"] = boundary.engine_value(value)
    return tensor


def _restore_scalar(
    gm: torch.fx.GraphModule, output: torch.fx.Node, value: Any, sizes: _InputSizes, label: str
) -> None:
    """If the engine output ``output`` stands for a scalar, read it back with ``item`` for its consumers.

    Traced again, ``item`` gives a fresh unbacked symbol; where the scalar is an
    expression in the input sizes, an assertion restates it, so that the tracer
    replaces the symbol by the expression (and the saved program checks it)::

        %item = item(%getitem)                    # meta["val"] = s0 - 1
        %sym_size = sym_size(%x, 0)
        %add = add(%sym_size, -1)                 # rebuilt from the recorded expression
        %eq = eq(%item, %add)
        %_assert_scalar = _assert_scalar(%eq, "... output 0 equals s0 - 1")

    ``_assert_scalar`` rather than ``torch._check``: it has side effects for dead
    code elimination (Torch-TensorRT's own ``transform`` runs one), an
    ExportedProgram may hold it, and tracing learns from it all the same.
    """
    if not scalars.is_scalar(value):
        return
    with gm.graph.inserting_after(output):
        item = gm.graph.call_function(aten.item.default, (output,))
    item.meta["val"] = value
    output.replace_all_uses_with(item, delete_user_cb=lambda user: user is not item)
    expr = symbolic.encode(value.node.expr) if isinstance(value, torch.SymInt) else None
    if expr is None or isinstance(expr, int) or not sizes.cover(expr):
        return  # static, or data-dependent: nothing in the inputs to restate it with
    with gm.graph.inserting_before(item.next):
        rebuilt = symbolic.build(gm.graph, expr, lambda name: sizes.node(gm.graph, name))
        equal = gm.graph.call_function(operator.eq, (item, rebuilt))
        equal.meta["val"] = value == symbolic.evaluate(expr, sizes.values)
        message = f"trt_inline: {label} equals {value}, as when it was compiled"
        gm.graph.call_function(compat.assert_scalar_op(), (equal, message)).meta["val"] = None


@dataclass
class _InputSizes:
    """Where each size symbol can be read: ``{"s0": (x, 0, 1, 0)}``, from the placeholders' fake values.

    An entry ``(placeholder, dim, scale, offset)`` says the size is ``scale * s + offset``
    (a derived ``Dim`` such as ``2 * half``); a plain size is scale 1, offset 0 and is preferred.
    """

    where: dict[str, tuple[torch.fx.Node, int, int, int]]
    values: dict[str, Any]

    @staticmethod
    def of(gm: torch.fx.GraphModule) -> _InputSizes:
        where: dict[str, tuple[torch.fx.Node, int, int, int]] = {}
        values: dict[str, Any] = {}
        for node in gm.graph.nodes:
            if node.op != "placeholder":
                continue
            value = node.meta.get("val")
            for dim, term in enumerate(symbolic.size_terms(value)):
                if term is None:
                    continue
                name, scale, offset = term
                if name not in where or (scale, offset) == (1, 0) != where[name][2:]:
                    where[name] = (node, dim, scale, offset)
                    values[name] = (value.shape[dim] - offset) // scale
        return _InputSizes(where, values)

    def cover(self, expr: Any) -> bool:
        try:
            symbolic.evaluate(expr, self.values)
        except KeyError:
            return False
        return True

    def node(self, graph: torch.fx.Graph, name: str) -> torch.fx.Node:
        placeholder, dim, scale, offset = self.where[name]
        size = graph.call_function(aten.sym_size.int, (placeholder, dim))
        size.meta["val"] = placeholder.meta["val"].shape[dim]
        # The symbol read back from a derived size: (size - offset) // scale.
        expr: Any = {"sym": name}
        if offset:
            expr = {"Add": [expr, -offset]}
        if scale != 1:
            expr = {"FloorDiv": [expr, scale]}
        return symbolic.build(graph, expr, lambda _: size)  # type: ignore[no-any-return]


# The submodule torch 2.9+'s ExportedProgram.module() checks the inputs with (a GuardsFn).
_GUARDS = "_guards_fn"


def _move_attribute(
    gm: torch.fx.GraphModule,
    fallback_module: torch.nn.Module,
    fallback_name: str,
    target: str,
    moved: dict[int, str],
) -> str:
    """Register ``fallback_module.<target>`` on ``gm`` under a fresh flat name; return it.

    Parameters stay parameters and buffers stay buffers (with their persistence),
    so export lifts each with its true kind. The same object reached from two
    fallbacks (a shared weight) is registered once.
    """
    try:
        owner, leaf, value = resolve_attribute(fallback_module, target)
    except AttributeError as exc:
        raise InlineError(f"{fallback_name}: references attribute {target!r}, which it does not have") from exc
    if id(value) in moved:
        return moved[id(value)]
    name = unique_attr_name(gm, f"{fallback_name}_{target}")
    if target == _GUARDS and isinstance(value, compat.guard_call_types()) and not hasattr(gm, _GUARDS):
        # Where ExportedProgram.module() keeps it: refit matches a re-partitioned module's children
        # against a loaded program's, which hold the input guard as `_guards_fn`.
        name = _GUARDS
    persistent = compat.buffer_persistent(owner, leaf)
    if isinstance(value, torch.nn.Parameter):
        gm.register_parameter(name, value)
    elif isinstance(value, torch.nn.Module):
        gm.add_module(name, value)
    elif persistent is not None:
        gm.register_buffer(name, value, persistent=persistent)
    else:
        setattr(gm, name, value)
    moved[id(value)] = name
    return name


def inline_torch_modules(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Copy every fallback submodule's body in front of its call, in place.

    Before::

        %getitem = getitem(%execute_engine_1, 0)     # a later engine's output
        ...
        %gpu = call_module[_run_on_gpu_1](%getitem_2)
            # _run_on_gpu_1: placeholder getitem -> relu(getitem) -> output relu

    After::

        %relu = relu(%getitem_2)                     # argument 0 -> placeholder 0
        (%gpu's users now read %relu)

    ``graph_copy`` is seeded with ``val_map = {placeholder_i: call_node.args[i]}``,
    so no placeholder is copied and no name is consulted. A multi-output
    fallback's ``getitem(call, i)`` users are replaced by output ``i``; an output
    that is a placeholder passed through becomes the call's argument. Attributes
    the copied nodes read (parameters, buffers, constants, ``call_module``
    targets) move to ``gm`` under names that cannot collide, and the copies are
    retargeted; the input guard (``_guards_fn``) keeps its name, as a loaded
    program's module has it.
    """
    log_graph(log, "before inline_torch_modules", gm)
    moved: dict[int, str] = {}
    for call_node in list(gm.graph.nodes):
        if not is_fallback_call(gm, call_node):
            continue
        name = str(call_node.target)
        fallback_module = gm.get_submodule(name)
        if not isinstance(fallback_module, torch.fx.GraphModule):
            raise InlineError(
                f"{name}: fallback submodule is a {type(fallback_module).__qualname__}, expected a GraphModule"
            )
        if call_node.kwargs:
            raise InlineError(f"{name}: fallback called with keyword arguments {sorted(call_node.kwargs)}")
        placeholders: list[torch.fx.Node] = []
        attribute_nodes: list[torch.fx.Node] = []
        for node in fallback_module.graph.nodes:
            if node.op == "placeholder":
                placeholders.append(node)
            elif node.op == "get_attr" or node.op == "call_module":
                attribute_nodes.append(node)
        if len(placeholders) != len(call_node.args):
            raise InlineError(
                f"{name}: call node {call_node.name} passes {len(call_node.args)} arguments, "
                f"the submodule has {len(placeholders)} placeholders "
                f"({', '.join(p.name for p in placeholders)})"
            )

        val_map: dict[torch.fx.Node, Any] = dict(zip(placeholders, call_node.args, strict=True))
        with gm.graph.inserting_before(call_node):
            output = gm.graph.graph_copy(fallback_module.graph, val_map)

        for node in attribute_nodes:
            val_map[node].target = _move_attribute(gm, fallback_module, name, str(node.target), moved)

        _replace_fallback_uses(call_node, output, name)
        gm.graph.erase_node(call_node)
    log_graph(log, "after inline_torch_modules", gm)
    return gm


def _replace_fallback_uses(call_node: torch.fx.Node, output: Any, name: str) -> None:
    if isinstance(output, (tuple, list)):
        for user, index in _getitem_users(call_node, len(output), "fallback"):
            user.replace_all_uses_with(output[index])
            user.graph.erase_node(user)
        return
    if call_node.users and not isinstance(output, torch.fx.Node):
        raise InlineError(f"{name}: fallback returns {output!r}, which its users cannot read")
    call_node.replace_all_uses_with(output)


def transform(gm: torch.fx.GraphModule, cross_compile_module: bool = False) -> torch.fx.GraphModule:
    """Flatten a compiled module into one graph: a deep copy, both passes, cleanup, ``lint()``.

    The argument is left untouched: :func:`copy_module`, then :func:`flatten_in_place` of the copy.
    """
    return flatten_in_place(copy_module(gm), cross_compile_module)


def flatten_in_place(gm: torch.fx.GraphModule, cross_compile_module: bool = False) -> torch.fx.GraphModule:
    """Both passes in place, then cleanup and ``lint()``; returns ``gm``, recompiled.

    Submodules no node calls any more are deleted, dead code is eliminated, and
    the graph is linted, so a miswired graph fails here rather than in a
    deployment.
    """
    inline_trt_modules(gm, cross_compile_module)
    inline_torch_modules(gm)
    gm.delete_all_unused_submodules()
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    log_graph(log, "after transform (flat graph)", gm)
    return gm


def copy_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm``'s modules and graphs that shares every tensor and engine with ``gm``.

    The passes rewire graphs and register attributes on the copy; they never
    write a tensor or an engine. Sharing those keeps the caller's module
    untouched without a second copy of its weights, and never re-creates an
    engine (which a release's ``TorchTensorRTModule`` without ``__deepcopy__``
    would, by deserializing it again). Every tensor keeps its kind: a
    GraphModule's deepcopy re-registers tensors as persistent buffers, which
    :func:`compat.restore_attribute_kinds` undoes.
    """
    result = copy.deepcopy(gm, _shared_values(gm))
    compat.restore_attribute_kinds(gm, result)
    return result


def _shared_values(gm: torch.nn.Module) -> dict[int, Any]:
    """A ``deepcopy`` memo mapping every tensor, script object and engine module of ``gm`` to itself."""
    memo: dict[int, Any] = {}
    for module in gm.modules():
        if engines.backend_of(module) is not None:
            memo[id(module)] = module
            continue
        values = [
            *(p for _, p in module.named_parameters(recurse=False)),
            *(b for _, b in module.named_buffers(recurse=False)),
            *vars(module).values(),
        ]
        for value in values:
            if isinstance(value, (torch.Tensor, torch.ScriptObject)):
                memo[id(value)] = value
    return memo
