"""The limits a child runs under and how much memory this machine and this process have.

``Limits`` (time, memory) for a file, sizes as users write them (``parse_size``),
the default memory limit from the file's size and the memory available, the
process's own address space and resident memory, a sampler of its peaks, and
whether an exception means an allocation failed under the limit.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass

from trt_inline.errors import (
    VerifyInputError,
)
from trt_inline.formats import format_size

DEFAULT_TIMEOUT = 3600.0


_BASE_MEMORY = 2 << 30


_MIN_MEMORY = 512 << 20


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1000, "KIB": 1 << 10, "M": 1 << 20, "MB": 1000**2, "MIB": 1 << 20}


_UNITS |= {"G": 1 << 30, "GB": 1000**3, "GIB": 1 << 30, "T": 1 << 40, "TB": 1000**4, "TIB": 1 << 40}


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``"2GiB"``, ``"512MiB"``, ``"1.5GB"`` or a plain number of bytes."""
    if isinstance(text, int):
        size = text
    else:
        match = _SIZE.match(text)
        unit = match.group(2).upper() if match else ""
        if match is None or unit not in _UNITS:
            raise VerifyInputError(f"memory limit {text!r}: give a size such as 2GiB, 512MiB or 4000000000")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise VerifyInputError(f"memory limit {text!r}: must be more than 0 bytes")
    return size


def proc_kib_field(path: str, field: str) -> int:
    """The ``<field>: N kB`` figure of a ``/proc`` file, in bytes; 0 where unknown."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def available_memory() -> int:
    """Memory the system can give a new process now without swapping (``MemAvailable``); 0 where unknown."""
    return proc_kib_field("/proc/meminfo", "MemAvailable")


def default_memory_limit(path: str | os.PathLike[str] | None) -> int:
    """What a child may use beyond its imports, by default: 2 GiB of working room and half the file's size.

    Weights are mapped from the file, not counted here (the address-space limit
    adds the file itself); what is counted is what is not mapped: activations,
    boundary data, copies of records that cannot be mapped. Never more than 80%
    of the memory available now, so that the limit, not the kernel, stops a child.
    """
    size = os.path.getsize(path) if path is not None and os.path.isfile(path) else 0
    wanted = _BASE_MEMORY + size // 2
    available = available_memory()
    return max(min(wanted, available * 4 // 5), _MIN_MEMORY) if available else wanted


@dataclass(frozen=True)
class Limits:
    """What a child may use: seconds of wall-clock time, and bytes beyond what it uses once torch is imported."""

    timeout: float
    memory: int

    @classmethod
    def for_file(cls, path: str | os.PathLike[str], timeout: float | None, memory_limit: int | str | None) -> Limits:
        """The limits asked for; :data:`DEFAULT_TIMEOUT` and :func:`default_memory_limit` for those not."""
        return cls(
            DEFAULT_TIMEOUT if timeout is None else float(timeout),
            default_memory_limit(path) if memory_limit is None else parse_size(memory_limit),
        )

    def describe(self) -> str:
        return f"{self.timeout:g} s, {format_size(self.memory)}"


class MemorySampler:
    """A thread reading this process's anonymous and file-backed resident memory every few milliseconds: the
    kernel keeps the peak of their sum only. Peaks are above what the process held when the sampler started."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._base = (own_status("RssAnon"), own_status("RssFile"))
        self._peak = self._base
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self._sample()

    def _sample(self) -> None:
        now = (own_status("RssAnon"), own_status("RssFile"))
        self._peak = (max(self._peak[0], now[0]), max(self._peak[1], now[1]))

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def peaks(self) -> tuple[int, int]:
        return self._peak[0] - self._base[0], self._peak[1] - self._base[1]


def own_address_space() -> int:
    return own_status("VmSize")


def own_resident() -> int:
    return own_status("VmRSS")


def own_status(field: str) -> int:
    """A memory figure of this process in bytes (``/proc/self``: in a PID namespace of its own, its pid is not
    the one /proc knows it by)."""
    return proc_kib_field("/proc/self/status", field)


def is_allocation_failure(exc: BaseException) -> bool:
    """Whether an allocation failed under the limit: the error itself or one it was raised from."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        # A thread's stack is address space too: under the limit, starting one fails so.
        allocation = ("can't allocate memory", "out of memory", "can't start new thread", "cannot allocate memory")
        # A C function of the interpreter that returned failure without an exception: an allocation it could not
        # make (seen under a 16 MiB limit on torch 2.5: "SystemError: error return without exception set").
        unsaid = isinstance(seen, SystemError) and "without exception set" in text
        if isinstance(seen, MemoryError) or unsaid or any(words in text.lower() for words in allocation):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
