"""``run_isolated``: run a job in a sandboxed child process and turn how it ended into a result or one error.

The parent's side: it refuses a job the sandbox or the memory limit cannot
hold before any child starts, sends the request, reads the file ahead of the
child where asked, and turns a killed, crashed or exhausted child into one
:class:`~trt_inline.errors.IsolationError` line that says which limit or which
signal. What a child may run is declared with the job (:mod:`trt_inline.isolation.jobs`); the request
names its job, and the answer is read as the job's declared response.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trt_inline import progress
from trt_inline.codec import MessageError, decode, encode
from trt_inline.errors import (
    IsolationError,
    RankSetError,
    RefusedOperatorError,
    UnsafeArchiveError,
    VerifyInputError,
    first_line,
)
from trt_inline.formats import format_size
from trt_inline.isolation import limits as machine
from trt_inline.isolation.envelope import ANSWER_BOUNDS, Answer, Envelope, ReadAhead
from trt_inline.isolation.jobs import job_of
from trt_inline.isolation.limits import Limits
from trt_inline.isolation.pipes import MAX_REPORT_BYTES, MAX_RESULT_BYTES, Pipes
from trt_inline.isolation.process import Ended, run_fresh, tail
from trt_inline.isolation.read_ahead import READ_AHEAD_FROM, FeedReader, unmappable, window_for
from trt_inline.isolation.zygote import zygote_for_now

if TYPE_CHECKING:
    from trt_inline.distributed.relay import RelayServer


@dataclass(frozen=True)
class ChildResult:
    value: Any  # the job's answer, read as its declared response
    peak_rss: int  # bytes, the child's maximum resident set
    base_rss: int  # bytes, the child's resident set once its imports were done, before the job
    sandbox: str | None  # what the sandbox set up, in words; None: it ran without one
    tensors: bytes  # what the job returned besides its JSON value (torch.save bytes; untrusted)
    # The job's peak anonymous memory (its own: heap, copies) and file-backed memory (mapped weights),
    # sampled while it ran, above what it held once its imports were done; 0 where not measured.
    peak_anonymous: int = 0
    peak_file: int = 0


def _fits(files: tuple[str, ...], limits: Limits, where: str) -> None:
    """Refuse, before anything is read, a file that must be read into memory (it cannot be mapped) past the limit."""
    for file in files:
        size = os.path.getsize(file) if os.path.isfile(file) else 0
        why_not = unmappable(file) if size > limits.memory else None
        if why_not is not None:
            raise IsolationError(
                f"{where}: {file} cannot be mapped here ({why_not}), so opening it reads its {format_size(size)} into "
                f"memory, past the memory limit of {format_size(limits.memory)} (--memory-limit raises it; "
                f"{format_size(machine.available_memory())} are available)"
            )


def sandbox_required(sandbox: bool) -> None:
    """Refuse, before any child starts, to open an untrusted file where the sandbox cannot be set up."""
    if not sandbox:
        return
    from trt_inline.isolation import sandbox as walls

    missing = walls.status().missing
    if missing:
        raise IsolationError(
            f"the OS sandbox that opens files from strangers cannot be set up here: this system lacks "
            f"{' and '.join(missing)}; --no-sandbox (sandbox=False) opens the file without it, with the child "
            "process's limits only"
        )


def run_isolated(
    request: Any,
    tensors: Any,
    limits: Limits,
    *,
    where: str,
    files: tuple[str, ...] = (),
    sandbox: bool = True,
    debug: bool = False,
    namespaces: bool = True,
    relay: RelayServer | None = None,
    read_ahead: str | None = None,
) -> ChildResult:
    """Run the job of ``request`` in a sandboxed child process under ``limits``; its answer, read as the job's
    declared response (:mod:`trt_inline.isolation.jobs`), or its error re-raised here.

    ``request``: a dataclass a job was registered for (sent as :func:`trt_inline.codec.encode`
    makes it, and decoded here first as the child decodes it: a request that is not what it
    declares is refused before any child starts).
    ``files``: what the job opens (readable in the sandbox, and mapped within its
    address space). ``tensors`` go through ``torch.save`` into the request.
    ``sandbox=False`` runs the child without the OS sandbox (limits still hold).
    What the child may do beyond reading its files is what the request's ``trust`` allows (a
    request without one: nothing), so no caller gives a child more than its request says:
    ``allow_pickle``, the sandbox lets it read every folder on the import path (an unpickler
    the user allowed imports modules by name); ``allow_native_code``, the job may load native
    code the user allowed (a package's library, TensorRT engines).
    ``namespaces=False`` leaves the namespace layer out (tests of the other walls).
    ``relay``: the child verifies one rank of a rank set; its collectives come
    over a second pair of pipes and ``relay`` answers them (:mod:`trt_inline.distributed.relay`).
    ``read_ahead``: one of ``files`` whose weights the job reads: this process
    reads it into the page cache from now on, paced by the child (:mod:`trt_inline.isolation.read_ahead`).
    Raises :class:`IsolationError` naming ``where`` when the child is stopped.
    """
    import torch

    job = job_of(request)
    sent = _sendable(request, where)
    # (what the child may do is what its request's trust allows: a request without one, nothing)
    trust = getattr(request, "trust", None)
    imports = bool(getattr(trust, "allow_pickle", False))
    native_code = bool(getattr(trust, "allow_native_code", False))
    sandbox_required(sandbox)
    _fits(files, limits, where)
    progress.report(f"{where}: starting a {'sandboxed ' if sandbox else ''}child process to open it")
    payload = io.BytesIO()
    torch.save(tensors, payload)
    envelope = Envelope(
        job.address, sent, limits.memory,
        mapped=sum(os.path.getsize(f) for f in files if os.path.isfile(f)),
        files=tuple(os.path.abspath(f) for f in files), native_code=native_code, sandbox=sandbox, imports=imports,
        namespaces=namespaces, debug=debug,
    )  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="trt-inline-"))
    feed = None
    try:
        feed = _feed_reader(read_ahead)  # reading from now on: the child takes seconds to start
        if feed is not None:
            envelope = dataclasses.replace(envelope, read_ahead=ReadAhead(feed.identity, feed.window))
            progress.report(f"{where}: reading it ahead of the child, at most {format_size(feed.window)} ahead")
        message = json.dumps(encode(envelope)).encode() + b"\n" + payload.getvalue()
        # Its temporary files (torch's own, a package's extracted library) stay in its own folder.
        (work / "tmp").mkdir()
        with Pipes(message, where, relay, feed) as pipes:
            zygote = zygote_for_now() if relay is None else None
            if zygote is not None:
                outcome = zygote.run(work, pipes, limits)
            else:
                outcome = run_fresh(work, pipes, limits)
        if debug:
            sys.stderr.write(tail(work / "stderr.txt"))
        result = _outcome(outcome, limits, where, files)
        return dataclasses.replace(result, value=job.decode_response(result.value, where))
    finally:
        try:
            if feed is not None:
                feed.stop()
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _sendable(request: Any, where: str) -> Any:
    """A job's request as plain data: encoded, and refused unless it decodes as the child will decode it."""
    try:
        sent = encode(request)
        decode(type(request), sent)
    except MessageError as exc:
        raise VerifyInputError(f"{where}: a request the child could not read ({exc})") from None
    return sent


def _feed_reader(path: str | None) -> FeedReader | None:
    """A reader of ``path`` for the child to pace, already reading its first window; None for a small file."""
    if path is None:
        return None
    try:
        size = os.path.getsize(path)
        if size < READ_AHEAD_FROM:
            return None
        return FeedReader(path, window_for(size))
    except OSError:
        return None  # the child says what is wrong with the file


def _outcome(ended: Ended, limits: Limits, where: str, files: tuple[str, ...] = ()) -> ChildResult:
    if ended.stopped == "time":
        raise IsolationError(f"{where}: stopped after {limits.timeout:g} s, the time limit (--timeout raises it)")
    if ended.stopped == "memory":
        raise IsolationError(
            f"{where}: stopped past {format_size(limits.memory)} of memory, the memory limit (--memory-limit raises it)"
        )
    status = ended.status
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        raise IsolationError(
            f"{where}: the child process loading it died on {name} (a crash in native code); "
            "nothing of it ran in this process"
        )
    if ended.overflow:
        raise IsolationError(f"{where}: the child process's report is larger than {format_size(MAX_RESULT_BYTES)}")
    header, _, tensors = ended.result.partition(b"\n")
    # Parsing JSON holds 10 (a report) to 21 (nested empty lists) times the bytes parsed: a report larger than a
    # sixteenth of the child's own memory limit (16 MiB at least, 128 MiB at most) is refused unread, so that the
    # parent parsing it stays near the limit the child ran under.
    header_limit = min(MAX_REPORT_BYTES, max(16 << 20, limits.memory // 16))
    if len(header) > header_limit:
        raises = "; --memory-limit raises it" if header_limit < MAX_REPORT_BYTES else ""
        raise IsolationError(
            f"{where}: the child process's report is {format_size(len(header))}, more than {format_size(header_limit)} "
            f"(a sixteenth of its memory limit, at least 16 MiB and at most 128 MiB{raises})"
        )
    try:
        result = json.loads(header)
        if not isinstance(result, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError, RecursionError):
        code = os.waitstatus_to_exitcode(status)
        if ended.limited:
            # Native code that cannot allocate under the limit (a thread's stack, a buffer) often exits so,
            # before Python can say MemoryError.
            raise IsolationError(
                f"{where}: the child process loading it exited with status {code} and no result while running "
                f"under its memory limit of {format_size(limits.memory)}: it most likely ran out of it (native "
                "code that cannot allocate ends so); --memory-limit raises it"
            ) from None
        raise IsolationError(f"{where}: the child process loading it exited with status {code} and no result") from None
    try:
        answer = decode(Answer, result, ANSWER_BOUNDS)
    except MessageError as exc:
        raise IsolationError(f"{where}: the child process handed back a malformed answer ({exc})") from None
    if answer.error is not None:
        kinds = (RefusedOperatorError, UnsafeArchiveError, IsolationError, VerifyInputError, RankSetError)
        kind = {cls.__name__: cls for cls in kinds}.get(answer.error, VerifyInputError)
        message = first_line(Exception(answer.message))
        # The child's own errors name the file (one of the job's: diff's second); an unexpected error may not.
        named = message.startswith((where, *(f"{file}: " for file in files)))
        raise kind(message if named else f"{where}: {message}")
    # The job process's own peak: the process that waits for it (namespaces) holds the whole
    # interpreter too, and the wait status's figure is the larger of the two.
    return ChildResult(
        answer.value,
        answer.peak_rss if answer.peak_rss > 0 else ended.peak_rss,
        answer.base_rss,
        None if answer.sandbox is None else first_line(Exception(answer.sandbox)),
        tensors,
        answer.peak_anonymous,
        answer.peak_file,
    )
