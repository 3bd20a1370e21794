"""Which operators a saved file may call: one allow-list for loaded graphs and reference-engine programs.

A saved graph names its operators as strings (``torch.ops.aten.relu.default``),
and so does a reference engine's program (``aten::relu.default``). Torch
resolves such names by walking attributes, which reaches far more than
operators (``torch.ops.load_library``, ``importlib.import_module``), and any
registered operator can be named, ``aten::from_file`` (reads and writes files)
included. So a file from a stranger may call only what this module allows:

==============================  ==========================================================
kind                            allowed
==============================  ==========================================================
ATen operators                  a name of :data:`ALLOWED_ATEN` (``allowed_aten.txt``: each
                                reviewed as computing on values only), in an overload with
                                a functional schema (no ``Tensor(a!)``, no ``out=``) whose
                                results are tensors, or one of :data:`SCALAR_RESULTS`; never
                                :data:`REFUSED_ATEN`, :data:`UNINITIALIZED_ATEN`, nor a name
                                containing ``sparse``, ``nested`` or ``_unsafe`` (but
                                ``_unsafe_view``); tagged random only in a call
                                :data:`DRAWS_ONLY_WHEN` says cannot draw; the operators of
                                :data:`CHECKED_ONLY_WHEN` only with the literals they name;
                                those of :data:`RUN_CHECKS` only with arguments in range,
                                checked as each call runs (:func:`check_run`);
                                ``as_strided`` only as a restride (:data:`RESTRIDE_ONLY`);
                                outputs of :data:`READABLE_OUTPUTS` kernels only where they
                                hold values
collectives                     :data:`~trt_inline.distributed.manifest.COLLECTIVE_OPS`
                                outside :func:`allowing` blocks (a process running what
                                it compiled), inside one only with ``collectives=True``
                                (a rank set's verification)
engine operators                ``trt_inline::execute_engine``; the TensorRT ones
                                (:data:`trt_inline.engines.ENGINE_OPS`) only where native
                                code is allowed: a TensorRT plan is native code
the rank check                  ``trt_inline::check_ranks`` (a rank file's first call,
                                :mod:`trt_inline.distributed.rank_check`): without a live
                                process group, as in verify's child, it does nothing;
                                verify checks its manifest statically instead
Python functions                :data:`PYTHON_FUNCTIONS`: ``getitem`` and the symbolic
                                size arithmetic exported graphs contain
anything else                   only when the caller names it (``allow_ops``,
                                ``--allow-op``)
==============================  ==========================================================

Names are resolved by lookup, never by walking attributes: a Python function
through :data:`PYTHON_FUNCTIONS`, an operator through its namespace's packet,
and the result must be the ``OpOverload`` of exactly the name asked for.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.resources
import itertools
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from trt_inline import compat, engines
from trt_inline.distributed.manifest import COLLECTIVE_OPS, RANK_CHECK_OP
from trt_inline.errors import RefusedOperatorError, printable

__all__ = [
    "ALLOWED_ATEN",
    "PYTHON_FUNCTIONS",
    "READABLE_OUTPUTS",
    "REFUSED_ATEN",
    "FRESH_RESULTS",
    "RESTRIDE_ONLY",
    "SCALAR_RESULTS",
    "UNINITIALIZED_ATEN",
    "CHECKED_ONLY_WHEN",
    "DRAWS_ONLY_WHEN",
    "allowed_now",
    "allows",
    "allowing",
    "RUN_CHECKS",
    "check_reads",
    "check_run",
    "checks_runs",
    "check_restride_run",
    "check_target",
    "is_native_engine_op",
    "qualified_name",
    "read_allow_list",
    "resolve",
    "serialized_to_qualified",
    "showing_refusals",
]

# Functions an exported graph calls besides operators, by the name torch's serializer
# gives them (``module.name``); the reference program format writes ``operator.x``.
PYTHON_FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{
        f"_operator.{fn.__name__}": fn
        for fn in (
            operator.getitem,
            operator.add,
            operator.sub,
            operator.mul,
            operator.truediv,
            operator.floordiv,
            operator.mod,
            operator.pow,
            operator.neg,
            operator.pos,
            operator.abs,
            operator.eq,
            operator.ne,
            operator.lt,
            operator.le,
            operator.gt,
            operator.ge,
            operator.and_,
            operator.or_,
            operator.not_,
        )
    },
    **{
        f"torch.{fn.__name__}": fn
        for fn in (torch.sym_not, torch.sym_float, torch.sym_int, torch.sym_max, torch.sym_min, torch.sym_ite)
    },
    **{f"math.{fn.__name__}": fn for fn in (math.ceil, math.floor, math.trunc)},
}
_FUNCTION_NAMES = {fn: name for name, fn in PYTHON_FUNCTIONS.items()}

# Functional ATen operators refused all the same: they touch files or build tensors unchecked.
REFUSED_ATEN = frozenset({"aten::from_file", "aten::_unsafe_index", "aten::_unsafe_masked_index"})
# Operators whose result is whatever memory held before: a program could read back how the process
# that runs it was set up (a verification fills fresh memory differently than a server that has run
# for days), and so behave one way under verify and another in use.
UNINITIALIZED_ATEN = frozenset(
    {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
     "aten::empty_permuted", "aten::resize", "aten::resize_as"}
)  # fmt: skip
# A gate: the literal (argument, value) pairs a call must pass, any one of them enough.
Gate = tuple[tuple[str, object], ...]
# Operators allowed only in a call that passes a literal keeping them to their values, each gate of the tuple
# passed: with another they skip the checks of their inputs (and read past them), or update statistics they are
# given in place although their schema says they write nothing (a program could count its calls, and compute
# otherwise on the thousandth). segment_reduce checks ``lengths`` (in part: :data:`RUN_CHECKS` does the rest)
# unless told ``unsafe``, and never checks ``offsets``. A copy told ``non_blocking`` hands back its result before
# the copy is done.
CHECKED_ONLY_WHEN: dict[str, tuple[Gate, ...]] = {
    "aten::segment_reduce": ((("unsafe", False),), (("offsets", None),), (("indices", None),)),
    "aten::isin": ((("assume_unique", False),),),
    "aten::batch_norm": ((("training", False),),),
    "aten::native_batch_norm": ((("training", False),),),
    "aten::instance_norm": (
        (("use_input_stats", False), ("running_mean", None)),
        (("use_input_stats", False), ("running_var", None)),
    ),
    "aten::_assert_tensor_metadata": ((("stride", None),),),
    "aten::_to_copy": ((("non_blocking", False),),),
    "aten::to": ((("non_blocking", False),),),
    "aten::copy": ((("non_blocking", False),),),
}
# What a call outside its gate does, per operator of CHECKED_ONLY_WHEN.
_SKIPS_CHECKS = "which can skip the checks of its inputs and read past them"
_UPDATES_STATISTICS = "which updates the statistics it is given in place unless told not to"
_GATE_REASONS = {
    "aten::segment_reduce": _SKIPS_CHECKS,
    "aten::isin": _SKIPS_CHECKS,
    "aten::batch_norm": _UPDATES_STATISTICS,
    "aten::native_batch_norm": _UPDATES_STATISTICS,
    "aten::instance_norm": _UPDATES_STATISTICS,
    "aten::_assert_tensor_metadata": (
        "which checks its input's strides (a program could refuse a layout verify does not pass)"
    ),
    "aten::_to_copy": "which returns before its copy is done unless told to block",
    "aten::to": "which returns before its copy is done unless told to block",
    "aten::copy": "which returns before its copy is done unless told to block",
}
# as_strided reads its source's storage, not its values: where the storage holds more than the source (an input
# that is a view of the caller's larger buffer) or holds it in another order (an input laid out channels-last), it
# reads whatever the process holds there. Lowering to core ATen calls it to restride the size-1 dimensions of a
# fresh result (``mean(keepdim=True)`` then a flatten): the same shape, one dimension longer than 1 read with
# stride 1, the source's own offset, which reads the source's elements in order. Only such a call is allowed: in a
# graph, of a reduction's result (FRESH_RESULTS) whose recorded static shape is that shape; in a reference engine's
# program, checked again on the tensor itself each time it runs (check_restride_run).
RESTRIDE_ONLY = "aten::as_strided"
# The producers whose result is always fresh memory of its own (a schema without ``Tensor(a)`` is no proof:
# ``_unsafe_view``, ``type_as``, ``einsum``, an eval-mode ``dropout`` return their input or a view of it): the
# reductions whose keepdim result lowering restrides.
FRESH_RESULTS = frozenset({"aten::mean", "aten::sum", "aten::amax", "aten::amin", "aten::prod"})
# Operators tagged random that draw only when an argument says so: an exported model in eval mode passes
# ``dropout_p=0.0`` to attention and ``train=False`` to dropout, and the call draws nothing. A call is
# allowed when each argument named here holds the literal value given (a value the graph computes never
# counts: it could be anything at run time) and it passes no generator.
_ATTENTION: Gate = (("dropout_p", 0.0),)
_NOT_TRAINING: Gate = (("train", False),)
DRAWS_ONLY_WHEN: dict[str, Gate] = {
    "aten::scaled_dot_product_attention": _ATTENTION,
    "aten::_scaled_dot_product_flash_attention_for_cpu": _ATTENTION,
    "aten::_scaled_dot_product_efficient_attention": _ATTENTION,
    "aten::_scaled_dot_product_flash_attention": _ATTENTION,
    "aten::_scaled_dot_product_cudnn_attention": _ATTENTION,
    "aten::native_dropout": _NOT_TRAINING,
    "aten::dropout": _NOT_TRAINING,
    "aten::feature_dropout": _NOT_TRAINING,
    "aten::alpha_dropout": _NOT_TRAINING,
    "aten::feature_alpha_dropout": _NOT_TRAINING,
    "aten::lstm": _NOT_TRAINING,  # dropout between layers, only in training
    "aten::gru": _NOT_TRAINING,
    "aten::rnn_tanh": _NOT_TRAINING,
    "aten::rnn_relu": _NOT_TRAINING,
    "aten::quantized_lstm": _NOT_TRAINING,  # (not tagged random, but draws the same way)
    "aten::quantized_gru": _NOT_TRAINING,
    "aten::rrelu": (("training", False),),
    "aten::rrelu_with_noise_functional": (("training", False),),
}
# Operators whose result is not a tensor (a bool, an int, a number...) may report how the program runs rather
# than compute on values: whether a value is a leaf of an autograd graph or an inference tensor, its output
# number, its version counter, whether its memory is pinned or contiguous. Only these, each reviewed, may:
# each gives a size, a rank, or a property of the values or dtype it is given.
SCALAR_RESULTS = frozenset(
    {
        "aten::sym_size", "aten::size", "aten::sym_numel", "aten::numel", "aten::dim",  # sizes and rank
        "aten::_local_scalar_dense", "aten::item",  # a 0-d tensor's value
        "aten::is_nonzero", "aten::equal", "aten::is_same_size", "aten::allclose",  # values and shapes
        "aten::is_floating_point", "aten::is_complex", "aten::is_signed",  # the dtype
        # CUDA attention kernels: besides tensors, the longest query and key sequence (sizes).
        "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention",
    }
)  # fmt: skip
_TENSOR_RESULTS = frozenset({"Tensor", "Optional[Tensor]", "List[Tensor]", "List[Optional[Tensor]]"})
_REFUSED_WORDS = ("sparse", "nested", "_unsafe")
# Operators some of whose outputs are uninitialized memory where they draw nothing (the CUDA attention kernels'
# random seeds and offsets, their unused slots): a call is allowed only where it reads nothing but these outputs.
READABLE_OUTPUTS: dict[str, frozenset[int]] = {
    "aten::_scaled_dot_product_efficient_attention": frozenset({0, 1}),  # output, log-sum-exp
    "aten::_scaled_dot_product_flash_attention": frozenset({0, 1, 4, 5}),  # ... and the longest sequences
    "aten::_scaled_dot_product_cudnn_attention": frozenset({0, 1, 4, 5}),
    # Its offsets and bag sizes are scratch where the mode does not need them.
    "aten::_embedding_bag": frozenset({0}),
    "aten::embedding_bag": frozenset({0}),
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LIST_LINE = re.compile(r"^aten::[A-Za-z_][A-Za-z0-9_]*$")
_SECTION = re.compile(r"^\[[a-z ,()]+\]$")


def read_allow_list(text: str, source: str = "allowed_aten.txt") -> frozenset[str]:
    """The operator names of an allow-list file: ``[section]`` lines, one ``aten::name`` a line, ``#`` notes.

    Strict: a line of another form, a name before any section or a name listed twice raises ``ValueError``
    naming the line, so that a typo cannot leave an operator silently off (or on) the list.
    """
    names: set[str] = set()
    section = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.partition("#")[0].strip()
        if not line:
            continue
        if _SECTION.match(line):
            section = line
        elif not _LIST_LINE.match(line) or section is None or line in names:
            what = "listed twice" if line in names else "before any [section]" if section is None else "not aten::name"
            raise ValueError(f"{source} line {number}: {raw.strip()!r} is {what}")
        else:
            names.add(line)
    return frozenset(names)


# The reviewed list, read once at import (before any sandbox, which need not grant the package folder).
ALLOWED_ATEN = read_allow_list(importlib.resources.files("trt_inline").joinpath("allowed_aten.txt").read_text())

_extra_allowed: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "trt_inline_allowed_ops", default=frozenset()
)
# Every registered operator allowed: a file the caller trusts (``trt_inline.load``).
_EVERY_OPERATOR = "*"
# Whether collectives may run: None outside any allowing() block (a process running what it compiled).
_collectives_allowed: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "trt_inline_collectives_allowed", default=None
)


@contextlib.contextmanager
def allowing(
    names: Iterable[str], *, native_code: bool = False, every_operator: bool = False, collectives: bool = False
) -> Iterator[None]:
    """Within the block, also allow ``names`` (``ns::op`` or ``ns::op.overload``), and TensorRT engines if asked.

    What a user passes as ``allow_ops`` / ``--allow-op`` for a file they trust;
    ``every_operator``: any registered operator (a file loaded as trusted).
    Collectives (:data:`COLLECTIVE_OPS`) run outside any such block (a program
    the process compiled itself); inside one only with ``collectives=True`` (a
    rank set's verification, whose process group is the job's own) or
    ``every_operator``, here or in an enclosing block.
    A context variable, so that the engine op's kernel, called by torch, sees it.
    """
    extra = set(names)
    if native_code or every_operator:
        extra |= {op.name for op in engines.ENGINE_OPS if op.native_code}
    if every_operator:
        extra.add(_EVERY_OPERATOR)
    token = _extra_allowed.set(_extra_allowed.get() | frozenset(extra))
    collectives_token = _collectives_allowed.set(bool(_collectives_allowed.get()) or collectives or every_operator)
    try:
        yield
    finally:
        _collectives_allowed.reset(collectives_token)
        _extra_allowed.reset(token)


# Within showing_refusals(): the ATen calls refused for what they compute, recorded instead of raised.
_shown: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("trt_inline_shown_refusals", default=None)
# Refusals that hold even where refusals are only shown: a name that is no ATen operator, or one that reads files.
_NOT_ATEN = "which is not an ATen or engine operator"
_READS_FILES = "which reads files or builds tensors unchecked"


@contextlib.contextmanager
def showing_refusals() -> Iterator[list[str]]:
    """Within the block, an ATen operator refused for what it computes (it writes to its arguments, draws from
    the global random state, returns uninitialized memory, is private) is allowed, and why verify refuses it is
    added to the list the block gives: ``inspect`` shows a file's table and says what verify would refuse,
    running nothing. Everything else is refused as outside the block.
    """
    shown: list[str] = []
    token = _shown.set(shown)
    try:
        yield shown
    finally:
        _shown.reset(token)


def allows(name: str) -> bool:
    """Whether ``name`` (``ns::op``) is allowed beyond the allow-list at this point (:func:`allowing`)."""
    extra = _extra_allowed.get()
    return name in extra or _EVERY_OPERATOR in extra


def allowed_now() -> frozenset[str]:
    """The operators allowed beyond the allow-list at this point (:func:`allowing`), collectives included, and
    a mark where refusals are only shown (:func:`showing_refusals`): what a cached decision depends on."""
    return (
        _extra_allowed.get()
        | (frozenset(COLLECTIVE_OPS) if _collectives_allowed.get() is not False else frozenset())
        | (frozenset({"<showing refusals>"}) if _shown.get() is not None else frozenset())
    )


def qualified_name(target: Any) -> str:
    """``aten::relu.default`` for an operator, ``_operator.add`` for a Python function, ``repr`` otherwise."""
    if isinstance(target, compat.OpOverload):
        return f"{compat.op_schema_name(target)}.{compat.op_overload_name(target)}"
    if target in _FUNCTION_NAMES:
        return _FUNCTION_NAMES[target]
    return printable(repr(target))


def is_native_engine_op(name: str) -> bool:
    """Whether a qualified op name (with or without overload) is a TensorRT engine op."""
    base = name.partition(".")[0]
    return any(op.name == base and op.native_code for op in engines.ENGINE_OPS)


# A call's arguments: (args, kwargs) as the graph or program passes them; literals are Python values.
Call = tuple[tuple[Any, ...], dict[str, Any]]
# The calls of an operator are each checked later with their arguments (check_call): name-level checks pass
# the operators of DRAWS_ONLY_WHEN.
PER_CALL = ((), {"__per_call__": True})


def check_target(target: Any, call: Call | None = None) -> None:
    """Raise :class:`RefusedOperatorError` unless a node target (an object) is allowed, called with ``call``.

    Without ``call`` a random operator is refused whatever it is given.
    """
    if isinstance(target, compat.OpOverload):
        _check_op(target, call)
        return
    try:
        if target in _FUNCTION_NAMES:
            return
    except TypeError:  # unhashable: not one of ours
        pass
    raise RefusedOperatorError(f"calls {qualified_name(target)}, which is not an allowed operator")


def check_reads(target: Any, reads: Iterable[int | None]) -> None:
    """Raise :class:`RefusedOperatorError` where a call of ``target`` has an output read that holds uninitialized
    memory (:data:`READABLE_OUTPUTS`). ``reads``: the index each use of its result takes (None: the whole result).
    """
    if not isinstance(target, compat.OpOverload):
        return
    name = compat.op_schema_name(target) or ""
    readable = READABLE_OUTPUTS.get(name)
    if readable is None or allows(name):
        return
    for index in reads:
        if index not in readable:
            what = "its whole result" if index is None else f"its output {index}"
            _refuse(
                f"reads {what} of {qualified_name(target)}, which is uninitialized memory where it draws nothing "
                f"(only outputs {sorted(readable)} hold values; --allow-op {name} allows it for a trusted file)"
            )


def _refuse(message: str, *, shown_only: bool = True) -> None:
    """Raise :class:`RefusedOperatorError` with ``message``; within :func:`showing_refusals` (where
    ``shown_only``) add it to the block's list instead."""
    shown = _shown.get()
    if shown is None or not shown_only:
        raise RefusedOperatorError(message)
    shown.append(message)


def check_call(target: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> None:
    """Raise :class:`RefusedOperatorError` unless this call of ``target``, with these arguments, is allowed."""
    check_target(target, (tuple(args), dict(kwargs)))


def _check_op(op: compat.OpOverload, call: Call | None = None) -> None:
    name = compat.op_schema_name(op) or ""
    full = f"{name}.{compat.op_overload_name(op)}"
    extra = _extra_allowed.get()
    if name in extra or full in extra or _EVERY_OPERATOR in extra:
        return
    if name in COLLECTIVE_OPS:
        if _collectives_allowed.get() is False:
            raise RefusedOperatorError(_collective_refusal(full))
        return
    if is_native_engine_op(name):
        raise RefusedOperatorError(_native_refusal(full))
    if name in (engines.REFERENCE_OP.name, RANK_CHECK_OP):
        return
    reason = _aten_refusal(op, name, call)
    if reason:
        _refuse(
            f"calls {full}, {reason} (--allow-op {name} allows it for a trusted file)",
            shown_only=reason not in (_NOT_ATEN, _READS_FILES),
        )


def _native_refusal(full: str) -> str:
    return (
        f"calls {full}, a TensorRT engine: deserializing and running a TensorRT plan runs native code "
        "(pass --allow-native-code / allow_native_code=True only for a file from a trusted source)"
    )


def _collective_refusal(full: str) -> str:
    return (
        f"calls {full}, a collective of a tensor-parallel rank set: it runs only where every rank runs too; "
        "verify the rank set (trt-inline verify --ranks N 'model_rank{rank}_of_{world_size}.pt2', or the same "
        "under torchrun)"
    )


def _gate(op: compat.OpOverload, call: Call | None, gate: Gate) -> str | None:
    """Why a call of ``op`` passes none of the literals ``gate`` (argument, value) asks for; None where it does.

    Only a literal of that value counts: ``0.0`` for a rate, ``False`` for a flag, ``None`` for an absent tensor
    (never a bool for a rate, NaN, or a value the graph computes). Without a call there is nothing to look at;
    ``PER_CALL``: checked later.
    """
    if call is None:
        return "whatever it is given"
    if call is PER_CALL:
        return None
    args, kwargs = call
    whys = []
    for argument, value in gate:
        try:
            given = compat.op_argument_value(op, args, kwargs, argument)
        except KeyError:
            whys.append(f"its {argument} not given")
            continue
        if value is None or isinstance(value, bool):
            literal = given is value
        else:
            literal = type(given) in (int, float) and given == value
        if literal:
            return None
        whys.append(f"{argument}={printable(repr(given))[:60]}")
    return ", ".join(whys)


def _restride_refusal(op: compat.OpOverload, call: Call | None) -> str | None:
    """Why a call of ``as_strided`` may read other than its source's own elements in order (RESTRIDE_ONLY); None
    where it cannot. A source that is a graph node must be a fresh result of the shape asked for; any other source
    (a reference program's value) is checked when the call runs (:func:`check_restride_run`)."""
    if call is None:
        return "whatever it is given"
    if call is PER_CALL:
        return None
    args, kwargs = call
    try:
        source, size, stride = (compat.op_argument_value(op, args, kwargs, name) for name in ("self", "size", "stride"))
        offset = compat.op_argument_value(op, args, kwargs, "storage_offset")
    except KeyError as exc:
        return f"its {exc.args[0]} not given"
    literal = all(type(v) is int for v in (*size, *stride)) if isinstance(size, list | tuple) else False
    if not literal or not isinstance(stride, list | tuple) or len(size) != len(stride) or offset is not None:
        return f"size={printable(repr(size))[:40]}, stride={printable(repr(stride))[:40]}, storage_offset={offset!r}"
    if any(n > 1 and s != 1 for n, s in zip(size, stride, strict=True)) or sum(n > 1 for n in size) > 1:
        return f"size {list(size)} with stride {list(stride)} reorders or skips elements"
    if isinstance(source, torch.fx.Node):
        value = source.meta.get("val")
        producer = source.target
        fresh = isinstance(producer, compat.OpOverload) and compat.op_schema_name(producer) in FRESH_RESULTS
        if source.op != "call_function" or not fresh:
            return (
                f"its source {source.name} is not the result of a reduction (an input or a view, whose storage "
                "may hold more than it)"
            )
        shape = list(value.shape) if isinstance(value, torch.Tensor) else None
        # (A symbolic size is never compared with an int: the comparison would guard, or raise.)
        if shape is None or not all(type(d) is int for d in shape) or shape != list(size):
            return f"its source {source.name} is not of the static shape {list(size)}"
    return None


def check_restride_run(size: Sequence[int], source: torch.Tensor) -> None:
    """Raise :class:`RefusedOperatorError` unless ``as_strided(source, size, ...)`` (a call :func:`_restride_refusal`
    allowed) reads exactly ``source``'s elements in order: the same shape, its one dimension longer than 1 dense."""
    long = [d for d, n in enumerate(size) if n > 1]
    if list(source.shape) != list(size) or any(source.stride(d) != 1 for d in long):
        raise RefusedOperatorError(
            f"calls {RESTRIDE_ONLY}.default on a tensor of shape {list(source.shape)} and strides "
            f"{list(source.stride())} for size {list(size)}: it would read the storage rather than the values"
        )


# -- arguments checked when the call runs ------------------------------------------------------------------------
#
# Operators whose kernels check an index, offset, length or size argument on one path only, or not against the
# tensor it indexes (read in their CPU and CUDA kernels): each call is checked with the values it is given, just
# before it runs (:func:`check_run`: the checked call of a graph, every step of a reference engine's program), and
# refused where the kernel would read or write outside its arguments or return memory it did not write.


def _argument(op: compat.OpOverload, args: Sequence[Any], kwargs: dict[str, Any], name: str) -> Any:
    try:
        return compat.op_argument_value(op, tuple(args), kwargs, name)
    except KeyError:
        return None


def _numel_is(value: Any, count: int) -> bool:
    return not isinstance(value, torch.Tensor) or value.numel() == count


def _shape_of(value: torch.Tensor) -> str:
    return f"{value.dtype} {list(value.shape)}"


def _ints_of(value: torch.Tensor) -> list[int]:
    return [int(v) for v in value.reshape(-1).tolist()]


def _segment_reduce_run(op: compat.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """``lengths`` (the form the gate allows): its batch shape the data's, non-negative, each row summing to the
    reduced dimension's size (the kernel checks the last two only; a short batch reads past both)."""
    data, lengths = _argument(op, args, kwargs, "data"), _argument(op, args, kwargs, "lengths")
    if not isinstance(data, torch.Tensor) or not isinstance(lengths, torch.Tensor):
        return "no lengths tensor (offsets are never checked)"
    axis, given = lengths.dim() - 1, _argument(op, args, kwargs, "axis")
    if type(given) is not int or given % max(1, data.dim()) != axis:
        return f"axis={given!r} for lengths of {lengths.dim()} dimensions"
    if axis < 0 or lengths.dtype.is_floating_point or list(lengths.shape[:axis]) != list(data.shape[:axis]):
        return f"lengths of shape {list(lengths.shape)} for data of shape {list(data.shape)}"
    if lengths.numel() and (bool((lengths < 0).any()) or bool((lengths.sum(-1) != data.shape[axis]).any())):
        return "lengths that are negative or do not sum to the reduced dimension"
    return None


def _repeat_interleave_run(op: compat.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """A ``repeats`` tensor with ``output_size`` given: the kernel then skips its check that repeats are not
    negative and writes as the repeats say into a result of ``output_size`` (past it)."""
    repeats, size = _argument(op, args, kwargs, "repeats"), _argument(op, args, kwargs, "output_size")
    if not isinstance(repeats, torch.Tensor) or size is None:
        return None
    total = int(repeats.sum()) if repeats.numel() else 0
    data, dim = _argument(op, args, kwargs, "self"), _argument(op, args, kwargs, "dim")
    if isinstance(data, torch.Tensor) and repeats.numel() == 1:  # (one repeat for every element along dim)
        total *= data.numel() if dim is None else data.shape[dim]
    if repeats.numel() and (bool((repeats < 0).any()) or total != int(size)):
        return f"repeats that are negative or do not sum to its output_size={int(size)}"
    return None


def _embedding_bag_run(op: compat.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """``offsets`` (the kernels check only the first and the last): starting at 0, never decreasing, within
    ``indices``; 1-D indices; per-sample weights one per index (a bag between bad offsets reads past them, or is
    left as uninitialized memory in the output)."""
    indices, offsets = _argument(op, args, kwargs, "indices"), _argument(op, args, kwargs, "offsets")
    weights = _argument(op, args, kwargs, "per_sample_weights")
    if not isinstance(indices, torch.Tensor) or not isinstance(offsets, torch.Tensor):
        return "no indices and offsets tensors"
    if indices.dim() != 1 or offsets.dim() != 1 or indices.dtype.is_floating_point or offsets.dtype.is_floating_point:
        return f"indices of shape {list(indices.shape)} and offsets of shape {list(offsets.shape)} (1-D each)"
    if isinstance(weights, torch.Tensor) and list(weights.shape) != list(indices.shape):
        return f"per_sample_weights of shape {list(weights.shape)} for {indices.numel()} indices"
    # (Its CPU kernel reads them as dense arrays: a strided view is read past its elements.)
    if not all(t.is_contiguous() for t in (indices, offsets, weights) if isinstance(t, torch.Tensor)):
        return "indices, offsets or per_sample_weights that are not contiguous (its kernel reads them as if they were)"
    if offsets.numel():
        steps = offsets[1:] - offsets[:-1]
        if int(offsets[0]) != 0 or bool((steps < 0).any()) or int(offsets[-1]) > indices.numel():
            return "offsets that do not start at 0, decrease, or reach past its indices"
    return None


def _batch_norm_run(op: compat.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Weight, bias and statistics of the input's channel count (only the composite ``batch_norm`` checks it; the
    kernels read past shorter ones); statistics given unless it computes them (``no_stats`` needs training)."""
    data = _argument(op, args, kwargs, "input")
    if not isinstance(data, torch.Tensor) or data.dim() < 2:
        return "an input of fewer than 2 dimensions"
    channels = data.shape[1]
    for name in ("weight", "bias", "running_mean", "running_var"):
        if not _numel_is(_argument(op, args, kwargs, name), channels):
            return f"a {name} of {_argument(op, args, kwargs, name).numel()} values for {channels} channels"
    if compat.op_overload_name(op) == "no_stats" and _argument(op, args, kwargs, "training") is not True:
        return "no statistics and training=False (nothing to normalize with)"
    return None


def _lstm_run(op: compat.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Every weight, bias and state of the shape the layer count, directions and sizes ask for (the CPU kernel
    torch picks for float32 checks none, and reads past a short weight or writes past a short state)."""
    data = _argument(op, args, kwargs, "input" if compat.op_overload_name(op) == "input" else "data")
    hx, params = _argument(op, args, kwargs, "hx"), _argument(op, args, kwargs, "params")
    layers, biases = _argument(op, args, kwargs, "num_layers"), _argument(op, args, kwargs, "has_biases")
    directions = 2 if _argument(op, args, kwargs, "bidirectional") else 1
    if not (isinstance(data, torch.Tensor) and isinstance(hx, list | tuple) and len(hx) == 2
            and isinstance(params, list | tuple) and type(layers) is int and layers > 0):  # fmt: skip
        return "no input, two states and parameters"
    h0, c0 = hx
    if not isinstance(h0, torch.Tensor) or not isinstance(c0, torch.Tensor) or h0.dim() != c0.dim():
        return "states that are not tensors of one rank"
    hidden, projected = c0.shape[-1], h0.shape[-1]
    per = 2 + (2 if biases else 0) + (1 if projected != hidden else 0)
    if len(params) != layers * directions * per:
        return f"{len(params)} parameters for {layers} layers of {directions} direction(s), {per} each"
    batch_first = bool(_argument(op, args, kwargs, "batch_first"))
    if compat.op_overload_name(op) == "input":
        batched = data.dim() == 3
        if data.dim() not in (2, 3) or h0.dim() != data.dim():
            return f"an input of {data.dim()} dimensions and states of {h0.dim()}"
        batch = [data.shape[0 if batch_first else 1]] if batched else []
        if list(h0.shape) != [layers * directions, *batch, projected] or list(c0.shape) != [
            layers * directions,
            *batch,
            hidden,
        ]:
            return f"states of shapes {list(h0.shape)} and {list(c0.shape)} for input {list(data.shape)}"
    elif h0.dim() != 3 or h0.shape[0] != layers * directions or list(c0.shape[:2]) != list(h0.shape[:2]):
        return f"states of shapes {list(h0.shape)} and {list(c0.shape)}"
    else:
        packed = _packed_problem(op, args, kwargs, h0)
        if packed is not None:
            return packed
    shapes = []
    for layer in range(layers):
        width = data.shape[-1] if layer == 0 else directions * projected
        one = [[4 * hidden, width], [4 * hidden, projected]] + ([[4 * hidden], [4 * hidden]] if biases else [])
        shapes += (one + ([[projected, hidden]] if projected != hidden else [])) * directions
    for index, (param, shape) in enumerate(zip(params, shapes, strict=True)):
        if not isinstance(param, torch.Tensor) or list(param.shape) != shape or param.dtype != data.dtype:
            given = _shape_of(param) if isinstance(param, torch.Tensor) else type(param).__name__
            return f"parameter {index} {given} where the layer needs {data.dtype} {shape}"
    if h0.dtype != data.dtype or c0.dtype != data.dtype:
        return f"states of {h0.dtype} and {c0.dtype} for an input of {data.dtype}"
    return None


def _packed_problem(
    op: compat.OpOverload, args: Sequence[Any], kwargs: dict[str, Any], state: torch.Tensor
) -> str | None:
    """A packed sequence's ``batch_sizes`` (the ``data`` overloads): the kernels read ``batch_sizes[0]`` whatever
    it holds, and run as many rows of the state as it says (past a state of a smaller batch)."""
    data, sizes = _argument(op, args, kwargs, "data"), _argument(op, args, kwargs, "batch_sizes")
    if not isinstance(data, torch.Tensor) or not isinstance(sizes, torch.Tensor):
        return "no data and batch_sizes tensors"
    if sizes.dim() != 1 or sizes.dtype != torch.int64 or sizes.device.type != "cpu" or not sizes.numel():
        return f"batch_sizes of shape {list(sizes.shape)}, {sizes.dtype} on {sizes.device} (1-D int64 on the CPU)"
    if not sizes.is_contiguous():
        return "batch_sizes that are not contiguous (the kernels read them as if they were)"
    values = _ints_of(sizes)
    decreasing = all(later <= earlier for earlier, later in itertools.pairwise(values))
    if min(values) <= 0 or not decreasing or sum(values) != data.shape[0]:
        return f"batch_sizes that are not positive, non-increasing and summing to the data's {data.shape[0]} rows"
    if state.dim() != 3 or state.shape[1] != values[0]:
        return f"a state of shape {list(state.shape)} for batches of up to {values[0]}"
    return None


def _recurrent_run(op: compat.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """GRU and RNN layers: their kernels check the shapes of an unpacked call; a packed one's ``batch_sizes`` not."""
    if compat.op_overload_name(op) != "data":
        return None
    state = _argument(op, args, kwargs, "hx")
    if not isinstance(state, torch.Tensor):
        return "no state tensor"
    return _packed_problem(op, args, kwargs, state)


def _grid_sampler_run(op: compat.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Modes the kernel knows (it writes nothing for another, and the result is uninitialized memory)."""
    data = _argument(op, args, kwargs, "input")
    interpolation, padding = (_argument(op, args, kwargs, n) for n in ("interpolation_mode", "padding_mode"))
    bicubic = isinstance(data, torch.Tensor) and data.dim() == 4
    if interpolation not in ((0, 1, 2) if bicubic else (0, 1)) or padding not in (0, 1, 2):
        return f"interpolation_mode={interpolation!r}, padding_mode={padding!r}"
    return None


def _upsample_run(op: compat.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Scales finite, positive and the ones the output size was computed from (``floor(size * scale)``): the
    kernels map coordinates with ``1 / scale``, and a scale inconsistent with the size reads outside the input."""
    data = _argument(op, args, kwargs, "self")
    if data is None:
        data = _argument(op, args, kwargs, "input")
    if not isinstance(data, torch.Tensor):
        return "no input tensor"
    spatial = list(data.shape[2:])
    scales = _argument(op, args, kwargs, "scale_factors")
    if scales is None:
        named = [n for n in ("scales", "scales_d", "scales_h", "scales_w") if n in compat.op_argument_names(op)]
        scales = [_argument(op, args, kwargs, n) for n in named] if named else None
    if scales is None or all(scale is None for scale in scales):
        return None
    if len(scales) != len(spatial):
        return f"{len(scales)} scales for {len(spatial)} spatial dimensions"
    size = _argument(op, args, kwargs, "output_size")
    for dim, scale in enumerate(scales):
        if scale is None:
            continue
        if type(scale) not in (int, float) or not math.isfinite(scale) or scale <= 0:
            return f"scale {scale!r}"
        if size is not None and int(size[dim]) != math.floor(spatial[dim] * scale):
            return f"scale {scale!r} for an output of {int(size[dim])} from {spatial[dim]}"
    return None


_UPSAMPLE = (
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa",
)  # fmt: skip
# The checks :func:`check_run` makes, by operator (each returns why a call may not run, or None).
RUN_CHECKS: dict[str, Callable[[compat.OpOverload, Sequence[Any], dict[str, Any]], str | None]] = {
    "aten::segment_reduce": _segment_reduce_run,
    "aten::repeat_interleave": _repeat_interleave_run,
    "aten::embedding_bag": _embedding_bag_run,
    "aten::_embedding_bag": _embedding_bag_run,
    "aten::native_batch_norm": _batch_norm_run,
    "aten::_native_batch_norm_legit": _batch_norm_run,
    "aten::_native_batch_norm_legit_no_training": _batch_norm_run,
    "aten::_native_batch_norm_legit_functional": _batch_norm_run,
    "aten::lstm": _lstm_run,
    "aten::gru": _recurrent_run,
    "aten::rnn_tanh": _recurrent_run,
    "aten::rnn_relu": _recurrent_run,
    "aten::grid_sampler": _grid_sampler_run,
    "aten::grid_sampler_2d": _grid_sampler_run,
    **{f"aten::{name}": _upsample_run for name in _UPSAMPLE},
}


def checks_runs(target: Any) -> bool:
    """Whether :func:`check_run` checks calls of ``target`` (an operator of :data:`RUN_CHECKS`, or ``as_strided``)."""
    if not isinstance(target, compat.OpOverload):
        return False
    name = compat.op_schema_name(target) or ""
    return name == RESTRIDE_ONLY or name in RUN_CHECKS


def check_run(target: Any, args: Sequence[Any], kwargs: dict[str, Any], *, everywhere: bool = False) -> None:
    """Raise :class:`RefusedOperatorError` where a call about to run with these values would read or write outside
    its arguments (:data:`RUN_CHECKS`), or an ``as_strided`` would read other than its source's elements in order
    (:func:`check_restride_run`, wherever it runs); nothing for an operator the caller allowed (``--allow-op``).
    The :data:`RUN_CHECKS` of a graph's call apply inside an :func:`allowing` block only (outside it the process
    runs a program it compiled itself, as at save: the allow-list is for files); ``everywhere``: wherever it
    runs (a reference engine's step, whose program may come from a file whatever loaded it)."""
    if not isinstance(target, compat.OpOverload):
        return
    name = compat.op_schema_name(target) or ""
    if name == RESTRIDE_ONLY and not allows(name):
        size, source = _argument(target, args, kwargs, "size"), _argument(target, args, kwargs, "self")
        if isinstance(source, torch.Tensor) and isinstance(size, list | tuple):
            check_restride_run(size, source)
        return
    check = RUN_CHECKS.get(name)
    # (Outside any allowing() block a process runs what it compiled itself, or saves it: not a file's call.)
    if check is None or allows(name) or (_collectives_allowed.get() is None and not everywhere):
        return
    why = check(target, args, kwargs)
    if why is not None:
        raise RefusedOperatorError(
            f"calls {qualified_name(target)} with {why}: its kernel would read or write outside its arguments "
            f"(--allow-op {name} allows it for a trusted file)"
        )


def _draws(op: compat.OpOverload, name: str, call: Call | None) -> str | None:
    """Why a call of random operator ``op`` may draw from the global generator; None where it cannot."""
    quiet = DRAWS_ONLY_WHEN.get(name)
    why = "whatever it is given" if quiet is None else _gate(op, call, quiet)
    if why is not None or call is None or call is PER_CALL:
        return why
    with contextlib.suppress(KeyError):
        if compat.op_argument_value(op, *call, "generator") is not None:
            return "an explicit generator"
    return None


def _aten_refusal(op: compat.OpOverload, name: str, call: Call | None = None) -> str | None:
    namespace, _, opname = name.partition("::")
    if namespace != "aten":
        return _NOT_ATEN
    if name in REFUSED_ATEN or (name != "aten::_unsafe_view" and any(word in opname for word in _REFUSED_WORDS)):
        return _READS_FILES
    if compat.op_is_mutable(op):
        return "which writes to its arguments"
    if name in UNINITIALIZED_ATEN:
        return "whose result is uninitialized memory (it could tell a verification from a normal run)"
    whys = [why for gate in CHECKED_ONLY_WHEN.get(name, ()) if (why := _gate(op, call, gate)) is not None]
    if whys:
        return f"{_GATE_REASONS[name]} ({'; '.join(dict.fromkeys(whys))})"
    if name == RESTRIDE_ONLY:
        why = _restride_refusal(op, call)
        if why is not None:
            return f"which reads its source's storage rather than its values ({why})"
    if compat.op_is_random(op) or name in DRAWS_ONLY_WHEN:
        why = _draws(op, name, call)
        if why is not None:
            return (
                f"whose result depends on the global random state ({why}; it could tell a verification "
                "from a normal run)"
            )
    if name not in SCALAR_RESULTS and not set(compat.op_return_types(op)) <= _TENSOR_RESULTS:
        return "whose result is not a tensor (it could report how the program is run rather than compute on values)"
    if name not in ALLOWED_ATEN:
        return "which is not on the list of operators that compute on values only (allowed_aten.txt)"
    return None


def resolve(name: str, *, per_call: bool = False) -> Callable[..., Any]:
    """The allowed callable a qualified name stands for (``aten::relu.default``, ``operator.add``).

    Raises :class:`RefusedOperatorError` for anything not allowed, or not an operator at all.
    ``per_call``: each call of it is checked later with its arguments (:func:`check_call`), so an
    operator of :data:`DRAWS_ONLY_WHEN` passes here.
    """
    # The reference program format writes ``operator.add``, torch's serializer ``_operator.add``.
    function = PYTHON_FUNCTIONS.get(f"_{name}" if name.startswith("operator.") else name)
    if function is not None:
        return function
    namespace, sep, rest = name.partition("::")
    opname, dot, overload = rest.partition(".")
    if not (sep and _NAME.match(namespace) and _NAME.match(opname) and (not dot or _NAME.match(overload))):
        raise RefusedOperatorError(f"names {printable(name)!r}, which is not an operator name")
    qualified = f"{namespace}::{opname}"
    if is_native_engine_op(qualified) and qualified not in _extra_allowed.get():
        raise RefusedOperatorError(_native_refusal(f"{qualified}.{overload or 'default'}"))
    op = _lookup(namespace, opname, overload or "default")
    _check_op(op, PER_CALL if per_call else None)
    return op


def _lookup(namespace: str, opname: str, overload: str) -> compat.OpOverload:
    """The registered OpOverload ``namespace::opname.overload``, checked to be exactly that one."""
    wanted = f"{namespace}::{opname}.{overload}"
    try:
        packet = getattr(getattr(torch.ops, namespace), opname)
    except (AttributeError, RuntimeError) as exc:
        if f"{namespace}::{opname}" in COLLECTIVE_OPS:
            raise RefusedOperatorError(
                f"names {wanted}, a collective that torch_tensorrt registers (Torch-TensorRT's fused NCCL ops): "
                "it runs only where torch_tensorrt imports, on CUDA"
            ) from exc
        raise RefusedOperatorError(f"names {wanted}, which is not registered in this process") from exc
    if not isinstance(packet, compat.OpOverloadPacket) or overload not in compat.op_overloads(packet):
        raise RefusedOperatorError(f"names {wanted}, which is not a registered operator")
    op = getattr(packet, overload)
    if not isinstance(op, compat.OpOverload) or qualified_name(op) != wanted:
        raise RefusedOperatorError(f"names {wanted}, which is not a registered operator")
    return op


def serialized_to_qualified(target: str) -> str:
    """A target as torch's serializer writes it (``torch.ops.aten.relu.default``) in qualified form.

    Python functions keep their name (``_operator.add``); other strings are returned as they are.
    """
    if target.startswith("torch.ops."):
        parts = target.split(".")
        if len(parts) == 5:
            return f"{parts[2]}::{parts[3]}.{parts[4]}"
    return target
