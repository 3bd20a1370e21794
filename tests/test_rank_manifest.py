"""Rank-set pieces that need no process group: manifests read from files, the relay's checks of a child's
calls, path templates, and where collectives are allowed. The torchrun tests: tests/test_tensor_parallel.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from trt_inline import allowed_ops, distributed
from trt_inline.distributed.manifest import FORMAT, decode_manifest
from trt_inline.distributed.relay import decode_call
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
        "_c10d_functional::all_reduce.default", "0", "sum", "float32"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rank": 2}, "records rank 2 of 2"),
        ({"rank": True}, "is not a rank or a count"),
        ({"groups": [{"name": "0", "ranks": [0, 5]}]}, "has ranks outside the world"),
        ({"groups": [{"name": "0", "ranks": [1, 1]}]}, "has ranks outside the world"),
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
        ({"reduce": "__import__"}, "reduction"),
        ({"group": 0}, "named no process group"),
        ({"call": 7}, "malformed call"),
    ],
)
def test_the_parent_checks_every_call_of_a_child(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(RankSetError, match=message):
        decode_call(_call(**fields), 1 << 30)


def test_a_call_that_is_not_json_is_refused() -> None:
    with pytest.raises(RankSetError, match="not JSON"):
        decode_call(b"\xff{", 1 << 30)
    assert decode_call(_call(), 1 << 30)["shape"] == [2, 3]


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
