"""Graph nodes in the user's terms: the module path and class a node came from, and its source line.

Export records, for each node, the stack of modules it was traced in (``nn_module_stack``) and the Python
stack it was traced from (``stack_trace``); both survive serialization as plain strings. Every report that
names a node, an engine or a fallback region asks here, so the same node reads the same everywhere:
``stage2.0.conv (Linear)`` and ``model.py:41 in forward: h = self.conv(x)``. What a set of nodes (a fallback
region, the steps of an engine) covers is summarized here too (:func:`covered`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.fx

from trt_inline.errors import printable

__all__ = [
    "NOT_RECORDED", "ORIGIN_META", "Coverage", "NodeOrigin", "brief", "covered", "file_origin", "node_origin",
    "serialized_origin",
]  # fmt: skip

# What a report says, once, where nothing it names carries a module path or a source line.
NOT_RECORDED = (
    "no module path or source line is recorded for what this report names (a reference engine records them for "
    "its steps, export for its nodes: nn_module_stack, stack_trace): it is named by its graph names only"
)

# Where trt-inline puts, on a node torch built from a file, the origin it read from that file as data (the
# file's own metadata never reaches torch, whose generated code quotes stack traces): a key FX does not read.
ORIGIN_META = "trt_inline_origin"
# Serialized metadata longer than this is not read (a stack trace is a few KiB).
_MAX_TEXT = 1 << 16

_FRAME = re.compile(r'\s*File "([^"]+)", line (\d+), in (\S+)')
# Frames of torch's own code (``nn.Linear.forward``, ``Sequential.forward``): where the file was saved, or here.
_TORCH_FRAME = re.compile(r"[/\\](?:site|dist)-packages[/\\]torch[/\\]")
_TORCH_HERE = os.path.dirname(torch.__file__) + os.sep


@dataclass(frozen=True)
class NodeOrigin:
    """Where a node came from; each part is ``""`` where the graph does not record it."""

    module: str  # "stage2.0.conv (Linear)"
    source: str  # "model.py:41 in forward: h = self.conv(x)"

    def describe(self) -> str:
        """``module; source``, the parts that are known."""
        return "; ".join(part for part in (self.module, self.source) if part)


def _module_of(stack: object) -> str:
    """The innermost module of an ``nn_module_stack`` (``{key: (path, class or its qualified name)}``).

    A program exported again (a save re-exports the flat graph) gives the nodes it adds the stack of
    torch.export's own wrapper: that is no module of the user's, and names nothing.
    """
    if not isinstance(stack, dict) or not stack:
        return ""
    entry = list(stack.values())[-1]
    if not (isinstance(entry, tuple) and len(entry) == 2):
        return ""
    path, kind = entry
    qualified = f"{kind.__module__}.{kind.__qualname__}" if isinstance(kind, type) else str(kind)
    if qualified.startswith(("torch.export.", "torch._export.")):
        return ""
    cls = kind.__name__ if isinstance(kind, type) else str(kind).rsplit(".", 1)[-1].strip("'>")
    path = str(path).removeprefix("L__self__").strip(".")
    return f"{path} ({cls})" if path else f"{cls} (the model itself)"


def _is_torch(filename: str) -> bool:
    return filename.startswith(_TORCH_HERE) or bool(_TORCH_FRAME.search(filename))


def _source_of(trace: object) -> str:
    """The innermost frame of a ``stack_trace`` in the user's code: ``file:line in function: code``.

    Frames of torch's own modules (``Linear.forward`` calling ``F.linear``) are passed over: the line that
    matters is the one calling the module. Where every frame is torch's, the innermost one.
    """
    lines = str(trace or "").strip().splitlines()
    frames = []
    for index, line in enumerate(lines):
        match = _FRAME.match(line)
        if match:
            following = lines[index + 1] if index + 1 < len(lines) else ""
            code = "" if _FRAME.match(following) else following.strip()  # (a frame of <stdin> has no code line)
            frames.append((match.group(1), match.group(2), match.group(3), code))
    if not frames:
        return ""
    filename, line, function, code = next((f for f in reversed(frames) if not _is_torch(f[0])), frames[-1])
    return f"{os.path.basename(filename)}:{line} in {function}: {code}".rstrip(": ")


def node_origin(node: torch.fx.Node) -> NodeOrigin:
    """The module path and class, and the source line, export recorded for ``node`` (or, for a node of a program
    loaded from a file, what trt-inline read from the file: :data:`ORIGIN_META`)."""
    recorded = node.meta.get(ORIGIN_META)
    if isinstance(recorded, NodeOrigin):
        return recorded
    return NodeOrigin(_module_of(node.meta.get("nn_module_stack")), _source_of(node.meta.get("stack_trace")))


def serialized_origin(metadata: object) -> NodeOrigin:
    """A node's origin from its serialized metadata, read as plain text: torch writes ``nn_module_stack`` as
    ``key,path,class`` items joined by ``;`` (innermost last) and ``stack_trace`` as the traceback's text. Parts
    absent, malformed or too long are ``""``; what is kept is escaped and cut (it is the file's text)."""
    if not isinstance(metadata, dict):
        return NodeOrigin("", "")
    stack, trace = metadata.get("nn_module_stack"), metadata.get("stack_trace")
    module = ""
    if isinstance(stack, str) and 0 < len(stack) <= _MAX_TEXT:
        key, _, rest = stack.rsplit(";", 1)[-1].partition(",")
        path, comma, kind = rest.rpartition(",")
        if comma:
            module = _module_of({key: (path, kind)})
    source = _source_of(trace) if isinstance(trace, str) and len(trace) <= _MAX_TEXT else ""
    return file_origin(module, source)


def file_origin(module: str, source: str) -> NodeOrigin:
    """An origin whose text comes from a file: escaped, each run of white space one space, cut (200 characters
    for the module, 300 for the source line), so that no file's text spans lines or pads one out in a report."""
    return NodeOrigin(" ".join(printable(module).split())[:200], " ".join(printable(source).split())[:300])


def brief(items: Sequence[str], limit: int = 3, noun: str = "modules") -> str:
    """``a, b, c``; past ``limit`` items, the first ``limit`` and a count: ``a, b, c and 4 more (7 modules)``."""
    if len(items) <= limit:
        return ", ".join(items)
    return f"{', '.join(items[:limit])} and {len(items) - limit} more ({len(items)} {noun})"


@dataclass(frozen=True)
class Coverage:
    """What a set of nodes covers in the user's terms: its distinct modules and source lines, first seen first."""

    modules: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.modules or self.sources)

    def module_text(self, limit: int = 3) -> str:
        """``0.proj (Linear), 1.fc (Linear)``; past ``limit`` modules, the first few and a count."""
        return brief(self.modules, limit)

    def source_text(self, limit: int = 2) -> str:
        """``model.py:32 in forward: return self.proj(h)``; past ``limit`` lines, the first few and a count."""
        text = "; ".join(self.sources[:limit])
        return text if len(self.sources) <= limit else f"{text}; and {len(self.sources) - limit} more"


def covered(origins: Iterable[NodeOrigin | torch.fx.Node]) -> Coverage:
    """The distinct modules and source lines of a set of nodes (or of their origins), in the order given."""
    modules: dict[str, None] = {}
    sources: dict[str, None] = {}
    for item in origins:
        origin = node_origin(item) if isinstance(item, torch.fx.Node) else item
        if origin.module:
            modules.setdefault(origin.module)
        if origin.source:
            sources.setdefault(origin.source)
    return Coverage(tuple(modules), tuple(sources))
