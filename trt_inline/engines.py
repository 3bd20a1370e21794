"""What an engine is: the one place that says so.

Everything else (the passes, verification, the ``inspect`` table, the plugin,
the archive safety checks, the reference backend's partitioner) asks this
module. A new engine op or module type is added here and nowhere else.

==============================  ==========================================================
accelerated module              node emitted in the flat graph
==============================  ==========================================================
``ReferenceEngine``             ``get_attr <name>_engine`` (uint8 payload) +
                                ``trt_inline.execute_engine([inputs...], engine, program)``
``TorchTensorRTModule``         ``get_attr <name>_engine`` (``tensorrt.Engine``) +
                                ``tensorrt.execute_engine([inputs...], engine)``
the same, cross-compiled        ``tensorrt.no_op_placeholder_for_execute_engine(
                                [inputs...], *engine_info)`` with the engine base64-encoded
==============================  ==========================================================

The Torch-TensorRT forms are the ones its own exporter emits (2.5 ... 2.14), so
the rest of Torch-TensorRT (``replace_execute_engine_no_op_node``, the runtime,
the AOTInductor and ExecuTorch paths) accepts the graph.

Each kind of engine module is an :class:`EngineBackend` registered here: it
names its module types (by qualified name, so that asking never imports
``torch_tensorrt``, which needs ``libnvinfer``), emits its engine op, and says
what it knows of its outputs and of a call's signature. The TensorRT backend is
registered by this module; the reference backend registers itself when
:mod:`trt_inline.reference.engine` is imported (which registering its op needs
anyway), so the passes never import it.

Every engine op takes its inputs as one ``Tensor[]`` argument (position 0) and
returns ``Tensor[]``: a scalar crossing the boundary travels as a 0-d tensor.
"""

from __future__ import annotations

import importlib
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import CustomObjArgument

from trt_inline import compat, releases
from trt_inline.errors import InlineError
from trt_inline.switches import REFERENCE_ENGINE_OP

__all__ = [
    "ACC_PREFIX",
    "ENGINE_OPS",
    "ENGINE_PICKLE_GLOBALS",
    "ENGINE_SCRIPT_CLASSES",
    "FALLBACK_PREFIX",
    "EngineBackend",
    "EngineOp",
    "EngineSignature",
    "ValueSpec",
    "backend_of",
    "emit_engine_call",
    "fake_constant",
    "engine_inputs",
    "engine_op",
    "engine_output_users",
    "engine_signature",
    "engine_submodule_name",
    "is_accelerated_call",
    "is_engine_attribute",
    "is_engine_call",
    "is_fallback_call",
    "output_count",
    "output_specs",
    "register_backend",
    "unique_attr_name",
]

# Submodule names Torch-TensorRT's partitioners give (and the reference backend copies).
ACC_PREFIX = "_run_on_acc_"
FALLBACK_PREFIX = "_run_on_gpu_"
# The attribute an inlined engine object is stored under: "<submodule>_engine", as the stock exporter names it,
# for each partitioner's submodule names: `_run_on_acc_3` (global and fast partitioners), `_run_on_acc_tensorrt_3`
# (hierarchical: the backend's name first), `_run_on_acc_3_resource_split_1` (an engine the resource partitioner
# split), each with the `_1`, `_2` ... suffix that keeps an attribute name unique.
_ENGINE_ATTRIBUTE = re.compile(
    rf"{ACC_PREFIX}(?:[A-Za-z][A-Za-z0-9]*_)?[0-9]+(?:_resource_split_[0-9]+)?_engine(?:_[0-9]+)?"
)


@dataclass(frozen=True)
class ValueSpec:
    """What one engine input or output is: a tensor's dtype and dims (None where symbolic), or a scalar."""

    dtype: torch.dtype
    dims: tuple[int | None, ...] = ()
    scalar: bool = False


@dataclass(frozen=True)
class EngineSignature:
    """What an engine call node's engine declares about its inputs and outputs."""

    inputs: tuple[ValueSpec | None, ...]
    outputs: tuple[ValueSpec | None, ...]


@dataclass(frozen=True)
class EngineOp:
    """An op that runs an engine.

    ``engine_arg`` is the position of the engine object (``None`` where the
    engine travels inside the call's own arguments). ``native_code``: running it
    runs native code carried by the file (a TensorRT plan). ``backend_module``
    is imported before the op's backend is asked anything (it registers it).
    """

    name: str
    backend: str
    engine_arg: int | None
    native_code: bool
    backend_module: str = __name__


# (Its name is shared with the entry point, which defines the op at import torch: trt_inline.switches.)
REFERENCE_OP = EngineOp(
    REFERENCE_ENGINE_OP, "reference", engine_arg=1, native_code=False, backend_module="trt_inline.reference.engine"
)
TENSORRT_OP = EngineOp("tensorrt::execute_engine", "tensorrt", engine_arg=1, native_code=True)
CROSS_COMPILE_OP = EngineOp(
    "tensorrt::no_op_placeholder_for_execute_engine", "tensorrt", engine_arg=None, native_code=True
)
ENGINE_OPS: tuple[EngineOp, ...] = (REFERENCE_OP, TENSORRT_OP, CROSS_COMPILE_OP)
_OPS_BY_NAME = {op.name: op for op in ENGINE_OPS}


class EngineBackend:
    """One kind of engine module: how its calls are inlined, and what it says about its values.

    Subclasses set ``name`` (an :attr:`EngineOp.backend`) and ``module_types``
    (qualified class names) and implement :meth:`emit`.
    """

    name: str = ""
    module_types: tuple[str, ...] = ()

    def emit(
        self,
        gm: torch.fx.GraphModule,
        call_node: torch.fx.Node,
        module: torch.nn.Module,
        inputs: list[Any],
        *,
        cross_compile_module: bool,
    ) -> torch.fx.Node:
        """Insert (the caller has set the insertion point) the engine op node replacing ``call_node``."""
        raise NotImplementedError

    def output_specs(self, module: torch.nn.Module) -> list[tuple[torch.dtype, torch.device]] | None:
        """(dtype, device) of each output, as the engine module records them; None where it does not."""
        return None

    def describe(self, call_node: torch.fx.Node) -> EngineSignature | None:
        """The signature of an engine op call, where the call carries enough to say."""
        return None


_BACKENDS: dict[str, EngineBackend] = {}


def register_backend(backend: EngineBackend) -> None:
    """Make a kind of engine module known (registering again replaces it)."""
    _BACKENDS[backend.name] = backend


def backend_of(module: torch.nn.Module) -> EngineBackend | None:
    """The backend of an engine module, or None for a module that is no engine."""
    for cls in type(module).__mro__:
        qualified = f"{cls.__module__}.{cls.__qualname__}"
        for backend in _BACKENDS.values():
            if qualified in backend.module_types:
                return backend
    return None


def _backend_of_op(op: EngineOp) -> EngineBackend | None:
    if op.backend not in _BACKENDS:
        importlib.import_module(op.backend_module)
    return _BACKENDS.get(op.backend)


# How a saved archive stores an engine object, and so what the archive safety
# checks let through without --allow-pickle:
# - TorchBind classes, pickled by torch.save (torch.ScriptObject + class name) or
#   by the TorchScript pickler (a global named after the class); loading runs the
#   class's registered C++ __setstate__, no Python from the file.
ENGINE_SCRIPT_CLASSES: tuple[str, ...] = ("__torch__.torch.classes.tensorrt.Engine",)
# - Python reconstructors (Torch-TensorRT 2.13+ saves engines as opaque objects
#   whose pickle calls this function of the installed torch_tensorrt with strings).
ENGINE_PICKLE_GLOBALS: tuple[tuple[str, str], ...] = releases.engine_pickle_globals()


# ---------------------------------------------------------------------------
# Engine call nodes in a flat graph
# ---------------------------------------------------------------------------


def engine_op(node: torch.fx.Node) -> EngineOp | None:
    """The engine op a ``call_function`` node calls, or None."""
    if node.op != "call_function":
        return None
    return _OPS_BY_NAME.get(compat.op_schema_name(node.target) or "")


def is_engine_call(node: torch.fx.Node) -> bool:
    return engine_op(node) is not None


def engine_inputs(node: torch.fx.Node) -> list[Any]:
    """The values wired into an engine call, in input order."""
    wired = node.args[0] if node.args else ()
    return list(wired) if isinstance(wired, (list, tuple)) else [wired]


def engine_signature(node: torch.fx.Node) -> EngineSignature | None:
    """What the engine of a call declares about its inputs and outputs, where its call carries that."""
    op = engine_op(node)
    backend = _backend_of_op(op) if op is not None else None
    return backend.describe(node) if backend is not None else None


def output_count(node: torch.fx.Node) -> int | None:
    """How many outputs an engine call has: from its engine where it says, else from ``meta["val"]``."""
    signature = engine_signature(node)
    if signature is not None:
        return len(signature.outputs)
    val = node.meta.get("val")
    return len(val) if isinstance(val, (list, tuple)) else None


def engine_output_users(node: torch.fx.Node) -> tuple[dict[int, list[torch.fx.Node]], list[torch.fx.Node]]:
    """``({output index: getitem users}, other users)`` of an engine call, in graph order."""
    by_index: dict[int, list[torch.fx.Node]] = {}
    others: list[torch.fx.Node] = []
    for user in node.users:
        index = user.args[1] if user.op == "call_function" and user.target is operator.getitem else None
        if isinstance(index, int):
            by_index.setdefault(index, []).append(user)
        else:
            others.append(user)
    return by_index, others


# ---------------------------------------------------------------------------
# Accelerated submodules in a partitioned module
# ---------------------------------------------------------------------------


def is_accelerated_call(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A ``call_module`` of an engine, or of a submodule a partitioner named ``_run_on_acc_...``."""
    if node.op != "call_module":
        return False
    return str(node.target).startswith(ACC_PREFIX) or backend_of(gm.get_submodule(str(node.target))) is not None


def is_fallback_call(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A ``call_module`` of a submodule the partitioner left to PyTorch (``_run_on_gpu_N``)."""
    return node.op == "call_module" and str(node.target).startswith(FALLBACK_PREFIX)


def output_specs(module: torch.nn.Module) -> list[tuple[torch.dtype, torch.device]] | None:
    """(dtype, device) of each output as the engine module itself records them; None where it does not."""
    backend = backend_of(module)
    return backend.output_specs(module) if backend is not None else None


def engine_submodule_key(text: str) -> str | None:
    """``_run_on_acc_5`` for ``acc_5`` or ``_run_on_acc_5`` (how a user names an engine submodule), else None."""
    short = ACC_PREFIX.removeprefix("_run_on_")
    name = (
        text if text.startswith(ACC_PREFIX) else ACC_PREFIX + text.removeprefix(short) if text.startswith(short) else ""
    )
    return name if len(name) > len(ACC_PREFIX) else None


def is_engine_attribute(target: str) -> bool:
    """Whether an attribute (a lifted constant's target) holds an inlined engine, by the exporters' naming."""
    # fullmatch: `$` would also match before a trailing newline, and `\d` any Unicode digit.
    return bool(_ENGINE_ATTRIBUTE.fullmatch(target.rpartition(".")[2]))


def engine_submodule_name(call_node: torch.fx.Node, lifted: Mapping[str, str] | None = None) -> str | None:
    """The submodule an engine call's engine was inlined from, by the attribute it is stored under.

    ``lifted`` maps a program's placeholders to the constants they lift (an
    ``ExportedProgram`` reads its engines through placeholders). None where the
    engine travels in the call's arguments or under a name no exporter gives.
    """
    op = engine_op(call_node)
    if op is None or op.engine_arg is None or len(call_node.args) <= op.engine_arg:
        return None
    holder = call_node.args[op.engine_arg]
    if not isinstance(holder, torch.fx.Node):
        return None
    if holder.op == "get_attr":
        target = str(holder.target)
    elif holder.op == "placeholder":
        target = (lifted or {}).get(holder.name, str(holder.target))
    else:
        return None
    name = target.rpartition(".")[2]
    return name.rsplit("_engine", 1)[0] if is_engine_attribute(name) else None


def unique_attr_name(gm: torch.nn.Module, base: str) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first name ``gm`` does not have yet."""
    base = base.replace(".", "_")
    name, suffix = base, 0
    while hasattr(gm, name):
        suffix += 1
        name = f"{base}_{suffix}"
    return name


def fake_constant(tensor: torch.Tensor, call_node: torch.fx.Node) -> Any:
    """A fake value for a tensor attribute, in the graph's fake mode when it has one."""
    fake_mode = compat.detect_fake_mode(list(call_node.meta.get("val", [])))
    if fake_mode is not None:
        return fake_mode.from_tensor(tensor, static_shapes=True)
    return torch.empty_like(tensor, device="meta")


def emit_engine_call(
    gm: torch.fx.GraphModule,
    call_node: torch.fx.Node,
    module: torch.nn.Module,
    inputs: Sequence[Any],
    *,
    cross_compile_module: bool,
) -> torch.fx.Node:
    """Insert, before ``call_node``, the engine op node that replaces it; return it.

    ``inputs`` are the engine's inputs in their order (the call's arguments, with
    scalars already turned into 0-d tensors): position is the only thing that
    ties an engine input to its producer.
    """
    backend = backend_of(module)
    if backend is None:
        known = " or ".join(sorted(t for b in _BACKENDS.values() for t in b.module_types))
        raise InlineError(
            f"{call_node.target}: accelerated submodule of type {type(module).__module__}."
            f"{type(module).__qualname__} is not an engine trt_inline knows (expected {known})"
        )
    with gm.graph.inserting_before(call_node):
        return backend.emit(gm, call_node, module, list(inputs), cross_compile_module=cross_compile_module)


class TensorRTBackend(EngineBackend):
    """Torch-TensorRT's ``TorchTensorRTModule``: the engine object as a custom-object attribute, or base64."""

    name = "tensorrt"
    module_types = ("torch_tensorrt.dynamo.runtime._TorchTensorRTModule.TorchTensorRTModule",)

    def emit(
        self,
        gm: torch.fx.GraphModule,
        call_node: torch.fx.Node,
        module: torch.nn.Module,
        inputs: list[Any],
        *,
        cross_compile_module: bool,
    ) -> torch.fx.Node:
        if cross_compile_module:
            engine_info = compat.tensorrt_engine_info(module)
            return gm.graph.call_function(
                torch.ops.tensorrt.no_op_placeholder_for_execute_engine.default, (inputs, *engine_info)
            )
        attr = unique_attr_name(gm, f"{call_node.target}_engine")
        setattr(gm, attr, getattr(module, "engine"))  # noqa: B009
        engine_node = gm.graph.get_attr(attr)
        engine_node.meta["val"] = CustomObjArgument(name=engine_node.name, class_fqn="")
        return gm.graph.call_function(torch.ops.tensorrt.execute_engine.default, (inputs, engine_node))


register_backend(TensorRTBackend())
