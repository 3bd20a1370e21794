"""``trt-inline inspect PATH``: the table of a file's engines, fallback ops and their wiring, and what each engine
needs, read in a sandboxed child (:class:`InspectRequest`, :func:`inspect_job`) and printed here."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from trt_inline import allowed_ops
from trt_inline.codec import wire
from trt_inline.commands.arguments import add_flags
from trt_inline.commands.check import MAX_ENGINES, engine_lines
from trt_inline.commands.output import print_lines, print_text
from trt_inline.engine_fields import EngineInfo
from trt_inline.errors import VerifyInputError, first_line, printable
from trt_inline.isolation import job
from trt_inline.verify.options import Isolation, Trust, for_child, from_flags

__all__ = ["InspectRequest", "InspectResponse", "add_parser", "inspect_job", "run"]


@dataclass(frozen=True)
class InspectRequest:
    """What an ``inspect`` child is sent: the file, and what it may do."""

    path: str
    trust: Trust

    @classmethod
    def of(cls, path: str, trust: Trust) -> InspectRequest:
        return cls(path, for_child(trust))


@dataclass(frozen=True)
class InspectResponse:
    """What an ``inspect`` child hands back: the table's lines, and its engines' infos."""

    lines: list[str]
    engines: list[EngineInfo] = field(metadata=wire(max_items=MAX_ENGINES))


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("inspect", help="table of engines, fallback ops and their wiring")
    parser.add_argument("path")
    add_flags(parser, "inspect")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trt_inline.archive.reader import check_path
    from trt_inline.isolation import Limits, run_isolated

    trust, isolation = from_flags(Trust, vars(args)), from_flags(Isolation, vars(args))
    check_path(args.path)  # (said at once, before a child starts)
    limits = Limits.for_file(args.path, isolation.timeout, isolation.memory_limit)
    result = run_isolated(
        InspectRequest.of(args.path, trust), None, limits, where=args.path, files=(args.path,),
        sandbox=isolation.sandbox, debug=isolation.debug,
    )  # fmt: skip
    answer: InspectResponse = result.value
    lines, engines = answer.lines, answer.engines
    if args.json:
        document = {"path": args.path, "lines": [printable(line) for line in lines],
                    "engines": [info.to_dict() for info in engines]}  # fmt: skip
        print_text(json.dumps(document, indent=2))
    else:
        print_lines(lines)
    if result.sandbox is None:
        print("note: opened WITHOUT the OS sandbox (--no-sandbox)", file=sys.stderr)
    return 0


@job(InspectRequest, response=InspectResponse)
def inspect_job(request: InspectRequest, tensors: Any) -> InspectResponse:
    """The ``inspect`` table of a file, line by line, and what its TensorRT engines need, inside the child process
    (its program loaded without weights; its engines' infos read as data first, nothing deserialized)."""
    from trt_inline.archive.engine_info import read_engine_infos
    from trt_inline.archive.loading import open_file
    from trt_inline.verify.graph_table import describe_file

    path, trust = request.path, request.trust
    _, engines = read_engine_infos(path, allow_pickle=trust.allow_pickle)
    needs = engine_lines(engines)
    if engines and not trust.allow_native_code:
        return InspectResponse([*needs, "engines and fallbacks are shown with --allow-native-code: loading the "
                                "program deserializes its TensorRT engines (native code; only for a file from a "
                                "trusted source)"], engines)  # fmt: skip
    # Collectives, and ATen operators verify refuses for what they compute, are shown, not run: inspect runs
    # nothing. What verify would refuse is said first.
    with allowed_ops.allowing((), collectives=True), allowed_ops.showing_refusals() as refused:
        try:
            loaded = open_file(
                path,
                allow_pickle=trust.allow_pickle,
                allow_native_code=trust.allow_native_code,
                allow_ops=trust.allow_ops,
                weights=False,
            )
        except VerifyInputError as exc:  # (its engines' needs are still worth showing: why it does not load here)
            if not engines:
                raise
            return InspectResponse([*needs, f"the program was not loaded here: {first_line(exc)}"], engines)
        table = describe_file(loaded).split("\n")
    warnings = [f"warning: verify refuses this file: a node or engine step {why}" for why in dict.fromkeys(refused)]
    return InspectResponse(warnings + table + needs, engines)
