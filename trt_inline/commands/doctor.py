"""``trt-inline doctor``: versions, CUDA, the rehearsal's pipeline, the entry point, the sandbox, the patch.

Each finding is one line (``--json``: the findings and this machine's description, what
``trt-inline check --target`` reads); exit 1 where one is not ok.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import io
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from trt_inline import switches
from trt_inline.commands.output import print_text
from trt_inline.errors import TrtInlineError, first_line, printable

__all__ = ["Finding", "add_parser", "doctor", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("doctor", help="report versions, CUDA, and whether torch_tensorrt.save is patched")
    parser.add_argument(
        "--json", action="store_true",
        help="print the findings and this machine's description as JSON (what trt-inline check --target reads)",
    )  # fmt: skip
    parser.set_defaults(run=run)


@dataclass
class Finding:
    label: str
    value: str
    ok: bool = True


def _package_status(distribution: str, module: str) -> tuple[str, bool, bool]:
    """(text, installed, importable) for a distribution and the module it provides.

    A module importable without distribution metadata (a source build on the path)
    counts as installed, with the version it declares.
    """
    import importlib.util

    try:
        version: str | None = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        if importlib.util.find_spec(module) is None:
            return "not installed", False, False
        version = None
    try:
        # (torch_tensorrt prints its own import failure; the finding says it in one line)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            imported = importlib.import_module(module)
    except Exception as exc:  # a missing libnvinfer surfaces as OSError, ImportError, RuntimeError...
        reason = f"{type(exc).__name__}: {first_line(exc)}"
        return f"{version or 'unknown version'}, not importable ({reason})", True, False
    return str(version or getattr(imported, "__version__", "unknown version")), True, True


def _rehearsal_pipeline() -> str:
    """The pipeline ``trt_inline.reference.compile`` runs here, in one line."""
    from trt_inline.formats import default_pipeline
    from trt_inline.reference import release

    found = release.installed_release() if default_pipeline() != "own" else None
    if found is None:
        return release.own_pipeline_note(chosen=default_pipeline() == "own")
    return release.release_pipeline_note(found)


def _entry_point() -> str | None:
    for entry in importlib.metadata.entry_points(group="torch.backends"):
        if entry.value == switches.ENTRY_POINT:
            return f"{entry.name} = {entry.value}"
    return None


def doctor() -> list[Finding]:
    import torch

    from trt_inline import plugin

    findings = [Finding("torch", torch.__version__)]
    trt_text, trt_installed, trt_importable = _package_status("torch_tensorrt", "torch_tensorrt")
    if trt_text.startswith("unknown version"):  # (a source tree on the path: its _version.py says it)
        from trt_inline.reference.release import installed_release

        found = installed_release()
        trt_text = trt_text.replace("unknown version", found.version, 1) if found is not None else trt_text
    tensorrt_text, tensorrt_installed, tensorrt_importable = _package_status("tensorrt", "tensorrt")
    cuda = torch.cuda.is_available()
    # A release installed without TensorRT on a machine without CUDA is the rehearsal setup (the reference backend
    # runs its pipeline as a dry run), not a broken install; with CUDA, or TensorRT installed, it is one.
    rehearsal_only = trt_installed and not trt_importable and not tensorrt_installed and not cuda
    if rehearsal_only:
        trt_text += "; rehearsed without TensorRT (see rehearsal)"
    findings.append(Finding("torch_tensorrt", trt_text, ok=trt_importable or not trt_installed or rehearsal_only))
    findings.append(Finding("tensorrt", tensorrt_text, ok=tensorrt_importable or not tensorrt_installed))
    findings.append(Finding("CUDA", "available" if cuda else "not available"))
    findings.append(Finding("rehearsal", _rehearsal_pipeline()))

    entry = _entry_point()
    findings.append(
        Finding(
            "entry point",
            f"registered (torch.backends: {entry})" if entry else "MISSING: reinstall trt-inline",
            ok=bool(entry),
        )
    )
    findings.extend(_sandbox_findings())
    autoload_off = not switches.entry_points_run()
    if switches.disabled_by_env():
        autoload = f"off ({switches.DISABLE_ENV}={os.environ[switches.DISABLE_ENV]})"
    elif autoload_off:
        autoload = "off (TORCH_DEVICE_BACKEND_AUTOLOAD=0): call trt_inline.install()"
    else:
        autoload = "on"
    findings.append(Finding("autoload", autoload))

    if not trt_importable:
        findings.append(Finding("exporter patch", "not applicable: torch_tensorrt is not importable"))
        return findings
    try:
        importlib.import_module(plugin.EXPORTER)
        version = plugin.torch_tensorrt_version()
        planned = sorted(plugin.replacements_for(sys.modules[plugin.EXPORTER]))
    except Exception as exc:
        findings.append(Finding("exporter patch", f"UNSUPPORTED: {exc}", ok=False))
        return findings
    label = f"exporter patch ({version or 'unknown version'})"
    if plugin.is_active():
        findings.append(Finding(label, "active: " + ", ".join(plugin.replaced_functions())))
    elif autoload != "on":
        findings.append(Finding(label, f"inactive ({autoload}); would replace " + ", ".join(planned)))
    else:
        findings.append(Finding(label, "NOT ACTIVE although autoload is on", ok=False))
    for name, why in sorted(plugin.refused_replacements().items()):
        findings.append(Finding(f"left stock: {name}", f"the replacement failed its preflight ({why})", ok=False))
    for module_name in plugin.BOUND_ELSEWHERE:  # import them, so that each door reports what it runs
        with contextlib.suppress(Exception):
            importlib.import_module(module_name)
    for door, runs in plugin.doors().items():
        findings.append(Finding(f"door: {door}", runs, ok=not (plugin.is_active() and runs == "stock")))
    return findings


def _sandbox_findings() -> list[Finding]:
    """What the OS sandbox sets up on this machine, and whether CUDA runs inside it, asked of a real sandboxed
    child (``sandbox_job``)."""
    from trt_inline.isolation import Limits, SandboxRequest, run_isolated

    try:
        result = run_isolated(SandboxRequest(), None, Limits(120.0, 2 << 30), where="sandbox")
    except TrtInlineError as exc:
        return [Finding("sandbox", f"UNAVAILABLE: {first_line(exc)}", ok=False)]
    findings = [Finding("sandbox", str(result.sandbox))]
    cuda = result.value.cuda
    if cuda is not None:
        findings.append(Finding("CUDA in sandbox", printable(str(cuda))[:300], ok=str(cuda).startswith("works")))
    return findings


def run(args: argparse.Namespace) -> int:
    findings = doctor()
    if args.json:
        from trt_inline.deployment import this_machine

        machine = this_machine()  # (after doctor's sandboxed child: CUDA may initialize here now)
        document = {
            "findings": [{"label": f.label, "value": f.value, "ok": f.ok} for f in findings],
            "machine": machine.to_dict(),
        }
        print_text(json.dumps(document, indent=2))
        return 0 if all(f.ok for f in findings) else 1
    width = max(len(f.label) for f in findings)
    for finding in findings:
        print(f"{finding.label:<{width}}  {finding.value}")
    return 0 if all(f.ok for f in findings) else 1
