"""The Torch-TensorRT releases trt-inline supports: one record each, the one place that says what a release is.

A record names the torch the release requires (the newest patch its
``Requires-Dist`` admits, the one the compatibility matrix installs), the
parameters of its exporter's stock ``inline_trt_modules`` (how the plugin
recognises it), which exporter functions the plugin replaces and why, what its
``torch_tensorrt.save`` takes, and how its archives store an engine object. The
plugin's adapters, its ``save`` wrapper, the archive checks and the tests read
these records; adding a release is adding a record (and running the matrix).

Every fact here was read in the release's wheel (``dynamo/_exporter.py``,
``_compile.py``, ``dynamo/runtime/``). This module imports nothing but the
standard library (and the autoload module): ``.ci/matrix`` reads it with a
Python that has no torch.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# The two Torch-TensorRT modules the plugin patches: named where the import hook (registered at `import torch`, by
# the entry point, which imports no torch itself) needs them.
from trt_inline.switches import COMPILE as COMPILE_MODULE
from trt_inline.switches import EXPORTER as EXPORTER_MODULE

__all__ = [
    "COMPILE_MODULE",
    "EXPORTER_MODULE",
    "EXPORTER_NAMES_BOUND_ELSEWHERE",
    "FUTURE_TORCH",
    "RELEASES",
    "Release",
    "engine_pickle_globals",
    "for_signature",
    "for_torch",
    "for_version",
    "installed_version",
    "minor",
]

# A torch no Torch-TensorRT release requires yet: the matrix runs import, passes and end-to-end tests on it.
FUTURE_TORCH = "2.15.0"

# Why the plugin replaces each exporter function (the records say which ones, per release).
_WHY = {
    "inline_torch_modules": "wires fallback inputs by placeholder name (the seed bug), or by position without "
    "scalar conversions",
    "inline_trt_modules": "passes scalars into Tensor[] engine inputs unconverted and types multi-output getitems "
    "by user order",
    "inline_trt_modules (outputs_map)": "types every engine output float32 from shape analysis",
    "transform": "runs shape analysis, which fails on any scalar crossing a boundary",
    "lift": "writes buffer specs without `persistent`, which torch >= 2.3 refuses",
    "lift (wrapped)": "passes `_guards_fn` calls and settled assertions to the serializer",
    "create_trt_exp_program": "records ranges for input sizes only and no sample inputs",
    "export": "re-exports the inlined graph (retrace) without size-oblivious tracing: a scalar an engine returns, "
    "equated with an input size, narrows a Dim(min=1) to 2 and the file rejects batch 1; and re-exports even when "
    "cross-compiling, which gives it no inputs (missing a required argument)",
    "copy": "transform deep-copies every weight and engine (a second copy of the model in memory; an engine "
    "module without __deepcopy__ is deserialized again)",
    "replace_execute_engine_no_op_node": "the Windows loader of cross-compiled programs finds its placeholder "
    "calls by node name, and so fails on an engine output nothing reads (its getitem is named after the call)",
    "replace_execute_engine_no_op_node (2.6)": "the Windows loader of cross-compiled programs indexes a one-output "
    "engine's result a second time (the program reads its first row), and fails on an engine output nothing reads",
}

# A pickled engine whose reconstructor is a Python function of the installed torch_tensorrt (2.13+).
_RECONSTRUCT_ENGINE = ("torch_tensorrt.dynamo.runtime._TRTEngine", "_reconstruct_trt_engine")


@dataclass(frozen=True)
class Release:
    """One Torch-TensorRT release, as trt-inline meets it."""

    version: str
    torch: str
    # Parameters of the stock inline_trt_modules, in order.
    inline_trt_params: tuple[str, ...]
    # {exporter function: why the plugin replaces it}; `inline_torch_modules` is in every record.
    replaced: Mapping[str, str]
    # Whether the stock inline_torch_modules pairs placeholders by name (the seed bug).
    wires_by_name: bool
    # Whether torch_tensorrt.save(retrace=True, dynamic_shapes=...) goes through transform().
    retrace_inlines: bool
    # Whether torch_tensorrt.save takes extra_files.
    save_extra_files: bool
    # Whether torch_tensorrt.save has output_format="aot_inductor".
    aot_inductor: bool
    # Whether TorchTensorRTModule defines __deepcopy__ (shares the engine instead of re-creating it).
    engine_deepcopy: bool
    # Whether torch_tensorrt.save has output_format="executorch" (an ExecuTorch .pte lowered from the flat program).
    executorch: bool = False
    # Whether the legacy exporter's lift() writes `persistent` on buffer specs (else the plugin's lift replaces it).
    lift_persistent: bool = False
    # Python globals a pickled engine object may name in this release's archives (beyond TorchBind classes).
    engine_pickle_globals: tuple[tuple[str, str], ...] = field(default=())
    # The runtime ABI version its engines are saved with and its runtime loads (only that one): runtime.h.
    runtime_abi: str = ""
    # How its dynamo.compile takes reduced precision (_settings.py, _defaults.py, _compiler.py): "weak"
    # (enabled_precisions), "explicit" (enable_autocast; enabled_precisions only with use_explicit_typing=False, its
    # default being True), "autocast" (enable_autocast; no enabled_precisions: strong typing always).
    precision: str = "weak"

    @property
    def autocast(self) -> bool:
        """Whether it has rule-based autocast (``enable_autocast``, ``autocast_*``: 2.10+)."""
        return self.precision != "weak"

    @property
    def minor(self) -> tuple[int, int]:
        return minor(self.version)


def _replaced(*names: str) -> Mapping[str, str]:
    return MappingProxyType({name.split(" ")[0]: _WHY[name] for name in ("inline_torch_modules", *names, "copy")})


_CROSS_COMPILE_FLAG = ("gm", "cross_compile_flag")
_CROSS_COMPILE = ("gm", "cross_compile_module")
_LOADER = "replace_execute_engine_no_op_node"
_BY_NAME = _replaced("inline_trt_modules", "lift", "create_trt_exp_program", _LOADER)
# From 2.11 `export()` re-exports the inlined graph with torch.export.export (retrace=True, dynamo.export).
_BY_NAME_RETRACING = _replaced("inline_trt_modules", "lift", "create_trt_exp_program", "export", _LOADER)

# Modules of Torch-TensorRT that bind an exporter function by name when they are imported (`from
# torch_tensorrt.dynamo._exporter import ...`): replacing the exporter's attribute does not reach them, so the
# plugin rebinds these names too (and puts the stock ones back). Read in 2.5.0 ... 2.14.0 and upstream main.
EXPORTER_NAMES_BOUND_ELSEWHERE: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "torch_tensorrt.dynamo": ("export",),  # the public `torch_tensorrt.dynamo.export`
        "torch_tensorrt.dynamo._refit": ("inline_torch_modules",),  # refit of a loaded program
        # load_cross_compiled_exported_program, the Windows loader (2.6+); its save imports `export` when called
        "torch_tensorrt.dynamo._compiler": ("replace_execute_engine_no_op_node",),
    }
)

RELEASES: tuple[Release, ...] = (
    Release(
        "2.5.0", "2.5.1", ("gm", "outputs_map"),
        _replaced("inline_trt_modules (outputs_map)", "transform", "lift", "create_trt_exp_program"),
        wires_by_name=True, retrace_inlines=False, save_extra_files=False, aot_inductor=False, engine_deepcopy=False,
        runtime_abi="6",
    ),
    Release(
        "2.6.1", "2.6.0", _CROSS_COMPILE_FLAG,
        _replaced("inline_trt_modules", "lift", "create_trt_exp_program", f"{_LOADER} (2.6)"),
        wires_by_name=True, retrace_inlines=False, save_extra_files=False, aot_inductor=False, engine_deepcopy=False,
        runtime_abi="6",
    ),
    Release(
        "2.7.0", "2.7.1", _CROSS_COMPILE, _BY_NAME,
        wires_by_name=True, retrace_inlines=False, save_extra_files=False, aot_inductor=False, engine_deepcopy=False,
        runtime_abi="7",
    ),
    Release(
        "2.8.0", "2.8.0", _CROSS_COMPILE, _BY_NAME,
        wires_by_name=True, retrace_inlines=False, save_extra_files=False, aot_inductor=True, engine_deepcopy=False,
        runtime_abi="7",
    ),
    Release(
        "2.9.0", "2.9.1", _CROSS_COMPILE, _BY_NAME,
        wires_by_name=True, retrace_inlines=False, save_extra_files=False, aot_inductor=True, engine_deepcopy=False,
        runtime_abi="7",
    ),
    Release(
        "2.10.0", "2.10.0", _CROSS_COMPILE, _BY_NAME,
        wires_by_name=True, retrace_inlines=False, save_extra_files=False, aot_inductor=True, engine_deepcopy=False,
        runtime_abi="7", precision="explicit",
    ),
    Release(
        "2.11.0", "2.11.0", _CROSS_COMPILE, _BY_NAME_RETRACING,
        wires_by_name=True, retrace_inlines=True, save_extra_files=True, aot_inductor=True, engine_deepcopy=False,
        runtime_abi="8", precision="explicit",
    ),
    Release(
        "2.12.1", "2.12.1", _CROSS_COMPILE, _BY_NAME_RETRACING,
        wires_by_name=True, retrace_inlines=True, save_extra_files=True, aot_inductor=True, engine_deepcopy=True,
        executorch=True, runtime_abi="9", precision="explicit",
    ),
    Release(
        "2.13.0", "2.13.0", _CROSS_COMPILE, _BY_NAME_RETRACING,
        wires_by_name=True, retrace_inlines=True, save_extra_files=True, aot_inductor=True, engine_deepcopy=True,
        executorch=True, engine_pickle_globals=(_RECONSTRUCT_ENGINE,), runtime_abi="9", precision="autocast",
    ),
    Release(
        "2.14.0", "2.14.1", ("gm", "cross_compile_module", "expose_aliased_mutations"),
        _replaced("inline_trt_modules", "lift (wrapped)", "create_trt_exp_program", "export", _LOADER),
        wires_by_name=False, retrace_inlines=True, save_extra_files=True, aot_inductor=True, engine_deepcopy=True,
        executorch=True, lift_persistent=True, engine_pickle_globals=(_RECONSTRUCT_ENGINE,), runtime_abi="10",
        precision="autocast",
    ),
)  # fmt: skip


def minor(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def for_version(version: str) -> Release | None:
    """The record of the release with this version's minor, or None."""
    wanted = minor(version)
    return next((release for release in RELEASES if release.minor == wanted), None)


def for_torch(torch_version: str) -> Release | None:
    """The record of the release that requires this torch's minor version, or None."""
    wanted = minor(torch_version)
    return next((release for release in RELEASES if minor(release.torch) == wanted), None)


def for_signature(params: tuple[str, ...], version: str | None = None) -> Release | None:
    """The record whose stock ``inline_trt_modules`` takes ``params``.

    Several releases share a signature (2.7 ... 2.13); the installed version picks
    among them, and where it is unknown or none of them, the newest record with
    that signature stands in (the replacements of those releases are the same).
    """
    matching = [release for release in RELEASES if release.inline_trt_params == params]
    if version is not None:
        exact = [release for release in matching if release.minor == minor(version)]
        if exact:
            return exact[0]
    return matching[-1] if matching else None


def installed_version() -> str | None:
    """The version of the installed (or already imported) Torch-TensorRT, None when unknown."""
    text = None
    try:
        text = importlib.metadata.version("torch_tensorrt")
    except importlib.metadata.PackageNotFoundError:
        text = getattr(sys.modules.get("torch_tensorrt"), "__version__", None)
    return str(text) if text and re.match(r"\d+\.\d+", str(text)) else None


def engine_pickle_globals() -> tuple[tuple[str, str], ...]:
    """Every Python global any supported release's archives name for an engine object."""
    found: list[tuple[str, str]] = []
    for release in RELEASES:
        found += [name for name in release.engine_pickle_globals if name not in found]
    return tuple(found)
