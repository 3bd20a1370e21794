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

Which nodes run in the low precision (:func:`low_precision_nodes`): every
floating-point node with ``enabled_precisions`` alone; with autocast, every one
but the excluded nodes (``autocast_excluded_nodes``: regular expressions
matched against node names, as Torch-TensorRT matches them), the excluded ops
(``autocast_excluded_ops``), nodes whose largest output on the example inputs is
above ``autocast_max_output_threshold``, and reductions deeper than
``autocast_max_depth_of_reduction``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from trt_inline import compat
from trt_inline.attributes import resolve_attribute
from trt_inline.logs import log_graph
from trt_inline.module_state import buffers_restored

__all__ = ["PrecisionSettings", "calibrate", "emulate_precision", "low_precision_nodes"]

log = logging.getLogger(__name__)

_LOW = (torch.float16, torch.bfloat16)
_ROUND = compat.to_copy_op()
_TF32_HALF_ULP = 1 << 12  # (fp32 keeps 23 mantissa bits, TF32 10: the 13 dropped, rounded to nearest)
_TF32_MASK = -(1 << 13)
# What accumulates in fp32 in a reduced-precision build (its inputs rounded, its output rounded once).
_MATMULS = frozenset(f"aten::{name}" for name in ("mm", "addmm", "bmm", "baddbmm", "convolution", "matmul", "linear"))
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
            low = _dtype(autocast_low_precision_type if autocast_low_precision_type is not None else torch.float16)
            if low not in _LOW:
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
        return cls(
            low, bool(enable_autocast), tuple(autocast_excluded_nodes),
            frozenset(_op_name(op) for op in autocast_excluded_ops), autocast_max_output_threshold,
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


def calibrate(gm: torch.fx.GraphModule, sample_input: Sequence[Any]) -> dict[str, float]:
    """The largest magnitude of each floating-point node's output when ``gm`` runs on ``sample_input`` (what
    ``autocast_max_output_threshold`` is held to), by node name."""
    largest: dict[str, float] = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            value = super().run_node(n)
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
                largest[n.name] = float(value.detach().abs().nan_to_num(posinf=math.inf).max())
            return value

    with torch.no_grad(), buffers_restored(gm):  # (a run that writes the model's buffers leaves them as they were)
        _Recorder(gm).run(*sample_input)
    return largest


def low_precision_nodes(
    graph: torch.fx.Graph, settings: PrecisionSettings, calibration: Mapping[str, float]
) -> tuple[set[str], dict[str, str]]:
    """The names of the nodes of ``graph`` that a build with ``settings`` runs in ``settings.low``, and for each
    other floating-point node a rule kept in fp32, why."""
    kept: dict[str, str] = {}
    if settings.low is None:
        return set(), kept
    chosen: set[str] = set()
    patterns = [re.compile(p) for p in settings.excluded_nodes]
    for node in graph.nodes:
        if node.op != "call_function" or not _floating(node):
            continue
        why = _kept_why(node, settings, patterns, calibration) if settings.autocast else None
        if why is None:
            chosen.add(node.name)
        else:
            kept[node.name] = why
    return chosen, kept


def _kept_why(
    node: torch.fx.Node, settings: PrecisionSettings, patterns: Sequence[re.Pattern[str]],
    calibration: Mapping[str, float],
) -> str | None:  # fmt: skip
    op = _op_name(node.target)
    if any(p.search(node.name) for p in patterns):
        return "autocast_excluded_nodes"
    if op in settings.excluded_ops:
        return "autocast_excluded_ops"
    largest = calibration.get(node.name)
    if settings.max_output_threshold is not None and largest is not None and largest > settings.max_output_threshold:
        return f"autocast_max_output_threshold (its largest output {largest:.4g})"
    depth = reduction_depth(node)
    if settings.max_depth_of_reduction is not None and depth is not None and depth > settings.max_depth_of_reduction:
        return f"autocast_max_depth_of_reduction (it reduces over {depth} values)"
    return None


def reduction_depth(node: torch.fx.Node) -> int | None:
    """How many values one output of ``node`` accumulates: a matmul's inner size, a convolution's input channels
    times its kernel, a reduction's reduced sizes; None for anything else or where sizes are symbolic."""
    op = _op_name(node.target)
    shapes = [tuple(a.meta["val"].shape) for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    try:
        if op in ("aten::mm", "aten::bmm", "aten::matmul") and shapes:
            return int(shapes[0][-1])
        if op in ("aten::addmm", "aten::baddbmm") and len(shapes) >= 2:
            return int(shapes[1][-1])
        if op == "aten::convolution" and len(shapes) >= 2:
            return int(math.prod(shapes[1][1:]))
        if op in _REDUCTIONS and shapes:
            given = node.args[1] if len(node.args) > 1 else None
            dims = [given] if isinstance(given, int) else list(given) if isinstance(given, (list, tuple)) else None
            sizes = shapes[0]
            if dims is None or not all(isinstance(d, int) for d in dims):
                return int(math.prod(sizes[-1:]))
            return int(math.prod(sizes[int(d)] for d in dims))  # type: ignore[call-overload]
    except (TypeError, IndexError):  # (a symbolic size)
        return None
    return None


def _floating(node: torch.fx.Node, block: torch.fx.GraphModule | None = None) -> bool:
    """Whether ``node`` gives an fp32 tensor: by its recorded value, or for a weight (``get_attr``, which older
    torch leaves without one) by the tensor ``block`` holds."""
    value = node.meta.get("val")
    if value is None and node.op == "get_attr" and block is not None:
        value = resolve_attribute(block, str(node.target))[2]
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
                if _floating(source, block) and source.name not in low_nodes:
                    if source not in rounded:
                        rounded[source] = _rounding(graph, source, low, after=source)
                        inserted += 1
                    node.replace_input_with(source, rounded[source])
            if _floating(node):
                users = list(node.users)
                stored = _rounding(graph, node, low, after=node)
                inserted += 1
                for user in users:
                    user.replace_input_with(node, stored)
        elif settings.tf32 and _op_name(node.target) in _MATMULS:
            for source in list(node.all_input_nodes):
                if _floating(source, block):
                    if source not in tf32:
                        tf32[source] = _tf32(graph, source)
                        inserted += 1
                    node.replace_input_with(source, tf32[source])
    if inserted:
        graph.lint()
        block.recompile()
        log_graph(log, "after emulate_precision", block)
    return inserted


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
