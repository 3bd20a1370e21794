"""A sandboxed verify child's collectives, carried out by its parent.

A rank set is verified by one parent process per rank (under ``torchrun``),
each opening its rank's file in a sandboxed child (:mod:`trt_inline.verify.isolation`).
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
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from trt_inline import compat
from trt_inline.errors import RankSetError, printable

__all__ = ["CALL_FD_ENV", "REPLY_FD_ENV", "RelayClient", "RelayGroup", "client", "decode_call", "encode_message"]

CALL_FD_ENV = "TRT_INLINE_CALL_FD"
REPLY_FD_ENV = "TRT_INLINE_REPLY_FD"
_MAX_HEADER = 1 << 16
_MAX_DIMS = 16
DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
        torch.int8, torch.uint8, torch.bool,
    )
}  # fmt: skip
COLLECTIVE_CALLS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
REDUCE_OPS = ("sum", "avg", "product", "min", "max")


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
    if not payload:
        return torch.empty(shape, dtype=dtype)  # zero elements: nothing uninitialized
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

    def _allgather_base(self, out: torch.Tensor, tensor: torch.Tensor, options: Any) -> _Done:  # type: ignore[override]
        return self._call("all_gather", tensor, out)

    def reduce_scatter_tensor_coalesced(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], options: Any
    ) -> _Done:
        for out, tensor in zip(outputs, inputs, strict=True):
            self._call("reduce_scatter", tensor, out, reduce=_reduce_name(options))
        return _Done(outputs)

    def _reduce_scatter_base(self, out: torch.Tensor, tensor: torch.Tensor, options: Any) -> _Done:  # type: ignore[override]
        return self._call("reduce_scatter", tensor, out, reduce=_reduce_name(options))

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
    reply, _ = relay.call({"call": "ready", "manifest": manifest_text, "refusal": refusal})
    groups = reply.get("groups")
    if not isinstance(groups, dict):
        raise RankSetError("the parent gave no process groups")
    for name, (rank, size) in groups.items():
        group = RelayGroup(relay, str(name), int(rank), int(size))
        _registered.append(group)  # the registry holds groups weakly
        compat.register_group(str(name), group)


def any_rank(value: bool) -> bool:
    """Whether ``value`` holds on any rank (in a rank-set child); ``value`` itself elsewhere."""
    relay = client()
    if relay is None:
        return value
    reply, _ = relay.call({"call": "any", "value": bool(value)})
    return bool(reply.get("value"))


# ---------------------------------------------------------------------------
# The parent's side
# ---------------------------------------------------------------------------


def decode_call(header: bytes, limit: int) -> dict[str, Any]:
    """A call header from the child, checked (untrusted): a dict with the fields its call needs."""
    try:
        call = json.loads(header)
    except ValueError:
        raise RankSetError("the child sent a call that is not JSON") from None
    if not isinstance(call, dict) or not isinstance(call.get("call"), str):
        raise RankSetError("the child sent a malformed call")
    nbytes = call.get("nbytes")
    if not isinstance(nbytes, int) or not 0 <= nbytes <= limit:
        raise RankSetError(f"the child announced {printable(repr(nbytes))[:40]} bytes, past its memory limit")
    if call["call"] in COLLECTIVE_CALLS:
        dtype, shape = call.get("dtype"), call.get("shape")
        if dtype not in DTYPES:
            raise RankSetError(f"the child sent a tensor of dtype {printable(repr(dtype))[:40]}")
        if not (
            isinstance(shape, list) and len(shape) <= _MAX_DIMS and all(isinstance(d, int) and 0 <= d for d in shape)
        ):
            raise RankSetError("the child sent a tensor with a malformed shape")
        numel = 1
        for d in shape:
            numel *= d
        if numel * DTYPES[dtype].itemsize != nbytes:
            raise RankSetError("the child sent a tensor whose size does not match its shape")
        if call.get("reduce", "sum") not in REDUCE_OPS:
            raise RankSetError(f"the child asked for reduction {printable(repr(call.get('reduce')))[:40]}")
        if not isinstance(call.get("group"), str):
            raise RankSetError("the child named no process group")
    return call


class RelayServer:
    """The parent's end: answers the child's calls with this job's process groups.

    ``agree(ready_call)`` is called once, for the child's ``ready`` (it returns
    the groups as {name: (group rank, size)}, or raises :class:`RankSetError` to stop the child).
    """

    def __init__(self, groups: Callable[[], dict[str, Any]], agree: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self._groups = groups
        self._agree = agree

    def answer(self, call: dict[str, Any], payload: bytes) -> bytes:
        try:
            kind = call["call"]
            if kind == "ready":
                return encode_message({"ok": True, "groups": self._agree(call)})
            if kind == "any":
                flag = torch.tensor([1 if call.get("value") else 0])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                return encode_message({"ok": True, "value": bool(flag.item())})
            if kind in COLLECTIVE_CALLS:
                return encode_message({"ok": True}, _tensor_bytes(self._collective(call, payload)))
            raise RankSetError(f"the child asked for {printable(kind)[:40]!r}, which is not a call")
        except RankSetError as exc:
            return encode_message({"ok": False, "message": str(exc)})

    def _collective(self, call: dict[str, Any], payload: bytes) -> torch.Tensor:
        group = self._groups().get(call["group"])
        if group is None:
            raise RankSetError(
                f"the child named process group {printable(call['group'])[:40]!r}, not one of the file's"
            )
        tensor = _tensor_from(payload, DTYPES[call["dtype"]], call["shape"])
        size = dist.get_world_size(group)
        kind = call["call"]
        reduce = call.get("reduce", "sum")
        op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
              "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[reduce]  # fmt: skip
        if kind == "all_reduce":
            dist.all_reduce(tensor, op=op, group=group)
            result = tensor
        elif kind == "all_gather":
            result = torch.empty(
                (tensor.shape[0] * size, *tensor.shape[1:]) if tensor.dim() else (size,), dtype=tensor.dtype
            )
            dist.all_gather_into_tensor(result, tensor, group=group)
        elif kind == "reduce_scatter":
            if tensor.dim() == 0 or tensor.shape[0] % size:
                raise RankSetError("the child asked to reduce-scatter a tensor its group cannot split")
            result = torch.empty((tensor.shape[0] // size, *tensor.shape[1:]), dtype=tensor.dtype)
            dist.reduce_scatter_tensor(result, tensor, op=op, group=group)
        elif kind == "all_to_all":
            out_splits, in_splits = call.get("out_splits"), call.get("in_splits")
            if not all(
                isinstance(s, list) and all(isinstance(n, int) and n >= 0 for n in s) for s in (out_splits, in_splits)
            ):
                raise RankSetError("the child sent malformed splits")
            rows = sum(out_splits) if out_splits else tensor.shape[0]
            result = torch.empty((rows, *tensor.shape[1:]), dtype=tensor.dtype)
            dist.all_to_all_single(result, tensor, out_splits or None, in_splits or None, group=group)
        else:  # broadcast
            root = call.get("root")
            if not isinstance(root, int) or not 0 <= root < size:
                raise RankSetError("the child asked to broadcast from a rank outside its group")
            dist.broadcast(tensor, group=group, group_src=root)
            result = tensor
        if reduce == "avg":
            result = result / size if result.is_floating_point() else result // size
        return result
