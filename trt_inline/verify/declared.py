"""What a program's graph declares about each value against what its run returns.

Every node of a saved program carries its value's declared metadata
(``meta["val"]``: a fake tensor's rank, shape, dtype and device, or a symbolic
scalar). Re-export, AOTInductor packaging, ExecuTorch lowering and refit read
that account; the run computes the other. Nothing in the run compares the two,
so an engine whose declared output is ``float64[8, 4]`` and which returns
``float32[8, 4]`` runs and may even match its reference, and the next tool in
the chain fails or miscompiles::

    x ──► engine 0 ──► getitem ──► relu ──► OUTPUT
          declared float64[s0, 4] on cpu     (meta["val"], what a re-export reads)
          returned float32[8, 4] on cpu      (the run: s0 = 8 from x, the dtype differs)

:class:`DeclaredValues` sees each value a run computes, node by node, and
checks it against the node's declaration: a tensor or which kind of scalar;
rank; each size, symbols resolved against the sizes of the run (the first
value a symbol takes binds it, every later use must agree); dtype; device
(where the run moves the program, the device it was moved to also agrees).
:func:`output_spec_problems` checks the program's output specs against the
same declarations without running anything.
"""

from __future__ import annotations

import operator
from typing import Any

import sympy
import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind, TensorArgument
from torch.utils import _pytree as pytree

from trt_inline import compat, engines
from trt_inline.verify.report import describe_value

__all__ = ["DeclaredValues", "describe_declared", "output_spec_problems"]

# The disagreements one run reports, then a count: a systematic fault repeats at every node it reaches.
_MAX_REPORTED = 20

_SCALARS: tuple[tuple[type, type], ...] = ((torch.SymBool, bool), (torch.SymInt, int), (torch.SymFloat, float))


def describe_declared(value: Any) -> str:
    """``float32[s0, 4] on cpu``, ``int``, ``int 3``: a declared or returned value, as a disagreement names it
    (:func:`~trt_inline.verify.report.describe_value`, with a tensor's device and a Python scalar's value)."""
    text = describe_value(value)
    if isinstance(value, torch.Tensor):
        return f"{text} on {value.device}"
    if isinstance(value, (bool, int, float)):
        return f"{text} {value!r}"
    return text


def _kind(value: Any) -> type | None:
    """The Python scalar type a declared scalar is (``SymInt`` or ``int``: int), None for anything else."""
    for symbolic, concrete in _SCALARS:
        if isinstance(value, (symbolic, concrete)) and not (concrete is int and isinstance(value, bool)):
            return concrete
    return None


class DeclaredValues:
    """One run's values against their nodes' declarations: where they disagree.

    An engine's outputs are what its backend declares (trt-inline's engines, TensorRT's): a disagreement
    there is a problem (:meth:`summary`), named by engine (``engine 2 (_run_on_acc_5) out[0]``). Every other
    node is one of torch's own operators, whose declaration is torch's account of it (torch 2.5's program of
    ``nn.LSTM`` declares its final states with a dimension the run does not return): a disagreement there
    is a warning (:meth:`torch_warnings`), named by node (``node lstm out[1]``). An input only binds the
    symbols of its sizes: what the caller passes is the caller's, checked by the program's own guards.

    ``moved_to``: the device the run moved the program and its inputs to, if it did (a value declared on
    another device may then be there).
    """

    def __init__(self, module: torch.fx.GraphModule, moved_to: str | None = None) -> None:
        self.moved_to = None if moved_to is None else torch.device(moved_to)
        self.symbols: dict[sympy.Symbol, int] = {}
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.forged: list[str] = []  # (of the problems: those at torch's own operators)
        # The value being checked (its name, engine or not, node, declaration, value), for a size held till the end.
        self._current: tuple[str, bool, torch.fx.Node, Any, Any] | None = None
        self.input_devices: list[torch.device] = []  # where the program's inputs are declared
        self._pending: list[tuple[tuple[str, bool, torch.fx.Node, Any, Any], Any, int]] = []
        self.unreported = 0
        self.names: dict[torch.fx.Node, str] = {}
        engine_calls = [n for n in module.graph.nodes if engines.is_engine_call(n)]
        for index, call_node in enumerate(engine_calls):
            label = engines.engine_submodule_name(call_node)
            self.names[call_node] = f"engine {index}" + (f" ({label})" if label else "")
        # A getitem of a call that returns several values is checked at the call, which declares every one
        # (whether the getitem's own declaration agrees with it is a structural check: ``check_getitems``).
        self.skipped = {
            user
            for n in module.graph.nodes
            if n in self.names or isinstance(n.meta.get("val"), (list, tuple))
            for user in n.users
            if user.target is operator.getitem
        }

    def check(self, node: torch.fx.Node, value: Any) -> None:
        """Compare the value ``node`` computed in this run with its ``meta["val"]``."""
        if node.op not in ("placeholder", "call_function", "call_method", "call_module") or node in self.skipped:
            return
        declared = node.meta.get("val")
        if declared is None:
            return
        if node.op == "placeholder":
            if isinstance(declared, torch.Tensor):
                self.input_devices.append(declared.device)
            if isinstance(declared, torch.Tensor) and isinstance(value, torch.Tensor) and declared.dim() == value.dim():
                for size, actual in zip(declared.shape, value.shape, strict=True):
                    self._size_agrees(size, actual)  # (binds its symbols)
            return
        engine = node in self.names
        name = self.names.get(node, f"node {node.name}")
        if isinstance(declared, (list, tuple)):
            if not isinstance(value, (list, tuple)) or len(value) != len(declared):
                count = len(value) if isinstance(value, (list, tuple)) else "not a list"
                self._disagree(f"{name}: declared {len(declared)} outputs, returned {count}", engine, node)
                return
            for index, (one_declared, one_value) in enumerate(zip(declared, value, strict=True)):
                self._check_one(f"{name} out[{index}]", one_declared, one_value, engine, node)
            return
        self._check_one(f"{name} out[0]" if engine else name, declared, value, engine, node)

    def _check_one(self, name: str, declared: Any, value: Any, engine: bool, node: torch.fx.Node) -> None:
        if declared is None:
            return
        self._current = (name, engine, node, declared, value)
        both = f"{name}: declared {describe_declared(declared)}, returned {describe_declared(value)}"
        if isinstance(declared, torch.Tensor):
            if not isinstance(value, torch.Tensor) or self._tensor_differs(declared, value):
                self._disagree(both, engine, node)
            return
        kind = _kind(declared)
        if kind is None:
            return  # (a memory format, a device, a string: nothing a run computes)
        if isinstance(value, torch.Tensor) or _kind(value) is not kind:
            self._disagree(both, engine, node)
            return
        if kind is int and not self._size_agrees(declared, value):
            shown = self._resolved(declared)
            self._disagree(f"{name}: declared int {shown}, returned int {value!r}", engine, node)

    def _tensor_differs(self, declared: torch.Tensor, value: torch.Tensor) -> bool:
        if declared.dtype != value.dtype or declared.dim() != value.dim():
            return True
        if not self._same_device(declared.device, value.device):
            return True
        # Every size checked, binding the symbols first seen here (an unbacked size, an input's dimension).
        agree = [self._size_agrees(d, v) for d, v in zip(declared.shape, value.shape, strict=True)]
        return not all(agree)

    def _same_device(self, declared: torch.device, actual: torch.device) -> bool:
        if _same(declared, actual):
            return True
        # Moved: what was declared where the program's inputs were is now where they were moved, nothing else.
        moved_from = any(_same(declared, device) for device in self.input_devices)
        return self.moved_to is not None and moved_from and _same(self.moved_to, actual)

    def _size_agrees(self, declared: Any, actual: int) -> bool:
        """Whether a declared size (an int, or a SymInt's expression in the run's symbols) is ``actual``.

        A symbol takes the value the run first gives it, also inside a linear expression (``2*s0`` of 8 binds
        ``s0`` to 4); an expression in symbols not bound yet is held until the run ends (:meth:`_finish`).
        """
        if isinstance(declared, int):
            return declared == actual
        if not isinstance(declared, torch.SymInt):
            return True
        expr = declared.node.expr
        if _too_large(expr):
            return False  # (no size a run computes: refused rather than evaluated)
        known = {s: sympy.Integer(v) for s, v in self.symbols.items() if s in expr.free_symbols}
        rest = expr.xreplace(known) if known else expr
        unbound = sorted(rest.free_symbols, key=str)
        if not unbound:
            try:
                return int(rest) == actual
            except (TypeError, ValueError):
                return False  # (an expression that does not fold to an integer is no size)
        if len(unbound) == 1:
            symbol = unbound[0]
            slope, offset = rest.diff(symbol), rest.xreplace({symbol: sympy.Integer(0)})
            if slope.is_Integer and offset.is_Integer and slope != 0 and rest == slope * symbol + offset:
                value, remainder = divmod(int(actual) - int(offset), int(slope))
                if remainder:
                    return False
                self.symbols[symbol] = value
                return True
        if self._current is not None:
            self._pending.append((self._current, expr, int(actual)))
        return True

    def _finish(self) -> None:
        """The sizes held until the end, in every symbol the run bound: each must agree now."""
        pending, self._pending = self._pending, []
        for (name, engine, node, declared, value), expr, actual in pending:
            if expr.free_symbols <= self.symbols.keys():
                if self._size_agrees_now(expr, actual):
                    continue
                self._disagree(f"{name}: declared {describe_declared(declared)}, returned "
                               f"{describe_declared(value)}", engine, node)  # fmt: skip
            else:
                self._disagree(f"{name}: declared {describe_declared(declared)} in symbols no value of the run "
                               "binds", engine, node)  # fmt: skip

    def _size_agrees_now(self, expr: Any, actual: int) -> bool:
        try:
            return int(expr.xreplace({s: sympy.Integer(self.symbols[s]) for s in expr.free_symbols})) == actual
        except (TypeError, ValueError):
            return False

    def _resolved(self, declared: torch.SymInt) -> str:
        expr = declared.node.expr
        known = {s: sympy.Integer(v) for s, v in self.symbols.items() if s in expr.free_symbols}
        folded = expr.xreplace(known)
        return f"{expr} = {folded}" if known else str(expr)

    def _disagree(self, line: str, engine: bool, node: torch.fx.Node) -> None:
        if not engine and not _torch_declares(node):
            # A declaration torch's kernel would not write for its operator: the file's, a problem (also where
            # torch's own export wrote it: torch 2.5's nn.LSTM).
            engine = True
            line += " (not what torch declares for its operator on these inputs)"
            self.forged.append(f"declared and returned values disagree at {line}")
        if not engine:
            if len(self.warnings) < _MAX_REPORTED:
                self.warnings.append(
                    f"declared and returned values disagree at {line} (torch's own {_operator(node)}: what torch "
                    "declares for it; a re-export or package of the file reads that)"
                )
            return
        if len(self.problems) < _MAX_REPORTED:
            self.problems.append(f"declared and returned values disagree at {line}")
        else:
            self.unreported += 1

    def summary(self) -> list[str]:
        """The engines' disagreements, and how many more there were past the first :data:`_MAX_REPORTED`."""
        self._finish()
        more = [f"declared and returned values disagree at {self.unreported} more values"] if self.unreported else []
        return [*self.problems, *more]

    def torch_warnings(self) -> list[str]:
        """The disagreements at torch's own operators (at most :data:`_MAX_REPORTED`)."""
        self._finish()
        return list(self.warnings)


def _torch_declares(node: torch.fx.Node) -> bool:
    """Whether ``node``'s declaration is what torch derives for its operator from its inputs' declarations (its
    fake kernel, in the program's own fake mode): then a disagreement is torch's, not the file's."""
    declared = node.meta.get("val")
    fakes = [v for v in pytree.tree_leaves(declared) if isinstance(v, torch.Tensor)]
    fakes += [
        v for n in node.all_input_nodes for v in pytree.tree_leaves(n.meta.get("val")) if isinstance(v, torch.Tensor)
    ]
    mode = next((getattr(v, "fake_mode", None) for v in fakes if getattr(v, "fake_mode", None) is not None), None)
    if node.op != "call_function" or mode is None or not callable(node.target):
        return False
    try:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        with mode:
            derived = node.target(*args, **kwargs)
    except Exception:
        return False  # (nothing torch derives: the declaration is the file's alone)
    return _described(derived) == _described(declared)


def _described(value: Any) -> list[str]:
    return [describe_declared(leaf) for leaf in pytree.tree_leaves(value)]


def _operator(node: torch.fx.Node) -> str:
    """``aten.lstm.input``: the operator a node calls, as a disagreement names it."""
    if node.op != "call_function":
        return node.op
    return str(node.target) if isinstance(node.target, compat.OpOverload) else getattr(node.target, "__name__", "")


def _too_large(expr: Any) -> bool:
    """An expression no program declares for a size: a power past 64, or past 256 operations (evaluating one
    exactly could take the run's whole time and memory)."""
    if sympy.count_ops(expr) > 256:
        return True
    return any(p.exp.is_Number and abs(p.exp) > 64 for p in expr.atoms(sympy.Pow))


def _same(declared: torch.device, actual: torch.device) -> bool:
    """One device: ``cuda`` without an index is the current CUDA device."""
    if declared.type != actual.type:
        return False
    if declared.index is None or actual.index is None:
        current = torch.cuda.current_device() if declared.type == "cuda" and torch.cuda.is_initialized() else 0
        return (declared.index if declared.index is not None else current) == (
            actual.index if actual.index is not None else current
        )
    return declared.index == actual.index


def output_spec_problems(program: ExportedProgram) -> list[str]:
    """The program's user outputs whose output spec says another kind than the value its graph declares.

    A ``SymInt`` described as a tensor (or a tensor as a ``SymInt``) loads and may
    run; a re-export or a package compiled from it does not.
    """
    output_node = next(n for n in reversed(program.graph.nodes) if n.op == "output")
    returned = output_node.args[0]
    if not isinstance(returned, (list, tuple)):
        return []
    problems = []
    user_index = 0
    for spec, value in zip(program.graph_signature.output_specs, returned, strict=False):
        if spec.kind is not OutputKind.USER_OUTPUT:
            continue
        index, user_index = user_index, user_index + 1
        declared = value.meta.get("val") if isinstance(value, torch.fx.Node) else value
        if declared is None:
            continue
        spec_tensor = isinstance(spec.arg, TensorArgument)
        kind = type(spec.arg).__name__.removesuffix("Argument")
        if spec_tensor != isinstance(declared, torch.Tensor):
            where = f" ({value.name})" if isinstance(value, torch.fx.Node) else ""
            problems.append(
                f"output {index}{where}: its output spec says {kind}, its graph declares {describe_declared(declared)}"
            )
    return problems
