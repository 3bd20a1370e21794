"""Rank-set pieces that need no process group: manifests read from files, the relay's checks of a child's
calls, path templates, and where collectives are allowed. The torchrun tests:
tests/distributed/test_tensor_parallel.py."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any

import pytest
import torch

from trt_inline import allowed_ops, distributed
from trt_inline.distributed.manifest import FORMAT, decode_manifest
from trt_inline.distributed.relay import RelayServer, decode_call
from trt_inline.errors import RankSetError, RefusedOperatorError, VerifyInputError


def _manifest(**changes: Any) -> str:
    document: dict[str, Any] = {
        "format": FORMAT, "rank": 1, "world_size": 2, "backend": "gloo", "save_id": "ab" * 16,
        "groups": [{"name": "0", "ranks": [0, 1]}],
        "collectives": [{"op": "_c10d_functional::all_reduce.default", "group": "0", "reduce_op": "sum",
                         "shape": ["s0", 8], "dtype": "float32", "where": "all_reduce"}],
    }  # fmt: skip
    document.update(changes)
    return json.dumps(document)


def test_a_manifest_is_read_field_by_field() -> None:
    manifest = decode_manifest(_manifest(), "m.pt2")
    assert (manifest.rank, manifest.world_size, manifest.group_ranks()) == (1, 2, {"0": (0, 1)})
    assert manifest.collectives[0].shape == ("s0", 8) and manifest.collectives[0].signature() == (
        "_c10d_functional::all_reduce.default", "0", "sum", "float32", ["s0", 8]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rank": 2}, "records rank 2 of 2"),
        ({"rank": True}, "is not a rank or a count"),
        ({"groups": [{"name": "0", "ranks": [0, 5]}]}, "has ranks outside the world"),
        ({"groups": [{"name": "0", "ranks": [1, 1]}]}, "lists its ranks out of order"),
        ({"groups": [{"name": "0", "ranks": []}]}, "has ranks outside the world"),
        ({"groups": [{"name": "0", "ranks": [0]}]}, "does not hold its own rank"),
        ({"groups": [{"name": "0", "ranks": [0, 1]}, {"name": "0", "ranks": [1]}]}, "names a group twice"),
        ({"groups": []}, "are not the ones its collectives name"),
        ({"groups": [{"name": str(n), "ranks": [1]} for n in range(65)]}, "at most 64"),
        ({"backend": "x" * 500}, "not a string of at most 200"),
        ({"format": "other"}, "not in format"),
        ({"collectives": [{"op": "x"}]}, "'group'"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_file(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(VerifyInputError, match=r"^m\.pt2: ") as raised:
        decode_manifest(_manifest(**changes), "m.pt2")
    assert message in str(raised.value)


def test_strings_of_a_manifest_are_escaped_where_decoded() -> None:
    manifest = decode_manifest(_manifest(backend="gloo\r\x1b[2Jforged"), "m.pt2")
    assert "\r" not in manifest.backend and "\x1b" not in manifest.backend


def _call(**fields: Any) -> bytes:
    call = {"call": "all_reduce", "group": "0", "dtype": "float32", "shape": [2, 3], "reduce": "sum", "nbytes": 24}
    call.update(fields)
    return json.dumps(call).encode()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nbytes": 20}, "does not match its shape"),
        ({"nbytes": 1 << 40, "shape": [1 << 38]}, "past its memory limit"),
        ({"dtype": "object"}, "dtype"),
        ({"shape": [2, -3]}, "malformed shape"),
        ({"shape": [1] * 17, "nbytes": 4}, "malformed shape"),
        ({"shape": [True, 6], "nbytes": 24}, "malformed shape"),
        ({"shape": [0, 1 << 70], "nbytes": 0}, "malformed shape"),
        ({"nbytes": True}, "bytes"),
        ({"call": "any", "nbytes": 5}, "takes none"),
        ({"reduce": "__import__"}, "reduction"),
        ({"group": 0}, "named no process group"),
        ({"call": 7}, "malformed call"),
    ],
)
def test_the_parent_checks_every_call_of_a_child(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(RankSetError, match=message):
        decode_call(_call(**fields), 1 << 30)


def test_a_call_that_is_not_json_is_refused() -> None:
    for header in (b"\xff{", b"[" * 100_000):
        with pytest.raises(RankSetError, match="not JSON"):
            decode_call(header, 1 << 30)
    assert decode_call(_call(), 1 << 30)["shape"] == [2, 3]


def _server() -> RelayServer:
    def agree(call: dict[str, Any]) -> dict[str, Any]:
        return {}

    return RelayServer(lambda: {}, agree, set, lambda: None, 1 << 20)


def _replies(server: RelayServer, calls: bytes) -> list[dict[str, Any]]:
    """Feed ``calls`` to ``server`` through a real pipe and read back every reply it writes."""
    call_read, call_write = os.pipe()
    reply_read, reply_write = os.pipe()
    os.set_blocking(reply_write, False)

    def send() -> None:  # (a pipe holds 64 KiB: the child's side writes while the parent reads)
        with contextlib.suppress(OSError):
            os.write(call_write, calls)
        os.close(call_write)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        for _ in range(1000):
            if server.wants_input():
                server.read_from(call_read)
            server.pump()
            server.write_to(reply_write)
            if server.stopped and not server.wants_output():
                break
        os.close(reply_write)
        data = b""
        while chunk := os.read(reply_read, 1 << 16):
            data += chunk
    finally:
        os.close(call_read)
        os.close(reply_read)
        sender.join()
    return [json.loads(line) for line in data.split(b"\n") if line.startswith(b"{")]


def test_the_relay_stops_at_a_header_over_64_kib() -> None:
    server = _server()
    replies = _replies(server, b"x" * 70_000)
    assert server.stopped and replies == [{"ok": False, "message": "the child sent a call header longer than 64 KiB",
                                           "nbytes": 0}]  # fmt: skip


def test_the_relay_refuses_a_question_before_the_ranks_agreed_and_a_collective_of_no_group() -> None:
    server = _server()
    replies = _replies(server, json.dumps({"call": "any", "value": True, "nbytes": 0}).encode() + b"\n")
    assert replies[0]["ok"] is False and "before every rank was ready" in replies[0]["message"]
    server = _server()
    payload = bytes(24)
    replies = _replies(server, _call() + b"\n" + payload)
    assert replies[0]["ok"] is False and "not one of the file's" in replies[0]["message"]


def test_a_reply_the_child_never_reads_does_not_block_the_parent() -> None:
    server = _server()
    server._reply = [memoryview(bytes(4 << 20))]  # more than a pipe holds
    reply_read, reply_write = os.pipe()
    os.set_blocking(reply_write, False)
    try:
        started = time.monotonic()
        server.write_to(reply_write)  # returns once the pipe is full, never waits for the reader
        assert time.monotonic() - started < 5 and server.wants_output()
    finally:
        os.close(reply_read)
        os.close(reply_write)


def test_an_arrival_timeout_must_be_a_number_of_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("nan", "inf", "-1", "0", "soon"):
        monkeypatch.setenv(distributed.ARRIVAL_TIMEOUT_ENV, value)
        with pytest.raises(RankSetError, match="not a number of seconds above 0"):
            distributed.arrival_timeout()


def test_path_templates() -> None:
    assert distributed.expand_path("model.pt2") == "model.pt2"
    assert distributed.expand_path("a{b}.pt2") == "a{b}.pt2"  # only {rank} and {world_size} are template fields
    with pytest.raises(RankSetError, match="needs an initialized process group"):
        distributed.expand_path("model_rank{rank}_of_{world_size}.pt2")
    assert not distributed.in_rank_set()


def test_collectives_are_refused_in_a_verification_unless_it_is_a_rank_sets() -> None:
    op = torch.ops._c10d_functional.all_reduce.default
    allowed_ops.check_target(op)  # a process running what it compiled: its own collectives
    with allowed_ops.allowing(()), pytest.raises(RefusedOperatorError, match="verify --ranks N"):
        allowed_ops.check_target(op)
    with allowed_ops.allowing((), collectives=True), allowed_ops.allowing(()):
        allowed_ops.check_target(op)  # an inner block keeps what the rank set's block allowed
    with allowed_ops.allowing(()), pytest.raises(RefusedOperatorError, match="fused NCCL"):
        allowed_ops.resolve("tensorrt::fused_nccl_all_reduce.default")


# ---------------------------------------------------------------------------
# What the parents of a group compare before each relayed collective
# ---------------------------------------------------------------------------


def _asked(call: str, shape: list[int], **fields: Any) -> Any:
    from trt_inline.distributed import relay

    size = fields.pop("size", 2)
    header = {"call": call, "dtype": fields.pop("dtype", "float32"), "shape": shape, **fields}
    return relay._decoded(relay._descriptor(header, size).tolist(), size)


def test_the_descriptor_round_trips() -> None:
    asked = _asked("all_to_all", [5, 3], in_splits=[2, 3], out_splits=[4, 1])
    assert (asked.call, asked.dtype, asked.shape, asked.in_splits, asked.out_splits) == (
        "all_to_all", "float32", (5, 3), (2, 3), (4, 1)
    )  # fmt: skip
    assert _asked("broadcast", [2], root=1).root == 1 and _asked("all_reduce", [2], reduce="max").reduce == "max"


@pytest.mark.parametrize(
    ("rows", "fragment"),
    [
        ([("all_reduce", [4, 8], {}), ("all_reduce", [8, 8], {})], "rank 1 sends all_reduce (sum) of float32[8, 8]"),
        ([("all_reduce", [4], {}), ("all_reduce", [4], {"dtype": "float64"})], "of float64[4] where"),
        ([("all_reduce", [4], {}), ("all_reduce", [4], {"reduce": "max"})], "all_reduce (max)"),
        ([("all_reduce", [4], {}), ("broadcast", [4], {"root": 0})], "sends broadcast from group rank 0"),
        ([("broadcast", [4], {"root": 0}), ("broadcast", [4], {"root": 1})], "broadcast from group rank 1"),
        ([("all_gather", [2, 3], {}), ("all_gather", [2, 4], {})], "all_gather of float32[2, 4]"),
        ([("reduce_scatter", [4], {}), ("reduce_scatter", [6], {})], "reduce_scatter (sum) of float32[6]"),
        ([("all_to_all", [4, 3], {}), ("all_to_all", [4, 2], {})], "all_to_all of float32[4, 2]"),
        ([("all_to_all", [3, 2], {}), ("all_to_all", [4, 2], {})], "sends 3 rows to all_to_all without splits"),
        # Without splits each rank sends its rows in equal parts: 2 and 3 rows do not pair up.
        ([("all_to_all", [4, 2], {}), ("all_to_all", [6, 2], {})], "rank 0 expects 2 rows from rank 1"),
        (
            [
                ("all_to_all", [3, 2], {"in_splits": [1, 2], "out_splits": [1, 1]}),
                ("all_to_all", [2, 2], {"in_splits": [1, 1], "out_splits": [1, 1]}),
            ],
            "rank 1 expects 1 rows from rank 0 in all_to_all, which sends it 2",
        ),
    ],
)
def test_calls_that_would_not_pair_up_are_named(rows: list[Any], fragment: str) -> None:
    from trt_inline.distributed import relay

    asked = [_asked(call, shape, **fields) for call, shape, fields in rows]
    problem = relay._disagreement(asked, [0, 1])
    assert problem is not None and fragment in problem, problem


def test_calls_that_pair_up_pass() -> None:
    from trt_inline.distributed import relay

    same = [_asked("all_reduce", [4, 8]), _asked("all_reduce", [4, 8])]
    assert relay._disagreement(same, [0, 1]) is None
    uneven = [_asked("all_to_all", [3, 2], in_splits=[1, 2], out_splits=[1, 1]),
              _asked("all_to_all", [2, 2], in_splits=[1, 1], out_splits=[2, 1])]  # fmt: skip
    assert relay._disagreement(uneven, [0, 1]) is None
    assert relay._disagreement([_asked("all_to_all", [4, 2]), _asked("all_to_all", [4, 2])], [0, 1]) is None
