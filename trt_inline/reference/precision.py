"""Reduced precision as a TensorRT build computes it, emulated inside a reference engine's own program.

A Torch-TensorRT build with ``enabled_precisions={torch.float16}`` (the weakly
typed releases) or ``enable_autocast=True`` (2.10+) runs layers in fp16 or
bf16: their inputs and outputs are stored in the low precision, a matmul or
convolution still accumulates in fp32, and the fp32 layers left round their
matmul and convolution inputs to TF32 unless ``disable_tf32=True``. This
module reproduces that, on the CPU or on CUDA, by inserting the roundings into
the accelerated block before it is frozen into an engine
(:func:`emulate_precision`); the saved engine then carries them, and whoever
loads the file sees the same numbers. It is an emulation: its numbers are not
TensorRT's (TensorRT picks kernels, fuses layers, may keep a layer in fp32), its
structure and the kind of error are (an fp16 overflow is an ``inf``, a value
stored in fp16 keeps 11 significant bits).

Which nodes run in the low precision (:func:`low_precision_nodes`) follows the releases' own rules
(``lowering/passes/nodeclassifier.py`` and ``rule_based_autocast.py`` of 2.10 ... 2.14): every
floating-point node with ``enabled_precisions`` alone (the weakly typed releases); with autocast, every
operator call but ``getitem`` (which follows the node it reads), kept in fp32 where its module path (the
innermost ``nn_module_stack`` entry, ``layer3.0.conv1``) ``re.match``-es a pattern of
``autocast_excluded_nodes``, where its operator is in ``autocast_excluded_ops``, and, on the calibration data
``autocast_calibration_dataloader`` gives (none: neither rule applies), where one of its inputs or one of its
users' outputs is larger than ``autocast_max_output_threshold``, or a convolution or matmul reduces over more
than ``autocast_max_depth_of_reduction`` values. ``enable_autocast=True`` without
``autocast_low_precision_type`` is an fp32 build, as in every release that has it.
"""

from __future__ import annotations

import logging
import math
import operator
import re
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from trt_inline import compat
from trt_inline.inlining.attributes import resolve_attribute
from trt_inline.inlining.module_state import buffers_restored
from trt_inline.logs import log_graph
from trt_inline.reference.lowered import module_path, operator_name

__all__ = [
    "PrecisionSettings", "calibrate", "emulate_accumulation", "emulate_precision", "low_precision_nodes", "tf32_asked",
]  # fmt: skip

log = logging.getLogger(__name__)

_LOW = (torch.float16, torch.bfloat16)
_ROUND = compat.to_copy_op()
_TF32_HALF_ULP = 1 << 12  # (fp32 keeps 23 mantissa bits, TF32 10: the 13 dropped, rounded to nearest)
_TF32_MASK = -(1 << 13)
# What accumulates in fp32 in a reduced-precision build (its inputs rounded, its output rounded once).
_MATMULS = frozenset(
    f"aten::{name}" for name in ("mm", "addmm", "bmm", "baddbmm", "convolution", "matmul", "linear", "conv1d", "conv2d",
                                 "conv3d", "_convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
)  # fmt: skip
_REDUCTIONS = frozenset(
    f"aten::{name}" for name in ("sum", "mean", "var", "var_mean", "amax", "amin", "_softmax", "_log_softmax",
                                 "native_layer_norm", "native_group_norm", "norm", "linalg_vector_norm")
)  # fmt: skip


@dataclass(frozen=True)
class PrecisionSettings:
    """A build's precision, in Torch-TensorRT's terms (:meth:`from_compile_settings`).

    ``low``: fp16 or bf16 layers (None: an fp32 build). ``autocast``: which layers is decided by rule (the
    exclusions below) rather than every one. ``tf32``: fp32 matmuls and convolutions round their inputs to TF32.
    """

    low: torch.dtype | None = None
    autocast: bool = False
    excluded_nodes: tuple[str, ...] = ()
    excluded_ops: frozenset[str] = frozenset()
    max_output_threshold: float | None = 512.0
    max_depth_of_reduction: int | None = None
    tf32: bool = True

    @classmethod
    def from_compile_settings(
        cls,
        *,
        enabled_precisions: Collection[Any] = (),
        enable_autocast: bool = False,
        autocast_low_precision_type: Any = None,
        autocast_excluded_nodes: Collection[str] = (),
        autocast_excluded_ops: Collection[Any] = (),
        autocast_max_output_threshold: float | None = 512.0,
        autocast_max_depth_of_reduction: int | None = None,
        disable_tf32: bool = False,
    ) -> PrecisionSettings:
        """The settings ``torch_tensorrt.dynamo.compile`` takes, read as a build applies them; a value it would
        not take is a :class:`ValueError` naming it."""
        low = None
        if enable_autocast:
            # (None, the releases' default, leaves the graph in fp32: "no low precision is used")
            low = None if autocast_low_precision_type is None else _dtype(autocast_low_precision_type)
            if low is not None and low not in _LOW:
                raise ValueError(f"autocast_low_precision_type must be float16 or bfloat16, got {low}")
        else:
            wanted = [_dtype(p) for p in enabled_precisions]
            low = next((p for p in _LOW if p in wanted), None)
            if autocast_excluded_nodes or autocast_excluded_ops:
                raise ValueError("autocast_excluded_nodes and autocast_excluded_ops take effect with enable_autocast")
        for pattern in autocast_excluded_nodes:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"autocast_excluded_nodes: {pattern!r} is not a regular expression ({exc})") from None
        for op in autocast_excluded_ops:
            if not (isinstance(op, str) and op.startswith("torch.ops.")):
                warnings.warn(
                    f"trt-inline: autocast_excluded_ops entry {op!r} matches no node: the releases compare each entry "
                    "with a node's qualified name, a string such as 'torch.ops.aten.div.Tensor'",
                    stacklevel=3,
                )
        return cls(
            low, bool(enable_autocast), tuple(autocast_excluded_nodes),
            frozenset(op for op in autocast_excluded_ops if isinstance(op, str)), autocast_max_output_threshold,
            autocast_max_depth_of_reduction, not disable_tf32,
        )  # fmt: skip

    @property
    def emulated(self) -> bool:
        """Whether a build with these settings computes anything but plain fp32."""
        return self.low is not None or self.tf32


def _dtype(value: Any) -> torch.dtype:
    """A precision as Torch-TensorRT takes it: a torch dtype, or an object with ``to(torch.dtype)``, or a name."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        found = getattr(torch, value.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    converted = getattr(value, "to", None)
    if callable(converted):
        try:
            result = converted(torch.dtype)
        except Exception:  # (not one of Torch-TensorRT's dtypes)
            result = None
        if isinstance(result, torch.dtype):
            return result
    raise ValueError(f"{value!r} is not a precision (torch.float16, torch.bfloat16, torch.float32)")


def _op_name(op: Any) -> str:
    """``aten::_softmax`` for ``torch.ops.aten._softmax.default``, ``"aten._softmax.default"`` or itself."""
    name = compat.op_schema_name(op)
    if name is not None:
        return name
    text = str(op).removeprefix("torch.ops.")
    if "::" in text:
        return text.split(".")[0]
    parts = text.split(".")
    return f"{parts[0]}::{parts[1]}" if len(parts) >= 2 else text


def tf32_asked(settings: Mapping[str, Any]) -> bool:
    """Whether a build with these compile settings has its engines round fp32 matmul inputs to TF32: where a
    precision setting is given and ``disable_tf32`` is not True, or where ``disable_tf32=False`` is given alone (by
    default the engines compute what PyTorch computes)."""
    disable = settings.get("disable_tf32")
    asked = bool(settings.get("enabled_precisions")) or bool(settings.get("enable_autocast")) or disable is False
    return asked and not disable


def calibrate(gm: torch.fx.GraphModule, batches: Iterable[Any]) -> dict[str, torch.Tensor]:
    """Each node's values when ``gm`` runs on every batch of ``batches`` (``autocast_calibration_dataloader``: a
    batch is the inputs, a tuple or one tensor), by node name: what the release's autocast rules read (the
    largest magnitude over the batches, and the shape), each kept as that magnitude expanded to the shape (no
    memory, where the release keeps every value)."""
    largest: dict[str, float] = {}
    shapes: dict[str, tuple[int, ...]] = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            value = super().run_node(n)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                shapes[n.name] = tuple(value.shape)
                if value.numel():
                    found = float(value.detach().abs().nan_to_num(posinf=math.inf).max())
                    largest[n.name] = max(found, largest.get(n.name, 0.0))
            return value

    with torch.no_grad(), buffers_restored(gm):  # (a run that writes the model's buffers leaves them as they were)
        for batch in batches:
            _Recorder(gm).run(*(batch if isinstance(batch, (tuple, list)) else (batch,)))
    return {name: torch.full((), largest.get(name, 0.0)).expand(shape) for name, shape in shapes.items()}


def low_precision_nodes(
    graph: torch.fx.Graph, settings: PrecisionSettings, calibration: Mapping[str, torch.Tensor]
) -> tuple[set[str], dict[str, str]]:
    """The names of the nodes of ``graph`` that a build with ``settings`` runs in ``settings.low``, and for each
    other floating-point node a rule kept in fp32, why. A ``getitem`` follows the node it reads."""
    kept: dict[str, str] = {}
    if settings.low is None:
        return set(), kept
    chosen: set[str] = set()
    patterns = [re.compile(p) for p in settings.excluded_nodes]
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            source = node.args[0]
            if isinstance(source, torch.fx.Node) and source.name in chosen and _floating(node):
                chosen.add(node.name)
            continue
        if not _floating(node):
            continue
        why = _kept_why(node, settings, patterns, calibration) if settings.autocast else None
        if why is None:
            chosen.add(node.name)
        else:
            kept[node.name] = why
    return chosen, kept


def _kept_why(
    node: torch.fx.Node, settings: PrecisionSettings, patterns: Sequence[re.Pattern[str]],
    calibration: Mapping[str, torch.Tensor],
) -> str | None:  # fmt: skip
    path = module_path(node)
    if any(p.match(path) for p in patterns):
        return f"autocast_excluded_nodes (its module {path})"
    if operator_name(node.target) in settings.excluded_ops:
        return "autocast_excluded_ops"
    if calibration and settings.max_output_threshold is not None:
        for other in (*node.all_input_nodes, *node.users):
            recorded = calibration.get(other.name)
            if (
                recorded is not None
                and recorded.numel()
                and float(recorded.abs().max()) > settings.max_output_threshold
            ):
                role = "input" if other in node.all_input_nodes else "user"
                return (
                    f"autocast_max_output_threshold (its {role} {other.name} reaches "
                    f"{float(recorded.abs().max()):.4g} on the calibration data)"
                )
    depth = reduction_depth(node, calibration) if calibration else None
    if settings.max_depth_of_reduction is not None and depth is not None and depth > settings.max_depth_of_reduction:
        return f"autocast_max_depth_of_reduction (it reduces over {depth} values)"
    return None


def reduction_depth(node: torch.fx.Node, calibration: Mapping[str, torch.Tensor]) -> int | None:
    """How many values one output of ``node`` accumulates, as the releases' rule counts it from the calibration
    data's shapes: a convolution's input channels times its kernel, a matmul's (``mm``, ``bmm``, ``matmul``,
    ``dot``, ``mv``) inner size; None for anything else (``addmm`` and ``linear`` included, as in the releases)."""
    op = _op_name(node.target)
    inputs = node.all_input_nodes
    first = calibration.get(inputs[0].name) if inputs else None
    if first is None:
        return None
    if op in ("aten::convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d"):
        weight = calibration.get(inputs[1].name) if len(inputs) > 1 else None
        if weight is None and len(inputs) > 1:
            value = inputs[1].meta.get("val")
            weight = value if isinstance(value, torch.Tensor) else None
        if weight is None or weight.dim() < 2:
            return None
        return int(weight.shape[1]) * int(math.prod(weight.shape[2:]))
    if op in ("aten::matmul", "aten::dot", "aten::mm", "aten::mv", "aten::bmm") and first.dim():
        return int(first.shape[-1])
    return None


def _floating(node: torch.fx.Node, block: torch.fx.GraphModule | None = None) -> bool:
    """Whether ``node`` gives an fp32 tensor (or, an operator with several results, one): by its recorded value,
    or for a weight (``get_attr``, which older torch leaves without one) by the tensor ``block`` holds."""
    value = node.meta.get("val")
    if value is None and node.op == "get_attr" and block is not None:
        value = resolve_attribute(block, str(node.target))[2]
    if isinstance(value, (tuple, list)):
        return any(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in value)
    return isinstance(value, torch.Tensor) and value.dtype == torch.float32


def emulate_precision(block: torch.fx.GraphModule, settings: PrecisionSettings, low_nodes: Collection[str]) -> int:
    """Insert the roundings a reduced-precision build makes into an accelerated ``block``; how many it inserted.

    Before (one low-precision node ``relu``, an fp32 matmul ``mm`` with TF32)::

        %x -> mm(%x, %w) -> relu -> output

    After::

        %x -> tf32(%x), tf32(%w) -> mm -> low(mm) -> relu -> low(relu) -> output

    where ``low(v)`` is ``_to_copy(_to_copy(v, dtype=low), dtype=float32)`` (the value stored in fp16 or bf16,
    handed on as fp32 so that every node keeps the dtypes its graph declares) and ``tf32(v)`` keeps 10 mantissa
    bits, rounded to nearest. A low-precision node's fp32 inputs from elsewhere (the engine's inputs, its
    weights, fp32 nodes) are rounded where it reads them: the cast at a precision boundary.
    """
    graph = block.graph
    low = settings.low
    inserted = 0
    rounded: dict[torch.fx.Node, torch.fx.Node] = {}
    tf32: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.name in low_nodes and low is not None:
            for source in list(node.all_input_nodes):
                if _tensor_dtype(source, block) == torch.float32 and source.name not in low_nodes:
                    if source not in rounded:
                        rounded[source] = _rounding(graph, source, low, after=source)
                        inserted += 1
                    node.replace_input_with(source, rounded[source])
            if _tensor_dtype(node, block) == torch.float32:
                users = list(node.users)
                stored = _rounding(graph, node, low, after=node)
                inserted += 1
                for user in users:
                    user.replace_input_with(node, stored)
        elif settings.tf32 and _op_name(node.target) in _MATMULS:
            inserted += _tf32_inputs(block, node, tf32)
    return _recompiled(block, inserted, "emulate_precision")


def emulate_accumulation(block: torch.fx.GraphModule, *, tf32: bool) -> int:
    """Make a block whose dtypes a Torch-TensorRT release chose compute as its TensorRT engine does; how many
    nodes it inserted.

    The release's own autocast already put every node in its dtype (an fp16 layer reads and returns fp16, the
    casts between are nodes of the block), and PyTorch computes each such node in fp16 storage as TensorRT does.
    What PyTorch does not do alike on every device is a reduced-precision matmul or convolution's accumulation,
    which TensorRT makes in fp32: here its inputs are read as fp32, it computes in fp32, and its result is
    stored in its own dtype. With ``tf32``, an fp32 matmul or convolution rounds its inputs to TF32 first.

    Before (``addmm`` in fp16)::

        %b, %x, %w (fp16) -> addmm -> relu

    After::

        %b, %x, %w (fp16) -> to(fp32) each -> addmm (fp32) -> to(fp16) -> relu
    """
    graph = block.graph
    inserted = 0
    widened: dict[torch.fx.Node, torch.fx.Node] = {}
    rounded: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or _op_name(node.target) not in _MATMULS:
            continue
        value = node.meta.get("val")
        dtype = value.dtype if isinstance(value, torch.Tensor) else None
        if dtype in _LOW:
            for source in list(node.all_input_nodes):
                if _tensor_dtype(source, block) in _LOW:
                    if source not in widened:
                        widened[source] = _cast(graph, source, torch.float32, after=source)
                        inserted += 1
                    node.replace_input_with(source, widened[source])
            users = list(node.users)
            node.meta["val"] = value.to(torch.float32)
            stored = _cast(graph, node, dtype, after=node)
            inserted += 1
            for user in users:
                user.replace_input_with(node, stored)
        elif dtype == torch.float32 and tf32:
            inserted += _tf32_inputs(block, node, rounded)
    return _recompiled(block, inserted, "emulate_accumulation")


def _tensor_dtype(node: torch.fx.Node, block: torch.fx.GraphModule) -> torch.dtype | None:
    """The dtype of the tensor ``node`` gives: its recorded value's, or for a weight the tensor ``block`` holds."""
    value = node.meta.get("val")
    if value is None and node.op == "get_attr":
        value = resolve_attribute(block, str(node.target))[2]
    return value.dtype if isinstance(value, torch.Tensor) else None


def _cast(graph: torch.fx.Graph, value: torch.fx.Node, dtype: torch.dtype, *, after: torch.fx.Node) -> torch.fx.Node:
    """``value`` converted to ``dtype``, inserted after ``after``."""
    with graph.inserting_after(after):
        cast = graph.call_function(_ROUND, (value,), {"dtype": dtype})
    val = value.meta.get("val")
    if isinstance(val, torch.Tensor):
        cast.meta["val"] = val.to(dtype)
    return cast


def _rounding(graph: torch.fx.Graph, value: torch.fx.Node, low: torch.dtype, *, after: torch.fx.Node) -> torch.fx.Node:
    """``value`` stored in ``low`` and read back as fp32, inserted after ``after``."""
    with graph.inserting_after(after):
        down = graph.call_function(_ROUND, (value,), {"dtype": low})
    with graph.inserting_after(down):
        up = graph.call_function(_ROUND, (down,), {"dtype": torch.float32})
    val = value.meta.get("val")
    if isinstance(val, torch.Tensor):
        down.meta["val"], up.meta["val"] = val.to(low), val
    return up


def _recompiled(block: torch.fx.GraphModule, inserted: int, pass_name: str) -> int:
    """``block`` linted, recompiled and dumped (DEBUG) where a pass inserted nodes; how many it inserted."""
    if inserted:
        block.graph.lint()
        block.recompile()
        log_graph(log, f"after {pass_name}", block)
    return inserted


def _tf32_inputs(block: torch.fx.GraphModule, node: torch.fx.Node, rounded: dict[torch.fx.Node, torch.fx.Node]) -> int:
    """``node`` (an fp32 matmul or convolution) reading each of its fp32 inputs rounded to TF32, each input rounded
    once however many nodes read it (``rounded``); how many roundings it inserted."""
    inserted = 0
    for source in list(node.all_input_nodes):
        if _tensor_dtype(source, block) == torch.float32:
            if source not in rounded:
                rounded[source] = _tf32(block.graph, source)
                inserted += 1
            node.replace_input_with(source, rounded[source])
    return inserted


def _tf32(graph: torch.fx.Graph, value: torch.fx.Node) -> torch.fx.Node:
    """``value`` rounded to TF32's 10 mantissa bits (to nearest, on its bits; infinities and NaN as they are)."""
    aten = torch.ops.aten
    with graph.inserting_after(value):
        bits = graph.call_function(aten.view.dtype, (value, torch.int32))
    with graph.inserting_after(bits):
        nearest = graph.call_function(aten.add.Scalar, (bits, _TF32_HALF_ULP))
    with graph.inserting_after(nearest):
        kept = graph.call_function(aten.bitwise_and.Scalar, (nearest, _TF32_MASK))
    with graph.inserting_after(kept):
        back = graph.call_function(aten.view.dtype, (kept, torch.float32))
    with graph.inserting_after(back):
        finite = graph.call_function(aten.isfinite.default, (value,))
    with graph.inserting_after(finite):
        chosen = graph.call_function(aten.where.self, (finite, back, value))
    val = value.meta.get("val")
    if isinstance(val, torch.Tensor):
        as_int = val.view(torch.int32)
        bits.meta["val"], nearest.meta["val"], kept.meta["val"] = as_int, as_int, as_int
        back.meta["val"], chosen.meta["val"] = val, val
        finite.meta["val"] = val.isfinite()
    return chosen
