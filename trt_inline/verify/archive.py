"""Opening saved files: telling unusable ones apart, and refusing unsafe ones before anything is loaded.

``torch.export.load`` is not safe on a file from a stranger: it retries sample
inputs with ``torch.load(weights_only=False)``, loads weights and constants
marked ``use_pickle`` with ``weights_only=False``, and opaque constants with
``pickle.loads``. So before torch sees an archive, :func:`check_archive` reads
its directory and every entry that is, or is loaded as, a pickle, and refuses
the file (:class:`UnsafeArchiveError`, naming the entry) when

* an entry declares a size that is absurd for what is stored (a zip bomb), or
* a pickle calls anything outside the ``weights_only=True`` allow-list, except
  the engine objects Torch-TensorRT writes (:mod:`trt_inline.engines`):
  ``torch.classes.tensorrt.Engine`` through the TorchScript pickler or as a
  ``torch.ScriptObject``, and ``_reconstruct_trt_engine`` calls with plain data.

The pickles are read as opcodes (``pickletools``), never executed. Raw tensor
payloads (``use_pickle: false``) are skipped unread.
"""

from __future__ import annotations

import io
import json
import os
import pickletools
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
import torch.fx
from torch.export import ExportedProgram

from trt_inline import allowed_ops, compat, engines, formats
from trt_inline.errors import (
    UnsafeArchiveError,
    VerifyInputError,
    first_line,
    printable,
)
from trt_inline.formats import PACKAGE_INFO_FILE
from trt_inline.package import output_kinds_of
from trt_inline.verify.program_checks import check_loaded_program, check_serialized_programs
from trt_inline.verify.reference_io import REFERENCE_IO_FILE, ReferenceIO, decode_reference_io
from trt_inline.verify.zip_layout import ZipEntry, check_layout

__all__ = [
    "AOTI_PACKAGE",
    "EXPORTED_PROGRAM",
    "MAX_COMPRESSION_RATIO",
    "MAX_INFLATED_BYTES",
    "LoadedFile",
    "check_archive",
    "classify_file",
    "load_exported_program",
    "open_file",
]

EXPORTED_PROGRAM = formats.EXPORTED_PROGRAM
AOTI_PACKAGE = formats.AOT_INDUCTOR

# A compressed entry that claims to expand more than this (and past 64 MiB) is refused unread.
MAX_COMPRESSION_RATIO = 200
_SMALL_ENTRY = 64 << 20
# What all compressed entries together may expand to (torch itself writes entries uncompressed).
MAX_INFLATED_BYTES = 1 << 30
# Pickles larger than this are not scanned in memory; none of the pickles torch.export writes comes close.
_MAX_PICKLE_BYTES = 1 << 30

_PROGRAM_MARKERS = ("/models/model.json", "serialized_exported_program.json")
_AOTI_MARKER = f"/{formats.AOTI_FOLDER}"


def classify_file(path: str | os.PathLike[str]) -> tuple[Path, str]:
    """(path, kind) of a complete zip archive holding an ExportedProgram or an AOTInductor package.

    Anything else is a one-line :class:`VerifyInputError` saying what it is.
    """
    file = Path(path)
    if not file.exists():
        raise VerifyInputError(f"{file}: no such file")
    if file.is_dir():
        raise VerifyInputError(f"{file}: is a directory")
    if file.stat().st_size == 0:
        raise VerifyInputError(f"{file}: empty file")
    if not zipfile.is_zipfile(file) or not _zip_end_is_intact(file):
        raise VerifyInputError(f"{file}: not a zip archive (truncated, or not written by torch.export.save)")
    names = _entry_names(file)
    if any(_AOTI_MARKER in f"/{name}" for name in names):
        return file, AOTI_PACKAGE
    if not any(name.endswith(marker) for name in names for marker in _PROGRAM_MARKERS):
        if any(name.endswith("/code/__torch__.py") or name.endswith("/constants.pkl") for name in names):
            raise VerifyInputError(
                f"{file}: a TorchScript archive; verify reads ExportedProgram files and AOTInductor packages"
            )
        raise VerifyInputError(f"{file}: a zip archive without an ExportedProgram or an AOTInductor model in it")
    return file, EXPORTED_PROGRAM


def _is_program_json(name: str) -> bool:
    """Whether an entry is a serialized program torch deserializes (``models/*.json``, 2.5's single file)."""
    return name.endswith(".json") and ("/models/" in f"/{name}" or name.endswith(_PROGRAM_MARKERS[1]))


def _zip_end_is_intact(file: Path) -> bool:
    """Whether the last end-of-archive record ends exactly at the end of the file.

    A truncated ``.pt2`` can still look like a zip: it embeds zips of its own
    (``torch.save`` blobs) whose end records ``zipfile`` finds instead.
    """
    size = file.stat().st_size
    with open(file, "rb") as handle:
        handle.seek(max(0, size - (1 << 16) - 22))
        tail = handle.read()
    position = tail.rfind(b"PK\x05\x06")
    if position < 0 or len(tail) - position < 22:
        return False
    comment_length = int.from_bytes(tail[position + 20 : position + 22], "little")
    return position + 22 + comment_length == len(tail)


def _entry_names(file: Path) -> list[str]:
    try:
        with zipfile.ZipFile(file) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise VerifyInputError(f"{file}: damaged zip archive ({exc})") from exc


# ---------------------------------------------------------------------------
# Safety: sizes and pickles, checked before anything is loaded
# ---------------------------------------------------------------------------


def check_archive(file: Path, *, allow_pickle: bool = False, allow_native_code: bool = False) -> None:
    """Refuse ``file`` (:class:`UnsafeArchiveError`) if loading it could run code from it or exhaust memory.

    In order: the zip layout (:mod:`trt_inline.verify.zip_layout`: the entries
    checked are the entries torch reads), sizes, the programs' operators and
    size expressions (:func:`check_serialized_programs`), then every pickle.
    ``allow_pickle=True`` skips the pickle checks for a file from a trusted
    source; ``allow_native_code=True`` lets TensorRT engines through.
    """
    with open(file, "rb") as handle:
        layout = check_layout(handle, file.stat().st_size, str(file))
    _check_sizes(file, layout)
    with zipfile.ZipFile(file) as archive:
        infos = archive.infolist()
        if [(i.filename, i.header_offset) for i in infos] != [(e.name, e.offset) for e in layout]:
            raise UnsafeArchiveError(f"{file}: refused: Python's zip reader sees other entries than the directory")
        bad = archive.testzip()
        if bad is not None:
            raise VerifyInputError(f"{file}: damaged zip archive (bad CRC in {printable(bad)})")
        check_serialized_programs(archive, [name for name in archive.namelist() if _is_program_json(name)], file)
        if allow_pickle:
            return
        payloads = _payloads(archive)
        missing = sorted((payloads.raw | payloads.pickled) - set(archive.namelist()))
        if missing:
            raise VerifyInputError(
                f"{file}: archive entry {printable(missing[0])} is declared by a payload config but missing"
            )
        for info in infos:
            if info.filename in payloads.raw or info.is_dir() or info.file_size == 0:
                continue  # raw tensor bytes, or nothing to load (torch writes empty sample inputs as 0 bytes)
            loaded_as_pickle = _loaded_as_pickle(info.filename, payloads)
            with archive.open(info) as stream:
                for where, problem in _pickle_problems(info.filename, stream, info.file_size, loaded_as_pickle):
                    if problem == _ENGINE_PROBLEM:
                        if allow_native_code:
                            continue
                        raise UnsafeArchiveError(
                            f"{file}: archive entry {printable(where)} refused: {problem}, and deserializing a "
                            "TensorRT plan runs native code (pass --allow-native-code / allow_native_code=True "
                            "only for a file from a trusted source)"
                        )
                    raise UnsafeArchiveError(
                        f"{file}: archive entry {printable(where)} refused: {problem}; loading it could run code "
                        "from the file (pass --allow-pickle / allow_pickle=True only for a file from a trusted source)"
                    )


def _check_sizes(file: Path | str, layout: list[ZipEntry]) -> None:
    """Each entry's ratio, and the total that compressed entries expand to: no zip bombs, however split."""
    inflated = 0
    for entry in layout:
        _check_size(file, entry.name, entry.method, entry.file_size, entry.compress_size)
        if entry.method != zipfile.ZIP_STORED:
            inflated += entry.file_size
    if inflated > MAX_INFLATED_BYTES:
        raise UnsafeArchiveError(
            f"{file}: refused: its compressed entries expand to {inflated} bytes "
            f"(limit {MAX_INFLATED_BYTES}; torch writes its archives uncompressed)"
        )


def _check_size(file: Path | str, name: str, method: int, file_size: int, compress_size: int) -> None:
    if method == zipfile.ZIP_STORED and file_size != compress_size:
        raise UnsafeArchiveError(
            f"{file}: archive entry {printable(name)} refused: declares {file_size} bytes but stores {compress_size}"
        )
    ratio = file_size / max(compress_size, 1)
    if file_size > _SMALL_ENTRY and ratio > MAX_COMPRESSION_RATIO:
        raise UnsafeArchiveError(
            f"{file}: archive entry {printable(name)} refused: declares {file_size} bytes from "
            f"{compress_size} compressed (ratio {ratio:.0f}, limit {MAX_COMPRESSION_RATIO}): a zip bomb"
        )


@dataclass(frozen=True)
class _Payloads:
    """Which entries the program's payload configs declare raw tensor bytes, and which pickles."""

    raw: frozenset[str]
    pickled: frozenset[str]


def _payloads(archive: zipfile.ZipFile) -> _Payloads:
    """Entries the weight / constant configs declare as raw tensor bytes (never unpickled), and as pickles."""
    raw: set[str] = set()
    pickled: set[str] = set()
    for name in archive.namelist():
        if not name.endswith(("_weights_config.json", "_constants_config.json")):
            continue
        folder = name.rpartition("/")[0]
        try:
            config = json.loads(archive.read(name)).get("config", {})
        except (ValueError, AttributeError, UnicodeDecodeError):
            continue  # torch.export.load will refuse it; nothing of it is unpickled before that
        for meta in config.values() if isinstance(config, dict) else ():
            path_name = meta.get("path_name") if isinstance(meta, dict) else None
            if not isinstance(path_name, str):
                continue
            # Raw only if torch reads it as raw: a tensor payload without use_pickle.
            is_raw = meta.get("use_pickle") is False and path_name.startswith(("tensor_", "weight_"))
            (raw if is_raw else pickled).add(f"{folder}/{path_name}")
    return _Payloads(frozenset(raw - pickled), frozenset(pickled))


def _loaded_as_pickle(name: str, payloads: _Payloads) -> bool:
    """Whether torch.export.load may unpickle this entry, whatever its first bytes look like.

    Payloads a config marks ``use_pickle`` or as objects, and every ``.pt`` /
    ``.pkl`` entry: sample inputs, and the state dict and constants that torch
    2.5 ... 2.8 keep as ``torch.save`` files (``serialized_*.pt``,
    ``data/weights/model.pt``), all loaded with ``torch.load(weights_only=False)``.
    """
    return name in payloads.pickled or name.endswith((".pt", ".pkl"))


_ENGINE_PROBLEM = "it holds a TensorRT engine"


def _pickle_problems(name: str, stream: IO[bytes], size: int, loaded_as_pickle: bool) -> Iterator[tuple[str, str]]:
    """(where, why) for each pickle in an entry (itself, or inside a nested torch.save zip) that is refused.

    Read as a stream, never whole. An entry torch would unpickle must hold one
    pickle and nothing after it: a legacy ``torch.save`` stream is several
    pickles back to back, and torch would unpickle the ones a scan that stops
    at the first never read.
    """
    head = stream.read(4)
    stream.seek(0)
    if head == b"PK\x03\x04":
        try:
            layout = check_layout(stream, size, name)
            _check_sizes(name, layout)
            nested = zipfile.ZipFile(stream)
            infos = nested.infolist()
        except zipfile.BadZipFile:
            if loaded_as_pickle:
                yield name, "a damaged torch.save archive"
            return
        for info in infos:
            if info.filename.endswith(".pkl"):
                with nested.open(info) as inner:
                    problem = _scan_pickle(inner)
                if problem:
                    yield f"{name} ({info.filename})", problem
        return
    if loaded_as_pickle or head[:1] == b"\x80":
        if size > _MAX_PICKLE_BYTES:
            yield name, f"a pickle of {size} bytes, too large to check"
            return
        problem = _scan_pickle(stream)
        if problem:
            yield name, problem


_STRING_OPS = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
)
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_REFUSED_OPS = frozenset({"EXT1", "EXT2", "EXT4", "PERSID"})
_TORCHSCRIPT_HELPERS = frozenset(
    ("torch.jit._pickle", name)
    for name in ("build_intlist", "build_doublelist", "build_boollist", "build_tensorlist", "restore_type_tag")
)
_ENGINE_CLASS_GLOBALS = frozenset(tuple(name.rsplit(".", 1)) for name in engines.ENGINE_SCRIPT_CLASSES)
_TORCHBIND_PREFIX = "__torch__.torch.classes."
_MARK = object()
_UNKNOWN = object()


def _allowed_global(module: str, name: str) -> bool:
    if f"{module}.{name}" in compat.weights_only_globals():
        return True
    return (module, name) in _TORCHSCRIPT_HELPERS or (module, name) == ("torch", "ScriptObject")


def _is_engine_global(module: str, name: str) -> bool:
    return (module, name) in _ENGINE_CLASS_GLOBALS or (module, name) in engines.ENGINE_PICKLE_GLOBALS


def _scan_pickle(stream: IO[bytes]) -> str | None:
    """Why a pickle is refused (it reaches a callable outside the allow-list), or None; never executes it.

    Simulates the pickle machine's stack with unknown values, except for the
    strings it pushes, so that ``STACK_GLOBAL`` (module and name taken from the
    stack or the memo) is resolved like ``GLOBAL``. A TensorRT engine object
    is reported as :data:`_ENGINE_PROBLEM` (allowed with native code). The
    stream must end where the pickle does.
    """
    stack: list[Any] = []
    memo: dict[Any, Any] = {}
    engine = False
    try:
        for opcode, arg, _ in pickletools.genops(stream):
            op = opcode.name
            if op in _REFUSED_OPS:
                return f"it uses the {op} opcode"
            if op in ("GLOBAL", "INST"):
                module, _, name = str(arg).partition(" ")
                engine = engine or _is_engine_global(module, name)
                if not _allowed_global(module, name) and not _is_engine_global(module, name):
                    return f"it calls {printable(module)}.{printable(name)}"
            elif op == "STACK_GLOBAL":
                name, module = stack.pop(), stack.pop()
                if not isinstance(module, str) or not isinstance(name, str):
                    return "it imports a global whose name it computes"
                engine = engine or _is_engine_global(module, name)
                if not _allowed_global(module, name) and not _is_engine_global(module, name):
                    return f"it calls {printable(module)}.{printable(name)}"
                stack.append(_UNKNOWN)
                continue
            if op in _STRING_OPS:
                text = arg.decode("latin-1") if isinstance(arg, bytes) else str(arg)
                if text.startswith(_TORCHBIND_PREFIX):
                    if text not in engines.ENGINE_SCRIPT_CLASSES:
                        return f"it builds a {printable(text)}"
                    engine = True
                stack.append(text)
            elif op in _GET_OPS:
                stack.append(memo.get(arg, _UNKNOWN))
            elif op in _PUT_OPS:
                memo[arg] = stack[-1] if stack else _UNKNOWN
            elif op == "MEMOIZE":
                memo[len(memo)] = stack[-1] if stack else _UNKNOWN
            else:
                _apply_stack_effect(stack, opcode)
    except (ValueError, IndexError, KeyError) as exc:
        return f"not a readable pickle ({first_line(exc) or type(exc).__name__})"
    if stream.read(1):
        return "it holds more after its pickle ends (a legacy torch.save stream, or data hidden from this check)"
    return _ENGINE_PROBLEM if engine else None


def _apply_stack_effect(stack: list[Any], opcode: pickletools.OpcodeInfo) -> None:
    """Pop what ``opcode`` consumes and push unknown values for what it produces."""
    before = opcode.stack_before
    if pickletools.markobject in before:
        while stack and stack[-1] is not _MARK:
            stack.pop()
        if stack:
            stack.pop()
        below_mark = before.index(pickletools.markobject)
        del stack[len(stack) - below_mark :]
    else:
        del stack[len(stack) - len(before) :]
    for produced in opcode.stack_after:
        stack.append(_MARK if produced is pickletools.markobject else _UNKNOWN)


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


@dataclass
class LoadedFile:
    """A file opened for verification: never its native code.

    ``program`` is the ExportedProgram (for a package: the one it was compiled
    from, where the package carries it; None otherwise). ``output_kinds`` is what a
    package records about its outputs (``"tensor"``, ``"int"``, ...).
    """

    path: Path
    kind: str
    program: ExportedProgram | None
    reference: ReferenceIO | None
    output_kinds: list[str] = field(default_factory=list)
    entries: list[tuple[str, int]] = field(default_factory=list)


def open_file(
    path: str | os.PathLike[str],
    *,
    allow_pickle: bool = False,
    allow_native_code: bool = False,
    allow_ops: Sequence[str] = (),
) -> LoadedFile:
    """Classify, safety-check and load an ExportedProgram file or an AOTInductor package, with its reference I/O.

    Loading never runs code from the file: pickles are checked first
    (:func:`check_archive`), and a package's shared library is not loaded (its
    ExportedProgram, if it has one, is read from a copy of the archive without
    the AOTInductor entries); every operator its graph and its reference engines
    call must be allowed (:mod:`trt_inline.allowed_ops`, extended by
    ``allow_ops``; TensorRT engines only with ``allow_native_code``). Raises
    :class:`VerifyInputError` (one line, naming the file) for anything unusable,
    :class:`UnsafeArchiveError` for a refusal.
    """
    file, kind = classify_file(path)
    try:
        with allowed_ops.allowing(allow_ops, native_code=allow_native_code):
            return _open(file, kind, allow_pickle, allow_native_code)
    except RecursionError:
        raise VerifyInputError(f"{file}: nested too deeply to be read") from None


def _open(file: Path, kind: str, allow_pickle: bool, allow_native_code: bool) -> LoadedFile:
    import trt_inline.reference  # noqa: F401  - registers the reference engine op for deserialisation

    check_archive(file, allow_pickle=allow_pickle, allow_native_code=allow_native_code)
    with zipfile.ZipFile(file) as archive:
        entries = [(info.filename, info.file_size) for info in archive.infolist()]
    extra: dict[str, Any] = {REFERENCE_IO_FILE: "", PACKAGE_INFO_FILE: ""}
    program = None
    if kind == EXPORTED_PROGRAM:
        program = _load(file, file, extra)
    elif any(name.endswith("/models/model.json") for name, _ in entries):
        program = _load(file, _without_native_code(file), extra)
    else:
        extra.update(_extra_files(file))
    if program is not None:
        check_loaded_program(program, file)
    reference = None
    if extra.get(REFERENCE_IO_FILE):
        try:
            reference = decode_reference_io(extra[REFERENCE_IO_FILE])
        except VerifyInputError as exc:
            raise VerifyInputError(f"{file}: {exc}") from exc
    return LoadedFile(file, kind, program, reference, _kinds(extra.get(PACKAGE_INFO_FILE)), entries)


def load_exported_program(
    path: str | os.PathLike[str], *, allow_pickle: bool = False, allow_native_code: bool = False
) -> LoadedFile:
    """:func:`open_file` for a file that must hold an ExportedProgram (a package must carry its program)."""
    loaded = open_file(path, allow_pickle=allow_pickle, allow_native_code=allow_native_code)
    if loaded.program is None:
        raise VerifyInputError(
            f"{loaded.path}: an AOTInductor package that carries no ExportedProgram (its graph is native code)"
        )
    return loaded


def _load(file: Path, source: Path | io.BytesIO, extra: dict[str, Any]) -> ExportedProgram:
    try:
        return torch.export.load(source, extra_files=extra)
    except Exception as exc:
        raise VerifyInputError(
            f"{file}: cannot be loaded by torch {torch.__version__} ({type(exc).__name__}: {first_line(exc)})"
        ) from exc


def _without_native_code(file: Path) -> io.BytesIO:
    """A copy of a package without its AOTInductor entries: what ``torch.export.load`` may see of it.

    ``torch.export.load`` of a whole package would load its shared library.
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(file) as source, zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as copy:
        for info in source.infolist():
            if _AOTI_MARKER not in f"/{info.filename}":
                copy.writestr(info, source.read(info))
    buffer.seek(0)
    return buffer


def _extra_files(file: Path) -> dict[str, str]:
    """The extra files of an archive torch will not load (a package without its program), read directly."""
    with zipfile.ZipFile(file) as archive:
        return {
            name.rpartition("/")[2]: archive.read(name).decode("utf-8", errors="replace")
            for name in archive.namelist()
            if name.split("/", 1)[-1].startswith("extra/")
        }


def _kinds(text: str | None) -> list[str]:
    return [printable(kind) for kind in output_kinds_of(text)]
