"""Make ``torch_tensorrt.save`` use trt_inline's passes, with no change to user code.

Torch-TensorRT's ``transform()`` looks ``inline_trt_modules`` and
``inline_torch_modules`` up as globals of ``torch_tensorrt.dynamo._exporter``
when it runs, so replacing those module attributes redirects every save path
that goes through it: ``export()``, the legacy ``retrace=False`` exporter and
the dynamic-shape ``retrace=True`` path. Before 2.14 the legacy exporter's
``lift()`` builds buffer specs without ``persistent``, which torch >= 2.3
refuses, so ``lift`` is replaced there too.

Activation: ``trt_inline_autoload.register`` runs at ``import torch`` (entry point
group ``torch.backends``) and registers a post-import hook for the exporter
module; the hook patches the module as soon as it has been executed. ``TRT_INLINE_DISABLE=1`` stops the
automatic activation; :func:`install`, :func:`uninstall` and :func:`enabled` are
the explicit controls and always do what they say.

================  =========================================  ===============================
Torch-TensorRT    ``inline_trt_modules`` signature            replaced
================  =========================================  ===============================
2.5               ``(gm, outputs_map)``                      both passes (shapes from the map), ``lift``
2.6               ``(gm, cross_compile_flag)``               both passes, ``lift``
2.7 ... 2.13      ``(gm, cross_compile_module)``             both passes, ``lift``
2.14              ``(gm, cross_compile_module,               both passes (KV-cache mutations still
                  expose_aliased_mutations)``                exposed by the stock helper); ``lift``
                                                             first drops ``_guards_fn`` calls
================  =========================================  ===============================
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import inspect
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.fx

from trt_inline import export, passes
from trt_inline.errors import TrtInlineError

__all__ = ["EXPORTER", "PatchError", "enabled", "install", "is_active", "replaced_functions", "uninstall"]

EXPORTER = "torch_tensorrt.dynamo._exporter"
COMPILE = "torch_tensorrt._compile"
TARGETS = (EXPORTER, COMPILE)
# TRT_INLINE_REFERENCE_IO=0: the patched torch_tensorrt.save embeds no reference I/O.
REFERENCE_IO_ENV = "TRT_INLINE_REFERENCE_IO"


class PatchError(TrtInlineError, RuntimeError):
    """The installed Torch-TensorRT's exporter does not look like any supported version."""


@dataclass
class _PluginState:
    """What this process has patched. One per process: the exporter module is one per process too."""

    # None until someone decides: the autoload hook activates then, uninstall() stops it.
    wanted: bool | None = None
    hook_registered: bool = False
    originals: dict[str, Any] = field(default_factory=dict)
    replacements: dict[str, Any] = field(default_factory=dict)
    # (stock torch_tensorrt.save, our wrapper) once wrapped.
    save: tuple[Any, Any] | None = None


_state = _PluginState()


def torch_tensorrt_version() -> tuple[int, int] | None:
    """(major, minor) of the installed or imported Torch-TensorRT, None when unknown."""
    text = None
    try:
        text = importlib.metadata.version("torch_tensorrt")
    except importlib.metadata.PackageNotFoundError:
        text = getattr(sys.modules.get("torch_tensorrt"), "__version__", None)
    match = re.match(r"(\d+)\.(\d+)", str(text or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _inline_trt_modules_with_outputs_map(gm: torch.fx.GraphModule, outputs_map: dict[Any, Any]) -> torch.fx.GraphModule:
    """2.5's form: engine output shapes come from shape analysis instead of ``meta["val"]``."""
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
    for node in gm.graph.nodes:
        if not passes.is_accelerated_call(gm, node) or "val" in node.meta:
            continue
        shapes = outputs_map.get(node.name, outputs_map.get(str(node.target)))
        if shapes is None:
            continue
        context = fake_mode if fake_mode is not None else contextlib.nullcontext()
        with context:
            node.meta["val"] = [
                torch.empty(tuple(shape), device="meta" if fake_mode is None else "cpu") for shape in shapes
            ]
    return passes.inline_trt_modules(gm)


def _exposing_inline_trt_modules(exporter: ModuleType) -> Callable[..., torch.fx.GraphModule]:
    """2.14's form: after each engine, the stock helper exposes aliased (KV-cache) buffer mutations."""
    expose = exporter._expose_aliased_buffer_mutations

    def inline_trt_modules(
        gm: torch.fx.GraphModule, cross_compile_module: bool | None = False, expose_aliased_mutations: bool = True
    ) -> torch.fx.GraphModule:
        on_engine = None
        if expose_aliased_mutations and not cross_compile_module:

            def on_engine(engine_call: torch.fx.Node, module: torch.nn.Module, num_outputs: int) -> None:
                expose(gm, engine_call, module, num_outputs)

        return passes.inline_engines(gm, cross_compile_module=bool(cross_compile_module), on_engine=on_engine)

    inline_trt_modules.__doc__ = passes.inline_trt_modules.__doc__
    return inline_trt_modules


def replacements_for(exporter: ModuleType) -> dict[str, Any]:
    """The functions of ``exporter`` to replace, and their replacements, for its version."""
    stock = getattr(exporter, "inline_trt_modules", None)
    if not callable(stock) or not callable(getattr(exporter, "inline_torch_modules", None)):
        raise PatchError(f"{exporter.__name__} has no inline_trt_modules / inline_torch_modules")
    params = list(inspect.signature(stock).parameters)
    result: dict[str, Any] = {"inline_torch_modules": passes.inline_torch_modules}
    if params == ["gm", "outputs_map"]:
        result["inline_trt_modules"] = _inline_trt_modules_with_outputs_map
    elif len(params) == 2 and params[0] == "gm" and params[1] in ("cross_compile_flag", "cross_compile_module"):
        result["inline_trt_modules"] = passes.inline_trt_modules
    elif params == ["gm", "cross_compile_module", "expose_aliased_mutations"]:
        if not callable(getattr(exporter, "_expose_aliased_buffer_mutations", None)):
            raise PatchError(f"{exporter.__name__}: 2.14-style signature without _expose_aliased_buffer_mutations")
        result["inline_trt_modules"] = _exposing_inline_trt_modules(exporter)
    else:
        raise PatchError(f"{exporter.__name__}.inline_trt_modules has an unknown signature ({', '.join(params)})")
    stock_lift = getattr(exporter, "lift", None)
    if callable(stock_lift):
        version = torch_tensorrt_version()
        stock_lift_lacks_persistent = version < (2, 14) if version else len(params) == 2
        result["lift"] = export.lift if stock_lift_lacks_persistent else _lift_without_guard_calls(stock_lift)
    return result


def _lift_without_guard_calls(stock_lift: Callable[..., Any]) -> Callable[..., Any]:
    """2.14's ``lift``, after removing the ``_guards_fn`` call the inlined fallback brought along."""

    def lift(gm: torch.fx.GraphModule, graph_signature: Any) -> Any:
        export.drop_guard_calls(gm)
        return stock_lift(gm, graph_signature)

    lift.__doc__ = stock_lift.__doc__
    return lift


def _patch(exporter: ModuleType) -> None:
    if _state.replacements and all(getattr(exporter, k, None) is v for k, v in _state.replacements.items()):
        return
    replacements = replacements_for(exporter)
    originals = {name: getattr(exporter, name) for name in replacements}
    for name, function in replacements.items():
        setattr(exporter, name, function)
    _state.originals, _state.replacements = originals, replacements


def _restore() -> None:
    exporter = sys.modules.get(EXPORTER)
    if exporter is not None:
        for name, function in _state.originals.items():
            if getattr(exporter, name, None) is _state.replacements.get(name):
                setattr(exporter, name, function)
    _state.originals, _state.replacements = {}, {}


def _save_with_reference_io(stock_save: Callable[..., Any]) -> Callable[..., Any]:
    """``torch_tensorrt.save`` that also embeds reference I/O when given tensor inputs.

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


def _patch_save(compile_module: ModuleType) -> None:
    stock = getattr(compile_module, "save")  # noqa: B009 - a module attribute mypy cannot see
    if hasattr(stock, "__trt_inline_stock__"):
        return
    wrapper = _save_with_reference_io(stock)
    package = sys.modules.get("torch_tensorrt")
    # torch_tensorrt/__init__ star-imports _compile: its `save` is the stock one, or not bound yet.
    for module in (compile_module, package):
        if module is not None and getattr(module, "save", None) in (stock, None):
            module.__dict__["save"] = wrapper
    _state.save = (stock, wrapper)


def _restore_save() -> None:
    if _state.save is None:
        return
    stock, wrapper = _state.save
    for name in (COMPILE, "torch_tensorrt"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "save", None) is wrapper:
            module.__dict__["save"] = stock
    _state.save = None


def _on_import(module: ModuleType) -> None:
    """Post-import hook for both target modules: patch unless this process said no. Never raises."""
    if _state.wanted is False:
        return
    try:
        if module.__name__ == COMPILE:
            _patch_save(module)
        else:
            _patch(module)
    except Exception as exc:  # a failed patch must never break importing torch_tensorrt
        warnings.warn(
            f"trt-inline: could not patch {module.__name__} ({type(exc).__name__}: {exc}); "
            "torch_tensorrt's stock behaviour stays in use",
            RuntimeWarning,
            stacklevel=2,
        )


def _register_hook() -> None:
    if not _state.hook_registered:
        import wrapt

        for name in TARGETS:
            wrapt.register_post_import_hook(_on_import, name)
        _state.hook_registered = True


def install() -> None:
    """Use trt_inline's passes in ``torch_tensorrt.save`` from now on. Idempotent.

    Raises :class:`PatchError` if the exporter is already imported and is not a
    supported version; otherwise patches it when it is imported.
    """
    _state.wanted = True
    exporter = sys.modules.get(EXPORTER)
    if exporter is not None:
        _patch(exporter)
    compile_module = sys.modules.get(COMPILE)
    if compile_module is not None:
        _patch_save(compile_module)
    _register_hook()


def uninstall() -> None:
    """Put the exact stock functions back and stop patching on import. Idempotent."""
    _state.wanted = False
    _restore()
    _restore_save()


def is_active() -> bool:
    """Whether the exporter is imported and runs trt_inline's passes now."""
    exporter = sys.modules.get(EXPORTER)
    return bool(
        exporter is not None
        and _state.replacements
        and all(getattr(exporter, name, None) is fn for name, fn in _state.replacements.items())
    )


def replaced_functions() -> list[str]:
    """Names of the functions currently replaced (``save`` is torch_tensorrt.save)."""
    names = sorted(_state.replacements) if is_active() else []
    return names + (["save"] if _state.save is not None else [])


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """Use trt_inline's passes for the duration of the block, then restore what was there."""
    was_wanted, was_active = _state.wanted, is_active()
    install()
    try:
        yield
    finally:
        if not was_active:
            _restore()
            _restore_save()
        _state.wanted = was_wanted
