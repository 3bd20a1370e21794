"""The argument groups every command subscribes to: each flag declared once, with its help and who takes it.

The option groups of :mod:`trt_inline.verify.options` (inputs, reference, tolerances, trust, isolation,
outputs) and the command line's own flags (:class:`CommandFlags`) declare each flag once with the entry
points that take it; a command adds the flags of its entry points (:func:`add_flags`) and only its own
arguments beside them, and reads them back as the groups (:func:`options_of`).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trt_inline.verify.options import (
    CASES,
    CHECK,
    DIFF,
    ENTRY_POINTS,
    GROUPS,
    INSPECT,
    RANKS,
    VERIFY,
    Declaration,
    Inputs,
    Isolation,
    Options,
    Outputs,
    Reference,
    Tolerances,
    Trust,
    declarations,
    declared,
    from_flags,
)

__all__ = [
    "COMMANDS",
    "CommandFlags",
    "OneLineParser",
    "add_flags",
    "argparse_keywords",
    "flag_default",
    "flags",
    "given_but_not_for",
    "options_of",
]


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr and exit 2, like every other unusable input (``--help`` shows usage)."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (--help shows usage)\n")


@dataclass(frozen=True)
class CommandFlags:
    """The flags of the command line alone (the files it reads, what it prints, verify's modes), declared as the
    options of :mod:`trt_inline.verify.options` are: each once, with its help text and who takes it."""

    # fmt: off
    inputs: str | None = field(default=None, metadata=declared(
        "torch.save'd tensor, list of tensors, or {'args', 'kwargs'}", "--inputs", used_by=(VERIFY, DIFF),
        help_for={DIFF: "torch.save'd inputs (default: the reference inputs embedded in A, else in B)"}))
    expected: str | None = field(default=None, metadata=declared(
        "torch.save'd tensor or list of tensors: the expected outputs", "--expected", used_by=(VERIFY,)))
    cases: str | None = field(default=None, metadata=declared(
        "verify PATH on every case of DIR, each a folder DIR/CASE holding inputs.pt (as --inputs) and "
        "expected.pt (as --expected): one verdict per case, the worst first; the exit status is the worst's",
        "--cases", used_by=(VERIFY, CASES), metavar="DIR"))
    ranks: int | None = field(default=None, metadata=declared(
        "verify a tensor-parallel rank set: PATH is a template ('model_rank{rank}_of_{world_size}.pt2'), "
        "N ranks are started through torch.distributed.run, each verifies its file in its own sandbox, their "
        "collectives are relayed; one report (the same as running this command under torchrun without --ranks)",
        "--ranks", used_by=(VERIFY, RANKS), type=int, metavar="N"))
    plot: str | None = field(default=None, metadata=declared(
        "draw the per-boundary errors (needs matplotlib: pip install trt-inline[plot])",
        "--plot", used_by=(VERIFY, DIFF), metavar="FILE.png"))
    json: bool = field(default=False, metadata=declared(
        "print the report as JSON", "--json", used_by=(VERIFY, DIFF, CASES, RANKS, INSPECT, CHECK),
        action="store_true", help_for={INSPECT: "print the table's lines and what each engine needs as JSON",
                                       CHECK: "print each engine's needs, the machine and the reasons as JSON"}))
    target: str | None = field(default=None, metadata=declared(
        "the deployment machine instead of this one: cc=8.9,platform=linux_x86_64,torch_tensorrt=2.13.0 "
        "(cc=8.9+9.0 for several GPUs; abi=9 instead of a release; any part left out is not checked), or the "
        ".json that trt-inline doctor --json wrote there", "--target", used_by=(CHECK,), metavar="DESCRIPTION"))
    junit: str | None = field(default=None, metadata=declared(
        "also write the verdict as a JUnit XML report (what CI systems display): a test case per file and case, "
        "a failure per output or engine boundary that differs",
        "--junit", used_by=(VERIFY, DIFF, CASES), metavar="FILE.xml"))
    progress: bool = field(default=False, metadata=declared(
        "report each phase of long work on stderr (the default when stderr is a terminal; never with --json)",
        "--progress", used_by=ENTRY_POINTS, action="store_true"))
    # fmt: on


# The order --help lists the flags in; each command shows those its entry points take (COMMANDS).
HELP_ORDER = (
    "--inputs", "--expected", "--expected-from", "--strict", "--cases", "--per-engine", "--save-boundaries",
    "--load-boundaries", "--extract", "--ranks", "--atol", "--rtol", "--check-error-stat", "--device",
    "--random-inputs", "--seed", "--range-ends", "--save-outputs", "--plot", "--json", "--target", "--top-k",
    "--min-top-k-agreement", "--junit",
    "--allow-pickle", "--allow-native-code", "--allow-op", "--timeout", "--memory-limit", "--progress", "--no-sandbox",
    "--verbose", "--debug",
)  # fmt: skip
# The entry points of each command: verify's flags are also those of its modes (--cases DIR, --ranks N).
COMMANDS = {"verify": {VERIFY, CASES, RANKS}, "diff": {DIFF}, "inspect": {INSPECT}, "check": {CHECK}}


def flags() -> list[tuple[dataclasses.Field[Any], Declaration]]:
    """Every declared option that has a flag, the groups' and the command line's own, in --help's order."""
    found = [(item, declaration) for item, declaration in declarations(*GROUPS, CommandFlags) if declaration.flags]
    return sorted(found, key=lambda pair: HELP_ORDER.index(pair[1].flags[0]))


def flag_default(item: dataclasses.Field[Any], declaration: Declaration) -> Any:
    """What a flag not given leaves: the field's default, as argparse holds it."""
    default: Any = item.default
    if declaration.action in ("store_true", "store_false"):
        return declaration.action == "store_false"
    if declaration.action == "append" and default is not None:
        return list(default)  # (argparse appends to a copy of it)
    return default


def argparse_keywords(item: dataclasses.Field[Any], declaration: Declaration, command: str | None) -> dict[str, Any]:
    """``add_argument``'s keywords for a declared option of ``command`` (None: before the command): parsed into the
    field's name, with the help text that command shows."""
    text = declaration.help if command is None else declaration.help_of(COMMANDS[command])
    keywords: dict[str, Any] = {
        "dest": item.name,
        "action": declaration.action,
        "help": text.replace("%", "%%"),
    }
    if declaration.action in ("store", "append"):
        keywords["default"] = flag_default(item, declaration)
    for name in ("type", "metavar", "choices"):
        if getattr(declaration, name) is not None:
            keywords[name] = getattr(declaration, name)
    return keywords


def add_flags(parser: argparse.ArgumentParser, command: str | None) -> None:
    """The declared flags of ``command`` (None: the flags given before the command) to its parser."""
    for item, declaration in flags():
        if command is None:
            wanted = declaration.before_command
        else:
            wanted = not declaration.before_command and bool(declaration.used_by & COMMANDS[command])
        if wanted:
            parser.add_argument(*declaration.flags, **argparse_keywords(item, declaration, command))


def options_of(args: argparse.Namespace) -> Options:
    """Every option group as this command line gave it (its flags are declared by the groups' fields)."""
    given = vars(args)
    return Options(
        inputs=from_flags(Inputs, given),
        reference=from_flags(Reference, given),
        tolerances=from_flags(Tolerances, given),
        trust=from_flags(Trust, given),
        isolation=from_flags(Isolation, given),
        outputs=from_flags(Outputs, given),
    )


def given_but_not_for(args: argparse.Namespace, entry: str) -> list[str]:
    """The flags of this command line, other than at their defaults, that ``entry`` (a mode of verify) does not take."""
    given = vars(args)
    return [
        declaration.flags[0]
        for item, declaration in flags()
        if item.name in given
        and entry not in declaration.used_by
        and given[item.name] != flag_default(item, declaration)
    ]
