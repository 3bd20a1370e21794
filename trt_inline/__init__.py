"""trt-inline: correct ExportedProgram saves of Torch-TensorRT modules with PyTorch fallbacks.

``inline_trt_modules`` and ``inline_torch_modules`` flatten a partitioned module
(``_run_on_acc_N`` engines, ``_run_on_gpu_N`` fallbacks) into one graph, wiring
every submodule input to its producer by argument position. ``transform`` runs
both on a copy and lints the result; ``save`` writes the ExportedProgram;
``verify`` checks a saved file; ``diff`` compares two saves engine by engine.

``torch.ops.trt_inline.execute_engine``, the op of the CPU reference backend
(:mod:`trt_inline.reference`), is defined at ``import torch`` by trt-inline's
``torch.backends`` entry point, so files saved from that backend load with
``torch.export.load`` alone; importing this package defines it where that entry
point did not run (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``).

Packages, lowest floor first (imports point down only: ``python3 .ci/imports``):

=======================  ===========================================================
package or module        concern
=======================  ===========================================================
:mod:`.inlining`         the inlining core: ``passes`` (the inline passes), ``flat_program``,
                         ``scalars``, ``symbolic``, ``attributes``, ``module_state``
core modules             ``engines`` (what an engine is), ``allowed_ops`` (the operator
                         allow-list), ``package`` (AOTInductor), ``compat`` (torch's private
                         APIs), ``releases``, ``formats``, ``errors``, ``logs``, ``progress``,
                         ``output_tree``, ``deployment`` (what an engine needs of a machine),
                         ``messages`` (typed messages to and from a child: encoded, decoded strictly),
                         ``module_paths`` (a node's module path and source line)
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
``cli``, ``__main__``    the ``trt-inline`` command line: the dispatcher
=======================  ===========================================================
"""

import sys as _sys

if _sys.argv[:1] == ["-m"] and _sys.orig_argv[len(_sys.orig_argv) - len(_sys.argv)] == "trt_inline":
    # `python -m trt_inline ...`: this package is imported before its __main__ runs, so the command's child
    # interpreter is started here, before torch is imported, as the `trt-inline` script starts it.
    from trt_inline_command import start_for

    start_for(_sys.argv[1:])

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
from trt_inline.inlining import attributes, flat_program, module_state, passes, scalars, symbolic
from trt_inline.inlining.flat_program import exported_program_from_graph
from trt_inline.inlining.passes import inline_torch_modules, inline_trt_modules, transform
from trt_inline.plugin import enabled, install, is_active, uninstall
from trt_inline.verify import VerifyReport, diff, verify

__version__ = "0.1.0"

# The inlining core's modules by the names they had before it was a package (``trt_inline.passes`` was documented):
# the same module objects, so ``from trt_inline.passes import inline_trt_modules`` is the function itself.
for _module in (attributes, flat_program, module_state, passes, scalars, symbolic):
    _sys.modules.setdefault(f"trt_inline.{_module.__name__.rpartition('.')[2]}", _module)
del _module

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
