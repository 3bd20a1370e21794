"""``torch.backends`` entry point of trt-inline: runs at ``import torch``.

It only registers post-import hooks for ``torch_tensorrt.dynamo._exporter`` (the
inline passes) and ``torch_tensorrt._compile`` (``save``, to embed reference I/O); it
imports neither ``torch_tensorrt`` nor ``trt_inline`` (which loads on the
exporter's first import, or when a rank check runs in a process group). An
exception escaping an entry point of this group makes ``import torch`` fail, so
nothing here raises: a failure becomes one warning and Torch-TensorRT's stock
behaviour. ``TRT_INLINE_DISABLE=1`` turns the automatic activation off.

It also defines ``trt_inline::check_ranks``, the operator a tensor-parallel rank
file calls first (:mod:`trt_inline.distributed.rank_check`), so that
``torch.export.load`` finds it in a process that never imports trt_inline. That
is a definition, not a patch: it is made whatever ``TRT_INLINE_DISABLE`` says (a
file that calls it must load), and costs a fraction of a millisecond.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any

from trt_inline_switches import (
    COMPILE,
    DISABLE_ENV,
    EXPORTER,
    RANK_CHECK_OP,
    checks_ranks,
    disabled_by_env,
    env_flag,
)

__all__ = [
    "COMPILE", "DISABLE_ENV", "EXPORTER", "RANK_CHECK_OP", "disabled_by_env", "env_flag", "register",
    "register_rank_check",
]  # fmt: skip

_RANK_CHECK_SCHEMA = "check_ranks(str manifest) -> ()"
# The library that defines it, once per process (torch refuses a second definition).
_rank_check_library: Any = None


def _check_ranks(manifest: str) -> None:
    """The operator's kernel. Without a process group it does nothing: verify's sandboxed child has none (and
    must observe nothing), and a program whose collectives need one fails at its first collective anyway."""
    if not checks_ranks():
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    from trt_inline.distributed import rank_check  # (torch is imported by now: the op is being run)

    rank_check.check_live(manifest)


def _check_ranks_traced(manifest: str) -> None:
    """Its fake kernel: tracing the program (export, AOTInductor) checks nothing, only running it does."""


def register_rank_check() -> None:
    """Define ``trt_inline::check_ranks`` in this process, once (the entry point and ``import trt_inline`` call it)."""
    global _rank_check_library
    if _rank_check_library is not None:
        return
    import torch
    import torch.fx

    namespace, _, name = RANK_CHECK_OP.partition("::")
    library = torch.library.Library(namespace, "FRAGMENT")  # type: ignore[no-untyped-call]
    library.define(_RANK_CHECK_SCHEMA)  # type: ignore[no-untyped-call]
    library.impl(name, _check_ranks, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
    torch.library.register_fake(RANK_CHECK_OP, _check_ranks_traced, lib=library)
    # It returns nothing: without this, dead-code elimination (program.module(), AOTInductor) drops its call.
    torch.fx.node.has_side_effect(getattr(getattr(torch.ops, namespace), name).default)
    _rank_check_library = library


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
    """Entry point: define the rank check, and arrange for the exporter to be patched when it is imported."""
    try:
        register_rank_check()
    except Exception as exc:
        warnings.warn(
            f"trt-inline: could not define {RANK_CHECK_OP} ({type(exc).__name__}: {exc}); "
            "rank files that call it load after `import trt_inline`",
            RuntimeWarning,
            stacklevel=2,
        )
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
