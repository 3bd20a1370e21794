"""The child's side: read the request, enter the sandbox and the limits, run the job, report.

The envelope names the job by its module and function; only a function that
module registered as a job runs (:mod:`trt_inline.isolation.jobs`). Its request is
decoded strictly into the dataclass the job declares (:mod:`trt_inline.codec`),
and a response it returns as a dataclass is encoded for the parent to decode the
same way.

Everything this module does after the sandbox is entered runs next to an
untrusted file: what it reports is checked again by the parent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trt_inline import progress
from trt_inline.codec import decode, encode
from trt_inline.errors import (
    TrtInlineError,
    bounded_strings,
    first_line,
)
from trt_inline.formats import format_size
from trt_inline.isolation.envelope import Answer, Envelope
from trt_inline.isolation.jobs import job, job_at
from trt_inline.isolation.limits import (
    MemorySampler,
    is_allocation_failure,
    own_address_space,
    own_resident,
    own_status,
)
from trt_inline.isolation.pipes import PROGRESS_FD, RESULT_FD
from trt_inline.isolation.process import ADDRESS_SPACE_LIMITED


def _read_request() -> tuple[Envelope, bytes]:
    data = bytearray()
    while chunk := os.read(0, 1 << 20):
        data += chunk
    header, _, tensors = bytes(data).partition(b"\n")
    return decode(Envelope, json.loads(header)), tensors


def child_main(folder: str) -> None:
    """Entry point of the child: request, sandbox and limits, the job, its answer on the result pipe. Never returns."""
    work = Path(folder)
    result_fd = int(os.environ.get("TRT_INLINE_RESULT_FD", RESULT_FD))
    progress_fd = int(os.environ.get("TRT_INLINE_PROGRESS_FD", PROGRESS_FD))
    envelope: Envelope | None = None
    tensors_out = b""

    def send_progress(message: str, step: tuple[int, int] | None) -> None:
        with contextlib.suppress(OSError):
            os.write(progress_fd, json.dumps([message, step]).encode() + b"\n")

    try:
        envelope, tensors = _read_request()
        with progress.listening(send_progress):
            answer, tensors_out = _child_job(work, envelope, tensors)
        answer = dataclasses.replace(answer, peak_rss=own_status("VmHWM"))
    except MemoryError:
        answer = _memory_error(envelope)
    except RecursionError:
        answer = Answer(error="VerifyInputError", message="nested too deeply to be read")
    except Exception as exc:
        if is_allocation_failure(exc):
            answer = _memory_error(envelope)
        else:
            if envelope is not None and envelope.debug:
                traceback.print_exc()
            kind = type(exc).__name__ if isinstance(exc, TrtInlineError) else "VerifyInputError"
            message = first_line(exc) if isinstance(exc, TrtInlineError) else f"{type(exc).__name__}: {first_line(exc)}"
            answer = Answer(error=kind, message=message)
    try:
        with open(result_fd, "wb", closefd=False) as out:
            out.write(json.dumps(encode(answer)).encode() + b"\n" + tensors_out)
    except OSError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_IN_CHILD = [False]


def in_child() -> bool:
    """Whether this process is a child running a job (a process of its own, ended with the job: what it registers
    with torch outlives nothing of the caller's)."""
    return _IN_CHILD[0]


def _child_job(work: Path, envelope: Envelope, payload: bytes) -> tuple[Answer, bytes]:
    """The job run inside the sandbox and the limits: its answer (but for the peak, measured once it has ended) and
    the tensors it hands back."""
    import resource

    import torch

    _IN_CHILD[0] = True

    from trt_inline.isolation import sandbox as sandbox_walls

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    job = job_at(*envelope.job)  # (only a function its module registered as a job runs)
    arguments = job.decode_request(envelope.arguments)
    tensors = torch.load(io.BytesIO(payload), weights_only=True)
    from trt_inline import compat

    applied = None
    # What loading a program imports, imported now: nothing is imported in the sandbox that could be before.
    compat.import_loaders()
    # Whether CUDA may be used, asked without initialising it: torch refuses CUDA in a process forked after
    # CUDA was initialised, and entering the sandbox forks (its PID namespace).
    cuda = compat.cuda_built() and sandbox_walls.cuda_devices_visible()
    if envelope.native_code:
        compat.prepare_package_loading(cuda)
    feed = envelope.read_ahead
    if feed is not None:  # the parent reads this file ahead: the child says how far
        from trt_inline.isolation import read_ahead

        with contextlib.suppress(OSError, KeyError, ValueError):
            read_ahead.feed_parent(int(os.environ["TRT_INLINE_FEED_FD"]), feed.identity, feed.window)
    if envelope.sandbox:
        readable = envelope.files
        if envelope.imports:
            readable += tuple(entry for entry in sys.path if os.path.isabs(entry) and os.path.isdir(entry))
        # Native code the user allowed may bring a loader that writes outside its folder (torch 2.8's: /tmp).
        writable = compat.aoti_loader_folders() if envelope.native_code else ()
        policy = sandbox_walls.Policy(work, readable, writable, devices=cuda, namespaces=envelope.namespaces)
        applied = sandbox_walls.enter(policy).describe()
    base_rss = own_resident()
    if cuda:
        # The CUDA driver reserves address space far beyond what it uses: the parent watches RSS instead.
        (work / "rss_limit").write_text(str(own_resident() + envelope.memory))
    else:
        limit = own_address_space() + envelope.memory + envelope.mapped
        (work / ADDRESS_SPACE_LIMITED).touch()
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with MemorySampler() as sampler:
        value = job.run(arguments, tensors)
    peak_anonymous, peak_file = sampler.peaks()
    returned = b""
    if isinstance(value, tuple):
        value, extra = value
        buffer = io.BytesIO()
        torch.save(extra, buffer)
        returned = buffer.getvalue()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = encode(value)  # (a response: the parent decodes it strictly, :mod:`trt_inline.codec`)
    # Strings from the file leave the child escaped and cut (the parent does it again: it trusts nothing here).
    answer = Answer(bounded_strings(value), sandbox=applied, base_rss=base_rss, peak_anonymous=peak_anonymous,
                    peak_file=peak_file)  # fmt: skip
    return answer, returned


@dataclass(frozen=True)
class SandboxRequest:
    """What a ``sandbox`` child (``trt-inline doctor``) is sent: nothing; it reports the walls it entered."""


@dataclass(frozen=True)
class SandboxResponse:
    """What a ``sandbox`` child hands back: its process id, and whether CUDA works inside the walls (None: this
    machine has no NVIDIA device; else ``works (...)`` or ``FAILS: ...``)."""

    pid: int
    cuda: str | None = None


@job(SandboxRequest, response=SandboxResponse)
def sandbox_job(request: SandboxRequest, tensors: Any) -> SandboxResponse:
    """What the sandbox of a child set up (``trt-inline doctor``): the layers are in the result itself; and
    whether CUDA starts and computes inside it, where this machine has NVIDIA devices."""
    from trt_inline import compat
    from trt_inline.isolation import sandbox as sandbox_walls

    if not (compat.cuda_built() and sandbox_walls.cuda_devices_visible()):
        return SandboxResponse(os.getpid(), None)
    import torch

    try:
        count = torch.cuda.device_count()
        if not torch.cuda.is_available() or count == 0:
            return SandboxResponse(os.getpid(), "FAILS: torch.cuda.is_available() is False inside the sandbox")
        value = float((torch.ones(64, device="cuda") * 2).sum())
        name = torch.cuda.get_device_name(0)
    except Exception as exc:
        return SandboxResponse(os.getpid(), f"FAILS: {type(exc).__name__}: {first_line(exc)}")
    if value != 128.0:
        return SandboxResponse(os.getpid(), f"FAILS: 64 twos summed to {value} on CUDA")
    return SandboxResponse(os.getpid(), f"works ({count} device{'s' if count > 1 else ''}: {name})")


def _memory_error(envelope: Envelope | None) -> Answer:
    limit = "memory" if envelope is None else format_size(envelope.memory)
    return Answer(error="IsolationError", message=f"ran out of its memory limit of {limit} (--memory-limit raises it)")
