"""The option groups of verify, diff, rank sets and --cases: declared once, the command line's flags made of them,
the same report whether given as groups or as keywords of their own."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import socket
import typing
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from support.programs import SavedSeed

from trt_inline import cli, verify
from trt_inline.codec import encode
from trt_inline.commands import arguments
from trt_inline.commands import ranks as rank_set
from trt_inline.errors import VerifyInputError
from trt_inline.verify import Inputs, Isolation, Outputs, Reference, Tolerances, Trust, diff, verifier
from trt_inline.verify import options as opts
from trt_inline.verify.cases import verify_cases

# Each entry point that takes keywords, by the name used_by gives it.
ENTRY_POINT_FUNCTIONS: dict[str, Any] = {
    opts.VERIFY: verify, opts.DIFF: diff, opts.CASES: verify_cases, opts.RANKS: rank_set.verify_rank_set,
}  # fmt: skip
# The fields with no flag: tensors, a module, isolate=False (a trusted file, in this process).
PYTHON_ONLY = {"arg_inputs", "kwarg_inputs", "expected", "expected_module", "isolate"}


def _help(monkeypatch: pytest.MonkeyPatch, *command: str) -> str:
    """``trt-inline [COMMAND] --help`` on one line per flag (no wrapping), whitespace collapsed."""
    monkeypatch.setenv("COLUMNS", "100000")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli._parser().parse_args([*command, "--help"])
    return " ".join(out.getvalue().split())


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no commands")


def _flags_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each flag of a parser (but --help) and the name it parses into."""
    return {
        flag: action.dest
        for action in parser._actions
        for flag in action.option_strings
        if flag not in ("-h", "--help")
    }


def test_every_declared_option_is_one_flag_with_its_help_once(monkeypatch: pytest.MonkeyPatch) -> None:
    helps = {command: _help(monkeypatch, command) for command in ("verify", "diff", "inspect")}
    main_help = _help(monkeypatch)
    declared = list(opts.declarations(*opts.GROUPS, arguments.CommandFlags))
    for item, declaration in declared:
        assert declaration.help, item.name
        if not declaration.flags:
            assert item.name in PYTHON_ONLY, f"{item.name} has no flag"
            continue
        shown = {command for command, entries in arguments.COMMANDS.items() if declaration.used_by & entries}
        if declaration.before_command:
            shown, texts = {"trt-inline"}, {"trt-inline": main_help}
        else:
            texts = helps
        for command, text in texts.items():
            own = declaration.help_of(arguments.COMMANDS.get(command, ()))  # (a command's own help text, else help)
            count = text.count(own)
            assert count == (command in shown), f"{declaration.flags[0]}: its help {count} times in {command} --help"
            assert (f"{declaration.flags[0]} " in text) is (command in shown), (declaration.flags[0], command)
            if own != declaration.help:
                assert declaration.help not in text, f"{declaration.flags[0]}: {command} --help shows both texts"
    # Each option once: no two fields share a flag or a help text (nor a command's own help text).
    flags = [flag for _, declaration in declared for flag in declaration.flags]
    assert len(flags) == len(set(flags))
    texts = [text for _, d in declared for text in (d.help, *(own for _, own in d.help_for))]
    assert len(texts) == len(set(texts))


def test_diff_says_where_its_inputs_come_from(monkeypatch: pytest.MonkeyPatch) -> None:
    # diff --inputs: its own help text, as before the declarations (verify's names its --expected).
    diff_help, verify_help = _help(monkeypatch, "diff"), _help(monkeypatch, "verify")
    own = "--inputs INPUTS torch.save'd inputs (default: the reference inputs embedded in A, else in B)"
    assert own in diff_help and own not in verify_help
    assert "--inputs INPUTS torch.save'd tensor, list of tensors, or {'args', 'kwargs'}" in verify_help
    (inputs,) = (d for item, d in opts.declarations(arguments.CommandFlags) if item.name == "inputs")
    assert inputs.help_of({opts.DIFF}) != inputs.help == inputs.help_of(arguments.COMMANDS["verify"])
    with pytest.raises(ValueError, match="not used by"):
        opts.declared("text", "--x", used_by=(opts.VERIFY,), help_for={opts.DIFF: "other"})


def test_every_flag_of_the_command_line_comes_from_a_declaration() -> None:
    parser = cli._parser()
    by_flag = {
        flag: (item.name, declaration)
        for item, declaration in opts.declarations(*opts.GROUPS, arguments.CommandFlags)
        for flag in declaration.flags
    }
    commands = _subparsers(parser)
    for command, taken_by in arguments.COMMANDS.items():
        shown = _flags_of(commands[command])
        assert set(shown) == {
            flag
            for flag, (_, declaration) in by_flag.items()
            if declaration.used_by & taken_by and not declaration.before_command
        }, command
        for flag, dest in shown.items():
            assert dest == by_flag[flag][0], f"{command} {flag} parses into {dest}, not its field"
    assert _flags_of(parser) == {"--debug": "debug"}
    # A flag not given leaves the field's default (--no-sandbox: sandbox stays True).
    args = parser.parse_args(["verify", "model.pt2"])
    options = arguments.options_of(args)
    for group in opts.GROUPS:
        assert getattr(options, group.__name__.lower()) == group(), group.__name__
    assert not arguments.given_but_not_for(args, opts.RANKS) and not arguments.given_but_not_for(args, opts.CASES)


def test_flags_parse_into_the_groups() -> None:
    args = cli._parser().parse_args(
        ["--debug", "verify", "m.pt2", "--atol", "1e-3", "--atol", "out1=0.5", "--rtol", "0.1", "--no-sandbox",
         "--allow-op", "aten::sin", "--allow-op", "aten::cos", "--timeout", "30", "--memory-limit", "2GiB",
         "--check-error-stat", "p99", "--top-k", "3", "--min-top-k-agreement", "0.5", "--strict", "--per-engine",
         "--random-inputs", "2", "--seed", "7", "--device", "cpu", "--save-outputs", "o.pt"]
    )  # fmt: skip
    options = arguments.options_of(args)
    assert options.tolerances == Tolerances(
        atol={"*": 1e-3, "1": 0.5}, rtol=0.1, check_error_stat="p99", top_k=3, min_top_k_agreement=0.5, strict=True
    )
    assert options.trust == Trust(allow_ops=("aten::sin", "aten::cos"))
    assert options.isolation == Isolation(sandbox=False, timeout=30.0, memory_limit="2GiB", debug=True)
    assert options.inputs == Inputs(random_inputs=2, seed=7, device="cpu")
    assert options.reference == Reference(per_engine=True) and options.outputs == Outputs(save_outputs="o.pt")
    assert arguments.given_but_not_for(args, opts.RANKS) == ["--device", "--random-inputs", "--seed", "--save-outputs"]
    assert arguments.given_but_not_for(args, opts.CASES) == ["--save-outputs"]


def test_the_keywords_have_the_types_of_the_fields() -> None:
    per_group = {
        opts.Inputs: opts.InputsFields, opts.Reference: opts.ReferenceFields, opts.Tolerances: opts.TolerancesFields,
        opts.Trust: opts.TrustFields, opts.Isolation: opts.IsolationFields, opts.Outputs: opts.OutputsFields,
    }  # fmt: skip
    assert set(per_group) == set(opts.GROUPS)
    for group, keywords in per_group.items():
        declared = {name: getattr(kind, "__forward_arg__", kind) for name, kind in keywords.__annotations__.items()}
        assert declared == {item.name: item.type for item in fields(group)}, group.__name__
    every = {item.name for group in opts.GROUPS for item in fields(group)}
    assert set(typing.get_type_hints(opts.VerifyFields, localns=vars(opts))) == every
    assert len(every) == sum(len(fields(group)) for group in opts.GROUPS)  # (no field in two groups)
    assert {item.name for item in fields(opts.Options)} == {group.__name__.lower() for group in opts.GROUPS}


def test_each_entry_point_takes_the_keywords_its_fields_declare() -> None:
    # An entry point's TypedDict (what a type checker holds a keyword to) lists exactly the fields whose used_by
    # names it, with their types: diff(a, b, strict=True) is refused by mypy as by the call.
    field_types: dict[str, Any] = {}
    for group in opts.GROUPS:
        field_types.update(typing.get_type_hints(group))
    assert set(opts.ENTRY_POINT_FIELDS) == set(ENTRY_POINT_FUNCTIONS)
    for entry, keywords in opts.ENTRY_POINT_FIELDS.items():
        taken = {item.name for item, declaration in opts.declarations() if entry in declaration.used_by}
        hints = typing.get_type_hints(keywords)
        assert set(hints) == taken, f"{keywords.__name__}: {set(hints) ^ taken} differ from used_by {entry!r}"
        assert hints == {name: field_types[name] for name in taken}, keywords.__name__
        assert not keywords.__required_keys__, keywords.__name__  # (each keyword may be left out)


@pytest.mark.parametrize(
    "entry",
    [
        opts.VERIFY,
        opts.DIFF,
        opts.RANKS,
        opts.CASES,
    ],
)  # fmt: skip
def test_an_entry_point_takes_its_keywords_and_the_groups_that_hold_them(entry: str) -> None:
    function = ENTRY_POINT_FUNCTIONS[entry]
    hints = typing.get_type_hints(function)  # (every name of the signature importable at run time)
    parameters = inspect.signature(function).parameters
    assert parameters["fields"].kind is inspect.Parameter.VAR_KEYWORD
    assert typing.get_args(hints["fields"]) == (opts.ENTRY_POINT_FIELDS[entry],), entry
    groups = {name for name, parameter in parameters.items() if parameter.kind is inspect.Parameter.KEYWORD_ONLY}
    taken = {
        group.__name__.lower()
        for group in opts.GROUPS
        if any(entry in declaration.used_by for _, declaration in opts.declarations(group))
    }
    assert taken <= groups, entry
    if entry != opts.CASES:  # (verify_cases takes outputs= too, to say why it does not apply to cases)
        assert groups == taken, entry
    assert all(hints[name] == getattr(opts, name.capitalize()) | None for name in groups), entry


def test_the_entry_points_type_hints_resolve() -> None:
    # typing.get_type_hints (documentation tools, runtime checkers): nothing only a type checker imports.
    for function in (verify, diff, rank_set.verify_rank_set):
        hints = typing.get_type_hints(function)
        assert {"fields", "return"} <= set(hints), function.__name__


def test_a_group_with_one_of_its_own_fields_is_a_type_error(tmp_path: Path) -> None:
    path = tmp_path / "never_opened.pt2"
    calls = {
        "verify": lambda **kw: verify(path, **kw),
        "diff": lambda **kw: diff(path, path, **kw),
        "verify_cases": lambda **kw: verify_cases(path, tmp_path, **kw),
        "verify_rank_set": lambda **kw: rank_set.verify_rank_set(str(path), **kw),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=rf"^{name}\(\) got tolerances= and atol=, a field of Tolerances"):
            call(tolerances=Tolerances(rtol=1e-3), atol=1e-3)
        with pytest.raises(TypeError, match=rf"^{name}\(\) got trust= and allow_pickle="):
            call(trust=Trust(), allow_pickle=False)  # (a default value too: which one was meant?)
        with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'atoll'"):
            call(atoll=1e-3)
        with pytest.raises(TypeError, match=rf"^{name}\(\): tolerances is a number \(atol and rtol\), a dict of "):
            call(tolerances="tight")
        with pytest.raises(TypeError, match=rf"^{name}\(\): tolerances has no field atoll"):
            call(tolerances={"atoll": 1e-3})
        with pytest.raises(VerifyInputError, match="check_error_stat is one of"):
            call(tolerances=Tolerances(check_error_stat="p95"))
    # What an entry point does not take, in a group or as a keyword, as a keyword it never had was.
    with pytest.raises(TypeError, match=r"^diff\(\) does not take strict"):
        diff(path, path, tolerances=Tolerances(strict=True))
    with pytest.raises(TypeError, match=r"^diff\(\) does not take extract"):
        diff(path, path, extract=None)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^diff\(\) got an unexpected keyword argument 'reference'"):
        diff(path, path, reference=Reference())  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^verify_rank_set\(\) does not take expected_from, isolate"):
        rank_set.verify_rank_set(str(path), reference=Reference(expected_from="b.pt2"), isolate=False)
    with pytest.raises(VerifyInputError, match="expected_from, save_outputs do not apply with cases"):
        verify_cases(path, tmp_path, reference=Reference(expected_from="b.pt2"), save_outputs="o.pt")  # type: ignore[call-arg]


def _comparable(report: Any) -> dict[str, Any]:
    """A report without what differs from run to run: its child's memory."""
    result = report.to_dict()
    for key in ("child_peak_extra_bytes", "child_peak_anonymous_bytes", "child_peak_file_bytes"):
        result.pop(key)
    result["notes"] = [note for note in result["notes"] if "run in a child process (" not in note]
    return dict(result)


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The request each child job is sent (JSON), the run going on as it would."""
    sent: list[dict[str, Any]] = []
    real = verifier.run_isolated  # (what verify, diff and rank sets run their child jobs through: report_of_child)

    def recording(request: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(encode(request))
        return real(request, *args, **kwargs)

    monkeypatch.setattr(verifier, "run_isolated", recording)
    yield sent


def test_keywords_and_groups_give_the_same_report(
    saved_seed: SavedSeed, tmp_path: Path, wire: list[dict[str, Any]]
) -> None:
    keywords: dict[str, Any] = dict(
        arg_inputs=[saved_seed.x], expected=list(saved_seed.compiled(saved_seed.x)), atol={0: 1e-3, "*": 1e-4},
        rtol=1e-3, check_error_stat="max", top_k=3, min_top_k_agreement=0.5, strict=True, random_inputs=1, seed=3,
        memory_limit="2GiB", timeout=300.0, save_outputs=tmp_path / "keywords.pt",
    )  # fmt: skip
    by_keywords = verify(saved_seed.bare, **keywords)
    by_groups = verify(
        saved_seed.bare,
        inputs=Inputs(arg_inputs=[saved_seed.x], random_inputs=1, seed=3),
        reference=Reference(expected=keywords["expected"]),
        tolerances=Tolerances(
            atol={0: 1e-3, "*": 1e-4}, rtol=1e-3, check_error_stat="max", top_k=3, min_top_k_agreement=0.5, strict=True
        ),
        isolation=Isolation(memory_limit="2GiB", timeout=300.0),
        outputs=Outputs(save_outputs=tmp_path / "groups.pt"),
        trust=Trust(),
    )
    assert by_keywords.ok and by_keywords.expected_source == "given" and len(by_keywords.random_runs) == 1
    assert any(output.top_k == 3 for output in by_keywords.outputs)
    assert _comparable(by_keywords) == _comparable(by_groups)
    first, second = wire
    tolerances = first["tolerances"]
    assert tolerances["atol"] == {"0": 1e-3, "*": 1e-4} and tolerances["check_error_stat"] == "max"
    assert first["inputs"]["seed"] == 3 and first["keep_outputs"] is True
    assert first == second
    saved = [torch.load(tmp_path / name, weights_only=True) for name in ("keywords.pt", "groups.pt")]
    assert all(torch.equal(a, b) for a, b in zip(*saved, strict=True))
    # In this process (isolate=False) as well, where nothing travels as JSON.
    here = verify(saved_seed.good, isolation=Isolation(isolate=False), tolerances=Tolerances(top_k=2))
    assert _comparable(here) == _comparable(verify(saved_seed.good, isolate=False, top_k=2))


def test_diff_takes_the_groups(saved_seed: SavedSeed, wire: list[dict[str, Any]]) -> None:
    by_groups = diff(
        saved_seed.good, saved_seed.bare,
        inputs=Inputs(arg_inputs=[saved_seed.x]), tolerances=Tolerances(atol=1e-3, top_k=2),
        trust=Trust(), isolation=Isolation(memory_limit="2GiB"),
    )  # fmt: skip
    by_keywords = diff(saved_seed.good, saved_seed.bare, arg_inputs=[saved_seed.x], atol=1e-3, top_k=2,
                       memory_limit="2GiB")  # fmt: skip
    assert by_groups.ok and by_groups.boundaries
    assert _comparable(by_groups) == _comparable(by_keywords)
    assert wire[0] == wire[1] and wire[0]["path_b"] == str(saved_seed.bare) and wire[0]["tolerances"]["top_k"] == 2


def test_cases_take_the_groups(saved_seed: SavedSeed, tmp_path: Path) -> None:
    case = tmp_path / "cases" / "one"
    case.mkdir(parents=True)
    torch.save([saved_seed.x], case / "inputs.pt")
    torch.save(list(saved_seed.compiled(saved_seed.x)), case / "expected.pt")
    by_groups = verify_cases(saved_seed.bare, case.parent, tolerances=Tolerances(atol=1e-3),
                             isolation=Isolation(memory_limit="2GiB"))  # fmt: skip
    by_keywords = verify_cases(saved_seed.bare, case.parent, atol=1e-3, memory_limit="2GiB")
    assert [r.status for r in by_groups] == [r.status for r in by_keywords] == ["PASS"]
    assert by_groups[0].report is not None and by_keywords[0].report is not None
    assert _comparable(by_groups[0].report) == _comparable(by_keywords[0].report)


# A gloo process group in the test's own process: with the rank-set tests (--tensor-parallel, .ci/run), not in a
# long-lived worker, where torch 2.5's gloo teardown waits forever for its threads.
@pytest.mark.tensor_parallel
def test_a_rank_set_takes_the_groups(
    saved_seed: SavedSeed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wire: list[dict[str, Any]]
) -> None:
    # A rank set of one, in this process's own process group: its file (saved alone) is refused by the set's
    # agreement, after its child opened it with the options it was sent.
    (tmp_path / "m_rank0_of_1.pt2").write_bytes(saved_seed.good.read_bytes())
    template = str(tmp_path / "m_rank{rank}_of_{world_size}.pt2")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)), ("RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    groups = dict(reference=Reference(per_engine=True), tolerances=Tolerances(atol=1e-3, strict=True),
                  trust=Trust(allow_ops=("aten::sin",)), isolation=Isolation(memory_limit="2GiB"))  # fmt: skip
    by_groups = rank_set.verify_rank_set(template, **groups)  # type: ignore[arg-type]
    assert "holds no rank manifest" in by_groups.ranks[0]["error"]
    sent = wire[0]
    assert sent["reference"]["per_engine"] is True and sent["tolerances"]["atol"] == 1e-3
    assert sent["trust"]["allow_ops"] == ["aten::sin"]
    # The keywords make the same groups (a second rank set would start a second fresh interpreter: seconds).
    keywords = dict(per_engine=True, atol=1e-3, strict=True, allow_ops=["aten::sin"], memory_limit="2GiB")
    options = opts.gather(opts.RANKS, keywords, reference=None, tolerances=None, trust=None, isolation=None)
    assert options == opts.gather(opts.RANKS, {}, **groups)


def test_groups_are_frozen_values() -> None:
    trust = Trust(allow_ops=["aten::sin"])
    assert trust.allow_ops == ("aten::sin",) and hash(trust) == hash(Trust(allow_ops=("aten::sin",)))
    with pytest.raises(AttributeError):
        trust.allow_pickle = True  # type: ignore[misc]
    assert replace(Tolerances(atol=1e-3), rtol=1e-2) == Tolerances(atol=1e-3, rtol=1e-2)
