"""Probes for a CUDA machine that need none: what a child does before its sandbox, what the sandbox lets it do.

``record_child_start``: run as a process of its own (``python -c``). It wraps every torch
function that asks the CUDA driver anything (each one starts CUDA, or poisons a later
fork, as ``torch.cuda.is_available()`` does), and ``sandbox.enter``, with recorders, then
starts a child job the way a verify child does (the imports of the interpreter that forks
children, then ``_child_job``) and prints, as JSON, the order in which they were called.
On a CPU build torch answers without asking a driver, but the calls are recorded all the
same: a call made before ``enter`` on this machine is one that breaks a CUDA machine.

``thread_names``: a job for the sandboxed child (registered by the tests): it names a new
thread of its own through ``/proc/self/task/<tid>/comm``, as the CUDA driver does while it
starts, and tries the same on the parent's main thread.
"""

from __future__ import annotations

import functools
import getpass
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trt_inline.isolation import job

# torch functions that ask the CUDA driver (or start CUDA) when CUDA is built in.
_CUDA_CALLS = (
    "is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_name",
    "get_device_properties", "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all",
    "manual_seed", "manual_seed_all", "seed", "initial_seed", "synchronize", "mem_get_info",
)  # fmt: skip


def record_child_start(file: str, allow_native_code: bool) -> None:
    """Print the calls, in order, that starting a child job for ``file`` made: ``["cuda.<name>" | "enter"]``."""
    import torch

    calls: list[str] = []

    def recorded(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return function(*args, **kwargs)

        return wrapper

    for name in _CUDA_CALLS:
        if hasattr(torch.cuda, name):
            setattr(torch.cuda, name, recorded(f"cuda.{name}", getattr(torch.cuda, name)))
    if hasattr(torch._C, "_cuda_getDeviceCount"):
        torch._C._cuda_getDeviceCount = recorded("cuda._cuda_getDeviceCount", torch._C._cuda_getDeviceCount)

    # What the interpreter that forks children imports (isolation.zygote.serve), then one child's start.
    import trt_inline.reference
    import trt_inline.verify  # noqa: F401
    from trt_inline import compat, isolation
    from trt_inline.isolation import inside, interpreter, process, sandbox  # noqa: F401

    compat.import_loaders()
    sandbox.enter = recorded("enter", sandbox.enter)
    work = Path(tempfile.mkdtemp(prefix="trt-inline-probe-"))
    (work / "tmp").mkdir()
    os.environ.update(interpreter.child_environment(work))  # as a child gets them: TMPDIR its own folder, ...
    tempfile.tempdir = None
    from trt_inline.codec import encode
    from trt_inline.commands.inspect import InspectRequest, inspect_job
    from trt_inline.isolation.envelope import Envelope
    from trt_inline.verify.options import Trust

    request = Envelope(
        (inspect_job.__module__, inspect_job.__qualname__),
        encode(InspectRequest.of(file, Trust(allow_native_code=allow_native_code))),
        2 << 30,
        mapped=os.path.getsize(file),
        files=(file,),
        native_code=allow_native_code,
    )
    import io

    payload = io.BytesIO()
    torch.save(None, payload)
    try:
        isolation.inside._child_job(work, request, payload.getvalue())
        outcome = "ran"
    except Exception as exc:  # the job's own error is not what this probe is about: the order of calls is
        outcome = f"{type(exc).__name__}: {exc}"
    sys.stdout.write(json.dumps({"calls": calls, "outcome": outcome}) + "\n")
    sys.stdout.flush()
    os._exit(0)


def thread_names(arguments: dict[str, Any], tensors: Any) -> dict[str, str]:
    """Name a new thread of this process, and the parent's main thread, through procfs; what happened to each."""
    results: dict[str, str] = {}

    def name_self() -> None:
        try:
            _name(f"/proc/self/task/{threading.get_native_id()}/comm", b"cuda-probe")
            results["own thread"] = "SUCCEEDED"
        except OSError as exc:
            results["own thread"] = f"blocked: {exc}"

    thread = threading.Thread(target=name_self)
    thread.start()
    thread.join()
    parent = int(arguments["parent"])
    try:
        import resource

        resource.prlimit(parent, resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))  # no change
        results["parent's limits"] = "SUCCEEDED"
    except OSError as exc:
        results["parent's limits"] = f"blocked: {exc}"
    try:
        _name(f"/proc/{parent}/task/{parent}/comm", b"renamed")
        results["parent's thread"] = "SUCCEEDED"
    except OSError as exc:
        results["parent's thread"] = f"blocked: {exc}"
    return results


def _name(comm: str, name: bytes) -> None:
    """Write a thread's name as the C library's pthread_setname_np does: opened read-write, not truncated."""
    descriptor = os.open(comm, os.O_RDWR)
    try:
        os.write(descriptor, name)
    finally:
        os.close(descriptor)


@dataclass(frozen=True)
class UserNameRequest:
    """Nothing: the probe hands back the user name it sees."""


@job(UserNameRequest)
def user_name(request: UserNameRequest, tensors: Any) -> dict[str, str]:
    """The user name code in the child gets, as torch's cache folder asks for it."""
    try:
        return {"user": getpass.getuser()}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
