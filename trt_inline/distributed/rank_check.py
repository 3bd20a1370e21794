"""The rank check a rank file carries in its program: ``trt_inline::check_ranks(manifest)``, called first.

``trt_inline.load`` refuses a rank file in a process it was not saved for;
``torch.export.load`` and an AOTInductor package's loader know nothing of rank
manifests, and rank 0's file runs on rank 1 without a word. So a rank file can
carry its own check: one call of :data:`RANK_CHECK_OP` as the first node of its
program, the file's rank manifest (its JSON, as in the archive) the only
argument. The operator is defined by trt-inline's ``torch.backends`` entry point
at ``import torch`` (:mod:`trt_inline.autoload`), so ``torch.export.load`` finds
it in a process that never uses trt-inline, and by ``import trt_inline`` where the
entry point did not run (:mod:`trt_inline.operators`, which holds its kernel). Each
run of the program starts with it: :func:`check_live` compares this process's rank, world size and the
members of every group the manifest names with the live process group
(:func:`~trt_inline.distributed.manifest.live_mismatch`, the comparison
``trt_inline.load`` makes) and raises :class:`RankSetError` naming both.

* Without an initialized process group it does nothing: verify's sandboxed
  child has none (and must observe nothing), and a program whose collectives
  need a group fails at its first collective anyway.
* Which files carry it (:func:`wanted`): those that need trt-inline to load
  anyway (reference engines, ``trt_inline::execute_engine``), always; the others
  (TensorRT engines, no engine) only with ``embed_rank_check=True`` at save, as
  the file then needs trt-inline installed to load.
* Overrides: ``TRT_INLINE_CHECK_RANKS=0`` lets every rank file through (this
  check and the patched ``torch_tensorrt.load``'s); ``trt_inline.load(path,
  check_ranks=False)`` returns the program without the call (:func:`drop_rank_checks`).
* ``trt-inline verify`` allows the operator and checks the call statically
  (:func:`~trt_inline.distributed.manifest.rank_check_problem`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import zipfile

import torch
import torch.fx
from torch.export import ExportedProgram

from trt_inline import compat, engines, formats
from trt_inline.distributed.manifest import (
    MANIFEST_FILE,
    RANK_CHECK_OP,
    RankManifest,
    decode_manifest,
    live_mismatch,
    rank_check_nodes,
)
from trt_inline.errors import RankSetError
from trt_inline.switches import CHECK_RANKS_ENV, checks_ranks

__all__ = [
    "CHECK_RANKS_ENV",
    "RANK_CHECK_OP",
    "check_live",
    "drop_rank_checks",
    "insert_rank_check",
    "manifest_text_of",
    "needs_trt_inline",
    "refuse_foreign_file",
    "wanted",
]

# A manifest larger than this is no manifest trt-inline wrote (65536 collectives of ~200 bytes at most).
_MAX_MANIFEST_BYTES = 64 << 20


def rank_check_op() -> compat.OpOverload:
    """The operator's overload (``torch.ops.trt_inline.check_ranks.default``)."""
    namespace, _, name = RANK_CHECK_OP.partition("::")
    return getattr(getattr(torch.ops, namespace), name).default  # type: ignore[no-any-return]


def needs_trt_inline(module: torch.nn.Module) -> bool:
    """Whether ``module`` (compiled, or a flat program's graph module) loads only with trt-inline once saved:
    it holds reference engines, or calls their operator."""
    for submodule in module.modules():
        backend = engines.backend_of(submodule)
        if backend is not None and backend.name == engines.REFERENCE_OP.backend:
            return True
        if isinstance(submodule, torch.fx.GraphModule) and any(
            engines.engine_op(node) is engines.REFERENCE_OP for node in submodule.graph.nodes
        ):
            return True
    return False


def wanted(module: torch.nn.Module, embed_rank_check: bool) -> bool:
    """Whether a rank file saved from ``module`` carries the check: always where it needs trt-inline to load
    anyway, elsewhere (TensorRT engines) only when asked, since the file then needs trt-inline too."""
    return embed_rank_check or needs_trt_inline(module)


def insert_rank_check(program: ExportedProgram, manifest: RankManifest) -> torch.fx.Node:
    """Make ``program`` check, first thing in each run, that it runs as the rank ``manifest`` describes.

    One ``call_function`` node of :data:`RANK_CHECK_OP` right after the
    placeholders, the manifest's JSON (without the save's id) its only argument (a literal: it travels
    in the program through ``torch.export.save``). It returns nothing; the
    operator is registered side-effectful, so dead-code elimination
    (``program.module()``, AOTInductor) keeps it. A call the program already
    has (a loaded rank file saved again) is replaced.

    Before / after::

        %p_up = placeholder[target=p_up]        %p_up = placeholder[target=p_up]
        %x = placeholder[target=x]              %x = placeholder[target=x]
        %mm = aten.mm(%x, %t)             ->    %check_ranks = trt_inline.check_ranks('{"format": ...}')
        ...                                     %mm = aten.mm(%x, %t)
                                                ...
    """
    graph: torch.fx.Graph = program.graph
    drop_rank_checks(program.graph_module)
    first = next(node for node in graph.nodes if node.op != "placeholder")  # (the output node at least)
    with graph.inserting_before(first):
        # Without the save's id (a fresh one each save): the same model saved twice gives the same graph.
        check_node = graph.call_function(rank_check_op(), (dataclasses.replace(manifest, save_id="").encode(),))
    check_node.meta["val"] = None  # what the operator returns
    program.graph_module.recompile()
    return check_node


def drop_rank_checks(module: torch.fx.GraphModule) -> int:
    """Remove every call of :data:`RANK_CHECK_OP` from ``module``'s graph; how many there were.

    ``trt_inline.load(path, check_ranks=False)`` returns a rank file's program without its check.

    Before / after::

        %x = placeholder[target=x]                             %x = placeholder[target=x]
        %check_ranks = trt_inline.check_ranks('{...}')   ->    %mm = aten.mm(%x, %t)
        %mm = aten.mm(%x, %t)
    """
    check_nodes = rank_check_nodes(module)
    for check_node in check_nodes:
        module.graph.erase_node(check_node)  # (it has no users: it returns nothing)
    if check_nodes:
        module.recompile()
    return len(check_nodes)


@functools.lru_cache(maxsize=8)
def _decoded(manifest_text: str) -> RankManifest:
    """A check's manifest, decoded once (the program calls the check on every run)."""
    return decode_manifest(manifest_text, f"the argument of {RANK_CHECK_OP}")


def check_live(manifest_text: str) -> None:
    """The check itself: raise :class:`RankSetError` unless this process is the rank (world size, groups) the
    manifest describes. Its caller (the operator's kernel) has found an initialized process group."""
    why = live_mismatch(_decoded(manifest_text), "the rank file running here")
    if why is not None:
        raise RankSetError(
            f"{why} (its own check, {RANK_CHECK_OP}, refused to run it; {CHECK_RANKS_ENV}=0 runs it anyway)"
        )


def manifest_text_of(path: str | os.PathLike[str]) -> str | None:
    """The rank manifest an archive carries as an extra file, or None (no manifest, or no zip archive).

    Read with ``zipfile``, not verify's strict reader: the caller is about to
    load the file as trusted anyway, and reads this one entry before it does.
    """
    # The PT2 archive (torch 2.9+): <root>/extra/NAME; torch 2.5 ... 2.8 wrote extra_files/NAME, at the top.
    current = f"/{formats.EXTRA_FOLDER}{MANIFEST_FILE}"
    older = f"extra_files/{MANIFEST_FILE}"
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n == older or (n.endswith(current) and n.count("/") == 2)]
            if not names:
                return None
            info = archive.getinfo(names[0])
            if info.file_size > _MAX_MANIFEST_BYTES:
                raise RankSetError(f"{path}: its rank manifest ({MANIFEST_FILE}) is {info.file_size} bytes")
            return archive.read(info).decode("utf-8", errors="replace")
    except (OSError, zipfile.BadZipFile):
        return None  # the loader says what is wrong with the file


def refuse_foreign_file(path: str | os.PathLike[str], override: str) -> None:
    """Raise :class:`RankSetError` if ``path`` is a rank file and this process is not the rank it was saved as
    (as ``trt_inline.load`` does); ``override`` says how to load it anyway. Nothing under ``TRT_INLINE_CHECK_RANKS=0``.
    """
    if not checks_ranks():
        return
    text = manifest_text_of(path)
    if text is None:
        return
    why = live_mismatch(decode_manifest(text, os.fspath(path)), os.fspath(path))
    if why is not None:
        raise RankSetError(f"{why} ({override})")
