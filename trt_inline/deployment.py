"""Will it run there: what a machine offers, and the checks of a saved TensorRT engine's needs against it.

An engine's info (:mod:`trt_inline.engine_fields`) names the runtime ABI it
needs; the runtime then checks the platform the engine was built for, and picks
a GPU of the same compute capability as the one it was built on, or, for an
engine built ``hardware_compatible=True``, any GPU of compute capability 8.0
(Ampere) or newer; only then does TensorRT deserialize the plan (native code).
Those checks are made here, on the fields read as data
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trt_inline import releases
from trt_inline.engine_fields import FIELDS_BY_ABI, GPU_DEVICE, EngineInfo, releases_text
from trt_inline.errors import VerifyInputError, printable
from trt_inline.switches import env_flag

__all__ = [
    "CHECK_ENGINES_ENV",
    "HARDWARE_COMPATIBLE_FLOOR",
    "Gpu",
    "Machine",
    "checks_engines",
    "described_machine",
    "engine_problems",
    "require_runnable",
    "this_machine",
]

# TRT_INLINE_CHECK_ENGINES=0: engines load without their needs checked against the machine first.
CHECK_ENGINES_ENV = "TRT_INLINE_CHECK_ENGINES"

# What an engine built hardware_compatible=True runs on: compute capability 8.0 and newer (Ampere).
HARDWARE_COMPATIBLE_FLOOR = (8, 0)
_PLATFORMS = ("linux_x86_64", "linux_aarch64", "windows_x86_64", "windows_arm64")


def checks_engines() -> bool:
    """Whether engines are checked against the machine before they load (``TRT_INLINE_CHECK_ENGINES``, default on)."""
    return env_flag(CHECK_ENGINES_ENV, default=True)


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
    needs = f"Torch-TensorRT {releases_text(engine.abi)} (runtime ABI {engine.abi})"
    if machine.torch_tensorrt == "":
        return [f"{label}: needs {needs}, and {machine.what} has no Torch-TensorRT: install torch-tensorrt "
                f"{releases_text(engine.abi)}"]  # fmt: skip
    if machine.abi == engine.abi:
        return []
    here = f"Torch-TensorRT {machine.torch_tensorrt or releases_text(machine.abi or '')} (runtime ABI {machine.abi})"
    found = []
    if engine.flag("output_allocator") and "output_allocator" not in FIELDS_BY_ABI.get(machine.abi or "", ()):
        found.append(
            f"{label}: needs the output allocator (data-dependent output shapes), which {here} does not have: "
            "install torch-tensorrt 2.7 or newer"
        )
    if engine.flag("multi_device") and "multi_device" not in FIELDS_BY_ABI.get(machine.abi or "", ()):
        found.append(f"{label}: needs native multi-device support, which {here} does not have")
    found.append(
        f"{label}: saved for {needs}, {machine.what} has {here}: install torch-tensorrt {releases_text(engine.abi)}, "
        "or rebuild the engine with the Torch-TensorRT there"
    )
    return found


def _device_problems(engine: EngineInfo, machine: Machine, label: str) -> list[str]:
    device = engine.device
    if device is None or device.device_type != GPU_DEVICE:
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
