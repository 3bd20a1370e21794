"""The program a file holds, checked field by field, and the runnable module built from it.

torch's deserializer evaluates much of a serialized program as Python: size
expressions with ``sympy.sympify``, guards with ``exec``, and names and pytree
keys written unescaped into the code FX generates (a lone carriage return ends
a Python line). :func:`canonical_document` therefore reads the program document
against this torch's own schema (``torch._export.serde.schema``, through
:mod:`trt_inline.compat`) and returns a new document holding only what it
checked:

* every field known to the schema and of its type, unions with exactly one
  member, enums within their values; anything else refused;
* every name-like string (node, input, output and signature names,
  ``get_attr`` targets, buffer, parameter and constant names, module paths,
  pytree keys and type names) a dotted path of ``[A-Za-z0-9_]`` words;
* every target an allowed operator (:mod:`trt_inline.allowed_ops`), every size
  expression only arithmetic on size symbols, every guard only comparisons of
  input sizes; string arguments of operators kept as data (FX writes them with
  ``repr``);
* output specs that write to the caller's inputs, gradients, losses and effect
  tokens refused; buffer and parameter mutations only where ``aten::copy_`` is
  allowed (``module()`` writes them with it);
* metadata torch does not need to run (stack traces, module stacks) dropped: torch
  writes stack traces into the code FX generates. What reports name a node by (its
  module path and source line) is read from it as data by :func:`node_origins`,
  escaped and cut, and never handed to torch.

After loading, :func:`check_runnable` checks the module ``program.module()``
returns, which is what runs: every node of every graph in it, and every step of
every reference engine.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import enum
import inspect
import json
import math
import operator
import re
import types
import typing
from pathlib import Path
from typing import Any

import torch
import torch.fx

from trt_inline import allowed_ops, compat, engines
from trt_inline.errors import RefusedOperatorError, TrtInlineError, UnsafeArchiveError, printable
from trt_inline.module_paths import NodeOrigin, serialized_origin

__all__ = [
    "canonical_bytes", "canonical_document", "check_expression", "check_guard", "check_runnable", "node_origins",
]  # fmt: skip


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
    if any(character in text for character in "#;\\\n\r"):
        # (torch pastes guards into generated source: a comment or a line break would change the lines around)
        return f"a {what} with a comment, a line break or a statement separator: {printable(text[:40])!r}"
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
    try:
        _magnitude_bits(tree.body)
    except _TooLarge as refused:
        return f"a {what} {refused}: {printable(text[:40])!r}"
    except RecursionError:
        return f"a {what} nested too deeply: {printable(text[:40])!r}"
    return None


class _TooLarge(Exception):
    pass


# What an expression's values may grow to before it is evaluated (sympify evaluates constant arithmetic as it
# parses; a guard runs on every call): a size read counts 64 bits, a power needs a literal exponent, a shift a
# literal count, and no value met may exceed _MAX_BITS. Expressions torch writes stay far below.
_MAX_BITS = 65536
_POWERS = frozenset({"Pow", "PowByNatural", "FloatPow"})
_SHIFTS = frozenset({"LShift"})


def _magnitude_bits(node: ast.AST) -> int:
    """A bound on the bits of every value ``node`` (already checked for its syntax) may compute (_TooLarge)."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            return 1
        if isinstance(node.value, int):
            return max(node.value.bit_length(), 1)
        if isinstance(node.value, float):
            return 1024  # (a double's range)
        return max(4 * len(str(node.value)), 64)  # (a name, or digits Integer("...") reads: 4 bits each at most)
    if isinstance(node, ast.UnaryOp):
        return _magnitude_bits(node.operand)
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, (ast.Pow, ast.LShift)):
            return _grown(_magnitude_bits(node.left), node.right, isinstance(node.op, ast.Pow))
        if _is_text(node.left) or _is_text(node.right):
            raise _TooLarge("computing on a string")
        left, right = _magnitude_bits(node.left), _magnitude_bits(node.right)
        return _bounded(left + right if isinstance(node.op, ast.Mult) else max(left, right) + 1)
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
        if name in _POWERS or name in _SHIFTS:
            if len(node.args) != 2 or node.keywords:
                raise _TooLarge(f"calling {name} with other than two arguments")
            return _grown(_magnitude_bits(node.args[0]), node.args[1], name in _POWERS)
        if name in _NUMBERS:
            return _number_bits(node, name)
        bits = [_magnitude_bits(argument) for argument in arguments]
        if name == "Mul":
            return _bounded(sum(bits))
        return _bounded(max(bits, default=64) + len(bits))
    if isinstance(node, (ast.Compare, ast.BoolOp, ast.Tuple)):
        children = [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr)]
        return max((_magnitude_bits(child) for child in children), default=1)
    if isinstance(node, (ast.Subscript, ast.Attribute, ast.Name)):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                _magnitude_bits(child)
        return 64  # (a size, a stride, a symbol: int64)
    return 64


# sympy's number constructors: their arguments, and Float's precision, are what it computes with.
_NUMBERS = {"Integer": 1, "Rational": 2, "Float": 2}
_DIGITS = re.compile(r"^[0-9]{1,256}$")
_MAX_PRECISION = 1024  # (bits of a Float's mantissa: a double's 53 and far beyond, never millions)


def _number_bits(node: ast.Call, name: str) -> int:
    """A bound for ``Integer(n)``, ``Rational(p, q)``, ``Float(x[, precision])``: each number a literal (a string
    only of decimal digits: ``Float('1e2000000')`` would be built digit by digit), a Float's precision at most
    _MAX_PRECISION bits."""
    keywords = {keyword.arg: keyword.value for keyword in node.keywords}
    if not 1 <= len(node.args) <= _NUMBERS[name] or (keywords and (name != "Float" or set(keywords) != {"precision"})):
        raise _TooLarge(f"calling {name} with other than its number")
    values = list(node.args)
    if name == "Float" and (len(values) == 2 or keywords):
        precision = _literal(values.pop() if len(values) == 2 else keywords["precision"])
        if not isinstance(precision, int) or not 1 <= precision <= _MAX_PRECISION:
            raise _TooLarge(f"with a Float of a precision other than 1 to {_MAX_PRECISION} bits")
    bits = 0
    for value in values:
        text = value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
        if text is not None and not _DIGITS.match(text):
            raise _TooLarge(f"calling {name} on text other than decimal digits")
        bits += math.ceil(len(text) * math.log2(10)) if text is not None else _magnitude_bits(value)
    return _bounded(max(bits, 1))


def _grown(base: int, exponent: ast.AST, power: bool) -> int:
    """The bound of ``base ** exponent`` (or ``base << exponent``): the exponent a literal, the result bounded."""
    count = _literal(exponent)
    if count is None:
        raise _TooLarge("raising to a computed power" if power else "shifting by a computed count")
    return _bounded(base * max(math.ceil(abs(count)), 1) if power else base + math.ceil(abs(count)))


def _literal(node: ast.AST) -> int | float | None:
    """The number a literal exponent stands for: ``2``, ``-1``, ``0.5``, ``Integer(2)``; None for anything else."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _literal(node.operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id in ("Integer", "Float") and len(node.args) == 1:
            return _literal(node.args[0])
        if node.func.id == "Rational" and len(node.args) == 2:  # (sqrt is Pow(x, Rational(1, 2)))
            numerator, denominator = _literal(node.args[0]), _literal(node.args[1])
            return None if numerator is None or not denominator else numerator / denominator
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        value = node.value
        return value if isinstance(value, int) or math.isfinite(value) else None
    return None


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _bounded(bits: int) -> int:
    if bits > _MAX_BITS:
        raise _TooLarge(f"whose values may exceed {_MAX_BITS} bits")
    return bits


def _plain_constant(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= 256 and value.replace("_", "a").isalnum()
    return isinstance(value, (bool, int, float))


_NAME = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
_VERSION = re.compile(r"^[A-Za-z0-9.+_<=-]{0,64}$")
_MAX_NAME = 1024
_MAX_DEPTH = 256
# The only strings a float field may hold: how torch's serializer spells the values JSON cannot (serialize.py).
_FLOAT_SPELLINGS = frozenset({"NaN", "Infinity", "-Infinity"})

# How a string in a given (schema class, field) is checked; any other string is a name.
_TEXT_FIELDS = {
    ("Node", "target"): "operator",
    ("Argument", "as_operator"): "operator",
    ("Argument", "as_string"): "data",
    ("Argument", "as_strings"): "data",
    ("Argument", "as_string_to_argument"): "data",
    ("ConstantValue", "as_string"): "data",
    ("SymExpr", "expr_str"): "expression",
    ("ExportedProgram", "range_constraints"): "expression",
    ("ExportedProgram", "guards_code"): "guard",
    ("ExportedProgram", "torch_version"): "version",
    ("ModuleCallSignature", "in_spec"): "treespec",
    ("ModuleCallSignature", "out_spec"): "treespec",
    ("ModuleCallEntry", "fqn"): "path",
    ("CustomObjArgument", "class_fqn"): "path",
}
# Metadata torch does not need to run the program: dropped, never handed to it.
# A node name a report may quote.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
_DROPPED = frozenset({("Node", "metadata"), ("GraphModule", "metadata")})
# Output and input specs no file from a stranger may carry (and the buffer / parameter mutations
# that only an allowed aten::copy_ may carry).
_REFUSED_SPECS = {
    ("OutputSpec", "user_input_mutation"): "writes to the caller's input",
    ("OutputSpec", "gradient_to_parameter"): "is a gradient (a training program)",
    ("OutputSpec", "gradient_to_user_input"): "is a gradient (a training program)",
    ("OutputSpec", "loss_output"): "is a loss (a training program)",
    ("OutputSpec", "token"): "is an effect token (side effects ordered across calls)",
    ("InputSpec", "token"): "is an effect token (side effects ordered across calls)",
}
_MUTATION_SPECS = frozenset({("OutputSpec", "buffer_mutation"), ("OutputSpec", "parameter_mutation")})


class _Refused(Exception):
    def __init__(self, where: str, why: str, *, operator: bool = False) -> None:
        super().__init__(f"{where}: {why}")
        self.where, self.why, self.operator = where, why, operator


def canonical_document(
    document: Any, file: Path | str, entry: str, *, mutations: bool = False, schema_class: type | None = None
) -> dict[str, Any]:
    """The program document ``document`` (parsed JSON) rebuilt from what this torch's schema defines, checked.

    ``entry`` names the archive entry it came from in errors; ``schema_class``
    is what it holds (default the ``ExportedProgram``; a payload config also).
    ``mutations``: buffer and parameter mutation specs are allowed (``aten::copy_`` is).
    Raises :class:`RefusedOperatorError` for a refused target,
    :class:`UnsafeArchiveError` for anything else the schema does not allow.
    """
    walker = _Walker(compat.export_schema(), mutations)
    try:
        result = walker.value(document, schema_class or walker.schema.ExportedProgram, "", None, 0)
    except _Refused as refused:
        where = f"{file}: {printable(entry)}"
        if refused.operator:
            raise RefusedOperatorError(f"{where}: {refused.why}") from None
        raise UnsafeArchiveError(f"{where}: refused: {refused}") from None
    return typing.cast(dict[str, Any], result)


def node_origins(document: Any) -> dict[str, NodeOrigin]:
    """Each node's module path and source line, read as data from the (raw, parsed) program document's own
    graph once :func:`canonical_document` has accepted it: its ``metadata``, which that drops, never reaches
    torch. Nodes whose name is not a plain name, or whose metadata names nothing, are left out; anything not
    shaped as expected is skipped, never refused (it names nothing)."""
    graph = document.get("graph_module") if isinstance(document, dict) else None
    graph = graph.get("graph") if isinstance(graph, dict) else None
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    origins: dict[str, NodeOrigin] = {}
    for node in nodes if isinstance(nodes, list) else ():
        if not isinstance(node, dict):
            continue
        outputs = node.get("outputs")
        name = _node_name(outputs[:1] if isinstance(outputs, list) else [])  # (a node is named by its first output)
        origin = serialized_origin(node.get("metadata"))
        if _PLAIN_NAME.fullmatch(name) and (origin.module or origin.source):
            origins[name] = origin
    return origins


def canonical_bytes(document: dict[str, Any]) -> bytes:
    """The canonical document as the bytes handed to torch (deterministic: fields in schema order)."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")


class _Walker:
    def __init__(self, schema: Any, mutations: bool) -> None:
        self.schema = schema
        self.mutations = mutations
        self.union_base = compat.schema_union_base()
        self._hints: dict[type, dict[str, Any]] = {}

    def fields(self, cls: type) -> dict[str, Any]:
        if cls not in self._hints:
            hints = typing.get_type_hints(cls, include_extras=True)
            self._hints[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
        return self._hints[cls]

    def value(self, value: Any, annotation: Any, where: str, owner: tuple[str, str] | None, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise _Refused(where, "nested too deeply")
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            return self.value(value, typing.get_args(annotation)[0], where, owner, depth)
        if origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if value is None and len(members) < len(typing.get_args(annotation)):
                return None
            if len(members) != 1:
                raise _Refused(where, "a field of several types")
            return self.value(value, members[0], where, owner, depth)
        if origin in (list, typing.List):  # noqa: UP006 - torch 2.5's schema spells it so
            if not isinstance(value, list):
                raise _Refused(where, f"expected a list, found {type(value).__name__}")
            (item,) = typing.get_args(annotation)
            return [self.value(v, item, f"{where}[{i}]", owner, depth + 1) for i, v in enumerate(value)]
        if origin in (tuple, typing.Tuple) and not typing.get_args(annotation):  # noqa: UP006
            # torch 2.5's schema writes a None value as the empty tuple (``as_none: Tuple[()]``): JSON's [].
            if value != [] or not isinstance(value, list):
                raise _Refused(where, f"expected an empty list, found {type(value).__name__}")
            return []
        if origin in (dict, typing.Dict):  # noqa: UP006
            if not isinstance(value, dict):
                raise _Refused(where, f"expected an object, found {type(value).__name__}")
            _, item = typing.get_args(annotation)
            return {
                self.text(str(k), owner, f"{where}[{printable(str(k))[:40]!r}]"): self.value(
                    v, item, f"{where}[{printable(str(k))[:40]!r}]", owner, depth + 1
                )
                for k, v in value.items()
            }
        if annotation is str:
            if not isinstance(value, str):
                raise _Refused(where, f"expected a string, found {type(value).__name__}")
            return self.text(value, owner, where)
        if annotation is bool:
            if not isinstance(value, bool):
                raise _Refused(where, f"expected true or false, found {type(value).__name__}")
            return value
        if annotation is int:
            # torch 2.5 writes an unbounded range as an infinite float where its schema says int.
            if (not isinstance(value, int) or isinstance(value, bool)) and value not in (math.inf, -math.inf):
                raise _Refused(where, f"expected an integer, found {type(value).__name__}")
            return value
        if annotation is float:
            if isinstance(value, str) and value in _FLOAT_SPELLINGS:
                # JSON has no NaN or infinity: torch writes these three words and reads them back with float().
                return value
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise _Refused(where, f"expected a number, found {type(value).__name__}")
            return value
        if isinstance(annotation, type) and issubclass(annotation, enum.IntEnum):
            if not isinstance(value, int) or isinstance(value, bool) or value not in {m.value for m in annotation}:
                raise _Refused(where, f"{printable(repr(value))[:40]} is not a {annotation.__name__}")
            return value
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            return self.record(value, annotation, where, depth)
        raise _Refused(where, f"a field of a type trt-inline does not read ({annotation!r})")

    def record(self, value: Any, cls: type, where: str, depth: int) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _Refused(where or cls.__name__, f"expected a {cls.__name__} object, found {type(value).__name__}")
        fields = self.fields(cls)
        unknown = [k for k in value if k not in fields]
        if unknown:
            raise _Refused(where or cls.__name__, f"{cls.__name__} has no field {printable(str(unknown[0]))[:60]!r}")
        is_union = self.union_base is not None and issubclass(cls, self.union_base)
        if is_union:
            present = [k for k, v in value.items() if v is not None] or list(value)
            if len(value) != 1:
                raise _Refused(where or cls.__name__, f"a {cls.__name__} must hold exactly one of its members")
            self.spec(cls.__name__, present[0], value[present[0]], where)
        result: dict[str, Any] = {}
        for name, annotation in fields.items():
            path = f"{where}.{name}" if where else name
            if (cls.__name__, name) in _DROPPED:
                result[name] = {}
                continue
            if name not in value:
                if is_union:
                    continue
                default = next(f for f in dataclasses.fields(cls) if f.name == name)
                if default.default is dataclasses.MISSING and default.default_factory is dataclasses.MISSING:
                    raise _Refused(path, f"{cls.__name__} lacks its field {name!r}")
                continue
            if cls.__name__ == "Node" and name == "target":
                self.operator(value[name], value.get("name") or value.get("outputs"))
                result[name] = value[name]
                continue
            result[name] = self.value(value[name], annotation, path, (cls.__name__, name), depth + 1)
        return result

    def spec(self, kind: str, member: str, value: Any, where: str) -> None:
        why = _REFUSED_SPECS.get((kind, member))
        if why is None and (kind, member) in _MUTATION_SPECS and not self.mutations:
            why = (
                "writes to the program's state, with aten::copy_ (--allow-op aten::copy_ allows it for a trusted file)"
            )
        if why is not None:
            target = ""
            if isinstance(value, dict):
                named = next((v for k, v in value.items() if k.endswith("_name") and isinstance(v, str)), None)
                target = f" ({printable(named)[:80]!r})" if named else ""
            raise _Refused(where, f"a {member} {kind.lower().replace('spec', ' spec')}{target} {why}")

    def operator(self, target: Any, node: Any) -> None:
        if not isinstance(target, str):
            raise _Refused("a node", "a target that is not a string")
        why = _target_problem(target)
        if why:
            raise _Refused("", f"node {printable(_node_name(node))} {why}", operator=True)

    def text(self, text: str, owner: tuple[str, str] | None, where: str) -> str:
        kind = _TEXT_FIELDS.get(owner or ("", ""), "name")
        if kind == "data":
            return text
        if kind == "operator":
            why = _target_problem(text)
            if why:
                raise _Refused(where, why, operator=True)
            return text
        if kind == "expression":
            why = check_expression(text)
        elif kind == "guard":
            why = check_guard(text)
        elif kind == "version":
            why = None if _VERSION.match(text) else f"a version string {printable(text)[:40]!r}"
        elif kind == "treespec":
            return _canonical_treespec(text, where)
        elif kind == "path" and text == "":
            why = None
        else:
            why = _name_problem(text)
        if why:
            raise _Refused(where, why)
        return text


def _name_problem(text: str) -> str | None:
    if len(text) > _MAX_NAME or not _NAME.match(text):
        return f"a name that is not a dotted path of letters, digits and underscores: {printable(text)[:60]!r}"
    return None


def _canonical_treespec(text: str, where: str) -> str:
    """A pytree spec (JSON in a string) rebuilt from its checked parts: type names and keys become code."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        raise _Refused(where, "a pytree spec that is not JSON") from None
    if not (isinstance(parsed, list) and len(parsed) == 2 and isinstance(parsed[0], int)):
        raise _Refused(where, "a pytree spec without its version")
    return json.dumps([parsed[0], _treespec_node(parsed[1], where, 0)])


def _treespec_node(node: Any, where: str, depth: int) -> dict[str, Any]:
    if depth > 64 or not isinstance(node, dict) or set(node) != {"type", "context", "children_spec"}:
        raise _Refused(where, "a malformed pytree spec")
    kind, context, children = node["type"], node["context"], node["children_spec"]
    if kind is not None and (not isinstance(kind, str) or _name_problem(kind)):
        raise _Refused(where, f"a pytree type {printable(str(kind))[:60]!r}")
    if context is not None:
        if not isinstance(context, str):
            raise _Refused(where, "a pytree context that is not a string")
        try:
            keys = json.loads(context)
        except ValueError:
            raise _Refused(where, "a pytree context that is not JSON") from None
        items = keys if isinstance(keys, list) else [keys]
        for key in items:
            if key is None or (isinstance(key, int) and not isinstance(key, bool)):
                continue
            if not isinstance(key, str) or _name_problem(key):
                raise _Refused(where, f"a pytree key {printable(str(key))[:60]!r} that is not a name")
        context = json.dumps(keys)
    if not isinstance(children, list):
        raise _Refused(where, "a pytree spec whose children are not a list")
    return {"type": kind, "context": context, "children_spec": [_treespec_node(c, where, depth + 1) for c in children]}


def _node_name(node: Any) -> str:
    """A serialized node's name: its own, or the name of its first output."""
    if isinstance(node, str):
        return node
    pending = collections.deque(node if isinstance(node, list) else [node])  # (breadth first, linear)
    while pending:
        value = pending.popleft()
        if isinstance(value, dict):
            for key in ("name", "as_name"):
                if isinstance(value.get(key), str):
                    return str(value[key])
            pending.extend(v for v in value.values() if isinstance(v, (dict, list)))
        elif isinstance(value, list):
            pending.extend(value)
    return "?"


def _target_problem(target: str) -> str | None:
    try:
        # Each call is checked with its arguments where the module is built (check_runnable).
        allowed_ops.resolve(allowed_ops.serialized_to_qualified(target), per_call=True)
    except RefusedOperatorError as exc:
        return str(exc)
    return None


def output_reads(node: torch.fx.Node) -> list[int | None]:
    """The output index each use of ``node``'s result takes (None: the whole result); a ``getitem`` nothing uses
    reads nothing (unpacking every output of a call leaves one for each, used or not)."""
    return [_index_read(node, user) for user in node.users if user.users or _index_read(node, user) is None]


def _index_read(node: torch.fx.Node, user: torch.fx.Node) -> int | None:
    """The output index ``user`` takes of ``node``'s result (``getitem(node, i)``); None for any other use."""
    is_getitem = user.op == "call_function" and user.target is operator.getitem and len(user.args) == 2
    if is_getitem and user.args[0] is node and type(user.args[1]) is int and not user.kwargs:
        return int(user.args[1])
    return None


def _check_keyword_order(module: torch.nn.Module, file: Path | str) -> None:
    """The module's keyword parameters named as its input spec names its keyword inputs, in the same order.

    The generated ``forward`` pairs the spec's keys with the parameters after the positional ones by position
    (torch writes both from the same call, in the same order): a file that lists them in another order computes
    ``f(x, a=b, b=a)`` where the caller wrote ``f(x, a=a, b=b)``."""
    specs = compat.pytree_specs(module.graph) if isinstance(module, torch.fx.GraphModule) else None
    positional = None if specs is None else compat.positional_count(specs[0])
    keys = None if specs is None else compat.keyword_keys(specs[0])
    if positional is None or keys is None:
        return
    parameters = list(inspect.signature(module.forward).parameters)[positional:]
    if parameters != keys:
        said = ", ".join(printable(name)[:40] for name in parameters[:8])
        raise UnsafeArchiveError(
            f"{file}: the program's keyword inputs ({said}) are not the ones its input spec names, in its order "
            f"({', '.join(printable(key)[:40] for key in keys[:8])}): its generated code would pair them by position"
        )


def check_runnable(module: torch.nn.Module, file: Path | str) -> None:
    """Every node of every graph in the module ``program.module()`` returned calls an allowed target.

    What runs is this module (torch adds nodes to the program's graph when it
    builds it: input guards, copies into mutated buffers), so this is the check
    that counts; the one on the document protects the deserializer. Every
    reference engine's steps are checked too. A ``call_module`` may only call the
    input guards torch adds.
    """
    _check_keyword_order(module, file)
    position = 0
    guards = compat.guard_call_types()
    for submodule in module.modules():
        if not isinstance(submodule, torch.fx.GraphModule):
            continue
        for node in submodule.graph.nodes:
            if node.op == "call_method":
                raise RefusedOperatorError(f"{file}: node {node.name} calls method {printable(str(node.target))!r}")
            if node.op == "call_module":
                called = submodule.get_submodule(str(node.target))
                if not (guards and isinstance(called, guards)):
                    raise RefusedOperatorError(f"{file}: node {node.name} calls module {printable(str(node.target))!r}")
                continue
            if node.op != "call_function":
                continue
            try:
                allowed_ops.check_call(node.target, node.args, node.kwargs)
                allowed_ops.check_reads(node.target, output_reads(node))
                if engines.is_engine_call(node):
                    engines.engine_signature(node)  # decodes a reference program: refuses its steps' targets
            except RefusedOperatorError as exc:
                where = f"engine {position} ({node.name})" if engines.is_engine_call(node) else f"node {node.name}"
                raise RefusedOperatorError(f"{file}: {where} {exc}") from None
            except TrtInlineError:
                pass  # a malformed engine program: a structural problem, reported by the checks
            position += engines.is_engine_call(node)
