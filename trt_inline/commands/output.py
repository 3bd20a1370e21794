"""What every command writes: the report printed with control characters escaped, its JUnit file and chart, the
exit status of a verdict; and the tensor files a command line names, read by the strict reader."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any

from trt_inline.errors import StdoutGone, TrtInlineError, first_line, printable
from trt_inline.verify.cases import CaseResult, load_tensor_file, split_inputs
from trt_inline.verify.report import EXIT_STATUS

__all__ = [
    "StdoutGone",
    "check_outputs",
    "finish",
    "inputs_file",
    "junit_of_error",
    "print_lines",
    "print_text",
    "write_junit",
]


def inputs_file(path: str | None) -> tuple[list[Any] | None, dict[str, Any] | None]:
    if path is None:
        return None, None
    return split_inputs(load_tensor_file(path, "inputs"))


def finish(report: Any, args: argparse.Namespace, *, unverified: str | None) -> int:
    """Print the report (text or JSON), draw its chart and write its JUnit file if asked; the exit status."""
    write_junit(args, [CaseResult(report.source, None, report, seconds=time.monotonic() - args.started)])
    if args.plot is not None:
        from trt_inline.commands.plot import plot_boundaries

        plot_boundaries(report, args.plot)
    print_text(report.to_json() if args.json else report.to_text())
    if report.problems:
        return 1
    if unverified is not None and not report.compared:
        print(f"trt-inline {args.command}: UNVERIFIED: {unverified}", file=sys.stderr)
        return EXIT_STATUS["UNVERIFIED"]
    return 0


def write_junit(args: argparse.Namespace, results: list[CaseResult]) -> None:
    """With ``--junit FILE``: the verdicts written there (:mod:`trt_inline.commands.junit`), once."""
    if getattr(args, "junit", None) is None:
        return
    from trt_inline.commands.junit import write_junit

    write_junit(args.junit, results, f"trt-inline {args.command}")
    args.junit_written = True


def junit_of_error(args: argparse.Namespace, exc: BaseException) -> None:
    """With ``--junit FILE``: an error that stopped ``verify`` or ``diff`` written there as the file's error (a CI
    job shows it with the rest), unless the verdicts were written already or the file cannot be."""
    if getattr(args, "junit", None) is None or getattr(args, "junit_written", False):
        return
    source = args.path if args.command == "verify" else f"{args.path_a} against {args.path_b}"
    error = first_line(exc) if isinstance(exc, TrtInlineError) else f"{type(exc).__name__}: {first_line(exc)}"
    with contextlib.suppress(OSError, TrtInlineError):  # (the one line on stderr says what went wrong)
        write_junit(args, [CaseResult(source, None, None, error, time.monotonic() - args.started)])


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse an unwritable --plot or --junit before the (possibly long) run, not after it (the files verify and
    diff write themselves, they check before they start)."""
    if args.plot is not None:
        from trt_inline.commands.plot import check_plot_target

        check_plot_target(args.plot)
    if getattr(args, "junit", None) is not None:
        from trt_inline.verify.verifier import save_target

        save_target(args.junit, "--junit")


def print_text(text: str) -> None:
    """Print a report line by line with control characters escaped: nothing from a file reaches the terminal raw.

    Strings from a file were escaped where they were decoded (no newline of theirs is left to split on);
    this escapes again whatever reaches the terminal.
    """
    print_lines(text.split("\n"))


def print_lines(lines: list[str]) -> None:
    try:
        print("\n".join(printable(line) for line in lines))
        sys.stdout.flush()  # (here, where a reader that left is seen, not at the interpreter's exit)
    except BrokenPipeError:
        raise StdoutGone() from None
