"""``torch.save`` blobs from a file, read without unpickling them.

``torch.save`` writes a zip archive: ``data.pkl`` (a pickle of the object
graph) and one record per tensor storage (``data/<key>``). torch reads the
pickle with an unpickler, restricted or not. Here it is evaluated by a small
pickle machine of our own that knows only plain data (``None``, booleans,
numbers, strings, bytes, tuples, lists, dicts, sets) and the globals a
``torch.save`` of tensors uses, each replaced by a function of ours that checks
its arguments:

================================================  ==================================================
global in the pickle                              what it builds here
================================================  ==================================================
``torch._utils._rebuild_tensor_v2``               a tensor over a storage record, bounds checked
``torch._utils._rebuild_parameter``               ``torch.nn.Parameter`` of such a tensor
``torch._utils._rebuild_meta_tensor_no_storage``  a tensor on the meta device (shape and dtype only)
``collections.OrderedDict``                       an empty ``OrderedDict`` (to be filled by items)
``torch.<Dtype>Storage``                          the storage's dtype, in a persistent id
``torch.<dtype>``                                 a dtype, as data
================================================  ==================================================

Anything else (another global, ``BUILD``, ``NEWOBJ``, ``INST``, extension
codes, a persistent id that is not a storage) is :class:`UnsafeArchiveError`,
and so is anything after the pickle's end (a legacy ``torch.save`` stream is
several pickles back to back). Tensors are built as ``torch.load`` builds them:
one storage per key (from its first mention: a key named again otherwise is
refused), on the device its location names, each tensor a leaf of its own over
it; the storage is the record in the view it comes from, mapped, not copied.
Every string the pickle holds is escaped as it is decoded.
"""

from __future__ import annotations

import collections
import functools
import io
import pickletools
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trt_inline.archive.views import View
from trt_inline.archive.zip_layout import ZipEntry, check_layout, folded, refuse_compressed
from trt_inline.errors import UnsafeArchiveError, VerifyInputError, decoded_text, first_line, printable

__all__ = ["PickledObject", "native_engine", "read_pickle", "read_torch_save"]

# What a torch.save archive holds besides data.pkl and its records (none of it read but the byte order).
_MARKERS = frozenset(
    {"byteorder", "version", ".format_version", ".storage_alignment", ".data/version", ".data/serialization_id"}
)
_RECORD = re.compile(r"^data/([0-9A-Za-z_]+)$")
_MAX_STACK = 1 << 20
_MARK = object()


@dataclass(frozen=True)
class _Global:
    module: str
    name: str


@dataclass(eq=False)  # (identity: one may be a set's item, as an enum member is)
class PickledObject:
    """An object a pickle would build, kept as data (``read_pickle(..., objects=True)``): what it names
    (``module.name`` of its class or reconstructor), the arguments it would be given, and its ``BUILD`` state.
    Nothing is imported or called to make one."""

    kind: str
    arguments: tuple[Any, ...] = ()
    state: Any = None
    items: list[Any] = field(default_factory=list)  # what APPENDS / SETITEMS added (a list or dict subclass)


@dataclass(frozen=True)
class _Dtype:
    """A dtype a pickle names as a global (``torch.float32``): data, not a callable."""

    dtype: torch.dtype


class _Storage:
    """A storage a persistent id names: its dtype, device, and the record its bytes are in (loaded once, shared
    by every tensor naming its key, as ``torch.load`` shares it)."""

    def __init__(self, key: str, dtype: torch.dtype, numel: int, device: str, load: Callable[[], torch.Tensor]) -> None:
        self.key = key
        self.dtype = dtype
        self.numel = numel
        self.device = device
        self._load = load
        self._tensor: torch.Tensor | None = None

    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            loaded = self._load()
            # Where torch.load restores it (no map_location: torch.export.load passes none).
            try:
                self._tensor = loaded if self.device == "cpu" else loaded.to(self.device)
            except (AssertionError, RuntimeError) as exc:
                raise VerifyInputError(
                    f"storage data/{printable(self.key)} is saved on {self.device}, which this machine cannot use "
                    f"({first_line(exc)})"
                ) from None
        return self._tensor


@functools.cache
def _storage_dtypes() -> dict[str, torch.dtype]:
    """``FloatStorage`` -> ``torch.float32`` ... for every typed storage class torch.save may name."""
    dtypes = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # typed storages are deprecated; their dtype is what is asked
        for name in dir(torch):
            if name.endswith("Storage") and name not in ("TypedStorage", "UntypedStorage"):
                dtype = getattr(getattr(torch, name), "dtype", None)
                if isinstance(dtype, torch.dtype):
                    dtypes[name] = dtype
    dtypes["UntypedStorage"] = torch.uint8
    return dtypes


def _rebuild_tensor(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any, *rest: Any
) -> Any:
    if not isinstance(storage, _Storage):
        raise UnsafeArchiveError("a tensor whose storage is not a storage record")
    dims = _ints(size, "size")
    steps = _ints(stride, "stride")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or len(dims) != len(steps):
        raise UnsafeArchiveError("a tensor with a malformed offset, size or stride")
    if not isinstance(requires_grad, bool) or (hooks is not None and (not isinstance(hooks, dict) or hooks)):
        raise UnsafeArchiveError("a tensor with backward hooks or a malformed requires_grad")
    if (rest and not (rest[0] is None or rest[0] == {})) or len(rest) > 1:
        raise UnsafeArchiveError("a tensor with metadata attached")
    if all(dims) and dims and offset + sum((d - 1) * s for d, s in zip(dims, steps, strict=True)) >= storage.numel:
        raise UnsafeArchiveError(f"a tensor of size {dims} reaching past its storage of {storage.numel} elements")
    if not dims and offset >= storage.numel:
        raise UnsafeArchiveError("a scalar tensor past the end of its storage")
    if requires_grad and not (storage.dtype.is_floating_point or storage.dtype.is_complex):
        raise UnsafeArchiveError(f"a {storage.dtype} tensor that requires grad (torch.load refuses it)")
    # As torch.load builds it: a tensor of its own over the shared storage (not a view of another), a leaf.
    tensor = torch.empty(0, dtype=storage.dtype, device=storage.device)
    tensor.set_(storage.tensor().untyped_storage(), offset, dims, steps)
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def _rebuild_meta_tensor(dtype: Any, size: Any, stride: Any, requires_grad: Any, *rest: Any) -> Any:
    """A tensor on the meta device (shape and dtype, no data): what a package's carried program holds."""
    if not isinstance(dtype, _Dtype) or not isinstance(requires_grad, bool) or rest:
        raise UnsafeArchiveError("a meta tensor with a malformed dtype or requires_grad")
    dims, steps = _ints(size, "size"), _ints(stride, "stride")
    if len(dims) != len(steps):
        raise UnsafeArchiveError("a meta tensor whose size and stride differ in length")
    tensor = torch.empty_strided(dims, steps, dtype=dtype.dtype, device="meta")
    return tensor.requires_grad_(requires_grad) if requires_grad and tensor.is_floating_point() else tensor


def _rebuild_parameter(data: Any, requires_grad: Any, hooks: Any) -> Any:
    if not isinstance(data, torch.Tensor) or not isinstance(requires_grad, bool) or hooks not in (None, {}):
        raise UnsafeArchiveError("a parameter built from something other than a plain tensor")
    return torch.nn.Parameter(data, requires_grad=requires_grad)


def _ints(value: Any, what: str) -> list[int]:
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise UnsafeArchiveError(f"a tensor whose {what} is not a tuple of integers")
    if any(v < 0 for v in value):
        raise UnsafeArchiveError(f"a tensor with a negative {what}")
    return list(value)


_CALLABLES: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): _rebuild_meta_tensor,
    ("collections", "OrderedDict"): lambda *args: collections.OrderedDict() if not args else _refuse_arguments(),
}


def _refuse_arguments() -> Any:
    raise UnsafeArchiveError("an OrderedDict built from arguments rather than items")


def read_pickle(data: bytes, persistent: Callable[[Any], Any], where: str, *, objects: bool = False) -> Any:
    """Evaluate one pickle of plain data and tensors; :class:`UnsafeArchiveError` for anything else.

    ``persistent`` turns a persistent id (a tuple) into its object (a storage). ``objects``: nothing is built at
    all: every call or object becomes a :class:`PickledObject` (what it names, as text; tensors too), so that
    what a pickle describes can be shown (an engine's info, its metadata) without importing or calling anything.
    """
    stream = io.BytesIO(data)
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    try:
        for opcode, arg, _ in pickletools.genops(stream):
            name = opcode.name
            if name == "STOP":
                if stream.read(1):
                    raise UnsafeArchiveError(
                        f"{where}: refused: it holds more after its pickle ends (a legacy torch.save stream, or "
                        "data hidden from this check)"
                    )
                if len(stack) != 1:
                    raise UnsafeArchiveError(f"{where}: refused: a malformed pickle")
                return stack[0]
            _step(name, arg, stack, memo, persistent, objects)
            if len(stack) > _MAX_STACK or len(memo) > _MAX_STACK:
                raise UnsafeArchiveError(f"{where}: refused: a pickle too large to read")
    except UnsafeArchiveError as exc:
        message = str(exc)
        raise UnsafeArchiveError(message if message.startswith(where) else f"{where}: refused: {message}") from None
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise UnsafeArchiveError(f"{where}: refused: not a readable pickle ({first_line(exc)})") from None
    raise UnsafeArchiveError(f"{where}: refused: a pickle without its end")


def _pop_mark(stack: list[Any]) -> list[Any]:
    for position in range(len(stack) - 1, -1, -1):
        if stack[position] is _MARK:
            items = stack[position + 1 :]
            del stack[position:]
            return items
    raise ValueError("no mark")


def _step(
    name: str, arg: Any, stack: list[Any], memo: dict[int, Any], persistent: Callable[[Any], Any], objects: bool
) -> None:
    """One opcode of the machine (everything but STOP); with ``objects``, objects built as :class:`PickledObject`."""
    if name in ("PROTO", "FRAME"):
        return
    if name == "MARK":
        stack.append(_MARK)
    elif name == "POP":
        stack.pop()
    elif name == "POP_MARK":
        _pop_mark(stack)
    elif name == "DUP":
        stack.append(stack[-1])
    elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
        stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
    elif name in ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT"):
        stack.append(arg)
    elif name in ("UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"):
        # (kept whole in objects mode, an engine's fields among them: escaped where they are shown)
        stack.append(str(arg) if objects else decoded_text(str(arg)))
    elif name in ("BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"):
        stack.append(bytes(arg))
    elif name in ("STRING", "BINSTRING", "SHORT_BINSTRING"):
        stack.append(decoded_text(arg.decode("latin-1") if isinstance(arg, bytes) else str(arg)))
    elif name == "EMPTY_TUPLE":
        stack.append(())
    elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
        count = int(name[-1])
        members = tuple(stack[len(stack) - count :])
        if len(members) != count or any(member is _MARK for member in members):
            raise ValueError("a tuple without its items")
        del stack[len(stack) - count :]
        stack.append(members)
    elif name == "TUPLE":
        stack.append(tuple(_pop_mark(stack)))
    elif name == "EMPTY_LIST":
        stack.append([])
    elif name == "LIST":
        stack.append(_pop_mark(stack))
    elif name in ("APPEND", "APPENDS"):
        items = [stack.pop()] if name == "APPEND" else _pop_mark(stack)
        if objects and isinstance(stack[-1], PickledObject):  # (a list subclass: its items kept as data)
            stack[-1].items.extend(items)
        elif not isinstance(stack[-1], list):
            raise UnsafeArchiveError("items appended to something other than a list")
        else:
            stack[-1].extend(items)
    elif name == "EMPTY_DICT":
        stack.append({})
    elif name == "DICT":
        items = _pop_mark(stack)
        stack.append(dict(zip(items[::2], items[1::2], strict=True)))
    elif name in ("SETITEM", "SETITEMS"):
        items = [stack.pop(-2), stack.pop()] if name == "SETITEM" else _pop_mark(stack)
        if objects and isinstance(stack[-1], PickledObject):  # (an OrderedDict, a dict subclass: pairs as data)
            stack[-1].items.extend(zip(items[::2], items[1::2], strict=True))
            return
        if not isinstance(stack[-1], dict):
            raise UnsafeArchiveError("items set on something other than a dict")
        for key, value in zip(items[::2], items[1::2], strict=True):
            stack[-1][_key(key)] = value
    elif name == "EMPTY_SET":
        stack.append(set())
    elif name == "ADDITEMS":
        items = _pop_mark(stack)
        if not isinstance(stack[-1], set):
            raise UnsafeArchiveError("items added to something other than a set")
        stack[-1].update(_key(item) for item in items)
    elif name == "FROZENSET":
        stack.append(frozenset(_key(item) for item in _pop_mark(stack)))
    elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
        memo[int(arg)] = stack[-1]
    elif name == "MEMOIZE":
        memo[len(memo)] = stack[-1]
    elif name in ("GET", "BINGET", "LONG_BINGET"):
        stack.append(memo[int(arg)])
    elif name in ("GLOBAL", "STACK_GLOBAL"):
        if name == "GLOBAL":
            module, _, attribute = str(arg).partition(" ")
        else:
            attribute, module = stack.pop(), stack.pop()
            if not isinstance(module, str) or not isinstance(attribute, str):
                raise UnsafeArchiveError("it imports a global whose name it computes")
        stack.append(_Global(module, attribute) if objects else _global(module, attribute))
    elif name == "REDUCE" and objects:
        arguments, function = stack.pop(), stack.pop()
        if not isinstance(function, _Global):
            raise UnsafeArchiveError(f"it calls {_describe(function)}")
        if (function.module, function.name) == _TYPE_TAG and isinstance(arguments, tuple) and arguments:
            stack.append(arguments[0])  # (TorchScript's tag of a container's element type: the container itself)
        else:
            stack.append(PickledObject(f"{function.module}.{function.name}", _arguments(arguments)))
    elif name in ("NEWOBJ", "NEWOBJ_EX") and objects:
        if name == "NEWOBJ_EX":
            stack.pop()  # (keyword arguments: not kept)
        arguments, cls = stack.pop(), stack.pop()
        if not isinstance(cls, _Global):
            raise UnsafeArchiveError(f"it builds an object of {_describe(cls)}")
        stack.append(PickledObject(f"{cls.module}.{cls.name}", _arguments(arguments)))
    elif name == "BUILD" and objects:
        state = stack.pop()
        if not isinstance(stack[-1], PickledObject):
            raise UnsafeArchiveError(f"it sets the state of {_describe(stack[-1])}")
        stack[-1].state = state
    elif name == "REDUCE":
        arguments, function = stack.pop(), stack.pop()
        if not isinstance(function, _Global) or (function.module, function.name) not in _CALLABLES:
            raise UnsafeArchiveError(f"it calls {_describe(function)}")
        if not isinstance(arguments, tuple):
            raise UnsafeArchiveError("a call with arguments that are not a tuple")
        stack.append(_CALLABLES[function.module, function.name](*arguments))
    elif name in ("BINPERSID", "PERSID"):
        stack.append(persistent(stack.pop() if name == "BINPERSID" else arg))
    else:
        # BUILD, NEWOBJ, NEWOBJ_EX, OBJ, INST, EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER, ...
        raise UnsafeArchiveError(f"it uses the {name} opcode, which builds objects")


_TYPE_TAG = ("torch.jit._pickle", "restore_type_tag")


def _arguments(value: Any) -> tuple[Any, ...]:
    if not isinstance(value, tuple):
        raise UnsafeArchiveError("a call with arguments that are not a tuple")
    return value


def _key(value: Any) -> Any:
    """A dict key or set item: plain hashable data only (or an object kept as data, by identity)."""
    if isinstance(value, (PickledObject, _Global)):  # (only ever made by ``objects`` mode)
        return value
    if isinstance(value, (str, int, float, bool, bytes, type(None))) or (
        isinstance(value, tuple) and all(isinstance(v, (str, int, float, bool, bytes, type(None))) for v in value)
    ):
        return value
    raise UnsafeArchiveError("a dict key or set item that is not plain data")


@functools.cache
def _dtypes() -> dict[str, torch.dtype]:
    """``float32`` -> ``torch.float32``: every dtype torch names at its top level."""
    return {name: value for name in dir(torch) if isinstance(value := getattr(torch, name, None), torch.dtype)}


def _global(module: str, attribute: str) -> _Global | _Dtype:
    if (module, attribute) in _CALLABLES or (module == "torch" and attribute in _storage_dtypes()):
        return _Global(module, attribute)
    if module == "torch" and attribute in _dtypes():
        return _Dtype(_dtypes()[attribute])
    raise UnsafeArchiveError(f"it calls {printable(module)}.{printable(attribute)}")


def _describe(value: Any) -> str:
    if isinstance(value, _Global):
        return f"{printable(value.module)}.{printable(value.name)} with arguments"
    return f"a {type(value).__name__}"


def read_torch_save(view: View, where: str) -> Any:
    """The object a ``torch.save`` archive in ``view`` holds: plain data and tensors over its records.

    Raises :class:`UnsafeArchiveError` naming ``where`` for anything else, and
    :class:`VerifyInputError` for what is no ``torch.save`` archive at all.
    """
    if view.size == 0:
        return None
    if view.read(0, 4) != b"PK\x03\x04":
        # A bare pickle (or the first of a legacy torch.save stream's): read as one, storages refused.
        return read_pickle(view.read(0, view.size), _no_storages, where)
    entries = check_layout(view, where)
    refuse_compressed(entries, where)
    root = _root(entries, where)
    by_name = {entry.name[len(root) :]: entry for entry in entries}
    for name in by_name:
        if name != "data.pkl" and name not in _MARKERS and not _RECORD.match(name):
            raise UnsafeArchiveError(f"{where}: refused: it holds {printable(name)!r}, which torch.save does not write")
        if folded(name) != name:
            raise UnsafeArchiveError(f"{where}: refused: {printable(name)!r} is not named as torch.save names it")
    if "data.pkl" not in by_name:
        raise UnsafeArchiveError(f"{where}: refused: a torch.save archive without its data.pkl")
    order = by_name.get("byteorder")
    if order is not None and view.read(order.data_offset, order.file_size).decode("ascii", "replace") != sys.byteorder:
        raise VerifyInputError(f"{where}: written on a machine of another byte order")
    pickle = by_name["data.pkl"]

    storages: dict[str, _Storage] = {}

    def storage(pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise UnsafeArchiveError("a persistent id that is not a storage")
        _, kind, key, location, numel = pid
        if not isinstance(kind, _Global) or kind.module != "torch" or kind.name not in _storage_dtypes():
            raise UnsafeArchiveError("a storage of an unknown type")
        if not isinstance(key, str) or not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
            raise UnsafeArchiveError("a malformed storage id")
        if not isinstance(location, str):
            raise UnsafeArchiveError("a storage without a device")
        record = by_name.get(f"data/{key}")
        if record is None:
            raise UnsafeArchiveError(f"a storage whose record data/{printable(key)} is missing")
        dtype = _storage_dtypes()[kind.name]
        device = _restored_device(location)
        known = storages.get(key)
        if known is not None:
            # torch.load builds a key's storage from its first mention, and every later one shares it.
            if (known.dtype, known.numel, known.device) != (dtype, numel, device):
                raise UnsafeArchiveError(
                    f"storage data/{printable(key)} is named as {dtype} x {numel} on {device} where it was first "
                    f"named as {known.dtype} x {known.numel} on {known.device}"
                )
            return known
        element = torch.empty((), dtype=dtype).element_size()
        if record.file_size != numel * element:
            raise UnsafeArchiveError(
                f"storage data/{printable(key)} declares {numel} elements and holds {record.file_size} bytes"
            )
        storages[key] = _Storage(
            key, dtype, numel, device, lambda: view.tensor(record.data_offset, record.file_size, dtype)
        )
        return storages[key]

    return read_pickle(view.read(pickle.data_offset, pickle.file_size), storage, where)


_LOCATION = re.compile(r"^(cpu|cuda(:[0-9]{1,3})?)$")


def _restored_device(location: str) -> str:
    """Where ``torch.load`` (without ``map_location``) puts a storage saved at ``location``: ``cpu`` or a CUDA
    device (it fails where CUDA is not available, and so does the reading here, when the tensor is built)."""
    if not _LOCATION.match(location):
        raise UnsafeArchiveError(f"a storage on device {printable(location)[:40]!r}, not the CPU or a CUDA device")
    return "cuda:0" if location == "cuda" else location


def _no_storages(pid: Any) -> Any:
    raise UnsafeArchiveError("a persistent id outside a torch.save archive")


def _root(entries: list[ZipEntry], where: str) -> str:
    """The one folder every entry of a torch.save archive is in (``archive/``)."""
    roots = {entry.name.partition("/")[0] + "/" for entry in entries}
    if len(roots) != 1 or any("/" not in entry.name for entry in entries):
        raise UnsafeArchiveError(f"{where}: refused: a torch.save archive whose entries are not in one folder")
    return roots.pop()


# ---------------------------------------------------------------------------
# TensorRT engines: pickles passed to torch only when native code is allowed
# ---------------------------------------------------------------------------

_STRING_OPS = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
)
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_TORCHSCRIPT_HELPERS = frozenset(
    ("torch.jit._pickle", name)
    for name in ("build_intlist", "build_doublelist", "build_boollist", "build_tensorlist", "restore_type_tag")
)
_TORCHBIND_PREFIX = "__torch__.torch.classes."
_UNKNOWN = object()


def native_engine(view: View) -> bool:
    """Whether a pickled payload holds a TensorRT engine and, besides it, only what ``weights_only`` allows.

    Such a payload can only be loaded by torch (its engine class's C++
    ``__setstate__`` deserializes the plan: native code). The pickles are
    scanned as opcodes, never executed: every global must be on torch's
    ``weights_only`` allow-list, a TorchScript helper, or an engine class or
    reconstructor (:mod:`trt_inline.engines`), and at least one must be an engine.
    """
    pickles: list[bytes] = []
    if view.read(0, 4) == b"PK\x03\x04":
        try:
            entries = check_layout(view, "engine")
        except UnsafeArchiveError:
            return False
        pickles = [view.read(e.data_offset, e.file_size) for e in entries if e.name.endswith(".pkl")]
    else:
        pickles = [view.read(0, view.size)]
    verdicts = [_engine_scan(data) for data in pickles]
    return bool(verdicts) and all(v is not None for v in verdicts) and any(verdicts)


def _engine_scan(data: bytes) -> bool | None:
    """True: an engine and allowed globals only; False: allowed globals only; None: anything else."""
    from trt_inline import compat, engines

    classes = frozenset(tuple(name.rsplit(".", 1)) for name in engines.ENGINE_SCRIPT_CLASSES)

    def allowed(module: str, name: str) -> bool:
        return (
            f"{module}.{name}" in compat.weights_only_globals()
            or (module, name) in _TORCHSCRIPT_HELPERS
            or (module, name) == ("torch", "ScriptObject")
        )

    def is_engine(module: str, name: str) -> bool:
        return (module, name) in classes or (module, name) in engines.ENGINE_PICKLE_GLOBALS

    stream = io.BytesIO(data)
    stack: list[Any] = []
    memo: dict[Any, Any] = {}
    engine = False
    try:
        for opcode, arg, _ in pickletools.genops(stream):
            op = opcode.name
            if op in ("EXT1", "EXT2", "EXT4", "PERSID"):
                return None
            if op in ("GLOBAL", "INST", "STACK_GLOBAL"):
                if op == "STACK_GLOBAL":
                    name, module = stack.pop(), stack.pop()
                else:
                    module, _, name = str(arg).partition(" ")
                if not isinstance(module, str) or not isinstance(name, str):
                    return None
                engine = engine or is_engine(module, name)
                if not allowed(module, name) and not is_engine(module, name):
                    return None
                if op == "STACK_GLOBAL":
                    stack.append(_UNKNOWN)
                    continue
            if op in _STRING_OPS:
                text = arg.decode("latin-1") if isinstance(arg, bytes) else str(arg)
                if text.startswith(_TORCHBIND_PREFIX):
                    if text not in engines.ENGINE_SCRIPT_CLASSES:
                        return None
                    engine = True
                stack.append(text)
            elif op in _GET_OPS:
                stack.append(memo.get(arg, _UNKNOWN))
            elif op in _PUT_OPS:
                memo[arg] = stack[-1] if stack else _UNKNOWN
            elif op == "MEMOIZE":
                memo[len(memo)] = stack[-1] if stack else _UNKNOWN
            else:
                _stack_effect(stack, opcode)
    except (ValueError, IndexError, KeyError):
        return None
    if stream.read(1):
        return None
    return engine


def _stack_effect(stack: list[Any], opcode: pickletools.OpcodeInfo) -> None:
    """Pop what ``opcode`` consumes and push unknown values for what it produces."""
    before = opcode.stack_before
    if pickletools.markobject in before:
        while stack and stack[-1] is not _MARK:
            stack.pop()
        if stack:
            stack.pop()
        del stack[len(stack) - before.index(pickletools.markobject) :]
    else:
        del stack[len(stack) - len(before) :]
    stack.extend(_MARK if produced is pickletools.markobject else _UNKNOWN for produced in opcode.stack_after)
