"""The one door to torch's private APIs.

trt_inline runs on every torch a supported Torch-TensorRT release requires
(2.5 ... 2.14) and on 2.15. Private APIs move between those releases, so every
use of one goes through a function here that detects the feature (an attribute
present, a parameter in a signature) rather than comparing version strings.
Each shim says which torch versions need it; the version matrix (``.ci/matrix``)
runs all of them.

Nothing else in trt_inline imports from ``torch._*`` or reads a private
attribute of a torch object.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import sys
import threading
import typing
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import torch
import torch.fx

from trt_inline.errors import IncompatibleTorchError

__all__ = [
    "OpOverload",
    "OpOverloadPacket",
    "answer_cuda_queries",
    "aoti_compile_and_package",
    "aoti_load_package",
    "aoti_loader_folders",
    "aoti_packages",
    "assert_scalar_op",
    "backed_size_oblivious",
    "buffer_persistent",
    "c10d_class",
    "cuda_built",
    "cuda_started",
    "default_store",
    "deserialize_program",
    "detect_fake_mode",
    "discarding_fresh_unbacked_symbols",
    "export_nonstrict",
    "export_schema",
    "exported_program",
    "expression_text",
    "fake_tensor_mode",
    "flatten_by_spec",
    "graph_codegen",
    "guard_call_types",
    "higher_order_by_name",
    "higher_order_name",
    "import_loaders",
    "init_splitter",
    "is_core_aten",
    "is_fake",
    "is_torch_tensorrt_device",
    "keyword_keys",
    "live_groups",
    "load_script_object",
    "module_call_signature",
    "move_program_to",
    "op_argument_types",
    "op_argument_value",
    "op_by_name",
    "op_is_mutable",
    "op_is_random",
    "op_overload_name",
    "op_overloads",
    "op_packet_name",
    "op_return_types",
    "op_schema_name",
    "own_buffers",
    "positional_count",
    "prepare_package_loading",
    "pytree_specs",
    "register_group",
    "restore_attribute_kinds",
    "scalar_argument",
    "schema_union_base",
    "script_object_class",
    "serialized_dtype",
    "set_codegen",
    "set_example_inputs",
    "shape_env_symbols",
    "splitter_base",
    "splitter_settings",
    "streaming_tensor_writes",
    "symbolic_value",
    "tensorrt_engine_info",
    "to_copy_op",
    "traces_size_obliviously",
    "value_range",
    "weights_only_globals",
]

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


def detect_fake_mode(values: Sequence[Any]) -> Any:
    """The FakeTensorMode that the fake values among ``values`` belong to, or None (all torch)."""
    from torch._guards import detect_fake_mode as detect

    return detect(list(values))


def fake_tensor_mode() -> Any:
    """A new FakeTensorMode without a shape environment (static shapes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def is_fake(value: Any) -> bool:
    """Whether ``value`` is a FakeTensor (a meta-only stand-in met during tracing)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor)


def import_loaders() -> None:
    """Import what ``torch.export.load`` (and an AOTInductor package's loader) would import on first use.

    An interpreter that forks one child per file imports them once, before any file is opened.
    """
    import torch._export.serde.serialize

    if getattr(torch._inductor, "aoti_load_package", None) is not None:
        import torch._inductor.package


def export_schema() -> Any:
    """``torch._export.serde.schema``: the dataclasses a serialized ExportedProgram is made of (2.5+)."""
    from torch._export.serde import schema

    return schema


def schema_union_base() -> type | None:
    """The base class of the schema's one-of types (``Argument``, ``InputSpec``, ...), 2.5+."""
    try:
        from torch._export.serde.union import _Union
    except ImportError:
        return None
    return _Union


def serialized_dtype(value: int) -> torch.dtype:
    """The dtype a serialized ``ScalarType`` stands for (KeyError for one this torch does not know)."""
    from torch._export.serde import serialize

    return serialize._SERIALIZE_TO_TORCH_DTYPE[export_schema().ScalarType(value)]  # type: ignore[no-any-return]


def deserialize_program(
    document: bytes,
    state_dict: dict[str, Any],
    constants: dict[str, Any],
    example_inputs: tuple[Any, ...] | None,
) -> torch.export.ExportedProgram:
    """An ExportedProgram from a serialized program document and the objects it refers to (2.5+).

    What every release's loader does once it has read the archive (``load_pt2``,
    and the 2.5 ... 2.7 ``torch.export.load``): the document into the schema's
    dataclasses, then ``ExportedProgramDeserializer.deserialize`` with weights,
    constants and sample inputs already as objects, so that torch unpickles
    nothing. Never ``torch.export.load``, whose fallbacks read other layouts.
    """
    import json

    from torch._export.serde import serialize
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass

    with _type_hints_cached(serialize):
        serialized = _dict_to_dataclass(export_schema().ExportedProgram, json.loads(document))  # type: ignore[no-untyped-call]
    return ExportedProgramDeserializer().deserialize(  # type: ignore[no-any-return]
        serialized, state_dict, constants, example_inputs
    )


class _CachedTypeHints:
    """The ``typing`` module, but ``get_type_hints`` answered once per class.

    torch's ``_dict_to_dataclass`` asks ``typing.get_type_hints`` of a schema
    class for every object it builds: half its time on a program of 10,000
    nodes. The answers never change, so the same dataclasses come out.
    """

    def __init__(self, typing_module: Any) -> None:
        self._typing = typing_module
        self._hints: dict[tuple[Any, ...], Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._typing, name)

    def get_type_hints(self, obj: Any, globalns: Any = None, localns: Any = None, include_extras: bool = False) -> Any:
        key = (obj, id(globalns), id(localns), include_extras)
        found = self._hints.get(key)
        if found is None:
            hints = self._typing.get_type_hints(obj, globalns, localns, include_extras)
            # the namespaces are held with their answer, so that no other object takes their ids meanwhile
            found = self._hints[key] = (hints, globalns, localns)
        return found[0]


_TYPE_HINTS_LOCK = threading.Lock()


@contextlib.contextmanager
def _type_hints_cached(serialize: Any) -> Iterator[None]:
    """``serialize``'s ``typing`` answering type hints from a cache, for the block (one block at a time)."""
    if not hasattr(serialize, "typing"):  # a torch that looks hints up some other way
        yield
        return
    with _TYPE_HINTS_LOCK:  # (checked inside: another thread's block may have the cache in place until it ends)
        if serialize.typing is not typing:
            yield
            return
        original = serialize.typing
        serialize.typing = _CachedTypeHints(original)
        try:
            yield
        finally:
            serialize.typing = original


def load_script_object(data: bytes) -> Any:
    """A TorchBind object (a TensorRT engine) from the bytes ``torch._C._pickle_save`` wrote: runs its C++ setstate."""
    return torch._C._pickle_load_obj(data)  # type: ignore[attr-defined]


def own_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """The buffers ``module`` itself holds (not its submodules'), as the live mapping it keeps them in."""
    return module._buffers


def buffer_persistent(module: torch.nn.Module, name: str) -> bool | None:
    """Whether ``module``'s buffer ``name`` is saved with its state; None where ``name`` is no buffer of it."""
    if name not in module._buffers:
        return None
    return name not in module._non_persistent_buffers_set


def restore_attribute_kinds(original: torch.nn.Module, copied: torch.nn.Module) -> None:
    """Undo what a GraphModule's deepcopy does to ``copied``'s tensors: every one a persistent buffer.

    Non-persistent buffers are marked so again, and plain tensor attributes
    (constants) stop being buffers, submodule by submodule.
    """
    copies = dict(copied.named_modules())
    for name, module in original.named_modules():
        copy = copies.get(name)
        if copy is None:
            continue
        for attr in list(copy._buffers):
            if attr in module._non_persistent_buffers_set:
                copy._non_persistent_buffers_set.add(attr)
            elif attr not in module._buffers and isinstance(module.__dict__.get(attr), torch.Tensor):
                copy.__dict__[attr] = copy._buffers.pop(attr)


def script_object_class(value: Any) -> str:
    """The qualified class name of a TorchBind object (``__torch__.torch.classes.tensorrt.Engine``)."""
    return str(value._type().qualified_name())


def assert_scalar_op() -> Any:
    """``aten._assert_scalar.default``: a runtime check an ExportedProgram may hold, and tracers learn from."""
    return torch.ops.aten._assert_scalar.default


def tensorrt_engine_info(module: torch.nn.Module) -> list[Any]:
    """A ``TorchTensorRTModule``'s engine info as its cross-compile placeholder op takes it (engine base64)."""
    import base64

    runtime = sys.modules["torch_tensorrt.dynamo.runtime._TorchTensorRTModule"]
    info = list(module._pack_engine_info())  # type: ignore[operator]
    info[runtime.ENGINE_IDX] = base64.b64encode(info[runtime.ENGINE_IDX]).decode("utf-8")
    return info


@contextlib.contextmanager
def discarding_fresh_unbacked_symbols(values: Sequence[Any]) -> Iterator[None]:
    """Inside, unbacked symbols created on the fake values' shape env need not reach an output (2.5+).

    A fake kernel that reads a scalar input with ``item()`` creates such a
    symbol; export otherwise demands that every one of them be bound to an output.
    """
    fake_mode = detect_fake_mode(values)
    shape_env = getattr(fake_mode, "shape_env", None)
    ignore = getattr(shape_env, "ignore_fresh_unbacked_symbols", None)
    if ignore is None:
        yield
        return
    with ignore():
        yield


def op_schema_name(target: Any) -> str | None:
    """``"trt_inline::execute_engine"`` for an OpOverload (its schema's name), None for anything else."""
    schema = getattr(target, "_schema", None) if isinstance(target, OpOverload) else None
    name = getattr(schema, "name", None)
    return name if isinstance(name, str) else None


def op_overload_name(target: OpOverload) -> str:
    """``"default"``, ``"Tensor"``: the overload part of an OpOverload's name."""
    return str(target._overloadname)


def op_is_mutable(target: OpOverload) -> bool:
    """Whether an OpOverload's schema writes to any argument (``Tensor(a!)``, ``out=``)."""
    return bool(target._schema.is_mutable)


def op_is_random(target: OpOverload) -> bool:
    """Whether an OpOverload draws from the global random generator (tagged ``nondeterministic_seeded``)."""
    return torch.Tag.nondeterministic_seeded in target.tags


def op_argument_types(target: OpOverload) -> list[str]:
    """The declared type of each argument of an OpOverload's schema (``"Tensor"``, ``"str"``, ...)."""
    return [str(argument.type) for argument in target._schema.arguments]


def move_program_to(program: torch.export.ExportedProgram, device: torch.device) -> torch.export.ExportedProgram:
    """``program`` with its weights, constants, example inputs, node metadata and the devices its nodes name
    moved to ``device`` (``torch.export.passes.move_to_device_pass``; each tensor copied on its own, so a
    weight mapped from a file goes to the device without a host copy of all of them)."""
    try:
        from torch.export.passes import move_to_device_pass
    except ImportError as exc:
        raise IncompatibleTorchError(
            f"torch {torch.__version__} has no torch.export.passes.move_to_device_pass: load without device= and "
            "move the module (program.module().to(device))"
        ) from exc
    moved: torch.export.ExportedProgram = move_to_device_pass(program, device)
    return moved


def program_copy_on(program: torch.export.ExportedProgram, device: torch.device) -> torch.export.ExportedProgram:
    """A copy of ``program`` on ``device``, ``program`` left as it is (:func:`move_program_to` moves in place).

    Each tensor is copied straight to ``device`` (a model on the GPU is never duplicated there first)."""
    import copy

    memo: dict[int, Any] = {}
    tensors = [*program.state_dict.values(), *program.constants.values()]
    tensors += [value for value in torch.utils._pytree.tree_leaves(program.example_inputs or ())]
    tensors += [*program.graph_module.parameters(), *program.graph_module.buffers()]
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
            moved = tensor.detach().to(device)
            if isinstance(tensor, torch.nn.Parameter):
                moved = torch.nn.Parameter(moved, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = moved
    with warnings.catch_warnings():  # (copying a pytree spec warns of torch's own deprecations)
        warnings.simplefilter("ignore", FutureWarning)
        copied = copy.deepcopy(program, memo)
    # Copying a graph renames a node named after a builtin ("input" becomes "input_1"), which the program's
    # signature still names: the copy keeps the original's names.
    for original, node in zip(program.graph.nodes, copied.graph.nodes, strict=True):
        node.name = original.name
    copied.graph_module.recompile()
    return move_program_to(copied, device)


def cuda_built() -> bool:
    """Whether this torch was built with CUDA; asks nothing of a device (CUDA is not started)."""
    return bool(torch.backends.cuda.is_built())  # type: ignore[no-untyped-call]


def cuda_started() -> bool:
    """Whether this process has started CUDA already (a process forked after that cannot use it)."""
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def op_argument_value(target: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """What a call of ``target`` passes as its argument ``name``: positional, keyword or the schema's default.

    Raises KeyError where the schema has no such argument, or the call passes none and it has no default.
    """
    for position, argument in enumerate(target._schema.arguments):
        if argument.name != name:
            continue
        if name in kwargs:
            return kwargs[name]
        if position < len(args) and not argument.kwarg_only:
            return args[position]
        if argument.has_default_value():
            return argument.default_value
        break
    raise KeyError(name)


def op_argument_names(target: OpOverload) -> list[str]:
    """The names of an OpOverload's arguments, in its schema's order."""
    return [str(argument.name) for argument in target._schema.arguments]


def namedtuple_fields(kind: Any) -> tuple[str, ...] | None:
    """A namedtuple class's field names (its documented ``_fields``); None for anything else."""
    fields = getattr(kind, "_fields", None)
    if isinstance(kind, type) and issubclass(kind, tuple) and isinstance(fields, tuple):
        return tuple(str(name) for name in fields)
    return None


def pytree_type_registered(serialized_name: str) -> bool:
    """Whether torch's pytree deserializes a node named ``serialized_name`` (a spec's ``"type"``) here."""
    from torch.utils import _pytree as pytree

    return serialized_name in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE


def register_mapping_node(cls: type, serialized_name: str) -> None:
    """``cls`` (a ``dict`` subclass whose constructor takes its items) registered with torch's pytree as
    transformers registers its ``ModelOutput`` types: values in key order, the keys as its context (dumped as
    JSON), key paths as a dict's (``out['last_hidden_state']``), deserialized from ``serialized_name``."""
    from torch.utils import _pytree as pytree

    def flatten(value: dict[str, Any]) -> tuple[list[Any], list[str]]:
        return list(value.values()), list(value.keys())

    def unflatten(values: Any, context: Any) -> Any:
        return cls(zip(context, values, strict=True))

    pytree.register_pytree_node(
        cls, flatten, unflatten, serialized_type_name=serialized_name,
        flatten_with_keys_fn=pytree._dict_flatten_with_keys,  # type: ignore[arg-type]
    )  # fmt: skip


def op_return_types(target: OpOverload) -> list[str]:
    """The declared type of each value an OpOverload returns (``"Tensor"``, ``"List[Tensor]"``, ``"bool"``)."""
    return [str(result.type) for result in target._schema.returns]


def op_overloads(packet: OpOverloadPacket) -> list[str]:
    """The overload names an OpOverloadPacket has (``"default"``, ``"Tensor"``, ...)."""
    return [str(name) for name in packet.overloads()]  # type: ignore[no-untyped-call]


def is_core_aten(target: Any) -> bool:
    """Whether a node target is a core ATen OpOverload (decomposing would leave it as it is)."""
    return isinstance(target, OpOverload) and torch.Tag.core in target.tags


@functools.cache
def weights_only_globals() -> frozenset[str]:
    """``module.name`` of every global ``torch.load(weights_only=True)`` lets a pickle reach (torch 2.5+).

    Read from torch's own allow-list so that the archive checks apply exactly
    the rules torch does; a torch without it gets the globals a ``torch.save``
    of plain tensors uses.
    """
    try:
        from torch import _weights_only_unpickler

        return frozenset(_weights_only_unpickler._get_allowed_globals())
    except (ImportError, AttributeError):
        storages = {f"torch.{name}" for name in dir(torch) if name.endswith("Storage")}
        return frozenset(
            {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter"} | storages
        )


def op_by_name(qualified: str, overload: str | None) -> Any:
    """The operator ``namespace::name`` (``torch.ops.namespace.name``), its overload ``overload`` (the packet where
    None): an operator found again by the name :func:`op_schema_name` / :func:`op_packet_name` gave."""
    namespace, _, name = qualified.partition("::")
    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)


def op_packet_name(packet: OpOverloadPacket) -> str:
    """``"aten::linear"`` for ``torch.ops.aten.linear``."""
    return str(packet._qualified_op_name)


def higher_order_by_name(name: str) -> Any:
    """The higher-order operator ``torch.ops.higher_order.<name>``."""
    return getattr(torch.ops.higher_order, name)


def shape_env_symbols(fake_mode: Any) -> dict[str, Any]:
    """What a size expression written as text (``str(symint.node.expr)``) is read back with: the symbols of
    ``fake_mode``'s shape environment and torch's sympy functions (``FloorDiv``, ``Mod``, ...), by name."""
    from torch.utils._sympy import functions

    names: dict[str, Any] = {
        name: value for name, value in vars(functions).items() if isinstance(value, type) and not name.startswith("_")
    }
    shape_env = getattr(fake_mode, "shape_env", None)
    for symbol in [*_backed_values(shape_env), *(getattr(shape_env, "var_to_range", None) or {})]:
        names[str(symbol)] = symbol
    return names


def _backed_values(shape_env: Any) -> dict[Any, Any]:
    """The hint of each backed symbol: ``backed_var_to_val`` (torch 2.13+, where ``var_to_val`` is deprecated), else
    ``var_to_val``."""
    table = getattr(shape_env, "backed_var_to_val", None)
    if table is None:
        table = getattr(shape_env, "var_to_val", None)
    return dict(table or {})


def symbolic_value(fake_mode: Any, kind: str, expression: str, names: dict[str, Any]) -> Any:
    """The SymInt (``kind`` ``"int"``), SymFloat or SymBool that ``expression`` (:func:`expression_text`) stands
    for in ``fake_mode``'s shape environment, its symbols taken by name from ``names``. A symbol it does not know
    (made after a fork, an unbacked size) becomes a fresh unbacked one, and ``names`` learns it."""
    import sympy

    shape_env = fake_mode.shape_env
    parsed = sympy.sympify(expression, locals=names)
    for symbol in sorted(parsed.free_symbols, key=str):
        if str(symbol) not in names or not isinstance(names[str(symbol)], sympy.Symbol):
            names[str(symbol)] = shape_env.create_unbacked_symint().node.expr
    parsed = parsed.xreplace({symbol: names[str(symbol)] for symbol in parsed.free_symbols})
    hints = _backed_values(shape_env)
    hint = parsed.xreplace(hints) if all(s in hints for s in parsed.free_symbols) else None
    if kind == "int":
        return shape_env.create_symintnode(parsed, hint=None if hint is None else int(hint))
    if kind == "float":
        return shape_env.create_symfloatnode(parsed, hint=None if hint is None else float(hint))
    return shape_env.create_symboolnode(parsed)


def expression_text(value: torch.SymInt | torch.SymFloat | torch.SymBool) -> str:
    """A symbolic value's expression as text :func:`symbolic_value` reads back as the same expression: sympy's
    ``srepr`` (``str`` prints torch's ``FloorDiv(s, 2)`` as ``s//2``, which reads back as ``floor(s/2)``)."""
    import sympy

    return str(sympy.srepr(value.node.expr))


def answer_cuda_queries(capability: tuple[int, int]) -> None:
    """In a rehearsal's forked child, which must never start CUDA: the CUDA queries a Torch-TensorRT release makes
    while it imports and dry-runs (``torch.cuda.get_device_capability``, ``current_device``, ``mem_get_info``,
    ``empty_cache``; ``torch._C._CudaDeviceProperties``, which its annotations name and a CPU build lacks) answered
    as a device of ``capability`` would. Nothing is put back: the child ends with it."""
    cuda: Any = torch.cuda
    cuda.is_available = lambda: False
    cuda.get_device_capability = lambda device=None: capability
    cuda.current_device = lambda: 0
    cuda.mem_get_info = lambda device=None: (64 << 30, 80 << 30)
    cuda.empty_cache = lambda: None
    cuda.synchronize = lambda device=None: None
    if not hasattr(torch._C, "_CudaDeviceProperties"):
        setattr(torch._C, "_CudaDeviceProperties", type("_CudaDeviceProperties", (), {}))  # noqa: B010


def is_torch_tensorrt_device(value: Any) -> bool:
    """Whether ``value`` is a Torch-TensorRT ``Device`` (recognised by its class, without importing it)."""
    kind = type(value)
    return kind.__name__ == "Device" and kind.__module__ == "torch_tensorrt._Device"


def higher_order_name(target: Any) -> str | None:
    """The name of a higher-order operator an FX node calls (``cond``, ``wrap_with_set_grad_enabled``), else None."""
    return str(target.name()) if isinstance(target, torch._ops.HigherOrderOperator) else None  # type: ignore[no-untyped-call]


def guard_call_types() -> tuple[type, ...]:
    """Module types that ``ExportedProgram.module()`` inserts as input-guard calls.

    torch 2.9+ adds a ``call_module`` to a ``GuardsFn``; earlier releases check
    inputs with a forward pre-hook and add no node, so there is nothing to drop.
    """
    try:
        from torch.export._unlift import GuardsFn  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return ()
    return (GuardsFn,)


def pytree_specs(graph: torch.fx.Graph) -> tuple[Any, Any] | None:
    """(in_spec, out_spec) of a graph whose code flattens its calling convention with pytree, else None."""
    from torch.fx.graph import _PyTreeCodeGen

    codegen = graph._codegen
    if isinstance(codegen, _PyTreeCodeGen) and codegen.pytree_info.out_spec is not None:
        return codegen.pytree_info.in_spec, codegen.pytree_info.out_spec
    return None


def flatten_by_spec(value: Any, spec: Any) -> list[Any]:
    """``value``'s leaves in the order ``spec`` has them (a dict's keys as the spec lists them, not as given):
    how a GraphModule's generated ``forward`` flattens its inputs (``fx_pytree.tree_flatten_spec``)."""
    from torch.fx._pytree import tree_flatten_spec

    return list(tree_flatten_spec(value, spec))


def positional_count(in_spec: Any) -> int | None:
    """How many positional inputs an exported program's input spec has (a tuple of those and a dict of the
    others); None for a spec of another shape. ``TreeSpec.children()`` from torch 2.10 (``children_specs``,
    deprecated there, before)."""
    children = list(in_spec.children()) if hasattr(in_spec, "children") else getattr(in_spec, "children_specs", None)
    if children is None or len(children) != 2 or children[0].type not in (tuple, list) or children[1].type is not dict:
        return None
    return int(children[0].num_children)


def keyword_keys(in_spec: Any) -> list[str] | None:
    """The keys of an exported program's keyword inputs as its input spec lists them (the order its generated
    ``forward`` pairs them with its parameters after the positional ones: by position, not by name); None for a
    spec of another shape."""
    if positional_count(in_spec) is None:
        return None
    children = list(in_spec.children()) if hasattr(in_spec, "children") else in_spec.children_specs
    return [str(key) for key in children[1].context]


def graph_codegen(graph: torch.fx.Graph) -> Any:
    """The object that writes ``graph``'s Python code (it carries the pytree calling convention)."""
    return graph._codegen


def set_codegen(graph: torch.fx.Graph, codegen: Any | None) -> None:
    """Install ``codegen`` on ``graph``; None installs FX's flat default (positional inputs, a tuple out)."""
    graph._codegen = codegen if codegen is not None else torch.fx.graph.CodeGen()


def value_range(lower: Any, upper: Any) -> Any:
    """A sympy value range ``[lower, upper]`` as ``range_constraints`` holds it."""
    from torch.utils._sympy.value_ranges import ValueRanges

    return ValueRanges(lower, upper)


def shape_env_ranges(fake_mode: Any) -> dict[Any, Any]:
    """The value range of every symbol the fake mode's shape environment knows."""
    shape_env = getattr(fake_mode, "shape_env", None)
    return dict(getattr(shape_env, "var_to_range", {}) or {})


@functools.cache
def _module_call_signature_fields() -> frozenset[str]:
    from torch.export import ModuleCallSignature

    return frozenset(inspect.signature(ModuleCallSignature).parameters)


def module_call_signature(
    inputs: list[Any], outputs: list[Any], in_spec: Any, out_spec: Any, forward_arg_names: list[str]
) -> Any:
    """``ModuleCallSignature``; ``forward_arg_names`` only where it exists (torch 2.6+).

    Without it (torch 2.5) the loaded module's forward takes ``*args``.
    """
    from torch.export import ModuleCallSignature

    extra = {"forward_arg_names": forward_arg_names} if "forward_arg_names" in _module_call_signature_fields() else {}
    return ModuleCallSignature(inputs=inputs, outputs=outputs, in_spec=in_spec, out_spec=out_spec, **extra)


def exported_program(**fields: Any) -> torch.export.ExportedProgram:
    """The ``ExportedProgram`` constructor, given only the fields this torch's accepts.

    All of ``root, graph, graph_signature, state_dict, range_constraints,
    module_call_graph, constants, example_inputs`` exist from torch 2.5 on; a
    field a future torch drops is left out rather than failing the save.
    """
    accepted = inspect.signature(torch.export.ExportedProgram.__init__).parameters
    return torch.export.ExportedProgram(**{k: v for k, v in fields.items() if k in accepted})


@functools.cache
def serializes_settled_conditions() -> bool:
    """Whether ``torch.export.save`` takes a symbolic comparison whose value is a plain bool.

    torch 2.5 accepts it and 2.7 and later write it as a constant SymBool; 2.6
    refuses the node ("Unsupported symbolic type: <class 'bool'>"). Asked of the
    serializer itself, on a one-node graph; any failure counts as "no".
    """
    import operator

    from torch.export import ExportGraphSignature

    try:
        from torch._export.serde.serialize import GraphModuleSerializer

        graph = torch.fx.Graph()
        size = graph.placeholder("size")
        size.meta["val"] = 1
        condition = graph.call_function(operator.eq, (size, size))
        condition.meta["val"] = True
        GraphModuleSerializer(ExportGraphSignature([], []), []).handle_call_function(condition)
    except Exception:
        return False
    return True


def traces_size_obliviously() -> bool:
    """Whether :func:`backed_size_oblivious` has an effect on this torch (the flag exists from 2.7.1)."""
    from torch.fx.experimental import _config as fx_config

    return "backed_size_oblivious" in getattr(fx_config, "_config", {})


@contextlib.contextmanager
def backed_size_oblivious() -> Iterator[None]:
    """Trace without 0/1 specialisation of input sizes, where this torch can (2.7.1+ has the flag).

    Without it, an unbacked size equated with an input size inherits the
    input's internal range ``[2, max]`` and a declared minimum of 1 fails a
    runtime assert in the saved program.
    """
    from torch.fx.experimental import _config as fx_config

    if not traces_size_obliviously():
        yield
        return
    with fx_config.patch(backed_size_oblivious=True):  # type: ignore[attr-defined]
        yield


def scalar_argument(value: Any, name: str) -> Any:
    """The graph-signature argument for a symbolic scalar output (SymInt; SymFloat / SymBool where known)."""
    from torch.export import graph_signature

    kind = "SymBoolArgument" if isinstance(value, (torch.SymBool, bool)) else "SymIntArgument"
    if isinstance(value, (torch.SymFloat, float)):
        kind = "SymFloatArgument"
    argument = getattr(graph_signature, kind, None) or graph_signature.SymIntArgument
    return argument(name=name)


def set_example_inputs(program: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Record sample inputs on a program: the property's setter where it has one (2.8+), else its field (2.5)."""
    prop = getattr(type(program), "example_inputs", None)
    if isinstance(prop, property) and prop.fset is not None:
        program.example_inputs = (args, kwargs)
    else:
        program._example_inputs = (args, kwargs)


def decompose_keeping(exported: Any, keep: Collection[Any]) -> Any:
    """``exported.run_decompositions()`` to core ATen, but for the operators ``keep`` names (OpOverloads, or
    packets: each overload), which stay as they are: what Torch-TensorRT does for the operators it is told to run
    in PyTorch (``torch_executed_ops``), so that a fallback asked for is a fallback of that operator."""
    default = getattr(torch.export, "default_decompositions", None)
    if default is not None:  # torch 2.6+
        table = default()
    else:
        from torch._decomp import core_aten_decompositions

        table = dict(core_aten_decompositions())
    for op in list(table.keys()):
        if op in keep or getattr(op, "overloadpacket", None) in keep:
            table.pop(op)
    return exported.run_decompositions(table)


def export_nonstrict(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, dynamic_shapes: Any
) -> torch.export.ExportedProgram:
    """``torch.export.export`` in non-strict mode (the default from torch 2.8; 2.5 ... 2.7 default to strict).

    Non-strict tracing runs the GraphModule's Python code on fake tensors, as
    Torch-TensorRT's own ``retrace=True`` save does.
    """
    return torch.export.export(module, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=False)


# ---------------------------------------------------------------------------
# The partitioner Torch-TensorRT builds on (torch.fx.passes.splitter_base)
# ---------------------------------------------------------------------------


def splitter_base() -> Any:
    """``torch.fx.passes.splitter_base._SplitterBase`` (imported on first use: only the reference backend needs it)."""
    from torch.fx.passes.splitter_base import _SplitterBase

    return _SplitterBase


def splitter_settings(min_block_size: int, *, skip_fusion: bool) -> Any:
    """Splitter settings: non-tensor I/O allowed, as Torch-TensorRT's fast partitioner sets them (torch 2.5+)."""
    from torch.fx.passes.splitter_base import _SplitterSettingBase

    return _SplitterSettingBase(min_acc_module_size=min_block_size, allow_non_tensor=True, skip_fusion=skip_fusion)


def init_splitter(
    splitter: Any,
    module: torch.fx.GraphModule,
    sample_input: Sequence[Any],
    operator_support: Any,
    settings: Any,
    non_acc_submodule_name: str,
) -> None:
    """Run ``_SplitterBase.__init__`` (torch 2.5 ... 2.15 take these parameters by these names).

    Going through the constructor, rather than copying its fields, keeps up
    with what each torch's splitter sets up (2.9 added fusion-merging state).
    """
    base = splitter_base()
    parameters = inspect.signature(base.__init__).parameters
    wanted = ("module", "sample_input", "operator_support", "settings", "non_acc_submodule_name")
    missing = [name for name in wanted if name not in parameters]
    if missing:
        raise IncompatibleTorchError(
            f"reference backend: torch {torch.__version__}'s _SplitterBase.__init__ lacks {', '.join(missing)}"
        )
    base.__init__(
        splitter,
        module=module,
        sample_input=sample_input,
        operator_support=operator_support,
        settings=settings,
        non_acc_submodule_name=non_acc_submodule_name,
    )


# ---------------------------------------------------------------------------
# AOTInductor (torch 2.6+ packages; Torch-TensorRT saves them from 2.8)
# ---------------------------------------------------------------------------


def aoti_packages() -> str | None:
    """None where this torch writes AOTInductor packages as PT2 archives (2.8+), else why not."""
    if getattr(torch._inductor, "aoti_compile_and_package", None) is None:
        return f"torch {torch.__version__} has no torch._inductor.aoti_compile_and_package"
    if importlib.util.find_spec("torch.export.pt2_archive") is None:
        return f"torch {torch.__version__} writes packages in a layout before the PT2 archive (torch 2.8)"
    return None


def aoti_compile_and_package(program: torch.export.ExportedProgram, package_path: str) -> str:
    """Compile ``program`` into an AOTInductor package at ``package_path``."""
    why_not = aoti_packages()
    if why_not is not None:
        raise IncompatibleTorchError(f"output_format='aot_inductor': {why_not}")
    return str(torch._inductor.aoti_compile_and_package(program, package_path=package_path))


def prepare_package_loading(cuda: bool) -> None:
    """Do now what loading an AOTInductor package does first: compare this machine's CPU ISA with the package's.

    torch finds the ISA by compiling probes with the C++ compiler (new processes);
    a sandboxed child does it before the sandbox closes, and the answer is cached
    in the process. Nothing here is read from a file. ``cuda``: whether CUDA devices
    are there, the answer ``torch.cuda.is_available()`` gets meanwhile: the probe
    imports ``torch.utils.cpp_extension``, which asks it (for a warning), and asking
    torch starts CUDA, which a process about to fork must not (seen on torch 2.14).
    """
    if getattr(torch._inductor, "aoti_load_package", None) is None:
        return
    asked = torch.cuda.is_available
    torch.cuda.is_available = lambda: cuda  # type: ignore[assignment]
    try:
        with contextlib.suppress(Exception):  # no compiler: torch's loader says so itself, later
            from torch._inductor import cpu_vec_isa

            cpu_vec_isa.pick_vec_isa()
    finally:
        torch.cuda.is_available = asked  # type: ignore[method-assign]


def aoti_loader_folders() -> tuple[str, ...]:
    """Folders AOTInductor's package loader writes to whatever ``TMPDIR`` says: the C++ loader of torch
    2.8 ... 2.12 extracts into a hard-coded ``/tmp/XXXXXX`` (seen as ``mkdir("/tmp/qNOkVj")`` under
    2.10.0, and on 2.9.1, 2.11.0 and 2.12.1); 2.13 on honour ``TMPDIR``."""
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    hard_coded = version < (2, 13)
    return ("/tmp",) if hard_coded and aoti_packages() is None else ()


def aoti_load_package(path: str) -> Callable[..., Any]:
    """Load an AOTInductor package (this runs its shared library)."""
    load = getattr(torch._inductor, "aoti_load_package", None)
    if load is None:
        raise IncompatibleTorchError(f"torch {torch.__version__} cannot load AOTInductor packages")
    # torch 2.10's loader reads torch._inductor.codecache without importing it.
    with contextlib.suppress(ImportError):
        importlib.import_module("torch._inductor.codecache")
    return load(path)  # type: ignore[no-any-return]


class _StorageRecord:
    """A tensor's storage on its way into a PT2 archive, written from its memory rather than copied to ``bytes``."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def __len__(self) -> int:
        return int(self.storage.nbytes())


_streaming_lock = threading.Lock()
_streaming_depth = 0
_streaming_originals: tuple[Any, Any] | None = None


@contextlib.contextmanager
def streaming_tensor_writes() -> Iterator[None]:
    """While active, ``torch.export.save`` writes CPU tensors from their storage, without a ``bytes`` copy.

    torch >= 2.8 (the PT2 archive writer) turns each weight or constant into
    ``bytes`` before writing it, and the writer copies that again: saving holds
    twice the largest tensor (a whole TensorRT-sized engine payload) in memory.
    The archive writer itself takes a storage (as ``torch.save`` uses it), so
    the raw-bytes helper hands the storage through and ``write_bytes`` passes it
    on; the file is byte for byte the same. On a torch without those functions
    this does nothing. Re-entrant and thread-safe; everything is restored on exit.
    """
    global _streaming_depth, _streaming_originals
    try:
        package = importlib.import_module("torch.export.pt2_archive._package")
    except ImportError:
        package = None
    raw_bytes = getattr(package, "_get_raw_tensor_bytes", None)
    writer = getattr(package, "PT2ArchiveWriter", None)
    if raw_bytes is None or writer is None or not callable(getattr(writer, "write_bytes", None)):
        yield
        return
    with _streaming_lock:
        if _streaming_depth == 0:
            original_raw, original_write = raw_bytes, writer.write_bytes

            def storage_bytes(value: torch.Tensor) -> Any:
                if is_fake(value) or value.device.type != "cpu" or not value.data_ptr():
                    return original_raw(value)
                return _StorageRecord(value.untyped_storage())

            def write_bytes(self: Any, name: str, data: Any) -> None:
                if isinstance(data, _StorageRecord):
                    self.archive_file.write_record(name, data.storage, len(data))
                else:
                    original_write(self, name, data)

            _streaming_originals = (original_raw, original_write)
            package._get_raw_tensor_bytes = storage_bytes  # type: ignore[union-attr]
            writer.write_bytes = write_bytes
        _streaming_depth += 1
    try:
        yield
    finally:
        with _streaming_lock:
            _streaming_depth -= 1
            if _streaming_depth == 0 and _streaming_originals is not None:
                package._get_raw_tensor_bytes, writer.write_bytes = _streaming_originals  # type: ignore[union-attr]
                _streaming_originals = None


# ---------------------------------------------------------------------------
# torch.distributed: the store and the registry of process groups by name
# ---------------------------------------------------------------------------


def default_store() -> Any:
    """The key-value store of the default process group (every rank reaches it; the launcher made it)."""
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def live_groups() -> dict[str, Any]:
    """This process's process groups by the name a graph's collectives call them ({name: ProcessGroup})."""
    from torch.distributed.distributed_c10d import _world

    return {str(name): group for group, name in _world.pg_names.items()}


def c10d_class(name: str) -> Any:
    """A class of torch's C++ distributed core (``ProcessGroup``, ``Work``), which Python may subclass."""
    return getattr(torch._C._distributed_c10d, name)


def register_group(name: str, group: Any) -> None:
    """Make ``group`` what a collective op naming ``name`` runs on (functional collectives look groups up by name)."""
    torch._C._distributed_c10d._register_process_group(name, group)  # type: ignore[arg-type]


def to_copy_op() -> OpOverload:
    """``aten._to_copy.default``: a copy to another dtype, as the reference backend's precision emulation rounds."""
    return torch.ops.aten._to_copy.default
