"""Partitioning for the reference backend.

The split is made by ``torch.fx.passes.splitter_base._SplitterBase``, the class
Torch-TensorRT's fast partitioner builds on, with the same settings that matter
for graph structure: accelerated blocks are named ``_run_on_acc_N``, the others
``_run_on_gpu_N``, blocks smaller than ``min_block_size`` fall back, and a
multi-output block is read in the parent through ``getitem`` nodes named
``getitem``, ``getitem_1``, ... by FX. That naming is what made the stock
exporter wire fallback inputs to the wrong tensor, so reproducing it exactly is
the point of this module.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.passes.operator_support import OperatorSupportBase

from trt_inline import compat
from trt_inline.distributed.manifest import is_collective
from trt_inline.engines import FALLBACK_PREFIX
from trt_inline.inlining import scalars
from trt_inline.inlining.module_state import buffers_restored
from trt_inline.reference.program import SCALAR_TARGETS, can_encode_args, encodable_target

__all__ = ["ReferenceOperatorSupport", "partition", "resolve_ops"]


def resolve_ops(ops: Iterable[Any]) -> tuple[frozenset[compat.OpOverload], frozenset[Any]]:
    """Split ``torch_executed_ops`` into OpOverloads and OpOverloadPackets.

    Accepts OpOverloads, packets (all overloads) and strings such as
    ``"torch.ops.aten.relu.default"``, ``"aten.relu.default"``, ``"aten::relu.default"``
    or ``"aten.relu"``.
    """
    overloads: set[compat.OpOverload] = set()
    packets: set[Any] = set()
    for op in ops:
        if isinstance(op, str):
            op = _op_from_string(op)
        if isinstance(op, compat.OpOverload):
            overloads.add(op)
        elif isinstance(op, compat.OpOverloadPacket):
            packets.add(op)
        else:
            raise ValueError(
                f"torch_executed_ops entry {op!r} is not an operator: give an OpOverload "
                "such as torch.ops.aten.relu.default or its name as a string"
            )
    return frozenset(overloads), frozenset(packets)


def _op_from_string(name: str) -> Any:
    text = name.strip().removeprefix("torch.ops.").replace("::", ".")
    parts = text.split(".")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"torch_executed_ops entry {name!r} is not an operator name like 'aten.relu.default'")
    obj: Any = torch.ops
    try:
        for part in parts:
            obj = getattr(obj, part)
    except (AttributeError, RuntimeError) as exc:
        raise ValueError(f"torch_executed_ops entry {name!r} names no registered operator") from exc
    return obj


# Scalar-producing ATen ops Torch-TensorRT converts (2.5 ... 2.14 have a converter for sym_size.int).
_SCALAR_OPS = frozenset({torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default})


def _is_tensor_value(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _is_tensor_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, torch.Tensor) for v in value)


class ReferenceOperatorSupport(OperatorSupportBase):  # type: ignore[misc]
    """Decides which nodes the reference backend places in an engine.

    As Torch-TensorRT's partitioner does (every release from 2.5 has converters
    for ``aten.sym_size.int`` and SymInt arithmetic, and treats a SymInt engine
    input as a shape tensor), a node is accelerated when it calls an ATen
    OpOverload or converted scalar arithmetic (``operator.sub`` on SymInts, ...)
    that is not in ``torch_executed_ops``, produces tensors or scalars, and has
    arguments a program can store. So scalars can cross engine boundaries in both
    directions. Data-dependent scalars (``item``), assertions, ``call_module``
    such as ``_guards_fn`` and higher-order ops run in PyTorch.

    ``scalar_boundaries=False`` keeps every scalar-producing node in PyTorch, so
    that engine boundaries carry tensors only. No Torch-TensorRT release
    partitions that way; it isolates scalar-boundary handling when debugging.
    """

    def __init__(
        self,
        torch_executed_ops: Collection[Any] = (),
        *,
        scalar_boundaries: bool = True,
        collectives_in_engines: bool = False,
    ) -> None:
        super().__init__()
        self._overloads, self._packets = resolve_ops(torch_executed_ops)
        self._scalar_boundaries = scalar_boundaries
        self._collectives_in_engines = collectives_in_engines

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node) -> bool:
        if node.op != "call_function" or encodable_target(node.target) is None:
            return False
        target = node.target
        if is_collective(target) and not self._collectives_in_engines:
            return False
        if isinstance(target, compat.OpOverload):
            if target in self._overloads or target.overloadpacket in self._packets:
                return False
        value = node.meta.get("val")
        if scalars.is_scalar(value):
            if not (self._scalar_boundaries and (target in _SCALAR_OPS or target in SCALAR_TARGETS)):
                return False
        elif target in SCALAR_TARGETS or not (_is_tensor_value(value) or _is_tensor_sequence(value)):
            return False
        for arg in node.all_input_nodes:
            arg_value = arg.meta.get("val")
            if arg.op == "get_attr" or _is_tensor_value(arg_value):
                continue
            if scalars.is_scalar(arg_value) and self._scalar_boundaries:
                continue
            # getitem unpacks a multi-output op; it follows its producer.
            if not (_is_tensor_sequence(arg_value) and self.is_node_supported(submodules, arg)):
                return False
        return can_encode_args(node)


_SplitterBase = compat.splitter_base()


class ReferencePartitioner(_SplitterBase):  # type: ignore[misc,valid-type]
    """``_SplitterBase`` configured as Torch-TensorRT's fast partitioner is.

    Built through the base constructor (:func:`trt_inline.compat.init_splitter`),
    which also records shapes by running the module once on ``sample_input``.
    """

    def __init__(
        self,
        module: torch.fx.GraphModule,
        sample_input: Sequence[Any],
        operator_support: OperatorSupportBase,
        min_block_size: int,
    ) -> None:
        # Fusion would pull a scalar producer into the block of its consumer; with it off, a
        # scalar goes into an engine whenever its op converts, so boundaries carry scalars
        # both ways, as Torch-TensorRT's engines take and return them (see ReferenceOperatorSupport).
        compat.init_splitter(
            self,
            module,
            sample_input,
            operator_support,
            compat.splitter_settings(min_block_size, skip_fusion=True),
            non_acc_submodule_name=FALLBACK_PREFIX,
        )
        self.min_block_size = min_block_size

    def starter_nodes(self) -> tuple[set[torch.fx.Node], set[torch.fx.Node]]:
        """The splitter's first nodes, and a call that reads no node (``arange(3)``) among them: torch 2.5's
        splitter starts from the users of inputs and weights only, so such a call was never reached, and a block
        reading it could never start ("Subgraph can't be empty"); later torches start from it too."""
        cpu_nodes, acc_nodes = super().starter_nodes()
        for node in self.module.graph.nodes:
            if node.op == "call_function" and not node.all_input_nodes:
                (acc_nodes if node in self.acc_nodes else cpu_nodes).add(node)
        return cpu_nodes, acc_nodes

    def remove_small_acc_subgraphs(self, subgraphs: list[Any]) -> list[Any]:
        """Fold accelerated blocks below ``min_block_size`` into the fallback before them."""
        result: list[Any] = []
        for subgraph in subgraphs:
            if subgraph.is_acc and len(subgraph.nodes) < self.min_block_size:
                subgraph.is_acc = False
            if result and not result[-1].is_acc and not subgraph.is_acc:
                result[-1].nodes.extend(subgraph.nodes)
            else:
                result.append(subgraph)
        return result

    def partition(self) -> torch.fx.GraphModule:
        subgraphs = self.remove_small_acc_subgraphs(defer_weight_nodes(self.put_nodes_into_subgraphs()))
        self.tag(subgraphs)
        return self.split(remove_tag=True)  # type: ignore[no-any-return]


def defer_weight_nodes(subgraphs: list[Any]) -> list[Any]:
    """Move nodes computed from weights alone into the accelerated block that uses them.

    The splitter places a node as soon as its inputs are ready, so every
    ``permute`` of a weight lands in the first accelerated block, which then
    returns the permuted weights for the later blocks: each call would copy
    every weight across an engine boundary. Torch-TensorRT folds such nodes
    into constants before partitioning; moving them to their users' block gives
    the same boundaries without a second copy of the weights::

        before: acc_1(x, w1, w2) -> (addmm(x, t(w1)), t(w2)) ; gpu_2 ; acc_3(h, t2) -> addmm(h, t2)
        after:  acc_1(x, w1) -> addmm(x, t(w1))              ; gpu_2 ; acc_3(h, w2) -> addmm(h, t(w2))

    A node moves when every input is a ``get_attr`` or a node that moves, and
    every user sits in one other accelerated block. Blocks left empty are
    dropped (fallback blocks that then meet are merged by
    :meth:`ReferencePartitioner.remove_small_acc_subgraphs`, which runs next).
    """
    block_of = {node: index for index, subgraph in enumerate(subgraphs) for node in subgraph.nodes}
    moved: dict[torch.fx.Node, int] = {}
    for index in reversed(range(len(subgraphs))):
        if not subgraphs[index].is_acc:
            continue
        for node in reversed(subgraphs[index].nodes):
            if not _from_weights(node):
                continue
            users = {block_of.get(user) for user in node.users}
            if len(users) != 1:
                continue
            (target,) = users
            if target is None or target == index or not subgraphs[target].is_acc:
                continue
            moved[node] = target
            block_of[node] = target
    if not moved:
        return subgraphs
    for subgraph in subgraphs:
        subgraph.nodes = [node for node in subgraph.nodes if node not in moved]
    for node, target in moved.items():
        subgraphs[target].nodes.append(node)
    return [subgraph for subgraph in subgraphs if subgraph.nodes]


def _from_weights(node: torch.fx.Node) -> bool:
    """Whether ``node`` is computed from ``get_attr`` nodes alone."""
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        if current in seen or current.op == "get_attr":
            continue
        seen.add(current)
        if current.op != "call_function":
            return False
        pending.extend(current.all_input_nodes)
    return True


def partition(
    gm: torch.fx.GraphModule,
    sample_input: Sequence[Any],
    *,
    torch_executed_ops: Collection[Any] = (),
    min_block_size: int = 1,
    scalar_boundaries: bool = True,
    collectives_in_engines: bool = False,
) -> torch.fx.GraphModule:
    """Split ``gm`` into ``_run_on_acc_N`` and ``_run_on_gpu_N`` submodules.

    ``sample_input`` are ``gm``'s flat inputs (the splitter runs the module once on them, and the buffers that run
    writes, which are the model's own, are put back).
    """
    if min_block_size < 1:
        raise ValueError(f"min_block_size must be at least 1, got {min_block_size}")
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    support = ReferenceOperatorSupport(
        torch_executed_ops, scalar_boundaries=scalar_boundaries, collectives_in_engines=collectives_in_engines
    )
    with buffers_restored(gm):
        return ReferencePartitioner(gm, sample_input, support, min_block_size).partition()
