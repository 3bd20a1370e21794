"""The options of ``verify``, ``diff``, rank sets and ``verify --cases``, declared once, in six frozen groups.

====================  ===========================================================================
group                 what it says
====================  ===========================================================================
:class:`Inputs`       what the program runs on, and where: inputs, random inputs, device
:class:`Reference`    what its outputs are compared with: expected outputs or module, another
                      file's reference I/O, a boundaries file; engine by engine or not
:class:`Tolerances`   how close is close enough, and what fails: tolerances, error statistic,
                      top-k agreement, warnings failing too
:class:`Trust`        what a file may do beyond the safe default: pickles, native code, operators
:class:`Isolation`    where a file is opened and within which limits: a sandboxed child process
:class:`Outputs`      the files written besides the report
====================  ===========================================================================

Each field is declared here and nowhere else: its type, its default, and in its ``metadata``
(:class:`Declaration`) its help text, its command-line flag and the entry points that take it. The
``trt-inline`` command line builds its flags from these declarations (:func:`from_flags` reads them
back), and every entry point takes the groups, or any field as a keyword of its own
(``verify(path, atol=1e-3)``, as before the groups): :func:`gather` makes the groups of both,
refuses a group given together with one of its own fields as a keyword, and a field the entry
point does not take. A child's job is sent the groups themselves (in its request:
:class:`~trt_inline.verify.verifier.VerifyRequest`), as :func:`for_child` makes them: how each
field travels, or that it stays in the calling process (tensors, a module), is declared beside it
too (:func:`trt_inline.codec.wire`).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict, TypeVar

import torch

from trt_inline.codec import wire, wire_of
from trt_inline.errors import VerifyInputError
from trt_inline.verify.compare import ERROR_STATS, Criteria, tolerance_key
from trt_inline.verify.range_ends import GROWTH, MODES, SMALL_BYTES, modes_checked

__all__ = [
    "CASES",
    "DIFF",
    "ENTRY_POINT_FIELDS",
    "ENTRY_POINTS",
    "FUNCTIONS",
    "KEYWORD_ENTRY_POINTS",
    "GROUPS",
    "INSPECT",
    "CHECK",
    "RANKS",
    "VERIFY",
    "CasesFields",
    "Declaration",
    "DiffFields",
    "Inputs",
    "InputsFields",
    "Isolation",
    "IsolationFields",
    "OptionGroup",
    "Options",
    "Outputs",
    "OutputsFields",
    "RankSetFields",
    "Reference",
    "ReferenceFields",
    "Tolerances",
    "TolerancesFields",
    "Trust",
    "TrustFields",
    "VerifyFields",
    "declaration",
    "declarations",
    "error_stat_checked",
    "for_child",
    "from_flags",
    "gather",
    "normalize_tolerance",
    "renamed_tolerances",
    "as_tolerances",
    "parse_tolerance",
    "top_k_checked",
    "untaken",
]

# The entry points an option may be taken by: the functions, and the command line's inspect. ``cases`` and
# ``ranks`` are verify's modes (``verify --cases DIR``, ``verify --ranks N``): their flags are verify's.
VERIFY, DIFF, CASES, RANKS, INSPECT, CHECK = "verify", "diff", "cases", "ranks", "inspect", "check"
ENTRY_POINTS = (VERIFY, DIFF, CASES, RANKS, INSPECT, CHECK)
# How an entry point is named where it refuses something.
FUNCTIONS: dict[str, str] = {
    VERIFY: "verify", DIFF: "diff", CASES: "verify_cases", RANKS: "verify_rank_set", INSPECT: "inspect",
    CHECK: "check_engines",
}  # fmt: skip
# The entry points that take the fields as keywords, and the name of their TypedDict.
KEYWORD_ENTRY_POINTS = {VERIFY: "VerifyFields", DIFF: "DiffFields", CASES: "CasesFields", RANKS: "RankSetFields"}


@dataclass(frozen=True)
class Declaration:
    """An option's help text (what ``--help`` shows), its command-line flag, and the entry points that take it.

    ``flags``: its spelling(s) on the command line, () for an option of the Python API alone (tensors, a module).
    ``action``, ``type``, ``metavar``, ``choices``: as :meth:`argparse.ArgumentParser.add_argument` takes them;
    the flag's default is the field's (a list for ``append``). ``parse``: the flag's value (and the flag) to the
    field's. ``before_command``: given before the command (``trt-inline --debug verify ...``). ``help_for``:
    (entry point, help) pairs, the help text the command of that entry point shows instead of ``help``
    (:meth:`help_of`; ``diff``'s ``--inputs`` says where diff's default inputs come from).
    """

    help: str
    flags: tuple[str, ...] = ()
    used_by: frozenset[str] = frozenset(ENTRY_POINTS)
    action: str = "store"
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[Any, str], Any] | None = None
    before_command: bool = False
    help_for: tuple[tuple[str, str], ...] = ()

    def help_of(self, entries: Collection[str]) -> str:
        """The help text of the command that takes ``entries``: its own (``help_for``), else ``help``."""
        own = {text for entry, text in self.help_for if entry in entries}
        if len(own) > 1:
            raise ValueError(
                f"{self.flags or self.help!r}: one help text per command, {len(own)} for {sorted(entries)}"
            )
        return own.pop() if own else self.help


def declared(
    help: str,
    *flags: str,
    used_by: Sequence[str] = ENTRY_POINTS,
    help_for: Mapping[str, str] | None = None,
    travels: Mapping[str, Any] | None = None,
    **how: Any,
) -> dict[str, Any]:
    """A field's ``metadata``: its :class:`Declaration` (``help_for``: by entry point, the help its command shows
    instead of ``help``); ``travels``: how it is sent to a child (:func:`trt_inline.codec.wire`; default: as its
    annotation says)."""
    own = tuple(sorted((help_for or {}).items()))
    for entry, _ in own:
        if entry not in used_by:
            raise ValueError(f"help_for {entry!r}: an entry point the option is not used by ({sorted(used_by)})")
    return {"option": Declaration(help, flags, frozenset(used_by), help_for=own, **how), **(travels or {})}


def declaration(item: dataclasses.Field[Any]) -> Declaration:
    """The :class:`Declaration` of a field of a group (or of the command line's own flags)."""
    found = item.metadata.get("option")
    if not isinstance(found, Declaration):
        raise TypeError(f"option {item.name} is not declared: field(metadata=declared(...))")
    return found


def declarations(*classes: type) -> Iterator[tuple[dataclasses.Field[Any], Declaration]]:
    """Every field of ``classes`` (default: the groups) with its declaration, in the order declared."""
    for cls in classes or GROUPS:
        for item in fields(cls):
            yield item, declaration(item)


# ----------------------------------------------------------------------------------------------------------------
# Checks of the values (the entry points make them before anything runs)


def normalize_tolerance(tolerance: float | Mapping[Any, float] | None) -> float | dict[str, float] | None:
    """One tolerance for every value, or one per output or engine (:func:`~trt_inline.verify.compare.tolerance_key`)."""
    if tolerance is None or isinstance(tolerance, (int, float)):
        return None if tolerance is None else float(tolerance)
    return {tolerance_key(key): float(value) for key, value in tolerance.items()}


def as_tolerances(value: Any, who: str) -> Tolerances | None:
    """``tolerances=`` as every entry point takes it: None, one number (``atol`` and ``rtol`` both), a dict of
    :class:`Tolerances` fields (``{"atol": 0.05, "rtol": 0.05}``) or a :class:`Tolerances`; anything else is a
    :class:`TypeError` saying what it takes."""
    if value is None or isinstance(value, Tolerances):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Tolerances(atol=float(value), rtol=float(value))
    if isinstance(value, Mapping):
        known = {item.name for item in fields(Tolerances)}
        unknown = sorted(str(key) for key in value if key not in known)
        if unknown:
            raise TypeError(
                f"{who}(): tolerances has no field {', '.join(unknown)} (it takes {', '.join(sorted(known))})"
            )
        return Tolerances(**{str(key): item for key, item in value.items()})
    raise TypeError(
        f"{who}(): tolerances is a number (atol and rtol), a dict of Tolerances fields "
        f"({{'atol': 0.05, 'rtol': 0.05}}) or a Tolerances, not a {type(value).__name__}"
    )


def renamed_tolerances(tolerances: Any, tolerance: Any, who: str) -> Tolerances | None:
    """``tolerances=``, or its old name ``tolerance=`` (a :class:`DeprecationWarning`); both given is a
    :class:`TypeError`."""
    if tolerance is not None:
        if tolerances is not None:
            raise TypeError(f"{who}() got tolerances= and tolerance= (its old name): give tolerances= alone")
        warnings.warn(f"{who}(tolerance=...) is now tolerances=, as verify and diff take it", DeprecationWarning,
                      stacklevel=3)  # fmt: skip
        tolerances = tolerance
    return as_tolerances(tolerances, who)


def parse_tolerance(values: list[str] | None, flag: str) -> float | dict[str, float] | None:
    """``--atol 1e-3`` (every value) and/or ``--atol out0=1e-3`` / ``engine2=`` / ``acc_5=`` (one), repeatable."""
    if not values:
        return None
    per_value: dict[str, float] = {}
    for value in values:
        key, _, number = value.rpartition("=")
        try:
            name = tolerance_key(key) if key else "*"
        except VerifyInputError:
            raise VerifyInputError(
                f"{flag} {value}: name an output (out0), an engine (engine2, acc_5) or give one number for all"
            ) from None
        try:
            per_value[name] = float(number)
        except ValueError:
            raise VerifyInputError(f"{flag} {value}: {number!r} is not a number") from None
    if set(per_value) == {"*"}:
        return per_value["*"]
    return per_value


def error_stat_checked(stat: str) -> str:
    """``stat``, if it is one of :data:`~trt_inline.verify.compare.ERROR_STATS`."""
    if stat not in ERROR_STATS:
        raise VerifyInputError(f"check_error_stat is one of {', '.join(ERROR_STATS)}, got {stat!r}")
    return stat


def top_k_checked(top_k: int | None, min_top_k_agreement: float | None) -> None:
    """Refuse a ``top_k`` below 1, or a ``min_top_k_agreement`` outside 0 to 1 or without ``top_k``."""
    if top_k is not None and (type(top_k) is not int or top_k < 1):
        raise VerifyInputError(f"top_k (--top-k) is a whole number of at least 1, got {top_k!r}")
    if min_top_k_agreement is not None:
        if top_k is None:
            raise VerifyInputError("min_top_k_agreement (--min-top-k-agreement) needs top_k (--top-k K)")
        if not 0.0 <= min_top_k_agreement <= 1.0:
            raise VerifyInputError(
                f"min_top_k_agreement (--min-top-k-agreement) is a fraction from 0 to 1, got {min_top_k_agreement!r}"
            )


# ----------------------------------------------------------------------------------------------------------------
# The groups

_BOTH = (VERIFY, DIFF)
_RUNS = (VERIFY, DIFF, CASES)  # what each case of a folder runs with too, and a rank set does not
_COMPARED = (VERIFY, DIFF, CASES, RANKS)
_CHECKED = (VERIFY, CASES, RANKS)  # verify's own checks, which diff does not make
_LOADED = (VERIFY, DIFF, CASES, RANKS, INSPECT)  # what loads a file's program (check reads its engines' infos only)
# How fields travel to a child where their annotation cannot say it (:mod:`trt_inline.codec`): tensors travel
# apart (``torch.save``), a path as text, a tolerance in the one form :func:`normalize_tolerance` gives.
_TENSORS = wire(stays=True)
_PATH = wire(as_type=str | None)
_TOLERANCE = wire(as_type=float | dict[str, float] | None)


@dataclass(frozen=True)
class OptionGroup:
    """What the groups share: frozen, every field declared (:class:`Declaration`) and defaulted."""


@dataclass(frozen=True)
class Inputs(OptionGroup):
    """What the program runs on, and where: given inputs (else the reference inputs a file embeds), runs at the
    ends of its declared dynamic ranges, that many more runs on random inputs within them, the device."""

    # fmt: off
    arg_inputs: Sequence[torch.Tensor] | None = field(default=None, metadata=declared(
        "the program's positional inputs (default: the reference inputs the file embeds)", used_by=_BOTH,
        travels=_TENSORS))
    kwarg_inputs: dict[str, torch.Tensor] | None = field(default=None, metadata=declared(
        "the program's keyword inputs, with arg_inputs", used_by=_BOTH, travels=_TENSORS))
    random_inputs: int = field(default=0, metadata=declared(
        "also run on N sets of random inputs within the program's declared dynamic ranges "
        "(the first at every minimum, the second at every maximum)",
        "--random-inputs", used_by=_RUNS, type=int, metavar="N"))
    seed: int = field(default=0, metadata=declared(
        "seed of --random-inputs and of the values at the ends of the dynamic ranges (default 0)", "--seed",
        used_by=_RUNS, type=int))
    range_ends: str = field(default="auto", metadata=declared(
        "also run at the ends of the program's declared dynamic ranges: every size at its minimum, at its maximum "
        "and at the optimization point the file records; auto (the default) leaves out an end whose inputs would "
        f"take more than {GROWTH} times the reference inputs' bytes and more than {SMALL_BYTES >> 20} MiB, all runs "
        "every end, off none", "--range-ends", used_by=_RUNS, choices=MODES))
    device: str | None = field(default=None, metadata=declared(
        "run on this device, e.g. cuda (default: where the program is)", "--device", used_by=_RUNS))
    # fmt: on


@dataclass(frozen=True)
class Reference(OptionGroup):
    """What the outputs are compared with, in order of preference: ``expected`` (for the given inputs), what
    ``expected_module`` returns, another file's embedded reference I/O (``expected_from``), a boundaries file
    (``load_boundaries``, compared engine by engine), else the reference I/O the file embeds; and whether engine
    by engine (``per_engine``). ``diff`` takes none: its second file is the reference."""

    # fmt: off
    expected: Any = field(default=None, metadata=declared(
        "the expected outputs for arg_inputs", used_by=(VERIFY,), travels=_TENSORS))
    expected_module: Callable[..., Any] | None = field(default=None, metadata=declared(
        "a module whose outputs (on arg_inputs, or the embedded inputs) are the expected outputs; with "
        "per_engine, a compiled module whose engines are compared engine by engine", used_by=(VERIFY,),
        travels=wire(stays=True)))
    expected_from: str | os.PathLike[str] | None = field(default=None, metadata=declared(
        "compare PATH with the reference I/O embedded in another file (a newer save of the same module)",
        "--expected-from", used_by=(VERIFY,), metavar="NEW.pt2", travels=_PATH))
    load_boundaries: str | os.PathLike[str] | None = field(default=None, metadata=declared(
        "compare PATH, engine by engine, with a run --save-boundaries recorded (its inputs are used)",
        "--load-boundaries", used_by=(VERIFY,), metavar="FILE", travels=wire(stays=True)))
    per_engine: bool = field(default=False, metadata=declared(
        "compare engine by engine with the boundary data the file embeds (embed_reference='boundaries'): "
        "each engine alone, then every boundary of the run; names the first engine or fallback region that "
        "diverges (automatic when an output differs and the file embeds boundary data)",
        "--per-engine", used_by=_CHECKED, action="store_true"))
    # fmt: on


@dataclass(frozen=True)
class Tolerances(OptionGroup):
    """How close is close enough, and what fails: ``atol`` / ``rtol`` (one number, or per output ``{0: 1e-3}``,
    per engine ``{"engine2": 1e-2}``, ``{"acc_5": 1e-2}``, and ``"*"`` for the others; default per dtype), the
    error statistic held to them, the outputs' top-k agreement, and ``strict``: warnings fail too."""

    # fmt: off
    atol: float | Mapping[Any, float] | None = field(default=None, metadata=declared(
        "absolute tolerance: one number for every value, or KEY=TOL for one: outN (output N), engineK "
        "(engine call K's inputs and outputs), acc_N (engine _run_on_acc_N) (repeatable; default: per dtype)",
        "--atol", used_by=_COMPARED, action="append", metavar="[KEY=]TOL", parse=parse_tolerance,
        travels=_TOLERANCE))
    rtol: float | Mapping[Any, float] | None = field(default=None, metadata=declared(
        "relative tolerance, as --atol",
        "--rtol", used_by=_COMPARED, action="append", metavar="[KEY=]TOL", parse=parse_tolerance,
        travels=_TOLERANCE))
    check_error_stat: str = field(default="elemwise", metadata=declared(
        "how a value passes: every element within atol + rtol*|reference| (elemwise, the default), or that "
        "statistic of the absolute error within atol or of the relative error within rtol",
        "--check-error-stat", used_by=_COMPARED, choices=ERROR_STATS))
    top_k: int | None = field(default=None, metadata=declared(
        "for logits: of each floating output with at least K values in its last dimension, the fraction of its "
        "rows (the other dimensions flattened) whose top-K indices are the same set as the reference's, and the "
        "first row that does not (reported; --min-top-k-agreement makes it fail)",
        "--top-k", used_by=_COMPARED, type=int, metavar="K"))
    min_top_k_agreement: float | None = field(default=None, metadata=declared(
        "with --top-k: an output whose rows agree in a fraction below F (0 to 1) fails",
        "--min-top-k-agreement", used_by=_COMPARED, type=float, metavar="F"))
    strict: bool = field(default=False, metadata=declared(
        "fail on warnings too: outputs and engine outputs that look like garbage without a reference (all "
        "zeros, NaN or Inf from finite inputs, the same in every run or in every row of a batch)",
        "--strict", used_by=_CHECKED, action="store_true"))
    # fmt: on

    def criteria(self) -> Criteria:
        """The one value every comparison takes: these tolerances normalized once."""
        return Criteria(
            normalize_tolerance(self.atol), normalize_tolerance(self.rtol), self.check_error_stat, self.top_k,
            self.min_top_k_agreement,
        )  # fmt: skip


@dataclass(frozen=True)
class Trust(OptionGroup):
    """What a file may do beyond the safe default: every default refuses; each is only for a file from a trusted
    source. Taken by every entry point, ``inspect`` too."""

    # fmt: off
    allow_pickle: bool = field(default=False, metadata=declared(
        "load pickles that need more than plain tensors and Torch-TensorRT engines; "
        "only for files from a trusted source (loading them can run code)",
        "--allow-pickle", action="store_true"))
    allow_native_code: bool = field(default=False, metadata=declared(
        "load TensorRT engines and run AOTInductor packages (native code from the file); "
        "only for files from a trusted source",
        "--allow-native-code", used_by=_LOADED, action="store_true"))
    allow_ops: Sequence[str] = field(default=(), metadata=declared(
        "also allow this operator (ns::op or ns::op.overload; repeatable); only for a file you trust",
        "--allow-op", used_by=_LOADED, action="append", metavar="NAME", travels=wire(as_type=tuple[str, ...])))
    # fmt: on

    def __post_init__(self) -> None:
        # A tuple, whatever sequence was given (the command line's is a list): frozen all the way down.
        object.__setattr__(self, "allow_ops", tuple(self.allow_ops))


@dataclass(frozen=True)
class Isolation(OptionGroup):
    """Where a file is opened and within which limits: a sandboxed child process by default, stopped past
    ``timeout`` seconds or ``memory_limit`` (bytes, or ``"2GiB"``). ``isolate=False`` opens it in this process
    (a trusted file); ``sandbox=False`` opens it in a child without the OS sandbox."""

    # fmt: off
    isolate: bool = field(default=True, metadata=declared(
        "load and run the file in a child process (False: in this process, for a file from a trusted source)",
        used_by=_RUNS))
    sandbox: bool = field(default=True, metadata=declared(
        "open the file in a child process without the OS sandbox (no namespaces, Landlock or seccomp), "
        "where the sandbox cannot be set up; the report says so",
        "--no-sandbox", action="store_false"))
    timeout: float | None = field(default=None, metadata=declared(
        "stop the child process that loads and runs the file after this long (default 3600)",
        "--timeout", type=float, metavar="SECONDS"))
    memory_limit: int | str | None = field(default=None, metadata=declared(
        "memory the child process may use beyond an interpreter with torch and the file it maps, e.g. 2GiB "
        "(default: 2 GiB and half the file's size, at most 80% of the memory available)",
        "--memory-limit", metavar="SIZE"))
    debug: bool = field(default=False, metadata=declared(
        "show tracebacks, torch's warnings and trt_inline's DEBUG log",
        "--debug", action="store_true", before_command=True))
    verbose: bool = field(default=False, metadata=declared(
        "say in the report the child process's limits and its memory in full, besides its walls",
        "--verbose", used_by=_LOADED, action="store_true"))
    # fmt: on


@dataclass(frozen=True)
class Outputs(OptionGroup):
    """The files written besides the report, each checked to be writable before the run and written once the
    verification is done (in the child or in this process alike: nothing where it raised)."""

    # fmt: off
    save_outputs: str | os.PathLike[str] | None = field(default=None, metadata=declared(
        "write the outputs on the reference inputs here (torch.save, tensors)",
        "--save-outputs", used_by=_BOTH, metavar="FILE"))
    save_boundaries: str | os.PathLike[str] | None = field(default=None, metadata=declared(
        "write this run's inputs, outputs and every engine's inputs and outputs to FILE (plain tensors), "
        "to compare a later run against with --load-boundaries (another machine, another TensorRT)",
        "--save-boundaries", used_by=(VERIFY,), metavar="FILE"))
    extract: str | os.PathLike[str] | None = field(default=None, metadata=declared(
        "write the first engine or fallback region that diverges to DIR as a program of its own (repro.pt2, "
        "with its recorded inputs and expected outputs, and repro.py): trt-inline verify DIR/repro.pt2 "
        "reproduces it alone",
        "--extract", used_by=(VERIFY,), metavar="DIR"))
    # fmt: on


GROUPS: tuple[type[OptionGroup], ...] = (Inputs, Reference, Tolerances, Trust, Isolation, Outputs)


# The fields as keyword arguments of their own (``verify(path, atol=1e-3)``): a TypedDict per group, and one per
# entry point that takes keywords (KEYWORD_ENTRY_POINTS) with exactly the fields whose declaration's ``used_by`` names
# it, so that a type checker refuses the others (diff(a, b, strict=True)) as it refuses any keyword a function does
# not take; at run time they are refused too (:func:`gather`). Written from the fields above by .ci/typed_keywords
# (.ci/run checks that they are), since a type checker reads them as source.
# BEGIN typed keywords (written by .ci/typed_keywords from the groups' fields: do not edit)


class InputsFields(TypedDict, total=False):
    arg_inputs: Sequence[torch.Tensor] | None
    kwarg_inputs: dict[str, torch.Tensor] | None
    random_inputs: int
    seed: int
    range_ends: str
    device: str | None


class ReferenceFields(TypedDict, total=False):
    expected: Any
    expected_module: Callable[..., Any] | None
    expected_from: str | os.PathLike[str] | None
    load_boundaries: str | os.PathLike[str] | None
    per_engine: bool


class TolerancesFields(TypedDict, total=False):
    atol: float | Mapping[Any, float] | None
    rtol: float | Mapping[Any, float] | None
    check_error_stat: str
    top_k: int | None
    min_top_k_agreement: float | None
    strict: bool


class TrustFields(TypedDict, total=False):
    allow_pickle: bool
    allow_native_code: bool
    allow_ops: Sequence[str]


class IsolationFields(TypedDict, total=False):
    isolate: bool
    sandbox: bool
    timeout: float | None
    memory_limit: int | str | None
    debug: bool
    verbose: bool


class OutputsFields(TypedDict, total=False):
    save_outputs: str | os.PathLike[str] | None
    save_boundaries: str | os.PathLike[str] | None
    extract: str | os.PathLike[str] | None


class VerifyFields(
    InputsFields, ReferenceFields, TolerancesFields, TrustFields, IsolationFields, OutputsFields, total=False
):
    """``verify``'s keywords: the fields whose ``used_by`` names verify."""


class DiffFields(InputsFields, TrustFields, IsolationFields, total=False):
    """``diff``'s keywords: the fields whose ``used_by`` names diff."""

    atol: float | Mapping[Any, float] | None
    rtol: float | Mapping[Any, float] | None
    check_error_stat: str
    top_k: int | None
    min_top_k_agreement: float | None
    save_outputs: str | os.PathLike[str] | None


class CasesFields(TolerancesFields, TrustFields, IsolationFields, total=False):
    """``verify_cases``'s keywords: the fields whose ``used_by`` names cases."""

    random_inputs: int
    seed: int
    range_ends: str
    device: str | None
    per_engine: bool


class RankSetFields(TolerancesFields, TrustFields, total=False):
    """``verify_rank_set``'s keywords: the fields whose ``used_by`` names ranks."""

    per_engine: bool
    sandbox: bool
    timeout: float | None
    memory_limit: int | str | None
    debug: bool
    verbose: bool


# Each entry point that takes keywords, and their TypedDict.
ENTRY_POINT_FIELDS: dict[str, type[Mapping[str, Any]]] = {
    VERIFY: VerifyFields,
    DIFF: DiffFields,
    CASES: CasesFields,
    RANKS: RankSetFields,
}
# END typed keywords


@dataclass(frozen=True)
class Options:
    """Every group, as one entry point was given them (:func:`gather`); the groups it does not take at their
    defaults."""

    inputs: Inputs = field(default_factory=Inputs)
    reference: Reference = field(default_factory=Reference)
    tolerances: Tolerances = field(default_factory=Tolerances)
    trust: Trust = field(default_factory=Trust)
    isolation: Isolation = field(default_factory=Isolation)
    outputs: Outputs = field(default_factory=Outputs)


# Each group by the name an entry point takes it as (``verify(path, tolerances=...)``), as Options names it.
_GROUP_NAMES: dict[str, type[OptionGroup]] = {cls.__name__.lower(): cls for cls in GROUPS}


def gather(entry: str, keywords: Mapping[str, Any], **groups: OptionGroup | None) -> Options:
    """The options ``entry`` was given: each group as given, or made of its fields given as ``keywords``.

    ``groups``: the groups the entry point takes, by name (``tolerances=...``; None: not given). Raises
    :class:`TypeError` for a keyword that is no field of them, for a group given together with one of its own
    fields as a keyword (which one would win?), and, but for ``cases`` (which says why itself: :func:`untaken`),
    for a field ``entry`` does not take; :class:`VerifyInputError` for a tolerance, error statistic, top-k or
    ``range_ends`` that cannot be used.
    """
    name = FUNCTIONS[entry]
    owner = {item.name: group for group in groups for item in fields(_GROUP_NAMES[group])}
    for keyword in keywords:
        if keyword not in owner:
            raise TypeError(f"{name}() got an unexpected keyword argument {keyword!r}")
    made: dict[str, Any] = {}
    for group, given in groups.items():
        cls = _GROUP_NAMES[group]
        own = {keyword: value for keyword, value in keywords.items() if owner[keyword] == group}
        if group == "tolerances":
            given = as_tolerances(given, name)
        if given is None:
            made[group] = cls(**own)
        elif not isinstance(given, cls):
            raise TypeError(f"{name}() takes {group}= as {cls.__name__}(...), got {type(given).__name__}")
        elif own:
            first = next(iter(own))
            raise TypeError(f"{name}() got {group}= and {first}=, a field of {cls.__name__}: give {first} in one place")
        else:
            made[group] = given
    options = dataclasses.replace(Options(), **made)
    refused = untaken(options, entry, keywords)
    if refused and entry != CASES:
        raise TypeError(f"{name}() does not take {', '.join(refused)}")
    modes_checked(options.inputs.range_ends)
    tolerances = options.tolerances
    error_stat_checked(tolerances.check_error_stat)
    top_k_checked(tolerances.top_k, tolerances.min_top_k_agreement)
    normalize_tolerance(tolerances.atol)
    normalize_tolerance(tolerances.rtol)
    return options


def untaken(options: Options, entry: str, keywords: Mapping[str, Any] | None = None) -> list[str]:
    """The fields ``entry`` does not take that were given anyway: set in a group, or given as ``keywords``."""
    refused = []
    for group in _GROUP_NAMES:
        values = getattr(options, group)
        for item, declared_as in declarations(type(values)):
            given = item.name in (keywords or {}) or _is_set(getattr(values, item.name), item.default)
            if given and entry not in declared_as.used_by:
                refused.append(item.name)
    return refused


def _is_set(value: Any, default: Any) -> bool:
    """Whether a field holds other than its default (``is`` for None: tensors compare element by element)."""
    return value is not None if default is None else bool(value != default)


G = TypeVar("G", bound=OptionGroup)


def from_flags(cls: type[G], values: Mapping[str, Any]) -> G:
    """The group ``cls`` as a command line gave it: each field with a flag read from ``values`` (the parsed
    arguments, by field name), parsed; the others (no flag, or none on this command) at their defaults."""
    given: dict[str, Any] = {}
    for item, declared_as in declarations(cls):
        if declared_as.flags and item.name in values:
            value = values[item.name]
            given[item.name] = declared_as.parse(value, declared_as.flags[0]) if declared_as.parse else value
    return dataclasses.replace(cls(), **given)


def for_child(group: G) -> G:
    """``group`` as a child's job is sent it (in its request): the fields that stay in this process
    (tensors, which travel apart; a module) at their defaults, paths as text, tolerances normalized
    (:func:`normalize_tolerance`)."""
    changes: dict[str, Any] = {}
    for item in fields(group):
        value = getattr(group, item.name)
        if wire_of(item).stays:
            changes[item.name] = item.default
        elif isinstance(value, os.PathLike):
            changes[item.name] = os.fspath(value)
    if isinstance(group, Tolerances):
        changes.update(atol=normalize_tolerance(group.atol), rtol=normalize_tolerance(group.rtol))
    return dataclasses.replace(group, **changes)
