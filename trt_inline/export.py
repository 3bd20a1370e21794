"""From a compiled module to a saved ExportedProgram.

Two routes, as in ``torch_tensorrt.save``:

* ``retrace=True``: :func:`transform`, then ``torch.export.export`` of the flat
  graph with the example inputs (and ``dynamic_shapes``).
* ``retrace=False``: :func:`transform`, then :func:`exported_program_from_graph`
  builds the ExportedProgram from the flat graph as it stands, without running
  it: every ``get_attr`` becomes a lifted placeholder of its true kind.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram

from trt_inline import compat, distributed, formats, package, progress
from trt_inline.distributed import rank_check
from trt_inline.embedding import embeds_boundaries, reference_extra_files, reference_limit
from trt_inline.errors import SaveError
from trt_inline.inlining.flat_program import drop_provenance, exported_program_from_graph, in_signature_order
from trt_inline.inlining.module_state import buffers_restored
from trt_inline.inlining.passes import transform
from trt_inline.verify.checked_run import checking
from trt_inline.verify.compare import isolated_run
from trt_inline.verify.declared import output_spec_problems

__all__ = ["exported_program_from_graph", "save", "to_exported_program", "write_program"]

log = logging.getLogger(__name__)


def to_exported_program(
    module: torch.nn.Module | ExportedProgram,
    *,
    arg_inputs: Sequence[Any] | None = None,
    kwarg_inputs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    retrace: bool = True,
) -> ExportedProgram:
    """The ExportedProgram :func:`save` writes, without writing it."""
    if isinstance(module, ExportedProgram):
        return module
    if not isinstance(module, torch.fx.GraphModule):
        raise SaveError(
            f"save() takes the GraphModule returned by torch_tensorrt.dynamo.compile or "
            f"trt_inline.reference.compile (or an ExportedProgram), got {type(module).__qualname__}"
        )
    kwarg_inputs = in_signature_order(module, kwarg_inputs)  # (by name, never the caller's dict order)
    flat = transform(module)
    if not retrace:
        examples = None
        if arg_inputs is not None or kwarg_inputs:
            examples = (tuple(arg_inputs or ()), dict(kwarg_inputs or {}))
        return drop_provenance(exported_program_from_graph(flat, dynamic_shapes, examples))
    if arg_inputs is None and not kwarg_inputs:
        raise SaveError("retrace=True re-exports the inlined graph and needs arg_inputs (or use retrace=False)")
    # Size-oblivious: an engine's scalar output read back with item() is an unbacked
    # symbol that export equates with an input size; with 0/1 specialisation that
    # equality would narrow a declared Dim(min=1) to 2 in a runtime assert.
    try:
        with compat.backed_size_oblivious():
            program = compat.export_nonstrict(flat, tuple(arg_inputs or ()), kwarg_inputs or None, dynamic_shapes)
    except TypeError as exc:
        if not kwarg_inputs:
            raise
        # (torch 2.5's export passes keyword inputs on to the interpreter of a GraphModule, which takes none)
        raise SaveError(
            f"torch {torch.__version__} cannot export the flattened module with keyword inputs ({exc}): pass "
            f"{', '.join(kwarg_inputs)} in arg_inputs, in the order of its parameters"
        ) from exc
    return drop_provenance(program)


def save(
    module: torch.nn.Module | ExportedProgram,
    path: str | os.PathLike[str],
    *,
    arg_inputs: Sequence[Any] | None = None,
    kwarg_inputs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    retrace: bool = True,
    embed_reference: bool | str = True,
    reference_limit_bytes: int | None = None,
    output_format: str = formats.EXPORTED_PROGRAM,
    declared_mismatch: str = "error",
    embed_rank_check: bool = False,
) -> ExportedProgram:
    """Inline a compiled module and write it as an ExportedProgram file, or as an AOTInductor package.

    ``output_format="aot_inductor"`` compiles the same flat program with
    AOTInductor (``torch._inductor.aoti_compile_and_package``; it needs
    ``arg_inputs``) into a PT2 archive that also carries the program, its
    reference I/O and its output kinds (:mod:`trt_inline.package`).

    With sample inputs, the file also carries reference I/O: the inputs and the
    in-memory module's outputs for them, so ``trt-inline verify PATH`` can check
    the saved program against what was compiled. ``embed_reference=False`` leaves
    them out; ``embed_reference="boundaries"`` also records every engine call's
    inputs and outputs in that run, so ``trt-inline verify PATH --per-engine`` can
    say which engine or fallback region diverged. Above ``reference_limit_bytes``
    (default 64 MiB, 1 GiB with boundaries) the reference I/O is left out with a warning;
    boundary data asked for is never left out: past the limit the save raises :class:`SaveError`.

    The file is written to a temporary name beside ``path`` and renamed into
    place, so an interrupted save never leaves a truncated file where a good one
    was. Returns the ExportedProgram that was written.

    With sample inputs, the program to be written is also run on them once and every value it computes is held
    to what its graph declares (:mod:`trt_inline.verify.declared`: each engine's outputs, their rank, sizes,
    dtype, device, tensor or scalar), which is what a re-export, a package or a refit of the file reads:
    a disagreement raises :class:`SaveError` naming the engine or node, the output and both accounts, before
    anything is written; ``declared_mismatch="warn"`` writes the file anyway, with a warning saying the same.

    In a process group of several ranks (tensor parallel, :mod:`trt_inline.distributed`)
    every rank calls ``save`` with its own shard: ``path`` may be a template
    (``"model_rank{rank}_of_{world_size}.pt2"``), the ranks wait for each other
    (a bounded time, then :class:`RankSetError` naming the missing ranks), and
    each file records its rank, the world size, the groups and the collectives.
    A rank file with reference engines also checks, first thing in each run, that
    it runs as that rank (:mod:`trt_inline.distributed.rank_check`), also where
    ``torch.export.load`` loads it; ``embed_rank_check=True`` puts the same check
    into any rank file (TensorRT engines), which then needs trt-inline to load.
    """
    target = Path(distributed.expand_path(path))
    try:
        boundaries = _check_save(target, output_format, embed_reference, declared_mismatch)
        problem = None
    except SaveError as exc:
        problem = exc
    # A rank set saves collectively: every rank must be here, its checks passed, before the reference run's
    # collectives (a rank whose checks failed still arrives, so that the others fail naming it).
    failure = None if problem is None else str(problem)
    in_rank_set = distributed.in_rank_set()
    save_id = distributed.arrive("save", failure, target=str(target.resolve())) if in_rank_set else None
    if problem is not None:
        raise problem
    progress.report(f"flattening into one program for {target}")
    program = to_exported_program(
        module, arg_inputs=arg_inputs, kwarg_inputs=kwarg_inputs, dynamic_shapes=dynamic_shapes, retrace=retrace
    )
    if arg_inputs is not None or kwarg_inputs:
        refused = None
        try:
            _check_declared(program, arg_inputs or (), kwarg_inputs or {}, target, declared_mismatch)
        except SaveError as exc:
            refused = exc
        if in_rank_set:  # (every rank learns of a refusal before the reference run's collectives)
            distributed.arrive("declared", None if refused is None else str(refused))
        if refused is not None:
            raise refused
    extra_files: dict[str, str] = {}
    if embed_reference and (arg_inputs is not None or kwarg_inputs):
        progress.report("running the module on the sample inputs for the reference I/O")
        runnable = module.module() if isinstance(module, ExportedProgram) else module
        extra_files = reference_extra_files(
            runnable,
            arg_inputs,
            kwarg_inputs,
            target,
            reference_limit(reference_limit_bytes, boundaries),
            boundaries=boundaries,
        )
    if save_id is not None:
        manifest = distributed.manifest_for(program.graph_module, save_id)
        extra_files[distributed.MANIFEST_FILE] = manifest.encode()
        if rank_check.wanted(program.graph_module, embed_rank_check):
            rank_check.insert_rank_check(program, manifest)
    if output_format == formats.AOT_INDUCTOR:
        progress.report("compiling the program into an AOTInductor package")
        seconds = package.compile_package(program, target, extra_files)
        log.info("compiled %s with AOTInductor in %.1f s", target, seconds)
    else:
        write_program(program, target, extra_files)
    return program


def _check_declared(
    program: ExportedProgram, args: Sequence[Any], kwargs: dict[str, Any], target: Path, declared_mismatch: str
) -> None:
    """Run the program to be written once on the sample inputs, each value held to its declaration."""
    progress.report(f"checking what {target.name}'s graph declares against a run on the sample inputs")
    module = program.module()
    # From the buffers' state as given, put back after: the program shares them with the module being saved.
    # (No autograd graph: what a node declares does not depend on the grad mode.)
    with isolated_run(), torch.no_grad(), buffers_restored(module), checking(module, None, "at save") as check:
        module(*args, **kwargs)
    assert check is not None  # (program.module() is a GraphModule)
    engines_wrong = check.declared.summary()
    # What torch's own operators declare is torch's export's doing, not the save's: warned of (verify fails a file
    # whose declaration torch's kernel would not write).
    for warning in [*check.declared.torch_warnings(), *check.declared.forged]:
        warnings.warn(f"{target}: {warning}", RuntimeWarning, stacklevel=3)
    problems = [p for p in engines_wrong if p not in check.declared.forged] + output_spec_problems(program)
    if not problems:
        return
    text = f"{target}: " + "; ".join(problems)
    if declared_mismatch == "warn":
        warnings.warn(f"{text} (written anyway: declared_mismatch='warn')", RuntimeWarning, stacklevel=3)
        return
    raise SaveError(f"{text} (declared_mismatch='warn' writes it anyway)")


def _check_save(target: Path, output_format: str, embed_reference: bool | str, declared_mismatch: str) -> bool:
    """Refuse a save that cannot be written, before any work; whether it embeds boundary data."""
    if declared_mismatch not in ("error", "warn"):
        raise SaveError(f"declared_mismatch is 'error' or 'warn', got {declared_mismatch!r}")
    if output_format not in formats.OUTPUT_FORMATS:
        choices = ", ".join(map(repr, formats.OUTPUT_FORMATS))
        raise SaveError(f"output_format {output_format!r} is not one of {choices}")
    if target.is_dir():
        raise SaveError(f"{target} is a directory")
    if not target.parent.exists():
        raise SaveError(f"directory {target.parent} does not exist")
    if output_format == formats.AOT_INDUCTOR and target.suffix != ".pt2":
        raise SaveError(f"{target}: an AOTInductor package's name must end in .pt2")
    boundaries = embeds_boundaries(embed_reference)
    if boundaries and output_format == formats.AOT_INDUCTOR:
        raise SaveError(
            "embed_reference='boundaries' is for ExportedProgram files: a package's engines run inside its compiled "
            "code, where no engine boundary can be observed; save an exported_program file to compare engines"
        )
    return boundaries


def write_program(program: ExportedProgram, target: Path, extra_files: dict[str, str] | None = None) -> None:
    """``torch.export.save`` to ``target`` atomically (:func:`trt_inline.formats.atomic_write`).

    Tensors are written from their own memory (:func:`trt_inline.compat.streaming_tensor_writes`).
    """
    # Through a file object: the archive's root folder is then a fixed name, not the temporary one.
    progress.report(f"writing {target}")
    with formats.atomic_write(target) as tmp, open(tmp, "wb") as handle, compat.streaming_tensor_writes():
        torch.export.save(program, handle, extra_files=extra_files or None)
