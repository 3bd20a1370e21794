"""Output types a file names that this process does not import: rebuilt from the file as data.

A program returning a ``transformers`` ``ModelOutput`` (or any type registered
with torch's pytree) records the type by name in its output spec, with its
field names as the node's context::

    out_spec:  transformers.modeling_outputs.BaseModelOutput ["last_hidden_state", "pooler_output"]
                 ├── *    (out['last_hidden_state'])
                 └── *    (out['pooler_output'])

torch rebuilds the spec only where that type is registered, which takes importing
the library that defines it. A sandboxed child never imports it (nothing of a
library a file names runs there): before torch reads the document, each such type
is registered as a :class:`StandIn`, a ``dict`` of the fields in the file's order
under the type's own module and name, flattened as ``ModelOutput`` is (values in
key order, key paths ``out['name']``), so the outputs are paired and compared
field by field by name, as a caller reads them. Only a context that is a list of
field names (one per value, each once, in every node that names the type) is
rebuilt, and the report says which types were; any other, and any unknown type
outside a child (a stand-in registered in a caller's process would outlive the
call), is one line naming the type and the way through. A type whose own
unflattening is not by field name (a cache) reads here as its fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from trt_inline import compat
from trt_inline.errors import VerifyInputError, printable
from trt_inline.isolation import in_child

__all__ = ["StandIn", "prepare_output_types", "spec_types", "stood_in_note"]

_SPEC_FIELDS = ("in_spec", "out_spec")
_STAND_INS: dict[str, type[StandIn]] = {}


class StandIn(dict[str, Any]):
    """A registered output type this process does not import: its fields by name, in the file's order (``out["x"]``
    and ``out.x``, as a ``ModelOutput`` reads them)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None


def spec_types(document: Mapping[str, Any]) -> list[tuple[str, Any, int]]:
    """Each typed node of the program document's call specs: (type, context as the spec holds it, how many children
    it has), ``("transformers.modeling_outputs.BaseModelOutput", '["last_hidden_state"]', 1)``."""
    found: list[tuple[str, Any, int]] = []
    module = document.get("graph_module")
    calls = module.get("module_call_graph") if isinstance(module, Mapping) else None
    for call in calls if isinstance(calls, list) else ():
        signature = call.get("signature") if isinstance(call, Mapping) else None
        for name in _SPEC_FIELDS:
            text = signature.get(name) if isinstance(signature, Mapping) else None
            if isinstance(text, str):
                found += _nodes(json.loads(text)[1])
    return found


def _nodes(node: Any) -> list[tuple[str, Any, int]]:
    """(type, context, children) of every typed node of a spec (checked already: a dict with its three keys)."""
    found, pending = [], [node]
    while pending:
        current = pending.pop()
        if isinstance(current["type"], str):
            found.append((current["type"], current["context"], len(current["children_spec"])))
        pending.extend(current["children_spec"])
    return found


def prepare_output_types(types: Sequence[tuple[str, Any, int]], source: str) -> None:
    """Every type of ``types`` (:func:`spec_types`) torch's pytree deserializes here: registered already, or, in a
    sandboxed child, registered as a :class:`StandIn` (every node of it naming one field per child, each once);
    else :class:`VerifyInputError` naming it and what to do."""
    for name, context, children in types:
        if compat.pytree_type_registered(name) and name not in _STAND_INS:
            continue
        library = printable(name.split(".", 1)[0])
        if not in_child():
            raise VerifyInputError(
                f"{source}: its program names the type {printable(name)}, which torch's pytree does not know in "
                f"this process: import the library that defines it ({library}) before loading the file, "
                "or verify it with trt-inline verify / diff / inspect, which rebuild such a type from the file"
            )
        fields = _field_names(context)
        if fields is None or len(fields) != children or len(set(fields)) != len(fields):
            raise VerifyInputError(
                f"{source}: its program names the type {printable(name)}, whose context "
                f"({printable(str(context))[:60]}) is not one field name per value, each once ({children} values): "
                f"it cannot be rebuilt from the file as data; load the file in a process that imports {library}"
            )
        _register(name)


def stood_in_note() -> str | None:
    """A line naming the types this process rebuilt from a file as data (None where it rebuilt none)."""
    if not _STAND_INS:
        return None
    names = ", ".join(sorted(_STAND_INS))
    return (
        f"output types rebuilt from the file as data, their fields compared by name (the library that defines them "
        f"was not imported): {names}"
    )


def _field_names(context: Any) -> list[str] | None:
    try:
        keys = json.loads(context) if isinstance(context, str) else None
    except ValueError:
        return None
    if isinstance(keys, list) and keys and all(isinstance(key, str) for key in keys):
        return keys
    return None


def _register(name: str) -> None:
    """The :class:`StandIn` for ``name``, registered under it (once per process)."""
    if name in _STAND_INS:
        return
    module, _, short = name.rpartition(".")
    stand_in = type(short, (StandIn,), {"__module__": module, "__qualname__": short})
    compat.register_mapping_node(stand_in, name)
    _STAND_INS[name] = stand_in
