"""A partitioned module handed from the rehearsal's child back to the caller: each graph node by node.

The release's pipeline runs in a child process (:mod:`trt_inline.reference.release`); what it ends with is a
partitioned ``GraphModule`` whose engines are already :class:`~trt_inline.reference.engine.ReferenceEngine`
modules. Pickle cannot carry that module as it is: an operator (``OpOverload``) does not pickle, a fake value
belongs to the child's fake mode, and a ``GraphModule`` pickles as its Python code, which the other side traces
again under other node names and without metadata. So :func:`describe` writes each graph as records, a node
each (its name, its op, its target, its arguments with every node named, the metadata a report reads, its value
described by dtype, device, sizes and strides, a size as the expression it is over the program's symbols), and
:func:`rebuild` makes the module again in the caller, node for node under the same names, each value a fake
tensor of the caller's own exported program::

    child:  GraphModule(_run_on_acc_0=ReferenceEngine, _run_on_gpu_1=GraphModule, ...)
              --describe-->  ModuleRecord(graph=[NodeRecord...], children={...}, tensors={...})  --pickle-->
    caller:   --rebuild(fake_mode, device)-->  GraphModule(_run_on_acc_0=ReferenceEngine, _run_on_gpu_1=...)

The bytes cross from a child forked from the caller's own process, which ran the caller's own model: nothing
here is read from a file or from anyone else.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from trt_inline import compat

__all__ = ["ModuleRecord", "NodeRecord", "describe", "dumps", "loads", "rebuild"]

# What a node's metadata keeps across: what reports read (module path, source line) and the value.
_KEPT_META = ("nn_module_stack", "stack_trace", "torch_fn")


@dataclass(frozen=True)
class _Ref:
    """A reference to the node of this name in the same graph."""

    name: str


@dataclass(frozen=True)
class _Size:
    """A size, a SymInt, SymFloat or SymBool as the expression it stands for over the program's symbols."""

    kind: str  # "int", "float" or "bool"
    expression: str


@dataclass(frozen=True)
class _TensorValue:
    """A tensor value without its data: what a fake tensor of the caller is made from."""

    shape: tuple[int | _Size, ...]
    stride: tuple[int | _Size, ...]
    storage_offset: int | _Size
    dtype: torch.dtype
    device: str
    requires_grad: bool


@dataclass
class NodeRecord:
    """One node: ``target`` is a name for placeholders, attributes, modules and methods, the callable (operators
    pickled by their names) for ``call_function``."""

    name: str
    op: str
    target: Any
    args: Any
    kwargs: Any
    meta: dict[str, Any]


@dataclass
class ModuleRecord:
    """One ``GraphModule``: its nodes in order, its submodules (records, or modules that pickle as they are), the
    tensors its ``get_attr`` nodes read, by attribute path, and plain attributes to set on it (plain data)."""

    nodes: list[NodeRecord]
    children: dict[str, ModuleRecord | torch.nn.Module | _CallersOwn] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# The child's side
# ---------------------------------------------------------------------------


def describe(module: torch.fx.GraphModule) -> ModuleRecord:
    """``module`` as records: its graph's nodes, its ``GraphModule`` children as records too, other children
    (the engines) as they are, and the tensors its ``get_attr`` nodes read."""
    record = ModuleRecord([_describe_node(node) for node in module.graph.nodes])
    for node in module.graph.nodes:
        if node.op == "call_module":
            child = module.get_submodule(str(node.target))
            if isinstance(child, torch.fx.GraphModule):
                record.children[str(node.target)] = describe(child)
            else:
                record.children[str(node.target)] = child if _pickles(child) else _CallersOwn(str(node.target))
        elif node.op == "get_attr":
            value = _attribute(module, str(node.target))
            if isinstance(value, torch.fx.GraphModule):  # (a higher-order op's branch)
                record.children[str(node.target)] = describe(value)
            elif isinstance(value, torch.nn.Parameter):  # (a weight stays a parameter, not a buffer)
                record.tensors[str(node.target)] = torch.nn.Parameter(value.detach(), value.requires_grad)
            elif isinstance(value, torch.Tensor):
                record.tensors[str(node.target)] = value.detach()
            else:
                raise TypeError(f"get_attr {node.name} reads a {type(value).__qualname__}, which cannot be handed over")
    return record


@dataclass(frozen=True)
class _CallersOwn:
    """A submodule that does not pickle (the input-guard module ``ExportedProgram.module()`` inserts, whose code is
    made at run time): the caller's module of the same name stands in for it."""

    name: str


def _pickles(module: torch.nn.Module) -> bool:
    try:
        pickle.dumps(module)
    except Exception:
        return False
    return True


def _attribute(module: torch.nn.Module, path: str) -> Any:
    value: Any = module
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _describe_node(node: torch.fx.Node) -> NodeRecord:
    meta: dict[str, Any] = {}
    for key in _KEPT_META:
        if key in node.meta:
            meta[key] = _plain_meta(key, node.meta[key])
    if "val" in node.meta:
        meta["val"] = _describe_value(node.meta["val"])
    target = node.target if node.op == "call_function" else str(node.target)
    return NodeRecord(node.name, node.op, target, _with_refs(node.args), _with_refs(node.kwargs), meta)


def _plain_meta(key: str, value: Any) -> Any:
    """Metadata without objects of the child's: a module stack's classes by their qualified names (as
    ``torch.export.load`` gives them)."""
    if key == "nn_module_stack" and isinstance(value, Mapping):
        return {str(k): (str(path), _type_name(kind)) for k, (path, kind) in value.items()}
    return value


def _type_name(kind: Any) -> str:
    if isinstance(kind, str):
        return kind
    return f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', repr(kind))}"


def _with_refs(value: Any) -> Any:
    return torch.fx.node.map_arg(value, lambda node: _Ref(node.name))  # type: ignore[arg-type,return-value]


def _describe_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _TensorValue(
            tuple(_describe_size(d) for d in value.shape), tuple(_describe_size(s) for s in value.stride()),
            _describe_size(value.storage_offset()), value.dtype, str(value.device), bool(value.requires_grad),
        )  # fmt: skip
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _describe_size(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_describe_value(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _Unknown()


class _Unknown:
    """A value the records do not carry (the node is rebuilt without one)."""


def _describe_size(value: Any) -> int | _Size:
    if isinstance(value, torch.SymInt):
        return _Size("int", compat.expression_text(value))
    if isinstance(value, torch.SymFloat):
        return _Size("float", compat.expression_text(value))
    if isinstance(value, torch.SymBool):
        return _Size("bool", compat.expression_text(value))
    return int(value)


class _Pickler(pickle.Pickler):
    """Operators (``aten.linear.default``, ``higher_order.cond``) by their names; everything else as pickle does."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, compat.OpOverload):
            return compat.op_by_name, (compat.op_schema_name(obj), compat.op_overload_name(obj))
        if isinstance(obj, compat.OpOverloadPacket):
            return compat.op_by_name, (compat.op_packet_name(obj), None)
        name = compat.higher_order_name(obj)
        if name is not None:
            return compat.higher_order_by_name, (name,)
        return NotImplemented


def dumps(record: Any) -> bytes:
    """``record`` (or a request to the child: settings naming operators) as bytes for the other side."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(record)
    return buffer.getvalue()


def loads(data: bytes) -> ModuleRecord:
    """The record :func:`dumps` wrote, read back in the caller (from its own child: see the module's note)."""
    record = pickle.loads(data)
    if not isinstance(record, ModuleRecord):
        raise TypeError(f"the rehearsal's child handed back a {type(record).__qualname__}, not a ModuleRecord")
    return record


# ---------------------------------------------------------------------------
# The caller's side
# ---------------------------------------------------------------------------


def rebuild(
    record: ModuleRecord, fake_mode: Any, device: torch.device | None = None, own: torch.nn.Module | None = None
) -> torch.fx.GraphModule:
    """The ``GraphModule`` ``record`` describes: every node under its own name with its metadata, each value a fake
    tensor of ``fake_mode`` (the caller's exported program's; sizes over its symbols), and, where ``device`` is
    given, the child's CPU moved to it (tensors, values, and the devices the graphs name). ``own``: the caller's
    module whose submodules stand in for those that did not pickle (by name)."""
    values = _Values(fake_mode, device)
    return _rebuild(record, values, own)


def _rebuild(record: ModuleRecord, values: _Values, own: torch.nn.Module | None) -> torch.fx.GraphModule:
    root = torch.nn.Module()
    for path, child in record.children.items():
        if isinstance(child, ModuleRecord):
            built: torch.nn.Module = _rebuild(child, values, own)
        elif isinstance(child, _CallersOwn):
            built = _callers_own(own, child.name)
        else:
            built = child.to(values.device) if values.device is not None else child
        _set_attribute(root, path, built)
    for path, tensor in record.tensors.items():
        _set_attribute(root, path, tensor if values.device is None else _moved(tensor, values.device))
    graph = torch.fx.Graph()
    made: dict[str, torch.fx.Node] = {}
    for node_record in record.nodes:
        args = _resolved(node_record.args, made, values)
        kwargs = _resolved(node_record.kwargs, made, values)
        node = graph.create_node(node_record.op, node_record.target, args, kwargs, name=node_record.name)
        if node.name != node_record.name:
            raise ValueError(f"node {node_record.name} came back as {node.name}")
        for key, value in node_record.meta.items():
            if key != "val":
                node.meta[key] = value
        if "val" in node_record.meta:
            value = values.make(node_record.meta["val"])
            if not isinstance(value, _Unknown):
                node.meta["val"] = value
        made[node.name] = node
    graph.lint()
    rebuilt = torch.fx.GraphModule(root, graph)
    for name, value in record.attributes.items():
        setattr(rebuilt, name, value)
    return rebuilt


def _callers_own(own: torch.nn.Module | None, name: str) -> torch.nn.Module:
    """The caller's submodule called ``name`` (at the top, else the first of that name below, in module order)."""
    last = name.rsplit(".", 1)[-1]
    if own is not None:
        modules: dict[str, torch.nn.Module] = dict(own.named_modules())
        if name in modules:  # (the same path first; a module of the same name elsewhere only where there is none)
            return modules[name]
        for path, module in modules.items():
            if path.rsplit(".", 1)[-1] == last:
                found: torch.nn.Module = module
                return found
    raise TypeError(f"submodule {name} did not pickle, and the caller has none of that name")


def _moved(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    moved = tensor.to(device)
    return torch.nn.Parameter(moved, tensor.requires_grad) if isinstance(tensor, torch.nn.Parameter) else moved


def _set_attribute(root: torch.nn.Module, path: str, value: Any) -> None:
    *parents, name = path.split(".")
    owner = root
    for part in parents:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    if isinstance(value, torch.nn.Module):
        owner.add_module(name, value)
    elif isinstance(value, torch.nn.Parameter):
        owner.register_parameter(name, value)
    else:
        owner.register_buffer(name, value)


def _resolved(value: Any, made: Mapping[str, torch.fx.Node], values: _Values) -> Any:
    if isinstance(value, _Ref):
        return made[value.name]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolved(v, made, values) for v in value)
    if isinstance(value, dict):
        return {k: _resolved(v, made, values) for k, v in value.items()}
    if isinstance(value, torch.device) and values.device is not None and value.type == "cpu":
        return values.device
    return value


class _Values:
    """Makes the caller's fake values from descriptions: sizes over the symbols of ``fake_mode``'s shape
    environment (a symbol made in the child after the fork, such as an unbacked size, gets a fresh one here)."""

    def __init__(self, fake_mode: Any, device: torch.device | None) -> None:
        self.fake_mode = fake_mode
        self.device = device
        self._symbols = compat.shape_env_symbols(fake_mode)
        self._sizes: dict[tuple[str, str], Any] = {}

    def make(self, described: Any) -> Any:
        if isinstance(described, _TensorValue):
            return self._tensor(described)
        if isinstance(described, _Size):
            return self._size(described)
        if isinstance(described, (list, tuple)):
            return type(described)(self.make(v) for v in described)
        return described

    def _tensor(self, described: _TensorValue) -> torch.Tensor:
        device = torch.device(described.device)
        if self.device is not None and device.type == "cpu":
            device = self.device
        shape = [self._size(d) if isinstance(d, _Size) else d for d in described.shape]
        stride = [self._size(s) if isinstance(s, _Size) else s for s in described.stride]
        with self.fake_mode:
            value = torch.empty_strided(shape, stride, dtype=described.dtype, device=device)
        return value.requires_grad_(described.requires_grad) if described.requires_grad else value

    def _size(self, described: _Size) -> Any:
        key = (described.kind, described.expression)
        if key not in self._sizes:
            self._sizes[key] = compat.symbolic_value(self.fake_mode, described.kind, described.expression,
                                                     self._symbols)  # fmt: skip
        return self._sizes[key]
