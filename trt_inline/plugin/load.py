"""``torch_tensorrt.load`` that refuses a rank file in a process it was not saved for, as ``trt_inline.load`` does.

Torch-TensorRT's tensor-parallel examples load each rank's file with
``torch_tensorrt.load``, which is ``torch.export.load`` (or ``torch.jit.load``)
and knows nothing of the rank manifest a rank file carries: rank 0's file runs
on rank 1 without a word. The wrapper reads the manifest first
(:func:`trt_inline.distributed.rank_check.refuse_foreign_file`: rank, world size
and group members against the live process group) and raises
:class:`~trt_inline.errors.RankSetError` naming both; ``TRT_INLINE_CHECK_RANKS=0``
loads the file anyway. A file without a manifest goes to the stock ``load`` untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from trt_inline.distributed import rank_check
from trt_inline_switches import CHECK_RANKS_ENV

__all__ = ["load_checking_ranks"]


def load_checking_ranks(stock_load: Callable[..., Any]) -> Callable[..., Any]:
    """``stock_load`` (a release's ``torch_tensorrt.load``) that first refuses another rank's file."""

    @functools.wraps(stock_load)
    def load(file_path: str = "", *args: Any, **kwargs: Any) -> Any:
        if file_path:
            rank_check.refuse_foreign_file(file_path, f"{CHECK_RANKS_ENV}=0 loads it anyway")
        return stock_load(file_path, *args, **kwargs)

    load.__trt_inline_stock__ = stock_load  # type: ignore[attr-defined]
    return load
