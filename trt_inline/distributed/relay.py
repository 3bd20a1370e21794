"""A sandboxed verify child's collectives, carried out by its parent.

A rank set is verified by one parent process per rank (under ``torchrun``),
each opening its rank's file in a sandboxed child (:mod:`trt_inline.isolation.child`).
The child has no network: its collectives go over a pair of pipes to its
parent, which runs them on the job's own process group and sends the result
back. The child's process group is a :class:`RelayGroup` registered under the
group names the file's collectives use.

Wire format, both ways: one JSON line, then the number of payload bytes it
announces (``nbytes``). The parent trusts nothing it reads: calls, dtypes,
shapes and sizes are checked before a tensor is built from the bytes, and a
tensor is all it ever builds.

Calls: ``ready`` (the child's checks are done; the parent agrees with every
rank before anything runs), ``any`` (whether any rank says yes: every rank
must take the same branches that run collectives), and the collectives
``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``.

The parent runs a child's collectives on process groups made for the relay
alone (never the group the parents coordinate on, whose collectives the child
could otherwise pair its own with), and only those its agreed manifest lists,
of the dtype and shape it lists. Before each, the parents of the group exchange
what their children asked for (a fixed-size descriptor: the call, dtype,
reduction, root, shape and splits) on that group, and run the collective only
where every member asks for the same one: a library given tensors of different
sizes on different ranks may abort the process that runs it (gloo does), and
these are the trusted parents.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trt_inline import compat
from trt_inline.distributed.manifest import describe_shape, is_count, shape_fits
from trt_inline.errors import RankSetError, first_line, printable

__all__ = [
    "CALL_FD_ENV", "CALL_OF_OP", "REPLY_FD_ENV", "Allowed", "RelayClient", "RelayGroup", "RelayServer", "client",
    "decode_call", "encode_message",
]  # fmt: skip

CALL_FD_ENV = "TRT_INLINE_CALL_FD"
REPLY_FD_ENV = "TRT_INLINE_REPLY_FD"
_MAX_HEADER = 1 << 16
_POLL_SECONDS = 0.01
_GRACE_SECONDS = 2.0
_MAX_DIMS = 16
DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
        torch.int8, torch.uint8, torch.bool,
    )
}  # fmt: skip
# The collective call a manifest's operator makes, by the operator's base name.
CALL_OF_OP = {
    "_c10d_functional::all_reduce": "all_reduce",
    "_c10d_functional::all_gather_into_tensor": "all_gather",
    "_c10d_functional::reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional::all_to_all_single": "all_to_all",
    "_c10d_functional::broadcast": "broadcast",
}
COLLECTIVE_CALLS = tuple(CALL_OF_OP.values())
REDUCE_OPS = ("sum", "avg", "product", "min", "max")
# What an agreed manifest lets a rank's child send: (call, group, reduction) -> {(dtype, shape)}; a shape's
# symbols (and the rows of an all_to_all, "*") stand for any size.
Allowed = dict[tuple[str, str, str | None], set[tuple[str, tuple[int | str, ...]]]]


def encode_message(header: dict[str, Any], payload: bytes = b"") -> bytes:
    return json.dumps({**header, "nbytes": len(payload)}).encode() + b"\n" + payload


def _read_exactly(fd: int, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = os.read(fd, min(count - len(data), 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the pipe")
        data += chunk
    return bytes(data)


def _read_line(fd: int) -> bytes:
    data = bytearray()
    while not data.endswith(b"\n"):
        if len(data) > _MAX_HEADER:
            raise ValueError("header line too long")
        chunk = os.read(fd, 1)
        if not chunk:
            raise EOFError("the other end closed the pipe")
        data += chunk
    return bytes(data[:-1])


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous()
    return ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size()) if flat.numel() else b""


def _tensor_from(payload: bytes, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    if len(payload) != math.prod(shape) * dtype.itemsize:
        raise RankSetError(f"the parent sent {len(payload)} bytes for a {dtype} tensor of shape {shape}")
    if not payload:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(shape).clone()


# ---------------------------------------------------------------------------
# The child's side
# ---------------------------------------------------------------------------


class RelayClient:
    """The child's end of the pipes: one call at a time, each answered before the next."""

    def __init__(self, call_fd: int, reply_fd: int) -> None:
        self._call_fd, self._reply_fd = call_fd, reply_fd
        self._lock = threading.Lock()

    def call(self, header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        with self._lock:
            message = memoryview(encode_message(header, payload))
            while message:
                message = message[os.write(self._call_fd, message[: 1 << 20]) :]
            reply = json.loads(_read_line(self._reply_fd))
            data = _read_exactly(self._reply_fd, int(reply.get("nbytes", 0)))
        if not reply.get("ok", False):
            raise RankSetError(str(reply.get("message", "the rank set stopped")))
        return reply, data


_client: RelayClient | None = None
_registered: list[RelayGroup] = []


def client() -> RelayClient | None:
    """This child's relay, where it verifies one rank of a rank set; None otherwise."""
    global _client
    if _client is None and CALL_FD_ENV in os.environ and REPLY_FD_ENV in os.environ:
        _client = RelayClient(int(os.environ[CALL_FD_ENV]), int(os.environ[REPLY_FD_ENV]))
    return _client


class _Done(compat.c10d_class("Work")):  # type: ignore[misc]
    """Work already completed (the parent answered before the call returned)."""

    def __init__(self, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: Any = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        return self._future


def _reduce_name(options: Any) -> str:
    op = getattr(options.reduceOp, "op", options.reduceOp)
    return str(getattr(op, "name", op)).lower()


class RelayGroup(compat.c10d_class("ProcessGroup")):  # type: ignore[misc]
    """A process group whose collectives the parent runs (what functional collectives call in the child)."""

    def __init__(self, relay: RelayClient, name: str, rank: int, size: int) -> None:
        super().__init__(rank, size)  # (the store-less constructor of Python-defined groups)
        self._relay, self._name = relay, name

    def getBackendName(self) -> str:
        return "trt_inline_relay"

    def _call(self, call: str, tensor: torch.Tensor, out: torch.Tensor, **fields: Any) -> _Done:
        header = {"call": call, "group": self._name, "dtype": str(tensor.dtype).removeprefix("torch."),
                  "shape": list(tensor.shape), **fields}  # fmt: skip
        _, data = self._relay.call(header, _tensor_bytes(tensor))
        result = _tensor_from(data, out.dtype, list(out.shape))
        with torch.no_grad():
            out.copy_(result)
        return _Done([out])

    def allreduce(self, tensors: list[torch.Tensor], options: Any) -> _Done:  # type: ignore[override]
        for tensor in tensors:
            self._call("all_reduce", tensor, tensor, reduce=_reduce_name(options))
        return _Done(tensors)

    def allgather_into_tensor_coalesced(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], options: Any
    ) -> _Done:
        for out, tensor in zip(outputs, inputs, strict=True):
            self._call("all_gather", tensor, out)
        return _Done(outputs)

    def reduce_scatter_tensor_coalesced(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], options: Any
    ) -> _Done:
        for out, tensor in zip(outputs, inputs, strict=True):
            self._call("reduce_scatter", tensor, out, reduce=_reduce_name(options))
        return _Done(outputs)

    def alltoall_base(  # type: ignore[override]
        self, out: torch.Tensor, tensor: torch.Tensor, out_splits: list[int], in_splits: list[int], options: Any
    ) -> _Done:
        return self._call("all_to_all", tensor, out, out_splits=list(out_splits), in_splits=list(in_splits))

    def broadcast(self, tensors: list[torch.Tensor], options: Any) -> _Done:  # type: ignore[override]
        for tensor in tensors:
            self._call("broadcast", tensor, tensor, root=int(options.rootRank))
        return _Done(tensors)


def checkpoint(manifest_text: str | None, refusal: str | None = None) -> None:
    """In a rank-set child: say that the checks are done (or what refused the file) and wait for every rank.

    Returns once every rank is ready, with a :class:`RelayGroup` registered
    under each group name the parent gives; raises :class:`RankSetError` (naming
    the rank that refused, or why the set does not fit) otherwise. Outside a
    rank-set child it does nothing.
    """
    relay = client()
    if relay is None:
        return
    # The manifest travels as the call's payload (a large model's does not fit a header).
    manifest = b"" if manifest_text is None else manifest_text.encode()
    reply, _ = relay.call({"call": "ready", "manifest": manifest_text is not None, "refusal": refusal}, manifest)
    groups = reply.get("groups")
    if not isinstance(groups, dict):
        raise RankSetError("the parent gave no process groups")
    for name, (rank, size) in groups.items():
        group = RelayGroup(relay, str(name), int(rank), int(size))
        _registered.append(group)  # the registry holds groups weakly
        compat.register_group(str(name), group)


def any_rank(value: bool, *, in_process: bool = False) -> bool:
    """Whether ``value`` holds on any rank: in a rank-set child, or (``in_process``) in a process of a rank set
    verifying its own trusted rank file; ``value`` itself elsewhere."""
    relay = client()
    if relay is None and in_process:
        flag = torch.tensor([1 if value else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
    if relay is None:
        return value
    reply, _ = relay.call({"call": "any", "value": bool(value)})
    return bool(reply.get("value"))


# ---------------------------------------------------------------------------
# The parent's side
# ---------------------------------------------------------------------------


def decode_call(header: bytes, limit: int) -> dict[str, Any]:
    """A call header from the child, checked (untrusted): a dict with the fields its call needs.

    Raises :class:`RankSetError` for anything else, whatever the header holds.
    """
    try:
        return _checked_call(json.loads(header), limit)
    except RankSetError:
        raise
    except Exception as exc:  # (deep nesting, odd numbers: nothing of the child's may raise anything else here)
        raise RankSetError(f"the child sent a call that is not JSON ({type(exc).__name__})") from None


def _checked_call(call: Any, limit: int) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("call"), str):
        raise RankSetError("the child sent a malformed call")
    nbytes = call.get("nbytes")
    if not is_count(nbytes, limit):
        raise RankSetError(f"the child announced {printable(repr(nbytes))[:40]} bytes, past its memory limit")
    if call["call"] in COLLECTIVE_CALLS:
        dtype, shape = call.get("dtype"), call.get("shape")
        if dtype not in DTYPES:
            raise RankSetError(f"the child sent a tensor of dtype {printable(repr(dtype))[:40]}")
        if not (isinstance(shape, list) and len(shape) <= _MAX_DIMS and all(is_count(d, 1 << 40) for d in shape)):
            raise RankSetError("the child sent a tensor with a malformed shape")
        if math.prod(shape) * DTYPES[dtype].itemsize != nbytes:
            raise RankSetError("the child sent a tensor whose size does not match its shape")
        if call.get("reduce", "sum") not in REDUCE_OPS:
            raise RankSetError(f"the child asked for reduction {printable(repr(call.get('reduce')))[:40]}")
        if not isinstance(call.get("group"), str):
            raise RankSetError("the child named no process group")
    elif nbytes and call["call"] != "ready":  # (ready carries the manifest)
        raise RankSetError("the child sent bytes with a call that takes none")
    return call


class RelayServer:
    """The parent's end: reads the child's calls, answers them with this job's process groups.

    A small state machine over the two pipes, driven by the parent's loop
    (:func:`trt_inline.isolation.process.supervise`, through :class:`trt_inline.isolation.pipes.Pipes`):
    it reads a call only when no reply is
    pending (:meth:`wants_input`), reads a header of at most 64 KiB and then
    exactly the payload it announces, and writes its reply without blocking
    (:meth:`write_to`), so that a child that stops reading cannot stall the
    parent past its time limit. After a malformed call it answers once with the
    error and reads nothing more.

    ``agree(ready_call, manifest_bytes)`` is called once, for the child's ``ready``: it returns
    the groups as {name: (group rank, size)} (or raises :class:`RankSetError`),
    and ``groups()`` then gives the parent's group per name, ``allowed()`` the
    calls the agreed manifest lets this rank make (:data:`Allowed`),
    ``world()`` the group ``any`` runs on. ``limit`` bounds every payload and result.
    ``ended()``: the ranks whose run has ended (a collective waiting on one of them is given up).
    """

    def __init__(
        self,
        groups: Callable[[], dict[str, Any]],
        agree: Callable[[dict[str, Any], bytes], dict[str, Any]],
        allowed: Callable[[], Allowed],
        world: Callable[[], Any],
        limit: int,
        ended: Callable[[], set[int]] = set,
    ) -> None:
        self._groups, self._agree, self._allowed, self._world = groups, agree, allowed, world
        self._ended = ended
        self.limit = limit
        self.stopped = False
        self._header = bytearray()
        self._leftover = b""
        self._call: dict[str, Any] | None = None
        self._payload: bytearray | None = None
        self._filled = 0
        self._reply: list[memoryview] = []
        self._calls: dict[str, int] = {}  # collectives run per group name (to name the one ranks disagree on)

    def wants_input(self) -> bool:
        return not self.stopped and not self._reply

    def wants_output(self) -> bool:
        return bool(self._reply)

    def read_from(self, fd: int) -> None:
        """Read what the child sent (``fd`` is readable and :meth:`wants_input`)."""
        if self._payload is not None:
            view = memoryview(self._payload)[self._filled : self._filled + (1 << 20)]
            count = os.readv(fd, [view])
            if not count:
                self.stopped = True
                return
            self._filled += count
            if self._filled == len(self._payload):
                self._complete()
            return
        chunk = os.read(fd, 4096)
        if not chunk:
            self.stopped = True
            return
        self._take(chunk)

    def pump(self) -> None:
        """Go on with bytes read past the last call, once its reply is out (a child that sent ahead)."""
        if self._leftover and self.wants_input():
            chunk, self._leftover = self._leftover, b""
            self._take(chunk)

    def _take(self, chunk: bytes) -> None:
        if self._payload is not None:  # (leftover bytes of a payload)
            take = chunk[: len(self._payload) - self._filled]
            self._payload[self._filled : self._filled + len(take)] = take
            self._filled += len(take)
            self._leftover = chunk[len(take) :]
            if self._filled == len(self._payload):
                self._complete()
            return
        line, newline, rest = chunk.partition(b"\n")
        self._header += line
        if len(self._header) > _MAX_HEADER:
            self._fail("the child sent a call header longer than 64 KiB")
            return
        if not newline:
            return
        header = bytes(self._header)
        self._header.clear()
        try:
            call = decode_call(header, self.limit)
        except RankSetError as exc:
            self._fail(str(exc))
            return
        self._call, self._payload, self._filled = call, bytearray(call["nbytes"]), 0
        self._leftover = rest
        if not call["nbytes"]:
            self._complete()
        else:
            self.pump()

    def _complete(self) -> None:
        assert self._call is not None and self._payload is not None
        call, payload = self._call, self._payload
        self._call, self._payload, self._filled = None, None, 0
        header, data = self.answer(call, payload)
        self._reply = [memoryview(json.dumps({**header, "nbytes": len(data)}).encode() + b"\n"), memoryview(data)]

    def _fail(self, message: str) -> None:
        self._reply = [memoryview(encode_message({"ok": False, "message": message}))]
        self.stopped = True

    def write_to(self, fd: int) -> None:
        """Write what fits of the pending reply (``fd`` is non-blocking)."""
        while self._reply:
            try:
                count = os.write(fd, self._reply[0][: 1 << 20])
            except BlockingIOError:
                return
            self._reply[0] = self._reply[0][count:]
            if not len(self._reply[0]):
                self._reply.pop(0)

    def answer(self, call: dict[str, Any], payload: bytearray) -> tuple[dict[str, Any], bytes]:
        """The reply to one checked call: (header, bytes). Any failure is an error reply, and the relay stops."""
        try:
            kind = call["call"]
            if kind == "ready":
                return {"ok": True, "groups": self._agree(call, bytes(payload))}, b""
            if kind == "any":
                world = self._world()
                if world is None:
                    raise RankSetError("the child asked the ranks a question before every rank was ready")
                flag = torch.tensor([1 if call.get("value") is True else 0])
                self._finish(dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=world, async_op=True), world)
                return {"ok": True, "value": bool(flag.item())}, b""
            if kind in COLLECTIVE_CALLS:
                return {"ok": True}, _tensor_bytes(self._collective(call, payload))
            raise RankSetError(f"the child asked for {printable(kind)[:40]!r}, which is not a call")
        except Exception as exc:
            self.stopped = True
            message = str(exc) if isinstance(exc, RankSetError) else f"{type(exc).__name__}: {first_line(exc)}"
            return {"ok": False, "message": printable(message)[:2000]}, b""

    def _collective(self, call: dict[str, Any], payload: bytearray) -> torch.Tensor:
        kind, name, reduce = call["call"], call["group"], call.get("reduce", "sum")
        group = self._groups().get(name)
        if group is None:
            raise RankSetError(f"the child named process group {printable(name)[:40]!r}, not one of the file's")
        what = f"{kind}" + (f" ({reduce})" if kind in ("all_reduce", "reduce_scatter") else "")
        listed = self._allowed().get((kind, name, reduce if kind in ("all_reduce", "reduce_scatter") else None))
        if listed is None:
            raise RankSetError(
                f"the child called {kind} ({reduce}) on group {printable(name)[:40]!r}, which its file's manifest does "
                "not list"
            )
        sent = f"{call['dtype']}{describe_shape(call['shape'])}"
        # (A reference engine's collectives are listed as "unknown": its steps record no shapes. The parents'
        # exchange below still holds them to what the other ranks send.)
        fits = (
            dtype == "unknown" or (dtype == call["dtype"] and shape_fits(shape, call["shape"]))
            for dtype, shape in listed
        )
        if not any(fits):
            declared = " or ".join(sorted(f"{dtype}{describe_shape(shape)}" for dtype, shape in listed))
            raise RankSetError(
                f"its program called {what} on group {printable(name)[:40]!r} with {sent}, where its file's manifest "
                f"declares {printable(declared)[:200]}"
            )
        size = dist.get_world_size(group)
        _check_arguments(call, size, self.limit)  # (before the exchange: every rank that agrees runs it)
        index = self._calls[name] = self._calls.get(name, -1) + 1
        self._same_on_every_rank(call, group, f"collective {index} on group {printable(name)[:40]!r}")
        dtype = DTYPES[call["dtype"]]
        tensor = (
            torch.frombuffer(payload, dtype=torch.uint8).view(dtype).reshape(call["shape"])
            if payload
            else torch.zeros(call["shape"], dtype=dtype)
        )
        op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
              "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[reduce]  # fmt: skip
        if kind == "all_reduce":
            self._finish(dist.all_reduce(tensor, op=op, group=group, async_op=True), group)
            result = tensor
        elif kind == "all_gather":
            result = torch.zeros(
                (tensor.shape[0] * size, *tensor.shape[1:]) if tensor.dim() else (size,), dtype=tensor.dtype
            )
            self._finish(dist.all_gather_into_tensor(result, tensor, group=group, async_op=True), group)
        elif kind == "reduce_scatter":
            # As an all_reduce and this rank's chunk: gloo's reduce_scatter never says it completed until waited on.
            self._finish(dist.all_reduce(tensor, op=op, group=group, async_op=True), group)
            result = tensor.chunk(size)[dist.get_rank(group)].clone()
        elif kind == "all_to_all":
            result = self._all_to_all(call, tensor, size, group)
        else:  # broadcast (its root checked before the exchange)
            source = dist.get_global_rank(group, call["root"])
            self._finish(dist.broadcast(tensor, src=source, group=group, async_op=True), group)
            result = tensor
        if reduce == "avg":
            result = result / size if result.is_floating_point() else result // size
        return result

    def _same_on_every_rank(self, call: dict[str, Any], group: Any, which: str) -> None:
        """Exchange this call's descriptor with the group's other parents; raise :class:`RankSetError` naming the
        rank and what it sends unless every member asks for the same collective, of tensors that fit together.

        The descriptors are of one fixed size on every rank, so the exchange itself cannot mismatch.
        """
        size = dist.get_world_size(group)
        mine = _descriptor(call, size)
        everyone = torch.zeros(size * mine.numel(), dtype=torch.int64)
        self._finish(dist.all_gather_into_tensor(everyone, mine, group=group, async_op=True), group)
        rows = [_decoded(row, size) for row in everyone.view(size, -1).tolist()]
        ranks = dist.get_process_group_ranks(group)
        problem = _disagreement(rows, ranks)
        if problem is not None:
            raise RankSetError(f"the ranks disagree on {which}: {problem}; nothing was sent")

    def _finish(self, work: Any, group: Any) -> None:
        """Wait for a collective, unless a rank it needs has ended its run (then it never will: stop at once).

        A member that ended may have sent its part just before: it gets a short grace.
        """
        members = set(dist.get_process_group_ranks(group))
        given_up: float | None = None
        while not work.is_completed():
            if given_up is None and members & self._ended():
                given_up = time.monotonic() + _GRACE_SECONDS
            if given_up is not None and time.monotonic() > given_up:
                ended = ", ".join(map(str, sorted(members & self._ended())))
                raise RankSetError(f"rank(s) {ended} ended their run before this collective: it cannot complete")
            time.sleep(_POLL_SECONDS)
        work.wait()

    def _all_to_all(self, call: dict[str, Any], tensor: torch.Tensor, size: int, group: Any) -> torch.Tensor:
        out_splits, in_splits = call.get("out_splits"), call.get("in_splits")  # (checked before the exchange)
        rows = tensor.shape[0] if tensor.dim() else 0
        out_rows = sum(out_splits) if out_splits else rows
        result = torch.zeros((out_rows, *tensor.shape[1:]), dtype=tensor.dtype)
        work = dist.all_to_all_single(result, tensor, out_splits or None, in_splits or None, group=group, async_op=True)
        self._finish(work, group)
        return result


# ---------------------------------------------------------------------------
# What the parents of a group exchange before each collective
# ---------------------------------------------------------------------------


def _check_arguments(call: dict[str, Any], size: int, limit: int) -> None:
    """A call's arguments for a group of ``size``: raise :class:`RankSetError` unless the exchange can carry them and
    the collective can run them within ``limit`` bytes (a root and splits that are ints in range, not bools or
    floats; a tensor its group can split; a result within the limit)."""
    kind, shape = call["call"], call["shape"]
    if kind == "all_gather" and call["nbytes"] * size > limit:
        raise RankSetError("the child asked to gather more than its memory limit")
    if kind == "reduce_scatter" and (not shape or shape[0] % size):
        raise RankSetError("the child asked to reduce-scatter a tensor its group cannot split")
    if call["call"] == "broadcast":
        root = call.get("root")
        if type(root) is not int or not is_count(root, size - 1):
            raise RankSetError("the child asked to broadcast from a rank outside its group")
    if call["call"] == "all_to_all":
        if not shape:
            raise RankSetError("the child asked to all_to_all a tensor without rows")
        rows = shape[0]
        splits = [call.get("out_splits"), call.get("in_splits")]
        for given in splits:
            if not (isinstance(given, list) and all(type(n) is int and is_count(n, 1 << 40) for n in given)):
                raise RankSetError("the child sent malformed splits")
            if given and len(given) != size:
                raise RankSetError("the child sent splits for another group size")
        if splits[1] and sum(splits[1]) != rows:
            raise RankSetError("the child sent input splits that do not cover its tensor")
        row_bytes = call["nbytes"] // rows if rows else 0
        if (sum(splits[0]) if splits[0] else rows) * row_bytes > limit:
            raise RankSetError("the child asked to receive more than its memory limit")


_DTYPE_NAMES = tuple(DTYPES)


def _descriptor(call: dict[str, Any], size: int) -> torch.Tensor:
    """A checked call as int64s of one length for a group of ``size``: call, dtype, reduction, root, rank,
    16 dimensions, then the input and output splits (``size`` each; -1 where not given)."""
    shape = list(call["shape"])
    root = call["root"] if call["call"] == "broadcast" else -1  # (checked before: an int in range)
    reduces = call["call"] in ("all_reduce", "reduce_scatter")  # (others carry no reduction to compare)
    values = [
        COLLECTIVE_CALLS.index(call["call"]), _DTYPE_NAMES.index(call["dtype"]),
        REDUCE_OPS.index(call.get("reduce", "sum") if reduces else "sum"), root, len(shape),
        *shape, *[-1] * (_MAX_DIMS - len(shape)),
    ]  # fmt: skip
    for key in ("in_splits", "out_splits"):
        splits = call.get(key) if call["call"] == "all_to_all" else None
        values += list(splits) if splits and len(splits) == size else [-1] * size
    return torch.tensor(values, dtype=torch.int64)


@dataclass(frozen=True)
class _Asked:
    call: str
    dtype: str
    reduce: str
    root: int
    shape: tuple[int, ...]
    in_splits: tuple[int, ...] | None
    out_splits: tuple[int, ...] | None

    def describe(self) -> str:
        reduce = f" ({self.reduce})" if self.call in ("all_reduce", "reduce_scatter") else ""
        root = f" from group rank {self.root}" if self.call == "broadcast" else ""
        return f"{self.call}{reduce}{root} of {self.dtype}{describe_shape(self.shape)}"


def _decoded(row: list[int], size: int) -> _Asked:
    """A descriptor back (from a trusted parent: every value is in range)."""
    ndim = row[4]
    splits = row[5 + _MAX_DIMS :]
    ins, outs = splits[:size], splits[size:]
    return _Asked(
        COLLECTIVE_CALLS[row[0]], _DTYPE_NAMES[row[1]], REDUCE_OPS[row[2]], row[3], tuple(row[5 : 5 + ndim]),
        None if ins[0] < 0 else tuple(ins), None if outs[0] < 0 else tuple(outs),
    )  # fmt: skip


def _disagreement(rows: list[_Asked], ranks: list[int]) -> str | None:
    """Why the members' calls (``rows``, in group order; ``ranks``: their global ranks) would not pair up in one
    collective; None where they do."""
    first = rows[0]
    for rank, asked in zip(ranks, rows, strict=True):
        kind = (asked.call, asked.dtype, asked.reduce, asked.root)
        same = kind == (first.call, first.dtype, first.reduce, first.root)
        if first.call == "all_to_all":
            same = same and asked.shape[1:] == first.shape[1:] and len(asked.shape) == len(first.shape) > 0
        else:
            same = same and asked.shape == first.shape
        if not same:
            return f"rank {rank} sends {asked.describe()} where rank {ranks[0]} sends {first.describe()}"
    if first.call != "all_to_all":
        return None
    size = len(rows)
    sends, receives = [], []
    for rank, asked in zip(ranks, rows, strict=True):
        rows_sent = asked.shape[0]
        if (asked.in_splits is None or asked.out_splits is None) and rows_sent % size:
            return f"rank {rank} sends {rows_sent} rows to all_to_all without splits, which {size} ranks cannot share"
        sends.append(asked.in_splits or (rows_sent // size,) * size)
        receives.append(asked.out_splits or (rows_sent // size,) * size)
    for i, rank in enumerate(ranks):
        for j, other in enumerate(ranks):
            if receives[i][j] != sends[j][i]:
                return (
                    f"rank {rank} expects {receives[i][j]} rows from rank {other} in all_to_all, which sends it "
                    f"{sends[j][i]}"
                )
    return None
