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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from trt_inline import compat, engines

__all__ = ["buffers_restored"]


@dataclass
class _Kept:
    owner: torch.nn.Module
    name: str
    tensor: torch.Tensor
    value: torch.Tensor | None  # None: the tensor could not have been written (no data behind it)


@contextlib.contextmanager
def buffers_restored(module: Any) -> Iterator[None]:
    """Inside the block ``module`` may run; afterwards each buffer it wrote or rebound is as it was.

    Only modules that can write a buffer pay for it: a graph with an op that
    writes its arguments, or an engine given a buffer (an aliased KV cache); any
    other module (eager code) is assumed to. Engines' own buffers (their
    payloads, which may be all the weights) are never copied. Copies are kept in
    host memory. A buffer restored is given its old value bit for bit, in the
    tensor it was (a rebound buffer gets its tensor back).
    """
    kept = [_keep(owner, name, tensor) for owner, name, tensor in _buffers_it_may_write(module)]
    failed = True
    try:
        yield
        failed = False
    finally:
        try:
            _put_back(kept)
        except Exception:
            if not failed:  # never in place of the block's own error
                raise


def _keep(owner: torch.nn.Module, name: str, tensor: torch.Tensor) -> _Kept:
    if tensor.is_meta:
        return _Kept(owner, name, tensor, None)
    return _Kept(owner, name, tensor, tensor.detach().to("cpu", copy=True))


def _put_back(kept: list[_Kept]) -> None:
    for item in kept:
        held = compat.own_buffers(item.owner)
        if held.get(item.name) is not item.tensor:
            held[item.name] = item.tensor  # rebound (`self.cache = self.cache + x`)
        if item.value is None or _same_bits(item.tensor, item.value):
            continue
        with torch.inference_mode() if item.tensor.is_inference() else torch.no_grad():
            item.tensor.copy_(item.value)


def _same_bits(tensor: torch.Tensor, value: torch.Tensor) -> bool:
    """Equal bit for bit (NaN and -0.0 included), not as numbers."""
    current = tensor.detach().to("cpu").contiguous()
    if current.shape != value.shape or current.dtype != value.dtype:
        return False
    return torch.equal(current.reshape(-1).view(torch.uint8), value.contiguous().reshape(-1).view(torch.uint8))


def _buffers_it_may_write(module: Any) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """(owner, name, tensor) of each buffer outside engines, where a run of ``module`` may write one."""
    if not isinstance(module, torch.nn.Module) or not _may_write_buffers(module):
        return []
    found: list[tuple[torch.nn.Module, str, torch.Tensor]] = []
    seen: set[int] = set()
    stack = [module]
    while stack:
        owner = stack.pop()
        for name, tensor in compat.own_buffers(owner).items():
            if tensor is None or id(tensor) in seen or engines.is_engine_attribute(name):
                continue
            seen.add(id(tensor))
            found.append((owner, name, tensor))
        stack.extend(sub for _, sub in owner.named_children() if engines.backend_of(sub) is None)
    return found


def _may_write_buffers(module: torch.nn.Module) -> bool:
    """Whether a run can write a buffer: an op that writes its arguments, or an engine handed a buffer."""
    graphs = [m for m in module.modules() if isinstance(m, torch.fx.GraphModule)]
    if not isinstance(module, torch.fx.GraphModule):
        return True  # eager code: anything may happen
    for gm in graphs:
        for node in gm.graph.nodes:
            if (
                node.op == "call_function"
                and isinstance(node.target, compat.OpOverload)
                and compat.op_is_mutable(node.target)
            ):
                return True
            if engines.is_engine_call(node):
                inputs = engines.engine_inputs(node)
            elif engines.is_accelerated_call(gm, node):
                inputs = list(node.args)
            else:
                continue
            if any(isinstance(value, torch.fx.Node) and value.op == "get_attr" for value in inputs):
                return True
    return False
