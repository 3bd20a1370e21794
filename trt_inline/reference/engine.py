"""The reference engine: a CPU (and CUDA) stand-in for a TensorRT engine.

An accelerated block ``_run_on_acc_N`` of a partitioned graph is frozen into two
things, the way TensorRT freezes it into an engine:

* ``program``: a JSON string describing the block's ATen graph
  (:mod:`trt_inline.reference.program`);
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

Scalars cross the boundary as TensorRT's do: a scalar input (a SymInt,
SymFloat or SymBool of the block) arrives as a 0-d tensor; a scalar output
leaves as a 0-d tensor (int64, float64 or bool).

The op is defined once per process (:mod:`trt_inline.operators`): by trt-inline's
``torch.backends`` entry point at ``import torch`` (so that ``torch.export.load`` of
a saved file works without ``import trt_inline``), or by ``import trt_inline``
where the entry point did not run (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). Its
kernels call :func:`run_engine` and :func:`run_engine_traced` here, importing this
module on their first call. Its name and schema live in :mod:`trt_inline.switches`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from trt_inline import compat, engines
from trt_inline.engines import EngineSignature
from trt_inline.errors import EngineFormatError
from trt_inline.inlining import scalars
from trt_inline.inlining.attributes import resolve_attribute
from trt_inline.module_paths import node_origin
from trt_inline.reference.program import (
    ALIGN,
    FORMAT,
    Unencodable,
    as_tensor,
    encodable_target,
    encode_arg,
    encode_spec,
    load_program,
)

__all__ = ["ReferenceBackend", "ReferenceEngine", "block_outputs", "build_engine", "run_engine", "run_engine_traced"]


class ReferenceBackend(engines.EngineBackend):
    """:class:`ReferenceEngine`: its payload as a constant, its program as the op's string argument."""

    name = engines.REFERENCE_OP.backend
    module_types = (f"{__name__}.ReferenceEngine",)

    def emit(
        self,
        gm: torch.fx.GraphModule,
        call_node: torch.fx.Node,
        module: torch.nn.Module,
        inputs: list[Any],
        *,
        cross_compile_module: bool,
    ) -> torch.fx.Node:
        payload: torch.Tensor = getattr(module, "engine")  # noqa: B009 - an attribute of a module typed nn.Module
        program: str = getattr(module, "program")  # noqa: B009
        attr = engines.unique_attr_name(gm, f"{call_node.target}_engine")
        # A non-persistent buffer: export lifts it as a constant, not a user weight.
        gm.register_buffer(attr, payload, persistent=False)
        engine_node = gm.graph.get_attr(attr)
        engine_node.meta["val"] = engines.fake_constant(payload, call_node)
        return gm.graph.call_function(torch.ops.trt_inline.execute_engine.default, (inputs, engine_node, program))

    def output_specs(self, module: torch.nn.Module) -> list[tuple[torch.dtype, torch.device]] | None:
        payload: torch.Tensor = getattr(module, "engine")  # noqa: B009
        specs = load_program(getattr(module, "program")).output_specs  # noqa: B009
        if any(spec is None for spec in specs):
            return None
        return [(spec.dtype, payload.device) for spec in specs if spec is not None]

    def describe(self, call_node: torch.fx.Node) -> EngineSignature | None:
        """The :class:`EngineSignature` of a ``trt_inline.execute_engine`` call, read from its program."""
        program = call_node.args[2] if len(call_node.args) > 2 else None
        if not isinstance(program, str):
            return None
        decoded = load_program(program)
        return EngineSignature(decoded.input_specs, decoded.output_specs)


# ---------------------------------------------------------------------------
# The op
# ---------------------------------------------------------------------------


def run_engine(inputs: list[torch.Tensor], engine: torch.Tensor, program: str) -> list[torch.Tensor]:
    """The op's kernel: run a reference engine, ``program`` over ``inputs`` with weights from ``engine``."""
    outputs = load_program(program).run(inputs, engine)
    # A custom op's outputs may not alias its inputs or each other: a block that
    # returns an input, a weight, or a view of one gets a copy. Like TensorRT's,
    # every output is contiguous: compiled callers (AOTInductor) index outputs with
    # the strides the fake kernel gave, never with those of a view (an expand's 0).
    seen = {t.untyped_storage().data_ptr() for t in (*inputs, engine) if t.numel()}
    result = []
    for out in outputs:
        ptr = out.untyped_storage().data_ptr()
        if not out.is_contiguous() or (out.numel() and ptr in seen):
            out = out.clone(memory_format=torch.contiguous_format)
            ptr = out.untyped_storage().data_ptr()
        seen.add(ptr)
        result.append(out)
    return result


def run_engine_traced(inputs: list[torch.Tensor], engine: torch.Tensor, program: str) -> list[torch.Tensor]:
    """The op's fake kernel: shapes from the program's own steps on fake inputs.

    A scalar input is read with ``item()`` (an unbacked symbol under export),
    never through ``.shape``. Where no output's shape depends on such a symbol
    (an ``arange`` reduced inside the engine), the symbol is discarded, since
    nothing outside could bind it; where one does, the steps run again with the
    symbols kept, so that export binds them to that output.
    """
    decoded = load_program(program)
    if not any(decoded.is_scalar_input(i) for i in range(decoded.num_inputs)):
        return [_contiguous_copy(out) for out in decoded.run(inputs, engine)]
    known = _free_symbols(inputs)
    with compat.discarding_fresh_unbacked_symbols(inputs):
        outputs = decoded.run(inputs, engine)
    if _free_symbols(outputs) - known:
        outputs = decoded.run(inputs, engine)
    return [_contiguous_copy(out) for out in outputs]


def _contiguous_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous tensor like ``tensor``: what the op returns for each output (see :func:`run_engine`)."""
    return tensor.clone(memory_format=torch.contiguous_format)


def _free_symbols(tensors: Sequence[torch.Tensor]) -> set[Any]:
    """The symbols in the tensors' sizes."""
    symbols: set[Any] = set()
    for tensor in tensors:
        for dim in tensor.shape:
            if isinstance(dim, torch.SymInt):
                symbols |= dim.node.expr.free_symbols
    return symbols


# ---------------------------------------------------------------------------
# Building engines from accelerated blocks
# ---------------------------------------------------------------------------


def block_outputs(block: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The nodes an accelerated block returns, in order (each an engine output)."""
    output = next(n for n in reversed(block.graph.nodes) if n.op == "output")
    result = output.args[0]
    return list(result) if isinstance(result, (tuple, list)) else [result]


def build_engine(block: torch.fx.GraphModule, name: str, built_on: str = "") -> ReferenceEngine:
    """Freeze an accelerated block (a ``_run_on_acc_N`` GraphModule) into an engine; ``built_on``: which pipeline
    built it (one line, kept in the program: ``inspect`` says it)."""
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
                        "args": encode_arg(list(node.args), refs),
                        "kwargs": {k: encode_arg(v, refs) for k, v in node.kwargs.items()},
                    }
                )
            except Unencodable as exc:
                raise EngineFormatError(f"{name}: node {node.name} has an {exc}") from exc
            origin = node_origin(node)  # (what a report inside the engine names: its module path, source line)
            if origin.module or origin.source:
                steps[-1]["origin"] = [origin.module, origin.source]
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
        offset += -(-nbytes // ALIGN) * ALIGN
    payload = torch.zeros(offset, dtype=torch.uint8)
    for start, tensor in zip(offsets, weights, strict=True):
        flat = tensor.to("cpu").contiguous().reshape(-1).view(torch.uint8)
        payload[start : start + flat.numel()] = flat

    program = json.dumps(
        {
            "format": FORMAT,
            "inputs": len(placeholders),
            "input_specs": [encode_spec(node.meta.get("val")) for node in placeholders],
            "weights": specs,
            "steps": steps,
            "outputs": outputs,
            "output_specs": [encode_spec(node.meta.get("val")) for node in output_nodes],
            **({"built_on": built_on} if built_on else {}),
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

    def forward(self, *inputs: Any) -> Any:
        tensors = [value for value in inputs if isinstance(value, torch.Tensor)]
        device = tensors[0].device if tensors else self.engine.device
        program = load_program(self.program)
        wired = [
            value if isinstance(value, torch.Tensor) else as_tensor(value, program.input_specs[i], device)
            for i, value in enumerate(inputs)
        ]
        outputs = torch.ops.trt_inline.execute_engine.default(wired, self.engine, self.program)
        values = [
            scalars.to_scalar(out) if spec is not None and spec.scalar else out
            for out, spec in zip(outputs, program.output_specs, strict=True)
        ]
        if self.num_outputs == 1:
            return values[0]  # type: ignore[no-any-return]
        return tuple(values)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, outputs={self.num_outputs}, payload_bytes={self.engine.numel()}"


engines.register_backend(ReferenceBackend())
