"""Runs of a module that leave it as they found it: buffers a forward writes are put back.

A save runs the user's module on the sample inputs (reference I/O, boundaries,
engine output types), and verify runs a file's program more than once (the
run, then its engines replayed). A model that updates a buffer as it runs (a KV
cache, a counter, running statistics) would otherwise come out of a save a call
ahead, with that state written into the file (the stock save runs nothing), and
each later run of a verify would start from the state the one before left.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.fx
import torch.utils._pytree as pytree

from trt_inline import compat, engines

__all__ = ["Restoring", "buffers_restored"]

_log = logging.getLogger("trt_inline")
_T = TypeVar("_T")

# Python callables an FX graph calls that never write their arguments (symbolically traced and exported graphs
# call `operator` functions and torch's symbolic-size functions on tensors and sizes); the in-place ones
# (`operator.iadd`, `setitem`) are not here.
_PURE_OPERATORS = frozenset(
    [getattr(operator, name) for name in (
        "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "matmul",
        "and_", "or_", "xor", "invert", "not_", "lshift", "rshift", "eq", "ne", "lt", "le", "gt", "ge", "truth",
    )]
    + [getattr(torch, name) for name in (
        "sym_float", "sym_int", "sym_ite", "sym_max", "sym_min", "sym_not", "sym_sqrt", "sym_sum",
    ) if hasattr(torch, name)]
)  # fmt: skip
# Higher-order operators that only call their subgraphs (looked through as graphs of their own).
_CALLING_OPERATORS = frozenset(
    {"cond", "while_loop", "map_impl", "scan", "invoke_subgraph", "wrap_with_set_grad_enabled", "wrap_with_autocast"}
)


@dataclass
class _Kept:
    tensor: torch.Tensor
    value: torch.Tensor | None  # None: the tensor could not have been written (no data behind it)


class Restoring:
    """What :func:`buffers_restored` yields: the buffers it will put back, for values that must outlive the block."""

    def __init__(self, owners: list[torch.nn.Module]) -> None:
        # Each module's buffers as they were bound (None included): rebound, added or removed ones are undone.
        self._bound = [(owner, dict(compat.own_buffers(owner))) for owner in owners]
        # Each tensor's value once, however many modules hold it; engines' payloads never.
        self._kept: dict[int, _Kept] = {}
        for _, bound in self._bound:
            for name, tensor in bound.items():
                if tensor is not None and id(tensor) not in self._kept and not engines.is_engine_attribute(name):
                    self._kept[id(tensor)] = _keep(tensor)

    def kept(self) -> list[torch.Tensor]:
        """The buffers whose values are kept to be put back."""
        return [item.tensor for item in self._kept.values()]

    def apart(self, value: _T) -> _T:
        """``value`` (any nesting) with each tensor sharing memory with a buffer to be put back copied.

        A module that returns the cache it updates hands out the buffer itself:
        putting the buffer back would change that output under whoever keeps it.
        Where each buffer's memory is now is looked up here (a run may have
        grown one into new memory).
        """
        kept = [item.tensor for item in self._kept.values() if item.value is not None]
        if not kept:
            return value
        shared = {key for tensor in kept if (key := _storage(tensor))}
        ids = {id(tensor) for tensor in kept}
        return pytree.tree_map_only(  # type: ignore[no-any-return]
            torch.Tensor,
            lambda tensor: tensor.clone() if id(tensor) in ids or _storage(tensor) in shared else tensor,
            value,
        )

    def put_back(self) -> Exception | None:
        """Bind each module's buffers as they were, then give each its value; the first error, or None.

        Each is put back on its own: one that fails leaves the others to be put back.
        """
        first: Exception | None = None
        for owner, bound in self._bound:
            held = compat.own_buffers(owner)
            for added in [name for name in held if name not in bound]:
                del held[added]
            for name, tensor in bound.items():
                if held.get(name, _ABSENT) is not tensor:
                    held[name] = tensor  # rebound (`self.cache = self.cache + x`), or filled where it was None
        for item in self._kept.values():
            try:
                if item.value is None or _same_bits(item.tensor, item.value):
                    continue
                with torch.inference_mode() if item.tensor.is_inference() else torch.no_grad():
                    if item.tensor.shape != item.value.shape:  # resized in place: its size back, then its value
                        item.tensor.resize_(item.value.shape)
                    item.tensor.copy_(item.value)
            except Exception as exc:
                if first is None:
                    first = exc
                else:
                    _log.warning("trt-inline: a buffer could not be put back: %s", exc)
        return first


_ABSENT = object()


@contextlib.contextmanager
def buffers_restored(module: Any) -> Iterator[Restoring]:
    """Inside the block ``module`` may run; afterwards each buffer it wrote, rebound or added is as it was.

    Only modules that can write a buffer pay for it: a graph with an op that
    writes its arguments, a method or Python call that may, an eager submodule,
    or an engine given a buffer (an aliased KV cache); any other module (eager
    code) is assumed to. Engines' own buffers (their payloads, which may be all
    the weights) are never copied. Copies are kept in host memory. A buffer
    restored is given its old value bit for bit, in the tensor it was (a rebound
    buffer gets its tensor back, a resized one its size). Outputs that are a
    buffer must be taken out with :meth:`Restoring.apart` before the block ends.
    """
    restoring = _restoring(module)
    try:
        yield restoring
    except BaseException:
        problem = restoring.put_back()
        if problem is not None:  # never in place of the block's own error
            _log.warning("trt-inline: a buffer could not be put back after the run failed: %s", problem)
        raise
    problem = restoring.put_back()
    if problem is not None:
        raise problem


def _restoring(module: Any) -> Restoring:
    """What puts ``module``'s buffers back: nothing kept where a run cannot write one."""
    writes = isinstance(module, torch.nn.Module) and _may_write_buffers(module)
    return Restoring(_owners(module) if writes else [])


def _keep(tensor: torch.Tensor) -> _Kept:
    if tensor.is_meta:
        return _Kept(tensor, None)
    return _Kept(tensor, tensor.detach().to("cpu", copy=True))


def _same_bits(tensor: torch.Tensor, value: torch.Tensor) -> bool:
    """Equal bit for bit (NaN and -0.0 included), not as numbers; False where bits cannot be compared."""
    if tensor.layout != torch.strided or tensor.is_quantized:  # (a quantized tensor has no plain byte view)
        return False
    current = tensor.detach().to("cpu").contiguous()
    if current.shape != value.shape or current.dtype != value.dtype:
        return False
    return torch.equal(current.reshape(-1).view(torch.uint8), value.contiguous().reshape(-1).view(torch.uint8))


def _storage(tensor: torch.Tensor) -> int:
    """Where ``tensor``'s memory starts (0: none to share, e.g. a sparse or meta tensor)."""
    if tensor.layout != torch.strided or tensor.is_meta:
        return 0
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0


def _owners(module: Any) -> list[torch.nn.Module]:
    """``module`` and its submodules outside engines (an engine's payload is its own)."""
    if not isinstance(module, torch.nn.Module):
        return []
    owners, stack = [], [module]
    while stack:
        owner = stack.pop()
        owners.append(owner)
        stack.extend(sub for _, sub in owner.named_children() if engines.backend_of(sub) is None)
    return owners


def _buffers_it_may_write(module: Any) -> list[str]:
    """The names of the buffers outside engines that :func:`buffers_restored` copies for ``module``."""
    kept = {id(tensor) for tensor in _restoring(module).kept()}
    return [name for name, buffer in module.named_buffers() if id(buffer) in kept] if kept else []


def _may_write_buffers(module: torch.nn.Module) -> bool:
    """Whether a run can write a buffer: an op that writes its arguments, a call that may, or an engine handed one."""
    if not isinstance(module, torch.fx.GraphModule):
        return True  # eager code: anything may happen
    for gm in module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for node in gm.graph.nodes:
            if _may_write(gm, node):
                return True
    return False


def _may_write(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether ``node`` may write a tensor it is given (or one its module holds)."""
    if engines.is_engine_call(node) or engines.is_accelerated_call(gm, node):  # an engine given a buffer
        inputs = engines.engine_inputs(node) if engines.is_engine_call(node) else list(node.args)
        return any(isinstance(value, torch.fx.Node) and value.op == "get_attr" for value in inputs)
    if node.op == "call_method":
        return str(node.target).endswith("_")  # torch's in-place methods (`add_`, `copy_`, `__setitem__`)
    if node.op == "call_function":
        if isinstance(node.target, compat.OpOverload):
            return compat.op_is_mutable(node.target)
        if compat.higher_order_name(node.target) in _CALLING_OPERATORS:
            return False
        return node.target not in _PURE_OPERATORS
    if node.op == "call_module":  # a graph is looked through, an input guard reads; other modules are eager code
        return not isinstance(gm.get_submodule(str(node.target)), (torch.fx.GraphModule, *compat.guard_call_types()))
    return False
