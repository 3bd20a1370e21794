"""``trt-inline`` (``python -m trt_inline``): the dispatcher of the commands of :mod:`trt_inline.commands`.

It builds the parser from each command's own (``add_parser``), runs the command's ``run``, and holds what
every command shares: errors print one line on stderr and exit 2 (unusable input) or 1 (a check
failed). Warnings and log records torch emits while loading a file are kept off
stderr; ``--debug`` shows them, the traceback of an error, and trt_inline's own
DEBUG records (the graph before and after each pass).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence

from trt_inline import progress
from trt_inline.commands import check, diff, doctor, fix, inspect, verify
from trt_inline.commands.arguments import OneLineParser, add_flags
from trt_inline.commands.output import junit_of_error
from trt_inline.errors import StdoutGone, TrtInlineError, first_line
from trt_inline.isolation import reusing_interpreter
from trt_inline.isolation.interpreter import take_prestarted
from trt_inline.logs import debug_to_stderr

__all__ = ["main"]

# The commands, in the order --help lists them.
COMMANDS = (doctor, verify, diff, inspect, check, fix)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="trt-inline", description="Correct ExportedProgram saves of Torch-TensorRT modules.")
    add_flags(parser, None)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


@contextlib.contextmanager
def _quiet(debug: bool) -> Iterator[None]:
    """Unless debugging: no warnings and no log records reach stderr; both restored afterwards."""
    if debug:
        with debug_to_stderr(True):
            yield
        return
    previous = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            yield
        finally:
            logging.disable(previous)


def _shows_progress(args: argparse.Namespace) -> bool:
    """Progress lines on stderr: asked for, or stderr a terminal; never with --json."""
    if getattr(args, "json", False) or not hasattr(args, "progress"):
        return False
    return bool(args.progress) or sys.stderr.isatty()


def _forking_interpreter() -> contextlib.AbstractContextManager[None]:
    """The command's children forked from the interpreter ``trt-inline`` started before it imported torch
    (:mod:`trt_inline.__main__`), where it did; otherwise each child starts as it would."""
    started = take_prestarted()
    return contextlib.nullcontext() if started is None else reusing_interpreter(started)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.argv = None if argv is None else list(argv)
    args.started = time.monotonic()  # (a JUnit report says how long each case took)
    try:
        with _quiet(args.debug), progress.printing(_shows_progress(args)), _forking_interpreter():
            code: int = args.run(args)
        return code
    except StdoutGone:
        # The reader of stdout left (``| head -1``): no traceback, nothing more to write there, and the status of
        # a program a closed pipe stopped (never 0: the verdict was not all written).
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except Exception as exc:
        junit_of_error(args, exc)
        if args.debug:
            traceback.print_exc()
        else:
            kind = "" if isinstance(exc, TrtInlineError) else f"{type(exc).__name__}: "
            print(f"trt-inline {args.command}: {kind}{first_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
