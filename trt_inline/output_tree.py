"""The structure of a program's outputs as a caller reads them: containers, dict keys in order, leaf paths.

Every comparison of outputs flattens them to leaves; what a caller reads is a
path into the structure (``out["scores"]``, ``out[1][0]``). Two programs whose
leaves agree one by one but whose dict keys come in another order give a caller
``out["scores"]`` of one and ``out["boxes"]`` of the other. So the structure is
kept beside the leaves (:class:`OutputTree`) and compared with the reference's
(:func:`structure_problems`), and values are paired by path, not by position
(:func:`paired_by_path`); :func:`by_path` gives both, what ``verify`` and ``diff`` hold a program's outputs to.

A ``None`` in the outputs is part of the structure (it is written ``None`` there)
and no value to compare: :func:`values` leaves it out, on every torch (older
torches' pytree has no leaf for it, newer ones have).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch.utils import _pytree as pytree

from trt_inline import compat
from trt_inline.codec import wire

__all__ = [
    "OutputTree",
    "Pairing",
    "by_path",
    "describe",
    "describe_spec",
    "is_flat",
    "paired_by_path",
    "structure_problems",
    "values",
]

_T = TypeVar("_T")

# A bound on what a file may declare (a structure text is carried in reference I/O and read back).
MAX_STRUCTURE = 1 << 20


@dataclass(frozen=True)
class OutputTree:
    """The outputs' structure (``dict['scores', 'boxes'](*, tuple(*, None))``) and the path of each value."""

    # (bounded as :meth:`from_plain` bounds them where the parent sends one to a child: :mod:`trt_inline.codec`)
    structure: str = field(metadata=wire(max_len=MAX_STRUCTURE))
    # ``out['scores']``, ``out[1][0]``: one per value of :func:`values`, in its order.
    paths: tuple[str, ...] = field(metadata=wire(max_len=MAX_STRUCTURE))

    @property
    def named(self) -> bool:
        """Whether a caller reads the outputs by more than a position: a dict, a named or nested container."""
        if self.paths == ("out",):  # one value, returned as it is
            return False
        return not all(path == f"out[{index}]" for index, path in enumerate(self.paths)) or "None" in self.structure

    def to_plain(self) -> dict[str, Any]:
        return {"structure": self.structure, "paths": list(self.paths)}

    @classmethod
    def from_plain(cls, value: Any, count: int, what: str) -> OutputTree:
        """What :meth:`to_plain` gave, checked: a bounded string and one path string per value."""
        structure = value.get("structure") if isinstance(value, dict) else None
        paths = value.get("paths") if isinstance(value, dict) else None
        if (
            not isinstance(structure, str)
            or len(structure) > MAX_STRUCTURE
            or not isinstance(paths, list)
            or not all(isinstance(path, str) and len(path) <= MAX_STRUCTURE for path in paths)
            or len(paths) != count
        ):
            raise ValueError(f"{what}: an output structure must be a string and one path per output ({count})")
        return cls(structure, tuple(paths))


def is_flat(outputs: Any) -> bool:
    """Whether ``outputs`` say nothing of how a caller reads them: a value, or a plain list or tuple of values
    (an ``--expected`` file's usual form; compared by position, names not checked)."""
    if type(outputs) not in (list, tuple):
        return not isinstance(outputs, list | tuple | dict)
    return all(not isinstance(item, list | tuple | dict) for item in outputs)


def values(outputs: Any) -> list[Any]:
    """The values of ``outputs`` in pytree order, ``None`` left out (it is structure, not a value)."""
    return [leaf for leaf in pytree.tree_leaves(outputs) if leaf is not None]


def describe(outputs: Any) -> OutputTree:
    """The :class:`OutputTree` of a program's (or a reference's) outputs as returned."""
    leaves, spec = pytree.tree_flatten_with_path(outputs)
    paths = tuple("out" + pytree.keystr(path) for path, leaf in leaves if leaf is not None)
    return OutputTree(_text(spec, [leaf is None for _, leaf in leaves]), paths)


def describe_spec(spec: pytree.TreeSpec) -> OutputTree:
    """The :class:`OutputTree` of a program's output spec (``program.call_spec.out_spec``), every leaf a value (a
    spec does not say which will be ``None``): comparable with another spec's."""
    return describe(pytree.tree_unflatten([_Leaf() for _ in range(spec.num_leaves)], spec))


class _Leaf:
    """A stand-in value at each leaf of a spec."""


def _text(spec: pytree.TreeSpec, none_leaves: list[bool]) -> str:
    """``spec`` as text; ``none_leaves``: which leaves (in order) are ``None``, consumed as the walk meets them."""
    position = [0]

    def walk(node: pytree.TreeSpec) -> str:
        if node.is_leaf():
            index = position[0]
            position[0] += 1
            return "None" if none_leaves[index] else "*"
        kind = node.type
        if kind is type(None):
            return "None"
        children = ", ".join(walk(child) for child in _children(node))
        if kind in (tuple, list):
            return f"{kind.__name__}({children})"
        # (A namedtuple's node: its class is the type on older torches, the context on newer ones.)
        for named in (kind, node.context):
            fields = compat.namedtuple_fields(named)
            if fields is not None:
                return f"{named.__name__}{list(fields)!r}({children})"
        label = (
            kind.__name__
            if kind.__module__ in ("builtins", "collections")
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        return f"{label}{_context(node.context)}({children})"

    return walk(spec)


def _children(node: pytree.TreeSpec) -> list[pytree.TreeSpec]:
    children = getattr(node, "children", None)
    if callable(children):  # newer torches: children(); children_specs is deprecated there
        return list(children())
    return list(node.children_specs)


def _context(context: Any) -> str:
    """A node's context (a dict's keys, in order) as text: keys by their ``repr``, anything else as JSON or repr."""
    if context is None:
        return ""
    if isinstance(context, list | tuple):
        return "[" + ", ".join(repr(key) for key in context) + "]"
    try:
        return json.dumps(context, sort_keys=False)
    except (TypeError, ValueError):
        return repr(context)


def _loosely(structure: str) -> str:
    """A structure text as a caller indexes it: a list read as a tuple is, an OrderedDict as a dict (a flat
    ``--expected`` list against a program's tuple, a nested list saved for nested tuples)."""
    return structure.replace("list(", "tuple(").replace("OrderedDict[", "dict[")


def structure_problems(got: OutputTree, want: OutputTree, what: str = "the reference") -> list[str]:
    """Where a program's output structure differs from ``want``'s, each naming the first path it concerns."""
    if _loosely(got.structure) == _loosely(want.structure):
        return []
    missing = [path for path in want.paths if path not in got.paths]
    extra = [path for path in got.paths if path not in want.paths]
    moved = [path for i, path in enumerate(want.paths) if path in got.paths and got.paths.index(path) != i]
    if missing:
        detail = f"{missing[0]} is not among its outputs"
    elif extra:
        detail = f"{extra[0]} is not among {what}'s outputs"
    elif moved:
        detail = (
            f"{moved[0]} is output {got.paths.index(moved[0])} of the program and output "
            f"{want.paths.index(moved[0])} of {what} (values compared by path)"
        )
    else:
        detail = "containers or None outputs differ"
    return [
        f"the outputs are structured otherwise than {what}'s: {detail} (the program returns "
        f"{_short(got.structure)}, {what} {_short(want.structure)})"
    ]


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def paired_by_path(got: OutputTree, want: OutputTree) -> list[int] | None:
    """For each of ``want``'s values, the index of ``got``'s value at the same path; None where the paths are
    not the same set (then values cannot be paired by path, and are compared by position)."""
    where = {path: index for index, path in enumerate(got.paths)}
    if len(where) != len(got.paths) or sorted(where) != sorted(want.paths):
        return None
    return [where[path] for path in want.paths]


@dataclass(frozen=True)
class Pairing:
    """A program's values against a reference's: how they pair, and what the structures say (:func:`by_path`)."""

    # For each of the reference's values, the index of the program's at the same path; None: paired by position.
    order: tuple[int, ...] | None = None
    problems: tuple[str, ...] = ()  # where the structures differ, each naming the first path it concerns
    notes: tuple[str, ...] = ()  # what was not checked (the reference says nothing of names)

    def ordered(self, got: Sequence[_T]) -> list[_T]:
        """The program's values ``got`` in the reference's order (as they are where paired by position)."""
        return list(got) if self.order is None else [got[index] for index in self.order]


def by_path(got: OutputTree | None, want: OutputTree | None, what: str = "the reference") -> Pairing:
    """A program's outputs (structured as ``got``) paired with a reference's (``want``, named ``what``) by path,
    their structures held to each other; where the reference is a flat list of values (``want`` None), a note that
    names were not checked; where the program's structure is unknown (``got`` None), by position."""
    if got is None:
        return Pairing()
    if want is None:
        note = (
            "output names were not checked: the reference is a flat list of values, and the program returns "
            f"{got.structure[:120]}"
        )
        return Pairing(notes=(note,) if got.named else ())
    order = paired_by_path(got, want)
    return Pairing(None if order is None else tuple(order), tuple(structure_problems(got, want, what)))
