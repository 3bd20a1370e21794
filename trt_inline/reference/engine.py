"""The reference engine: a CPU (and CUDA) stand-in for a TensorRT engine.

An accelerated block ``_run_on_acc_N`` of a partitioned graph is frozen into two
things, the way TensorRT freezes it into an engine:

* ``program``: a JSON string describing the block's ATen graph: one step per
  node, arguments given as references to earlier values, inputs, or weights;
* ``engine``: a ``uint8`` tensor holding every weight the block reads, packed
  at 64-byte aligned offsets.

Both travel into the saved ExportedProgram: the payload as a lifted constant
(the analogue of TensorRT's engine object) and the program as a string argument
of ``torch.ops.trt_inline.execute_engine``. The op's fake kernel reads only the
program string and the weights' recorded shapes, never the payload bytes, so
shape propagation under ``FakeTensorMode`` never has to materialise a real
tensor inside a fake context (the ``torch.export.load``-inside-a-fake-kernel
failure, "set the storage of a tensor on device meta to a storage on different
device cpu", cannot happen by construction).

Loading a program never unpickles: it is JSON, and every step's target must be
an ``OpOverload`` registered in ``torch.ops`` or one of a few ``operator``
functions.

Scalars cross the boundary as TensorRT's do: a scalar input (a SymInt,
SymFloat or SymBool of the block) arrives as a 0-d tensor and is read back
with ``item()`` inside the engine; a scalar output leaves as a 0-d tensor
(int64, float64 or bool). The program records which inputs and outputs are
scalars (``input_specs`` / ``output_specs``).
"""

from __future__ import annotations

import functools
import json
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from trt_inline import compat
from trt_inline.attributes import resolve_attribute
from trt_inline.engines import EngineSignature, ValueSpec
from trt_inline.errors import EngineFormatError

__all__ = [
    "FORMAT",
    "EngineProgram",
    "ReferenceEngine",
    "build_engine",
    "describe_call",
    "encodable_target",
    "load_program",
]

FORMAT = "trt_inline.reference/1"
_ALIGN = 64

# Python-level callables an engine may contain besides OpOverloads: getitem, which
# FX uses to unpack multi-output ops (batch norm, split, topk) inside a block, and
# the symbolic-scalar arithmetic Torch-TensorRT converts (operator.sub on SymInts...).
_PY_TARGETS: dict[str, Callable[..., Any]] = {
    f"operator.{fn.__name__}": fn
    for fn in (
        operator.getitem,
        operator.add,
        operator.sub,
        operator.mul,
        operator.floordiv,
        operator.truediv,
        operator.mod,
        operator.pow,
        operator.neg,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
    )
}
_PY_TARGETS.update({"torch.sym_not": torch.sym_not, "torch.sym_min": torch.sym_min, "torch.sym_max": torch.sym_max})
_PY_TARGET_NAMES = {fn: name for name, fn in _PY_TARGETS.items()}
SCALAR_TARGETS = frozenset(fn for name, fn in _PY_TARGETS.items() if name != "operator.getitem")


def encodable_target(target: Any) -> str | None:
    """Name under which a node target is stored in a program, or None if it can't be."""
    if isinstance(target, compat.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    return _PY_TARGET_NAMES.get(target)


def _resolve_target(name: str) -> Callable[..., Any]:
    if name in _PY_TARGETS:
        return _PY_TARGETS[name]
    namespace, sep, rest = name.partition("::")
    opname, dot, overload = rest.rpartition(".")
    if not sep or not dot or not namespace or not opname:
        raise EngineFormatError(f"engine program names an invalid target {name!r}")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), opname), overload)  # type: ignore[no-any-return]
    except (AttributeError, RuntimeError) as exc:
        raise EngineFormatError(
            f"engine program uses operator {name!r}, which is not registered in this process"
        ) from exc


# ---------------------------------------------------------------------------
# Encoding of node arguments
# ---------------------------------------------------------------------------


class _Unencodable(Exception):
    pass


def _encode_arg(arg: Any, refs: dict[torch.fx.Node, int]) -> Any:
    """Turn one FX argument into JSON. Node references become ``{"ref": k}``."""
    if isinstance(arg, torch.fx.Node):
        if arg not in refs:
            raise _Unencodable(f"reference to {arg.name}, which is not in the block")
        return {"ref": refs[arg]}
    if arg is None or isinstance(arg, (bool, int, float, str)):
        return arg
    if isinstance(arg, list):
        return [_encode_arg(a, refs) for a in arg]
    if isinstance(arg, tuple):
        return {"tuple": [_encode_arg(a, refs) for a in arg]}
    if isinstance(arg, torch.dtype):
        return {"dtype": str(arg).removeprefix("torch.")}
    if isinstance(arg, torch.device):
        # Engines run wherever their inputs are; the recorded device is dropped.
        return {"device": None}
    if isinstance(arg, torch.memory_format):
        return {"memory_format": str(arg).removeprefix("torch.")}
    if isinstance(arg, torch.layout):
        return {"layout": str(arg).removeprefix("torch.")}
    raise _Unencodable(f"argument of type {type(arg).__name__}")


def can_encode_args(node: torch.fx.Node) -> bool:
    """Whether a node's non-Node arguments can be written into a program."""
    refs = {n: 0 for n in node.all_input_nodes}
    try:
        _encode_arg(list(node.args), refs)
        _encode_arg(list(node.kwargs.values()), refs)
    except _Unencodable:
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
    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, kind):
        raise EngineFormatError(f"engine program names an unknown {kind.__name__} {name!r}")
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


@dataclass(frozen=True)
class _Step:
    target: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


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
            return tensor.item()
        sizes: dict[str, Any] = {}
        for symbols, value in zip(self.input_symbols, inputs, strict=False):
            for name, dim in zip(symbols, value.shape if value.dim() == len(symbols) else (), strict=False):
                if name is not None:
                    sizes.setdefault(name, dim)
        try:
            return _evaluate_expr(expr, sizes)
        except KeyError:  # a symbol no input of this call carries
            return tensor.item()

    def run(self, inputs: Sequence[torch.Tensor], payload: torch.Tensor) -> list[torch.Tensor]:
        """Run the steps; scalar inputs arrive and scalar outputs leave as 0-d tensors.

        The device (of outputs, and of weights copied over) is the first tensor
        input's, never a scalar's: a scalar input may sit anywhere.
        """
        if len(inputs) != self.num_inputs:
            raise EngineFormatError(f"engine expects {self.num_inputs} inputs, got {len(inputs)}")
        tensors = [t for i, t in enumerate(inputs) if not self.is_scalar_input(i)]
        like = tensors[0] if tensors else None
        device = like.device if like is not None else payload.device
        values = [self._scalar(i, inputs) if self.is_scalar_input(i) else t for i, t in enumerate(inputs)]
        env: list[Any] = [*values, *self.weight_tensors(payload, like)]
        for step in self.steps:
            args = _substitute(step.args, env, device)
            kwargs = {k: _substitute(v, env, device) for k, v in step.kwargs.items()}
            env.append(step.target(*args, **kwargs))
        return [_as_tensor(env[i], spec, device) for i, spec in zip(self.outputs, self.output_specs, strict=True)]


def _as_tensor(value: Any, spec: ValueSpec | None, device: torch.device) -> torch.Tensor:
    """An engine output as the engine returns it: a scalar becomes a 0-d tensor of its recorded dtype."""
    if isinstance(value, torch.Tensor):
        return value
    dtype = spec.dtype if spec is not None else _scalar_dtype(value)
    return torch.scalar_tensor(value, dtype=dtype, device=device)


def _scalar_dtype(value: Any) -> torch.dtype:
    if isinstance(value, (torch.SymBool, bool)):
        return torch.bool
    if isinstance(value, (torch.SymInt, int)):
        return torch.int64
    return torch.float64


_device_copies: weakref.WeakKeyDictionary[torch.Tensor, dict[torch.device, torch.Tensor]] = weakref.WeakKeyDictionary()


def _payload_on(payload: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The payload moved to ``device``, copied once per payload and device."""
    copies = _device_copies.setdefault(payload, {})
    if device not in copies:
        copies[device] = payload.to(device)
    return copies[device]


@functools.lru_cache(maxsize=256)
def load_program(program: str) -> EngineProgram:
    """Decode a program string. Cached: the same string object arrives on every call."""
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
        for raw in doc["steps"]:
            steps.append(
                _Step(
                    target=_resolve_target(str(raw["target"])),
                    args=tuple(_decode_arg(raw["args"], num_values)),
                    kwargs={str(k): _decode_arg(v, num_values) for k, v in raw["kwargs"].items()},
                )
            )
            num_values += 1
        outputs = tuple(int(i) for i in doc["outputs"])
        raw_inputs = doc.get("input_specs", [None] * num_inputs)
        input_specs = tuple(_decode_spec(spec) for spec in raw_inputs)
        output_specs = tuple(_decode_spec(spec) for spec in doc.get("output_specs", [None] * len(outputs)))
        input_symbols = tuple(
            tuple(None if name is None else str(name) for name in (spec or {}).get("symbols", []))
            for spec in raw_inputs
        )
        scalar_exprs = tuple(_check_expr((spec or {}).get("expr")) for spec in raw_inputs)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, EngineFormatError):
            raise
        raise EngineFormatError(f"engine program is incomplete: {exc!r}") from exc
    if any(not 0 <= i < num_values for i in outputs):
        raise EngineFormatError("engine program returns a value it never computes")
    if len(input_specs) != num_inputs:
        raise EngineFormatError("engine program describes a different number of inputs than it takes")
    if len(output_specs) != len(outputs):
        raise EngineFormatError("engine program describes a different number of outputs than it returns")
    return EngineProgram(
        num_inputs, input_specs, weights, tuple(steps), outputs, output_specs, input_symbols, scalar_exprs
    )


def _encode_spec(value: Any) -> dict[str, Any] | None:
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
        symbols = [
            str(d.node.expr) if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol else None for d in value.shape
        ]
        if any(symbols):
            spec["symbols"] = symbols
        return spec
    if isinstance(value, (torch.SymBool, torch.SymInt, torch.SymFloat, bool, int, float)):
        spec = {"scalar": str(_scalar_dtype(value)).removeprefix("torch.")}
        expr = _encode_expr(value.node.expr) if isinstance(value, torch.SymInt) else None
        if expr is not None:
            spec["expr"] = expr
        return spec
    return None


# Integer expressions a program can record, by the name of the sympy function: how to evaluate each.
_EXPR_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "Add": lambda *terms: functools.reduce(operator.add, terms),
    "Mul": lambda *factors: functools.reduce(operator.mul, factors),
    "FloorDiv": operator.floordiv,
    "Mod": operator.mod,
    "PythonMod": operator.mod,
    "Max": lambda *values: functools.reduce(torch.sym_max, values),
    "Min": lambda *values: functools.reduce(torch.sym_min, values),
}


def _encode_expr(expr: Any) -> Any:
    """A sympy integer expression as JSON (``{"sym": "s77"}``, ``{"Add": [...]}``, 3), or None if it has other parts."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return {"sym": str(expr)}
    name = type(expr).__name__
    if name == "Pow" and expr.args[1].is_Integer and int(expr.args[1]) >= 0:
        base = _encode_expr(expr.args[0])
        return None if base is None else {"Mul": [base] * int(expr.args[1])} if int(expr.args[1]) else 1
    if name not in _EXPR_FUNCTIONS:
        return None
    args = [_encode_expr(arg) for arg in expr.args]
    return None if any(arg is None for arg in args) else {name: args}


def _check_expr(expr: Any) -> Any:
    """A recorded expression as read from a program (shape checked; evaluation never imports anything)."""
    if expr is None or isinstance(expr, int):
        return expr
    if isinstance(expr, dict) and len(expr) == 1:
        ((tag, payload),) = expr.items()
        if tag == "sym" and isinstance(payload, str):
            return expr
        if tag in _EXPR_FUNCTIONS and isinstance(payload, list):
            return {tag: [_check_expr(arg) for arg in payload]}
    raise EngineFormatError(f"engine program has an unreadable size expression {expr!r}")


def _evaluate_expr(expr: Any, sizes: dict[str, Any]) -> Any:
    """A recorded expression's value, its symbols taken from ``sizes`` (KeyError for one not there)."""
    if isinstance(expr, int):
        return expr
    ((tag, payload),) = expr.items()
    if tag == "sym":
        return sizes[payload]
    return _EXPR_FUNCTIONS[tag](*(_evaluate_expr(arg, sizes) for arg in payload))


def _decode_spec(spec: Any) -> ValueSpec | None:
    if spec is None:
        return None
    if "scalar" in spec:
        return ValueSpec(_torch_attr(spec["scalar"], torch.dtype), (), scalar=True)
    dims = tuple(None if d is None else int(d) for d in spec["shape"])
    return ValueSpec(_torch_attr(spec["dtype"], torch.dtype), dims)


def describe_call(node: torch.fx.Node) -> EngineSignature | None:
    """The :class:`EngineSignature` of a ``trt_inline.execute_engine`` call, read from its program."""
    program = node.args[2] if len(node.args) > 2 else None
    if not isinstance(program, str):
        return None
    decoded = load_program(program)
    return EngineSignature(decoded.input_specs, decoded.output_specs)


# ---------------------------------------------------------------------------
# The op
# ---------------------------------------------------------------------------


def _execute_engine(inputs: list[torch.Tensor], engine: torch.Tensor, program: str) -> list[torch.Tensor]:
    """Run a reference engine: ``program`` over ``inputs`` with weights from ``engine``."""
    outputs = load_program(program).run(inputs, engine)
    # A custom op's outputs may not alias its inputs or each other: a block that
    # returns an input, a weight, or a view of one gets a copy.
    seen = {t.untyped_storage().data_ptr() for t in (*inputs, engine) if t.numel()}
    result = []
    for out in outputs:
        ptr = out.untyped_storage().data_ptr()
        if out.numel() and ptr in seen:
            out = out.clone()
            ptr = out.untyped_storage().data_ptr()
        seen.add(ptr)
        result.append(out)
    return result


def _execute_engine_fake(inputs: list[torch.Tensor], engine: torch.Tensor, program: str) -> list[torch.Tensor]:
    """Shapes from the program's own steps on fake inputs.

    A scalar input is read with ``item()`` (an unbacked symbol under export),
    never through ``.shape``. Where no output's shape depends on such a symbol
    (an ``arange`` reduced inside the engine), the symbol is discarded, since
    nothing outside could bind it; where one does, the steps run again with the
    symbols kept, so that export binds them to that output.
    """
    decoded = load_program(program)
    if not any(decoded.is_scalar_input(i) for i in range(decoded.num_inputs)):
        return [out.clone() for out in decoded.run(inputs, engine)]
    known = _free_symbols(inputs)
    with compat.discarding_fresh_unbacked_symbols(inputs):
        outputs = decoded.run(inputs, engine)
    if _free_symbols(outputs) - known:
        outputs = decoded.run(inputs, engine)
    return [out.clone() for out in outputs]


def _free_symbols(tensors: Sequence[torch.Tensor]) -> set[Any]:
    """The symbols in the tensors' sizes."""
    symbols: set[Any] = set()
    for tensor in tensors:
        for dim in tensor.shape:
            if isinstance(dim, torch.SymInt):
                symbols |= dim.node.expr.free_symbols
    return symbols


execute_engine = compat.define_op(
    "trt_inline::execute_engine",
    "(Tensor[] inputs, Tensor engine, str program) -> Tensor[]",
    _execute_engine,
    _execute_engine_fake,
)


# ---------------------------------------------------------------------------
# Building engines from accelerated blocks
# ---------------------------------------------------------------------------


def build_engine(block: torch.fx.GraphModule, name: str) -> ReferenceEngine:
    """Freeze an accelerated block (a ``_run_on_acc_N`` GraphModule) into an engine."""
    refs: dict[torch.fx.Node, int] = {}
    weights: list[torch.Tensor] = []
    weight_index: dict[str, int] = {}
    placeholders = [n for n in block.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        refs[node] = i

    for node in block.graph.nodes:
        if node.op != "get_attr":
            continue
        if node.target not in weight_index:
            value = resolve_attribute(block, str(node.target))[2]
            if not isinstance(value, torch.Tensor):
                raise EngineFormatError(
                    f"{name}: get_attr {node.name} reads a {type(value).__name__}, an engine can only hold tensors"
                )
            weight_index[str(node.target)] = len(weights)
            weights.append(value.detach())
        refs[node] = len(placeholders) + weight_index[str(node.target)]

    steps = []
    next_ref = len(placeholders) + len(weights)
    outputs: list[int] = []
    output_nodes: list[Any] = []
    for node in block.graph.nodes:
        if node.op == "call_function":
            target = encodable_target(node.target)
            if target is None:
                raise EngineFormatError(f"{name}: node {node.name} calls {node.target}, which an engine cannot hold")
            try:
                steps.append(
                    {
                        "target": target,
                        "args": _encode_arg(list(node.args), refs),
                        "kwargs": {k: _encode_arg(v, refs) for k, v in node.kwargs.items()},
                    }
                )
            except _Unencodable as exc:
                raise EngineFormatError(f"{name}: node {node.name} has an {exc}") from exc
            refs[node] = next_ref
            next_ref += 1
        elif node.op == "output":
            result = node.args[0]
            output_nodes = list(result) if isinstance(result, (tuple, list)) else [result]
            for value in output_nodes:
                if not isinstance(value, torch.fx.Node) or value not in refs:
                    raise EngineFormatError(f"{name}: output {value!r} is not a value of the block")
                outputs.append(refs[value])
        elif node.op not in ("placeholder", "get_attr"):
            raise EngineFormatError(f"{name}: node {node.name} ({node.op}) cannot be part of an engine")

    specs: list[dict[str, Any]] = []
    offsets: list[int] = []
    offset = 0
    for tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        offsets.append(offset)
        specs.append(
            {
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "shape": list(tensor.shape),
                "offset": offset,
                "nbytes": nbytes,
            }
        )
        offset += -(-nbytes // _ALIGN) * _ALIGN
    payload = torch.zeros(offset, dtype=torch.uint8)
    for start, tensor in zip(offsets, weights, strict=True):
        flat = tensor.to("cpu").contiguous().reshape(-1).view(torch.uint8)
        payload[start : start + flat.numel()] = flat

    program = json.dumps(
        {
            "format": FORMAT,
            "inputs": len(placeholders),
            "input_specs": [_encode_spec(node.meta.get("val")) for node in placeholders],
            "weights": specs,
            "steps": steps,
            "outputs": outputs,
            "output_specs": [_encode_spec(node.meta.get("val")) for node in output_nodes],
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    load_program(program)  # fail now, not at the first call, if something did not round-trip
    return ReferenceEngine(program, payload, num_outputs=len(outputs), name=name)


class ReferenceEngine(torch.nn.Module):
    """An accelerated block after compilation by the reference backend.

    ``forward`` takes the block's values positionally and returns one value, or a
    tuple when the block has several outputs. The engine op itself takes and
    returns tensors only, as TensorRT's does: a scalar argument (a Python number
    where the block was traced with a SymInt) is passed to it as a 0-d tensor on
    the device of the tensor inputs, and a scalar result comes out of it as a
    0-d tensor, which ``forward`` reads back with ``item()`` for its consumers,
    as the graph trt-inline saves does. (Torch-TensorRT 2.14's
    ``TorchTensorRTModule`` hands the 0-d tensor itself to a consumer traced
    against a scalar, which then rejects it.)
    """

    engine: torch.Tensor

    def __init__(self, program: str, payload: torch.Tensor, *, num_outputs: int, name: str) -> None:
        super().__init__()
        self.program = program
        self.num_outputs = num_outputs
        self.name = name
        # Non-persistent: the engine follows .to(device) but is not a user weight.
        self.register_buffer("engine", payload, persistent=False)

    def output_specs(self) -> tuple[ValueSpec | None, ...]:
        """dtype (and dims, or scalar-ness) of each output as the program records them; None where it does not."""
        return load_program(self.program).output_specs

    def forward(self, *inputs: Any) -> Any:
        tensors = [value for value in inputs if isinstance(value, torch.Tensor)]
        device = tensors[0].device if tensors else self.engine.device
        program = load_program(self.program)
        wired = [
            value if isinstance(value, torch.Tensor) else _as_tensor(value, program.input_specs[i], device)
            for i, value in enumerate(inputs)
        ]
        outputs = torch.ops.trt_inline.execute_engine.default(wired, self.engine, self.program)
        values = [
            out.item() if spec is not None and spec.scalar else out
            for out, spec in zip(outputs, program.output_specs, strict=True)
        ]
        if self.num_outputs == 1:
            return values[0]  # type: ignore[no-any-return]
        return tuple(values)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, outputs={self.num_outputs}, payload_bytes={self.engine.numel()}"
