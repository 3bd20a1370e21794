"""Integer size expressions (``rows - 1``, ``(rows + 1) // 2``) kept as data, and turned back into values or nodes.

Under dynamic shapes a scalar that crosses an engine boundary is an expression in
the input sizes. Where it turns into a fresh, unbacked symbol (``item()`` on the
engine's 0-d tensor, or on an engine's scalar input while tracing), the relation
is lost unless it is written down. This module writes it down as JSON, without
any sympy or torch-private type in it::

    s77 - 1        ->  {"Add": [-1, {"sym": "s77"}]}

and folds it back into a value (symbols taken from the sizes at hand) or into FX
nodes (symbols read with ``sym_size``).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

__all__ = ["build", "checked", "encode", "evaluate", "fold", "is_settled", "size_symbols", "size_terms"]

# The sympy functions an expression may be made of, by name, with the binary Python operation each folds with.
_OPERATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "Add": operator.add,
    "Mul": operator.mul,
    "FloorDiv": operator.floordiv,
    "Mod": operator.mod,
    "PythonMod": operator.mod,
    "Max": torch.sym_max,
    "Min": torch.sym_min,
}


def encode(expr: Any) -> Any:
    """A sympy integer expression as JSON (``{"sym": "s77"}``, ``{"Add": [...]}``, 3); None if it has other parts."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return {"sym": str(expr)}
    name = type(expr).__name__
    if name == "Pow" and expr.args[1].is_Integer and int(expr.args[1]) >= 1:
        base = encode(expr.args[0])
        return None if base is None else {"Mul": [base] * int(expr.args[1])}
    if name not in _OPERATIONS:
        return None
    args = [encode(arg) for arg in expr.args]
    return None if any(arg is None for arg in args) else {name: args}


# Bounds on an expression read from a file, checked before anything is evaluated: the expressions this module
# writes are a few terms over int64 sizes; a product of thousands of huge literals is not one of them.
_MAX_TERMS = 256
_MAX_DEPTH = 32
_MAX_BITS = 4096  # (a bound on the magnitude of every value met while folding: sizes count as 64 bits)


def checked(expr: Any) -> Any:
    """An expression read from a file, its shape checked (ValueError if it is not one this module writes, or is
    larger than one: more than 256 terms, nested deeper than 32, or a value that may exceed 4096 bits)."""
    terms = [0]
    _checked_bits(expr, 0, terms)
    return expr


def _checked_bits(expr: Any, depth: int, terms: list[int]) -> int:
    """A bound on the bits of the expression's value, its shape checked; ``terms[0]`` counts the terms seen."""
    terms[0] += 1
    if terms[0] > _MAX_TERMS or depth > _MAX_DEPTH:
        raise ValueError(f"a size expression of more than {_MAX_TERMS} terms or {_MAX_DEPTH} levels")
    if expr is None:
        return 0
    if isinstance(expr, int) and not isinstance(expr, bool):
        if not -(2**63) <= expr < 2**63:
            raise ValueError("a size expression with a constant past 64 bits")
        return 64
    if isinstance(expr, dict) and len(expr) == 1:
        ((tag, payload),) = expr.items()
        if tag == "sym" and isinstance(payload, str) and len(payload) <= 64:
            return 64
        if tag in _OPERATIONS and isinstance(payload, list) and payload:
            bits = [_checked_bits(arg, depth + 1, terms) for arg in payload]
            if any(arg is None for arg in payload):
                raise ValueError(f"a size expression with an empty {tag} term")
            total = sum(bits) if tag == "Mul" else max(bits) + len(bits)
            if total > _MAX_BITS:
                raise ValueError(f"a size expression whose value may exceed {_MAX_BITS} bits")
            return total
    raise ValueError(f"unreadable size expression {repr(expr)[:80]}")


def fold(expr: Any, symbol: Callable[[str], Any], operation: Callable[[str, Any, Any], Any]) -> Any:
    """Fold an expression: ``symbol(name)`` for each symbol, ``operation(tag, a, b)`` left to right for the rest."""
    if isinstance(expr, int):
        return expr
    ((tag, payload),) = expr.items()
    if tag == "sym":
        return symbol(payload)
    values = [fold(arg, symbol, operation) for arg in payload]
    return functools.reduce(lambda a, b: operation(tag, a, b), values)


def evaluate(expr: Any, sizes: dict[str, Any]) -> Any:
    """The expression's value, its symbols taken from ``sizes`` (KeyError for a symbol not there)."""
    return fold(expr, sizes.__getitem__, lambda tag, a, b: _OPERATIONS[tag](a, b))


def build(graph: torch.fx.Graph, expr: Any, size_node: Callable[[str], torch.fx.Node]) -> Any:
    """FX nodes computing the expression at the graph's insertion point: ``operator`` calls on ``size_node(name)``s.

    Each new node gets ``meta["val"]`` computed from its arguments' values.
    """

    def operation(tag: str, a: Any, b: Any) -> torch.fx.Node:
        node = graph.call_function(_OPERATIONS[tag], (a, b))
        node.meta["val"] = _OPERATIONS[tag](_value(a), _value(b))
        return node

    return fold(expr, size_node, operation)


def _value(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def size_symbols(value: Any) -> list[str | None]:
    """The symbol naming each size of a tensor value (None where the size is static or an expression)."""
    return [term[0] if term is not None and term[1:] == (1, 0) else None for term in size_terms(value)]


def size_terms(value: Any) -> list[tuple[str, int, int] | None]:
    """Per size of a tensor value, ``(symbol, scale, offset)`` where the size is ``scale * symbol + offset``.

    A plain symbol gives ``(s, 1, 0)``; a derived ``Dim`` (``2 * half``,
    ``seq + 1``) gives its symbol and both integers, so the symbol can be read
    back from the size as ``(size - offset) // scale``. None where the size is
    static or any other expression.
    """
    if not isinstance(value, torch.Tensor):
        return []
    terms: list[tuple[str, int, int] | None] = []
    for dim in value.shape:
        expr = dim.node.expr if isinstance(dim, torch.SymInt) else None
        if expr is None or len(expr.free_symbols) != 1:
            terms.append(None)
            continue
        (symbol,) = expr.free_symbols
        scale, offset = expr.coeff(symbol), expr.subs(symbol, 0)
        if not (scale.is_Integer and offset.is_Integer and int(scale) >= 1) or (expr - scale * symbol - offset) != 0:
            terms.append(None)
            continue
        terms.append((str(symbol), int(scale), int(offset)))
    return terms


def is_settled(condition: Any) -> bool:
    """Whether a condition's value is known to hold: ``True``, or a SymBool whose expression is the constant true."""
    if isinstance(condition, torch.SymBool):
        return bool(condition.node.expr == True)  # noqa: E712 - sympy's true compares equal to True
    return condition is True
