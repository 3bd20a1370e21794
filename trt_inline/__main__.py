"""The ``trt-inline`` command (the script, and ``python -m trt_inline``): its child's interpreter started before
torch is imported here.

``verify``, ``diff``, ``inspect`` and ``doctor`` open files in a child forked from a clean interpreter
(:mod:`trt_inline.isolation`). Importing torch takes a second or two in each process; started first,
that interpreter imports it while this one does, and the command's child is forked from it, as
``reusing_interpreter`` forks them (:mod:`trt_inline.isolation.interpreter`). Every other command (and
``--help``) starts nothing. The command line itself is :mod:`trt_inline.cli`; ``import trt_inline`` imports
neither it nor torch (:mod:`trt_inline.importing`), so ``python -m trt_inline`` starts the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

from trt_inline.isolation.interpreter import prestart

# The commands whose run opens a file in a child forked from the interpreter; --ranks starts its own children.
_FORKING = frozenset({"verify", "diff", "inspect", "doctor"})
_NOT_FORKING_FLAGS = ("--help", "--ranks")


def forks_a_child(argv: list[str]) -> bool:
    """Whether this command line will fork a child from the interpreter (its command, and no flag that runs
    without one, as argparse reads it: ``-h``, or ``--help`` / ``--ranks`` or a prefix of either, ``--he``);
    a flag's value taken for the command only costs an interpreter started for nothing."""
    command = next((word for word in argv if not word.startswith("-")), None)
    if command not in _FORKING:
        return False
    for word in argv:
        flag = word.split("=", 1)[0]
        if flag == "-h" or (len(flag) >= 3 and any(full.startswith(flag) for full in _NOT_FORKING_FLAGS)):
            return False
    return True


def start_for(argv: list[str]) -> None:
    """Start the interpreter the command's child is forked from, where this command line forks one."""
    if forks_a_child(argv):
        prestart()


def main() -> int:
    start_for(sys.argv[1:])
    from trt_inline.cli import main as command_line

    exit_with(command_line())
    return 2  # (not reached)


def exit_with(code: int) -> None:
    """End the process once its exit handlers ran and its streams are flushed, without the interpreter's
    teardown of torch's modules: half a second on two cores spent on nothing the command still needs."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # (None where the caller started it with that descriptor closed)
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
