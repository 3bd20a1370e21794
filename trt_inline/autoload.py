"""``torch.backends`` entry point of trt-inline: runs at ``import torch``.

It registers post-import hooks for ``torch_tensorrt.dynamo._exporter`` (the
inline passes) and ``torch_tensorrt._compile`` (``save``, to embed reference I/O); it
imports neither ``torch_tensorrt`` nor the package's modules that do the work
(the plugin loads on the exporter's first import, the kernels when an operator
below is first run). An exception
escaping an entry point of this group makes ``import torch`` fail, so nothing
here raises: a failure becomes one warning and Torch-TensorRT's stock behaviour.
``TRT_INLINE_DISABLE=1`` turns the automatic activation off.

It also defines the operators a file trt-inline saved may call
(:mod:`trt_inline.operators`), so that ``torch.export.load`` finds them, and the
program runs, in a process that never uses trt_inline. These are definitions, not
patches: they are made whatever ``TRT_INLINE_DISABLE`` says, since a file that calls
them must load either way.

Importing this module imports the package's ``__init__`` and the light modules it
names (:mod:`trt_inline.importing`, :mod:`trt_inline.operators`,
:mod:`trt_inline.switches`: the standard library only); nothing that imports torch
(``python3 .ci/imports`` checks it).
"""

from __future__ import annotations

import warnings
from types import ModuleType

from trt_inline import operators
from trt_inline.importing import when_imported
from trt_inline.switches import COMPILE, EXPORTER, disabled_by_env

__all__ = ["register"]


# ---------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------


def _on_exporter_import(exporter: ModuleType) -> None:
    try:
        from trt_inline import plugin

        plugin.on_import(exporter)
    except Exception as exc:
        warnings.warn(
            f"trt-inline: could not load its exporter patch ({type(exc).__name__}: {exc}); "
            "torch_tensorrt's stock exporter stays in use",
            RuntimeWarning,
            stacklevel=2,
        )


def register() -> None:
    """Entry point: define the operators, and arrange for the exporter to be patched when it is imported."""
    operators.define_all()
    if disabled_by_env():
        return
    try:
        when_imported((EXPORTER, COMPILE), _on_exporter_import)
    except Exception as exc:
        warnings.warn(
            f"trt-inline: could not register its import hook ({type(exc).__name__}: {exc}); "
            "torch_tensorrt.save keeps its stock exporter",
            RuntimeWarning,
            stacklevel=2,
        )
