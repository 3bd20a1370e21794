"""The two operators a file trt-inline saved may call, defined once per process, whoever asks first.

* ``trt_inline::execute_engine``, the reference backend's engine
  (:mod:`trt_inline.reference.engine`);
* ``trt_inline::check_ranks``, the check a tensor-parallel rank file calls first
  (:mod:`trt_inline.distributed.rank_check`).

They are defined at ``import torch`` by torch's entry point (:mod:`trt_inline.autoload`), so that
``torch.export.load`` finds them, and the program runs, in a process that never imports trt_inline;
where that entry point did not run (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), ``import trt_inline`` defines
them once torch is imported (:func:`define_once_torch_is_imported`). Either way with the schemas of
:mod:`trt_inline.switches` and the kernels below, which import the package's own on their first call
(the rank check not even then, where no process group is initialized): defining them takes a fraction
of a millisecond and imports nothing of the package. torch refuses a second definition: a second call
defines nothing. This module imports nothing but the standard library, :mod:`trt_inline.switches` and
:mod:`trt_inline.importing` at import; torch only when it defines the operators.
"""

from __future__ import annotations

import sys
from typing import Any

from trt_inline.importing import when_imported
from trt_inline.switches import (
    RANK_CHECK_OP,
    RANK_CHECK_SCHEMA,
    REFERENCE_ENGINE_OP,
    REFERENCE_ENGINE_SCHEMA,
    checks_ranks,
    our_entry_point_runs,
)

__all__ = [
    "OPERATORS", "define", "define_all", "define_once_torch_is_imported", "defined", "engine_fake_kernel",
    "engine_kernel", "rank_check_fake_kernel", "rank_check_kernel",
]  # fmt: skip

# What defines each operator, once per process (the operator lasts as long as it): {name: its definition}.
_definitions: dict[str, Any] = {}


def defined(qualname: str) -> bool:
    """Whether the operator ``namespace::name`` is defined in this process (by this module or anyone else)."""
    import torch

    namespace, _, name = qualname.partition("::")
    return hasattr(getattr(torch.ops, namespace), name)


# ---------------------------------------------------------------------------
# trt_inline::execute_engine
# ---------------------------------------------------------------------------


def engine_kernel(inputs: list[Any], engine: Any, program: str) -> list[Any]:
    """The engine op's kernel: the reference backend's, imported on the first call."""
    from trt_inline.reference import engine as reference_engine

    return reference_engine.run_engine(inputs, engine, program)


def engine_fake_kernel(inputs: list[Any], engine: Any, program: str) -> list[Any]:
    """Its fake kernel: the reference backend's, imported on the first call (export, AOTInductor)."""
    from trt_inline.reference import engine as reference_engine

    return reference_engine.run_engine_traced(inputs, engine, program)


def _define_engine_op() -> Any:
    """``torch.library.custom_op`` from the explicit schema: torch 2.5's ``infer_schema`` rejects
    ``list[torch.Tensor]``."""
    import torch

    op = torch.library.custom_op(REFERENCE_ENGINE_OP, mutates_args=(), schema=REFERENCE_ENGINE_SCHEMA)(engine_kernel)
    op.register_fake(engine_fake_kernel)
    return op


# ---------------------------------------------------------------------------
# trt_inline::check_ranks
# ---------------------------------------------------------------------------


def rank_check_kernel(manifest: str) -> None:
    """The rank check's kernel. Without a process group it does nothing, and imports nothing: verify's sandboxed
    child has none (and must observe nothing), and a program whose collectives need one fails at its first
    collective anyway. ``TRT_INLINE_CHECK_RANKS=0`` lets every rank through."""
    if not checks_ranks():
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    from trt_inline.distributed import rank_check  # (torch is imported by now: the op is being run)

    rank_check.check_live(manifest)


def rank_check_fake_kernel(manifest: str) -> None:
    """Its fake kernel: tracing the program (export, AOTInductor) checks nothing, only running it does."""


def _define_rank_check() -> Any:
    """A ``torch.library.Library`` definition marked as a side effect: it returns nothing, and without the mark
    dead-code elimination (``program.module()``, AOTInductor) drops its every call."""
    import torch
    import torch.fx

    namespace, _, name = RANK_CHECK_OP.partition("::")
    library = torch.library.Library(namespace, "FRAGMENT")  # type: ignore[no-untyped-call]
    library.define(name + RANK_CHECK_SCHEMA)  # type: ignore[no-untyped-call]
    library.impl(name, rank_check_kernel, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
    torch.library.register_fake(RANK_CHECK_OP, rank_check_fake_kernel, lib=library)
    torch.fx.node.has_side_effect(getattr(getattr(torch.ops, namespace), name).default)
    return library


# ---------------------------------------------------------------------------
# Defining them
# ---------------------------------------------------------------------------

# Each operator, and what defines it.
OPERATORS = {REFERENCE_ENGINE_OP: _define_engine_op, RANK_CHECK_OP: _define_rank_check}


def define(qualname: str) -> bool:
    """Define the operator ``qualname`` (one of :data:`OPERATORS`) unless it is defined already; whether this call
    defined it."""
    if qualname in _definitions or defined(qualname):
        return False
    _definitions[qualname] = OPERATORS[qualname]()
    return True


def define_all() -> None:
    """Define both operators where they are not defined yet. Never raises (torch's entry point calls it while
    ``import torch`` runs): a failure is one warning for each operator."""
    import warnings

    for qualname in OPERATORS:
        try:
            define(qualname)
        except Exception as exc:
            warnings.warn(
                f"trt-inline: could not define {qualname} ({type(exc).__name__}: {exc}); files that call it load "
                "once trt_inline.operators.define_all() has run (trt_inline.load runs it)",
                RuntimeWarning,
                stacklevel=2,
            )


def define_once_torch_is_imported() -> None:
    """Define both operators once torch is imported: now, where it is; otherwise by our entry point, where torch will
    run it (``TORCH_DEVICE_BACKEND_AUTOLOAD``, as torch reads it, and the entry point installed:
    :func:`~trt_inline.switches.our_entry_point_runs`), or else when torch's import completes. (Waiting costs
    ``wrapt``'s import, 0.1 s, which the ``trt-inline`` command would pay before it starts its child's
    interpreter.) Where torch is being imported (it is running its entry points: ours, or another that imports
    the package), the entry point or this call defines them now, at the end of torch's import."""
    torch = sys.modules.get("torch")
    importing = torch is not None and getattr(getattr(torch, "__spec__", None), "_initializing", False)
    if torch is not None and not importing:
        define_all()
    elif our_entry_point_runs():
        return  # (it defines them at the end of torch's import; where that is now, it is about to)
    elif importing:
        define_all()
    else:
        when_imported(("torch",), lambda torch: define_all())
