"""A module's attributes: resolving ``get_attr`` / ``call_module`` targets, keeping buffers across a sample run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from trt_inline import engines

__all__ = ["buffers_restored", "resolve_attribute"]


def resolve_attribute(module: torch.nn.Module, target: str) -> tuple[torch.nn.Module, str, Any]:
    """(owning module, attribute name, value) of a dotted target; AttributeError if it is missing.

    The owner matters: whether ``leaf`` is a buffer, and whether it persists, is
    recorded on the module that holds it.
    """
    owner_path, _, leaf = target.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    return owner, leaf, getattr(owner, leaf)


@contextlib.contextmanager
def buffers_restored(module: Any) -> Iterator[None]:
    """Put back every buffer a run of ``module`` inside the block writes to.

    A save runs the user's module on the sample inputs (reference I/O, engine
    output types). A model that updates a buffer as it runs (a KV cache, a
    counter, running statistics) would otherwise leave the save with its state
    advanced by one call, and write that state into the file: the stock save
    runs nothing. Engines' own buffers (their payloads, which may be all the
    weights) are not copied: an engine's inputs are what it may update.
    """
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    if isinstance(module, torch.nn.Module):
        engine_modules = [name for name, sub in module.named_modules() if name and engines.backend_of(sub) is not None]
        for name, buffer in module.named_buffers(remove_duplicate=True):
            if engines.is_engine_attribute(name) or any(name.startswith(f"{m}.") for m in engine_modules):
                continue
            kept.append((buffer, buffer.detach().clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in kept:
                if not torch.equal(buffer, value):
                    buffer.copy_(value)
