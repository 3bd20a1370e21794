"""Will it run there: what a saved TensorRT engine needs of a machine, what a machine offers, and the checks.

Every engine Torch-TensorRT saves carries its *engine info*, a list of text
fields whose layout the release's runtime fixes (``core/runtime/runtime.h``,
``SerializedInfoIndex``; from 2.13 mirrored in
``dynamo/runtime/_serialized_engine_layout.py``). Its first field, the runtime
ABI version, says which layout the rest follows (:data:`FIELDS_BY_ABI`), and
the runtime that deserializes the engine refuses any other ABI. The runtime
then checks the platform the engine was built for, and picks a GPU of the
same compute capability as the one it was built on, or, for an engine built
``hardware_compatible=True``, any GPU of compute capability 8.0 (Ampere) or
newer; only then does TensorRT deserialize the plan (native code). Those
checks are made here, on the fields read as data
(:mod:`trt_inline.archive.engine_info`), against :class:`Machine`: this one
(:func:`this_machine`) or one described (:func:`described_machine`: ``trt-inline
check --target``, or the JSON ``trt-inline doctor --json`` writes on the
deployment machine). ``TRT_INLINE_CHECK_ENGINES=0`` turns the check off where
files are loaded, for a user who knows better (a runtime built from source
with another ABI string, say).

The TensorRT version a plan needs is not among the fields of any release, so
it is not checked: a plan built by another TensorRT fails natively ("Version
tag does not match"), which the check cannot foresee.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trt_inline import releases
from trt_inline.errors import VerifyInputError, printable
from trt_inline.messages import wire
from trt_inline.switches import env_flag

__all__ = [
    "CHECK_ENGINES_ENV",
    "FIELDS_BY_ABI",
    "HARDWARE_COMPATIBLE_FLOOR",
    "DeviceInfo",
    "EngineInfo",
    "Gpu",
    "Machine",
    "checks_engines",
    "described_machine",
    "engine_problems",
    "field_problems",
    "stoi",
    "releases_of_abi",
    "this_machine",
]

# TRT_INLINE_CHECK_ENGINES=0: engines load without their needs checked against the machine first.
CHECK_ENGINES_ENV = "TRT_INLINE_CHECK_ENGINES"

_BASE = ("abi", "name", "device", "engine", "inputs", "outputs", "hardware_compatible", "metadata", "platform")
# The engine info's fields, in order, per runtime ABI (read in runtime.h of each release, 2.5.0 ... 2.14.0).
FIELDS_BY_ABI: Mapping[str, tuple[str, ...]] = {
    "6": _BASE,  # 2.5, 2.6
    "7": (*_BASE, "output_allocator"),  # 2.7 ... 2.10
    "8": (*_BASE, "output_allocator", "resource_allocation"),  # 2.11
    "9": (*_BASE, "output_allocator", "resource_allocation", "multi_device"),  # 2.12, 2.13
    "10": (*_BASE, "output_allocator", "resource_allocation", "multi_device", "aliased_io"),  # 2.14
}
# What an engine built hardware_compatible=True runs on: compute capability 8.0 and newer (Ampere).
HARDWARE_COMPATIBLE_FLOOR = (8, 0)
_PLATFORMS = ("linux_x86_64", "linux_aarch64", "windows_x86_64", "windows_arm64")
_GPU, _DLA = 0, 1  # nvinfer1::DeviceType


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


def checks_engines() -> bool:
    """Whether engines are checked against the machine before they load (``TRT_INLINE_CHECK_ENGINES``, default on)."""
    return env_flag(CHECK_ENGINES_ENV, default=True)


def releases_of_abi(abi: str) -> list[str]:
    """The Torch-TensorRT releases whose runtime has this ABI (``["2.7.0", ..., "2.10.0"]``)."""
    return [release.version for release in releases.RELEASES if release.runtime_abi == abi]


def _releases_text(abi: str) -> str:
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
        kind = "DLA " if self.device_type == _DLA else ""
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

    A child reading a file hands it back as plain data (:mod:`trt_inline.messages`), read strictly in the parent
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


@dataclass(frozen=True)
class Gpu:
    major: int
    minor: int
    name: str = ""

    def describe(self) -> str:
        return f"{self.major}.{self.minor}" + (f" ({self.name})" if self.name else "")


@dataclass(frozen=True)
class Machine:
    """What a machine offers an engine. None: not known (that check is not made, and the report says so)."""

    what: str  # "this machine", "the target cc=8.9,platform=linux_x86_64"
    platform: str | None = None
    gpus: tuple[Gpu, ...] | None = None
    torch_tensorrt: str | None = None  # the installed release; "" where it is known to be absent
    abi: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "gpus": None if self.gpus is None else [dataclasses.asdict(g) for g in self.gpus],
            "torch_tensorrt": self.torch_tensorrt,
            "runtime_abi": self.abi,
        }

    def unchecked(self) -> list[str]:
        """What this description leaves unchecked (said once by ``check``)."""
        missing = [name for name, value in (("platform", self.platform), ("GPUs", self.gpus)) if value is None]
        if self.abi is None and self.torch_tensorrt != "":  # ("": known to have none, which is checked)
            missing.append("Torch-TensorRT runtime ABI")
        return missing


def this_machine() -> Machine:
    """This machine: its platform, its GPUs (which initializes CUDA where there is one: call it in the process
    that is about to load the engines, never in one that forks afterwards), its Torch-TensorRT."""
    import torch

    gpus: tuple[Gpu, ...] = ()
    if torch.cuda.is_available():
        gpus = tuple(
            Gpu(*torch.cuda.get_device_capability(i), name=torch.cuda.get_device_name(i))
            for i in range(torch.cuda.device_count())
        )
    version = releases.installed_version()
    record = releases.for_version(version) if version else None
    return Machine(
        "this machine", _this_platform(), gpus, version or "", record.runtime_abi if record is not None else None
    )


def _this_platform() -> str | None:
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "x86_64": "x86_64", "aarch64": "aarch64", "arm64": "arm64"}.get(machine)
    if sys.platform.startswith("linux") and arch in ("x86_64", "aarch64"):
        return f"linux_{arch}"
    if sys.platform == "win32" and arch in ("x86_64", "arm64"):
        return f"windows_{arch}"
    return None


def described_machine(text: str) -> Machine:
    """A machine described by ``--target``: ``cc=8.9,platform=linux_x86_64,torch_tensorrt=2.13.0`` (``cc`` may
    list several GPUs, ``cc=8.9+9.0``; ``abi=9`` instead of a release), or the path of the JSON ``trt-inline
    doctor --json`` wrote there. Raises :class:`VerifyInputError` (one line) for anything else."""
    if text.endswith(".json"):
        return _machine_of_json(text)
    values: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in ("cc", "platform", "torch_tensorrt", "abi") or key in values:
            raise VerifyInputError(
                f"--target {printable(text)[:200]!r}: expected key=value pairs of cc, platform, torch_tensorrt, abi "
                "(cc=8.9,platform=linux_x86_64), or a .json file written by trt-inline doctor --json"
            )
        values[key] = value.strip()
    gpus = None
    if "cc" in values:
        gpus = tuple(_gpu(part, text) for part in values["cc"].split("+") if part)
    target_platform = values.get("platform")
    if target_platform is not None and target_platform not in _PLATFORMS:
        raise VerifyInputError(
            f"--target: platform {printable(target_platform)!r} is not one of {', '.join(_PLATFORMS)}"
        )
    release, abi = values.get("torch_tensorrt"), values.get("abi")
    if release is not None:
        record = releases.for_version(release) if re.match(r"\d+\.\d+", release) else None
        if record is None:
            raise VerifyInputError(f"--target: torch_tensorrt={printable(release)!r} is no release trt-inline knows")
        if abi is not None and abi != record.runtime_abi:
            raise VerifyInputError(
                f"--target: torch_tensorrt={release} has runtime ABI {record.runtime_abi}, not {printable(abi)}"
            )
        abi = record.runtime_abi
    if abi is not None and abi not in FIELDS_BY_ABI:
        raise VerifyInputError(f"--target: runtime ABI {printable(abi)!r} is not one of {', '.join(FIELDS_BY_ABI)}")
    return Machine(f"the target {printable(text)[:200]}", target_platform, gpus, release, abi)


def _gpu(text: str, whole: str) -> Gpu:
    match = re.fullmatch(r"(\d{1,3})\.(\d{1,3})", text.strip())
    if match is None:
        raise VerifyInputError(f"--target {printable(whole)[:200]!r}: cc={printable(text)!r} is not MAJOR.MINOR (8.9)")
    return Gpu(int(match.group(1)), int(match.group(2)))


def _machine_of_json(path: str) -> Machine:
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.loads(handle.read(1 << 20))
        described = document["machine"]
        gpus = described["gpus"]
        listed = None if gpus is None else tuple(_gpu_of_json(gpu) for gpu in gpus[:64])
        machine = Machine(
            f"the machine described in {printable(path)}",
            _optional_text(described["platform"]),
            listed,
            _optional_text(described["torch_tensorrt"]),
            _optional_text(described["runtime_abi"]),
        )
    except OSError as exc:
        raise VerifyInputError(f"--target {printable(path)}: cannot be read ({exc.strerror})") from None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise VerifyInputError(
            f"--target {printable(path)}: not a machine description (write one with trt-inline doctor --json)"
        ) from None
    if machine.abi is not None and machine.abi not in FIELDS_BY_ABI:
        raise VerifyInputError(f"--target {printable(path)}: runtime ABI {printable(machine.abi)!r} is unknown")
    return machine


def _gpu_of_json(gpu: Any) -> Gpu:
    major, minor = gpu["major"], gpu["minor"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1000 for v in (major, minor)):
        raise TypeError("not a compute capability")
    return Gpu(major, minor, _optional_text(gpu.get("name", "")) or "")


def _optional_text(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError("not text")
    return printable(value)[:120]


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
    elif device.device_type not in (_GPU, _DLA):
        found.append(f"its device type {device.device_type} is neither a GPU nor a DLA: the runtime refuses it")
    return found


def engine_problems(engine: EngineInfo, machine: Machine) -> list[str]:
    """Why ``engine`` would not run on ``machine``: one line each, naming the engine, what it needs, what is
    there and the remedy; [] where every check that could be made passes."""
    label = f"{engine.where}"
    problems = [f"{label}: {problem}" for problem in engine.problems]
    if engine.abi not in FIELDS_BY_ABI:
        return [*problems, f"{label}: saved with runtime ABI {printable(engine.abi)[:20]!r}, which no release "
                           "trt-inline knows writes: it cannot be checked, and no known runtime loads it"]  # fmt: skip
    if machine.abi is not None or machine.torch_tensorrt == "":
        problems += _abi_problems(engine, machine, label)
    built_for = engine.fields.get("platform")
    if machine.platform is not None and built_for is not None and built_for != machine.platform:
        # (the runtime maps a name it does not know, "unknown" and "" among them, to a platform that is none)
        built = printable(built_for) if built_for in _PLATFORMS else f"no platform it knows ({printable(built_for)!r})"
        problems.append(
            f"{label}: built for {built}, {machine.what} is {machine.platform}: rebuild it on "
            f"{machine.platform} (or cross-compile for it)"
        )
    if machine.gpus is not None:
        problems += _device_problems(engine, machine, label)
    return problems


def _abi_problems(engine: EngineInfo, machine: Machine, label: str) -> list[str]:
    needs = f"Torch-TensorRT {_releases_text(engine.abi)} (runtime ABI {engine.abi})"
    if machine.torch_tensorrt == "":
        return [f"{label}: needs {needs}, and {machine.what} has no Torch-TensorRT: install torch-tensorrt "
                f"{_releases_text(engine.abi)}"]  # fmt: skip
    if machine.abi == engine.abi:
        return []
    here = f"Torch-TensorRT {machine.torch_tensorrt or _releases_text(machine.abi or '')} (runtime ABI {machine.abi})"
    found = []
    if engine.flag("output_allocator") and "output_allocator" not in FIELDS_BY_ABI.get(machine.abi or "", ()):
        found.append(
            f"{label}: needs the output allocator (data-dependent output shapes), which {here} does not have: "
            "install torch-tensorrt 2.7 or newer"
        )
    if engine.flag("multi_device") and "multi_device" not in FIELDS_BY_ABI.get(machine.abi or "", ()):
        found.append(f"{label}: needs native multi-device support, which {here} does not have")
    found.append(
        f"{label}: saved for {needs}, {machine.what} has {here}: install torch-tensorrt {_releases_text(engine.abi)}, "
        "or rebuild the engine with the Torch-TensorRT there"
    )
    return found


def _device_problems(engine: EngineInfo, machine: Machine, label: str) -> list[str]:
    device = engine.device
    if device is None or device.device_type != _GPU:
        return []  # (an unreadable field is the engine's own problem; a DLA's cores are not described here)
    gpus = machine.gpus or ()
    here = ", ".join(g.describe() for g in gpus) or "no CUDA GPU"
    if engine.flag("hardware_compatible"):
        if any((g.major, g.minor) >= HARDWARE_COMPATIBLE_FLOOR for g in gpus):
            return []
        return [
            f"{label}: hardware-compatible (built on {device.describe()}), which runs on compute capability "
            f"{HARDWARE_COMPATIBLE_FLOOR[0]}.{HARDWARE_COMPATIBLE_FLOOR[1]} (Ampere) and newer; {machine.what} has "
            f"{here}: rebuild it on this GPU"
        ]
    candidates = [g for g in gpus if (g.major, g.minor) == device.capability]
    if len(candidates) == 1 or (candidates and any(g.name == device.name for g in candidates)):
        return []
    if candidates:
        # (several GPUs of its capability: the runtime takes one of the name it was built on, else none)
        return [
            f"{label}: built on {device.describe()}; {machine.what} has several GPUs of compute capability "
            f"{device.major}.{device.minor} ({', '.join(g.describe() for g in candidates)}) and none is a "
            f"{device.name}, which is then what the runtime needs: rebuild it there, or compile with "
            "hardware_compatible=True"
        ]
    return [
        f"{label}: built on {device.describe()}, and an engine runs only on GPUs of the compute capability it was "
        f"built on; {machine.what} has {here}: rebuild it there, or compile with hardware_compatible=True (runs on "
        "Ampere and newer)"
    ]


def require_runnable(engines: Sequence[EngineInfo], machine: Machine, where: str) -> None:
    """Raise :class:`VerifyInputError` (one line: the first engine that would not run, and how many more) before
    anything deserializes them; nothing where ``TRT_INLINE_CHECK_ENGINES=0``."""
    if not engines or not checks_engines():
        return
    problems = [problem for engine in engines for problem in engine_problems(engine, machine)]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise VerifyInputError(
            f"{where}: {problems[0]}{more}; nothing was deserialized ({CHECK_ENGINES_ENV}=0 loads it anyway)"
        )
