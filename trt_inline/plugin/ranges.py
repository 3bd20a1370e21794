"""Whether a saved program accepts every size its caller declared: read from the file's graph, not its weights.

``torch_tensorrt.save(..., dynamic_shapes=...)`` can write a program whose range
for an input size is narrower than the ``Dim`` declared for it (a minimum of 1
that became 2), which then rejects sizes the user asked for. The file's program
JSON (``models/model.json``) says, for each user input, what each size is (an
integer, a symbol, ``2 * half + 2``) and each symbol's range; that is compared
with the declared ``Dim`` ranges, and every size that lost part of its range is
named. Expressions are read with :mod:`ast` (sympy's ``srepr`` calls ``Symbol``,
``Integer``, ``Add``, ``Mul``, or the ``str()`` form torch before 2.8 writes:
names, integers, ``+``, ``-``, ``*``), never evaluated as Python.
"""

from __future__ import annotations

import ast
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["narrowed_ranges"]

# The program's JSON in a PT2 archive (torch 2.8+), and in the archives torch 2.5 ... 2.7 write.
_PROGRAM_ENTRIES = ("/models/model.json", "serialized_exported_program.json")


def narrowed_ranges(path: str | Path, dynamic_shapes: Any, arg_names: list[str] | None = None) -> list[str]:
    """``["x size 0: accepts 2 ... 8, declared 1 ... 8", ...]`` for the saved program at ``path``.

    ``dynamic_shapes`` as given to ``torch.export``: per positional input, a
    ``{dim: Dim}`` (or None), or those by input name. Sizes whose range cannot
    be read (another file layout, an expression of several symbols) are left out.
    """
    document = _program_document(Path(path))
    if document is None:
        return []
    graph = document.get("graph_module", {}).get("graph", {})
    specs = document.get("graph_module", {}).get("signature", {}).get("input_specs", [])
    names = [
        spec["user_input"]["arg"]["as_tensor"]["name"]
        for spec in specs
        if "user_input" in spec and "as_tensor" in spec["user_input"].get("arg", {})
    ]
    ranges = {str(k): (v.get("min_val"), v.get("max_val")) for k, v in document.get("range_constraints", {}).items()}
    problems = []
    for index, label, dim, declared in _declared(dynamic_shapes, arg_names):
        if index >= len(names):
            continue
        sizes = graph.get("tensor_values", {}).get(names[index], {}).get("sizes", [])
        if dim >= len(sizes):
            continue
        accepted = _bounds(sizes[dim], ranges)
        if accepted is None:
            continue
        low, high = accepted
        if low > declared[0] or high < declared[1]:
            problems.append(f"{label} size {dim}: accepts {low} ... {high}, declared {declared[0]} ... {declared[1]}")
    return problems


def _program_document(path: Path) -> dict[str, Any] | None:
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith(_PROGRAM_ENTRIES)), None)
            if name is None or archive.getinfo(name).file_size > 256 << 20:
                return None
            loaded = json.loads(archive.read(name))
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _declared(dynamic_shapes: Any, arg_names: list[str] | None) -> Iterator[tuple[int, str, int, tuple[int, int]]]:
    """(input index, input label, dim, (min, max)) for each declared ``Dim`` with both bounds known."""
    if isinstance(dynamic_shapes, dict):
        order = arg_names or list(dynamic_shapes)
        entries = [(order.index(name), name, shape) for name, shape in dynamic_shapes.items() if name in order]
    elif isinstance(dynamic_shapes, (list, tuple)):
        entries = [(index, f"input {index}", shape) for index, shape in enumerate(dynamic_shapes)]
    else:
        return
    for index, label, shape in entries:
        if not isinstance(shape, dict):
            continue
        for dim, spec in shape.items():
            low, high = getattr(spec, "min", None), getattr(spec, "max", None)
            if isinstance(dim, int) and isinstance(low, int) and isinstance(high, int):
                yield index, label, dim, (low, high)


def _bounds(size: dict[str, Any], ranges: dict[str, tuple[Any, Any]]) -> tuple[int, int] | None:
    """The range of one serialized size: an integer, or ``scale * symbol + offset`` over the symbol's range."""
    if "as_int" in size:
        return int(size["as_int"]), int(size["as_int"])
    text = size.get("as_expr", {}).get("expr_str")
    term = _linear_term(text) if isinstance(text, str) else None
    if term is None or term[0] not in ranges:
        return None
    symbol, scale, offset = term
    low, high = ranges[symbol]
    if not isinstance(low, int) or not isinstance(high, int):
        return None
    return scale * low + offset, scale * high + offset


def _linear_term(text: str) -> tuple[str, int, int] | None:
    """``(symbol, scale, offset)`` of a sympy ``srepr`` that is ``scale * symbol + offset``; None otherwise."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    return _term(tree)


def _term(node: ast.AST) -> tuple[str, int, int] | None:
    if isinstance(node, ast.Name):  # str() of an expression, as torch before 2.8 writes it: s0, 2*s1 + 2
        return node.id, 1, 0
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        return _binary_term(node)
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return None
    args = node.args
    if node.func.id == "Symbol" and args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        return args[0].value, 1, 0
    parts = [_integer(arg) if _integer(arg) is not None else _term(arg) for arg in args]
    if any(part is None for part in parts) or node.func.id not in ("Add", "Mul"):
        return None
    terms = [part for part in parts if isinstance(part, tuple)]
    numbers = [part for part in parts if isinstance(part, int)]
    if len(terms) != 1:
        return None
    symbol, scale, offset = terms[0]
    if node.func.id == "Add":
        return symbol, scale, offset + sum(numbers)
    factor = 1
    for number in numbers:
        factor *= number
    return (symbol, scale * factor, offset * factor) if factor > 0 else None


def _binary_term(node: ast.BinOp) -> tuple[str, int, int] | None:
    left, right = node.left, node.right
    number = _literal(right) if _literal(right) is not None else _literal(left)
    term = _term(left) if _literal(right) is not None else _term(right)
    if number is None or term is None:
        return None
    symbol, scale, offset = term
    if isinstance(node.op, ast.Mult):
        return (symbol, scale * number, offset * number) if number > 0 else None
    if isinstance(node.op, ast.Sub) and _literal(right) is None:
        return None  # number - term: decreasing in the symbol
    return symbol, scale, offset + (number if isinstance(node.op, ast.Add) else -number)


def _literal(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    return None


def _integer(node: ast.AST) -> int | None:
    is_integer_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Integer"
    if is_integer_call and node.args and isinstance(node.args[0], ast.Constant):  # type: ignore[attr-defined]
        value = node.args[0].value  # type: ignore[attr-defined]
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None
