"""Typed messages between a parent and its child (trt_inline.codec): every annotation the decoder knows, accepted
and refused; unknown and missing keys; the bounds declared beside a field; fields that stay or travel as another
type; and a round trip through JSON of every request and response a child job is sent or hands back."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, TypedDict

import pytest
import torch

from trt_inline.codec import Bounds, MessageError, Wire, decode, encode, wire
from trt_inline.commands import check, inspect
from trt_inline.commands.check import NeedsRequest, NeedsResponse
from trt_inline.commands.inspect import InspectRequest, InspectResponse
from trt_inline.engine_fields import EngineInfo
from trt_inline.errors import IsolationError, VerifyInputError
from trt_inline.isolation import SandboxRequest, child, inside, job, job_of
from trt_inline.isolation.jobs import job_at
from trt_inline.output_tree import OutputTree
from trt_inline.verify import verifier
from trt_inline.verify.diff import DiffRequest, diff_job
from trt_inline.verify.options import Inputs, Options, Outputs, Reference, Tolerances, Trust, for_child
from trt_inline.verify.report import VerifyReport
from trt_inline.verify.verifier import VerifyRequest


@dataclass(frozen=True)
class Inner:
    name: str
    count: int = 0


@dataclass(frozen=True)
class Every:
    text: str
    whole: int
    number: float
    flag: bool
    nothing: None
    maybe: Optional[int]  # noqa: UP045 (Optional is one of the spellings the decoder reads)
    either: int | str | None
    choice: Literal["a", "b", 3]
    names: tuple[str, ...]
    pair: tuple[int, str]
    items: list[float]
    table: dict[str, int]
    inner: Inner
    inners: list[Inner]
    anything: Any


EVERY = {
    "text": "t", "whole": 3, "number": 0.5, "flag": True, "nothing": None, "maybe": None, "either": "x",
    "choice": "b", "names": ["x", "y"], "pair": [1, "one"], "items": [1.5, 2], "table": {"k": 1},
    "inner": {"name": "n", "count": 2}, "inners": [{"name": "m", "count": 0}], "anything": {"a": [1, None, "s"]},
}  # fmt: skip


def test_every_annotation_accepted() -> None:
    every = decode(Every, EVERY)
    assert every == Every(
        "t", 3, 0.5, True, None, None, "x", "b", ("x", "y"), (1, "one"), [1.5, 2], {"k": 1}, Inner("n", 2),
        [Inner("m", 0)], {"a": [1, None, "s"]},
    )  # fmt: skip
    assert encode(every) == EVERY and decode(Every, json.loads(json.dumps(encode(every)))) == every
    assert decode(Every, {**EVERY, "maybe": 4, "either": 5, "choice": 3}).either == 5


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("text", 1, "text: an int, not text"),
        ("whole", True, "whole: true or false, not an integer"),  # a bool is no int
        ("whole", 1.0, "whole: a float, not an integer"),
        ("number", False, "number: true or false, not a number"),
        ("number", "1", "number: a str, not a number"),
        ("flag", 1, "flag: an int, not true or false"),
        ("nothing", 0, "nothing: an int, not None"),
        ("maybe", "1", "maybe: a str, not an integer"),
        ("maybe", True, "maybe: true or false, not an integer"),
        ("either", 1.5, "either: a float, not an integer or text or None"),
        ("choice", "c", "choice: not one of 'a', 'b', 3"),
        ("choice", 3.0, "choice: not one of"),  # of the same type
        ("names", "xy", "names: a str, not a list"),
        ("names", ["x", 1], "names[1]: an int, not text"),
        ("names", ("x",), "names: a tuple, not a list"),  # plain data: JSON has lists only
        ("pair", [1], "pair: 1 items, not 2"),
        ("pair", [1, 2], "pair[1]: an int, not text"),
        ("items", [1, True], "items[1]: true or false, not a number"),
        ("table", [], "table: a list, not an object"),
        ("table", {"k": "1"}, "table.k: a str, not an integer"),
        ("inner", {"name": "n"}, "inner.count: missing"),
        ("inner", {"name": "n", "count": 1, "more": 1}, "inner.more: no such field of Inner"),
        ("inner", ["n", 1], "inner: a list, not an object (Inner)"),
        ("inners", [{"name": 2, "count": 1}], "inners[0].name: an int, not text"),
        ("anything", {"a": {1, 2}}, "anything.a: a set, not plain data"),
    ],
)
def test_every_annotation_refused(key: str, value: Any, fragment: str) -> None:
    with pytest.raises(MessageError) as raised:
        decode(Every, {**EVERY, key: value})
    assert str(raised.value).startswith(fragment), str(raised.value)


def test_unknown_and_missing_keys_are_refused_and_named_escaped() -> None:
    with pytest.raises(MessageError, match=r"^whole: missing$"):
        decode(Every, {k: v for k, v in EVERY.items() if k != "whole"})
    with pytest.raises(MessageError, match=r"no such field of Every") as raised:
        decode(Every, {**EVERY, "\x1b[2Jforged": 1})
    assert "\x1b" not in str(raised.value) and "\\x1b[2Jforged" in str(raised.value)
    with pytest.raises(MessageError, match=r"^Every: a list, not an object"):
        decode(Every, [EVERY])


@dataclass(frozen=True)
class Bounded:
    short: str = field(metadata=wire(max_len=3))
    few: list[int] = field(metadata=wire(max_items=2))
    shallow: Any = field(metadata=wire(max_depth=1))
    shown: dict[str, str] = field(metadata=wire(cut=4, key_cut=2))
    plain: dict[str, Any] = field(metadata=wire(max_items=2, cut=3, key_cut=1))


BOUNDED = {"short": "abc", "few": [1, 2], "shallow": [1], "shown": {"k": "v"}, "plain": {"k": "v"}}


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("short", "abcd", "short: text of 4 characters, more than 3"),
        ("few", [1, 2, 3], "few: 3 items, more than 2"),
        ("shallow", [[1]], "shallow[0][0]: nested more than 1 deep"),
        ("plain", {"a": 1, "b": 2, "c": 3}, "plain: 3 items, more than 2"),
        ("plain", {"a": [1, 2, 3]}, "plain.a: 3 items, more than 2"),  # at every level of the field
    ],
)
def test_over_a_bound_is_refused(key: str, value: Any, fragment: str) -> None:
    assert decode(Bounded, BOUNDED) == Bounded("abc", [1, 2], [1], {"k": "v"}, {"k": "v"})
    with pytest.raises(MessageError) as raised:
        decode(Bounded, {**BOUNDED, key: value})
    assert str(raised.value) == fragment


def test_text_from_a_child_is_escaped_and_cut() -> None:
    bounded = decode(Bounded, {**BOUNDED, "shown": {"key\n": "\x1b[31mred"}, "plain": {"k\x07": ["\nabc", "ok"]}})
    assert bounded.shown == {"ke": "\\x1b"} and bounded.plain == {"k": ["\\na", "ok"]}


@dataclass(frozen=True)
class Carried:
    path: Any = field(default=None, metadata=wire(as_type=str | None))
    tensors: Any = field(default=None, metadata=wire(stays=True))
    names: Any = field(default=(), metadata=wire(as_type=tuple[str, ...]))


def test_fields_that_stay_and_fields_carried_as_another_type() -> None:
    carried = Carried("a.pt2", None, ("x",))
    assert encode(carried) == {"path": "a.pt2", "names": ["x"]}
    assert decode(Carried, {"path": None, "names": []}) == Carried(None, None, ())
    with pytest.raises(MessageError, match="tensors: no such field"):
        decode(Carried, {"path": None, "names": [], "tensors": None})
    with pytest.raises(MessageError, match=r"^tensors: a field that stays here holds other than its default"):
        encode(Carried("a", [torch.ones(1)]))
    with pytest.raises(MessageError, match=r"^path: an int, not text$"):
        decode(Carried, {"path": 1, "names": []})


def test_what_cannot_travel() -> None:
    @dataclass
    class PathLike:
        path: Path

    with pytest.raises(TypeError, match="cannot travel"):
        decode(PathLike, {"path": "a"})
    with pytest.raises(MessageError, match=r"^path: a PosixPath, which plain data cannot hold"):
        encode(PathLike(Path("a")))
    with pytest.raises(MessageError, match="keys are not all text"):
        encode({0: 1.0})
    with pytest.raises(TypeError, match="decode reads a dataclass"):
        decode(dict, {})  # type: ignore[type-var]


# -- the requests and responses of the child jobs -------------------------------------------------------------


def _through_json(message: Any) -> Any:
    return decode(type(message), json.loads(json.dumps(encode(message))))


def test_a_verify_request_round_trip(tmp_path: Path) -> None:
    x = torch.ones(2, 3)
    options = Options(
        inputs=Inputs(arg_inputs=[x], kwarg_inputs={"y": x}, random_inputs=2, seed=7, range_ends="all", device="cpu"),
        reference=Reference(expected=[x], expected_from=tmp_path / "new.pt2", per_engine=True),
        tolerances=Tolerances(
            atol={0: 1e-3, "acc_5": 1e-2, "*": 1},
            rtol=1e-3,
            check_error_stat="p99",
            top_k=3,
            min_top_k_agreement=1,
            strict=True,
        ),
        trust=Trust(allow_pickle=True, allow_ops=["aten::sin"]),
        outputs=Outputs(save_outputs=tmp_path / "o.pt", extract=tmp_path / "repro"),
    )
    tree = OutputTree("dict['a', 'b'](*, *)", ("out['a']", "out['b']"))
    request = VerifyRequest.of(str(tmp_path / "a.pt2"), options, label="module", expected_tree=tree)
    # Only what a child may see: the tensors travel apart, paths as text, tolerances normalized.
    assert request.inputs == Inputs(random_inputs=2, seed=7, range_ends="all", device="cpu")
    assert request.reference == Reference(expected_from=str(tmp_path / "new.pt2"), per_engine=True)
    assert request.tolerances.atol == {"0": 1e-3, "_run_on_acc_5": 1e-2, "*": 1.0}
    assert (request.keep_outputs, request.keep_reference, request.extract, request.keep_range_ends) == (
        True, False, True, True
    )  # fmt: skip
    assert _through_json(request) == request
    assert encode(request)["tolerances"]["check_error_stat"] == "p99"
    plain = VerifyRequest.of("a.pt2", Options())
    assert _through_json(plain) == plain and plain.label is None and plain.expected_tree is None
    with pytest.raises(MessageError, match=r"^label: not one of 'module'"):
        decode(VerifyRequest, {**encode(plain), "label": "given"})
    with pytest.raises(MessageError, match=r"^expected_tree.paths: a str, not a list"):
        decode(VerifyRequest, {**encode(request), "expected_tree": {"structure": "x", "paths": "out"}})
    with pytest.raises(MessageError, match=r"^inputs.seed: true or false, not an integer"):
        decode(VerifyRequest, {**encode(plain), "inputs": {**encode(plain.inputs), "seed": True}})
    with pytest.raises(MessageError, match=r"^inputs.arg_inputs: no such field of Inputs"):
        decode(VerifyRequest, {**encode(plain), "inputs": {**encode(plain.inputs), "arg_inputs": []}})


def test_the_other_requests_round_trip(tmp_path: Path) -> None:
    options = Options(inputs=Inputs(arg_inputs=[torch.ones(1)], seed=1), tolerances=Tolerances(atol=1e-2),
                      trust=Trust(allow_native_code=True), outputs=Outputs(save_outputs=tmp_path / "o.pt"))  # fmt: skip
    for request in (
        DiffRequest.of("a.pt2", "b.pt2", options),
        DiffRequest.of("a.pt2", "b.pt2", Options()),
        InspectRequest.of("a.pt2", Trust(allow_ops=("aten::sin",), allow_native_code=True)),
        NeedsRequest.of("a.pt2", allow_pickle=True),
    ):
        assert _through_json(request) == request, request
    assert DiffRequest.of("a.pt2", "b.pt2", options).keep_outputs
    assert DiffRequest.of("a.pt2", "b.pt2", options).inputs == Inputs(seed=1)
    assert for_child(Trust(allow_ops=["x"])) == Trust(allow_ops=("x",))


def test_each_request_names_its_job_and_the_child_runs_only_registered_jobs() -> None:
    """The job table is built from the request classes: each request type names the function registered for it
    beside its definition, the child finds it by that function's own module and name, and decodes the request
    strictly into the declared dataclass; a function that is not a registered job is refused in the child before it
    is called, and a request no job runs is refused in the parent."""
    expected = {
        VerifyRequest: (verifier.verify_job, VerifyReport), DiffRequest: (diff_job, VerifyReport),
        InspectRequest: (inspect.inspect_job, InspectResponse), NeedsRequest: (check.needs_job, NeedsResponse),
        SandboxRequest: (inside.sandbox_job, inside.SandboxResponse),
    }  # fmt: skip
    requests = [VerifyRequest.of("a.pt2", Options(tolerances=Tolerances(atol=1e-3))),
                DiffRequest.of("a.pt2", "b.pt2", Options()), InspectRequest.of("a.pt2", Trust()),
                NeedsRequest.of("a.pt2", allow_pickle=False), SandboxRequest()]  # fmt: skip
    for request in requests:
        found = job_of(request)
        assert (found.run, found.response) == expected[type(request)]
        assert job_at(*found.address) is found
        assert found.decode_request(encode(request)) == request
        if type(request) is not SandboxRequest:
            with pytest.raises(MessageError, match=f"no such field of {type(request).__name__}"):
                found.decode_request({"x": 1})
    for module, name in (("os", "system"), ("trt_inline.verify.verifier", "verify"), ("subprocess", "run")):
        with pytest.raises(IsolationError, match=rf"^{re.escape(module)}\.{name} is not a job a child runs$"):
            job_at(module, name)

    @dataclass(frozen=True)
    class Unregistered:
        path: str

    with pytest.raises(TypeError, match=r"no child job runs a .*Unregistered: declare one with @isolation\.job"):
        job_of(Unregistered("a.pt2"))
    with pytest.raises(TypeError, match="no child job runs a"):
        child.run_isolated(Unregistered("a.pt2"), None, child.Limits(10, 1 << 30), where="a.pt2")
    with pytest.raises(TypeError, match="already has a job"):
        job(VerifyRequest)(diff_job)
    with pytest.raises(TypeError, match="a job's request is a dataclass"):
        job(dict)


def test_a_request_that_does_not_decode_is_refused_before_a_child_starts() -> None:
    bad = VerifyRequest.of("a.pt2", Options(inputs=Inputs(random_inputs=True)))  # (a bool where an int is declared)
    with pytest.raises(VerifyInputError, match=r"^a.pt2: a request the child could not read \(inputs.random_inputs"):
        child._sendable(bad, "a.pt2")
    with pytest.raises(VerifyInputError, match=r"a request the child could not read \(inputs.arg_inputs: a field"):
        child._sendable(replace(bad, inputs=Inputs(arg_inputs=[torch.ones(1)])), "a.pt2")
    with pytest.raises(TypeError, match="no child job runs a dict"):  # (plain data names no job: nothing runs it)
        job_of({"kind": "report"})


def _info(**changes: Any) -> dict[str, Any]:
    fields = {"name": "e", "platform": "linux_x86_64"}
    metadata = {"keys": ["settings"], "settings": {"debug": False}}
    info = EngineInfo("engine 0 (_run_on_acc_0_engine)", "9", fields, 440, metadata, "240 bytes", ["a problem"])
    return {**encode(info), **changes}


def test_engine_infos_round_trip_within_the_limits_of_the_reader_they_replace() -> None:
    info = decode(EngineInfo, _info())
    assert encode(info) == _info() and _through_json(NeedsResponse([info])) == NeedsResponse([info])
    assert _through_json(InspectResponse(["a line"], [info, info])).engines == [info, info]
    cut = decode(EngineInfo, _info(where="\x1b" + "w" * 300, abi="9" * 40, problems=["p" * 500],
                                   fields={"k" * 50: "v" * 5000}, metadata={"m" * 70: "\n" + "s" * 500}))  # fmt: skip
    assert cut.where == "\\x1b" + "w" * 196 and cut.abi == "9" * 20 and cut.problems == ["p" * 400]
    assert cut.fields == {"k" * 40: "v" * 4096} and cut.metadata == {"m" * 60: "\\n" + "s" * 398}
    deep: Any = 1
    for _ in range(5):
        deep = [deep]
    # (the object is at depth 0: a value 6 deep is read, one 7 deep is not)
    assert decode(EngineInfo, _info(metadata={"d": deep})).metadata == {"d": deep}
    for change, fragment in (
        (dict(fields={str(i): "" for i in range(33)}), "fields: 33 items, more than 32"),
        (dict(problems=["p"] * 33), "problems: 33 items, more than 32"),
        (dict(metadata={"d": [deep]}), "nested more than 6 deep"),
        (dict(metadata={"l": list(range(65))}), "metadata.l: 65 items, more than 64"),
        (dict(metadata={str(i): i for i in range(65)}), "metadata: 65 items, more than 64"),
        (dict(metadata=["settings"]), "metadata: a list, not an object"),  # (as EngineInfo declares it)
        (dict(engine_bytes=True), "engine_bytes: true or false, not an integer"),
        (dict(fields={"k": 1}), "fields.k: an int, not text"),
        (dict(where=None), "where: None, not text"),
        (dict(extra=1), "extra: no such field of EngineInfo"),
    ):
        with pytest.raises(MessageError) as raised:
            decode(EngineInfo, _info(**change))
        assert fragment in str(raised.value), (change, str(raised.value))
    missing = _info()
    del missing["problems"]
    with pytest.raises(MessageError, match="problems: missing"):
        decode(EngineInfo, missing)
    with pytest.raises(MessageError, match="engines: 4097 items, more than 4096"):
        decode(NeedsResponse, {"engines": [_info()] * 4097})
    with pytest.raises(IsolationError, match=r"^m.pt2: the child process handed back a malformed answer \(lines"):
        job_of(InspectRequest.of("m.pt2", Trust())).decode_response({"lines": "a line", "engines": []}, "m.pt2")
    with pytest.raises(IsolationError, match=r"^m.pt2: the child process gave a malformed report"):
        job_of(VerifyRequest.of("m.pt2", Options())).decode_response({"outputs": "x"}, "m.pt2")


# -- what a whole message declares: per-level bounds, typed dicts, derived properties, bounds on the message ----


class Run(TypedDict):
    name: str
    sizes: Annotated[list[Annotated[list[int], Wire(max_items=2)]], Wire(max_items=3)]


@dataclass
class Counted:
    value: float = field(default=0.0, metadata=wire(at_least=0.0, at_most=1.0))
    floor: float | None = field(default=None, metadata=wire(at_least=-math.inf))
    count: int = 0

    __wire_derived__: ClassVar[tuple[str, ...]] = ("positive",)

    @property
    def positive(self) -> bool:
        return self.count > 0


@dataclass
class Whole:
    note: str = ""
    runs: list[Run] = field(default_factory=list)
    counted: list[Counted] = field(default_factory=list)
    more: list[Counted] = field(default_factory=list)


def test_each_level_of_an_annotated_type_has_its_own_bounds() -> None:
    assert decode(Whole, {"note": "", "runs": [{"name": "r", "sizes": [[1, 2]] * 3}], "counted": [], "more": []})
    for sizes, fragment in (
        ([[1]] * 4, "runs[0].sizes: 4 items, more than 3"),
        ([[1, 2, 3]], "runs[0].sizes[0]: 3 items, more than 2"),
        ([[True]], "runs[0].sizes[0][0]: true or false, not an integer"),
    ):
        with pytest.raises(MessageError) as raised:
            decode(Whole, {"note": "", "runs": [{"name": "r", "sizes": sizes}], "counted": [], "more": []})
        assert str(raised.value) == fragment


def test_a_typed_dict_is_read_as_a_dict_of_its_keys() -> None:
    run = {"name": "r", "sizes": [[1]]}
    whole = decode(Whole, {"note": "", "runs": [run], "counted": [], "more": []})
    assert whole.runs == [run] and type(whole.runs[0]) is dict
    for change, fragment in (({"extra": 1}, "runs[0].extra: no such field of Run"), ({"name": 1}, "runs[0].name")):
        with pytest.raises(MessageError, match=re.escape(fragment)):
            decode(Whole, {"note": "", "runs": [{**run, **change}], "counted": [], "more": []})
    with pytest.raises(MessageError, match=re.escape("runs[0].sizes: missing")):
        decode(Whole, {"note": "", "runs": [{"name": "r"}], "counted": [], "more": []})


def test_numbers_within_their_range_and_64_bits() -> None:
    assert decode(Counted, {"value": 1, "floor": -math.inf, "count": (1 << 63) - 1}).floor == -math.inf
    for change, fragment in (
        ({"value": 1.5}, "value: 1.5, not from 0 to 1"),
        ({"value": math.nan}, "value: nan, not from 0 to 1"),  # (NaN is outside every range)
        ({"floor": math.nan}, "floor: nan, not a number other than NaN"),
        ({"count": 1 << 63}, "count: an integer of more than 64 bits"),
        ({"value": -(1 << 64)}, "value: an integer of more than 64 bits"),
    ):
        with pytest.raises(MessageError) as raised:
            decode(Counted, {"value": 0.5, "floor": None, "count": 0, **change})
        assert str(raised.value) == fragment


def test_derived_properties_are_written_read_as_their_type_and_computed_again() -> None:
    counted = Counted(0.5, None, 2)
    assert encode(counted) == {"value": 0.5, "floor": None, "count": 2, "positive": True}
    forged = {"value": 0.5, "floor": None, "count": 0, "positive": True}
    assert decode(Counted, forged).positive is False  # (what it says is not what it is)
    with pytest.raises(MessageError, match=r"^positive: an int, not true or false$"):
        decode(Counted, {**forged, "positive": 1})


def test_the_bounds_of_a_whole_message() -> None:
    one = {"value": 0.5, "floor": None, "count": 0}
    bounds = Bounds(items=20, counted=((Counted, 3, "counted things"),), text=5, defaults=True)
    whole = decode(Whole, {"note": "\x1b[2J" + "n" * 10, "counted": [one, one], "more": [one]}, bounds)
    assert whole.note == "\\x1b[... (12 more characters)" and whole.runs == []  # (cut as a document's text; a default)
    with pytest.raises(MessageError, match=re.escape("more[1]: the message holds more than 3 counted things")):
        decode(Whole, {"counted": [one, one], "more": [one, one]}, bounds)
    with pytest.raises(MessageError, match="the message holds more than 20 items in all"):
        decode(Whole, {"counted": [one], "more": [one], "runs": [{"name": "r", "sizes": [[1, 2]] * 3}] * 2}, bounds)
    with pytest.raises(MessageError, match=r"^note: missing$"):  # (without defaults, every field is sent)
        decode(Whole, {"runs": [], "counted": [], "more": []})


def test_text_is_cut_as_if_escaped_whole_without_escaping_the_whole() -> None:
    """decoded_text escapes only what it shows and counts the rest a chunk at a time: the same text as escaping the
    whole string and cutting it, for every kind of character, at and around the limit."""
    import random

    from trt_inline.errors import decoded_text, printable

    def whole(text: str, limit: int) -> str:
        clean = printable(text)
        return f"{clean[:limit]}... ({len(clean) - limit} more characters)" if len(clean) > limit else clean

    alphabet = ["a", "\n", "\x1b", "\u0100", "\u200f", "\U000e0001", "\x7f"]
    chosen = random.Random(0)
    for size in (0, 4, 5, 6, 1999, 2000, 2001, 70_000):
        text = "".join(chosen.choice(alphabet) for _ in range(size))
        for limit in (5, 2000):
            assert decoded_text(text, limit) == whole(text, limit), (size, limit)
