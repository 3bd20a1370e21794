"""What a child may run: one job per request type, declared beside the function that runs it.

::

    @job(InspectRequest, response=InspectResponse)          # where the verb is defined
    def inspect_job(request: InspectRequest, tensors) -> InspectResponse: ...

    run_isolated(InspectRequest.of(path, trust), ...)        # the parent: the request says which job
        -> the envelope names inspect_job by its own module and name
        -> the child imports that module, finds the function registered as a job by it (nothing else runs),
           decodes the request strictly as InspectRequest, runs it
        -> the parent decodes the answer as InspectResponse

The table is built from the request classes as their modules are imported: the parent imported the
module of every request it builds, and the child imports the one module its envelope names. No job is
named by a string a reader would have to look up; a function that is not registered is refused in the
child before it is called.

A response is read strictly by its type: a ``from_dict`` classmethod where it has one
(:meth:`~trt_inline.verify.report.VerifyReport.from_dict`), :func:`trt_inline.codec.decode`
otherwise; ``response=None`` hands back plain data (a probe's).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from trt_inline.codec import MessageError, decode
from trt_inline.errors import IsolationError, first_line

__all__ = ["Job", "job", "job_at", "job_of"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Job:
    """A job: the request type it runs on, the type its answer is read as (None: plain data), the function."""

    request: type
    response: type | None
    run: Callable[[Any, Any], Any]

    @property
    def address(self) -> tuple[str, str]:
        """What the envelope names: the function's module and name, as the function itself says them."""
        return self.run.__module__, self.run.__qualname__

    def decode_request(self, arguments: Any) -> Any:
        """The request as the child reads it: strictly, as the declared dataclass."""
        return decode(self.request, arguments)

    def decode_response(self, value: Any, where: str) -> Any:
        """The child's answer read strictly as the declared response; one :class:`IsolationError` naming ``where``
        for anything else."""
        if self.response is None:
            return value
        from_dict = getattr(self.response, "from_dict", None)
        if from_dict is not None:
            try:
                return from_dict(value)
            except (KeyError, TypeError, ValueError) as exc:
                why = first_line(exc)
                raise IsolationError(f"{where}: the child process gave a malformed report ({why})") from None
        try:
            return decode(self.response, value)
        except MessageError as exc:
            raise IsolationError(f"{where}: the child process handed back a malformed answer ({exc})") from None


_BY_REQUEST: dict[type, Job] = {}


def job(request: type, *, response: type | None = None) -> Callable[[F], F]:
    """Register the decorated function as the job a child runs on a ``request`` (a dataclass)."""
    if not (dataclasses.is_dataclass(request) and isinstance(request, type)):
        raise TypeError(f"a job's request is a dataclass, not {request!r}")

    def register(function: F) -> F:
        known = _BY_REQUEST.get(request)
        if known is not None and known.address != (function.__module__, function.__qualname__):
            raise TypeError(f"{request.__qualname__} already has a job: {'.'.join(known.address)}")
        _BY_REQUEST[request] = Job(request, response, function)
        return function

    return register


def job_of(request: Any) -> Job:
    """The job that runs ``request`` (the parent's side)."""
    found = _BY_REQUEST.get(type(request))
    if found is None:
        raise TypeError(f"no child job runs a {type(request).__qualname__}: declare one with @isolation.job")
    return found


def job_at(module_name: str, name: str) -> Job:
    """The job the envelope names (the child's side): its module imported, and the function found there only if
    importing it registered that function as a job."""
    function = getattr(importlib.import_module(module_name), name, None)
    for known in _BY_REQUEST.values():
        if known.run is function:
            return known
    raise IsolationError(f"{module_name}.{name} is not a job a child runs")
