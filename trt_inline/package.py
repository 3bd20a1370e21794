"""AOTInductor packages of a flat program: compiled, and carrying what verification needs.

A package is a PT2 archive, the layout ``torch.export.pt2_archive`` defines and
``package_pt2`` writes, holding side by side:

==========================================  =================================================
entry (under the archive's root folder)      what it is
==========================================  =================================================
``data/aotinductor/model/...``              the AOTInductor model, as ``aoti_compile_and_package``
                                            writes it (generated C++, its shared library)
``models/model.json``, ``data/...``          the ExportedProgram it was compiled from, so the
                                            graph can be read and checked without loading
                                            native code
``extra/trt_inline_reference_io.b64``        reference I/O (:mod:`trt_inline.verify.reference_io`)
``extra/trt_inline_package.json``            what kind of value each output is
==========================================  =================================================

``torch._inductor.aoti_load_package`` reads the model from such a file as from
any package. It returns every output as a tensor; :func:`load_package` gives a
scalar output back as the Python number the compiled module returns.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from trt_inline import compat, formats, scalars
from trt_inline.errors import SaveError
from trt_inline.formats import EXTRA_FOLDER, PACKAGE_INFO_FILE

__all__ = ["compile_package", "extend_package", "load_package", "output_kinds_of", "package_info", "package_root"]

# Written once per archive; a program's copies of them are not added next to the package's.
_ARCHIVE_RECORDS = ("archive_format", "archive_version", ".data/version", "byteorder", ".data/serialization_id")


def package_info(kinds: Sequence[str]) -> str:
    """The ``trt_inline_package.json`` text."""
    return json.dumps({"format": 1, "outputs": list(kinds)}, sort_keys=True)


def output_kinds_of(info: str | bytes | None) -> list[str]:
    """The output kinds a ``trt_inline_package.json`` text records; [] where it is missing or unreadable."""
    if not info:
        return []
    try:
        decoded = json.loads(info)
    except ValueError:
        return []
    kinds = decoded.get("outputs") if isinstance(decoded, dict) else None
    return [str(kind) for kind in kinds] if isinstance(kinds, list) else []


def compile_package(program: ExportedProgram, target: Path, extra_files: dict[str, str]) -> float:
    """Compile ``program`` with AOTInductor into a package at ``target`` (atomically); the compile seconds.

    The package also carries ``program`` itself, its output kinds and ``extra_files``.
    """
    if program.example_inputs is None:
        raise SaveError("output_format='aot_inductor' compiles for example inputs: give arg_inputs")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as workdir:
        compiled = Path(workdir) / f"{target.stem}.pt2"
        started = time.monotonic()
        compat.aoti_compile_and_package(program, str(compiled))
        seconds = time.monotonic() - started
        kinds = scalars.kinds_of([spec.arg for spec in program.graph_signature.output_specs])
        extend_package(
            compiled, target, program=program, extra_files={**extra_files, PACKAGE_INFO_FILE: package_info(kinds)}
        )
    return seconds


def package_root(names: Sequence[str]) -> str:
    """The root folder every entry of a PT2 archive sits in."""
    return names[0].split("/", 1)[0] if names else "archive"


def extend_package(source: Path, target: Path, *, program: ExportedProgram | None, extra_files: dict[str, str]) -> None:
    """Write ``target``: the package ``source``, plus ``program``'s entries and ``extra_files`` (atomically).

    ``source`` and ``target`` may be the same file.
    """
    with zipfile.ZipFile(source) as archive:
        entries = {info.filename: archive.read(info) for info in archive.infolist()}
    root = package_root(list(entries))
    if program is not None:
        entries.update(_program_entries(program, root, existing=entries))
    for name, text in extra_files.items():
        entries[f"{root}/{EXTRA_FOLDER}{name}"] = text.encode("utf-8")
    # Stored, not deflated: as torch writes archives, and so that no entry looks like a zip bomb.
    with formats.atomic_write(target) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)


def _program_entries(program: ExportedProgram, root: str, existing: dict[str, bytes]) -> dict[str, bytes]:
    """``program`` as ``torch.export.save`` writes it, moved under ``root`` (entries the package has kept)."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    moved: dict[str, bytes] = {}
    with zipfile.ZipFile(buffer) as archive:
        for info in archive.infolist():
            relative = info.filename.split("/", 1)[1] if "/" in info.filename else info.filename
            name = f"{root}/{relative}"
            if relative in _ARCHIVE_RECORDS and name in existing:
                continue
            moved[name] = archive.read(info)
    if set(moved) & set(existing) or not any(name.endswith("/models/model.json") for name in moved):
        return {}  # a torch whose package or program layout would collide: the package goes without the program
    return moved


def load_package(path: str | os.PathLike[str]) -> Callable[..., Any]:
    """Load an AOTInductor package (this runs its shared library) as a callable.

    Scalar outputs come back as Python numbers where the package records its
    output kinds; ``aoti_load_package`` alone returns them as tensors.
    """
    model = compat.aoti_load_package(os.fspath(path))
    kinds = _recorded_kinds(Path(path))
    if not kinds or all(kind == "tensor" for kind in kinds):
        return model

    def run(*args: Any, **kwargs: Any) -> Any:
        outputs = model(*args, **kwargs)
        leaves, spec = pytree.tree_flatten(outputs)
        restored = [
            scalars.to_scalar(leaf) if kind != "tensor" and _is_one_element(leaf) else leaf
            for leaf, kind in zip(leaves, kinds, strict=False)
        ]
        return pytree.tree_unflatten(restored, spec)

    return run


def _is_one_element(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1


def _recorded_kinds(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        name = f"{package_root(names)}/{EXTRA_FOLDER}{PACKAGE_INFO_FILE}"
        return output_kinds_of(archive.read(name)) if name in names else []
