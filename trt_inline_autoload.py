"""``torch.backends`` entry point of trt-inline: runs at ``import torch``.

It only registers post-import hooks for ``torch_tensorrt.dynamo._exporter`` (the
inline passes) and ``torch_tensorrt._compile`` (``save``, to embed reference I/O); it
imports neither ``torch_tensorrt`` nor ``trt_inline`` (which loads on the
exporter's first import). An exception escaping an entry point of this group
makes ``import torch`` fail, so nothing here raises: a failure becomes one
warning and Torch-TensorRT's stock behaviour. ``TRT_INLINE_DISABLE=1`` turns the
automatic activation off.
"""

from __future__ import annotations

import warnings
from types import ModuleType

from trt_inline_switches import COMPILE, DISABLE_ENV, EXPORTER, disabled_by_env, env_flag

__all__ = ["COMPILE", "DISABLE_ENV", "EXPORTER", "disabled_by_env", "env_flag", "register"]


def _on_exporter_import(exporter: ModuleType) -> None:
    try:
        from trt_inline import plugin

        plugin._on_import(exporter)
    except Exception as exc:
        warnings.warn(
            f"trt-inline: could not load its exporter patch ({type(exc).__name__}: {exc}); "
            "torch_tensorrt's stock exporter stays in use",
            RuntimeWarning,
            stacklevel=2,
        )


def register() -> None:
    """Entry point: arrange for the exporter to be patched when it is imported."""
    if disabled_by_env():
        return
    try:
        import wrapt

        for name in (EXPORTER, COMPILE):
            wrapt.register_post_import_hook(_on_exporter_import, name)
    except Exception as exc:
        warnings.warn(
            f"trt-inline: could not register its import hook ({type(exc).__name__}: {exc}); "
            "torch_tensorrt.save keeps its stock exporter",
            RuntimeWarning,
            stacklevel=2,
        )
