"""The one strict reader of files from strangers: every byte ``verify``, ``inspect`` and ``diff`` use enters here.

torch's loader reads a ``.pt2`` file in ways a check of the same bytes cannot
follow: its zip reader matches names without case, it deserializes every entry
under ``models/`` whatever its extension, it falls back to older layouts (and to
``weights_only=False``) when the current one fails, and it writes names from
the file into Python source. So torch is never given the file. This module reads
it once, itself, and hands on only what it checked (:mod:`trt_inline.archive.canonical`
builds the program torch deserializes from that):

* the zip archive (:mod:`~trt_inline.archive.zip_layout`): one view every reader
  must agree on, names unique without case, nothing compressed;
* every entry accounted for: it is one of the entries the layout it belongs to
  defines, in one folder, named exactly as torch names it; anything else is
  refused, never skipped;
* the program document (:mod:`~trt_inline.archive.program_checks`): strict JSON
  (UTF-8, no repeated keys), checked against this torch's schema and rebuilt;
* weights and constants: raw records at offsets checked against the payload
  configs (themselves checked against the schema), mapped, never copied; or
  ``torch.save`` blobs read by :mod:`~trt_inline.archive.pickles`, never unpickled;
* sample inputs and the extra files trt-inline writes, read the same way, every
  string in them escaped where it is decoded.

Three layouts are read: the PT2 archive with raw weight records (torch 2.9+), the
PT2 archive with pickled weights (torch 2.8), and the single-folder archive of
torch 2.5 ... 2.7. A file that mixes them is refused.

Pickled payloads beyond plain tensors (tensor subclasses, opaque objects) pass
only with ``allow_pickle``, and TensorRT engines (native code) only with
``allow_native_code``: those bytes then go to torch as they are, for a file the
user trusts.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trt_inline import compat, formats, progress
from trt_inline.archive import pickles, program_checks
from trt_inline.archive.views import BytesView, FileView, View
from trt_inline.archive.zip_layout import ZipEntry, check_layout, folded, refuse_compressed
from trt_inline.errors import UnsafeArchiveError, VerifyInputError, decoded_text, printable
from trt_inline.formats import format_size
from trt_inline.module_paths import NodeOrigin

__all__ = ["Contents", "TensorRecord", "read_file"]

# Markers a PT2 archive holds besides its payload (none of it read but the byte order and format).
_PT2_MARKERS = frozenset(
    {"archive_format", "archive_version", ".data/version", "byteorder", ".data/serialization_id", ".format_version",
     ".storage_alignment"}
)  # fmt: skip
_PT2_PROGRAM = "models/model.json"
_WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
_CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
_PICKLED_WEIGHTS = "data/weights/model.pt"
_PICKLED_CONSTANTS = "data/constants/model.pt"
_SAMPLE_INPUTS = "data/sample_inputs/model.pt"
_RECORD = re.compile(r"^data/(weights|constants)/([A-Za-z0-9_]+)$")
# torch 2.5 ... 2.7: one folder of named entries, written by Python's zipfile.
_LEGACY = {
    "serialized_exported_program.json": "program",
    "serialized_state_dict.pt": "weights",
    "serialized_constants.pt": "constants",
    "serialized_example_inputs.pt": "sample inputs",
    "version": "marker",
}
_LEGACY_EXTRA = "extra_files/"
# The program document: what a model this size can hold (the engine programs of a reference backend included).
_MAX_DOCUMENT = 1 << 30
# Entry names torch writes: printable ASCII (a user's extra file may have a space in its name).
_ENTRY_NAME = re.compile(r"^[\x20-\x5b\x5d-\x7e]+$")


# One base tensor per record, as torch's loader builds it, and the config it was built from:
# ``{(view, offset): (record, base)}``, shared by every config of one payload.
Bases = dict[tuple[int, int], tuple["TensorRecord", torch.Tensor]]


@dataclass(frozen=True)
class TensorRecord:
    """A weight or constant as a payload config declares it: a strided view of a raw record, checked."""

    view: View
    offset: int
    nbytes: int
    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    storage_offset: int
    requires_grad: bool
    device: str
    is_param: bool
    # Why the record cannot hold what its config declares; raised when the data is used (inspect reads none).
    problem: str | None = None
    # The config's name (``layer.weight``) and the record's entry, for a refusal that names them.
    name: str = ""
    entry: str = ""

    def tensor(self, bases: Bases, *, meta: bool = False) -> torch.Tensor:
        """The tensor exactly as torch's loader builds it from the file (``torch.export.load``, torch 2.9+).

        Torch builds one base tensor per record, from the first config naming it (its dtype, device and
        ``requires_grad``: ``bases`` keeps it), and makes every config of the record a view of that base
        (``as_strided``), a parameter wrapping the view with its own ``requires_grad``. So a buffer sharing
        a record with a parameter that requires grad requires grad too, a view and no leaf, here as there.
        Configs of one record that disagree in dtype or device are refused (torch would build every one in
        the first one's). ``meta``: its shape and dtype only, on the meta device (nothing of the file read).
        """
        if meta:
            value = torch.empty_strided(self.sizes, self.strides, dtype=self.dtype, device="meta")
            return torch.nn.Parameter(value, requires_grad=self.requires_grad) if self.is_param else value
        if self.problem is not None:
            raise UnsafeArchiveError(self.problem)
        key = (id(self.view), self.offset)
        if key not in bases:
            bases[key] = (self, self._base())
        first, base = bases[key]
        disagree = [
            f"{what} {mine} where {first.name!r} says {theirs}"
            for what, mine, theirs in (("dtype", self.dtype, first.dtype), ("device", self.device, first.device))
            if mine != theirs
        ]
        if disagree:
            raise UnsafeArchiveError(
                f"{self.entry}: refused: {printable(self.name)!r} shares the record with {printable(first.name)!r} "
                f"and declares {'; '.join(disagree)} (torch's loader would build it as the first one declares)"
            )
        value = torch.as_strided(base, self.sizes, self.strides, self.storage_offset)
        if self.is_param:
            return torch.nn.Parameter(value, requires_grad=self.requires_grad)
        return value

    def _base(self) -> torch.Tensor:
        """The record's one tensor, as torch's loader builds it from the first config naming it: flat over the
        record (zeros of the config's shape for an empty one), ``requires_grad`` set, then moved to its device."""
        if self.nbytes == 0:
            base = torch.zeros(self.sizes, dtype=self.dtype)
        else:
            base = self.view.tensor(self.offset, self.nbytes, self.dtype)
        if self.requires_grad:
            base.requires_grad_(True)
        if self.device != "cpu":
            base = base.to(self.device)
        return base


@dataclass
class Contents:
    """What the strict reader found in a file: only checked parts, ready to hand to torch.

    ``document``: the canonical program document (None for a package that
    carries no program). ``weights`` and ``constants``: by name, a
    :class:`TensorRecord`, a tensor read from a ``torch.save`` blob, or bytes
    the user allowed to reach torch as they are (``passthrough``). ``extra``:
    the entries of the extra files trt-inline writes, read as text when first asked
    for (:meth:`extra_text`: ``inspect`` never reads the reference I/O). ``entries``: every entry's
    (escaped) name and size, for ``inspect``.
    """

    path: Path
    kind: str
    layout: str
    view: View
    document: dict[str, Any] | None = None
    weights: dict[str, Any] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    sample_inputs: tuple[Any, ...] | None = None
    extra: dict[str, ZipEntry] = field(default_factory=dict)
    entries: list[tuple[str, int]] = field(default_factory=list)
    # Names of what was left to torch as it is: pickles and engines the user allowed.
    passthrough: list[str] = field(default_factory=list)
    # Blobs torch must read itself (allowed pickles of torch 2.5 ... 2.8 weight files), by what they hold.
    blobs: dict[str, bytes] = field(default_factory=dict)
    # Extra files of others: accounted for, never read, never handed to torch.
    unread: list[str] = field(default_factory=list)
    # Read only to be described (read_file(as_data=True)): its document was not rebuilt, it must never load.
    as_data: bool = False
    # Each node's module path and source line, read from the document as data (never handed to torch).
    origins: dict[str, NodeOrigin] = field(default_factory=dict)

    def extra_text(self, name: str) -> str | None:
        """One of trt-inline's extra files as text (UTF-8), or None where the file has none."""
        entry = self.extra.get(name)
        if entry is None:
            return None
        try:
            return self.view.read(entry.data_offset, entry.file_size).decode("utf-8")
        except UnicodeDecodeError:
            raise UnsafeArchiveError(
                f"{self.path}: archive entry {printable(entry.name)}: refused: not UTF-8"
            ) from None


def read_file(
    path: str | os.PathLike[str],
    *,
    allow_pickle: bool = False,
    allow_native_code: bool = False,
    mutations: bool = False,
    as_data: bool = False,
) -> Contents:
    """Read and check ``path``; :class:`VerifyInputError` (unusable) or :class:`UnsafeArchiveError` (refused).

    ``mutations``: programs that write to their buffers are accepted (``aten::copy_`` is allowed).
    ``as_data``: the program is only to be described (what its engines need), never loaded: its document is
    kept as the strict JSON reader parsed it, not rebuilt against this torch's schema and operators (a
    cross-compiled program names operators only Torch-TensorRT registers); :mod:`~trt_inline.archive.canonical`
    refuses such contents.
    """
    file, view, entries = _archive(path)
    progress.report(f"reading the archive ({format_size(view.size)})")  # (here: check_path, in the parent, is silent)
    if view.unmapped_reason is not None:
        progress.report(f"it cannot be mapped here ({view.unmapped_reason}): its records are read instead")
    elif view.read_only:
        progress.report("it is larger than the memory the system commits to a private mapping: mapped read-only")
    refuse_compressed(entries, str(file))
    reader = _Reader(file, view, entries, allow_pickle, allow_native_code, mutations)
    reader.as_data = as_data
    contents = reader.read()
    contents.as_data = as_data
    return contents


def check_path(path: str | os.PathLike[str]) -> Path:
    """The refusals of :func:`read_file` that its zip directory alone decides (no such file, a directory, not a
    zip archive, a TorchScript archive, a ``torch.save`` file): what the calling process says at once, before a
    child starts to read the file strictly (which decides again, on the file it opens)."""
    file, view, _ = _archive(path)
    view.close()
    return file


def _archive(path: str | os.PathLike[str]) -> tuple[Path, FileView, list[ZipEntry]]:
    """The file mapped and its zip directory, or a one-line :class:`VerifyInputError` saying what the file is."""
    file = _existing(path)
    view = FileView(file)
    if view.read(0, 4) != b"PK\x03\x04" or not _ends_as_zip(view):
        raise VerifyInputError(f"{file}: not a zip archive (truncated, or not written by torch.export.save)")
    entries = check_layout(view, str(file))
    kind = _kind({folded(entry.name) for entry in entries})
    if kind == "torchscript":
        raise VerifyInputError(
            f"{file}: a TorchScript archive; verify reads ExportedProgram files and AOTInductor packages"
        )
    if kind == "torch.save":
        raise VerifyInputError(
            f"{file}: a torch.save file (tensors or a checkpoint), not a saved program: save the compiled module "
            "with trt_inline.save or torch_tensorrt.save(..., output_format='exported_program'); tensors are "
            "given to verify with --inputs/--expected"
        )
    return file, view, entries


def _kind(names: set[str]) -> str:
    """What a zip archive of these (case-folded) entry names holds: ``torchscript``, ``torch.save`` (tensors, a
    checkpoint), ``program`` (an ExportedProgram or a package), or ``zip`` (something else)."""
    if any(name.endswith(("/code/__torch__.py", "/constants.pkl")) for name in names):
        return "torchscript"
    parts = [name.split("/") for name in names]
    # (torch.save writes <root>/data.pkl, whatever the file is called: models.pt has a root named models)
    if any(part[1:] == ["data.pkl"] for part in parts):
        return "torch.save"
    if any(part[1:2] == ["models"] for part in parts) or "serialized_exported_program.json" in names:
        return "program"
    return "zip"


def is_saved_program(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a zip archive holding a saved program (read with the strict zip reader; False for
    anything it cannot read): what a tensor-file reader tells a user who gave a ``.pt2`` where tensors go."""
    try:
        view = FileView(path)
    except OSError:
        return False
    try:
        if view.size < 4 or view.read(0, 4) != b"PK\x03\x04" or not _ends_as_zip(view):
            return False
        return _kind({folded(entry.name) for entry in check_layout(view, os.fspath(path))}) == "program"
    except (VerifyInputError, UnsafeArchiveError, ValueError):
        return False
    finally:
        view.close()


def _existing(path: str | os.PathLike[str]) -> Path:
    file = Path(path)
    if not file.exists():
        raise VerifyInputError(f"{file}: no such file")
    if file.is_dir():
        raise VerifyInputError(f"{file}: is a directory")
    if file.stat().st_size == 0:
        raise VerifyInputError(f"{file}: empty file")
    return file


def _ends_as_zip(view: View) -> bool:
    """Whether an end-of-archive record ends exactly at the end of the file (a truncated file does not)."""
    tail = view.read(max(0, view.size - (1 << 16) - 22), min(view.size, (1 << 16) + 22))
    position = tail.rfind(b"PK\x05\x06")
    if position < 0 or len(tail) - position < 22:
        return False
    return position + 22 + int.from_bytes(tail[position + 20 : position + 22], "little") == len(tail)


class _Reader:
    def __init__(
        self,
        file: Path,
        view: View,
        entries: list[ZipEntry],
        allow_pickle: bool,
        allow_native_code: bool,
        mutations: bool,
    ) -> None:
        self.file = file
        self.view = view
        self.entries = entries
        self.allow_pickle = allow_pickle
        self.allow_native_code = allow_native_code
        self.mutations = mutations
        self.as_data = False
        self.by_name = {entry.name: entry for entry in entries}
        self.claimed: set[str] = set()

    # -- entries ---------------------------------------------------------------

    def refuse(self, why: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(f"{self.file}: refused: {why}")

    def where(self, name: str) -> str:
        return f"{self.file}: archive entry {printable(name)}"

    def entry(self, name: str) -> ZipEntry | None:
        """The entry named exactly ``name`` (claimed: it is accounted for), or None."""
        found = self.by_name.get(name)
        if found is not None:
            self.claimed.add(name)
        return found

    def data(self, entry: ZipEntry, limit: int = _MAX_DOCUMENT) -> bytes:
        if entry.file_size > limit:
            raise self.refuse(f"archive entry {printable(entry.name)!r} holds {entry.file_size} bytes (limit {limit})")
        return self.view.read(entry.data_offset, entry.file_size)

    def window(self, entry: ZipEntry) -> View:
        return self.view.window(entry.data_offset, entry.file_size)

    # -- the file --------------------------------------------------------------

    def read(self) -> Contents:
        for entry in self.entries:
            if not _ENTRY_NAME.match(entry.name):
                raise self.refuse(
                    f"archive entry {printable(entry.name)!r} has a name with characters torch never writes"
                )
        roots = {entry.name.partition("/")[0] for entry in self.entries if "/" in entry.name}
        top_level = [entry.name for entry in self.entries if "/" not in entry.name]
        if len(roots) == 1 and not top_level:
            contents = self._pt2(roots.pop() + "/")
        elif not roots or set(roots) == {_LEGACY_EXTRA.rstrip("/")}:
            contents = self._legacy()
        else:
            raise self.refuse("its entries are not in one folder (a PT2 archive keeps all of them under its root)")
        self._all_claimed(contents)
        contents.entries = [(printable(entry.name), entry.file_size) for entry in self.entries]
        return contents

    def _all_claimed(self, contents: Contents) -> None:
        for entry in self.entries:
            if entry.name not in self.claimed:
                raise self._foreign(entry.name, contents.layout)

    def _foreign(self, name: str, layout: str) -> UnsafeArchiveError:
        return self.refuse(
            f"archive entry {printable(name)!r} is not part of a {layout} (every entry must be one torch writes, "
            "named as torch names it)"
        )

    def _only(self, root: str, known: Callable[[str], bool], layout: str) -> None:
        """Refuse, before anything is read, an entry that is none of what ``layout`` holds."""
        for entry in self.entries:
            if not known(entry.name[len(root) :]):
                raise self._foreign(entry.name, layout)

    def _known(self, root: str, names: set[str]) -> None:
        """Refuse entries a case-blind reader would take for one of ``names`` while not named so exactly."""
        wanted = {folded(root + name): root + name for name in names}
        for entry in self.entries:
            exact = wanted.get(folded(entry.name))
            if exact is not None and exact != entry.name:
                raise self.refuse(
                    f"archive entry {printable(entry.name)!r} is named {exact!r} but for case; torch's reader matches "
                    "names without case"
                )

    def _pt2(self, root: str) -> Contents:
        names = {entry.name[len(root) :] for entry in self.entries}
        self._known(
            root,
            {*_PT2_MARKERS, _PT2_PROGRAM, _WEIGHTS_CONFIG, _CONSTANTS_CONFIG, _PICKLED_WEIGHTS, _PICKLED_CONSTANTS,
             _SAMPLE_INPUTS},
        )  # fmt: skip
        package = any(folded(name).startswith(formats.AOTI_FOLDER) for name in names)
        kind = formats.AOT_INDUCTOR if package else formats.EXPORTED_PROGRAM
        if not package and not any(folded(name).startswith("models/") for name in names):
            raise VerifyInputError(
                f"{self.file}: a zip archive without an ExportedProgram or an AOTInductor model in it"
            )
        for name in names:
            if folded(name).startswith("models/") and name != _PT2_PROGRAM:
                raise self.refuse(
                    f"archive entry {printable(root + name)!r}: torch deserializes every entry under models/ as a "
                    "program, and a file holds one, models/model.json"
                )
        pickled = any(name in names for name in (_PICKLED_WEIGHTS, _PICKLED_CONSTANTS))
        layout = "PT2 archive with pickled weights (torch 2.8)" if pickled else "PT2 archive (torch 2.9+)"
        fixed = {*_PT2_MARKERS, _PT2_PROGRAM, _SAMPLE_INPUTS}
        fixed |= {_PICKLED_WEIGHTS, _PICKLED_CONSTANTS} if pickled else {_WEIGHTS_CONFIG, _CONSTANTS_CONFIG}
        self._only(
            root,
            lambda name: (
                name in fixed
                or name.startswith((formats.EXTRA_FOLDER, formats.AOTI_FOLDER))
                or (not pickled and bool(_RECORD.match(name)))
            ),
            layout,
        )
        for name in _PT2_MARKERS:
            self.entry(root + name)
        self._check_markers(root)
        contents = Contents(self.file, kind, layout, self.view)
        for name in names:
            if name.startswith(formats.AOTI_FOLDER):
                self.claimed.add(root + name)  # native code: read only by torch's package loader, never here
            elif name.startswith(formats.EXTRA_FOLDER):
                self._extra(root + name, name[len(formats.EXTRA_FOLDER) :], contents)
        program = self.entry(root + _PT2_PROGRAM)
        if program is None:
            if not package:
                raise VerifyInputError(f"{self.file}: a zip archive without an ExportedProgram or an AOTInductor model")
            return contents
        contents.document = self._document(program, contents)
        if pickled:
            contents.weights = self._pickled_payload(root + _PICKLED_WEIGHTS, "weights", contents)
            contents.constants = self._pickled_payload(root + _PICKLED_CONSTANTS, "constants", contents)
        else:
            contents.weights = self._configured(root, "weights", _WEIGHTS_CONFIG, contents)
            contents.constants = self._configured(root, "constants", _CONSTANTS_CONFIG, contents)
        contents.sample_inputs = self._sample_inputs(root + _SAMPLE_INPUTS, contents)
        return contents

    def _check_markers(self, root: str) -> None:
        order = self.by_name.get(root + "byteorder")
        if order is not None and self.data(order, 16) != b"little":
            raise VerifyInputError(f"{self.file}: written on a big-endian machine")
        form = self.by_name.get(root + "archive_format")
        if form is not None and self.data(form, 16) != b"pt2":
            raise self.refuse(f"its archive_format says {printable(self.data(form, 16).decode('latin-1'))!r}")

    def _legacy(self) -> Contents:
        self._known("", set(_LEGACY))
        contents = Contents(self.file, formats.EXPORTED_PROGRAM, "torch 2.5 ... 2.7 archive", self.view)
        self._only("", lambda name: name in _LEGACY or name.startswith(_LEGACY_EXTRA), contents.layout)
        for entry in self.entries:
            if entry.name.startswith(_LEGACY_EXTRA):
                self._extra(entry.name, entry.name[len(_LEGACY_EXTRA) :], contents)
        self.entry("version")
        program = self.entry("serialized_exported_program.json")
        if program is None:
            raise VerifyInputError(
                f"{self.file}: a zip archive without an ExportedProgram or an AOTInductor model in it"
            )
        contents.document = self._document(program, contents)
        contents.weights = self._pickled_payload("serialized_state_dict.pt", "weights", contents)
        contents.constants = self._pickled_payload("serialized_constants.pt", "constants", contents)
        contents.sample_inputs = self._sample_inputs("serialized_example_inputs.pt", contents)
        return contents

    # -- the program -------------------------------------------------------------

    def _json(self, entry: ZipEntry) -> Any:
        """Strict JSON: UTF-8 (torch's reader would also take UTF-16), no key given twice."""

        def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            keys = [key for key, _ in pairs]
            if len(set(keys)) != len(keys):
                raise ValueError("a key given twice in one object")
            return dict(pairs)

        try:
            return json.loads(self.data(entry).decode("utf-8"), object_pairs_hook=unique)
        except RecursionError:
            raise VerifyInputError(f"{self.file}: nested too deeply to be read") from None
        except (ValueError, UnicodeDecodeError) as exc:
            # What this reader cannot read it cannot vouch for: refused, not left to torch's reader.
            raise UnsafeArchiveError(
                f"{self.where(entry.name)}: refused: not a readable program ({printable(str(exc))[:120]})"
            ) from None

    def _document(self, entry: ZipEntry, contents: Contents) -> dict[str, Any]:
        """The program document of ``entry``, checked (rebuilt from what this torch's schema defines); its nodes'
        module paths and source lines, read as data, into ``contents.origins``."""
        if self.as_data:
            document = self._json(entry)
            if not isinstance(document, dict):
                raise self.refuse(f"archive entry {printable(entry.name)!r} is not a program document")
            return document
        progress.report(f"checking its program against torch's schema ({format_size(entry.file_size)})")
        document = self._json(entry)
        canonical = program_checks.canonical_document(document, self.file, entry.name, mutations=self.mutations)
        contents.origins = program_checks.node_origins(document)  # (of a document checked first: its shape known)
        return canonical

    # -- weights and constants ---------------------------------------------------------

    def _configured(self, root: str, kind: str, config_name: str, contents: Contents) -> dict[str, Any]:
        """Weights or constants of a PT2 archive with payload configs: every record as its config declares it."""
        entry = self.entry(root + config_name)
        if entry is None:
            raise self.refuse(f"it has models/model.json but no {config_name}")
        schema = compat.export_schema()
        config = program_checks.canonical_document(
            self._json(entry), self.file, entry.name, schema_class=schema.PayloadConfig
        )["config"]
        folder = f"{root}data/{kind}/"
        result: dict[str, Any] = {}
        for name, meta in config.items():
            record_name = folder + meta["path_name"]
            record = self.entry(record_name)
            if record is None:
                raise VerifyInputError(
                    f"{self.file}: archive entry {printable(record_name)} is declared by a payload config but missing"
                )
            if meta["use_pickle"]:
                result[name] = self._pickled_record(record, meta["path_name"], contents)
            elif meta["tensor_meta"] is None:  # (torch's loader fails on it: no program to build)
                raise self.refuse(
                    f"payload config {printable(name)!r} is neither pickled nor described (no tensor_meta)"
                )
            else:
                result[name] = self._record(record, meta["tensor_meta"], meta["is_param"], name)
        for other in self.by_name:
            if other.startswith(folder) and other not in self.claimed and _RECORD.match(other[len(root) :]):
                self.claimed.add(other)  # a record no config names: never read
        return result

    def _record(self, entry: ZipEntry, meta: dict[str, Any], is_param: bool, name: str) -> TensorRecord:
        where = self.where(entry.name)
        try:
            dtype = compat.serialized_dtype(meta["dtype"])
        except (KeyError, ValueError):
            raise UnsafeArchiveError(f"{where}: refused: an unknown dtype") from None
        sizes, strides = _ints(meta["sizes"], where), _ints(meta["strides"], where)
        (offset,) = _ints([meta["storage_offset"]], where)
        device = meta["device"]["type"] + (
            f":{meta['device']['index']}" if meta["device"].get("index") is not None else ""
        )
        if len(sizes) != len(strides):
            raise UnsafeArchiveError(f"{where}: refused: a shape and strides of different lengths")
        problem = _record_problem(entry.file_size, dtype, sizes, strides, offset, device, where)
        return TensorRecord(
            self.view, entry.data_offset, entry.file_size, dtype, sizes, strides, offset,
            bool(meta["requires_grad"]), device, is_param, problem, name, where,
        )  # fmt: skip

    def _pickled_record(self, entry: ZipEntry, path_name: str, contents: Contents) -> Any:
        """A payload the config marks as pickled: a tensor read here, else an engine or object the user allowed."""
        where = self.where(entry.name)
        if path_name.startswith(("tensor_", "weight_")):
            try:
                return pickles.read_torch_save(self.window(entry), where)
            except UnsafeArchiveError as refused:
                if not self.allow_pickle:
                    raise UnsafeArchiveError(f"{refused}{_PICKLE_HINT}") from None
        else:
            self._allowed_object(entry, where)
        contents.passthrough.append(printable(entry.name))
        return _Passthrough(path_name, self.data(entry))

    def _allowed_object(self, entry: ZipEntry, where: str) -> None:
        """A custom or opaque object: a TensorRT engine with native code allowed, anything with pickles allowed."""
        if self.allow_pickle:
            return
        engine = pickles.native_engine(self.window(entry))
        if engine and self.allow_native_code:
            return
        if engine:
            raise UnsafeArchiveError(
                f"{where} refused: it holds a TensorRT engine, and deserializing a TensorRT plan runs native code "
                "(pass --allow-native-code / allow_native_code=True only for a file from a trusted source)"
            )
        raise UnsafeArchiveError(f"{where} refused: it holds a pickled object{_PICKLE_HINT}")

    def _pickled_payload(self, name: str, kind: str, contents: Contents) -> dict[str, Any]:
        """Weights or constants kept as one ``torch.save`` blob (torch 2.5 ... 2.8)."""
        entry = self.entry(name)
        if entry is None:
            raise self.refuse(f"it has a program but no {name}")
        where = self.where(name)
        try:
            value = pickles.read_torch_save(self.window(entry), where)
        except UnsafeArchiveError as refused:
            engine = pickles.native_engine(self.window(entry)) if not self.allow_pickle else False
            if not (self.allow_pickle or (engine and self.allow_native_code)):
                hint = (
                    ", and deserializing a TensorRT plan runs native code (pass --allow-native-code only for a file "
                    "from a trusted source)"
                    if engine
                    else _PICKLE_HINT
                )
                raise UnsafeArchiveError(f"{refused}{hint}") from None
            contents.passthrough.append(printable(name))
            contents.blobs[kind] = self.data(entry)
            return {}
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise UnsafeArchiveError(f"{where}: refused: {kind} that are not a mapping of names to tensors")
        return dict(value)

    def _sample_inputs(self, name: str, contents: Contents) -> tuple[Any, ...] | None:
        entry = self.entry(name)
        if entry is None or entry.file_size == 0:
            return None
        try:
            value = pickles.read_torch_save(self.window(entry), self.where(name))
        except UnsafeArchiveError as refused:
            raise UnsafeArchiveError(f"{refused}{_PICKLE_HINT}") from None
        if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict)):
            raise UnsafeArchiveError(f"{self.where(name)}: refused: sample inputs that are not (args, kwargs)")
        return value

    # -- extra files --------------------------------------------------------------------

    def _extra(self, name: str, short: str, contents: Contents) -> None:
        """An extra file: trt-inline's own are read (as UTF-8 text); any other is accounted for and left unread."""
        entry = self.entry(name)
        assert entry is not None
        if short in formats.OWN_EXTRA_FILES:
            if entry.file_size > _MAX_DOCUMENT:
                raise self.refuse(f"archive entry {printable(name)!r} holds {entry.file_size} bytes")
            contents.extra[short] = entry
        elif folded(short) in {folded(own) for own in formats.OWN_EXTRA_FILES}:
            raise self.refuse(f"archive entry {printable(name)!r} is named as trt-inline's own but for case")
        else:
            contents.unread.append(printable(name))


_PICKLE_HINT = (
    "; loading it could run code from the file (pass --allow-pickle / allow_pickle=True only for a file from a "
    "trusted source)"
)


@dataclass(frozen=True)
class _Passthrough:
    """Bytes of a payload the user allowed to reach torch as they are (a pickle, an engine)."""

    path_name: str
    data: bytes


def _ints(values: Any, where: str) -> tuple[int, ...]:
    """Integers of a serialized size, stride or offset (``{"as_int": n}``); symbolic ones refused for a payload."""
    result = []
    for value in values:
        number = value.get("as_int") if isinstance(value, dict) else None
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise UnsafeArchiveError(f"{where}: refused: a payload whose shape is not concrete non-negative integers")
        result.append(number)
    return tuple(result)


def _record_problem(
    nbytes: int,
    dtype: torch.dtype,
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
    device: str,
    where: str,
) -> str | None:
    """Why a record cannot hold the tensor its config declares (checked when its data is used), or None."""
    element = torch.empty((), dtype=dtype).element_size()
    if nbytes % element:
        return f"{where}: refused: {nbytes} bytes are not a whole number of {dtype} elements"
    numel = nbytes // element
    if device == "meta" or not all(sizes):
        return None
    reach = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides, strict=True))
    if (numel == 0 and _count(sizes)) or (numel and reach >= numel):
        return f"{where}: refused: a tensor of size {list(sizes)} reaching past its record of {numel} elements"
    return None


def _count(sizes: tuple[int, ...]) -> int:
    total = 1
    for size in sizes:
        total *= size
    return total


def decode_base64(text: str, what: str) -> BytesView:
    """Bytes an extra file carries as base64 (reference I/O), as a view for :func:`pickles.read_torch_save`."""
    try:
        return BytesView(base64.b64decode(text.encode("ascii"), validate=True))
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise VerifyInputError(f"{what} is not base64: {decoded_text(str(exc), 120)}") from exc


def passthrough_payload(value: Any) -> bytes | None:
    """The bytes of a payload left to torch as they are (an allowed engine or pickle), None for anything read here
    (:mod:`trt_inline.archive.engine_info` reads an engine's info out of them as data)."""
    return value.data if isinstance(value, _Passthrough) else None


def passthrough_loader(value: Any) -> Callable[[], Any] | None:
    """How a passed-through payload becomes what torch expects (None for anything read here)."""
    if not isinstance(value, _Passthrough):
        return None
    if value.path_name.startswith("custom_obj_"):
        return lambda: compat.load_script_object(value.data)
    if value.path_name.startswith("opaque_obj_"):
        import pickle

        return lambda: pickle.loads(value.data)
    import io

    return lambda: torch.load(io.BytesIO(value.data), weights_only=False)
