"""``torch.backends`` entry point of trt-inline: runs at ``import torch``.

It registers post-import hooks for ``torch_tensorrt.dynamo._exporter`` (the
inline passes) and ``torch_tensorrt._compile`` (``save``, to embed reference I/O); it
imports neither ``torch_tensorrt`` nor ``trt_inline`` (which loads on the
exporter's first import, or when an operator below is first run). An exception
escaping an entry point of this group makes ``import torch`` fail, so nothing
here raises: a failure becomes one warning and Torch-TensorRT's stock behaviour.
``TRT_INLINE_DISABLE=1`` turns the automatic activation off.

It also defines the two operators a file trt-inline saved may call, so that
``torch.export.load`` finds them, and the program runs, in a process that never
imports trt_inline:

* ``trt_inline::execute_engine``, the reference backend's engine
  (:mod:`trt_inline.reference.engine`);
* ``trt_inline::check_ranks``, the check a tensor-parallel rank file calls first
  (:mod:`trt_inline.distributed.rank_check`).

Only their schemas (:mod:`trt_inline_switches`) and kernels that stand in are
defined here, a fraction of a millisecond: a kernel imports the package's own on
its first call (the rank check not even then, where no process group is
initialized). These are definitions, not patches: they are made whatever
``TRT_INLINE_DISABLE`` says, since a file that calls them must load either way.
Where this entry point does not run (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``),
``import trt_inline`` defines them with the same schemas and the package's kernels;
the package never imports this module (``python3 .ci/imports``).
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
    RANK_CHECK_SCHEMA,
    REFERENCE_ENGINE_OP,
    REFERENCE_ENGINE_SCHEMA,
    checks_ranks,
    disabled_by_env,
    env_flag,
)

__all__ = [
    "COMPILE", "DISABLE_ENV", "EXPORTER", "RANK_CHECK_OP", "REFERENCE_ENGINE_OP", "disabled_by_env", "env_flag",
    "register", "register_engine_op", "register_rank_check",
]  # fmt: skip

# What defines each operator, once per process (torch refuses a second definition): its library, or None.
_rank_check_library: Any = None
_engine_op: Any = None


# ---------------------------------------------------------------------------
# trt_inline::execute_engine
# ---------------------------------------------------------------------------


def _execute_engine(inputs: list[Any], engine: Any, program: str) -> list[Any]:
    """The engine op's kernel: the reference backend's, imported on the first call."""
    from trt_inline.reference import engine as reference_engine

    return reference_engine.run_engine(inputs, engine, program)


def _execute_engine_traced(inputs: list[Any], engine: Any, program: str) -> list[Any]:
    """Its fake kernel: the reference backend's, imported on the first call (export, AOTInductor)."""
    from trt_inline.reference import engine as reference_engine

    return reference_engine.run_engine_traced(inputs, engine, program)


def register_engine_op() -> None:
    """Define ``trt_inline::execute_engine`` in this process, once, unless it is defined already.

    ``torch.library.custom_op``, as the package defines it where this entry point did not run
    (``trt_inline.compat.define_op``): the op behaves the same whoever defined it.
    """
    global _engine_op
    if _engine_op is not None:
        return
    import torch

    namespace, _, name = REFERENCE_ENGINE_OP.partition("::")
    if hasattr(getattr(torch.ops, namespace), name):
        return  # (trt_inline was imported before this ran: it defined the op with its own kernels)
    op = torch.library.custom_op(REFERENCE_ENGINE_OP, mutates_args=(), schema=REFERENCE_ENGINE_SCHEMA)(_execute_engine)
    op.register_fake(_execute_engine_traced)
    _engine_op = op


# ---------------------------------------------------------------------------
# trt_inline::check_ranks
# ---------------------------------------------------------------------------


def _check_ranks(manifest: str) -> None:
    """The operator's kernel. Without a process group it does nothing, and imports nothing: verify's sandboxed child
    has none (and must observe nothing), and a program whose collectives need one fails at its first collective
    anyway. (``trt_inline.distributed.rank_check.check_ranks``, its kernel where the package defines it, decides
    the same way.)"""
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
    """Define ``trt_inline::check_ranks`` in this process, once, unless it is defined already."""
    global _rank_check_library
    if _rank_check_library is not None:
        return
    import torch
    import torch.fx

    namespace, _, name = RANK_CHECK_OP.partition("::")
    if hasattr(getattr(torch.ops, namespace), name):
        return  # (trt_inline was imported before this ran: it defined the op with its own kernels)
    library = torch.library.Library(namespace, "FRAGMENT")  # type: ignore[no-untyped-call]
    library.define(name + RANK_CHECK_SCHEMA)  # type: ignore[no-untyped-call]
    library.impl(name, _check_ranks, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
    torch.library.register_fake(RANK_CHECK_OP, _check_ranks_traced, lib=library)
    # It returns nothing: without this, dead-code elimination (program.module(), AOTInductor) drops its call.
    torch.fx.node.has_side_effect(getattr(getattr(torch.ops, namespace), name).default)
    _rank_check_library = library


# ---------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------


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
    """Entry point: define the operators, and arrange for the exporter to be patched when it is imported."""
    for op, define in ((REFERENCE_ENGINE_OP, register_engine_op), (RANK_CHECK_OP, register_rank_check)):
        try:
            define()
        except Exception as exc:
            warnings.warn(
                f"trt-inline: could not define {op} ({type(exc).__name__}: {exc}); "
                "files that call it load after `import trt_inline`",
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
