"""The wire codec of messages between a parent and its child: dataclasses sent as plain data, read back strictly.

A request (what a child job is sent) and a response (what it hands back) are
dataclasses. :func:`encode` turns one into plain data JSON can hold;
:func:`decode` reads plain data back into the dataclass, checking every field
against its annotation, and refuses anything else with :class:`MessageError`:

=========================  ==================================================================
annotation                 accepted
=========================  ==================================================================
``str``, ``bool``, None    exactly that (``True`` is no ``int``, ``1`` no ``bool``)
``int``                    an ``int`` of at most 64 bits, never a ``bool``
``float``                  a ``float`` or an ``int`` of at most 64 bits (as Python's typing takes
                           it), never a ``bool``
``X | Y``, ``Optional``    the first member that accepts the value
``Literal[...]``           one of its values, of the same type
``list[X]``                a list of ``X``
``tuple[X, ...]``          a list of ``X``, read as a tuple; ``tuple[X, Y]``: exactly two
``dict[str, X]``           an object of text keys and ``X`` values
a dataclass                an object holding every field that travels and nothing else (and the
                           properties it names in ``__wire_derived__``, checked and dropped)
a ``TypedDict``            an object holding its required keys, any of its other keys, nothing
                           else; read as a ``dict``
``Annotated[X, Wire()]``   ``X`` within that :class:`Wire`'s bounds (at this level and below)
``Any``                    plain data (None, booleans, numbers, text, lists, objects), of
                           bounded depth
=========================  ==================================================================

Any other annotation (a path-like, a mapping, a tensor) cannot travel: its field
says how it does instead, in its ``metadata`` (:func:`wire`, :class:`Wire`): as
another type (``as_type``), or not at all (``stays``: left out of the message,
at its default on the other side). The bounds of a field are declared there too,
and hold at every level of its value (an ``Annotated`` level declares its own):
``max_len`` (longer text refused), ``max_items`` (a list, tuple or object with
more items refused), ``max_depth`` (plain data nested deeper refused),
``at_least`` / ``at_most`` (a number outside refused; NaN is outside every
range), and for text from an untrusted child ``cut`` / ``key_cut`` (every
string / key escaped with :func:`~trt_inline.errors.printable` and cut to that
length). A field declared ``unread`` is handed on as it came (and encoded as it
is) for the reader that owns it: a job's response inside the envelope every
child answers with, read by the job's own declared reader.

Bounds that span a whole message are :class:`Bounds`, given to :func:`decode`:
every item of every list and object together, the instances of a dataclass
wherever they sit (a report's comparisons), every string without a cut of its
own escaped and cut as a document's text is (:func:`~trt_inline.errors.decoded_text`),
and whether a field missing from the message takes its default.

The same decoder reads what a trusted parent sent and what an untrusted child
handed back: a message that decodes is of its declared types and within its
bounds, whoever wrote it. Each annotation's reader is built once per type and
bounds, so that a message of a hundred thousand objects is read at the cost of
its values, not of its annotations.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union

from trt_inline.errors import MessageError, decoded_text, printable

__all__ = ["MAX_DEPTH", "Bounds", "MessageError", "Wire", "decode", "encode", "wire", "wire_of"]

# How deep plain data (``Any``) may nest where a field declares no max_depth.
MAX_DEPTH = 32
# The metadata key of a field's :class:`Wire`.
_KEY = "wire"
# An integer as the other side's readers take one (torch, numpy, C): 64 bits, signed.
_INT_RANGE = range(-(1 << 63), 1 << 63)

T = TypeVar("T")


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
    at_least: float | None = None
    at_most: float | None = None
    unread: bool = False


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
    at_least: float | None = None,
    at_most: float | None = None,
    unread: bool = False,
) -> dict[str, Wire]:
    """A field's ``metadata`` saying how it travels: ``field(metadata=wire(cut=200))``."""
    return {_KEY: Wire(stays, as_type, max_len, max_items, max_depth, cut, key_cut, at_least, at_most, unread)}


def wire_of(item: dataclasses.Field[Any]) -> Wire:
    """How ``item`` travels (:func:`wire`; a field that says nothing: as its annotation, unbounded)."""
    found = item.metadata.get(_KEY, _PLAIN)
    if not isinstance(found, Wire):
        raise TypeError(f"field {item.name}: its {_KEY!r} metadata is not a Wire")
    return found


@dataclass(frozen=True)
class Bounds:
    """Bounds on a whole message (:func:`decode`): ``items``, every item of every list and object in it together;
    ``counted``, ``(dataclass, at most, what they are called)`` for the instances of a dataclass wherever they sit;
    ``text``, every string without a ``cut`` of its own escaped and cut to that length, saying how much was cut
    (:func:`~trt_inline.errors.decoded_text`); ``defaults``, whether a field missing takes its default."""

    items: int | None = None
    counted: tuple[tuple[type, int, str], ...] = ()
    text: int | None = None
    defaults: bool = False


_UNBOUNDED = Bounds()


# ----------------------------------------------------------------------------------------------------------------
# Encoding


def encode(value: Any) -> Any:
    """``value`` as plain data: a dataclass as an object of the fields that travel (a field that stays must hold its
    default) and the properties it names in ``__wire_derived__``, a tuple as a list, text, numbers, booleans, None,
    lists and objects of text keys as they are.

    It checks shapes, not types: :func:`decode` on the other side checks those (a sender that wants to know first
    decodes what it encoded). A field declared a scalar (``str``, ``float | None``) or ``unread`` is copied as it is,
    its declaration trusted; anything else plain data cannot hold raises :class:`MessageError`.
    """
    try:
        return _encode(value)
    except _Fault as fault:
        raise MessageError(f"{_path(fault) or 'the message'}: {fault.what}") from None


@dataclass(frozen=True)
class _Encoding:
    """How a dataclass is encoded: its fields that travel, which of them are declared scalars (copied as they are),
    the fields that stay (with their defaults), and the properties it writes besides."""

    travelling: tuple[str, ...]
    others: tuple[str, ...]  # (travelling fields not declared a scalar: encoded one by one)
    staying: tuple[tuple[str, Any], ...]
    derived: tuple[str, ...]
    copied: bool  # (all of its instance's attributes are its travelling fields: copied at once, then the others)


@functools.cache
def _encoding(cls: type) -> _Encoding:
    hints = _hints(cls)
    fields = dataclasses.fields(cls)
    by_name = {item.name: item for item in fields}
    travelling = tuple(item.name for item in fields if not wire_of(item).stays)
    others = tuple(name for name in travelling if not (_scalar(hints[name]) or wire_of(by_name[name]).unread))
    staying = tuple((item.name, item.default) for item in fields if wire_of(item).stays)
    copied = not staying and not hasattr(cls, "__slots__") and len(fields) == len(travelling)
    return _Encoding(travelling, others, staying, tuple(getattr(cls, "__wire_derived__", ())), copied)


_SCALARS = frozenset((type(None), bool, int, float, str))


def _scalar(tp: Any) -> bool:
    """Whether values annotated ``tp`` are scalars: ``str``, ``float | None``, ``Literal["a", "b"]``."""
    if tp in _SCALARS or tp is None:
        return True
    origin = typing.get_origin(tp)
    if origin is Literal:
        return all(type(choice) in _SCALARS for choice in typing.get_args(tp))
    return (origin is Union or origin is types.UnionType) and all(map(_scalar, typing.get_args(tp)))


def _encode(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    how = _ENCODINGS.get(kind)
    if how is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        how = _ENCODINGS[kind] = _encoding(typing.cast(type, kind))
    if how is not None:
        for name, default in how.staying:
            if getattr(value, name) is not default:
                raise _Fault("a field that stays here holds other than its default").at(f".{name}")
        # (a hundred thousand comparisons: their declared scalars copied at once, as vars() holds them)
        attributes = vars(value) if how.copied else None
        if attributes is not None and len(attributes) == len(how.travelling):
            encoded = dict(attributes)
            for name in how.others:
                inner = encoded[name]
                if type(inner) not in _SCALARS:
                    encoded[name] = _encoded_at(inner, name)
        else:
            encoded = {name: _encoded_at(getattr(value, name), name) for name in how.travelling}
        for name in how.derived:
            encoded[name] = _encoded_at(getattr(value, name), name)
        return encoded
    if kind is list or kind is tuple:
        try:
            return [inner if type(inner) in _SCALARS else _encode(inner) for inner in value]
        except _Fault as fault:  # (where: found again, only for a value that cannot be encoded)
            raise fault.at(f"[{_first_refused(value)}]") from None
    if kind is dict:
        if not all(type(key) is str for key in value):
            raise _Fault("an object whose keys are not all text")
        return {key: _encoded_at(inner, key) for key, inner in value.items()}
    raise _Fault(f"a {kind.__name__}, which plain data cannot hold")


def _first_refused(items: list[Any] | tuple[Any, ...]) -> int:
    for index, inner in enumerate(items):
        try:
            _encode(inner)
        except _Fault:
            return index
    return len(items)


# The dataclasses encoded so far, by type (what _encoding found for each).
_ENCODINGS: dict[type, _Encoding] = {}


def _encoded_at(value: Any, name: str) -> Any:
    try:
        return _encode(value)
    except _Fault as fault:
        raise fault.at(f".{name}") from None


# ----------------------------------------------------------------------------------------------------------------
# Decoding


def decode(cls: type[T], data: Any, bounds: Bounds = _UNBOUNDED) -> T:
    """``data`` read as the dataclass ``cls``: every field present and of its type, within its bounds and the
    message's (``bounds``), no other key (see the module's docstring). Raises :class:`MessageError` naming the
    first field that is not."""
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"decode reads a dataclass, not {cls!r}")
    state = _State(bounds)
    try:
        return typing.cast(T, _reader(cls, _PLAIN)(data, state, 0))
    except _Fault as fault:
        raise MessageError(f"{_path(fault) or cls.__name__}: {fault.what}") from None


class _Fault(Exception):
    """What is wrong, and where: the path's parts, innermost first (each reader on the way out adds its own), so
    that a path is written only for a message that is refused."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.where: list[str] = []

    def at(self, part: str) -> _Fault:
        self.where.append(part)
        return self


def _path(fault: _Fault) -> str:
    """Where ``fault`` is, as ``tolerances.atol`` or ``outputs[3].ok`` ("" at the top)."""
    return "".join(reversed(fault.where)).removeprefix(".")


@dataclass
class _Counted:
    left: int
    limit: int
    noun: str


class _State:
    """One message's reading: what is left of its bounds."""

    def __init__(self, bounds: Bounds) -> None:
        self.items, self.items_left = bounds.items, bounds.items
        self.counts = {cls: _Counted(limit, limit, noun) for cls, limit, noun in bounds.counted}
        self.text = bounds.text
        self.defaults = bounds.defaults

    def count(self, items: int) -> None:
        if self.items_left is not None:
            self.items_left -= items
            if self.items_left < 0:
                raise _Fault(f"the message holds more than {self.items} items in all")

    def tally(self, cls: type) -> None:
        counted = self.counts.get(cls)
        if counted is not None:
            counted.left -= 1
            if counted.left < 0:
                raise _Fault(f"the message holds more than {counted.limit} {counted.noun}")


Reader = Callable[[Any, _State, int], Any]  # (value, the message's state, how deep in the field's value)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


@functools.cache
def _reader(tp: Any, how: Wire) -> Reader:
    """The reader of values annotated ``tp`` within ``how``'s bounds (built once per pair)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return functools.partial(_plain, how=how)
    if tp is None or tp is type(None):
        return _none
    if tp is bool:
        return _flag
    if tp is int or tp is float:
        return _number_reader(tp, how)
    if tp is str:
        return _text_reader(how, how.cut)
    if origin is typing.Annotated:
        inner = next((item for item in tp.__metadata__ if isinstance(item, Wire)), None)
        if inner is None:
            raise TypeError(f"{tp!r}: an Annotated type travels with a Wire among its metadata")
        return _reader(args[0], inner)
    if origin is Literal:
        return _literal_reader(args)
    if origin is Union or origin is types.UnionType:
        return _union_reader(args, how)
    if origin in (list, tuple, dict) and not args:
        raise TypeError(f"{tp!r} cannot travel: name its items' type ({tp!r}[...])")
    if origin is list or origin is tuple:
        return _sequence_reader(origin, args, how)
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"an object's keys travel as text: dict[str, ...], not {tp!r}")
        return _mapping_reader(args[1], how)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass_reader(tp)
    if typing.is_typeddict(tp):
        return _typeddict_reader(tp)
    raise TypeError(f"{tp!r} cannot travel (declare how it does: wire(as_type=...) or wire(stays=True))")


def _unread(value: Any, state: _State, depth: int) -> Any:
    """A field handed on as it came, for the reader that owns it (``wire(unread=True)``: a job's response)."""
    return value


def _none(value: Any, state: _State, depth: int) -> None:
    if value is not None:
        raise _Fault(f"{_kind(value)}, not None")


def _flag(value: Any, state: _State, depth: int) -> bool:
    if type(value) is not bool:
        raise _Fault(f"{_kind(value)}, not true or false")
    return value


def _number_reader(tp: type, how: Wire) -> Reader:
    allowed = (int, float) if tp is float else (int,)
    low, high = how.at_least, how.at_most

    def read(value: Any, state: _State, depth: int) -> Any:
        kind = type(value)
        if kind not in allowed:
            raise _Fault(f"{_kind(value)}, not {'a number' if tp is float else 'an integer'}")
        if kind is int and value not in _INT_RANGE:
            raise _Fault("an integer of more than 64 bits")
        if (low is not None and not value >= low) or (high is not None and not value <= high):
            raise _Fault(f"{value!r}, not {_range(low, high)}")  # (a number: nothing in it to escape)
        return value

    return read


def _range(low: float | None, high: float | None) -> str:
    if low == -math.inf and high is None:
        return "a number other than NaN"
    if low is not None and high is not None:
        return f"from {low:g} to {high:g}"
    return f"at least {low:g}" if low is not None else f"at most {high:g}"


def _text_reader(how: Wire, cut: int | None) -> Reader:
    limit = how.max_len

    def read(value: Any, state: _State, depth: int) -> str:
        if type(value) is not str:
            raise _Fault(f"{_kind(value)}, not text")
        if limit is not None and len(value) > limit:
            raise _Fault(f"text of {len(value)} characters, more than {limit}")
        if cut is not None:
            return printable(value[:cut])[:cut]  # (each character escapes to one or more: the first are enough)
        return value if state.text is None else decoded_text(value, state.text)

    return read


def _literal_reader(choices: tuple[Any, ...]) -> Reader:
    def read(value: Any, state: _State, depth: int) -> Any:
        if not any(type(value) is type(choice) and value == choice for choice in choices):
            raise _Fault(f"not one of {', '.join(map(repr, choices))}")
        return value

    return read


def _union_reader(members: tuple[Any, ...], how: Wire) -> Reader:
    nullable = type(None) in members
    others = [_reader(member, how) for member in members if member is not type(None)]
    names = " or ".join(_named(member) for member in members)

    def read(value: Any, state: _State, depth: int) -> Any:
        if value is None and nullable:
            return None
        if len(others) == 1:
            return others[0](value, state, depth)
        for member in others:
            try:
                return member(value, state, depth)
            except _Fault:
                continue
        raise _Fault(f"{_kind(value)}, not {names}")

    return read


def _sequence_reader(origin: Any, args: tuple[Any, ...], how: Wire) -> Reader:
    limit = how.max_items
    if origin is list or (len(args) == 2 and args[1] is Ellipsis):
        item = _reader(args[0], how)
        as_tuple = origin is tuple

        def read(value: Any, state: _State, depth: int) -> Any:
            _items(value, state, limit)
            found = []
            for index, inner in enumerate(value):
                try:
                    found.append(item(inner, state, depth + 1))
                except _Fault as fault:
                    raise fault.at(f"[{index}]") from None
            return tuple(found) if as_tuple else found

        return read
    members = [_reader(member, how) for member in args]

    def read_fixed(value: Any, state: _State, depth: int) -> Any:
        _items(value, state, limit)
        if len(value) != len(members):
            raise _Fault(f"{len(value)} items, not {len(members)}")
        found = []
        for index, (member, inner) in enumerate(zip(members, value, strict=True)):
            try:
                found.append(member(inner, state, depth + 1))
            except _Fault as fault:
                raise fault.at(f"[{index}]") from None
        return tuple(found)

    return read_fixed


def _items(value: Any, state: _State, limit: int | None) -> None:
    if type(value) is not list:
        raise _Fault(f"{_kind(value)}, not a list")
    if limit is not None and len(value) > limit:
        raise _Fault(f"{len(value)} items, more than {limit}")
    state.count(len(value))


def _object(value: Any, state: _State, limit: int | None, what: str = "") -> None:
    if type(value) is not dict:
        raise _Fault(f"{_kind(value)}, not an object{what}")
    if limit is not None and len(value) > limit:
        raise _Fault(f"{len(value)} items, more than {limit}")
    state.count(len(value))


def _mapping_reader(values: Any, how: Wire) -> Reader:
    key_text = _text_reader(how, how.key_cut)
    item = _reader(values, how)

    def read(value: Any, state: _State, depth: int) -> dict[str, Any]:
        _object(value, state, how.max_items)
        found = {}
        for key, inner in value.items():
            try:
                found[key_text(key, state, depth)] = item(inner, state, depth + 1)
            except _Fault as fault:
                raise fault.at(f".{_shown(key)}") from None
        return found

    return read


def _dataclass_reader(cls: type) -> Reader:
    """An object of ``cls``'s fields that travel (each read as its annotation, or its Wire's ``as_type``), and the
    properties ``__wire_derived__`` names (read as their return annotation, and dropped: ``cls`` computes them)."""
    hints = _hints(cls)
    fields: list[tuple[str, Reader, bool]] = []  # (name, reader, whether it has a default)
    for item in dataclasses.fields(cls):
        how = wire_of(item)
        if how.stays:
            if item.default is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{item.name} stays, so it needs a default (not a default factory)")
        elif item.init:
            tp = how.as_type if how.as_type is not None else hints[item.name]
            has_default = item.default is not dataclasses.MISSING or item.default_factory is not dataclasses.MISSING
            fields.append((item.name, _unread if how.unread else _reader(tp, how), has_default))
    derived = {
        name: _reader(typing.get_type_hints(getattr(cls, name).fget)["return"], _PLAIN)
        for name in getattr(cls, "__wire_derived__", ())
    }
    known = {name for name, _, _ in fields} | set(derived)

    def read(value: Any, state: _State, depth: int) -> Any:
        _object(value, state, None, f" ({cls.__name__})")
        state.tally(cls)
        for key in value:
            if key not in known:
                raise _Fault(f"no such field of {cls.__name__}").at(f".{_shown(key)}")
        found = {}
        for name, field_reader, has_default in fields:
            if name in value:
                try:
                    found[name] = field_reader(value[name], state, 0)
                except _Fault as fault:
                    raise fault.at(f".{name}") from None
            elif not (has_default and state.defaults):
                raise _Fault("missing").at(f".{name}")
        for name, derived_reader in derived.items():
            if name in value:
                try:
                    derived_reader(value[name], state, 0)
                except _Fault as fault:
                    raise fault.at(f".{name}") from None
        return cls(**found)

    return read


def _typeddict_reader(cls: type) -> Reader:
    """An object of a TypedDict's keys (its required ones present), each read as its annotation: a ``dict``."""
    hints = _hints(cls)
    readers = {name: _reader(tp, _PLAIN) for name, tp in hints.items()}
    required = [name for name in hints if name in cls.__required_keys__]  # type: ignore[attr-defined]

    def read(value: Any, state: _State, depth: int) -> dict[str, Any]:
        _object(value, state, None, f" ({cls.__name__})")
        for key in value:
            if key not in readers:
                raise _Fault(f"no such field of {cls.__name__}").at(f".{_shown(key)}")
        for name in required:
            if name not in value:
                raise _Fault("missing").at(f".{name}")
        found = {}
        for name, inner in value.items():
            try:
                found[name] = readers[name](inner, state, 0)
            except _Fault as fault:
                raise fault.at(f".{name}") from None
        return found

    return read


def _plain(value: Any, state: _State, depth: int, how: Wire) -> Any:
    """Plain data: None, booleans, numbers, text (escaped and cut where the field says), lists and objects of it."""
    limit = MAX_DEPTH if how.max_depth is None else how.max_depth
    if depth > limit:
        raise _Fault(f"nested more than {limit} deep")
    kind = type(value)
    if value is None or kind is bool:
        return value
    if kind is int or kind is float:
        return _reader(float, how)(value, state, depth)
    if kind is str:
        return _reader(str, how)(value, state, depth)
    if kind is list:
        _items(value, state, how.max_items)
        found = []
        for index, inner in enumerate(value):
            try:
                found.append(_plain(inner, state, depth + 1, how))
            except _Fault as fault:
                raise fault.at(f"[{index}]") from None
        return found
    if kind is dict:
        _object(value, state, how.max_items)
        key_text = _text_reader(how, how.key_cut)
        mapping = {}
        for key, inner in value.items():
            try:
                mapping[key_text(key, state, depth)] = _plain(inner, state, depth + 1, how)
            except _Fault as fault:
                raise fault.at(f".{_shown(key)}") from None
        return mapping
    raise _Fault(f"{_kind(value)}, not plain data")


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "text", type(None): "None"}


def _named(tp: Any) -> str:
    if tp in _NAMES:
        return _NAMES[tp]
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _named(typing.get_args(tp)[0])
    if origin is list or origin is tuple:
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp) or typing.is_typeddict(tp):
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
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _shown(key: Any) -> str:
    """A key as an error names it: escaped and cut (it may come from an untrusted child)."""
    return printable(str(key)[:60])[:60]
