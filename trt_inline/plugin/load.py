"""``torch_tensorrt.load`` that refuses a rank file in a process it was not saved for, as ``trt_inline.load`` does.

Torch-TensorRT's tensor-parallel examples load each rank's file with
``torch_tensorrt.load``, which is ``torch.export.load`` (or ``torch.jit.load``)
and knows nothing of the rank manifest a rank file carries: rank 0's file runs
on rank 1 without a word. The wrapper reads the manifest first
(:func:`trt_inline.distributed.rank_check.refuse_foreign_file`: rank, world size
and group members against the live process group) and raises
:class:`~trt_inline.errors.RankSetError` naming both; ``TRT_INLINE_CHECK_RANKS=0``
loads the file anyway. A file without a manifest goes to the stock ``load`` untouched.

It also reads what each TensorRT engine of the file needs (:mod:`trt_inline.deployment`: runtime ABI,
platform, compute capability) as data and refuses, before any engine is deserialized, a file this machine
cannot run, with one line naming the engine and the remedy (``TRT_INLINE_CHECK_ENGINES=0`` loads it anyway).
A file the strict reader does not read (a TorchScript file) is not checked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from trt_inline import deployment
from trt_inline.archive.engine_info import read_engine_infos
from trt_inline.distributed import rank_check
from trt_inline.errors import UnsafeArchiveError, VerifyInputError
from trt_inline.switches import CHECK_RANKS_ENV

__all__ = ["load_checking_ranks", "refuse_unrunnable_file"]


def load_checking_ranks(stock_load: Callable[..., Any]) -> Callable[..., Any]:
    """``stock_load`` (a release's ``torch_tensorrt.load``) that first refuses another rank's file."""

    @functools.wraps(stock_load)
    def load(file_path: str = "", *args: Any, **kwargs: Any) -> Any:
        if file_path:
            rank_check.refuse_foreign_file(file_path, f"{CHECK_RANKS_ENV}=0 loads it anyway")
            refuse_unrunnable_file(file_path)
        return stock_load(file_path, *args, **kwargs)

    load.__trt_inline_stock__ = stock_load  # type: ignore[attr-defined]
    return load


def refuse_unrunnable_file(file_path: str) -> None:
    """:class:`~trt_inline.errors.VerifyInputError` for a file with an engine this machine cannot run."""
    if not deployment.checks_engines():
        return
    try:
        _, infos = read_engine_infos(file_path, allow_pickle=True)
    except (UnsafeArchiveError, VerifyInputError, OSError, ValueError, RecursionError):
        return  # (a TorchScript file, or one only torch reads: the stock load says what it says)
    deployment.require_runnable(infos, deployment.this_machine(), str(file_path))
