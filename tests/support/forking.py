"""The loop of the tests' forking interpreter (``conftest.run_forked``) and what each of its children does.

That interpreter is started as the package starts the one its sandboxed children are forked from
(``isolation.interpreter.start_interpreter``: ``python -I``, a session of its own, one end of a UNIX socket),
serving this module rather than ``trt_inline.isolation.zygote``; its loop is the package's
(``isolation.interpreter.fork_per_job``: a job, a child forked, ``pid N``, then ``exit STATUS MAXRSS``). It has
imported this module, the standard library modules of that loop, torch and the modules it was given, and nothing of
trt-inline: a child runs a request's code as a new ``python -c CODE ARGS`` would after those imports.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import NoReturn

from trt_inline.isolation.interpreter import fork_per_job


def serve(channel_fd: int, *preload: str) -> None:
    """The interpreter's loop: what ``python -c`` takes from its environment and ``-I`` ignored (``sys.path``: the
    current folder, then ``PYTHONPATH``, before the worker's path; ``PYTHONDONTWRITEBYTECODE``), torch and
    ``preload`` imported, then a child per request (:func:`run`)."""
    sys.path[:0] = ["", *(entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry)]
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    import torch  # noqa: F401

    for name in preload:
        importlib.import_module(name)
    sys.stdout.flush()  # what the imports printed is the interpreter's own, not its children's
    sys.stderr.flush()
    fork_per_job(channel_fd, run)


def run(request_file: str, descriptors: list[int]) -> NoReturn:
    """In a forked child: the request saved in ``request_file`` (its code, arguments, ``path``, output files and
    folder) run as ``python -c`` runs code, then the process's end with the exit status that would give."""
    with open(request_file) as file:
        request = json.load(file)
    os.dup2(os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
    if request["stderr"] is None:
        os.dup2(1, 2)
    else:
        os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
    os.chdir(request["cwd"])
    sys.path[:0] = request["path"]
    exit_as_python_c(request["code"], request["argv"])


def exit_as_python_c(code: str, argv: list[str], filename: str = "<string>") -> NoReturn:
    """``code`` run as ``python -c code argv`` runs it, then this process's end with the exit status that gives
    (``sys.exit(None)`` 0, ``sys.exit("text")`` the text on stderr and 1, an exception its traceback and 1)."""
    sys.argv = ["-c", *argv]
    status = 0
    try:
        exec(compile(code, filename, "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
