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
import warnings
import weakref
from collections.abc import Iterator

import torch

from trt_inline import progress
from trt_inline.formats import format_size
from trt_inline.isolation import read_ahead

__all__ = ["BytesView", "FileView", "View", "Window"]


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


# Where torch's loader puts every tensor it reads from a file: a fresh allocation of its own, which torch aligns to
# 64 bytes. A kernel may take another path by its operand's address (vectorized loads, BLAS blocking): a program
# comparing two such results could tell a weight at another alignment from the one a normal call gets. So a
# record is used in place only where its address is so aligned (a mapping starts on a page: its offset in the
# file), and copied to a fresh allocation otherwise.
ALIGNMENT = 64


def _aligned(offset: int) -> bool:
    return offset % ALIGNMENT == 0


class FileView(View):
    """An open file, mapped copy-on-write where the system can map it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        # One descriptor for everything (the mapping, reads of bytes, reading ahead): what is read is the
        # file that was opened, whatever the path names later. Bytes are read through it, tensors through
        # the mapping: a read of a record's header through the mapping would map the pages around it too.
        self._descriptor = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        # The reader, if any, is stopped before the descriptor it reads is closed (also when collected).
        self._reader: list[read_ahead.ReadingAhead] = []
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

        The reading starts while the program is still being built (that work is
        all CPU) and stays at most a window ahead of the furthest page the program
        has touched (:mod:`trt_inline.isolation.read_ahead`: why, and who reads).
        """
        if self.mapped is None or self.size < read_ahead.READ_AHEAD_FROM or self._reader or not self._closed.alive:
            return False
        reading = read_ahead.start(self._descriptor, self.mapped, self.size, release=self.read_only)
        self._reader.append(reading)
        paced = "" if reading.paced else " (not paced: /proc/self/pagemap cannot be read)"
        window = format_size(reading.window)
        if reading.by_parent:
            progress.report(f"pacing the calling process's reading ahead of the program{paced}")
        else:
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
        if self.mapped is not None and nbytes and _aligned(offset):
            element = torch.empty((), dtype=dtype).element_size()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a read-only mapping: torch warns that writing is undefined
                return torch.frombuffer(self.mapped, dtype=dtype, count=nbytes // element, offset=offset)
        return _from_bytes(self.read(offset, nbytes), dtype)


def _release(descriptor: int, reader: list[read_ahead.ReadingAhead]) -> None:
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
    """A tensor owning a copy of ``data`` in a fresh allocation, aligned as torch's loader aligns one (a range that
    cannot be mapped, or is not so aligned in the file)."""
    element = torch.empty((), dtype=dtype).element_size()
    tensor = torch.empty(len(data) // element, dtype=dtype)
    if data:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (read-only bytes: only read here, into the fresh allocation)
            tensor.view(torch.uint8).copy_(torch.frombuffer(data, dtype=torch.uint8))
    return tensor
