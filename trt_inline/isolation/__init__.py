"""Loading and running a file in a sandboxed child process with a time limit and a memory limit.

A file from a stranger can make the native code that loads or runs it crash
(an operator with a memory-safety bug, a package's shared library, a TensorRT
plan), allocate without bound, compute for hours, or, if code from it runs
after all, try to reach what is outside. So ``verify``, ``inspect`` and
``diff`` open files in a child interpreter:

* started isolated (``python -I``: no current directory on ``sys.path``, no
  ``PYTHON*`` variables of the user's shell beyond those listed below), with the
  parent's import path passed explicitly, in a session of its own;
* given only the environment variables that configure Python, torch, threads
  and devices (never the caller's tokens or credentials);
* sandboxed (:mod:`trt_inline.isolation.sandbox`) after its imports and before it reads
  the file: no network, no programs, no new processes, no signals or ptrace to
  other processes, files only from the Python installation, the files named in
  the job, and its own private folder, which nobody else uses;
* with ``RLIMIT_AS`` set to what it uses once torch is imported, plus the
  memory limit, plus the size of the files it may map. Where CUDA is available
  the driver reserves far more address space than it uses, so there the parent
  watches the resident memory of the child's process group instead;
* no core dumps; its folder removed afterwards, and the child and everything
  in its process group killed when the job ends.

==============  ====================================================================
module          concern
==============  ====================================================================
``child``       ``run_isolated``: the parent's side of one job (refusals before any
                child starts, the request, how the child ended, its answer read)
``jobs``        what a child may run: ``@job(Request, response=...)`` registers a job
                beside its function; a request names its job, the child runs only
                registered functions, the answer is read as the declared response
``inside``      the child's side: the request, the sandbox and the limits entered,
                the job run, its report
``envelope``    what every child is sent around its job's request (``Envelope``) and
                answers with around its job's response (``Answer``), read with the one
                decoder of messages
``process``     a child interpreter's process group, supervision against the time and
                memory limits, its end
``interpreter`` a child interpreter's command line and environment, the loop of one that
                forks children, and the one the ``trt-inline`` command starts before it
                imports torch (standard library only: the lowest floor)
``zygote``      one clean interpreter that forks the children (``reusing_interpreter``;
                what its children become: ``serve``)
``pipes``       the request, report, progress and read-ahead pipes (the request written on a
                thread; the others drained by the supervising loop)
``limits``      ``Limits``, sizes, the memory available, this process's own memory
``read_ahead``  reading a mapped file into the page cache ahead of the program, in the
                same process or, for a child, by its parent
``sandbox``     the operating-system walls a child puts around itself (namespaces,
                Landlock, seccomp)
==============  ====================================================================

Its one entry point for the rest of the package is :func:`run_isolated` (with
:class:`Limits`), and :func:`job` declares what it runs; every verb runs its children
through it. It imports nothing from the floors above it (``trt_inline.archive``,
``trt_inline.verify``, the commands): a job registers itself where it is defined, and the
child imports the one module its envelope names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trt_inline.importing import lazy_exports

if TYPE_CHECKING:
    from trt_inline.isolation.child import ChildResult, run_isolated, sandbox_required
    from trt_inline.isolation.inside import SandboxRequest, in_child
    from trt_inline.isolation.jobs import Job, job, job_of
    from trt_inline.isolation.limits import (
        DEFAULT_TIMEOUT,
        Limits,
        MemorySampler,
        available_memory,
        default_memory_limit,
        is_allocation_failure,
        parse_size,
    )
    from trt_inline.isolation.zygote import reusing_interpreter

_WHERE = {
    "trt_inline.isolation.child": ("ChildResult", "run_isolated", "sandbox_required"),
    "trt_inline.isolation.inside": ("SandboxRequest", "in_child"),
    "trt_inline.isolation.jobs": ("Job", "job", "job_of"),
    "trt_inline.isolation.limits": (
        "DEFAULT_TIMEOUT", "Limits", "MemorySampler", "available_memory", "default_memory_limit",
        "is_allocation_failure", "parse_size",
    ),
    "trt_inline.isolation.zygote": ("reusing_interpreter",),
}  # fmt: skip
# Imported on first use: the ``trt-inline`` command imports :mod:`.interpreter` before torch (the rest imports it).
lazy_exports(__name__, {name: f"{module}:{name}" for module, names in _WHERE.items() for name in names})

__all__ = [
    "DEFAULT_TIMEOUT",
    "ChildResult",
    "Job",
    "Limits",
    "SandboxRequest",
    "MemorySampler",
    "available_memory",
    "default_memory_limit",
    "in_child",
    "is_allocation_failure",
    "job",
    "job_of",
    "parse_size",
    "reusing_interpreter",
    "run_isolated",
    "sandbox_required",
]
