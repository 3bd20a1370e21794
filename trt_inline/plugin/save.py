"""``torch_tensorrt.save`` that also embeds reference I/O, so ``trt-inline verify`` can check the file."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.fx

from trt_inline import export

__all__ = ["REFERENCE_IO_ENV", "save_with_reference_io"]

# TRT_INLINE_REFERENCE_IO=0: the patched torch_tensorrt.save embeds no reference I/O.
REFERENCE_IO_ENV = "TRT_INLINE_REFERENCE_IO"


def save_with_reference_io(stock_save: Callable[..., Any]) -> Callable[..., Any]:
    """``stock_save`` that also embeds reference I/O when given tensor inputs.

    From 2.12 the stock function takes ``extra_files``; before, the written
    archive is rewritten once with the extra file added.
    """
    accepts_extra_files = "extra_files" in inspect.signature(stock_save).parameters

    @functools.wraps(stock_save)
    def save(module: Any, file_path: str = "", **kwargs: Any) -> Any:
        extra = _reference_io_for_save(module, file_path, kwargs)
        if extra and accepts_extra_files:
            kwargs["extra_files"] = {**(kwargs.get("extra_files") or {}), **extra}
        result = stock_save(module, file_path, **kwargs)
        if extra and not accepts_extra_files:
            export.write_program(torch.export.load(file_path), Path(file_path), extra)
        return result

    save.__trt_inline_stock__ = stock_save  # type: ignore[attr-defined]
    return save


def _reference_io_for_save(module: Any, file_path: str, kwargs: dict[str, Any]) -> dict[str, str]:
    """The reference-I/O extra file for a ``torch_tensorrt.save`` call, or {} where it does not apply."""
    if os.environ.get(REFERENCE_IO_ENV, "1").strip() in ("0", "false", "no"):
        return {}
    if kwargs.get("output_format", "exported_program") != "exported_program":
        return {}
    if not isinstance(module, torch.fx.GraphModule) or not file_path:
        return {}
    args = kwargs.get("arg_inputs") or kwargs.get("inputs")
    kwarg_inputs = kwargs.get("kwarg_inputs") or {}
    values = [*(args or ()), *kwarg_inputs.values()]
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        return {}  # torch_tensorrt.Input specs carry no data to keep
    return export.reference_extra_files(
        module, list(args or ()), kwarg_inputs, Path(file_path), export.DEFAULT_REFERENCE_LIMIT_BYTES
    )
