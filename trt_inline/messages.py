"""Typed messages between a parent and its child process: dataclasses sent as plain data and read back strictly.

A request (what a child job is sent) and a response (what it hands back) are
dataclasses. :func:`encode` turns one into plain data JSON can hold;
:func:`decode` reads plain data back into the dataclass, checking every field
against its annotation, and refuses anything else with :class:`MessageError`:

=========================  ==================================================================
annotation                 accepted
=========================  ==================================================================
``str``, ``bool``, None    exactly that (``True`` is no ``int``, ``1`` no ``bool``)
``int``                    an ``int``, never a ``bool``
``float``                  a ``float`` or an ``int`` (as Python's typing takes it), never a ``bool``
``X | Y``, ``Optional``    the first member that accepts the value
``Literal[...]``           one of its values, of the same type
``list[X]``                a list of ``X``
``tuple[X, ...]``          a list of ``X``, read as a tuple; ``tuple[X, Y]``: exactly two
``dict[str, X]``           an object of text keys and ``X`` values
a dataclass                an object holding every field that travels and nothing else
``Any``                    plain data (None, booleans, numbers, text, lists, objects), of
                           bounded depth
=========================  ==================================================================

Any other annotation (a path-like, a mapping, a tensor) cannot travel: its field
says how it does instead, in its ``metadata`` (:func:`wire`, :class:`Wire`): as
another type (``as_type``), or not at all (``stays``: left out of the message,
at its default on the other side). The bounds of a field are declared there too,
and hold at every level of its value: ``max_len`` (longer text refused),
``max_items`` (a list, tuple or object with more items refused), ``max_depth``
(plain data nested deeper refused), and for text from an untrusted child
``cut`` / ``key_cut`` (every string / key escaped with
:func:`~trt_inline.errors.printable` and cut to that length, as every reader of
a child's text does).

The same decoder reads what a trusted parent sent and what an untrusted child
handed back: a message that decodes is of its declared types and within its
bounds, whoever wrote it.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union

from trt_inline.errors import printable

__all__ = ["MAX_DEPTH", "MessageError", "Wire", "decode", "encode", "wire", "wire_of"]

# How deep plain data (``Any``) may nest where a field declares no max_depth.
MAX_DEPTH = 32
# The metadata key of a field's :class:`Wire`.
_KEY = "wire"

T = TypeVar("T")


class MessageError(ValueError):
    """A message that is not what its dataclass declares: its path (``tolerances.atol``) and what is wrong."""


@dataclass(frozen=True)
class Wire:
    """How a dataclass field travels: ``stays`` (never: left out, its default on the other side), ``as_type`` (the
    type it travels as, where its annotation cannot: ``str | None`` for a path-like), and its bounds (see the
    module's docstring)."""

    stays: bool = False
    as_type: Any = None
    max_len: int | None = None
    max_items: int | None = None
    max_depth: int | None = None
    cut: int | None = None
    key_cut: int | None = None


_PLAIN = Wire()


def wire(
    *,
    stays: bool = False,
    as_type: Any = None,
    max_len: int | None = None,
    max_items: int | None = None,
    max_depth: int | None = None,
    cut: int | None = None,
    key_cut: int | None = None,
) -> dict[str, Wire]:
    """A field's ``metadata`` saying how it travels: ``field(metadata=wire(cut=200))``."""
    return {_KEY: Wire(stays, as_type, max_len, max_items, max_depth, cut, key_cut)}


def wire_of(item: dataclasses.Field[Any]) -> Wire:
    """How ``item`` travels (:func:`wire`; a field that says nothing: as its annotation, unbounded)."""
    found = item.metadata.get(_KEY, _PLAIN)
    if not isinstance(found, Wire):
        raise TypeError(f"field {item.name}: its {_KEY!r} metadata is not a Wire")
    return found


# ----------------------------------------------------------------------------------------------------------------
# Encoding


def encode(value: Any) -> Any:
    """``value`` as plain data: a dataclass as an object of the fields that travel (a field that stays must hold its
    default), a tuple as a list, text, numbers, booleans, None, lists and objects of text keys as they are.

    It checks shapes, not types: :func:`decode` on the other side checks those (a sender that wants to know first
    decodes what it encoded). Raises :class:`MessageError` for anything plain data cannot hold.
    """
    return _encode(value, "")


def _encode(value: Any, path: str) -> Any:
    if value is None or type(value) in (bool, int, float, str):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        encoded = {}
        for item in dataclasses.fields(value):
            inner = getattr(value, item.name)
            if wire_of(item).stays:
                if inner is not item.default:
                    raise MessageError(f"{_at(path, item.name)}: a field that stays here holds other than its default")
                continue
            encoded[item.name] = _encode(inner, _at(path, item.name))
        return encoded
    if type(value) in (list, tuple):
        return [_encode(inner, f"{path}[{index}]") for index, inner in enumerate(value)]
    if type(value) is dict:
        if not all(type(key) is str for key in value):
            raise MessageError(f"{path or 'the message'}: an object whose keys are not all text")
        return {key: _encode(inner, _at(path, key)) for key, inner in value.items()}
    raise MessageError(f"{path or 'the message'}: a {type(value).__name__}, which plain data cannot hold")


# ----------------------------------------------------------------------------------------------------------------
# Decoding


def decode(cls: type[T], data: Any) -> T:
    """``data`` read as the dataclass ``cls``: every field present and of its type, within its bounds, no other key
    (see the module's docstring). Raises :class:`MessageError` naming the first field that is not."""
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"decode reads a dataclass, not {cls!r}")
    return typing.cast(T, _dataclass(cls, data, ""))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _dataclass(cls: type, value: Any, path: str) -> Any:
    if type(value) is not dict:
        raise MessageError(f"{path or cls.__name__}: {_kind(value)}, not an object ({cls.__name__})")
    hints = _hints(cls)
    travelling = {}
    for item in dataclasses.fields(cls):
        how = wire_of(item)
        if how.stays:
            if item.default is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{item.name} stays, so it needs a default (not a default factory)")
        elif item.init:
            travelling[item.name] = (how.as_type if how.as_type is not None else hints[item.name], how)
    unknown = [key for key in value if key not in travelling]
    if unknown:
        raise MessageError(f"{_at(path, _shown(unknown[0]))}: no such field of {cls.__name__}")
    missing = [name for name in travelling if name not in value]
    if missing:
        raise MessageError(f"{_at(path, missing[0])}: missing")
    return cls(**{name: _value(tp, value[name], _at(path, name), how, 0) for name, (tp, how) in travelling.items()})


def _value(tp: Any, value: Any, path: str, how: Wire, depth: int) -> Any:
    """``value`` read as ``tp``, ``how`` bounding it (``depth``: how deep in the field's value it is)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return _plain(value, path, how, depth)
    if tp is None or tp is type(None):
        if value is not None:
            raise MessageError(f"{path}: {_kind(value)}, not None")
        return None
    if tp in (bool, int, float):
        allowed = (int, float) if tp is float else (tp,)
        if type(value) not in allowed:
            raise MessageError(f"{path}: {_kind(value)}, not {'a number' if tp is float else _NAMES[tp]}")
        return value
    if tp is str:
        return _text(value, path, how, how.cut)
    if origin is Literal:
        if not any(type(value) is type(choice) and value == choice for choice in args):
            raise MessageError(f"{path}: not one of {', '.join(map(repr, args))}")
        return value
    if origin is Union or origin is types.UnionType:
        return _union(args, value, path, how, depth)
    if origin in (list, tuple, dict) and not args:
        raise TypeError(f"{path}: {tp!r} cannot travel: name its items' type ({tp!r}[...])")
    if origin is list or origin is tuple:
        items = _items(value, path, how)
        if origin is list:
            return [_value(args[0], inner, f"{path}[{i}]", how, depth + 1) for i, inner in enumerate(items)]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], inner, f"{path}[{i}]", how, depth + 1) for i, inner in enumerate(items))
        if len(items) != len(args):
            raise MessageError(f"{path}: {len(items)} items, not {len(args)}")
        pairs = enumerate(zip(args, items, strict=True))
        return tuple(_value(member, inner, f"{path}[{i}]", how, depth + 1) for i, (member, inner) in pairs)
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"{path}: an object's keys travel as text: dict[str, ...], not {tp!r}")
        if type(value) is not dict:
            raise MessageError(f"{path}: {_kind(value)}, not an object")
        _count(value, path, how)
        return {
            _text(key, path, how, how.key_cut): _value(args[1], inner, _at(path, _shown(key)), how, depth + 1)
            for key, inner in value.items()
        }
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp, value, path)
    raise TypeError(f"{path}: {tp!r} cannot travel (declare how it does: wire(as_type=...) or wire(stays=True))")


def _union(members: tuple[Any, ...], value: Any, path: str, how: Wire, depth: int) -> Any:
    if value is None and type(None) in members:
        return None
    others = [member for member in members if member is not type(None)]
    if len(others) == 1:
        return _value(others[0], value, path, how, depth)
    for member in others:
        try:
            return _value(member, value, path, how, depth)
        except MessageError:
            continue
    raise MessageError(f"{path}: {_kind(value)}, not {' or '.join(_named(member) for member in members)}")


def _text(value: Any, path: str, how: Wire, cut: int | None) -> str:
    if type(value) is not str:
        raise MessageError(f"{path}: {_kind(value)}, not text")
    if how.max_len is not None and len(value) > how.max_len:
        raise MessageError(f"{path}: text of {len(value)} characters, more than {how.max_len}")
    return value if cut is None else printable(value)[:cut]


def _items(value: Any, path: str, how: Wire) -> list[Any]:
    if type(value) is not list:
        raise MessageError(f"{path}: {_kind(value)}, not a list")
    _count(value, path, how)
    return value


def _count(value: list[Any] | dict[str, Any], path: str, how: Wire) -> None:
    if how.max_items is not None and len(value) > how.max_items:
        raise MessageError(f"{path}: {len(value)} items, more than {how.max_items}")


def _plain(value: Any, path: str, how: Wire, depth: int) -> Any:
    """Plain data: None, booleans, numbers, text (escaped and cut where the field says), lists and objects of it."""
    limit = MAX_DEPTH if how.max_depth is None else how.max_depth
    if depth > limit:
        raise MessageError(f"{path}: nested more than {limit} deep")
    if value is None or type(value) in (bool, int, float):
        return value
    if type(value) is str:
        return _text(value, path, how, how.cut)
    if type(value) is list:
        _count(value, path, how)
        return [_plain(inner, f"{path}[{i}]", how, depth + 1) for i, inner in enumerate(value)]
    if type(value) is dict:
        _count(value, path, how)
        return {
            _text(key, path, how, how.key_cut): _plain(inner, _at(path, _shown(key)), how, depth + 1)
            for key, inner in value.items()
        }
    raise MessageError(f"{path}: {_kind(value)}, not plain data")


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "text", type(None): "None"}


def _named(tp: Any) -> str:
    if tp in _NAMES:
        return _NAMES[tp]
    origin = typing.get_origin(tp)
    if origin is list or origin is tuple:
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "an object"
    return repr(tp)


def _kind(value: Any) -> str:
    """What a value is, in words (never the value itself: it may come from an untrusted child)."""
    if value is None:
        return "None"
    if type(value) is bool:
        return "true or false"
    if type(value) is dict:
        return "an object"
    return f"a {type(value).__name__}"


def _shown(key: Any) -> str:
    """A key as an error names it: escaped and cut (it may come from an untrusted child)."""
    return printable(str(key))[:60]


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
