"""Checks of the programs in a file: what torch's deserializer would evaluate, and what the loaded graph calls.

Before ``torch.export.load`` parses a serialized program,
:func:`check_serialized_programs` reads its JSON: every target must be an
allowed operator (:mod:`trt_inline.allowed_ops`; the deserializer resolves
targets by walking attributes of ``torch``), every size expression only
arithmetic on size symbols (it is evaluated with ``sympy.sympify``), every
guard only comparisons of input sizes (``exec``'d when the module is built),
every graph input name an identifier (FX writes it into generated code).
After loading, :func:`check_loaded_program` checks every node of every graph,
and every step of every reference engine, again.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram

from trt_inline import allowed_ops, engines
from trt_inline.errors import RefusedOperatorError, TrtInlineError, UnsafeArchiveError, first_line, printable

__all__ = ["check_expression", "check_guard", "check_loaded_program", "check_serialized_programs"]


# torch's deserializer turns size expressions (sympy's ``srepr`` form, ``Add(Symbol('s0',
# integer=True), Integer(-1))``, or infix ``s0 + 1``) into sympy with ``sympify``, which evaluates
# the string as Python; and it ``exec``s guards. Both must be expressions over these names only.
_SIZE_FUNCTIONS = frozenset(
    {
        "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Mod", "Max", "Min", "Abs",
        "GreaterThan", "LessThan", "StrictGreaterThan", "StrictLessThan", "Equality", "Unequality",
        "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "BooleanTrue", "BooleanFalse",
        "true", "false", "True", "False", "oo", "zoo", "nan", "Infinity", "NegativeInfinity",
        "floor", "ceiling", "sqrt", "Piecewise", "ExprCondPair",
        "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt",
        "CeilDiv", "LShift", "RShift", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
        "RoundToInt", "RoundDecimal", "ToFloat", "FloatPow", "PowByNatural", "IntTrueDiv", "FloatTrueDiv",
        "Identity", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or",
    }
)  # fmt: skip
_SYMBOL = re.compile(r"^[a-z]+\d+$")
_MAX_EXPRESSION = 4096
_EXPRESSION_NODES: tuple[type[ast.AST], ...] = (
    ast.Expression, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Call,
    ast.keyword, ast.Load, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.Tuple,
)  # fmt: skip
# Guards read input sizes: L['x'].size()[0], and call math and torch's symbolic functions.
# torch prints sympy Max/Min/Abs in guards as the builtins max, min and abs (pure functions of numbers).
_GUARD_NAMES = frozenset({"L", "math", "inf", "torch", "max", "min", "abs"}) | _SIZE_FUNCTIONS
_GUARD_ATTRIBUTES = frozenset(
    {
        "size",
        "stride",
        "storage_offset",
        "dim",
        "numel",
        "floor",
        "ceil",
        "trunc",
        "sqrt",
        "sym_float",
        "sym_int",
        "sym_max",
        "sym_min",
    }
)
_GUARD_NODES = (*_EXPRESSION_NODES, ast.Subscript, ast.Attribute, ast.Slice)


def check_expression(text: str) -> str | None:
    """Why a size expression is refused (it is more than arithmetic on size symbols), or None."""
    return _python_problem(text, "size expression", _EXPRESSION_NODES, _SIZE_FUNCTIONS, frozenset())


def check_guard(text: str) -> str | None:
    """Why a guard (Python torch will execute) is refused, or None: only comparisons of input sizes pass."""
    return _python_problem(text, "guard", _GUARD_NODES, _GUARD_NAMES, _GUARD_ATTRIBUTES)


def _python_problem(
    text: str,
    what: str,
    nodes: tuple[type[ast.AST], ...],
    names: frozenset[str],
    attributes: frozenset[str],
) -> str | None:
    """Why ``text``, about to be evaluated as Python by torch, is more than the expression it should be.

    Parsed, never evaluated: only the syntax in ``nodes``, names in ``names`` or
    shaped like size symbols (``s0``, ``u3``), attributes in ``attributes``,
    calls of plain names or those attributes, keywords without underscores
    (sympy's assumptions) and constants that are numbers, booleans or short
    identifier-like strings (a symbol's name, an input's key).
    """
    if len(text) > _MAX_EXPRESSION:
        return f"a {what} of {len(text)} characters"
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return f"a {what} that is not an expression: {printable(text[:40])!r}"
    for node in ast.walk(tree):
        if not isinstance(node, nodes):
            return f"a {what} containing {type(node).__name__}: {printable(text[:40])!r}"
        if isinstance(node, ast.Name) and node.id not in names and not _SYMBOL.match(node.id):
            return f"a {what} naming {printable(node.id)!r}"
        if isinstance(node, ast.Attribute) and node.attr not in attributes:
            return f"a {what} reading .{printable(node.attr)}"
        if isinstance(node, ast.Call) and not isinstance(node.func, (ast.Name, ast.Attribute)):
            return f"a {what} calling a computed function: {printable(text[:40])!r}"
        if isinstance(node, ast.keyword) and (node.arg is None or "_" in node.arg):
            return f"a {what} passing {printable(str(node.arg))!r}"
        if isinstance(node, ast.Constant) and not _plain_constant(node.value):
            return f"a {what} with the constant {printable(repr(node.value)[:40])}"
    return None


def _plain_constant(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= 256 and value.replace("_", "a").isalnum()
    return isinstance(value, (bool, int, float))


def check_serialized_programs(archive: zipfile.ZipFile, names: Iterable[str], file: Path | str) -> None:
    """Every operator a serialized program calls is allowed, every size expression is only arithmetic.

    Read from the JSON torch will deserialize, before it does: its deserializer
    resolves targets by walking attributes of ``torch`` and evaluates size
    expressions as Python. The loaded graph is checked again afterwards
    (:func:`check_loaded_program`). ``names`` are the program entries of the archive.
    """
    for name in names:
        try:
            document = json.loads(archive.read(name).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            # What this check cannot read it cannot vouch for: refused, not left to torch's reader.
            raise UnsafeArchiveError(
                f"{file}: {printable(name)}: refused: not a readable program ({first_line(exc)})"
            ) from None
        problem = _program_problem(document)
        if problem:
            raise RefusedOperatorError(f"{file}: {printable(name)}: {problem}")


def _program_problem(document: Any) -> str | None:
    """The first refused target or expression anywhere in a serialized program (walked without recursion)."""
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(value)
            continue
        if not isinstance(value, dict):
            continue
        target = value.get("target")
        if isinstance(target, str) and "inputs" in value and "outputs" in value:
            why = _target_problem(target)
            if why:
                node: Any = value.get("name") or next(iter(value["outputs"] or [{}]), {})
                return f"node {printable(str(_node_name(node)))} {why}"
        if isinstance(value.get("nodes"), list) and isinstance(value.get("inputs"), list):
            why = _graph_inputs_problem(value["inputs"])
            if why:
                return f"refused: {why}"
        for key, item in value.items():
            if key == "guards_code" and isinstance(item, list):
                for guard in item:
                    why = check_guard(str(guard))
                    if why:
                        return f"refused: {why}"
            if key == "expr_str" and isinstance(item, str):
                why = check_expression(item)
                if why:
                    return f"refused: {why}"
            if key == "range_constraints" and isinstance(item, dict):
                for symbol in item:
                    why = check_expression(str(symbol))
                    if why:
                        return f"refused: {why}"
            pending.append(item)
    return None


def _graph_inputs_problem(inputs: list[Any]) -> str | None:
    """A graph input whose name is not an identifier: FX writes placeholder names into the code it generates."""
    pending: list[Any] = list(inputs)
    while pending:
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                if key in ("name", "as_name") and isinstance(item, str):
                    if not item.isidentifier() or keyword.iskeyword(item):
                        return f"a graph input named {printable(item)!r}"
                else:
                    pending.append(item)
    return None


def _node_name(node: Any) -> str:
    """A serialized node's name: the name of its first output, where it has one."""
    if isinstance(node, str):
        return node
    if isinstance(node, dict):
        for value in node.values():
            if isinstance(value, dict) and isinstance(value.get("name"), str):
                return str(value["name"])
            if isinstance(value, dict) and isinstance(value.get("as_name"), str):
                return str(value["as_name"])
            if isinstance(value, str):
                return value
    return "?"


def _target_problem(target: str) -> str | None:
    qualified = allowed_ops.serialized_to_qualified(target)
    try:
        allowed_ops.resolve(qualified)
    except RefusedOperatorError as exc:
        return str(exc)
    return None


def check_loaded_program(program: ExportedProgram, file: Path | str) -> None:
    """Every node of every graph in a loaded program calls an allowed target; every reference engine's steps too.

    What runs is the loaded graph, so this is the check that counts; the one on
    the JSON (:func:`check_serialized_programs`) protects the deserializer.
    """
    position = 0
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op == "call_method":
                raise RefusedOperatorError(f"{file}: node {node.name} calls method {printable(str(node.target))!r}")
            if node.op != "call_function":
                continue
            try:
                allowed_ops.check_target(node.target)
                if engines.is_engine_call(node):
                    engines.engine_signature(node)  # decodes a reference program: refuses its steps' targets
            except RefusedOperatorError as exc:
                where = f"engine {position} ({node.name})" if engines.is_engine_call(node) else f"node {node.name}"
                raise RefusedOperatorError(f"{file}: {where} {exc}") from None
            except TrtInlineError:
                pass  # a malformed engine program: a structural problem, reported by the checks
            position += engines.is_engine_call(node)
