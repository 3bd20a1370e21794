"""What an accelerated submodule is, and the node that replaces its call.

Three kinds of accelerated module can sit behind a ``_run_on_acc_N`` call:

==============================  ==========================================================
module                          node emitted in the flat graph
==============================  ==========================================================
:class:`ReferenceEngine`        ``get_attr <name>_engine`` (uint8 payload) +
                                ``trt_inline.execute_engine((inputs...), engine, program)``
``TorchTensorRTModule``         ``get_attr <name>_engine`` (``tensorrt.Engine``) +
                                ``tensorrt.execute_engine((inputs...), engine)``
the same, cross-compiled        ``tensorrt.no_op_placeholder_for_execute_engine(
                                (inputs...), *engine_info)`` with the engine base64-encoded
==============================  ==========================================================

The Torch-TensorRT forms are the ones its own exporter emits (2.5 ... 2.14), so
the rest of Torch-TensorRT (``replace_execute_engine_no_op_node``, the runtime,
the AOTInductor and ExecuTorch paths) accepts the graph. ``torch_tensorrt`` is
only ever imported here when one of its modules is already in the graph, which
means it is already imported.
"""

from __future__ import annotations

import base64
import sys
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import CustomObjArgument

from trt_inline.errors import InlineError
from trt_inline.reference.engine import ReferenceEngine

__all__ = ["emit_engine_call", "engine_kind", "unique_attr_name"]


def engine_kind(module: torch.nn.Module) -> str | None:
    """``"reference"``, ``"tensorrt"``, or None for a module that is no engine."""
    if isinstance(module, ReferenceEngine):
        return "reference"
    if "torch_tensorrt" in sys.modules:
        runtime = sys.modules.get("torch_tensorrt.dynamo.runtime")
        trt_class = getattr(runtime, "TorchTensorRTModule", None)
        if isinstance(trt_class, type) and isinstance(module, trt_class):
            return "tensorrt"
    return None


def unique_attr_name(gm: torch.nn.Module, base: str) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first name ``gm`` does not have yet."""
    base = base.replace(".", "_")
    name, suffix = base, 0
    while hasattr(gm, name):
        suffix += 1
        name = f"{base}_{suffix}"
    return name


def _fake_like(tensor: torch.Tensor, call_node: torch.fx.Node) -> Any:
    """A fake value for a tensor attribute, in the graph's fake mode when it has one."""
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode(list(call_node.meta.get("val", [])))
    if fake_mode is not None:
        return fake_mode.from_tensor(tensor, static_shapes=True)
    return torch.empty_like(tensor, device="meta")


def emit_engine_call(
    gm: torch.fx.GraphModule,
    call_node: torch.fx.Node,
    module: torch.nn.Module,
    *,
    cross_compile_module: bool,
) -> torch.fx.Node:
    """Insert, before ``call_node``, the engine op node that replaces it; return it.

    The engine's inputs are ``call_node.args`` in their order: position is the
    only thing that ties an engine input to its producer.
    """
    name = str(call_node.target)
    kind = engine_kind(module)
    inputs = tuple(call_node.args)
    with gm.graph.inserting_before(call_node):
        if kind == "reference":
            assert isinstance(module, ReferenceEngine)
            attr = unique_attr_name(gm, f"{name}_engine")
            # A non-persistent buffer: export lifts it as a constant, not a user weight.
            gm.register_buffer(attr, module.engine, persistent=False)
            engine_node = gm.graph.get_attr(attr)
            engine_node.meta["val"] = _fake_like(module.engine, call_node)
            return gm.graph.call_function(
                torch.ops.trt_inline.execute_engine.default,
                (inputs, engine_node, module.program),
            )
        if kind == "tensorrt":
            if cross_compile_module:
                from torch_tensorrt.dynamo.runtime._TorchTensorRTModule import ENGINE_IDX

                engine_info = list(module._pack_engine_info())  # type: ignore[operator]
                engine_info[ENGINE_IDX] = base64.b64encode(engine_info[ENGINE_IDX]).decode("utf-8")
                return gm.graph.call_function(
                    torch.ops.tensorrt.no_op_placeholder_for_execute_engine.default,
                    (inputs, *engine_info),
                )
            attr = unique_attr_name(gm, f"{name}_engine")
            setattr(gm, attr, module.engine)
            engine_node = gm.graph.get_attr(attr)
            engine_node.meta["val"] = CustomObjArgument(name=engine_node.name, class_fqn="")
            return gm.graph.call_function(torch.ops.tensorrt.execute_engine.default, (inputs, engine_node))
    raise InlineError(
        f"{name}: accelerated submodule of type {type(module).__module__}.{type(module).__qualname__} "
        "is not an engine trt_inline knows (expected torch_tensorrt's TorchTensorRTModule "
        "or trt_inline.reference.ReferenceEngine)"
    )
