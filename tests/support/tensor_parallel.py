"""Tensor-parallel models and the steps tests/distributed/test_tensor_parallel.py runs under torchrun (gloo, CPU).

``python -m torch.distributed.run --nproc-per-node N tests/support/tensor_parallel.py STEP FOLDER`` with STEP one of:

* ``save``: every model of the rank set saved as ``FOLDER/<model>_rank{rank}_of_{world_size}.pt2``, with
  each rank's compiled outputs in ``FOLDER/<model>_expected_rank{rank}.pt``; a rank set whose rank 1
  file has one weight moved (``perturbed``); rank sets whose rank 1 file sends a larger tensor
  (``oversized``, ``declared``); a save called on rank 0 only (its error and seconds in
  ``FOLDER/lonely_rank0.json``).
* ``load``: each rank loads its files in this fresh job (with other process groups made first, so that group
  names differ from the saving job's) and writes the max abs difference to the expected outputs, and what
  loading another rank's (or another world size's) file said, in ``FOLDER/load_rank{rank}.json``.
* ``swapped`` (2 ranks, with a release's ``torch_tensorrt`` shell importable): each rank loads the other rank's
  files, and then its own, through ``torch_tensorrt.load`` (the release's own, wrapped by the plugin at import)
  and through plain ``torch.export.load``, and writes what each said or how far its outputs were from this
  rank's expected ones in ``FOLDER/swapped_rank{rank}.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import trt_inline
from trt_inline import reference
from trt_inline.distributed import MANIFEST_FILE, arrive, manifest_for
from trt_inline.embedding import reference_extra_files
from trt_inline.export import to_exported_program, write_program
from trt_inline.plugin.save import save_with_reference_io

HIDDEN = 8


def _shard(rank: int, world: int, seed: int, rows: int, cols: int, dim: int) -> torch.Tensor:
    full = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    return full.chunk(world, dim)[rank].clone()


class RowColumnMLP(torch.nn.Module):
    """Megatron's MLP: column-parallel up projection, row-parallel down projection, all_reduce of the partial sums."""

    def __init__(self, rank: int, world: int, group: Any = None) -> None:
        super().__init__()
        self.up = torch.nn.Parameter(_shard(rank, world, 0, 4 * world, HIDDEN, 0))
        self.down = torch.nn.Parameter(_shard(rank, world, 1, HIDDEN, 4 * world, 1))
        self.group = dist.group.WORLD if group is None else group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = torch.relu(x @ self.up.t()) @ self.down.t()
        return torch.tanh(funcol.all_reduce(partial, "sum", self.group)) + x


class SequenceParallelMLP(torch.nn.Module):
    """Sequence parallel: all_gather the sequence shards, the MLP on the whole sequence, reduce_scatter it back."""

    def __init__(self, rank: int, world: int) -> None:
        super().__init__()
        self.up = torch.nn.Parameter(_shard(rank, world, 2, 4 * world, HIDDEN, 0))
        self.down = torch.nn.Parameter(_shard(rank, world, 3, HIDDEN, 4 * world, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        whole = funcol.all_gather_tensor(x, 0, dist.group.WORLD)
        partial = torch.nn.functional.gelu(whole @ self.up.t()) @ self.down.t()
        return funcol.reduce_scatter_tensor(partial, "sum", 0, dist.group.WORLD) * 0.5 + x


def inputs(rank: int, batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, HIDDEN, generator=torch.Generator().manual_seed(100 + rank))


def _subgroup() -> Any:
    """This rank's group of a 3-rank job split in ranks {0, 1} and {2} (both made on every rank: new_group is
    collective over the world)."""
    pair, single = dist.new_group([0, 1]), dist.new_group([2])
    return pair if dist.get_rank() < 2 else single


def _save(folder: Path, name: str, module: torch.nn.Module, x: torch.Tensor, **options: Any) -> None:
    rank = dist.get_rank()
    with torch.no_grad():
        compiled = reference.compile(
            module, (x,), dynamic_shapes=options.get("dynamic_shapes"), **options.pop("compile", {})
        )
        trt_inline.save(compiled, folder / f"{name}_rank{{rank}}_of_{{world_size}}.pt2", arg_inputs=(x,), **options)
        torch.save({"x": x, "out": compiled(x)}, folder / f"{name}_expected_rank{rank}.pt")


def _save_perturbed(folder: Path, x: torch.Tensor) -> None:
    """A rank set whose rank 1 program has a moved weight, its reference I/O that of the good model."""
    rank, world = dist.get_rank(), dist.get_world_size()
    good = RowColumnMLP(rank, world).eval()
    with torch.no_grad():
        compiled = reference.compile(good, (x,))
        save_id = arrive("perturbed")
        target = folder / f"perturbed_rank{rank}_of_{world}.pt2"
        extra = reference_extra_files(compiled, [x], None, target, 1 << 30, boundaries=True)
        if rank == 1:
            good.up.add_(0.05)
        moved = reference.compile(good, (x,))  # on every rank: its sample run's collectives pair up
        compiled = moved if rank == 1 else compiled
        program = to_exported_program(compiled, arg_inputs=(x,))
        extra[MANIFEST_FILE] = manifest_for(program.graph_module, save_id).encode()
        write_program(program, target, extra)


def _save_oversized(folder: Path, x: torch.Tensor) -> None:
    """Rank sets whose rank 1 program all_reduces twice the rows of rank 0's, as a hostile rank file would:
    ``oversized`` keeps the manifest of the honest program (the same collectives, of rank 0's size), ``declared``
    declares its own size."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = RowColumnMLP(rank, world).eval()
    with torch.no_grad():
        save_id = arrive("oversized")
        built = {}
        # Every rank compiles and runs both programs (their collectives pair up); rank 1 keeps the larger.
        for rows in (x, torch.cat([x, x])):
            compiled = reference.compile(model, (rows,))
            program = to_exported_program(compiled, arg_inputs=(rows,))
            extra = reference_extra_files(compiled, [rows], None, folder / "oversized.pt2", 1 << 30)
            built[len(rows)] = (program, extra, manifest_for(program.graph_module, save_id).encode())
    program, extra, own = built[2 * len(x)] if rank == 1 else built[len(x)]
    for variant, manifest in (("oversized", built[len(x)][2]), ("declared", own)):
        write_program(program, folder / f"{variant}_rank{rank}_of_{world}.pt2", {**extra, MANIFEST_FILE: manifest})


def _stand_in_save(
    module: torch.nn.Module,
    file_path: str,
    *,
    arg_inputs: Any = None,
    extra_files: dict[str, str] | None = None,
    retrace: bool = True,
    **_: Any,
) -> None:
    """A release's ``torch_tensorrt.save`` reduced to what the plugin's wrapper relies on (no release imports
    on a CPU): it writes the flat program, with the extra files it is given."""
    program = to_exported_program(module, arg_inputs=arg_inputs, retrace=retrace)
    write_program(program, Path(file_path), extra_files)


def _save_through_the_plugin(folder: Path, x: torch.Tensor) -> None:
    """The mlp saved by the plugin's ``torch_tensorrt.save`` wrapper around a stand-in release save."""
    rank = dist.get_rank()
    with torch.no_grad():
        compiled = reference.compile(RowColumnMLP(rank, dist.get_world_size()).eval(), (x,))
        save = save_with_reference_io(_stand_in_save)
        save(compiled, str(folder / "plugin_rank{rank}_of_{world_size}.pt2"), arg_inputs=[x])
        torch.save({"x": x, "out": compiled(x)}, folder / f"plugin_expected_rank{rank}.pt")


def _save_exported(folder: Path, x: torch.Tensor, *, embed_rank_check: bool) -> None:
    """The mlp exported as it is: no engine, so that the file loads without trt-inline (as a file of TensorRT
    engines does) and carries the rank check only when asked (``plain_checked``; ``plain``: not)."""
    rank = dist.get_rank()
    model = RowColumnMLP(rank, dist.get_world_size()).eval()
    name = "plain_checked" if embed_rank_check else "plain"
    with torch.no_grad():
        program = torch.export.export(model, (x,))
        template = folder / f"{name}_rank{{rank}}_of_{{world_size}}.pt2"
        trt_inline.save(program, template, arg_inputs=(x,), embed_rank_check=embed_rank_check)
        torch.save({"x": x, "out": model(x)}, folder / f"{name}_expected_rank{rank}.pt")


def save_step(folder: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    x = inputs(rank)
    batch = torch.export.Dim("batch", min=1, max=16)
    _save(folder, "mlp", RowColumnMLP(rank, world).eval(), x, embed_reference="boundaries")
    _save(folder, "mlp_dynamic", RowColumnMLP(rank, world).eval(), x, dynamic_shapes=({0: batch},))
    _save(folder, "mlp_in_engines", RowColumnMLP(rank, world).eval(), x, compile={"collectives_in_engines": True})
    _save(folder, "seq", SequenceParallelMLP(rank, world).eval(), x, dynamic_shapes=({0: batch},))
    _save(folder, "seq_in_engines", SequenceParallelMLP(rank, world).eval(), x,
          compile={"collectives_in_engines": True}, retrace=False)  # fmt: skip
    _save_through_the_plugin(folder, x)
    if world == 3:
        _save(folder, "subgroup", RowColumnMLP(rank, world, _subgroup()).eval(), x, embed_reference="boundaries")
    if world == 2:
        _save_perturbed(folder, x)
        _save_oversized(folder, x)
        _save_exported(folder, x, embed_rank_check=False)
        _save_exported(folder, x, embed_rank_check=True)
        os.environ["TRT_INLINE_ARRIVAL_TIMEOUT"] = "3"
        with torch.no_grad():  # compiled on every rank (its sample run's collectives pair up), saved on rank 0
            lonely = reference.compile(RowColumnMLP(rank, world).eval(), (x,))
        if rank == 0:
            start = time.monotonic()
            try:
                with torch.no_grad():
                    trt_inline.save(lonely, folder / "lonely_rank{rank}_of_{world_size}.pt2", arg_inputs=(x,))
                message = "saved"
            except trt_inline.TrtInlineError as exc:
                message = f"{type(exc).__name__}: {exc}"
            (folder / "lonely_rank0.json").write_text(json.dumps([message, time.monotonic() - start]))
        dist.barrier()


def load_step(folder: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.new_group(list(range(world)))  # a group of every rank first: later groups get other names than when saved
    if world == 3:
        _subgroup()  # the subgroup model's groups, now under other names
    found: dict[str, Any] = {}
    for model in ("mlp", "mlp_dynamic", "mlp_in_engines", "seq", "seq_in_engines", "plugin", "subgroup"):
        path = folder / f"{model}_rank{rank}_of_{world}.pt2"
        if not path.exists():
            continue
        expected = torch.load(folder / f"{model}_expected_rank{rank}.pt")
        module = trt_inline.load(path).module()
        with torch.no_grad():
            found[model] = (module(expected["x"]) - expected["out"]).abs().max().item()
        if model in ("mlp_dynamic", "seq"):
            with torch.no_grad():
                found[f"{model} batch 1"] = list(module(expected["x"][:1]).shape)
    # A trusted rank file verified in this process: its collectives run on this job's group.
    found["verify isolate=False"] = trt_inline.verify(folder / f"mlp_rank{rank}_of_{world}.pt2", isolate=False).ok
    for label, other in (("other rank", f"mlp_rank{(rank + 1) % world}_of_{world}.pt2"),
                         ("other world", f"mlp_rank{rank % 2}_of_2.pt2")):  # fmt: skip
        if label == "other world" and world == 2:
            continue
        try:
            trt_inline.load(folder / other)
            found[label] = "loaded"
        except trt_inline.TrtInlineError as exc:
            found[label] = f"{type(exc).__name__}: {exc}"
    (folder / f"load_rank{rank}.json").write_text(json.dumps(found))


def _outcome(run: Any, expected: dict[str, torch.Tensor]) -> Any:
    """The max abs difference of ``run()``'s module on this rank's input from this rank's expected output, or the
    error loading or running it raised (every rank makes the same calls: their collectives pair up)."""
    try:
        with torch.no_grad():
            return (run().module()(expected["x"]) - expected["out"]).abs().max().item()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def swapped_step(folder: Path) -> None:
    """Rank 0 loads rank 1's files and rank 1 rank 0's, then each its own, through the loaders users call."""
    import torch_tensorrt  # the release's shell: its own load, wrapped by the plugin's import hook

    rank, world = dist.get_rank(), dist.get_world_size()
    other = (rank + 1) % world
    found: dict[str, Any] = {"load wrapped": hasattr(torch_tensorrt.load, "__trt_inline_stock__")}
    stock_load = getattr(torch_tensorrt.load, "__trt_inline_stock__", torch_tensorrt.load)
    for model in ("mlp", "plain", "plain_checked"):
        expected = torch.load(folder / f"{model}_expected_rank{rank}.pt")
        for owner, label in ((other, "swapped"), (rank, "own")):
            path = str(folder / f"{model}_rank{owner}_of_{world}.pt2")
            found[f"{model} {label} torch_tensorrt.load"] = _outcome(lambda p=path: torch_tensorrt.load(p), expected)
            found[f"{model} {label} torch.export.load"] = _outcome(lambda p=path: torch.export.load(p), expected)
        if model == "plain":  # as it was: the release's own load of a file without the check runs it
            path = str(folder / f"{model}_rank{other}_of_{world}.pt2")
            found["plain swapped stock torch_tensorrt.load"] = _outcome(lambda p=path: stock_load(p), expected)
    (folder / f"swapped_rank{rank}.json").write_text(json.dumps(found))


def main() -> None:
    step, folder = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    try:
        {"save": save_step, "load": load_step, "swapped": swapped_step}[step](folder)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Done, results written: leave without the interpreter's teardown. After a few hundred collectives torch's gloo
    # sometimes aborts in its own teardown at exit ("terminate called without an active exception", SIGABRT; seen
    # in 2 of 14 runs of a job that imports only torch). A step that fails raises above and exits 1 as before.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
