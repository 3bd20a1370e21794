"""AOTInductor packages of a flat program: compiled, and carrying what verification needs.

A package is a PT2 archive, the layout ``torch.export.pt2_archive`` defines and
``package_pt2`` writes, holding side by side:

==========================================  =================================================
entry (under the archive's root folder)      what it is
==========================================  =================================================
``data/aotinductor/model/...``              the AOTInductor model, as ``aoti_compile_and_package``
                                            writes it (generated C++, its shared library)
``models/model.json``, ``data/...``          the ExportedProgram it was compiled from, its
                                            tensors on the meta device (:func:`graph_only`),
                                            so the graph can be read and checked without
                                            loading native code
``extra/trt_inline_reference_io.b64``        reference I/O (:mod:`trt_inline.archive.reference_io`)
``extra/trt_inline_package.json``            what kind of value each output is
==========================================  =================================================

``torch._inductor.aoti_load_package`` reads the model from such a file as from
any package. It returns every output as a tensor; :func:`load_package` gives a
scalar output back as the Python number the compiled module returns.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from trt_inline import compat, formats
from trt_inline.errors import SaveError, TrtInlineError, first_line
from trt_inline.formats import EXTRA_FOLDER, PACKAGE_INFO_FILE
from trt_inline.inlining import scalars

__all__ = ["compile_package", "extend_package", "load_package", "output_kinds_of", "package_info", "package_root"]

# Written once per archive; a program's copies of them are not added next to the package's.
_CHUNK_BYTES = 4 << 20
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
        try:
            compat.aoti_compile_and_package(program, str(compiled))
        except TrtInlineError:
            raise
        except Exception as exc:
            # Inductor's own failures surface from deep inside it: one line naming the file and the torch.
            raise SaveError(
                f"{target}: AOTInductor of torch {torch.__version__} could not compile the program "
                f"({type(exc).__name__}: {first_line(exc)}); output_format='exported_program' saves it"
            ) from exc
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

    ``program`` goes in without its tensor data (:func:`graph_only`): the
    package's AOTInductor model holds the weights. Entries are copied in
    chunks, never read whole, so a package of any size is extended in a few
    MiB of memory. ``source`` and ``target`` may be the same file.
    """
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as workdir:
        program_file = None
        if program is not None:
            program_file = Path(workdir) / "program.pt2"
            with open(program_file, "wb") as handle, compat.streaming_tensor_writes():
                torch.export.save(graph_only(program), handle)
        with zipfile.ZipFile(source) as package:
            infos = package.infolist()
            root = package_root([info.filename for info in infos])
            extras = {f"{root}/{EXTRA_FOLDER}{name}": text.encode("utf-8") for name, text in extra_files.items()}
            # Stored, not deflated: as torch writes archives, and so that no entry looks like a zip bomb.
            with formats.atomic_write(target) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as out:
                written = set()
                for info in infos:
                    if info.filename in extras:
                        _write(out, info.filename, extras.pop(info.filename))
                    else:
                        _copy_entry(package, info, out, info.filename)
                    written.add(info.filename)
                if program_file is not None:
                    _copy_program(program_file, root, out, written)
                for name, data in extras.items():
                    _write(out, name, data)


def graph_only(program: ExportedProgram) -> ExportedProgram:
    """``program`` with every weight and tensor constant on the meta device: graph, signature and shapes, no data.

    What a package carries of its program, to be read and checked without
    loading native code; ``torch.export.load`` gives it back with meta tensors.
    """

    def meta(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value  # a script object (a TensorRT engine) is kept as it is
        moved = value.detach().to("meta")
        if isinstance(value, torch.nn.Parameter):
            return torch.nn.Parameter(moved, requires_grad=value.requires_grad)
        return moved

    return compat.exported_program(
        root=program.graph_module,
        graph=program.graph,
        graph_signature=program.graph_signature,
        state_dict={name: meta(value) for name, value in program.state_dict.items()},
        range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph,
        constants={name: meta(value) for name, value in program.constants.items()},
        example_inputs=program.example_inputs,
    )


def _copy_program(program_file: Path, root: str, out: zipfile.ZipFile, written: set[str]) -> None:
    """The entries of a saved program, moved under ``root``; none where they would collide with the package's."""
    with zipfile.ZipFile(program_file) as program:
        moved = []
        for info in program.infolist():
            relative = info.filename.split("/", 1)[1] if "/" in info.filename else info.filename
            name = f"{root}/{relative}"
            if relative in _ARCHIVE_RECORDS and name in written:
                continue
            moved.append((info, name))
        names = {name for _, name in moved}
        if names & written or not any(name.endswith("/models/model.json") for name in names):
            return  # a torch whose package or program layout would collide: the package goes without the program
        for info, name in moved:
            _copy_entry(program, info, out, name)


def _entry(name: str) -> zipfile.ZipInfo:
    """An archive entry with a fixed date: the same package content gives the same bytes."""
    return zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))


def _copy_entry(source: zipfile.ZipFile, info: zipfile.ZipInfo, out: zipfile.ZipFile, name: str) -> None:
    entry = _entry(name)
    entry.file_size = info.file_size  # known in advance: the writer picks ZIP64 for entries past 4 GiB
    with source.open(info) as reader, out.open(entry, "w") as writer:
        shutil.copyfileobj(reader, writer, _CHUNK_BYTES)


def _write(out: zipfile.ZipFile, name: str, data: bytes) -> None:
    out.writestr(_entry(name), data)


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
