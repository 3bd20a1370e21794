"""Building an ExportedProgram from a flat graph, and the clean-ups the serializer needs.

:func:`exported_program_from_graph` builds one without running the graph (the
``retrace=False`` route of :func:`trt_inline.save`); :func:`lift_into` is the same
lifting for a caller that holds its own graph signature (Torch-TensorRT's
legacy exporter, through the plugin). Both first remove what
``torch.export.save`` cannot take (:func:`drop_unserializable`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram, ExportGraphSignature, ModuleCallEntry
from torch.export.graph_signature import (
    ConstantArgument,
    CustomObjArgument,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from torch.utils import _pytree as pytree

from trt_inline import compat
from trt_inline.errors import SaveError
from trt_inline.inlining import scalars, symbolic
from trt_inline.inlining.attributes import resolve_attribute

__all__ = [
    "add_missing_ranges",
    "drop_provenance",
    "drop_unserializable",
    "in_signature_order",
    "exported_program_from_graph",
    "lift_attributes",
    "lift_into",
    "refuse_call_modules",
]


def in_signature_order(module: Any, kwarg_inputs: dict[str, Any] | None) -> dict[str, Any] | None:
    """Keyword inputs in the order of ``module.forward``'s parameters, whatever order the caller's dict has.

    ``torch.export`` keeps the dict's order in the program's input spec but binds a GraphModule's inputs by
    position when it traces it, so ``{"z": z, "y": y}`` for ``forward(x, y, z)`` wrote a program computing with
    ``y`` and ``z`` swapped. Keywords the signature does not name (``**kwargs``) follow, in the caller's order.
    """
    if not kwarg_inputs or not callable(getattr(module, "forward", None)):
        return kwarg_inputs
    try:
        names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return kwarg_inputs
    ordered = {name: kwarg_inputs[name] for name in names if name in kwarg_inputs}
    ordered.update((name, value) for name, value in kwarg_inputs.items() if name not in ordered)
    return ordered


# Order the ExportedProgram verifier expects lifted inputs in, before user inputs.
_LIFT_ORDER = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ)


def _lifted_kind(owner: torch.nn.Module, leaf: str, value: Any) -> tuple[InputKind, bool | None]:
    if isinstance(value, torch.nn.Parameter):
        return InputKind.PARAMETER, None
    persistent = compat.buffer_persistent(owner, leaf)
    if persistent is not None:
        return InputKind.BUFFER, persistent
    if isinstance(value, torch.Tensor):
        return InputKind.CONSTANT_TENSOR, None
    if isinstance(value, torch.ScriptObject):
        return InputKind.CUSTOM_OBJ, None
    raise SaveError(f"get_attr target {leaf!r} holds a {type(value).__name__}, which cannot be lifted")


def drop_guard_calls(gm: torch.fx.GraphModule) -> None:
    """Remove unused input-guard calls: a loaded program installs guards of its own.

    From torch 2.9, ``ExportedProgram.module()`` adds a ``call_module`` to a
    ``GuardsFn``; after inlining it sits in the flat graph, and no
    ExportedProgram may hold a ``call_module``. Earlier torch adds none.
    """
    guard_types = compat.guard_call_types()
    if not guard_types:
        return
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and not node.users and isinstance(gm.get_submodule(str(node.target)), guard_types):
            gm.graph.erase_node(node)
    gm.delete_all_unused_submodules()


def drop_unserializable(gm: torch.fx.GraphModule) -> None:
    """Remove from a flat graph what ``torch.export.save`` cannot take: guard calls, then settled assertions."""
    drop_guard_calls(gm)
    drop_settled_assertions(gm)


def drop_settled_assertions(gm: torch.fx.GraphModule) -> None:
    """Remove ``_assert_scalar`` checks the graph's own symbols already settle, where torch cannot save them.

    :func:`trt_inline.inlining.passes.inline_trt_modules` restates a scalar engine
    output as an expression in the input sizes for tracers; in the graph itself
    the condition is settled (``True``, or a SymBool that is constant true).
    torch 2.6 cannot serialize a settled condition
    (:func:`compat.serializes_settled_conditions`), so there the check goes, with
    the size arithmetic that only fed it::

        before:  %item = item(%getitem)          # meta["val"] = s0 - 1
                 %sym_size = sym_size(%x, 0)
                 %add = add(%sym_size, -1)
                 %eq = eq(%item, %add)           # meta["val"] = True
                 %_assert_scalar = _assert_scalar(%eq, "...")
        after:   %item = item(%getitem)
    """
    if compat.serializes_settled_conditions():
        return
    for node in list(gm.graph.nodes):
        if node.target is not compat.assert_scalar_op():
            continue
        condition = node.args[0]
        if isinstance(condition, torch.fx.Node) and symbolic.is_settled(condition.meta.get("val")):
            gm.graph.erase_node(node)
            _erase_unused(gm.graph, condition)


def _erase_unused(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Erase ``node`` if nothing reads it, then each of its inputs that this leaves unread (not placeholders)."""
    if node.users or node.op != "call_function":
        return
    inputs = list(node.all_input_nodes)
    graph.erase_node(node)
    for producer in inputs:
        _erase_unused(graph, producer)


def refuse_call_modules(gm: torch.fx.GraphModule) -> None:
    """A :class:`SaveError` naming the first node that still calls a submodule."""
    for node in gm.graph.nodes:
        if node.op == "call_module":
            raise SaveError(
                f"node {node.name} still calls submodule {node.target!r}; an ExportedProgram cannot "
                "hold call_module nodes (save with retrace=True to trace through it)"
            )


def exported_program_from_graph(
    gm: torch.fx.GraphModule,
    dynamic_shapes: Any = None,
    example_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
) -> ExportedProgram:
    """Build an ExportedProgram from a flat graph without re-executing it.

    Before::

        %x = placeholder[x]
        %w = get_attr[conv_weight]          # a Parameter
        %e = get_attr[_run_on_acc_0_engine] # an engine
        ...

    After (graph signature in brackets)::

        %p_conv_weight = placeholder        [PARAMETER conv_weight]
        %b__run_on_acc_0_engine = placeholder [BUFFER persistent=False]
        %x = placeholder                    [USER_INPUT]

    Buffers carry their ``persistent`` flag, plain tensors become constants, script
    objects (TensorRT engines) custom objects. ``gm`` is consumed.

    ``example_inputs`` (``(args, kwargs)``) are kept in the program as
    ``torch.export`` keeps them: ``ExportedProgram.module()`` compiles its input
    guards from them, and otherwise checks every call in Python instead.
    """
    drop_unserializable(gm)
    refuse_call_modules(gm)
    user_inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = compat.detect_fake_mode([n.meta.get("val") for n in user_inputs])

    output_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat_outputs = list(pytree.tree_leaves(output_node.args[0]))
    specs = compat.pytree_specs(gm.graph)
    if specs is not None:
        in_spec, out_spec = specs
    else:
        in_spec = pytree.tree_flatten((tuple(user_inputs), {}))[1]
        out_spec = pytree.tree_flatten(tuple(flat_outputs))[1]

    input_specs, state_dict, constants, _ = lift_attributes(gm, fake_mode)
    input_specs += [
        InputSpec(kind=InputKind.USER_INPUT, arg=TensorArgument(name=n.name), target=None) for n in user_inputs
    ]
    output_args = [_output_argument(out) for out in flat_outputs]
    output_specs = [OutputSpec(kind=OutputKind.USER_OUTPUT, arg=arg, target=None) for arg in output_args]

    compat.set_codegen(gm.graph, None)
    output_node.args = (tuple(flat_outputs),)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()

    return compat.exported_program(
        root=gm,
        graph=gm.graph,
        graph_signature=ExportGraphSignature(input_specs=input_specs, output_specs=output_specs),
        state_dict=state_dict,
        range_constraints=_range_constraints(gm, user_inputs, fake_mode, dynamic_shapes),
        module_call_graph=[
            ModuleCallEntry(
                "",
                compat.module_call_signature(
                    inputs=[TensorArgument(name=n.name) for n in user_inputs],
                    outputs=[*output_args],
                    in_spec=in_spec,
                    out_spec=out_spec,
                    # The loaded module's forward is named after the caller's arguments (x, not arg_0).
                    forward_arg_names=[str(n.target) for n in user_inputs],
                ),
            )
        ],
        constants=constants,
        example_inputs=example_inputs,
    )


def lift_into(
    gm: torch.fx.GraphModule, graph_signature: ExportGraphSignature
) -> tuple[torch.fx.GraphModule, ExportGraphSignature, dict[str, Any], dict[str, Any]]:
    """Lift ``gm``'s attributes into placeholders and their specs into ``graph_signature``, in place.

    Before::

        %x = placeholder[x]                 [USER_INPUT x]
        %w = get_attr[weight]
        %out = mm(%x, %w)                   [USER_OUTPUT out]

    After::

        %p_weight = placeholder             [PARAMETER weight]
        %x = placeholder[x]                 [USER_INPUT x]
        %out = mm(%x, %p_weight)            [USER_OUTPUT out]

    What the serializer cannot take is removed first; an output spec naming a
    lifted ``get_attr`` is renamed to its placeholder. Returns the graph, the
    signature, the state dict and the constants (the contract of Torch-TensorRT's
    ``_exporter.lift``).
    """
    drop_unserializable(gm)
    refuse_call_modules(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = compat.detect_fake_mode([n.meta.get("val") for n in placeholders])
    specs, state_dict, constants, renamed = lift_attributes(gm, fake_mode)
    graph_signature.input_specs[0:0] = specs
    for spec in graph_signature.output_specs:
        if isinstance(spec.arg, TensorArgument) and spec.arg.name in renamed:
            spec.arg = TensorArgument(name=renamed[spec.arg.name])
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    return gm, graph_signature, state_dict, constants


def lift_attributes(
    gm: torch.fx.GraphModule, fake_mode: Any
) -> tuple[list[InputSpec], dict[str, Any], dict[str, Any], dict[str, str]]:
    """Turn every ``get_attr`` of a tensor or script object into a leading placeholder.

    One placeholder per target, created in graph order, then placed at the start
    of the graph in the order the ExportedProgram verifier expects (parameters,
    buffers, constants, custom objects). Returns their input specs, the state
    dict (parameters and persistent buffers), the constants (everything else),
    and ``{get_attr node name: placeholder name}`` for callers holding specs that
    name a replaced node.
    """
    lifted: dict[str, tuple[InputKind, bool | None, torch.fx.Node]] = {}
    renamed: dict[str, str] = {}
    state_dict: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        target = str(node.target)
        owner, leaf, value = resolve_attribute(gm, target)
        if isinstance(value, torch.nn.Module):
            continue  # subgraphs of higher-order ops stay get_attr
        if target not in lifted:
            kind, persistent = _lifted_kind(owner, leaf, value)
            with gm.graph.inserting_before(None):
                placeholder = gm.graph.placeholder(_placeholder_name(kind, target))
            placeholder.meta = dict(node.meta)
            if isinstance(value, torch.Tensor):
                placeholder.meta["val"] = (
                    fake_mode.from_tensor(value, static_shapes=True)
                    if fake_mode is not None
                    else torch.empty_like(value, device="meta")
                )
            lifted[target] = (kind, persistent, placeholder)
            if kind is InputKind.PARAMETER or (kind is InputKind.BUFFER and persistent):
                state_dict[target] = value
            else:
                constants[target] = value
        renamed[node.name] = lifted[target][2].name
        node.replace_all_uses_with(lifted[target][2])
        gm.graph.erase_node(node)

    specs: list[InputSpec] = []
    for kind_in_order in _LIFT_ORDER:
        for target, (kind, persistent, placeholder) in lifted.items():
            if kind is not kind_in_order:
                continue
            arg: TensorArgument | CustomObjArgument = TensorArgument(name=placeholder.name)
            if kind is InputKind.CUSTOM_OBJ:
                arg = CustomObjArgument(name=placeholder.name, class_fqn=compat.script_object_class(constants[target]))
            specs.append(InputSpec(kind=kind, arg=arg, target=target, persistent=persistent))
    for spec in reversed(specs):
        next(iter(gm.graph.nodes)).prepend(lifted[str(spec.target)][2])
    return specs, state_dict, constants, renamed


def _output_argument(value: Any) -> Any:
    """The signature's argument for one graph output: a tensor, a symbolic scalar, or a constant."""
    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        if scalars.is_scalar(val):
            return compat.scalar_argument(val, value.name)
        return TensorArgument(name=value.name)
    return ConstantArgument(name="", value=value)


def _placeholder_name(kind: InputKind, target: str) -> str:
    prefix = {InputKind.PARAMETER: "p_", InputKind.BUFFER: "b_", InputKind.CONSTANT_TENSOR: "c_"}.get(kind, "obj_")
    return prefix + target.replace(".", "_")


def _declared_dims(user_inputs: Sequence[torch.fx.Node], dynamic_shapes: Any) -> list[dict[int, Any]]:
    """``dynamic_shapes`` (a tuple by position or a dict by input name) as one dict per input."""
    if dynamic_shapes is None:
        return [{} for _ in user_inputs]
    if isinstance(dynamic_shapes, dict):
        specs = [dynamic_shapes.get(str(n.target)) for n in user_inputs]
    else:
        specs = list(dynamic_shapes) + [None] * (len(user_inputs) - len(dynamic_shapes))
    return [dict(spec) if isinstance(spec, dict) else dict(enumerate(spec or ())) for spec in specs]


def _range_constraints(
    gm: torch.fx.GraphModule, user_inputs: Sequence[torch.fx.Node], fake_mode: Any, dynamic_shapes: Any
) -> dict[Any, Any]:
    """The value range of every symbol in the graph's values: input sizes, and unbacked sizes from ``item()``.

    The bounds a ``Dim`` declares win: the shape env of an export holds ``[2, max]``
    for a ``Dim(min=1)`` (export's 0/1 specialisation), which would reject batch 1.
    A loaded program needs a range for every symbol its nodes mention, or it
    cannot be deserialised.
    """
    if fake_mode is None or fake_mode.shape_env is None:
        return {}
    ranges: dict[Any, Any] = {}
    for node, declared in zip(user_inputs, _declared_dims(user_inputs, dynamic_shapes), strict=False):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for index, dim in enumerate(value.shape):
            spec = declared.get(index)
            if isinstance(dim, torch.SymInt) and dim.node.expr.is_Symbol and hasattr(spec, "min"):
                ranges[dim.node.expr] = compat.value_range(spec.min, spec.max)
    add_missing_ranges(gm.graph, fake_mode, ranges)
    return ranges


def add_missing_ranges(graph: torch.fx.Graph, fake_mode: Any, ranges: dict[Any, Any]) -> None:
    """Give every symbol a node's value mentions a range (from the shape env) where ``ranges`` has none."""
    var_to_range = compat.shape_env_ranges(fake_mode)
    for node in graph.nodes:
        for symbol in sorted(_free_symbols(node.meta.get("val")), key=str):
            if symbol in var_to_range:
                ranges.setdefault(symbol, var_to_range[symbol])


def _free_symbols(value: Any) -> set[Any]:
    """The sympy symbols in a fake value: a tensor's sizes, a symbolic scalar, or a list of those."""
    if isinstance(value, (list, tuple)):
        return set().union(*(_free_symbols(v) for v in value))
    if isinstance(value, torch.Tensor):
        return set().union(*(_free_symbols(d) for d in value.shape))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return set(value.node.expr.free_symbols)
    return set()


def drop_provenance(program: ExportedProgram) -> ExportedProgram:
    """Remove ``meta["from_node"]``: FX's provenance records ``id(graph)``, a memory address.

    Left in, it is serialized, and the same model saved twice gives different files.
    """
    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                node.meta.pop("from_node", None)
    return program
