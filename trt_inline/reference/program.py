"""Reference-engine programs: a block's ATen graph as JSON, decoded and run.

A program lists one step per node of the accelerated block; each argument is a
literal, a reference to an earlier value (an input, a weight, a step's result),
or a dtype / device / layout by name. Decoding never unpickles and never
imports: every step's target is looked up by name and must be on the allow-list
of :mod:`trt_inline.allowed_ops` (refused with :class:`RefusedOperatorError`,
naming the step), so a program from a stranger's file reaches no other callable.

Inputs and outputs are described (``input_specs`` / ``output_specs``): a
tensor's dtype and dims (with the symbol naming each dynamic dim), or a scalar
with its dtype and, for a SymInt, the size expression it equals
(:mod:`trt_inline.inlining.symbolic`). A scalar input arrives as a 0-d tensor and is
read back with ``item()``, or, while tracing, recomputed from the input sizes;
a scalar output leaves as a 0-d tensor.

A step may record where its node came from (``origin``: the module path and
source line :func:`trt_inline.module_paths.node_origin` gave when the engine was
built), so that a report can name an op inside an engine in the user's terms.
"""

from __future__ import annotations

import functools
import json
import operator
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from trt_inline import allowed_ops, compat
from trt_inline.engines import ValueSpec
from trt_inline.errors import EngineFormatError, RefusedOperatorError, Unencodable, printable
from trt_inline.inlining import scalars, symbolic
from trt_inline.module_paths import NodeOrigin, file_origin

__all__ = [
    "ALIGN",
    "FORMAT",
    "SCALAR_TARGETS",
    "EngineProgram",
    "Unencodable",
    "WeightSpec",
    "as_tensor",
    "can_encode_args",
    "encodable_target",
    "encode_arg",
    "encode_spec",
    "float64_values",
    "load_program",
]

FORMAT = "trt_inline.reference/1"
# How much of a program's "built_on" is read (the line is cut shorter when shown: module_paths.file_origin).
_BUILT_ON_READ = 4096
ALIGN = 64  # weights start at offsets that are multiples of this

# Python-level callables an engine may contain besides OpOverloads: getitem, which
# FX uses to unpack multi-output ops (batch norm, split, topk) inside a block, and
# the symbolic-scalar arithmetic Torch-TensorRT has converters for (2.9 ... 2.14:
# add, sub, mul, floordiv, mod, pow, eq, sym_not; truediv from 2.11). Other
# comparisons (the ``>=`` of a ``torch._check``) have none and stay in PyTorch.
SCALAR_TARGETS: frozenset[Callable[..., Any]] = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.floordiv,
        operator.truediv,
        operator.mod,
        operator.pow,
        operator.eq,
        torch.sym_not,
    }
)
_ENGINE_CALLABLES: tuple[Callable[..., Any], ...] = (operator.getitem, *SCALAR_TARGETS)


def encodable_target(target: Any) -> str | None:
    """Name under which a node target is stored in a program, or None if it can't be.

    Operators by qualified name (``aten::relu.default``); the Python functions an
    engine may hold by the allow-list's name, written ``operator.add`` in this format.
    """
    if isinstance(target, compat.OpOverload):
        return allowed_ops.qualified_name(target)
    if target not in _ENGINE_CALLABLES:
        return None
    return allowed_ops.qualified_name(target).removeprefix("_")


# ---------------------------------------------------------------------------
# Encoding of node arguments
# ---------------------------------------------------------------------------


def encode_arg(arg: Any, refs: dict[torch.fx.Node, int]) -> Any:
    """Turn one FX argument into JSON. Node references become ``{"ref": k}``."""
    if isinstance(arg, torch.fx.Node):
        if arg not in refs:
            raise Unencodable(f"reference to {arg.name}, which is not in the block")
        return {"ref": refs[arg]}
    if arg is None or isinstance(arg, (bool, int, float, str)):
        return arg
    if isinstance(arg, list):
        return [encode_arg(a, refs) for a in arg]
    if isinstance(arg, tuple):
        return {"tuple": [encode_arg(a, refs) for a in arg]}
    if isinstance(arg, torch.dtype):
        return {"dtype": str(arg).removeprefix("torch.")}
    if isinstance(arg, torch.device):
        # Engines run wherever their inputs are; the recorded device is dropped.
        return {"device": None}
    if isinstance(arg, torch.memory_format):
        return {"memory_format": str(arg).removeprefix("torch.")}
    if isinstance(arg, torch.layout):
        return {"layout": str(arg).removeprefix("torch.")}
    raise Unencodable(f"argument of type {type(arg).__name__}")


def can_encode_args(node: torch.fx.Node) -> bool:
    """Whether a node's non-Node arguments can be written into a program."""
    refs = {n: 0 for n in node.all_input_nodes}
    try:
        encode_arg(list(node.args), refs)
        encode_arg(list(node.kwargs.values()), refs)
    except Unencodable:
        return False
    return True


class _Ref:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Device:
    __slots__ = ()


_DEVICE = _Device()


def _decode_arg(value: Any, num_values: int) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode_arg(v, num_values) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        ((tag, payload),) = value.items()
        if tag == "ref":
            if not isinstance(payload, int) or not 0 <= payload < num_values:
                raise EngineFormatError(f"engine program has a dangling reference {payload!r}")
            return _Ref(payload)
        if tag == "tuple" and isinstance(payload, list):
            return tuple(_decode_arg(v, num_values) for v in payload)
        if tag == "dtype":
            return _torch_attr(payload, torch.dtype)
        if tag == "device":
            return _DEVICE
        if tag == "memory_format":
            return _torch_attr(payload, torch.memory_format)
        if tag == "layout":
            return _torch_attr(payload, torch.layout)
    raise EngineFormatError(f"engine program has an unreadable argument {value!r}")


def _torch_attr(name: Any, kind: type) -> Any:
    public = isinstance(name, str) and name.isidentifier() and not name.startswith("_")
    value = getattr(torch, name, None) if public else None
    if not isinstance(value, kind):
        raise EngineFormatError(f"engine program names an unknown {kind.__name__} {printable(repr(name))}")
    return value


def float64_values(value: Any) -> Any:
    """``value`` with every floating tensor in it widened to float64 (exactly)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.float64)
    if isinstance(value, (list, tuple)):
        return type(value)(float64_values(v) for v in value)
    return value


def _substitute(value: Any, env: list[Any], device: torch.device) -> Any:
    if isinstance(value, _Ref):
        return env[value.index]
    if isinstance(value, list):
        return [_substitute(v, env, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_substitute(v, env, device) for v in value)
    if value is _DEVICE:
        return device
    return value


# ---------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightSpec:
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


_NO_ORIGIN = NodeOrigin("", "")


@dataclass(frozen=True)
class _Step:
    target: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    origin: NodeOrigin = _NO_ORIGIN  # the module path and source line its node was traced from


@dataclass(frozen=True)
class EngineProgram:
    """A decoded program: what :func:`load_program` returns."""

    num_inputs: int
    # Per input / output: a tensor's dtype and dims (None where symbolic) or a scalar; None where not recorded.
    input_specs: tuple[ValueSpec | None, ...]
    weights: tuple[WeightSpec, ...]
    steps: tuple[_Step, ...]
    outputs: tuple[int, ...]
    output_specs: tuple[ValueSpec | None, ...]
    # Per input: the symbol naming each size of a tensor input (None where static or not recorded), and
    # for a scalar input the expression it equals in those symbols (see _encode_expr), where recorded.
    input_symbols: tuple[tuple[str | None, ...], ...] = ()
    scalar_exprs: tuple[Any, ...] = ()
    # Per input: (symbol, scale, offset) for each size that is a derived expression, scale * symbol + offset.
    input_terms: tuple[tuple[tuple[str, int, int] | None, ...], ...] = ()
    # Which pipeline built the engine (one line: a Torch-TensorRT release's own, or trt-inline's emulation of
    # one), escaped and cut as any text from a file; "" where not recorded.
    built_on: str = ""

    def weight_tensors(self, payload: torch.Tensor, like: torch.Tensor | None) -> list[torch.Tensor]:
        """Views of the payload (real run) or fresh fake tensors (fake run)."""
        if compat.is_fake(payload) or payload.device.type == "meta":
            base = like if like is not None else payload
            return [base.new_empty(w.shape, dtype=w.dtype) for w in self.weights]
        if payload.dim() != 1 or payload.dtype != torch.uint8:
            raise EngineFormatError("engine payload must be a 1-D uint8 tensor")
        end = max((w.offset + w.nbytes for w in self.weights), default=0)
        if payload.numel() < end:
            raise EngineFormatError(f"engine payload holds {payload.numel()} bytes, its program needs {end}")
        if like is not None and like.device != payload.device:
            payload = _payload_on(payload, like.device)
        return [payload[w.offset : w.offset + w.nbytes].view(w.dtype).view(w.shape) for w in self.weights]

    def reduced_precisions(self) -> frozenset[torch.dtype]:
        """The reduced floating dtypes (float16, bfloat16) the program computes in: those of its inputs, outputs
        and weights, and those its steps cast to (an emulated fp16 layer's roundings)."""
        found = {spec.dtype for spec in (*self.input_specs, *self.output_specs) if spec is not None}
        found.update(weight.dtype for weight in self.weights)
        for step in self.steps:
            found.update(value for value in (*step.args, *step.kwargs.values()) if isinstance(value, torch.dtype))
        return frozenset(found & {torch.float16, torch.bfloat16})

    def is_scalar_input(self, index: int) -> bool:
        spec = self.input_specs[index]
        return spec is not None and spec.scalar

    def _scalar(self, index: int, inputs: Sequence[torch.Tensor]) -> Any:
        """The value of scalar input ``index``: read from its 0-d tensor, or (tracing) from the input sizes.

        A fake 0-d tensor carries no value, so ``item()`` on it gives a fresh
        unbacked symbol and the relation to the input sizes (the scalar was
        ``rows - 1``) is lost; where the program recorded that relation and the
        sizes it names are inputs of this call, the value is computed from them.
        """
        tensor = inputs[index]
        expr = self.scalar_exprs[index] if index < len(self.scalar_exprs) else None
        if expr is None or not compat.is_fake(tensor):
            return scalars.to_scalar(tensor)
        sizes: dict[str, Any] = {}
        for symbols, value in zip(self.input_symbols, inputs, strict=False):
            for name, dim in zip(symbols, value.shape if value.dim() == len(symbols) else (), strict=False):
                if name is not None:
                    sizes.setdefault(name, dim)
        for terms, value in zip(self.input_terms, inputs, strict=False):
            for term, dim in zip(terms, value.shape if value.dim() == len(terms) else (), strict=False):
                if term is not None:
                    sizes.setdefault(term[0], (dim - term[2]) // term[1])
        try:
            return symbolic.evaluate(expr, sizes)
        except KeyError:  # a symbol no input of this call carries
            return scalars.to_scalar(tensor)

    def run(self, inputs: Sequence[torch.Tensor], payload: torch.Tensor) -> list[torch.Tensor]:
        """Run the steps; scalar inputs arrive and scalar outputs leave as 0-d tensors.

        The device (of outputs, and of weights copied over) is the first tensor
        input's, never a scalar's: a scalar input may sit anywhere.
        """
        env, device = self._run_steps(inputs, payload, upcast=False)
        return [as_tensor(env[i], spec, device) for i, spec in zip(self.outputs, self.output_specs, strict=True)]

    def step_values(self, inputs: Sequence[torch.Tensor], payload: torch.Tensor, *, upcast: bool) -> list[Any]:
        """What each step returns, in order; ``upcast``: its floating inputs and weights in float64 first, and
        a floating dtype a step asks for (a cast) float64 too."""
        env, _ = self._run_steps(inputs, payload, upcast=upcast)
        return env[len(env) - len(self.steps) :]

    def outputs_of(self, values: Sequence[Any]) -> list[Any]:
        """The program's outputs among ``values`` (as :meth:`values` numbers them), as its steps left them."""
        return [values[index] for index in self.outputs]

    def outputs_after(self, values: Sequence[Any], step: int, value: Any, device: torch.device) -> list[Any]:
        """The outputs of a run that goes on from ``values`` (a run's, as :meth:`values` numbers them) with step
        ``step`` returning ``value``, every step after it computing in float64 (what one op's own error does
        downstream, nothing after it adding its own; the steps before it are not run again)."""
        first = self.num_inputs + len(self.weights)
        env: list[Any] = [*values[: first + step], value]
        for index in range(step + 1, len(self.steps)):
            env.append(self._step(index, env, device, upcast=True))
        return self.outputs_of(env)

    def _step(self, index: int, env: list[Any], device: torch.device, *, upcast: bool) -> Any:
        """Step ``index`` on ``env``; ``upcast``: its floating arguments in float64, a floating cast made to it."""
        step = self.steps[index]
        args = _substitute(step.args, env, device)
        kwargs = {k: _substitute(v, env, device) for k, v in step.kwargs.items()}
        if upcast:  # (the values it reads may be narrower: a run going on from an engine's own values)
            args, kwargs = float64_values(args), {k: float64_values(v) for k, v in kwargs.items()}
        dtype = kwargs.get("dtype")
        if upcast and isinstance(dtype, torch.dtype) and dtype.is_floating_point:
            kwargs["dtype"] = torch.float64  # (a cast to float16 or float32 stays float64: never narrower)
        # (as_strided only where it reads its source's elements in order; index arguments within range:
        # wherever the engine runs, a plain torch.export.load of its file included)
        allowed_ops.check_run(step.target, args, kwargs, everywhere=True)
        return step.target(*args, **kwargs)

    def _run_steps(
        self, inputs: Sequence[torch.Tensor], payload: torch.Tensor, *, upcast: bool
    ) -> tuple[list[Any], Any]:
        if len(inputs) != self.num_inputs:
            raise EngineFormatError(f"engine expects {self.num_inputs} inputs, got {len(inputs)}")
        tensors = [t for i, t in enumerate(inputs) if not self.is_scalar_input(i)]
        like = tensors[0] if tensors else None
        device = like.device if like is not None else payload.device
        values = [self._scalar(i, inputs) if self.is_scalar_input(i) else t for i, t in enumerate(inputs)]
        env: list[Any] = [*values, *self.weight_tensors(payload, like)]
        if upcast:
            env = [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in env]
        for index in range(len(self.steps)):
            env.append(self._step(index, env, device, upcast=upcast))
        return env, device

    def values(self, inputs: Sequence[torch.Tensor], payload: torch.Tensor) -> list[Any]:
        """Every value a run computes, numbered as steps refer to them: the inputs, the weights, each step's result."""
        return self._run_steps(inputs, payload, upcast=False)[0]

    def run_step(
        self,
        index: int,
        values: list[Any],
        device: torch.device,
        convert: Callable[[tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]],
    ) -> Any:
        """Step ``index`` run again on ``values`` (as :meth:`values` numbers them), its arguments passed through
        ``convert`` first (widened, say), and checked as a run checks them."""
        step = self.steps[index]
        args = _substitute(step.args, values, device)
        kwargs = {k: _substitute(v, values, device) for k, v in step.kwargs.items()}
        args, kwargs = convert(args, kwargs)
        allowed_ops.check_run(step.target, args, kwargs, everywhere=True)
        return step.target(*args, **kwargs)

    def step_names(self) -> list[str]:
        """Each step's target, as the program names it (``aten::addmm.default``)."""
        return [encodable_target(step.target) or repr(step.target) for step in self.steps]

    def step_origins(self) -> list[NodeOrigin]:
        """Each step's module path and source line, where the program records them (both empty where not)."""
        return [step.origin for step in self.steps]

    def step_reads(self, index: int) -> list[int]:
        """The values step ``index`` reads, numbered as :meth:`values` numbers them, in argument order."""
        step = self.steps[index]
        return [ref.index for ref in _refs((step.args, step.kwargs))]


def as_tensor(value: Any, spec: ValueSpec | None, device: torch.device) -> torch.Tensor:
    """An engine value as the engine op passes it: a scalar becomes a 0-d tensor of its recorded dtype."""
    return scalars.to_tensor(value, device, spec.dtype if spec is not None else None)


# Copies of payloads on other devices, by the payload's identity: a weak-keyed dictionary would compare
# two references to one tensor with the tensor's own ==, which compares values (and raises).
_device_copies: dict[int, tuple[weakref.ref[torch.Tensor], dict[torch.device, torch.Tensor]]] = {}


def _payload_on(payload: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The payload moved to ``device``, copied once per payload and device, dropped with the payload."""
    key = id(payload)
    entry = _device_copies.get(key)
    if entry is None or entry[0]() is not payload:
        entry = (weakref.ref(payload, lambda _, key=key: _device_copies.pop(key, None)), {})  # type: ignore[misc]
        _device_copies[key] = entry
    copies = entry[1]
    if device not in copies:
        copies[device] = payload.to(device)
    return copies[device]


def load_program(program: str) -> EngineProgram:
    """Decode a program string; refuses (:class:`RefusedOperatorError`) a step calling a target not allowed.

    Cached per program and per set of operators the caller allowed
    (:func:`trt_inline.allowed_ops.allowing`): the same string arrives on every call.
    """
    return _load_program(program, allowed_ops.allowed_now())


@functools.lru_cache(maxsize=256)
def _load_program(program: str, allowed: frozenset[str]) -> EngineProgram:
    try:
        doc = json.loads(program)
    except ValueError as exc:
        raise EngineFormatError(f"engine program is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise EngineFormatError(f"engine program is not in format {FORMAT!r}")
    try:
        num_inputs = int(doc["inputs"])
        weights = tuple(
            WeightSpec(
                dtype=_torch_attr(w["dtype"], torch.dtype),
                shape=tuple(int(d) for d in w["shape"]),
                offset=int(w["offset"]),
                nbytes=int(w["nbytes"]),
            )
            for w in doc["weights"]
        )
        steps = []
        num_values = num_inputs + len(weights)
        for index, raw in enumerate(doc["steps"]):
            args = tuple(_decode_arg(raw["args"], num_values))
            kwargs = {str(k): _decode_arg(v, num_values) for k, v in raw["kwargs"].items()}
            try:
                target = allowed_ops.resolve(str(raw["target"]), per_call=True)
                allowed_ops.check_call(target, args, kwargs)  # a random operator: only where it cannot draw
            except RefusedOperatorError as exc:
                raise RefusedOperatorError(f"step {index} {exc}") from None
            steps.append(_Step(target=target, args=args, kwargs=kwargs, origin=_decode_origin(raw.get("origin"))))
            num_values += 1
        outputs = tuple(int(i) for i in doc["outputs"])
        raw_inputs = doc.get("input_specs", [None] * num_inputs)
        input_specs = tuple(_decode_spec(spec) for spec in raw_inputs)
        output_specs = tuple(_decode_spec(spec) for spec in doc.get("output_specs", [None] * len(outputs)))
        input_symbols = tuple(
            tuple(None if name is None else str(name) for name in (spec or {}).get("symbols", []))
            for spec in raw_inputs
        )
        input_terms = tuple(_decode_terms((spec or {}).get("terms", [])) for spec in raw_inputs)
        scalar_exprs = tuple(symbolic.checked((spec or {}).get("expr")) for spec in raw_inputs)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:  # (OverflowError: a count of Infinity)
        if isinstance(exc, (EngineFormatError, RefusedOperatorError)):
            raise
        raise EngineFormatError(f"engine program is incomplete: {repr(exc)[:200]}") from exc
    if any(not 0 <= i < num_values for i in outputs):
        raise EngineFormatError("engine program returns a value it never computes")
    _check_reads(steps, num_inputs + len(weights), outputs)
    if len(input_specs) != num_inputs:
        raise EngineFormatError("engine program describes a different number of inputs than it takes")
    if len(output_specs) != len(outputs):
        raise EngineFormatError("engine program describes a different number of outputs than it returns")
    built_on = doc.get("built_on", "")
    if not isinstance(built_on, str):
        raise EngineFormatError("engine program says what built it in something other than text")
    return EngineProgram(
        num_inputs, input_specs, weights, tuple(steps), outputs, output_specs, input_symbols, scalar_exprs, input_terms,
        file_origin("", built_on[:_BUILT_ON_READ]).source,
    )  # fmt: skip


def _decode_origin(raw: Any) -> NodeOrigin:
    """A step's ``origin`` (``[module path, source line]``, what :func:`~trt_inline.module_paths.node_origin` said
    when the engine was built), escaped and cut as any text from a file; none recorded: both empty."""
    if raw is None:
        return _NO_ORIGIN
    if not (isinstance(raw, list) and len(raw) == 2 and all(isinstance(part, str) for part in raw)):
        raise EngineFormatError("engine program has a step origin that is not [module, source]")
    return file_origin(raw[0], raw[1])


def _check_reads(steps: Sequence[_Step], first: int, outputs: Sequence[int]) -> None:
    """Each step whose target has outputs that hold no values (:func:`allowed_ops.check_reads`) is read only at
    the others: by ``getitem`` steps of a literal index. ``first``: the value index of step 0's result."""
    reads: dict[int, list[int | None]] = {}
    for step in steps:
        if step.target is operator.getitem and len(step.args) == 2 and isinstance(step.args[0], _Ref):
            if type(step.args[1]) is int and not step.kwargs:
                reads.setdefault(step.args[0].index, []).append(step.args[1])
                continue
        for ref in _refs((step.args, step.kwargs)):
            reads.setdefault(ref.index, []).append(None)
    for index in outputs:
        reads.setdefault(index, []).append(None)
    for position, step in enumerate(steps):
        try:
            allowed_ops.check_reads(step.target, reads.get(first + position, []))
        except RefusedOperatorError as exc:
            raise RefusedOperatorError(f"step {position} {exc}") from None


def _refs(value: Any) -> Iterator[_Ref]:
    """Every value reference in a step's (nested) arguments."""
    if isinstance(value, _Ref):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _refs(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _refs(item)


def _decode_terms(raw: Any) -> tuple[tuple[str, int, int] | None, ...]:
    """The ``terms`` of an input spec: per dim, None or ``(symbol, scale >= 1, offset)``."""
    terms: list[tuple[str, int, int] | None] = []
    for term in raw:
        if term is None:
            terms.append(None)
            continue
        name, scale, offset = term
        if not isinstance(name, str) or type(scale) is not int or type(offset) is not int or scale < 1:
            raise ValueError(f"unreadable size term {term!r}")
        terms.append((name, scale, offset))
    return tuple(terms)


def encode_spec(value: Any) -> dict[str, Any] | None:
    """How a program records one input or output.

    A tensor: dtype, dims (symbolic ones as None) and the symbol naming each
    symbolic dim. A scalar: its dtype, and, for a SymInt, the expression it
    equals in those symbols (``rows - 1``), so that tracing the engine again can
    recompute it from the input sizes rather than lose the relation.
    """
    if isinstance(value, torch.Tensor):
        spec: dict[str, Any] = {
            "dtype": str(value.dtype).removeprefix("torch."),
            "shape": [d if isinstance(d, int) else None for d in value.shape],
        }
        symbols = symbolic.size_symbols(value)
        if any(symbols):
            spec["symbols"] = symbols
        # A derived size (2 * half, seq + 1): its symbol, scale and offset, so the symbol can be read back.
        terms = [None if term is None or term[1:] == (1, 0) else list(term) for term in symbolic.size_terms(value)]
        if any(terms):
            spec["terms"] = terms
        return spec
    if scalars.is_scalar(value):
        spec = {"scalar": str(scalars.dtype_of(value)).removeprefix("torch.")}
        expr = symbolic.encode(value.node.expr) if isinstance(value, torch.SymInt) else None
        if expr is not None:
            spec["expr"] = expr
        return spec
    return None


def _decode_spec(spec: Any) -> ValueSpec | None:
    if spec is None:
        return None
    if "scalar" in spec:
        return ValueSpec(_torch_attr(spec["scalar"], torch.dtype), (), scalar=True)
    dims = tuple(None if d is None else int(d) for d in spec["shape"])
    return ValueSpec(_torch_attr(spec["dtype"], torch.dtype), dims)
