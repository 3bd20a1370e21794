"""``trt-inline diff A.pt2 B.pt2``: two saves of one model on the same inputs, compared at every engine boundary
(:func:`trt_inline.diff`; B is the reference)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from trt_inline.commands.arguments import add_flags, options_of
from trt_inline.commands.output import check_outputs, finish, inputs_file

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "diff",
        help="run two saves of one model on the same inputs and compare them at every engine boundary",
        description="B is the reference. Exit 0: every boundary agrees within tolerance. 1: they diverge (the "
        "first divergence is named). 2: unusable or refused input.",
    )
    parser.add_argument("path_a", metavar="A.pt2")
    parser.add_argument("path_b", metavar="B.pt2")
    add_flags(parser, "diff")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trt_inline.verify import diff

    check_outputs(args)
    arg_inputs, kwarg_inputs = inputs_file(args.inputs)
    options = options_of(args)
    report = diff(
        args.path_a,
        args.path_b,
        inputs=replace(options.inputs, arg_inputs=arg_inputs, kwarg_inputs=kwarg_inputs),
        tolerances=options.tolerances,
        trust=options.trust,
        isolation=options.isolation,
        outputs=options.outputs,
    )
    return finish(report, args, unverified=None)
