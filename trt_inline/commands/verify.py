"""``trt-inline verify PATH``: one file's verdict, or one per case of ``--cases DIR``; ``--ranks N`` and a
template under torchrun are a rank set's (:mod:`trt_inline.commands.ranks`).

The verification itself is :func:`trt_inline.verify` (:mod:`trt_inline.verify`): this module reads the command
line into its option groups and writes what it hands back.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from trt_inline.commands import ranks
from trt_inline.commands.arguments import add_flags, given_but_not_for, options_of
from trt_inline.commands.output import check_outputs, finish, print_text, write_junit
from trt_inline.errors import VerifyInputError
from trt_inline.verify.cases import CaseResult, expected_outputs, load_tensor_file, split_inputs
from trt_inline.verify.options import CASES
from trt_inline.verify.report import EXIT_STATUS

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "verify",
        help="check a saved ExportedProgram or AOTInductor package: loads safely, graph sound, outputs match",
        description="Exit 0: passed. 1: a structural problem or an output mismatch. 2: unusable or refused input, "
        "or the child process that loads the file hit a limit or crashed.",
    )
    parser.add_argument("path")
    add_flags(parser, "verify")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trt_inline.verify import verify

    if args.ranks is not None:
        return ranks.launch_from(args)
    if ranks.under_launcher(args.path):
        return ranks.run_rank(args)
    check_outputs(args)
    if args.cases is not None:
        return _run_cases(args)
    if args.expected is not None and args.inputs is None:
        raise VerifyInputError("--expected needs --inputs: the inputs the expected outputs were computed from")
    if args.inputs is not None and args.expected_from is not None:
        raise VerifyInputError("--expected-from replaces --inputs/--expected; give one or the other")
    if args.load_boundaries is not None and (args.inputs is not None or args.expected_from is not None):
        raise VerifyInputError(
            "--load-boundaries is the reference: give it without --inputs/--expected/--expected-from"
        )
    arg_inputs = kwarg_inputs = expected = None
    if args.inputs is not None:
        arg_inputs, kwarg_inputs = split_inputs(load_tensor_file(args.inputs, "inputs"))
        if args.expected is not None:
            expected = expected_outputs(load_tensor_file(args.expected, "expected"))
    options = options_of(args)
    report = verify(
        args.path,
        inputs=replace(options.inputs, arg_inputs=arg_inputs, kwarg_inputs=kwarg_inputs),
        reference=replace(options.reference, expected=expected),
        tolerances=options.tolerances,
        trust=options.trust,
        isolation=options.isolation,
        outputs=options.outputs,
    )
    return finish(
        report,
        args,
        unverified=(
            f"{args.path} ran on the inputs in {args.inputs}, with nothing to compare its outputs with: give the "
            "expected outputs with --expected FILE"
            if args.inputs is not None
            else f"{args.path} carries no reference I/O: structural checks passed, comparing outputs needs "
            "--inputs FILE --expected FILE or --expected-from NEW.pt2"
        ),
    )


# The exit status of a set of cases is its worst case's: as that verdict exits for one file (ERROR: 2, unusable
# input).
_CASE_EXIT = {status: EXIT_STATUS[status] for status in ("ERROR", "FAIL", "UNVERIFIED", "PASS")}


def _run_cases(args: argparse.Namespace) -> int:
    """``verify PATH --cases DIR``: one verify per case, one verdict per case (the worst first), the worst's exit."""
    from trt_inline.verify.cases import verify_cases

    given = given_but_not_for(args, CASES)
    if given:
        raise VerifyInputError(f"--cases gives each case its inputs and expected outputs, and writes one report: "
                               f"{', '.join(given)} do not apply with it")  # fmt: skip
    options = options_of(args)
    results = verify_cases(
        args.path,
        args.cases,
        inputs=options.inputs,
        reference=options.reference,
        tolerances=options.tolerances,
        trust=options.trust,
        isolation=options.isolation,
    )
    write_junit(args, results)
    if args.json:
        document = [
            {"case": r.case, "status": r.status, "error": r.error, "report": r.report and r.report.to_dict()}
            for r in results
        ]
        print_text(json.dumps(document, indent=2, sort_keys=True))
    else:
        print_text("\n".join(_cases_text(results, args.path, args.cases)))
    for result in results:
        if result.error is not None:
            print(f"trt-inline verify: case {result.case}: {result.error}", file=sys.stderr)
    return _CASE_EXIT.get(results[0].status, 2)


def _cases_text(results: list[CaseResult], path: str, folder: str) -> list[str]:
    """The verdicts in a table, the worst first, then each case's report."""
    counts = ", ".join(
        f"{sum(r.status == status for r in results)} {status}"
        for status in _CASE_EXIT
        if any(r.status == status for r in results)
    )
    width, status_width = max(len(r.case or "") for r in results), max(len(r.status) for r in results)
    lines = [f"{len(results)} cases of {path} in {folder} ({counts}), the worst first:"]
    for result in results:
        lines.append(f"  {result.status:<{status_width}}  {result.case or '':<{width}}  {_case_summary(result)}")
    for result in results:
        lines += ["", f"case {result.case}:"]
        lines.append(f"ERROR {result.error}" if result.report is None else result.report.to_text())
    return lines


def _case_summary(result: CaseResult) -> str:
    """A case's verdict in a few words: its error, its first problem, or its worst output's error and SQNR."""
    report = result.report
    if report is None:
        return result.error or ""
    if report.problems:
        more = len(report.problems) - 1
        return report.problems[0][:200] + (f" (and {more} more)" if more else "")
    if not report.outputs:
        return "outputs not compared"
    worst = max(report.outputs, key=lambda output: output.max_abs_diff)
    sqnrs = [output.sqnr_db for output in report.outputs if output.sqnr_db is not None]
    return f"{worst.error_text()}" + (f", lowest SQNR {min(sqnrs):.3g} dB" if sqnrs else "")
