"""The bytes of an untrusted file, as the strict reader reaches them: mapped, never copied whole.

A :class:`FileView` maps the file once (copy-on-write: a program that writes to
a weight changes its own page, never the file) and hands out bytes at offsets
and tensors over ranges of the mapping, so that a 20 GB file costs address space
and page cache rather than anonymous memory. A file larger than the memory the
system will commit to a copy-on-write mapping (Linux counts its whole size) is
mapped read-only instead: its tensors must not be written to (the operators a file
from a stranger may call never write to their arguments). Where a file cannot be
mapped at all, it is read range by range, and the view says so. A :class:`BytesView` does the
same over bytes already in memory (an archive nested in an extra file), and a
window of either is a view of its own (an archive nested in an entry).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
import time
import warnings
import weakref
from collections.abc import Iterator

import torch

from trt_inline import progress
from trt_inline.formats import format_size

__all__ = ["BytesView", "FileView", "View", "Window", "unmappable"]

# Files smaller than this are not read ahead: their pages come in as fast either way.
_READ_AHEAD_FROM = 64 << 20


class View:
    """Bytes ``[0, size)`` of a file, read at offsets, and tensors over ranges of them."""

    size: int

    def read(self, offset: int, length: int) -> bytes:
        raise NotImplementedError

    def tensor(self, offset: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D tensor over bytes ``[offset, offset + nbytes)``, without copying where it can."""
        raise NotImplementedError

    def window(self, offset: int, size: int) -> Window:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise ValueError(f"a window {offset}+{size} outside a view of {self.size} bytes")
        return Window(self, offset, size)


def _aligned(offset: int, dtype: torch.dtype) -> bool:
    return offset % max(1, torch.empty((), dtype=dtype).element_size()) == 0


def unmappable(path: str | os.PathLike[str]) -> str | None:
    """Why this system cannot map the file (then its records are read into memory), or None."""
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ):
            return None
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


class FileView(View):
    """An open file, mapped copy-on-write where the system can map it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        # One descriptor for everything (the mapping, reads of bytes, reading ahead): what is read is the
        # file that was opened, whatever the path names later. Bytes are read through it, tensors through
        # the mapping: a read of a record's header through the mapping would map the pages around it too.
        self._descriptor = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        # The reader, if any, is stopped before the descriptor it reads is closed (also when collected).
        self._reader: list[_ReadAhead] = []
        self._closed = weakref.finalize(self, _release, self._descriptor, self._reader)
        self.size = os.fstat(self._descriptor).st_size
        self.mapped: mmap.mmap | None = None
        self.unmapped_reason: str | None = None
        self.read_only = False
        try:
            self.mapped = _map(self._descriptor, mmap.ACCESS_COPY) if self.size else None
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                self.unmapped_reason = f"{type(exc).__name__}: {exc}"
            else:  # more than the system commits to a private mapping: shared and read-only costs no commit
                try:
                    self.mapped, self.read_only = _map(self._descriptor, mmap.ACCESS_READ), True
                except OSError as again:
                    self.unmapped_reason = f"{type(again).__name__}: {again}"
        except ValueError as exc:
            self.unmapped_reason = f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Stop reading ahead and close the descriptor (the mapping lives as long as tensors over it)."""
        self._closed()

    def start_reading_ahead(self) -> bool:
        """Start reading the file into the page cache, a bounded window ahead of the program; whether it started.

        A program reads its weights in the order they were saved, through the
        mapping, page fault by page fault: about half the disk's rate, measured.
        A thread reads the file in large sequential reads instead, so the pages
        are there when the program gets to them, and it starts while the program
        is still being built (that work is all CPU). It stays at most a window
        (half the memory available now) ahead of the furthest page the program
        has touched: of a file larger than memory, a thread running further
        ahead pushes out pages the program has not reached yet, and they are read twice.
        """
        if self.mapped is None or self.size < _READ_AHEAD_FROM or self._reader or not self._closed.alive:
            return False
        reader = _ReadAhead(self._descriptor, self.mapped, self.size, release=self.read_only)
        self._reader.append(reader)
        paced = "" if reader.paced else " (not paced: /proc/self/pagemap cannot be read)"
        window = format_size(reader.window)
        progress.report(f"reading the file ahead of the program, at most {window} ahead{paced}")
        return True

    def stop_reading_ahead(self) -> None:
        while self._reader:
            self._reader.pop().stop()

    @contextlib.contextmanager
    def reading_ahead(self) -> Iterator[None]:
        """While the block runs, the file is read ahead (:meth:`start_reading_ahead`), unless it already is."""
        started = self.start_reading_ahead()
        try:
            yield
        finally:
            if started:
                self.stop_reading_ahead()

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"bytes {offset}+{length} outside a file of {self.size} bytes")
        chunks, done = [], 0
        while done < length:
            chunk = os.pread(self._descriptor, length - done, offset + done)
            if not chunk:
                raise ValueError(f"bytes {offset}+{length}: the file ended at {offset + done}")
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)

    def tensor(self, offset: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        if self.mapped is not None and nbytes and _aligned(offset, dtype):
            element = torch.empty((), dtype=dtype).element_size()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a read-only mapping: torch warns that writing is undefined
                return torch.frombuffer(self.mapped, dtype=dtype, count=nbytes // element, offset=offset)
        return _from_bytes(self.read(offset, nbytes), dtype)


class _ReadAhead:
    """A thread reading a mapped file into the page cache, at most ``window`` bytes ahead of the program.

    Where the program is comes from ``/proc/self/pagemap``: a page of the mapping
    is present there once the program has touched it (reads into the page cache
    map nothing). Where pagemap cannot be read, the thread is not paced.
    """

    _CHUNK = 16 << 20
    _PROBE = 4 << 20  # the granularity at which the program's progress is looked up

    _LAG = 1 << 30  # how far behind the program's frontier pages are let go (a weight being read is behind it)

    def __init__(self, descriptor: int, mapped: mmap.mmap, size: int, *, release: bool = False) -> None:
        from trt_inline.verify.isolation import available_memory  # (isolation reads files through views)

        self.descriptor, self.size = descriptor, size
        # A file larger than memory (mapped shared and read-only): pages well behind the program are unmapped
        # from it, so that the kernel drops those (read, used) rather than the ones read ahead (not yet used).
        self._mapped = mapped if release else None
        self.released = 0
        # (in a sandboxed child /proc/meminfo may be out of reach: then half the machine's memory)
        available = available_memory() // 2 or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
        self.window = max(self._CHUNK * 4, available)
        self.progress = 0  # the furthest page the program was last seen to have touched
        self.position = 0  # how far the thread has read
        self._pagemap: int | None = None
        self._base = 0
        self._scanned = 0.0  # when the whole window was last looked through
        with contextlib.suppress(OSError):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._base = torch.frombuffer(mapped, dtype=torch.uint8, count=1).data_ptr()
            pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if len(os.pread(pagemap, 8, self._base // mmap.PAGESIZE * 8)) == 8:
                    self._pagemap, pagemap = pagemap, -1
            finally:
                if pagemap >= 0:
                    os.close(pagemap)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trt-inline-read-ahead", daemon=True)
        self._thread.start()

    @property
    def paced(self) -> bool:
        return self._pagemap is not None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._pagemap is not None:
            os.close(self._pagemap)
            self._pagemap = None

    def _touched(self, offset: int) -> bool:
        assert self._pagemap is not None
        entry = os.pread(self._pagemap, 8, (self._base + offset) // mmap.PAGESIZE * 8)
        return len(entry) == 8 and bool(int.from_bytes(entry, "little") >> 63)

    def _frontier(self, end: int) -> int:
        """How far below ``end`` the program has touched pages: ``progress`` moved up to it.

        Looked up from ``progress`` upwards, stopping at the first untouched probe
        after touched ones: a few reads of pagemap while the program moves on. A
        program that skips a range (a weight it never reads) leaves a gap: past one,
        the whole window is looked through, at most once a second.
        """
        if self._pagemap is None:
            return end  # no way to tell: not paced
        whole = time.monotonic() - self._scanned > 1.0
        if whole:
            self._scanned = time.monotonic()
        furthest, offset = self.progress, self.progress + self._PROBE
        while offset < end:
            if self._touched(offset):
                furthest = offset
            elif furthest > self.progress or not whole:
                break
            offset += self._PROBE
        return furthest

    def _release_behind(self) -> None:
        """Unmap the pages more than ``_LAG`` behind the program (they stay cached; a later read maps them again).

        Mapped pages are the last the kernel reclaims: left mapped, the pages the
        program has used would outlive the ones read ahead for it, which are then
        dropped and read twice.
        """
        end = (self.progress - self._LAG) // mmap.PAGESIZE * mmap.PAGESIZE
        if self._mapped is None or end - self.released < self._CHUNK * 4:
            return
        with contextlib.suppress(OSError, ValueError):
            self._mapped.madvise(mmap.MADV_DONTNEED, self.released, end - self.released)
        self.released = end

    def _run(self) -> None:
        chunk = bytearray(self._CHUNK)
        with contextlib.suppress(OSError):
            while not self._stop.is_set() and self.position < self.size:
                if self.position >= self.progress + self.window:
                    self.progress = self._frontier(self.position)
                    self._release_behind()
                    if self.position >= self.progress + self.window:
                        self._stop.wait(0.02)
                        continue
                done = os.preadv(self.descriptor, [chunk], self.position)
                if not done:
                    break
                self.position += done


def _release(descriptor: int, reader: list[_ReadAhead]) -> None:
    while reader:
        reader.pop().stop()
    os.close(descriptor)


def _map(descriptor: int, access: int) -> mmap.mmap:
    return mmap.mmap(descriptor, 0, access=access)


class BytesView(View):
    """Bytes in memory (decoded from an entry), read at offsets."""

    def __init__(self, data: bytes) -> None:
        self.data = bytearray(data)
        self.size = len(data)

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"bytes {offset}+{length} outside {self.size} bytes")
        return bytes(self.data[offset : offset + length])

    def tensor(self, offset: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        return _from_bytes(self.read(offset, nbytes), dtype)


class Window(View):
    """Bytes ``[offset, offset + size)`` of another view, addressed from 0."""

    def __init__(self, base: View, offset: int, size: int) -> None:
        self.base = base
        self.offset = offset
        self.size = size

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"bytes {offset}+{length} outside a window of {self.size} bytes")
        return self.base.read(self.offset + offset, length)

    def tensor(self, offset: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError(f"bytes {offset}+{nbytes} outside a window of {self.size} bytes")
        return self.base.tensor(self.offset + offset, nbytes, dtype)


def _from_bytes(data: bytes, dtype: torch.dtype) -> torch.Tensor:
    """A tensor owning a copy of ``data`` (a range that cannot be mapped, or is not aligned for its dtype)."""
    if not data:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype)
