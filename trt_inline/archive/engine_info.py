"""What each TensorRT engine of a file needs, read from the file as data: never deserialized, never unpickled.

An engine's info (:mod:`trt_inline.engine_fields` says what its fields mean and
checks them) is held in one of three forms, all read here by the strict
reader (:func:`trt_inline.archive.pickles.read_pickle` with ``objects=True``:
what a pickle would build is kept as text, nothing is imported or called):

===============================================  ===========================================================
where the file holds the engine                  what is read
===============================================  ===========================================================
a TorchBind engine (``custom_obj_N``, torch      its pickle: ``__torch__.torch.classes.tensorrt.Engine``
2.9+ layouts; the constants blob, 2.5 ... 2.8)   built with the list of fields as its state
a Python engine (Torch-TensorRT 2.13+)           its pickle: ``_reconstruct_trt_engine`` called with the list
a cross-compiled program (the graph)             the text arguments of
                                                 ``tensorrt.no_op_placeholder_for_execute_engine`` after its inputs
===============================================  ===========================================================

The serialized metadata field is a base64 pickle upstream; it is read the same
way, and only its plain data is kept (the compile settings' flags:
refittable, stripped, weight streaming), else it is shown as opaque.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Iterator
from typing import Any

from trt_inline import allowed_ops, engines
from trt_inline.archive.pickles import PickledObject, native_engine, read_pickle
from trt_inline.archive.reader import Contents, passthrough_payload, read_file
from trt_inline.archive.views import BytesView
from trt_inline.archive.zip_layout import check_layout
from trt_inline.engine_fields import FIELDS_BY_ABI, NUMERIC_FIELDS, DeviceInfo, EngineInfo, field_problems, stoi
from trt_inline.errors import UnsafeArchiveError, printable

__all__ = ["engine_infos", "metadata_summary", "read_engine_infos"]

_MAX_METADATA = 16 << 20
# An engine's fields as a payload holds them: text (the plan base64), or bytes (a plan given raw).
Fields = list[str | bytes]
_MAX_FIELD = 4096  # (every field but the plan and the metadata is short text)
# The compile settings worth showing for deployment (their names across releases 2.5 ... 2.14).
_SETTINGS = (
    "make_refittable", "immutable_weights", "strip_engine_weights", "refit_identical_engine_weights",
    "enable_weight_streaming", "hardware_compatible", "version_compatible", "use_explicit_typing",
    "use_fp32_acc", "enable_autocast", "require_full_compilation", "min_block_size",
)  # fmt: skip


def read_engine_infos(path: str | os.PathLike[str], *, allow_pickle: bool = False) -> tuple[Contents, list[EngineInfo]]:
    """The file read strictly (engines passed as data, nothing deserialized), and every engine's info.

    Its program is read as data (``as_data``): what it calls need not be registered here, nothing of it runs
    or loads (``verify`` and ``trt_inline.load`` hold it to the allow-list when they open it).
    """
    with allowed_ops.allowing((), native_code=True):
        contents = read_file(path, allow_pickle=allow_pickle, allow_native_code=True, mutations=True, as_data=True)
    return contents, engine_infos(contents)


def engine_infos(contents: Contents) -> list[EngineInfo]:
    """Every engine's info in the file, in the order its program calls them (``engine N``, as ``inspect``
    numbers engines), then any the program does not call (``engine object NAME``). An engine whose info does
    not read as data is listed with that as its problem: never taken for no engine."""
    objects: dict[str, list[Fields | None]] = {}
    for store in (contents.constants, contents.weights):
        for name, value in store.items():
            payload = passthrough_payload(value)
            if payload is not None:
                found = _payload_engines(payload, f"{contents.path}: {printable(name)}")
                if found:
                    objects[name] = found
    for kind, blob in sorted(contents.blobs.items()):
        try:
            value = _read(blob, f"{contents.path}: {kind}")
        except UnsafeArchiveError:
            if native_engine(BytesView(blob)):
                objects[kind] = [None]
            continue
        members = value.items() if isinstance(value, dict) else [(kind, value)]
        for name, member in members:
            found = list(_engine_fields(member))
            if found:
                objects[printable(str(name))] = found
    infos: list[EngineInfo] = []
    used: set[str] = set()
    for index, (label, key, fields) in enumerate(_graph_engines(contents.document or {}, objects)):
        infos.append(_info(f"engine {index} ({label})", fields))
        if key is not None:
            used.add(key)
    for name, every in objects.items():
        rest = every[1:] if name in used else every  # (the first is the one the program calls)
        for position, fields in enumerate(rest):
            suffix = f" [{position + (1 if name in used else 0)}]" if len(every) > 1 else ""
            infos.append(_info(f"engine object {printable(name)}{suffix}", fields))
    return infos


def _payload_engines(payload: bytes, where: str) -> list[Fields | None]:
    """The engines a passed-through payload holds; a payload that does not read as data is an engine that
    cannot be checked where the reader's engine scan says it holds one, and not ours to read otherwise."""
    try:
        return list(_engine_fields(_read(payload, where)))
    except UnsafeArchiveError:
        return [None] if native_engine(BytesView(payload)) else []


def _graph_engines(
    document: dict[str, Any], objects: dict[str, list[Fields | None]]
) -> Iterator[tuple[str, str | None, Fields | None]]:
    """(label, the engine object's name or None, fields) of each engine call in graph order: a cross-compiled
    call's arguments, or the engine object an ``execute_engine`` call names (through the placeholder the
    signature lifts it to)."""
    program = document.get("graph_module", {}) if isinstance(document, dict) else {}
    graph = program.get("graph", {}) if isinstance(program, dict) else {}
    lifted: dict[str, str] = {}
    for spec in (program.get("signature", {}) or {}).get("input_specs", []) or []:
        custom = spec.get("custom_obj") if isinstance(spec, dict) else None
        if isinstance(custom, dict) and isinstance(custom.get("arg"), dict):
            lifted[str(custom["arg"].get("name"))] = str(custom.get("custom_obj_name"))
    for node in graph.get("nodes", []) if isinstance(graph, dict) else []:
        if not isinstance(node, dict):
            continue
        arguments = [i.get("arg", {}) for i in node.get("inputs", []) if isinstance(i, dict)]
        target = node.get("target")
        op = allowed_ops.serialized_to_qualified(target).rsplit(".", 1)[0] if isinstance(target, str) else None
        if op == engines.CROSS_COMPILE_OP.name:
            texts = [a.get("as_string") for a in arguments[1:] if isinstance(a, dict)]
            fields: Fields = [t if isinstance(t, str) else "" for t in texts]
            yield printable(str(fields[1]) if len(fields) > 1 else "cross-compiled")[:120], None, fields
        elif op == engines.TENSORRT_OP.name and len(arguments) > 1 and isinstance(arguments[1], dict):
            holder = arguments[1].get("as_custom_obj", {})
            name = holder.get("name") if isinstance(holder, dict) else None
            held = lifted.get(str(name), str(name))
            if held in objects:
                yield printable(held)[:120], held, objects[held][0]


def _read(payload: bytes, where: str) -> Any:
    """A pickled payload (a ``torch.save``/TorchScript zip with its ``data.pkl``, or a bare pickle) as data."""
    view = BytesView(payload)
    data = payload
    if payload[:4] == b"PK\x03\x04":
        pickles = [e for e in check_layout(view, where) if e.name.endswith("data.pkl")]
        if len(pickles) != 1:
            raise UnsafeArchiveError(f"{where}: refused: an engine payload without one data.pkl")
        data = view.read(pickles[0].data_offset, pickles[0].file_size)
    return read_pickle(data, lambda pid: PickledObject("storage", (pid,)), where, objects=True)


def _engine_fields(root: Any) -> Iterator[Fields | None]:
    """The field lists of the engines a read payload holds, in the order it holds them (an engine object's
    state or call argument; None for an engine object whose fields are not a list of text). Every container is
    walked once (a pickle may share one list many times over), dict keys and set items too."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        value = stack.pop()
        if isinstance(value, (list, tuple, dict, set, frozenset, PickledObject)):
            if id(value) in seen:
                continue
            seen.add(id(value))
        if isinstance(value, PickledObject):
            if _is_engine(value):
                fields = next((v for v in _members(value) if _text_list(v)), None)
                yield None if fields is None else list(fields)
                continue
            stack.extend(reversed([value.state, *value.arguments, *value.items]))
        elif isinstance(value, dict):
            stack.extend(reversed([member for pair in value.items() for member in pair]))
        elif isinstance(value, (list, tuple)):
            stack.extend(reversed(value))
        elif isinstance(value, (set, frozenset)):
            stack.extend(value)


def _is_engine(value: PickledObject) -> bool:
    """An engine class or reconstructor; or a TorchBind object as Python's pickle writes one (``torch.save`` of a
    ``ScriptObject``, the 2.5 ... 2.8 constants blob) whose state names an engine class."""
    named = {f"{module}.{name}" for module, name in engines.ENGINE_PICKLE_GLOBALS}
    if value.kind in engines.ENGINE_SCRIPT_CLASSES or value.kind in named:
        return True
    return value.kind.endswith(".ScriptObject") and any(
        text in engines.ENGINE_SCRIPT_CLASSES for text in _texts((value.state, value.arguments), 0)
    )


def _texts(value: Any, depth: int) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)) and depth < 4:
        for member in value:
            yield from _texts(member, depth + 1)


def _members(value: PickledObject) -> Iterator[Any]:
    """The state and arguments of an object, and the members of those that are tuples (a ``(class name, state)``)."""
    for member in (value.state, *value.arguments):
        yield member
        if isinstance(member, tuple):
            yield from member


def _text_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) >= 4 and all(isinstance(v, (str, bytes)) for v in value)


def _info(where: str, fields: Fields | None) -> EngineInfo:
    """An engine's info from its fields as the file holds them: numbers and the device read as the runtime reads
    them (``std::stoi``), what it would refuse among the problems; text escaped."""
    if fields is None:
        return EngineInfo(where=where, abi="", problems=["an engine whose info does not read as data: not checked"])
    texts = [f.decode("latin-1") if isinstance(f, bytes) else f for f in fields]
    abi = texts[0] if texts else ""
    info = EngineInfo(where=where, abi=printable(abi)[:20])
    layout = FIELDS_BY_ABI.get(abi)
    if layout is None:
        return info
    if len(fields) != len(layout):
        info.problems.append(
            f"{len(fields)} engine info fields where runtime ABI {abi} has {len(layout)}: the runtime refuses it"
        )
    plain: dict[str, str] = {}
    for name, value, text in zip(layout, fields, texts, strict=False):
        if name == "engine":
            info.engine_bytes = len(value) if isinstance(value, bytes) else _decoded_size(text)
        elif name == "metadata":
            info.metadata, info.metadata_note = metadata_summary(text)
        else:
            plain[name] = text
            info.fields[name] = _shown(name, text)
    info.problems += field_problems(plain)
    return info


def _shown(name: str, text: str) -> str:
    """A field as reports show it: a number or a device as the runtime reads it, anything else escaped."""
    if name in NUMERIC_FIELDS and (number := stoi(text)) is not None:
        return str(number)
    if name == "device" and (device := DeviceInfo.parse(text)) is not None:
        return f"{device.id}%{device.major}%{device.minor}%{device.device_type}%{device.name}"
    return printable(text[:_MAX_FIELD])


def _decoded_size(text: str) -> int:
    stripped = text.rstrip("=")
    return len(stripped) * 3 // 4


def metadata_summary(text: str) -> tuple[dict[str, Any], str]:
    """(plain data, note) of an engine's serialized metadata (base64 of a pickle): the compile settings' flags
    where they read as plain data; otherwise nothing, and a note saying what it is."""
    if not text:
        return {}, "none"
    if len(text) > _MAX_METADATA:
        return {}, f"opaque ({len(text)} characters: not read)"
    try:
        value = read_pickle(base64.b64decode(text.encode("ascii"), validate=True), _no_storage, "metadata",
                            objects=True)  # fmt: skip
    except (binascii.Error, UnicodeEncodeError, UnsafeArchiveError, ValueError, RecursionError):
        return {}, f"opaque ({_decoded_size(text)} bytes, not a pickle of plain data)"
    if not isinstance(value, dict):
        return {}, f"opaque ({_decoded_size(text)} bytes)"
    # (only text keys are shown: another key could be any object, whose text could be made to take forever)
    summary: dict[str, Any] = {"keys": sorted(printable(k[:60]) for k in value if isinstance(k, str))[:32]}
    settings = value.get("settings")
    state = settings.state if isinstance(settings, PickledObject) else None
    if isinstance(state, dict):
        plain = (bool, int, str, type(None))
        summary["settings"] = {key: state[key] for key in _SETTINGS if key in state and isinstance(state[key], plain)}
    return summary, f"{_decoded_size(text)} bytes, read as data"


def _no_storage(pid: Any) -> Any:
    raise UnsafeArchiveError("metadata holding tensors")
