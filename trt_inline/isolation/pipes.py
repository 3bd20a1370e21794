"""The pipes between the parent and a child: the request in, the report, progress lines and read-ahead records out.

A thread of the parent writes the request (the child reads it while the parent
supervises); the loop that supervises the child (:func:`trt_inline.isolation.process.supervise`)
drains the other pipes as it waits, so that a child that writes much never
blocks; a report past its cap is cut and marked, never read whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
from typing import TYPE_CHECKING

from trt_inline import progress
from trt_inline.errors import (
    decoded_text,
)
from trt_inline.isolation.read_ahead import FeedReader

if TYPE_CHECKING:
    from trt_inline.distributed.relay import RelayServer


POLL_SECONDS = 0.02


# What the parent reads back of the child's report: a report is a few lines per output and problem,
# plus the outputs themselves where the caller asked to save them.
MAX_RESULT_BYTES = 256 << 20


MAX_REPORT_BYTES = 128 << 20  # of which the JSON report (the rest: tensors handed back, read by the strict reader)


RESULT_FD = 3


PROGRESS_FD = 4


_MAX_PROGRESS_LINE = 8192


class Pipes:
    """The request pipe (written by a thread: the child reads it while the parent supervises), the result pipe,
    the progress pipe and the read-ahead feed (:class:`~trt_inline.isolation.read_ahead.Feed`).

    Each descriptor is closed once (a number closed twice may by then be another file's).
    """

    def __init__(
        self, message: bytes, where: str, relay: RelayServer | None = None, feed: FeedReader | None = None
    ) -> None:
        self.request_read, self.request_write = os.pipe()
        self.result_read, self.result_write = os.pipe()
        self.progress_read, self.progress_write = os.pipe()
        self.feed_read, self.feed_write = os.pipe()
        self.feed = feed
        self.relay = relay
        self.call_read, self.call_write = os.pipe() if relay is not None else (-1, -1)
        self.reply_read, self.reply_write = os.pipe() if relay is not None else (-1, -1)
        if relay is not None:
            os.set_blocking(self.reply_write, False)
        self.message = message
        self.where = where
        self.result = bytearray()
        self.overflow = False
        self._progress = bytearray()
        self._open = {
            self.request_read, self.request_write, self.result_read, self.result_write, self.progress_read,
            self.progress_write, self.feed_read, self.feed_write, self.call_read, self.call_write, self.reply_read,
            self.reply_write,
        } - {-1}  # fmt: skip
        self._lock = threading.Lock()
        self._writer = threading.Thread(target=self._write, daemon=True)

    def __enter__(self) -> Pipes:
        self._writer.start()
        return self

    def _close(self, descriptor: int) -> None:
        with self._lock:
            if descriptor in self._open:
                self._open.discard(descriptor)
                with contextlib.suppress(OSError):
                    os.close(descriptor)

    def _write(self) -> None:
        with contextlib.suppress(OSError):  # the child died before reading all of it
            view = memoryview(self.message)
            while view:
                view = view[os.write(self.request_write, view[: 1 << 20]) :]
        self._close(self.request_write)

    def child_ends(self) -> tuple[int, int, int, int]:
        """The ends the child keeps (request, result, progress, feed); the parent closes its copies once it has them."""
        return self.request_read, self.result_write, self.progress_write, self.feed_write

    def relay_ends(self) -> tuple[int, int]:
        """The ends a rank-set child keeps: it writes its calls to the first and reads the replies from the second."""
        return self.call_write, self.reply_read

    def handed_over(self) -> None:
        self._close(self.request_read)
        self._close(self.result_write)
        self._close(self.progress_write)
        self._close(self.feed_write)
        self._close(self.call_write)
        self._close(self.reply_read)

    def _take(self, chunk: bytes) -> None:
        if len(self.result) + len(chunk) > MAX_RESULT_BYTES:
            self.overflow = True
        else:
            self.result += chunk

    def drain(self, timeout: float) -> None:
        """Read what the child has written of its result and progress, waiting at most ``timeout`` seconds.

        A rank-set child's calls are read, and their replies written, here too,
        never blocking: the caller checks the limits between two drains.
        """
        relay = self.relay
        watched = [self.result_read] + [end for end in (self.progress_read, self.feed_read) if end in self._open]
        if relay is not None and relay.wants_input() and self.call_read in self._open:
            watched.append(self.call_read)
        replying = relay is not None and relay.wants_output() and self.reply_write in self._open
        ready, _, _ = select.select(watched, [self.reply_write] if replying else [], [], timeout)
        if self.result_read in ready:
            self._take(os.read(self.result_read, 1 << 20))
        if self.progress_read in ready:
            self._progress_lines(os.read(self.progress_read, 1 << 16))
        if self.feed_read in ready:
            self._feed_records(os.read(self.feed_read, 1 << 16))
        if relay is None:
            return
        if self.call_read in ready:
            relay.read_from(self.call_read)
        relay.pump()
        if relay.wants_output() and self.reply_write in self._open:
            try:
                relay.write_to(self.reply_write)
            except OSError:  # the child is gone: its outcome says so
                self._close(self.reply_write)

    def _progress_lines(self, chunk: bytes) -> None:
        """Report again each line of progress the child sent: untrusted, so escaped and cut (never a crash)."""
        if not chunk:
            self._close(self.progress_read)
            return
        self._progress += chunk
        while b"\n" in self._progress:
            line, _, rest = bytes(self._progress).partition(b"\n")
            self._progress = bytearray(rest)
            try:
                message, step = json.loads(line)
                counted = (int(step[0]), int(step[1])) if step else None
            except (ValueError, TypeError, IndexError):
                continue
            progress.report(f"{self.where}: {decoded_text(str(message), 400)}", counted)
        if len(self._progress) > _MAX_PROGRESS_LINE:
            self._progress.clear()

    def _feed_records(self, chunk: bytes) -> None:
        """Move the reading ahead as the child says (untrusted: see FeedReader.take)."""
        if not chunk:
            self._close(self.feed_read)
        elif self.feed is not None:
            self.feed.take(chunk)

    def finish(self) -> None:
        """Read the rest once the child has ended (its write end is closed: EOF comes)."""
        while not self.overflow:
            ready, _, _ = select.select([self.result_read], [], [], 1.0)
            if not ready:
                return  # something the child left holds the pipe open: what came is what there is
            chunk = os.read(self.result_read, 1 << 20)
            if not chunk:
                return
            self._take(chunk)

    def __exit__(self, *exc: object) -> None:
        self.handed_over()
        self._close(self.result_read)
        self._close(self.progress_read)
        self._close(self.feed_read)
        self._close(self.call_read)
        self._close(self.reply_write)
        self._close(self.request_write)  # unblocks the writer if the child never read
        self._writer.join(timeout=5)
