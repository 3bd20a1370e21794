"""What is imported when: a package's names imported on their first use, a callback run when a module is imported.

:func:`lazy_exports` (PEP 562) keeps ``import trt_inline`` light:
``import trt_inline`` must not import torch: torch's entry point (:mod:`trt_inline.autoload`) runs while
torch is still being imported, and the ``trt-inline`` command starts its child's interpreter before it
imports torch (:mod:`trt_inline.__main__`); both are modules of this package, so the package's
``__init__`` (and that of :mod:`trt_inline.isolation`) names its exports here and imports each on its
first use.

:func:`when_imported` is the one registration of post-import hooks (``wrapt``'s): torch's entry point
watches Torch-TensorRT's exporter with it, the plugin the modules it patches, and the package torch, to
define its operators where the entry point did not run. Standard library only at import (the lowest
floor of ``python3 .ci/imports``): ``wrapt`` is imported by the first registration.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = ["lazy_exports", "when_imported"]


class _ExportsFirst(ModuleType):
    """A package whose exported names win over its submodules of the same name (``trt_inline.verify``, the
    function, and ``trt_inline.verify``, the package that defines it): the import system binds a submodule as its
    package's attribute once it is imported, which would hide the export; bound here, the name is the export."""

    def __setattr__(self, name: str, value: Any) -> None:
        module_name, _, attribute = self.__dict__.get("_exports", {}).get(name, "").partition(":")
        if attribute and isinstance(value, ModuleType) and value.__name__ == module_name == f"{self.__name__}.{name}":
            value = getattr(value, attribute)
        super().__setattr__(name, value)


def lazy_exports(package: str, exports: Mapping[str, str]) -> None:
    """Give ``package`` (being imported) the names ``exports`` lists, each imported on its first use (PEP 562's
    ``__getattr__`` and ``__dir__``) and then bound in the package: ``exports[N]`` is ``"module"`` (the module
    itself) or ``"module:attribute"``. Its submodules are its attributes too, each imported on its first use."""
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            # A submodule, as the package was read before its names were imported on first use (trt_inline.package).
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, _, attribute = where.partition(":")
        value = importlib.import_module(module_name)
        if attribute:
            value = getattr(value, attribute)
        setattr(module, name, value)  # (the next use finds it without this function)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *exports})

    module.__dict__.update(__getattr__=__getattr__, __dir__=__dir__, _exports=exports)
    module.__class__ = _ExportsFirst


def when_imported(names: Sequence[str], callback: Callable[[ModuleType], object]) -> None:
    """Run ``callback(module)`` once each module of ``names`` has been imported: at once for one imported already,
    otherwise as soon as its import has executed it. ``callback`` must not raise (it runs inside the importer's
    ``import``)."""
    waiting = []
    for name in names:
        if name in sys.modules:
            callback(sys.modules[name])
        else:
            waiting.append(name)
    if waiting:
        import wrapt  # (0.1 s: not for modules imported already)

        for name in waiting:
            wrapt.register_post_import_hook(callback, name)
