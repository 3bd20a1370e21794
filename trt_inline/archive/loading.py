"""Opening saved files for verification: read strictly, rebuilt canonically, loaded, and what runs checked.

``torch.export.load`` is not safe on a file from a stranger (it unpickles,
falls back to older layouts, evaluates strings and writes names into code), and
a check of the file's bytes cannot follow everything it does. So a file is
opened in three steps:

1. :mod:`trt_inline.archive.reader` reads every byte of it once, strictly, and
   keeps only what it checked (:class:`~trt_inline.archive.reader.Contents`);
2. :mod:`trt_inline.archive.canonical` makes that a fresh archive and has torch
   deserialize it: torch only ever loads bytes trt-inline wrote, and tensor
   data it maps from the file at checked offsets;
3. :func:`~trt_inline.archive.program_checks.check_runnable` checks the module
   ``program.module()`` returns, which is what runs, against the operator
   allow-list (:mod:`trt_inline.allowed_ops`).

A package's shared library is never loaded here (``--allow-native-code`` runs
it through :func:`trt_inline.package.load_package`); its carried program is
opened like any other.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.fx
from torch.export import ExportedProgram

from trt_inline import allowed_ops, compat, deployment, distributed, formats, operators, progress
from trt_inline.archive.canonical import Canonical, canonical_archive
from trt_inline.archive.engine_info import engine_infos, read_engine_infos
from trt_inline.archive.program_checks import check_runnable
from trt_inline.archive.reader import Contents, read_file
from trt_inline.archive.reference_io import REFERENCE_IO_FILE, ReferenceIO, decode_reference_io
from trt_inline.archive.views import FileView
from trt_inline.distributed.manifest import MANIFEST_FILE, decode_manifest
from trt_inline.engine_fields import EngineInfo
from trt_inline.errors import LoadError, RefusedOperatorError, UnsafeArchiveError, VerifyInputError, printable
from trt_inline.module_paths import ORIGIN_META, NodeOrigin
from trt_inline.package import output_kinds_of

__all__ = [
    "AOTI_PACKAGE",
    "EXPORTED_PROGRAM",
    "LoadedFile",
    "classify_file",
    "load",
    "load_exported_program",
    "open_file",
]

EXPORTED_PROGRAM = formats.EXPORTED_PROGRAM
AOTI_PACKAGE = formats.AOT_INDUCTOR


@dataclass
class LoadedFile:
    """A file opened for verification: never its native code.

    ``program`` is the ExportedProgram torch built from the canonical archive
    (for a package: the one it was compiled from, where it carries it; None
    otherwise). ``module`` is what ``program.module()`` returned once, checked:
    the one object that runs. ``output_kinds`` is what a package records about
    its outputs (``"tensor"``, ``"int"``, ...).
    """

    path: Path
    kind: str
    program: ExportedProgram | None
    reference: ReferenceIO | None
    output_kinds: list[str] = field(default_factory=list)
    entries: list[tuple[str, int]] = field(default_factory=list)
    canonical: Canonical | None = None
    layout: str = ""
    passthrough: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    # Whether the file embeds reference I/O (``reference`` is None when it was not decoded: ``inspect``).
    has_reference: bool = False
    view: FileView | None = None
    # A tensor-parallel rank file's manifest (trt_inline.distributed.manifest), as the file holds it: untrusted.
    manifest_text: str | None = None
    # Each node's module path and source line, read from the file as data (put on the nodes torch built: named).
    origins: dict[str, NodeOrigin] = field(default_factory=dict)
    _module: torch.fx.GraphModule | None = None

    def reading_ahead(self) -> contextlib.AbstractContextManager[None]:
        """Around a run of the program: its file read ahead (:meth:`FileView.reading_ahead`)."""
        return self.view.reading_ahead() if self.view is not None else contextlib.nullcontext()

    def stop_reading_ahead(self) -> None:
        """End what ``open_file(..., read_ahead=True)`` started."""
        if self.view is not None:
            self.view.stop_reading_ahead()

    @property
    def module(self) -> torch.fx.GraphModule:
        """The runnable module of the program, built and checked on first use (every later use gets the same one)."""
        if self.program is None:
            raise VerifyInputError(f"{self.path}: holds no program to run")
        if self._module is None:
            progress.report("checking what runs: the module the program builds, against the allowed operators")
            module = self.program.module()
            check_runnable(module, self.path)
            _named(module.graph, self.origins)
            self._module = module
        return self._module


def classify_file(path: str | os.PathLike[str]) -> tuple[Path, str]:
    """(path, kind) of a file holding an ExportedProgram or an AOTInductor package; else a one-line error."""
    contents = read_file(path)
    return contents.path, contents.kind


def open_file(
    path: str | os.PathLike[str],
    *,
    allow_pickle: bool = False,
    allow_native_code: bool = False,
    allow_ops: Sequence[str] = (),
    weights: bool = True,
    read_ahead: bool = False,
) -> LoadedFile:
    """Read, check and load an ExportedProgram file or an AOTInductor package, with its reference I/O.

    Never runs code from the file: see the module's steps. Every operator its
    runnable module and its reference engines call must be allowed
    (:mod:`trt_inline.allowed_ops`, extended by ``allow_ops``; TensorRT engines
    only with ``allow_native_code``). ``weights=False`` loads the program with
    its tensors on the meta device and leaves its reference I/O undecoded (``inspect``).
    ``read_ahead``: the file's pages are read into the page cache from now on,
    while the program is built (:meth:`FileView.start_reading_ahead`), until
    :meth:`LoadedFile.stop_reading_ahead`. Raises
    :class:`VerifyInputError` (one line, naming the file) for anything
    unusable, :class:`UnsafeArchiveError` for a refusal.
    """
    try:
        with allowed_ops.allowing(allow_ops, native_code=allow_native_code):
            with _engines_first(path, allow_pickle, allow_native_code):
                contents = read_file(
                    path,
                    allow_pickle=allow_pickle,
                    allow_native_code=allow_native_code,
                    mutations=allowed_ops.allows("aten::copy_"),
                )
            if allow_native_code:  # (checked before anything deserializes an engine: nothing native has run)
                _require_runnable_engines(contents)
            view = contents.view if isinstance(contents.view, FileView) else None
            if read_ahead and weights and view is not None and contents.kind == EXPORTED_PROGRAM:
                view.start_reading_ahead()
            try:
                loaded = _loaded(contents, weights)
                if loaded.program is not None and loaded.kind == EXPORTED_PROGRAM and weights:
                    _ = loaded.module  # built and checked now, while the allow-list of this call is in force
            except BaseException:
                if view is not None:
                    view.stop_reading_ahead()
                raise
            return loaded
    except RecursionError:
        raise VerifyInputError(f"{Path(path)}: nested too deeply to be read") from None


def _loaded(contents: Contents, weights: bool) -> LoadedFile:
    canonical = canonical_archive(contents) if contents.document is not None else None
    program = canonical.load(weights=weights and contents.kind == EXPORTED_PROGRAM) if canonical else None
    reference = None
    text = contents.extra_text(REFERENCE_IO_FILE) if weights else None
    if text:
        try:
            reference = decode_reference_io(text)
        except VerifyInputError as exc:
            raise VerifyInputError(f"{contents.path}: {exc}") from exc
    kinds = [printable(kind) for kind in output_kinds_of(contents.extra_text(formats.PACKAGE_INFO_FILE))]
    if program is not None:
        _named(program.graph, contents.origins)
    return LoadedFile(
        contents.path, contents.kind, program, reference, kinds, contents.entries, canonical, contents.layout,
        contents.passthrough, contents.unread, REFERENCE_IO_FILE in contents.extra,
        contents.view if isinstance(contents.view, FileView) else None, contents.extra_text(MANIFEST_FILE),
        contents.origins,
    )  # fmt: skip


def _named(graph: torch.fx.Graph, origins: dict[str, NodeOrigin]) -> None:
    """Each node of ``graph`` given the module path and source line the file records for its name
    (:data:`~trt_inline.module_paths.ORIGIN_META`, which reports read; torch's own metadata was dropped)."""
    if origins:
        for node in graph.nodes:
            origin = origins.get(node.name)
            if origin is not None:
                node.meta[ORIGIN_META] = origin


def load(
    path: str | os.PathLike[str], *, check_ranks: bool = True, device: str | torch.device | None = None
) -> ExportedProgram:
    """The ExportedProgram a ``.pt2`` file holds, its weights mapped from the file rather than read into memory.

    ``torch.export.load`` reads every weight into the process's own memory; this
    maps them (copy-on-write: the file never changes), so that loading a file of
    W bytes costs address space and page cache, not W of anonymous memory. For a
    file you trust: pickled payloads, TensorRT engines, buffer mutations and every
    registered operator are accepted, and it loads in this process. It reads the
    file with the same strict reader as ``verify`` (a file that reader refuses,
    ``torch.export.load`` may still read). Before any TensorRT engine is deserialized, what
    each needs is checked against this machine (:mod:`trt_inline.deployment`; ``TRT_INLINE_CHECK_ENGINES=0``
    lets it through). Raises :class:`~trt_inline.errors.LoadError` (one line naming the file) for a file
    that cannot load here, :class:`UnsafeArchiveError` for one the strict reader refuses.

    A rank file of a tensor-parallel save (:mod:`trt_inline.distributed`) loads
    only in a process of the rank, world size and process groups it was saved
    for (:class:`RankSetError` otherwise; ``check_ranks=False`` loads it anyway, and
    takes out the rank check its program may carry, which would refuse it at its
    first run: :mod:`trt_inline.distributed.rank_check`), and its collectives are
    pointed at this job's groups with the recorded members.

    ``device`` (``"cuda:1"``, ``"cpu"``): the program placed there, whatever device it was saved on: its
    weights go from the file's mapping to the device one tensor at a time, and the devices its nodes name
    follow (reference engines run where their inputs are).
    """
    try:
        return _load(path, check_ranks, device)
    except (UnsafeArchiveError, LoadError):
        raise
    except VerifyInputError as exc:  # (its words, as a load's error: the file is not loadable here)
        raise LoadError(str(exc)) from exc


def _load(path: str | os.PathLike[str], check_ranks: bool, device: str | torch.device | None) -> ExportedProgram:
    operators.define_all()  # (where torch's entry point failed to: a file of the reference backend calls them)
    try:
        target = None if device is None else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise VerifyInputError(f"{Path(path)}: device {device!r} is not a device ({exc})") from None
    with allowed_ops.allowing((), every_operator=True):
        with _engines_first(path, True, True):
            contents = read_file(path, allow_pickle=True, allow_native_code=True, mutations=True)
        if contents.document is None:
            raise VerifyInputError(f"{contents.path}: an AOTInductor package that carries no ExportedProgram")
        manifest_text = contents.extra_text(MANIFEST_FILE)
        manifest = decode_manifest(manifest_text, str(contents.path)) if manifest_text is not None else None
        if manifest is not None and check_ranks:
            distributed.refuse_foreign(manifest, str(contents.path))
        _require_runnable_engines(contents)
        program = canonical_archive(contents).load(weights=contents.kind == EXPORTED_PROGRAM)
        if not check_ranks:
            distributed.drop_rank_checks(program.graph_module)
        if manifest is not None and distributed.in_rank_set():
            distributed.rebind_groups(program.graph_module, manifest)
        if target is not None:
            try:
                program = compat.move_program_to(program, target)
            except (AssertionError, RuntimeError) as exc:  # torch's words for a device this process cannot use
                raise VerifyInputError(f"{contents.path}: device {device!r} is not available here ({exc})") from None
        return program


@contextlib.contextmanager
def _engines_first(path: str | os.PathLike[str], allow_pickle: bool, native_code: bool) -> Iterator[None]:
    """Around reading a file: where its program names an operator this process lacks (a cross-compiled engine's,
    which only Torch-TensorRT registers), what its engines need is said first if this machine lacks it (the
    reason it cannot load here), read from the file as data."""
    try:
        yield
    except RefusedOperatorError:
        if native_code and deployment.checks_engines():
            infos: list[EngineInfo] = []
            with contextlib.suppress(VerifyInputError, ValueError, RecursionError):
                _, infos = read_engine_infos(path, allow_pickle=allow_pickle)
            if infos:
                deployment.require_runnable(infos, deployment.this_machine(), str(Path(path)))
        raise


def _require_runnable_engines(contents: Contents) -> None:
    """Refuse, before any engine is deserialized, a file with a TensorRT engine this machine cannot run
    (:mod:`trt_inline.deployment`; ``TRT_INLINE_CHECK_ENGINES=0`` lets it through)."""
    if not deployment.checks_engines():
        return
    infos = engine_infos(contents)
    if infos:
        deployment.require_runnable(infos, deployment.this_machine(), str(contents.path))


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
