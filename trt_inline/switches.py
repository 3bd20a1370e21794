"""What must be known while torch is still being imported: the environment switches, watched modules, operators.

The ``torch.backends`` entry point (:mod:`trt_inline.autoload`) runs while torch
is still being imported, so it reads the switches, the Torch-TensorRT modules it
watches and the names and schemas of the operators (:mod:`trt_inline.operators`)
from here, with nothing that imports torch; the package's own modules read the
same names and the same parser. This module imports nothing but the standard
library, and it is on the lowest floor of ``python3 .ci/imports``: it imports
nothing of trt-inline, so no import circle passes through it.
"""

from __future__ import annotations

import os

__all__ = [
    "AUTOLOAD_ENV", "CHECK_RANKS_ENV", "COMPILE", "DISABLE_ENV", "DISTRIBUTION", "ENTRY_POINT", "EXPORTER",
    "RANK_CHECK_OP", "RANK_CHECK_SCHEMA", "REFERENCE_ENGINE_OP", "REFERENCE_ENGINE_SCHEMA", "checks_ranks",
    "disabled_by_env", "entry_points_run", "env_flag", "our_entry_point_runs",
]  # fmt: skip

# The Torch-TensorRT modules whose import the entry point waits for.
EXPORTER = "torch_tensorrt.dynamo._exporter"
COMPILE = "torch_tensorrt._compile"
# TRT_INLINE_DISABLE=1: the plugin does not activate at import torch.
DISABLE_ENV = "TRT_INLINE_DISABLE"
# torch runs its torch.backends entry points (ours: trt_inline.autoload) at import unless this is other than 1.
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"
# The distribution, and its torch.backends entry point (pyproject.toml).
DISTRIBUTION = "trt-inline"
ENTRY_POINT = "trt_inline.autoload:register"
# TRT_INLINE_CHECK_RANKS=0: a rank file runs and loads on any rank (its embedded check and the patched
# torch_tensorrt.load's check of its rank manifest both let it through).
CHECK_RANKS_ENV = "TRT_INLINE_CHECK_RANKS"
# The operators a saved file may call that only trt-inline defines, each with its schema (the part after the
# name): defined at import torch by the entry point (trt_inline.autoload), so that torch.export.load finds them in
# a process that never imports trt_inline, and by the package itself where the entry point did not run
# (TORCH_DEVICE_BACKEND_AUTOLOAD=0). torch refuses a second definition: whoever comes second keeps the first.
# The rank check a rank file calls at the start of its program, with its rank manifest (JSON) as argument
# (trt_inline.distributed.rank_check).
RANK_CHECK_OP = "trt_inline::check_ranks"
RANK_CHECK_SCHEMA = "(str manifest) -> ()"
# The reference backend's engine (trt_inline.reference.engine): its inputs, its weights, its program (JSON).
REFERENCE_ENGINE_OP = "trt_inline::execute_engine"
REFERENCE_ENGINE_SCHEMA = "(Tensor[] inputs, Tensor engine, str program) -> Tensor[]"

_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


def env_flag(name: str, *, default: bool) -> bool:
    """A boolean environment switch: 1/true/yes/on or 0/false/no/off (any case); unset, empty or other: ``default``.

    The one parser of trt-inline's switches (``TRT_INLINE_DISABLE``, ``TRT_INLINE_REFERENCE_IO``,
    ``TRT_INLINE_CHECK_RANKS``).
    """
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return default


def disabled_by_env() -> bool:
    """Whether ``TRT_INLINE_DISABLE`` turns the automatic activation off."""
    return env_flag(DISABLE_ENV, default=False)


def entry_points_run() -> bool:
    """Whether ``import torch`` runs the ``torch.backends`` entry points (ours among them), as torch decides it."""
    return os.environ.get(AUTOLOAD_ENV, "1") == "1"


def our_entry_point_runs() -> bool:
    """Whether ``import torch`` runs trt-inline's entry point: torch runs entry points (:func:`entry_points_run`) and
    the installed distribution declares ours (not so where the package is only on the import path)."""
    if not entry_points_run():
        return False
    import importlib.metadata  # (torch imports it anyway, to run its entry points)

    try:
        declared = importlib.metadata.distribution(DISTRIBUTION).entry_points
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(entry.group == "torch.backends" and entry.value == ENTRY_POINT for entry in declared)


def checks_ranks() -> bool:
    """Whether rank files are held to their rank manifest where they are run or loaded (``TRT_INLINE_CHECK_RANKS``,
    default on)."""
    return env_flag(CHECK_RANKS_ENV, default=True)
