"""Make ``torch_tensorrt.save`` use trt_inline's passes, with no change to user code.

Torch-TensorRT's ``transform()`` looks ``inline_trt_modules`` and
``inline_torch_modules`` up as globals of ``torch_tensorrt.dynamo._exporter``
when it runs, so replacing those module attributes redirects every save path
that goes through it: ``export()``, the legacy ``retrace=False`` exporter and
the dynamic-shape ``retrace=True`` path. Before 2.14 the legacy exporter's
``lift()`` builds buffer specs without ``persistent``, which torch >= 2.3
refuses, so ``lift`` is replaced there too (:mod:`trt_inline.plugin.adapters`
holds the per-release replacements).

Activation: ``trt_inline.autoload.register`` runs at ``import torch`` (entry point
group ``torch.backends``) and registers a post-import hook for the exporter
module; the hook patches the module as soon as it has been executed.
``TRT_INLINE_DISABLE=1`` stops the automatic activation; :func:`install`,
:func:`uninstall` and :func:`enabled` are the explicit controls and always do
what they say; after an ``enabled()`` block the decision is what it was before.

``torch_tensorrt.load`` is wrapped the same way as ``torch_tensorrt.save``: it
refuses a tensor-parallel rank file in a process that is not the rank it was
saved as (:mod:`trt_inline.plugin.load`), as ``trt_inline.load`` does.

Never worse than stock: before installing, each replacement runs on a small
probe graph (:func:`~trt_inline.plugin.adapters.preflight`); one that fails
there is not installed, one warning names it and why, and ``trt-inline doctor``
reports it.

==============  ====================================================================
module          concern
==============  ====================================================================
(``__init__``)  installing, uninstalling and reporting the patches
``adapters``    the replacements for ``torch_tensorrt.dynamo._exporter``'s functions,
                built per release, and their preflight
``save``        ``torch_tensorrt.save`` that also embeds reference I/O and manifests
``load``        ``torch_tensorrt.load`` that refuses a rank file saved for another rank
``ranges``      whether a saved program accepts every size its caller declared
==============  ====================================================================
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from trt_inline import releases, switches
from trt_inline.errors import PatchError
from trt_inline.importing import when_imported
from trt_inline.plugin.adapters import preflight, replacements_for, torch_tensorrt_version
from trt_inline.plugin.load import load_checking_ranks
from trt_inline.plugin.save import REFERENCE_IO_ENV, save_with_reference_io

__all__ = [
    "EXPORTER",
    "REFERENCE_IO_ENV",
    "PatchError",
    "doors",
    "enabled",
    "install",
    "is_active",
    "on_import",
    "refused_replacements",
    "replaced_functions",
    "replacements_for",
    "torch_tensorrt_version",
    "uninstall",
]

EXPORTER = releases.EXPORTER_MODULE
COMPILE = releases.COMPILE_MODULE
TARGETS = (EXPORTER, COMPILE)
BOUND_ELSEWHERE = releases.EXPORTER_NAMES_BOUND_ELSEWHERE

log = logging.getLogger(__name__)


@dataclass
class _PluginState:
    """What this process has patched. One per process: the exporter module is one per process too."""

    # None until someone decides explicitly: the autoload hook (and TRT_INLINE_DISABLE) decides then.
    wanted: bool | None = None
    hook_registered: bool = False
    originals: dict[str, Any] = field(default_factory=dict)
    replacements: dict[str, Any] = field(default_factory=dict)
    # {function: why} for replacements that failed preflight and were left stock.
    refused: dict[str, str] = field(default_factory=dict)
    # (stock torch_tensorrt.save, our wrapper) once wrapped.
    save: tuple[Any, Any] | None = None
    # (stock torch_tensorrt.load, our wrapper) once wrapped.
    load: tuple[Any, Any] | None = None


_state = _PluginState()


def _decided_to_patch() -> bool:
    """An explicit install/uninstall wins; otherwise the environment's opt-out decides."""
    if _state.wanted is not None:
        return _state.wanted
    return not switches.disabled_by_env()


def _patch(exporter: ModuleType) -> None:
    if _state.replacements and all(getattr(exporter, k, None) is v for k, v in _state.replacements.items()):
        return
    replacements = replacements_for(exporter)
    refused = preflight(replacements)
    for name, why in refused.items():
        replacements.pop(name, None)
        warnings.warn(
            f"trt-inline: {exporter.__name__}.{name} left stock: the replacement failed on a probe graph ({why})",
            RuntimeWarning,
            stacklevel=3,
        )
    if "inline_torch_modules" not in replacements:
        replacements.clear()  # without positional fallback wiring, nothing else is worth replacing
    originals = {name: getattr(exporter, name) for name in replacements}
    for name, function in replacements.items():
        setattr(exporter, name, function)
    _state.originals, _state.replacements, _state.refused = originals, replacements, refused
    if replacements:
        log.info("patched %s: %s", exporter.__name__, ", ".join(sorted(replacements)))
    for module_name in BOUND_ELSEWHERE:
        if module_name in sys.modules:
            _rebind(sys.modules[module_name], to_replacements=True)


def _rebind(module: ModuleType, *, to_replacements: bool) -> None:
    """Point a module's own binding of an exporter function (``from ..._exporter import name``) at ours or stock.

    Only a binding that holds the other one of the pair is changed: a name the
    user rebound to something else is theirs.
    """
    changed = []
    for name in BOUND_ELSEWHERE.get(module.__name__, ()):
        stock, ours = _state.originals.get(name), _state.replacements.get(name)
        if stock is None or ours is None:
            continue
        old, new = (stock, ours) if to_replacements else (ours, stock)
        if module.__dict__.get(name) is old:
            module.__dict__[name] = new
            changed.append(name)
    if changed:
        log.info("%s %s.%s", "rebound" if to_replacements else "restored stock", module.__name__, ", ".join(changed))


def _restore() -> None:
    for module_name in BOUND_ELSEWHERE:
        if module_name in sys.modules:
            _rebind(sys.modules[module_name], to_replacements=False)
    exporter = sys.modules.get(EXPORTER)
    restored = []
    if exporter is not None:
        for name, function in _state.originals.items():
            if getattr(exporter, name, None) is _state.replacements.get(name):
                setattr(exporter, name, function)
                restored.append(name)
    _state.originals, _state.replacements = {}, {}
    if restored:
        log.info("restored stock %s: %s", EXPORTER, ", ".join(sorted(restored)))


def _wrap_compile_function(compile_module: ModuleType, name: str, wrap: Any) -> tuple[Any, Any] | None:
    """Bind ``wrap(stock)`` as ``torch_tensorrt._compile.<name>`` and ``torch_tensorrt.<name>``; (stock, wrapper),
    or None where it is wrapped already (or absent)."""
    stock = compile_module.__dict__.get(name)
    if stock is None or hasattr(stock, "__trt_inline_stock__"):
        return None
    wrapper = wrap(stock)
    package = sys.modules.get("torch_tensorrt")
    # torch_tensorrt/__init__ star-imports _compile: its binding is the stock one, or not made yet.
    for module in (compile_module, package):
        if module is not None and getattr(module, name, None) in (stock, None):
            module.__dict__[name] = wrapper
    return stock, wrapper


def _unwrap_compile_function(name: str, wrapped: tuple[Any, Any]) -> None:
    """Put the stock function back where our wrapper is bound (a binding the user changed is theirs)."""
    stock, wrapper = wrapped
    for module_name in (COMPILE, "torch_tensorrt"):
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, name, None) is wrapper:
            module.__dict__[name] = stock


def _patch_compile(compile_module: ModuleType) -> None:
    """Wrap ``torch_tensorrt.save`` (reference I/O, rank manifests) and ``torch_tensorrt.load`` (rank manifests)."""
    wrapped = _wrap_compile_function(compile_module, "save", save_with_reference_io)
    if wrapped is not None:
        _state.save = wrapped
        log.info("patched torch_tensorrt.save: embeds reference I/O")
    wrapped = _wrap_compile_function(compile_module, "load", load_checking_ranks)
    if wrapped is not None:
        _state.load = wrapped
        log.info("patched torch_tensorrt.load: refuses another rank's file")


def _restore_compile() -> None:
    """Put the stock ``torch_tensorrt.save`` and ``load`` back."""
    if _state.save is not None:
        _unwrap_compile_function("save", _state.save)
        _state.save = None
        log.info("restored stock torch_tensorrt.save")
    if _state.load is not None:
        _unwrap_compile_function("load", _state.load)
        _state.load = None
        log.info("restored stock torch_tensorrt.load")


def on_import(module: ModuleType) -> None:
    """Post-import hook for both target modules: patch if this process decided so. Never raises."""
    if not _decided_to_patch():
        return
    try:
        if module.__name__ == COMPILE:
            _patch_compile(module)
        elif module.__name__ == EXPORTER:
            _patch(module)
        elif is_active():  # a module binding exporter functions by name, imported after the exporter
            _rebind(module, to_replacements=True)
    except Exception as exc:  # a failed patch must never break importing torch_tensorrt
        warnings.warn(
            f"trt-inline: could not patch {module.__name__} ({type(exc).__name__}: {exc}); "
            "torch_tensorrt's stock behaviour stays in use",
            RuntimeWarning,
            stacklevel=2,
        )


def _register_hook() -> None:
    if not _state.hook_registered:
        when_imported((*TARGETS, *BOUND_ELSEWHERE), on_import)
        _state.hook_registered = True


def install() -> None:
    """Use trt_inline's passes in ``torch_tensorrt.save``, and its rank check in ``torch_tensorrt.load``, from now
    on. Idempotent.

    Raises :class:`PatchError` if the exporter is already imported and is not a
    supported version; otherwise patches it when it is imported.
    """
    _state.wanted = True
    exporter = sys.modules.get(EXPORTER)
    if exporter is not None:
        _patch(exporter)
    compile_module = sys.modules.get(COMPILE)
    if compile_module is not None:
        _patch_compile(compile_module)
    _register_hook()


def uninstall() -> None:
    """Put the exact stock functions back and stop patching on import. Idempotent."""
    _state.wanted = False
    _restore()
    _restore_compile()


def is_active() -> bool:
    """Whether the exporter is imported and runs trt_inline's passes now."""
    exporter = sys.modules.get(EXPORTER)
    return bool(
        exporter is not None
        and _state.replacements
        and all(getattr(exporter, name, None) is fn for name, fn in _state.replacements.items())
    )


def replaced_functions() -> list[str]:
    """Names of the functions currently replaced (``save`` and ``load`` are torch_tensorrt's)."""
    names = sorted(_state.replacements) if is_active() else []
    return names + (["save"] if _state.save is not None else []) + (["load"] if _state.load is not None else [])


def doors() -> dict[str, str]:
    """``{door: what it runs now}`` for each Torch-TensorRT entry point that flattens a graph.

    The doors: ``save`` (``torch_tensorrt.save``), ``dynamo.export``
    (``torch_tensorrt.dynamo.export``), ``cross-compile``
    (``save_cross_compiled_exported_program``), ``refit``
    (``refit_module_weights`` of a loaded program), ``executorch``
    (``torch_tensorrt.save(..., output_format="executorch")``, 2.12+, and
    ``torch_tensorrt.executorch.export`` of a compiled module, 2.14).

    ``torch_tensorrt.save`` (every output format that flattens: exported
    program, AOTInductor, ExecuTorch), cross-compiling and the ExecuTorch
    export reach the passes through the exporter's module globals; ``torch_tensorrt.dynamo.export``
    and refit bind exporter functions by name, so their own bindings are read.
    A door whose module is not imported yet says so (the import hook patches it then).
    """
    active = is_active()
    version = releases.installed_version()
    release = releases.for_version(version) if version is not None else None
    through_exporter = "trt-inline's passes" if active else "stock"
    if sys.modules.get(EXPORTER) is None:
        through_exporter = "not imported yet"

    def bound(module_name: str, name: str) -> str:
        module = sys.modules.get(module_name)
        if module is None:
            return "not imported yet"
        if name not in module.__dict__:
            return "absent in this release"
        ours = _state.replacements.get(name)
        if ours is not None and module.__dict__[name] is ours and active:
            return "trt-inline's passes"
        return "stock"

    save = through_exporter
    if _state.save is not None and active:
        save += ", reference I/O embedded"
    export = through_exporter if "torch_tensorrt.dynamo" in sys.modules else "not imported yet"
    if "export" in _state.replacements:
        export = bound("torch_tensorrt.dynamo", "export")
    # Short keys: doctor prints them as labels (`door: refit`); the README's table says what each door is.
    return {
        "save": save,
        "dynamo.export": export,
        "cross-compile": through_exporter,
        "refit": bound("torch_tensorrt.dynamo._refit", "inline_torch_modules"),
        "executorch": through_exporter if release is None or release.executorch else "absent in this release",
    }


def refused_replacements() -> dict[str, str]:
    """``{function: why}`` for replacements that failed their preflight and were left stock."""
    return dict(_state.refused)


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """Use trt_inline's passes for the duration of the block; afterwards everything is as before.

    The previous explicit decision (or its absence, which leaves the choice to
    ``TRT_INLINE_DISABLE`` and the autoload hook) is restored exactly, and
    functions that were stock before the block are stock again.
    """
    was_wanted, was_active, had_save = _state.wanted, is_active(), _state.save is not None
    install()
    try:
        yield
    finally:
        _state.wanted = was_wanted
        if not was_active:
            _restore()
        if not had_save:
            _restore_compile()
