"""``trt-inline check PATH``: what a file's TensorRT engines need, checked against this machine or a described one
(``--target``); ``inspect`` shows the same needs (:func:`engine_lines`).

The engine infos are read in the sandboxed child, as every file is
(:func:`needs_job`: :mod:`trt_inline.archive.engine_info`, nothing
deserialized), handed back as data and read strictly here
(:class:`NeedsResponse`, within the bounds
:class:`~trt_inline.engine_fields.EngineInfo` declares); the checks
(:mod:`trt_inline.deployment`) run in this process, against this machine or a
described one.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

from trt_inline.codec import wire
from trt_inline.commands.arguments import add_flags
from trt_inline.commands.output import print_text
from trt_inline.deployment import Machine, engine_problems
from trt_inline.engine_fields import EngineInfo, releases_of_abi
from trt_inline.formats import format_size
from trt_inline.isolation import job
from trt_inline.verify.options import Isolation, Trust, from_flags

__all__ = ["MAX_ENGINES", "CheckReport", "NeedsRequest", "NeedsResponse", "add_parser", "check_engines", "engine_lines",
           "needs_job", "run"]  # fmt: skip

# The most engine infos a child may hand back.
MAX_ENGINES = 4096


@dataclass(frozen=True)
class NeedsRequest:
    """What a ``needs`` child (``trt-inline check``) is sent: the file, and what it may do (pickles only: it reads
    the engines' infos as data)."""

    path: str
    trust: Trust

    @classmethod
    def of(cls, path: str, allow_pickle: bool) -> NeedsRequest:
        return cls(path, Trust(allow_pickle=allow_pickle))


@dataclass(frozen=True)
class NeedsResponse:
    """What a ``needs`` child hands back: its engines' infos."""

    engines: list[EngineInfo] = field(metadata=wire(max_items=MAX_ENGINES))


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "check",
        help="will its TensorRT engines run on this machine, or on --target? (read as data, nothing deserialized)",
        description="Exit 0: every engine's needs (runtime ABI, platform, GPU compute capability) are met. 1: one "
        "line per engine that would not run. 2: unusable input.",
    )
    parser.add_argument("path")
    add_flags(parser, "check")
    parser.set_defaults(run=run)


@job(NeedsRequest, response=NeedsResponse)
def needs_job(request: NeedsRequest, tensors: Any) -> NeedsResponse:
    """The engine infos of a file, inside the child process (``check``)."""
    from trt_inline.archive.engine_info import read_engine_infos

    _, infos = read_engine_infos(request.path, allow_pickle=request.trust.allow_pickle)
    return NeedsResponse(infos)


def engine_lines(infos: list[EngineInfo]) -> list[str]:
    """``inspect``'s table of what each engine needs: one row per engine, aligned, then its bindings and flags."""
    if not infos:
        return []
    header = ("engine", "runtime ABI (releases)", "built on", "hw-compatible", "platform", "output allocator",
              "multi-device", "plan")  # fmt: skip
    rows = [header]
    for info in infos:
        device = info.device
        found = releases_of_abi(info.abi)
        rows.append((
            info.where,
            f"{info.abi} ({found[0]}{' ... ' + found[-1] if len(found) > 1 else ''})" if found else f"{info.abi} (?)",
            device.describe() if device is not None else (info.fields.get("device") or "?"),
            _yes(info.flag("hardware_compatible")),
            info.platform or "?",
            _yes(info.flag("output_allocator")),
            _yes(info.flag("multi_device")),
            format_size(info.engine_bytes),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["what each engine needs (read from the file as data; nothing deserialized):"]
    lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
              for row in rows]  # fmt: skip
    for info in infos:
        settings = info.metadata.get("settings", {}) if isinstance(info.metadata, dict) else {}
        flags = ", ".join(f"{key}={value}" for key, value in settings.items()) if isinstance(settings, dict) else ""
        lines.append(
            f"  {info.where}: inputs {', '.join(info.inputs) or '-'}; outputs {', '.join(info.outputs) or '-'}; "
            f"metadata {info.metadata_note or 'none'}{'; ' + flags if flags else ''}"
        )
        lines += [f"  {info.where}: {problem}" for problem in info.problems]
    return lines


def _yes(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "no"


@dataclass
class CheckReport:
    """``trt-inline check``: each engine, what would keep it from running on ``machine``, what was not checked."""

    path: str
    machine: Machine
    engines: list[EngineInfo] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_text(self) -> str:
        if not self.engines:
            return f"{self.path}: no TensorRT engine: nothing of it depends on {self.machine.what}'s GPU or runtime"
        unchecked = self.machine.unchecked()
        tail = f" (not checked: {', '.join(unchecked)}: not described)" if unchecked else ""
        count = len(self.engines)
        engines = "its engine" if count == 1 else f"its {count} engines"
        if self.ok:
            return f"{self.path}: {engines} can run on {self.machine.what}{tail}"
        reasons = "1 reason" if len(self.problems) == 1 else f"{len(self.problems)} reasons"
        summary = f"{self.path}: {reasons} {engines} would not run on {self.machine.what}{tail}"
        return "\n".join([*self.problems, summary])

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "machine": self.machine.to_dict(),
            "ok": self.ok,
            "engines": [info.to_dict() for info in self.engines],
            "problems": self.problems,
            "unchecked": self.machine.unchecked(),
        }


def check_engines(
    path: str | os.PathLike[str],
    machine: Machine | None = None,
    *,
    allow_pickle: bool = False,
    sandbox: bool = True,
    timeout: float | None = None,
    memory_limit: int | str | None = None,
) -> CheckReport:
    """Whether every TensorRT engine of ``path`` would run on ``machine`` (default: this one), read in a
    sandboxed child and checked here, before anything native runs anywhere."""
    from trt_inline.archive.reader import check_path
    from trt_inline.deployment import this_machine
    from trt_inline.isolation import Limits, run_isolated

    where = os.fspath(path)
    check_path(where)
    limits = Limits.for_file(where, timeout, memory_limit)
    result = run_isolated(
        NeedsRequest.of(where, allow_pickle), None, limits, where=where, files=(where,), sandbox=sandbox
    )
    infos = result.value.engines
    target = machine if machine is not None else this_machine()  # (after the child: nothing forks from here on)
    report = CheckReport(where, target, infos)
    report.problems = [problem for info in infos for problem in engine_problems(info, target)]
    return report


def run(args: argparse.Namespace) -> int:
    from trt_inline.deployment import described_machine

    trust, isolation = from_flags(Trust, vars(args)), from_flags(Isolation, vars(args))
    machine = described_machine(args.target) if args.target is not None else None
    report = check_engines(
        args.path,
        machine,
        allow_pickle=trust.allow_pickle,
        sandbox=isolation.sandbox,
        timeout=isolation.timeout,
        memory_limit=isolation.memory_limit,
    )
    print_text(json.dumps(report.to_dict(), indent=2) if args.json else report.to_text())
    return 0 if report.ok else 1
