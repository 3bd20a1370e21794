"""Verifying a tensor-parallel rank set (``verify --ranks N``, or a template under torchrun): one sandboxed child per
rank, collectives relayed, one report.

Each rank's process (started by ``torchrun``, or by ``trt-inline verify --ranks N``
through ``torch.distributed.run``) verifies its own file in a sandboxed child,
exactly as a single-file verify does, with two differences:

1. Before anything runs, every rank's checks are agreed on: the child reports
   ready (or its parent reports what refused the file), the parents gather
   every rank's status, manifest and collective sequence, and either every
   child runs or none does. A refused rank, a file of another rank or world
   size, or files whose collectives differ stop every rank at once.
2. The child's collectives go to its parent (:mod:`trt_inline.distributed.relay`),
   which runs them on the job's own process group.

Afterwards the parents gather every rank's report into one
(:class:`RankSetReport`): one row per rank, one exit status.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trt_inline import compat, distributed
from trt_inline.commands.arguments import given_but_not_for, options_of
from trt_inline.commands.output import print_text
from trt_inline.distributed.manifest import (
    COLLECTIVE_OPS,
    REDUCING_OPS,
    RankManifest,
    agreed_shape,
    decode_manifest,
    describe_shape,
    first_difference,
)
from trt_inline.distributed.relay import CALL_OF_OP, Allowed, RelayServer
from trt_inline.errors import RankSetError, TrtInlineError, VerifyInputError, first_line, printable
from trt_inline.verify.options import RANKS, Isolation, RankSetFields, Reference, Tolerances, Trust

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # (typing has it from 3.11)
    from typing_extensions import Unpack

__all__ = [
    "RESULT_FILE_ENV",
    "RankSetReport",
    "launch",
    "launch_from",
    "run_rank",
    "under_launcher",
    "verify_rank_set",
]

# Where `verify --ranks N` wants rank 0 to leave the set's exit status (its workers then exit 0,
# so that torch.distributed.run reports no failure of its own).
RESULT_FILE_ENV = "TRT_INLINE_RANK_SET_RESULT"


def under_launcher(path: str) -> bool:
    """Whether a verify of ``path`` is one rank's part of a rank set: a template, in a torchrun job of several ranks.

    (A plain path verifies one file, even in a process torchrun started.)
    """
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ and "{rank}" in path
    except ValueError:
        return False


@dataclass
class RankSetReport:
    """Every rank's verify report (or error) of one rank set."""

    template: str
    world_size: int
    rank: int  # of the process holding this report
    # Per rank: {"rank", "path", "status": "PASS"/"FAIL"/"UNVERIFIED"/"ERROR", "report": dict | None, "error": str}
    ranks: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        from trt_inline.verify.report import EXIT_STATUS

        # The worst rank's: an error, a failure, nothing compared, a pass.
        statuses = {row["status"] for row in self.ranks}
        worst = next(
            status for status in ("ERROR", "FAIL", "UNVERIFIED", "PASS") if status in statuses or status == "PASS"
        )
        return EXIT_STATUS[worst]

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        return {"template": self.template, "world_size": self.world_size, "ranks": self.ranks, "notes": self.notes,
                "ok": self.ok, "exit_code": self.exit_code}  # fmt: skip

    def to_text(self) -> str:
        from trt_inline.verify.report import VerifyReport

        verdict = {0: "PASS", 1: "FAIL", 2: "ERROR"}[self.exit_code]
        lines = [f"{verdict} rank set {self.template} ({self.world_size} ranks)"]
        for row in self.ranks:
            detail = row.get("error") or row.get("summary") or ""
            lines.append(f"  rank {row['rank']}  {row['status']:<10} {row['path']}" + (f"  {detail}" if detail else ""))
        lines += [f"  note: {note}" for note in self.notes]
        for row in self.ranks:
            if row.get("report") is not None:
                lines.append(f"rank {row['rank']}:")
                text = VerifyReport.from_dict(row["report"]).to_text()
                lines += [f"  {line}" for line in text.split("\n")]
        return "\n".join(lines)


def ensure_process_group(timeout: float) -> bool:
    """The job's process group (gloo: the parents carry CPU tensors), made from torchrun's variables if needed.

    Whether it was made here (and is to be destroyed here).
    """
    if dist.is_available() and dist.is_initialized():
        return False
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    return True


_MAX_EXCHANGE = 64 << 20
_STATUSES = ("PASS", "FAIL", "UNVERIFIED", "ERROR")


def exchange(mine: dict[str, Any]) -> list[dict[str, Any]]:
    """Every parent's JSON object, in rank order, over the job's process group.

    JSON, never pickles (``all_gather_object`` unpickles what other ranks send);
    lengths are gathered first, every object is bounded and must be an object.
    """
    data = json.dumps(mine).encode()
    if len(data) > _MAX_EXCHANGE:
        raise RankSetError(f"rank {dist.get_rank()}'s part of the rank set's exchange is over 64 MiB")
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64))
    longest = max(int(size.item()) for size in sizes)
    if not 0 <= longest <= _MAX_EXCHANGE:
        raise RankSetError("a rank's part of the rank set's exchange is over 64 MiB")
    padded = torch.zeros(longest, dtype=torch.uint8)
    if data:
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(gathered, padded)
    result = []
    for rank, (size, tensor) in enumerate(zip(sizes, gathered, strict=True)):
        try:
            value = json.loads(bytes(tensor[: int(size.item())].tolist()).decode())
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise RankSetError(f"rank {rank} sent a malformed part of the rank set's exchange")
        result.append(value)
    return result


class _Agreement:
    """One rank's part in agreeing that every rank may run, and the groups its child's collectives use."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.done = False
        self.groups: dict[str, Any] = {}  # recorded group name -> this job's relay group with those members
        # (call, group, reduction) -> the (dtype, shape) each of the file's collectives of that kind sends
        self.allowed: Allowed = {}
        self.relay_world: Any = None  # the relay's group of every rank (``any``)
        self.notes: list[str] = []
        self.run_id = uuid.uuid4().hex  # (rank 0's, once agreed: where ranks say that their run has ended)

    def mark_ended(self) -> None:
        """Say (in the job's store) that this rank's run is over: a collective still waiting for it gives up."""
        compat.default_store().set(f"trt_inline/verify/{self.run_id}/ended/{self.rank}", "1")

    def ended(self) -> set[int]:
        store = compat.default_store()
        return {r for r in range(self.world) if store.check([f"trt_inline/verify/{self.run_id}/ended/{r}"])}

    def child_ready(self, call: dict[str, Any], manifest_bytes: bytes) -> dict[str, Any]:
        if self.done:  # (a second agreement would pair with the other ranks' exchanges)
            raise RankSetError("the child said it was ready twice")
        refusal = printable(call["refusal"])[:2000] if isinstance(call.get("refusal"), str) else None
        manifest: RankManifest | None = None
        if refusal is None and call.get("manifest") is not True:
            refusal = (
                f"{self.path} holds no rank manifest: it was not saved by a rank set (trt_inline.save under torchrun)"
            )
        elif refusal is None:
            try:
                manifest = decode_manifest(manifest_bytes.decode(), self.path)
            except (VerifyInputError, UnicodeDecodeError) as exc:
                refusal = first_line(exc)
        if manifest is not None and (manifest.rank, manifest.world_size) != (self.rank, self.world):
            refusal = (
                f"{self.path} is rank {manifest.rank} of {manifest.world_size}, verified as rank {self.rank} of "
                f"{self.world}"
            )
        return self._agree(refusal, manifest)

    def child_ended(self, error: str) -> None:
        """The child ended before it was ready (its file refused): take part in the agreement with that."""
        if not self.done:
            try:
                self._agree(error, None)
            except RankSetError:
                pass

    def _agree(self, refusal: str | None, manifest: RankManifest | None) -> dict[str, Any]:
        self.done = True
        mine: dict[str, Any] = {
            "run_id": self.run_id,
            "refusal": refusal,
            "save_id": manifest.save_id if manifest else None,
            "collectives": [list(c.signature()) for c in manifest.collectives] if manifest else [],
            "where": [c.where for c in manifest.collectives] if manifest else [],
            "groups": {g.name: list(g.ranks) for g in manifest.groups} if manifest else {},
        }
        everyone = exchange(mine)
        self.run_id = str(everyone[0].get("run_id", ""))[:64] or self.run_id
        for rank, status in enumerate(everyone):
            if status.get("refusal") is not None:
                if rank == self.rank:
                    raise RankSetError(str(status["refusal"]))
                raise RankSetError(f"rank {rank} refused its file, so no rank ran: {printable(str(status['refusal']))}")
        member_sets = _groups_pair_up(everyone)
        _same_collectives(everyone)
        # The relay's own groups, made by every parent in one order (new_group is collective over the world):
        # the child's collectives never share a group with the parents' exchanges.
        timeout = datetime.timedelta(seconds=self.timeout)
        self.relay_world = dist.new_group(list(range(self.world)), timeout=timeout)
        relay = {members: dist.new_group(list(members), timeout=timeout) for members in member_sets}
        assert manifest is not None  # (no refusal: every rank, this one included, has a manifest)
        self.groups = {g.name: relay[g.ranks] for g in manifest.groups}
        self.allowed = {}
        for c in manifest.collectives:
            base = c.op.partition(".")[0]
            if c.group is not None and base in CALL_OF_OP:
                key = (CALL_OF_OP[base], c.group, c.reduce_op if base in REDUCING_OPS else None)
                self.allowed.setdefault(key, set()).add((c.dtype, agreed_shape(c.op, c.shape)))
        if len({status.get("save_id") for status in everyone}) > 1:
            self.notes = ["the files come from different saves (their save ids differ)"]
        return {name: (dist.get_rank(group), dist.get_world_size(group)) for name, group in self.groups.items()}


def _groups_pair_up(everyone: list[dict[str, Any]]) -> list[tuple[int, ...]]:
    """The member sets of every rank's groups, sorted; refused unless every member of a group declares it too."""
    declared = {rank: {tuple(ranks) for ranks in status["groups"].values()} for rank, status in enumerate(everyone)}
    for rank, sets in declared.items():
        for members in sorted(sets):
            if rank not in members:
                raise RankSetError(f"rank {rank}'s file calls collectives on ranks {list(members)}, without itself")
            missing = [other for other in members if members not in declared.get(other, set())]
            if missing:
                raise RankSetError(
                    f"rank {rank}'s file calls collectives on the group of ranks {list(members)}, which rank(s) "
                    f"{', '.join(map(str, missing))} do not; nothing ran"
                )
    return sorted(set().union(*declared.values()))


def _same_collectives(everyone: list[dict[str, Any]]) -> None:
    """Refuse rank files whose collectives do not pair up: the run would wait forever, or mix tensors.

    For every process group (by its members), each member's file must call the
    same collectives on it, in the same order.
    """
    per_group: dict[tuple[int, ...], dict[int, list[tuple[Any, str]]]] = {}
    for rank, status in enumerate(everyone):
        groups = {name: tuple(ranks) for name, ranks in status["groups"].items()}
        for signature, where in zip(status["collectives"] or [], status["where"] or [], strict=False):
            op, group, reduce_op, dtype, shape = signature
            if group is None:
                continue  # wait_tensor: it waits, and talks to nobody
            members = groups[group]  # (a manifest declares every group its collectives name)
            agreed = (op, reduce_op, dtype, agreed_shape(op, shape))
            per_group.setdefault(members, {}).setdefault(rank, []).append((agreed, where))
    for members, by_rank in sorted(per_group.items()):
        sequences = {rank: by_rank.get(rank, []) for rank in members}
        first_rank = members[0] if members else 0
        first = sequences.get(first_rank, [])
        for rank, theirs in sequences.items():
            index = first_difference([s for s, _ in first], [s for s, _ in theirs])
            if index == len(first) == len(theirs):
                continue

            def describe(sequence: list[tuple[Any, str]], i: int) -> str:
                if i >= len(sequence):
                    return "nothing"
                (op, reduce_op, dtype, shape), where = sequence[i]
                reduction = f" ({reduce_op})" if reduce_op else ""
                return f"{op}{reduction} of {dtype}{describe_shape(shape)} at {where}"

            raise RankSetError(
                f"the rank files call different collectives on the group of ranks {list(members)}: collective "
                f"{index} is {describe(first, index)} on rank {first_rank} and {describe(theirs, index)} on rank "
                f"{rank}; nothing ran"
            )


def verify_rank_set(
    template: str,
    *,
    reference: Reference | None = None,
    tolerances: Tolerances | None = None,
    trust: Trust | None = None,
    isolation: Isolation | None = None,
    **fields: Unpack[RankSetFields],
) -> RankSetReport:
    """Verify this rank's file of a rank set, with every other rank doing the same; every rank's report.

    Called on every rank of the job (``torchrun``), with the same arguments.
    ``template`` names the files (``"model_rank{rank}_of_{world_size}.pt2"``). The options are
    :func:`trt_inline.verify`'s groups (:mod:`trt_inline.verify.options`), or their fields as keywords, but for
    what applies to single files: a rank set runs on its embedded reference I/O, in sandboxed children (of
    ``reference`` only ``per_engine``; no ``isolate``: a :class:`TypeError`).
    """
    from trt_inline.isolation import DEFAULT_TIMEOUT, Limits
    from trt_inline.verify.options import gather
    from trt_inline.verify.verifier import VerifyRequest, report_of_child, strictly

    options = gather(RANKS, fields, reference=reference, tolerances=tolerances, trust=trust, isolation=isolation)
    timeout, memory_limit = options.isolation.timeout, options.isolation.memory_limit
    made_here = ensure_process_group(DEFAULT_TIMEOUT if timeout is None else timeout)
    try:
        path = distributed.expand_path(template)
        agreement = _Agreement(path, DEFAULT_TIMEOUT if timeout is None else timeout)
        row: dict[str, Any] = {"rank": agreement.rank, "path": printable(path)}
        try:
            if not os.path.isfile(path):
                raise VerifyInputError(f"{path}: no such file")
            limits = Limits.for_file(path, timeout, memory_limit)
            server = RelayServer(
                lambda: agreement.groups, agreement.child_ready, lambda: agreement.allowed,
                lambda: agreement.relay_world, limits.memory, agreement.ended,
            )  # fmt: skip
            tensors = {"args": None, "kwargs": None, "expected": None, "boundaries": None}
            report, _ = report_of_child(
                VerifyRequest.of(path, options), tensors, limits, where=path, files=(path,),
                isolation=options.isolation, relay=server,
            )  # fmt: skip
            report = strictly(report, options.tolerances.strict)
            if not agreement.done:
                why = "; ".join(report.problems[:1]) or "it carries no reference I/O to run"
                agreement.child_ended(f"{path} was not run ({why})")
            # (the engine that diverged on its own says most: it is this rank's own fault)
            summary = next((p for p in report.problems if "own error" in p), (report.problems or [""])[0])
            row.update(status=report.status, report=report.to_dict(), summary=summary[:300])
        except TrtInlineError as exc:
            agreement.child_ended(first_line(exc))
            row.update(status="ERROR", report=None, error=first_line(exc)[:2000])
        agreement.mark_ended()
        rows = [_checked_row(rank, other) for rank, other in enumerate(exchange(row))]
        result = RankSetReport(template, agreement.world, agreement.rank, rows, agreement.notes)
        _name_the_source(result)
        return result
    finally:
        if made_here:
            dist.destroy_process_group()  # (a gloo group left at exit aborts the interpreter)


def _checked_row(rank: int, row: dict[str, Any]) -> dict[str, Any]:
    """A rank's row as the set's report shows it: known fields only, strings escaped, a report that reads back."""
    from trt_inline.verify.report import VerifyReport

    status = row.get("status") if row.get("status") in _STATUSES else "ERROR"
    report = row.get("report") if isinstance(row.get("report"), dict) else None
    if report is not None:
        try:
            report = VerifyReport.from_dict(report).to_dict()
        except (KeyError, TypeError, ValueError):
            status, report = "ERROR", None
    checked = {"rank": rank, "path": printable(str(row.get("path", "")))[:2000], "status": status, "report": report}
    for key in ("summary", "error"):
        if isinstance(row.get(key), str):
            checked[key] = printable(row[key])[:2000]
    if status == "ERROR" and "error" not in checked:
        checked["error"] = "its report was unusable"
    return checked


# How a fallback region's nodes that call collectives are named (``all_reduce_1``, ``fused_nccl_all_gather``).
_COLLECTIVE_NAMES = tuple(op.partition("::")[2] for op in COLLECTIVE_OPS if not op.endswith("wait_tensor"))


def _name_the_source(result: RankSetReport) -> None:
    """A rank whose first divergence is a collective region, while another rank's engine diverged on its own:
    say that the other rank sent different data, and name it (the rank's own view would blame the region)."""
    diverged: dict[int, str] = {}
    for row in result.ranks:
        for boundary in (row.get("report") or {}).get("boundaries", []):
            if boundary.get("own_ok") is False:
                diverged[row["rank"]] = f"rank {row['rank']}'s {boundary['boundary'].removesuffix(' outputs')}"
                break
    for row in result.ranks:
        sources = [text for rank, text in diverged.items() if rank != row["rank"]]
        if not sources:
            continue
        report = row.get("report") or {}
        divergence = report.get("divergence")
        if not divergence or divergence.get("kind") != "fallback":
            continue
        nodes = " ".join([str(divergence.get("where", "")), *map(str, divergence.get("nodes", []))])
        if not any(name in nodes for name in _COLLECTIVE_NAMES):
            continue
        detail = (
            f"a collective in this region combines this rank's inputs, which agree with the reference, with other "
            f"ranks' data: another rank diverged ({', '.join(sources)} diverged on its own)"
        )
        divergence["detail"] = detail
        row["summary"] = f"another rank sent different data through a collective: {', '.join(sources)} diverged"


def launch(world_size: int, argv: Sequence[str], *, debug: bool = False) -> int:
    """``trt-inline verify --ranks N ...``: run the same verify on N ranks through ``torch.distributed.run``.

    ``argv`` is the verify command line without ``--ranks``. Rank 0 prints the
    set's report; the exit status is the set's.
    """
    if world_size < 2:
        raise RankSetError(f"--ranks {world_size}: a rank set has at least two ranks (one file: verify it alone)")
    if "{rank}" not in "".join(argv):
        raise RankSetError("--ranks N takes a path template with {rank} (e.g. 'model_rank{rank}_of_{world_size}.pt2')")
    with tempfile.TemporaryDirectory(prefix="trt-inline-ranks-") as folder:
        result_file = Path(folder) / "status"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
            "--no-python", sys.executable, "-m", "trt_inline", *argv,
        ]  # fmt: skip
        environment = {**os.environ, RESULT_FILE_ENV: str(result_file)}
        environment.setdefault("OMP_NUM_THREADS", "1")  # (torch.distributed.run would say it sets this)
        launched = subprocess.run(
            command, env=environment, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
        )
        errors = launched.stderr.decode(errors="replace")
        if debug:
            sys.stderr.write(errors)
        # The ranks' own one-line errors; torch.distributed.run's logs and tracebacks only with --debug.
        own = list(dict.fromkeys(line for line in errors.splitlines() if line.startswith("trt-inline ")))
        try:
            code = int(result_file.read_text().strip())
        except (OSError, ValueError):
            why = f": {own[0].partition(': ')[2]}" if own else " (--debug shows its log)"
            raise RankSetError(
                f"the {world_size} ranks ended (torch.distributed.run exit status {launched.returncode}) without a "
                f"report{why}"
            ) from None
        for line in own:
            print(printable(line), file=sys.stderr)
        return code


def finish_rank(result: RankSetReport) -> int:
    """What a rank's process exits with: the set's status, or 0 under ``--ranks`` (rank 0 left it in a file)."""
    target = os.environ.get(RESULT_FILE_ENV)
    if target:
        if result.rank == 0:
            Path(target).write_text(str(result.exit_code))
        return 0
    return result.exit_code


# ----------------------------------------------------------------------------------------------------------------
# The command line: verify --ranks N, and one rank's verify under torchrun


def launch_from(args: argparse.Namespace) -> int:
    """``trt-inline verify TEMPLATE --ranks N``: the N ranks started here, each running the rest of the command line."""
    if under_launcher(args.path) or os.environ.get(RESULT_FILE_ENV):
        raise VerifyInputError("--ranks starts the ranks itself: run it outside torchrun, or drop --ranks under it")
    _refuse_for_rank_set(args)  # (here, before N ranks start to refuse it each)
    return launch(args.ranks, _without_ranks(sys.argv[1:] if args.argv is None else args.argv), debug=args.debug)


def _without_ranks(argv: Sequence[str]) -> list[str]:
    """A verify command line without its ``--ranks N`` (each rank runs the rest)."""
    result: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
        elif item in ("--ranks", "--rank"):  # (argparse takes an unambiguous prefix too)
            skip = True
        elif not item.startswith(("--ranks=", "--rank=")):
            result.append(item)
    return result


def _refuse_for_rank_set(args: argparse.Namespace) -> None:
    """Refuse the flags that apply to single files, which a rank set (``--ranks``, or a template under torchrun)
    does not take."""
    unsupported = given_but_not_for(args, RANKS)
    if unsupported:
        raise VerifyInputError(f"a rank set is verified against its embedded reference I/O: {', '.join(unsupported)} "
                               "apply to single files")  # fmt: skip


def run_rank(args: argparse.Namespace) -> int:
    """One rank of ``torchrun ... -m trt_inline verify 'model_rank{rank}_of_{world_size}.pt2'``."""
    _refuse_for_rank_set(args)
    options = options_of(args)
    result = verify_rank_set(
        args.path,
        reference=options.reference,
        tolerances=options.tolerances,
        trust=options.trust,
        isolation=options.isolation,
    )
    if result.rank == 0:
        print_text(json.dumps(result.to_dict(), indent=2, sort_keys=True) if args.json else result.to_text())
    return finish_rank(result)
