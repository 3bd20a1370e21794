"""What a saved TensorRT engine says of itself: its engine info, field by field, as the release's runtime reads it.

Every engine Torch-TensorRT saves carries its *engine info*, a list of text
fields whose layout the release's runtime fixes (``core/runtime/runtime.h``,
``SerializedInfoIndex``; from 2.13 mirrored in
``dynamo/runtime/_serialized_engine_layout.py``). Its first field, the runtime
ABI version, says which layout the rest follows (:data:`FIELDS_BY_ABI`), and
the runtime that deserializes the engine refuses any other ABI. The fields are
read from a file as data (:mod:`trt_inline.archive.engine_info`) into
:class:`EngineInfo`; what the runtime refuses whatever the machine is
:func:`field_problems`, what a machine must offer :mod:`trt_inline.deployment`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trt_inline import releases
from trt_inline.codec import wire
from trt_inline.errors import printable

__all__ = [
    "DLA_DEVICE",
    "FIELDS_BY_ABI",
    "GPU_DEVICE",
    "NUMERIC_FIELDS",
    "DeviceInfo",
    "EngineInfo",
    "field_problems",
    "releases_of_abi",
    "releases_text",
    "stoi",
]

_BASE = ("abi", "name", "device", "engine", "inputs", "outputs", "hardware_compatible", "metadata", "platform")
# The engine info's fields, in order, per runtime ABI (read in runtime.h of each release, 2.5.0 ... 2.14.0).
FIELDS_BY_ABI: Mapping[str, tuple[str, ...]] = {
    "6": _BASE,  # 2.5, 2.6
    "7": (*_BASE, "output_allocator"),  # 2.7 ... 2.10
    "8": (*_BASE, "output_allocator", "resource_allocation"),  # 2.11
    "9": (*_BASE, "output_allocator", "resource_allocation", "multi_device"),  # 2.12, 2.13
    "10": (*_BASE, "output_allocator", "resource_allocation", "multi_device", "aliased_io"),  # 2.14
}
GPU_DEVICE, DLA_DEVICE = 0, 1  # nvinfer1::DeviceType


_INT32 = 1 << 31
# The fields the runtime reads with std::stoi, as numbers (a flag is true where it is not 0).
NUMERIC_FIELDS = ("hardware_compatible", "output_allocator", "resource_allocation", "multi_device")


def stoi(text: str) -> int | None:
    """``std::stoi`` as the runtime reads a field: leading white space, a sign, ASCII digits up to the first other
    character (``"0x1"`` is 0, ``" 1"`` is 1, leading zeros skipped); None where it throws (no digit, past 32
    bits). The digits are counted before any is converted: a field of thousands of digits is out of range by its
    length (Python would refuse to convert it at all)."""
    match = re.match(r"[ \t\n\v\f\r]*([+-]?)0*([0-9]+)", text)
    if match is None:
        return None
    sign, digits = match.groups()
    if len(digits) > 10:  # (2**31 has 10 digits: more is out of range whatever they are)
        return None
    value = int(sign + digits)
    return value if -_INT32 <= value < _INT32 else None


def releases_of_abi(abi: str) -> list[str]:
    """The Torch-TensorRT releases whose runtime has this ABI (``["2.7.0", ..., "2.10.0"]``)."""
    return [release.version for release in releases.RELEASES if release.runtime_abi == abi]


def releases_text(abi: str) -> str:
    """The releases of :func:`releases_of_abi` as a report names them: ``2.7.0 ... 2.10.0``."""
    found = releases_of_abi(abi)
    if not found:
        return "no release trt-inline knows"
    return found[0] if len(found) == 1 else f"{found[0]} ... {found[-1]}"


@dataclass(frozen=True)
class DeviceInfo:
    """The device an engine was built on, as its info records it (``id%major%minor%type%name``)."""

    id: int
    major: int
    minor: int
    device_type: int
    name: str

    @property
    def capability(self) -> tuple[int, int]:
        return self.major, self.minor

    def describe(self) -> str:
        kind = "DLA " if self.device_type == DLA_DEVICE else ""
        return f"{kind}compute capability {self.major}.{self.minor} ({self.name})"

    @classmethod
    def parse(cls, text: str) -> DeviceInfo | None:
        """The runtime's reading (``RTDevice``): exactly five ``%``-separated fields, the first four ``std::stoi``;
        None where it refuses the field."""
        parts = text.split("%")
        numbers = [stoi(part) for part in parts[:4]]
        if len(parts) != 5 or any(n is None for n in numbers):
            return None
        id_, major, minor, kind = (n for n in numbers if n is not None)
        return cls(id_, major, minor, kind, printable(parts[4])[:120])


@dataclass
class EngineInfo:
    """One engine's info, read from a file as data (nothing deserialized). ``where``: how the report names it.

    ``fields``: every field the layout of its ABI names, as text (the plan itself left out: ``engine_bytes`` is
    its decoded size). ``metadata``: the plain data of its serialized metadata where it decodes as such
    (:func:`trt_inline.archive.engine_info.metadata_summary`), ``metadata_note`` what it is otherwise.

    A child reading a file hands it back as plain data (:mod:`trt_inline.codec`), read strictly in the parent
    within the bounds declared here: strings escaped and cut, at most 32 fields and 32 problems, the metadata
    plain data at most 6 deep, 64 items a list or object.
    """

    where: str = field(metadata=wire(cut=200))
    abi: str = field(metadata=wire(cut=20))
    fields: dict[str, str] = field(default_factory=dict, metadata=wire(max_items=32, key_cut=40, cut=4096))
    engine_bytes: int = 0
    metadata: dict[str, Any] = field(
        default_factory=dict, metadata=wire(max_items=64, max_depth=6, key_cut=60, cut=400)
    )
    metadata_note: str = field(default="", metadata=wire(cut=200))
    problems: list[str] = field(default_factory=list, metadata=wire(max_items=32, cut=400))

    @property
    def name(self) -> str:
        return self.fields.get("name", "")

    @property
    def device(self) -> DeviceInfo | None:
        return DeviceInfo.parse(self.fields.get("device", ""))

    def flag(self, key: str) -> bool | None:
        """A numeric field as the runtime reads it (``std::stoi``, true where not 0); None where it is absent (an
        older layout) or unreadable (a problem of the engine, said by :func:`field_problems`)."""
        value = self.fields.get(key)
        number = None if value is None else stoi(value)
        return None if number is None else number != 0

    @property
    def platform(self) -> str | None:
        return self.fields.get("platform") or None

    @property
    def inputs(self) -> list[str]:
        return [n for n in self.fields.get("inputs", "").split("%") if n]

    @property
    def outputs(self) -> list[str]:
        return [n for n in self.fields.get("outputs", "").split("%") if n]

    def to_dict(self) -> dict[str, Any]:
        device = self.device
        return {
            "where": self.where,
            "name": self.name,
            "runtime_abi": self.abi,
            "releases": releases_of_abi(self.abi),
            "device": None if device is None else dataclasses.asdict(device),
            "hardware_compatible": self.flag("hardware_compatible"),
            "target_platform": self.platform,
            "requires_output_allocator": self.flag("output_allocator"),
            "requires_native_multi_device": self.flag("multi_device"),
            "resource_allocation_strategy": self.fields.get("resource_allocation"),
            "inputs": self.inputs,
            "outputs": self.outputs,
            "engine_bytes": self.engine_bytes,
            "metadata": self.metadata,
            "metadata_note": self.metadata_note,
            "problems": self.problems,
        }


def _shown(text: str) -> str:
    """A field's text as a report shows it: its first 40 characters, and how long it is where that is longer."""
    shown = repr(printable(text)[:40])
    return shown if len(text) <= 40 else f"{shown} ({len(text)} characters)"


def field_problems(fields: Mapping[str, str]) -> list[str]:
    """What in an engine's fields (as the file holds them) the runtime refuses whatever the machine: a numeric
    field ``std::stoi`` throws on, a device field it cannot read, a device type it does not know."""
    found = [
        f"its {name} field {_shown(fields[name])} is not a 32-bit number (std::stoi throws): the runtime refuses "
        "the engine"
        for name in NUMERIC_FIELDS if name in fields and stoi(fields[name]) is None
    ]  # fmt: skip
    device = DeviceInfo.parse(fields.get("device", ""))
    if device is None:
        found.append(
            f"its device field {printable(fields.get('device', ''))[:80]!r} is not id%major%minor%type%name: the "
            "runtime refuses the engine"
        )
    elif device.device_type not in (GPU_DEVICE, DLA_DEVICE):
        found.append(f"its device type {device.device_type} is neither a GPU nor a DLA: the runtime refuses it")
    return found
