"""Resolving ``get_attr`` / ``call_module`` targets such as ``"inner.weight"``."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["resolve_attribute"]


def resolve_attribute(module: torch.nn.Module, target: str) -> tuple[torch.nn.Module, str, Any]:
    """(owning module, attribute name, value) of a dotted target; AttributeError if it is missing.

    The owner matters: whether ``leaf`` is a buffer, and whether it persists, is
    recorded on the module that holds it.
    """
    owner_path, _, leaf = target.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    return owner, leaf, getattr(owner, leaf)
