"""The cases a build is held to: each its inputs and the outputs it must give (within the tolerance).

A folder as ``verify --cases`` reads it (:func:`trt_inline.verify.cases.read_cases`: each case its inputs and
expected outputs), or input tuples whose expected outputs are the model's own, run in fp32 here; by default
the example inputs alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from trt_inline.fixing.fix_report import FixError

__all__ = ["HeldCase", "flat_tensors", "held_cases"]


@dataclass(frozen=True)
class HeldCase:
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    expected: list[torch.Tensor]


def held_cases(
    model: torch.nn.Module, arg_inputs: Sequence[Any], cases: str | os.PathLike[str] | Sequence[Sequence[Any]] | None
) -> list[HeldCase]:
    """The cases: a folder's (by name), or each input tuple run through ``model`` (``case 0``, ...; the example
    inputs alone: ``arg_inputs``)."""
    if isinstance(cases, (str, os.PathLike)):
        from trt_inline.verify.cases import read_cases

        return [HeldCase(case.name, case.args, case.kwargs, flat_tensors(case.expected)) for case in read_cases(cases)]
    inputs = [(f"case {index}", list(given)) for index, given in enumerate(cases)] if cases is not None else []
    if cases is None:
        inputs = [("arg_inputs", list(arg_inputs))]
    if not inputs:
        raise FixError("find_fix: no case to hold the build to (cases is empty)")
    found = []
    for name, args in inputs:
        with torch.no_grad():
            out = model(*args)
        found.append(HeldCase(name, args, {}, flat_tensors(out)))
    return found


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) output, in order."""
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]
