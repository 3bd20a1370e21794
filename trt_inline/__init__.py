"""trt-inline: correct ExportedProgram saves of Torch-TensorRT modules with PyTorch fallbacks.

``inline_trt_modules`` and ``inline_torch_modules`` flatten a partitioned module
(``_run_on_acc_N`` engines, ``_run_on_gpu_N`` fallbacks) into one graph, wiring
every submodule input to its producer by argument position. ``transform`` runs
both on a copy and lints the result; ``save`` writes the ExportedProgram;
``verify`` checks a saved file; ``diff`` compares two saves engine by engine.

``import trt_inline`` imports neither torch nor any of the names below: each is
imported on its first use (:mod:`trt_inline.importing`), so that torch's entry point
(:mod:`trt_inline.autoload`, run while torch is being imported) and the
``trt-inline`` command (:mod:`trt_inline.__main__`, which starts its child's
interpreter before it imports torch) can be modules of this package.

The operators a saved file may call (:mod:`trt_inline.operators`:
``torch.ops.trt_inline.execute_engine``, the reference backend's engine, and
``trt_inline::check_ranks``) are defined at ``import torch`` by that entry point,
so files saved from that backend load with ``torch.export.load`` alone; where the
entry point did not run (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), importing this
package defines them once torch is imported (at once where it is already).

Packages, lowest floor first (imports point down only: ``python3 .ci/imports``):

=======================  ===========================================================
package or module        concern
=======================  ===========================================================
startup modules          ``switches`` (the environment switches, the names of the watched
                         modules and of the operators), ``importing`` (names imported on
                         first use, import hooks), ``errors`` (every exception class),
                         ``isolation.interpreter`` (a child interpreter, started before torch
                         is imported): standard library only
:mod:`.inlining`         the inlining core: ``passes`` (the inline passes), ``flat_program``,
                         ``scalars``, ``symbolic``, ``attributes``, ``module_state``
core modules             ``engines`` (what an engine is), ``allowed_ops`` (the operator
                         allow-list), ``package`` (AOTInductor), ``compat`` (torch's private
                         APIs), ``releases``, ``formats``, ``logs``, ``progress``,
                         ``output_tree``, ``engine_fields`` (what an engine's info says),
                         ``deployment`` (whether a machine runs it), ``codec`` (typed
                         messages to and from a child: encoded, decoded strictly),
                         ``module_paths`` (a node's module path and source line),
                         ``operators`` (the operators a saved file may call, defined once)
:mod:`.reference`        the CPU reference backend
:mod:`.distributed`      rank sets: manifests, the rank check, the relay
:mod:`.isolation`        the sandboxed child process, its limits, the read-ahead; the
                         jobs a child may run, declared with each job
:mod:`.archive`          reading saved files through one strict reader; ``load``
:mod:`.verify`           checks, comparison, which engine diverged, reports; ``verify``, ``diff``
``export``, ``embedding``  ``save``: from a compiled module to a checked, saved file
:mod:`.fixing`           ``find_fix``: the compile settings that bring a reduced-precision
                         build within tolerance; ``trt-inline fix``
:mod:`.plugin`           ``torch_tensorrt.save`` / ``load`` patched, with no change to user code
:mod:`.commands`         one module per verb (``doctor``, ``verify``, ``ranks``, ``diff``,
                         ``inspect``, ``check``, ``fix``) over shared argument groups
``autoload``             torch's ``torch.backends`` entry point: the operators, the import hooks
``cli``                  the ``trt-inline`` command line: the dispatcher
``__main__``             the ``trt-inline`` command (and ``python -m trt_inline``): its child's
                         interpreter started, then the command line
=======================  ===========================================================
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys as _sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from trt_inline.importing import lazy_exports

if TYPE_CHECKING:
    from trt_inline import reference
    from trt_inline.archive import load
    from trt_inline.errors import (
        CompileError,
        EngineFormatError,
        IncompatibleTorchError,
        InlineError,
        LoadError,
        PatchError,
        SaveError,
        TrtInlineError,
        UnsafeArchiveError,
        VerifyInputError,
    )
    from trt_inline.export import save, to_exported_program
    from trt_inline.fixing import FixReport, find_fix
    from trt_inline.inlining import attributes as attributes
    from trt_inline.inlining import flat_program as flat_program
    from trt_inline.inlining import module_state as module_state
    from trt_inline.inlining import passes as passes
    from trt_inline.inlining import scalars as scalars
    from trt_inline.inlining import symbolic as symbolic
    from trt_inline.inlining.flat_program import exported_program_from_graph
    from trt_inline.inlining.passes import inline_torch_modules, inline_trt_modules, transform
    from trt_inline.plugin import enabled, install, is_active, uninstall
    from trt_inline.verify import VerifyReport, verify
    from trt_inline.verify.diff import diff

__version__ = "0.1.0"

_ERRORS = (
    "CompileError", "EngineFormatError", "IncompatibleTorchError", "InlineError", "LoadError", "PatchError",
    "SaveError", "TrtInlineError", "UnsafeArchiveError", "VerifyInputError",
)  # fmt: skip
# The inlining core's modules, also by the names they had before it was a package (``trt_inline.passes`` was
# documented): ``import trt_inline.passes`` gives the module ``trt_inline.inlining.passes`` itself.
_INLINING = ("attributes", "flat_program", "module_state", "passes", "scalars", "symbolic")
_EXPORTS = {
    **{name: f"trt_inline.errors:{name}" for name in _ERRORS},
    **{name: f"trt_inline.inlining.{name}" for name in _INLINING},
    "reference": "trt_inline.reference",
    "load": "trt_inline.archive:load",
    "save": "trt_inline.export:save",
    "to_exported_program": "trt_inline.export:to_exported_program",
    "FixReport": "trt_inline.fixing:FixReport",
    "find_fix": "trt_inline.fixing:find_fix",
    "exported_program_from_graph": "trt_inline.inlining.flat_program:exported_program_from_graph",
    "inline_torch_modules": "trt_inline.inlining.passes:inline_torch_modules",
    "inline_trt_modules": "trt_inline.inlining.passes:inline_trt_modules",
    "transform": "trt_inline.inlining.passes:transform",
    "enabled": "trt_inline.plugin:enabled",
    "install": "trt_inline.plugin:install",
    "is_active": "trt_inline.plugin:is_active",
    "uninstall": "trt_inline.plugin:uninstall",
    "VerifyReport": "trt_inline.verify:VerifyReport",
    "diff": "trt_inline.verify.diff:diff",
    "verify": "trt_inline.verify:verify",
}
lazy_exports(__name__, _EXPORTS)


class _FormerName(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import trt_inline.passes`` (and the inlining core's other modules by their former names): the module
    ``trt_inline.inlining.passes`` itself, not a second copy of it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in _INLINING:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(f"{__name__}.inlining.{spec.name.rpartition('.')[2]}")

    def exec_module(self, module: ModuleType) -> None:
        # The import system has just set the module's __spec__ to the former name's: it keeps its own (found by its
        # own name, in its package's folder).
        module.__spec__ = importlib.util.spec_from_file_location(module.__name__, module.__file__)


# (once per process: by the class's name, since a package imported again defines the class again)
if not any(type(finder).__qualname__ == _FormerName.__qualname__ for finder in _sys.meta_path):
    _sys.meta_path.append(_FormerName())

# The operators a saved file may call, where torch's entry point did not define them: once torch is imported.
from trt_inline.operators import define_once_torch_is_imported  # noqa: E402

define_once_torch_is_imported()

__all__ = [
    "CompileError",
    "EngineFormatError",
    "FixReport",
    "IncompatibleTorchError",
    "InlineError",
    "LoadError",
    "PatchError",
    "SaveError",
    "TrtInlineError",
    "UnsafeArchiveError",
    "VerifyInputError",
    "VerifyReport",
    "diff",
    "enabled",
    "exported_program_from_graph",
    "find_fix",
    "inline_torch_modules",
    "inline_trt_modules",
    "install",
    "is_active",
    "load",
    "reference",
    "save",
    "to_exported_program",
    "transform",
    "uninstall",
    "verify",
]
