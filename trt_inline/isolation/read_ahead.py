"""Reading a mapped file into the page cache ahead of the program that uses it.

A program reads its weights through the mapping, page fault by page fault:
about half the disk's rate, measured. So a file is read ahead in large
sequential reads while the program is built and run, at most a window (half the
memory available) ahead of the furthest page the program has touched: of a file
larger than memory, reading further ahead pushes out pages the program has not
reached yet, and they are read twice. Two parts::

    Pacer (where the program maps the file)          SequentialReader (a thread)
      /proc/self/pagemap -> the program's frontier     preadv into one buffer,
      pages well behind it let go                      from 0 up to the target
      target = frontier + window  ------------------>  (chunks of 16-256 MiB)

In one process the pacer moves its own reader. A child that verifies a file
hands the reading to its parent instead (:class:`Feed`: 16-byte records on a
pipe): the parent starts reading before the child has even imported torch, and a
thread of another process never waits for the child's interpreter lock. Why that
matters: between two reads a thread waits for the lock, which a busy program
(building 7,000 tensors of a program is pure Python) holds for a switch interval
at a time. Measured beside a busy thread, 8 GiB of a file: 16 MiB reads 0.4-0.95
GB/s, 256 MiB reads 1.6-1.8 GB/s, another process's 16 MiB reads 1.2-1.5 GB/s.

Nothing read here is interpreted: the bytes go to a buffer that is overwritten.
What a child sends on the feed is untrusted too: it can move the parent's
reading within the file the parent chose, and nothing else.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import struct
import threading
import time
import warnings
from collections.abc import Callable

import torch

from trt_inline.isolation import limits

__all__ = ["READ_AHEAD_FROM", "Feed", "Pacer", "ReadingAhead", "SequentialReader", "chunk_for", "start", "unmappable"]

# Files smaller than this are not read ahead: their pages come in as fast either way.
READ_AHEAD_FROM = 64 << 20
_RECORD = struct.Struct("<QQ")  # a feed record: (run, target)


def chunk_for(size: int) -> int:
    """The size of one read of a file of ``size`` bytes: 1/128 of it, from 16 MiB to 256 MiB (whole MiB)."""
    return min(256 << 20, max(16 << 20, (size // 128) >> 20 << 20))


def window_for(size: int) -> int:
    """How far ahead of the program to read: half the memory available now, at least four reads.

    (In a sandboxed child /proc/meminfo may be out of reach: then half the machine's memory.)
    """
    available = limits.available_memory() or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(chunk_for(size) * 4, available // 2)


def unmappable(path: str | os.PathLike[str]) -> str | None:
    """Why this system cannot map the file (then its records are read into memory), or None."""
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ):
            return None
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


class SequentialReader:
    """A thread reading a file from its start into the page cache, up to a target that :meth:`move` sets.

    ``owned``: the descriptor is this reader's, closed by its thread when it
    ends (a read under way is never cut off by a close from another thread).
    """

    def __init__(
        self, descriptor: int, size: int, target: int, *, owned: bool = False, chunk: int | None = None
    ) -> None:
        self.descriptor, self.size, self.owned = descriptor, size, owned
        self.chunk = chunk or chunk_for(size)
        self.position = 0  # how far it has read
        self._target = max(0, min(size, target))
        self._restarts = 0
        self._stopped = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="trt-inline-read-ahead", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            if owned:
                os.close(descriptor)
            raise

    def move(self, target: int, *, restart: bool = False) -> None:
        """Read up to ``target`` (from the start again with ``restart``: a new run of the program)."""
        with self._changed:
            if restart:
                self.position, self._restarts = 0, self._restarts + 1
            self._target = max(0, min(self.size, target))
            self._changed.notify()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join()

    def _run(self) -> None:
        try:
            buffer = memoryview(bytearray(self.chunk))
            while True:
                with self._changed:
                    while not self._stopped and self.position >= self._target:
                        self._changed.wait()
                    if self._stopped:
                        return
                    position, restarts = self.position, self._restarts
                    length = min(self.chunk, self._target - position)
                done = os.preadv(self.descriptor, [buffer[:length]], position)
                with self._changed:
                    if not done:  # the file is shorter than it was: nothing more to read
                        self._stopped = True
                        return
                    if self._restarts == restarts:
                        self.position = position + done
        except (OSError, MemoryError):
            return
        finally:
            if self.owned:
                os.close(self.descriptor)


class Pacer:
    """A thread that keeps the reading of a mapped file ``window`` bytes ahead of what the program has touched.

    Where the program is comes from ``/proc/self/pagemap``: a page of the mapping
    is present there once the program has touched it (reads into the page cache
    map nothing). Where pagemap cannot be read, it is not paced: the target is
    the whole file at once. ``move(target)`` moves the reading.
    """

    _PROBE = 4 << 20  # the granularity at which the program's progress is looked up
    _SPAN = 1 << 30  # looked up with one read of pagemap per GiB of the mapping (2 MiB of entries)
    _PERIOD = 0.05
    _LAG = 1 << 30  # how far behind the program's frontier pages are let go (a weight being read is behind it)

    def __init__(
        self, mapped: mmap.mmap, size: int, window: int, move: Callable[[int], None], *, release: bool = False
    ) -> None:
        self.size, self.window = size, window
        self._move = move
        # A file larger than memory (mapped shared and read-only): pages well behind the program are unmapped
        # from it, so that the kernel drops those (read, used) rather than the ones read ahead (not yet used).
        self._mapped = mapped if release else None
        self.released = 0
        self.progress = 0  # the furthest page the program was last seen to have touched
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
        self._thread = threading.Thread(target=self._run, name="trt-inline-read-ahead-pacer", daemon=True)
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

    def _touched(self, start: int, end: int) -> list[bool]:
        """Whether the program has touched the page at each probe ``start, start + _PROBE, ... < end``: one read."""
        assert self._pagemap is not None
        first = (self._base + start) // mmap.PAGESIZE
        pages = (end - start + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        entries = os.pread(self._pagemap, pages * 8, first * 8)
        present = memoryview(entries[: len(entries) // 8 * 8]).cast("Q")[:: self._PROBE // mmap.PAGESIZE]
        return [bool(entry >> 63) for entry in present]

    def _frontier(self, end: int) -> int:
        """How far below ``end`` the program has touched pages: ``progress`` moved up to it.

        Looked up from ``progress`` upwards, stopping at the first untouched probe
        after touched ones. A program that skips a range (a weight it never
        reads) leaves a gap: past one, the whole window is looked through, at
        most once a second.
        """
        whole = time.monotonic() - self._scanned > 1.0
        if whole:
            self._scanned = time.monotonic()
        furthest, start, span = self.progress, self.progress + self._PROBE, self._PROBE * 16
        while start < end:
            stop = min(end, start + span)
            for index, touched in enumerate(self._touched(start, stop)):
                if touched:
                    furthest = start + index * self._PROBE
                elif furthest > self.progress or not whole:
                    return furthest
            start, span = stop, min(span * 2, self._SPAN)  # (the program is usually within the first span)
        return furthest

    def _release_behind(self) -> None:
        """Unmap the pages more than ``_LAG`` behind the program (they stay cached; a later read maps them again).

        Mapped pages are the last the kernel reclaims: left mapped, the pages the
        program has used would outlive the ones read ahead for it, which are then
        dropped and read twice.
        """
        end = (self.progress - self._LAG) // mmap.PAGESIZE * mmap.PAGESIZE
        if self._mapped is None or end - self.released < 64 << 20:
            return
        with contextlib.suppress(OSError, ValueError):
            self._mapped.madvise(mmap.MADV_DONTNEED, self.released, end - self.released)
        self.released = end

    def _run(self) -> None:
        if self._pagemap is None:
            self._move(self.size)  # no way to tell where the program is: not paced
            return
        self._move(min(self.size, self.window))
        with contextlib.suppress(OSError):
            while not self._stop.wait(self._PERIOD):
                progress = self._frontier(min(self.size, self.progress + self.window))
                if progress > self.progress:
                    self.progress = progress
                    self._release_behind()
                    self._move(min(self.size, progress + self.window))


class Feed:
    """The pipe on which a child tells its parent, which reads the child's file ahead, how far to read.

    The parent named the file (its device and inode, as the parent opened it) and
    the window in the child's request; the child paces the reading of that file
    when it is what the child opened, and writes (run, target) records, never blocking.
    """

    def __init__(self, descriptor: int, identity: tuple[int, int], window: int) -> None:
        self.descriptor, self.identity, self.window = descriptor, identity, window
        self._runs = 0
        os.set_blocking(descriptor, False)

    def serves(self, descriptor: int) -> bool:
        status = os.fstat(descriptor)
        return (status.st_dev, status.st_ino) == self.identity

    def mover(self) -> Callable[[int], None]:
        """What moves the parent's reading for one run of the program (the first continues its reading from 0)."""
        self._runs += 1
        run = self._runs

        def move(target: int) -> None:
            with contextlib.suppress(OSError):  # a full pipe drops a record: a later one says more
                os.write(self.descriptor, _RECORD.pack(run, target))

        return move


class FeedReader:
    """The parent's side of a :class:`Feed`: a reader of a regular file, moved by the child's records.

    Before the first record it reads the first window. Records are untrusted:
    a target is clamped to the file, a run older than the current one ignored,
    and of what one read of the pipe brings only the last record counts.
    Raises OSError where ``path`` is not a regular file it can open (never
    waiting on a FIFO put in its place).
    """

    # Not competing with a busy interpreter for its lock, 64 MiB reads get the disk's rate (measured: another
    # process's 64 MiB reads 1.7-1.9 GB/s); a smaller buffer stops sooner.
    _CHUNK = 64 << 20

    def __init__(self, path: str, window: int) -> None:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            status = os.fstat(descriptor)
            if not stat.S_ISREG(status.st_mode):
                raise OSError(f"{path}: not a regular file")
        except OSError:
            os.close(descriptor)
            raise
        self.identity, self.window = (status.st_dev, status.st_ino), window
        self._run = 1
        self._pending = b""
        self.reader = SequentialReader(
            descriptor, status.st_size, window, owned=True, chunk=min(self._CHUNK, chunk_for(status.st_size))
        )

    def take(self, data: bytes) -> None:
        data = self._pending + data
        whole = len(data) // _RECORD.size * _RECORD.size
        self._pending = data[whole:]
        latest: int | None = None
        restart = False
        for run, target in _RECORD.iter_unpack(data[:whole]):
            if run >= self._run:
                restart, self._run, latest = restart or run > self._run, run, target
        if latest is not None:
            self.reader.move(latest, restart=restart)

    def stop(self) -> None:
        self.reader.stop()


class ReadingAhead:
    """A mapped file read ahead of the program: its pacer, and its reader where this process reads."""

    def __init__(self, pacer: Pacer, reader: SequentialReader | None) -> None:
        self.pacer, self.reader = pacer, reader

    @property
    def window(self) -> int:
        return self.pacer.window

    @property
    def paced(self) -> bool:
        return self.pacer.paced

    @property
    def position(self) -> int:
        """How far this process has read (0 where the parent reads)."""
        return self.reader.position if self.reader is not None else 0

    @property
    def by_parent(self) -> bool:
        return self.reader is None

    def stop(self) -> None:
        self.pacer.stop()
        if self.reader is not None:
            self.reader.stop()


# The feed to the parent, in a child whose parent reads its file ahead (set once, by the child's entry point).
_feed: Feed | None = None


def feed_parent(descriptor: int, identity: tuple[int, int], window: int) -> None:
    """In a child: the parent reads the file ``identity`` (device, inode) ``window`` bytes ahead of the program,
    as told on ``descriptor``."""
    global _feed
    _feed = Feed(descriptor, identity, window)


def start(descriptor: int, mapped: mmap.mmap, size: int, *, release: bool) -> ReadingAhead:
    """Read the file open as ``descriptor`` and mapped as ``mapped`` ahead of the program, from now on.

    Its parent reads it where it named this file (:func:`feed_parent`); else a
    thread of this process does.
    """
    if _feed is not None and _feed.serves(descriptor):
        return ReadingAhead(Pacer(mapped, size, _feed.window, _feed.mover(), release=release), None)
    reader = SequentialReader(descriptor, size, 0)
    return ReadingAhead(Pacer(mapped, size, window_for(size), reader.move, release=release), reader)
