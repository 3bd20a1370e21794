"""trt-inline: correct ExportedProgram saves of Torch-TensorRT modules with PyTorch fallbacks.

``inline_trt_modules`` and ``inline_torch_modules`` flatten a partitioned module
(``_run_on_acc_N`` engines, ``_run_on_gpu_N`` fallbacks) into one graph, wiring
every submodule input to its producer by argument position. ``transform`` runs
both on a copy and lints the result; ``save`` writes the ExportedProgram;
``verify`` checks a saved file; ``diff`` compares two saves engine by engine.

Importing this package registers ``torch.ops.trt_inline.execute_engine``, the op
of the CPU reference backend (:mod:`trt_inline.reference`), so files saved from
that backend load after ``import trt_inline``.
"""

from trt_inline import reference
from trt_inline.errors import (
    EngineFormatError,
    IncompatibleTorchError,
    InlineError,
    PatchError,
    SaveError,
    TrtInlineError,
    UnsafeArchiveError,
    VerifyInputError,
)
from trt_inline.export import save, to_exported_program
from trt_inline.flat_program import exported_program_from_graph
from trt_inline.passes import inline_torch_modules, inline_trt_modules, transform
from trt_inline.plugin import enabled, install, is_active, uninstall
from trt_inline.verify import VerifyReport, diff, load, verify

__version__ = "0.1.0"

__all__ = [
    "EngineFormatError",
    "IncompatibleTorchError",
    "InlineError",
    "PatchError",
    "SaveError",
    "TrtInlineError",
    "UnsafeArchiveError",
    "VerifyInputError",
    "VerifyReport",
    "diff",
    "enabled",
    "exported_program_from_graph",
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
