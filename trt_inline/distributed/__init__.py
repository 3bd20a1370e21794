"""Tensor-parallel rank sets: ranks, process groups and manifests, in one place.

A tensor-parallel model runs as N processes under ``torch.distributed`` (one
shard each, collectives between them) and is saved as one file per rank.
trt-inline works with the process group the user's launcher (``torchrun``)
made; it never starts one of its own except for ``verify --ranks N``, which
runs ``torch.distributed.run`` itself.

* :func:`expand_path` fills ``{rank}`` and ``{world_size}`` of a path template.
* :func:`arrive` waits, a bounded time, for every rank to reach the same
  collective step (a save): a save called on some ranks only fails with the
  ranks that did not arrive, instead of waiting in the first collective of the
  reference run until gloo's or NCCL's own timeout.
* :func:`manifest_for` describes the rank set a file belongs to
  (:mod:`trt_inline.distributed.manifest`); :func:`refuse_foreign` refuses a
  file in a process group it was not saved for, :func:`rebind_groups` points
  its collectives at this job's groups.
* :mod:`trt_inline.distributed.rank_check`: the same refusal carried in the
  file's own program (``trt_inline::check_ranks``, called first), for loaders
  that know nothing of manifests (``torch.export.load``, AOTInductor).
* :mod:`trt_inline.distributed.relay` carries a sandboxed verify child's
  collectives to its parent. Verifying a rank set is a command's
  (:mod:`trt_inline.commands.ranks`): it runs verification, a floor above.

==============  ====================================================================
module          concern
==============  ====================================================================
(``__init__``)  ranks, process groups, waiting for every rank, refusing a foreign file
``manifest``    what a rank file records about its rank set, and the checks against a
                live one and against the file's own program
``rank_check``  ``trt_inline::check_ranks``, the refusal carried in a rank file's program
``relay``       a sandboxed verify child's collectives, carried out by its parent
==============  ====================================================================

The whole package sits on the core floor (isolation relays a child's collectives
through ``relay``); ``.ci/imports`` checks the floors.
"""

from __future__ import annotations

import itertools
import math
import os
import time
import uuid

import torch

from trt_inline import compat
from trt_inline.distributed.manifest import (
    MANIFEST_FILE,
    Group,
    RankManifest,
    collectives_of,
    live_group_ranks,
    live_mismatch,
    rebind_groups,
)
from trt_inline.distributed.rank_check import drop_rank_checks, insert_rank_check
from trt_inline.errors import RankSetError

__all__ = [
    "ARRIVAL_TIMEOUT_ENV",
    "MANIFEST_FILE",
    "RankManifest",
    "arrive",
    "drop_rank_checks",
    "expand_path",
    "in_rank_set",
    "insert_rank_check",
    "manifest_for",
    "rebind_groups",
    "refuse_foreign",
]

# Seconds a collective save waits for the other ranks before it fails naming them.
ARRIVAL_TIMEOUT_ENV = "TRT_INLINE_ARRIVAL_TIMEOUT"
_DEFAULT_ARRIVAL_TIMEOUT = 120.0
_POLL_SECONDS = 0.05
# One number per collective step of this process; every rank counts the same steps.
_steps = itertools.count()


def in_rank_set() -> bool:
    """Whether this process is one rank of an initialized process group of more than one rank."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def expand_path(path: str | os.PathLike[str]) -> str:
    """``path`` with ``{rank}`` and ``{world_size}`` replaced by this process's (no other braces are touched)."""
    text = os.fspath(path)
    if "{rank}" not in text and "{world_size}" not in text:
        return text
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RankSetError(f"{text}: a path template with {{rank}} needs an initialized process group (torchrun)")
    return text.replace("{rank}", str(dist.get_rank())).replace("{world_size}", str(dist.get_world_size()))


def arrival_timeout() -> float:
    raw = os.environ.get(ARRIVAL_TIMEOUT_ENV)
    try:
        seconds = float(raw) if raw else _DEFAULT_ARRIVAL_TIMEOUT
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise RankSetError(f"{ARRIVAL_TIMEOUT_ENV}={raw!r} is not a number of seconds above 0")
    return seconds


def arrive(what: str, failure: str | None = None, timeout: float | None = None, *, target: str | None = None) -> str:
    """Wait until every rank has reached this step; its id, shared by the rank set.

    Every rank calls it once per step, ``failure`` saying why it cannot go on
    (its own checks failed): then every other rank raises :class:`RankSetError`
    naming it, so that no rank enters a collective the failed one will never
    join, and the ranks stay in step for the next one. Each rank leaves its
    status under a key of the default group's store and counts itself in one
    counter; past ``timeout`` seconds (:data:`ARRIVAL_TIMEOUT_ENV`) it marks the
    step abandoned (a rank arriving later fails at once instead of waiting alone)
    and raises naming the ranks that did not arrive. ``target``: the file this
    rank writes, which must be no other rank's (a path without ``{rank}`` would
    leave one rank's shard, the last renamed into place).
    """
    import torch.distributed as dist

    timeout = arrival_timeout() if timeout is None else timeout
    rank, world = dist.get_rank(), dist.get_world_size()
    store = compat.default_store()
    prefix = f"trt_inline/{what}/{next(_steps)}"
    if rank == 0:
        store.set(f"{prefix}/id", uuid.uuid4().hex)
    store.set(f"{prefix}/{rank}", failure or "")
    store.set(f"{prefix}/target/{rank}", target or "")
    store.add(f"{prefix}/count", 1)
    deadline = time.monotonic() + timeout
    while True:
        # (checked first, also once every rank is counted: a rank counted in after another gave up is alone)
        if store.check([f"{prefix}/abandoned"]):
            raise RankSetError(f"{what}: another rank stopped waiting for this one (it called {what} earlier)")
        if store.add(f"{prefix}/count", 0) >= world and store.check([f"{prefix}/id"]):
            break
        if time.monotonic() > deadline:
            store.set(f"{prefix}/abandoned", str(rank))
            missing = [r for r in range(world) if not store.check([f"{prefix}/{r}"])]
            raise RankSetError(
                f"{what} on rank {rank} of {world}: rank(s) {', '.join(map(str, missing)) or '?'} did not call it "
                f"within {timeout:g} s; every rank of the process group must call it (each saves its own shard), "
                "e.g. not under `if rank == 0`"
            )
        time.sleep(_POLL_SECONDS)
    for other in range(world):
        reason = bytes(store.get(f"{prefix}/{other}")).decode(errors="replace")
        if reason and other != rank:
            raise RankSetError(f"{what} on rank {rank} of {world}: rank {other} could not go on ({reason})")
        theirs = bytes(store.get(f"{prefix}/target/{other}")).decode(errors="replace")
        if target and other != rank and theirs == target:
            raise RankSetError(
                f"{what} on rank {rank} of {world}: rank {other} writes {target} too; give each rank its own file "
                "(a path template: 'model_rank{rank}_of_{world_size}.pt2')"
            )
    return bytes(store.get(f"{prefix}/id")).decode()


def manifest_for(module: torch.nn.Module, save_id: str) -> RankManifest:
    """This rank's manifest for ``module`` (compiled or flat): rank, world, backend, groups, collectives."""
    import torch.distributed as dist

    collectives = collectives_of(module)
    live = live_group_ranks()
    names = sorted({c.group for c in collectives if c.group is not None})
    unknown = [name for name in names if name not in live]
    if unknown:
        raise RankSetError(
            f"rank {dist.get_rank()}: the module's collectives name process group(s) {', '.join(map(repr, unknown))}, "
            "which this process does not have"
        )
    return RankManifest(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        backend=str(dist.get_backend()),
        save_id=save_id,
        groups=[Group(name, live[name]) for name in names],
        collectives=collectives,
    )


def refuse_foreign(manifest: RankManifest, path: str) -> None:
    """Raise :class:`RankSetError` if this process is not the rank (world size, groups) ``path`` was saved as."""
    why = live_mismatch(manifest, path)
    if why is not None:
        raise RankSetError(f"{why} (trt_inline.load(..., check_ranks=False) loads it anyway)")
