"""``trt-inline`` command line.

Errors print one line on stderr and exit 2 (unusable input) or 1 (a check
failed); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["main"]


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
        imported = importlib.import_module(module)
    except Exception as exc:  # a missing libnvinfer surfaces as OSError, ImportError, RuntimeError...
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return f"{version or 'unknown version'}, not importable ({type(exc).__name__}: {first_line})", True, False
    return str(version or getattr(imported, "__version__", "unknown version")), True, True


def _entry_point() -> str | None:
    for entry in importlib.metadata.entry_points(group="torch.backends"):
        if entry.value.startswith("trt_inline_autoload"):
            return f"{entry.name} = {entry.value}"
    return None


def doctor() -> list[Finding]:
    import torch

    import trt_inline_autoload
    from trt_inline import plugin

    findings = [Finding("torch", torch.__version__)]
    trt_text, trt_installed, trt_importable = _package_status("torch_tensorrt", "torch_tensorrt")
    findings.append(Finding("torch_tensorrt", trt_text, ok=trt_importable or not trt_installed))
    tensorrt_text, tensorrt_installed, tensorrt_importable = _package_status("tensorrt", "tensorrt")
    findings.append(Finding("tensorrt", tensorrt_text, ok=tensorrt_importable or not tensorrt_installed))
    findings.append(Finding("CUDA", "available" if torch.cuda.is_available() else "not available"))

    entry = _entry_point()
    findings.append(
        Finding(
            "entry point",
            f"registered (torch.backends: {entry})" if entry else "MISSING: reinstall trt-inline",
            ok=bool(entry),
        )
    )
    autoload_off = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "1"
    if trt_inline_autoload.disabled_by_env():
        autoload = f"off ({trt_inline_autoload.DISABLE_ENV}={os.environ[trt_inline_autoload.DISABLE_ENV]})"
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
    label = f"exporter patch ({'.'.join(map(str, version)) if version else 'unknown version'})"
    if plugin.is_active():
        findings.append(Finding(label, "active: " + ", ".join(plugin.replaced_functions())))
    elif autoload != "on":
        findings.append(Finding(label, f"inactive ({autoload}); would replace " + ", ".join(planned)))
    else:
        findings.append(Finding(label, "NOT ACTIVE although autoload is on", ok=False))
    return findings


def _run_doctor(args: argparse.Namespace) -> int:
    findings = doctor()
    width = max(len(f.label) for f in findings)
    for finding in findings:
        print(f"{finding.label:<{width}}  {finding.value}")
    return 0 if all(f.ok for f in findings) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trt-inline", description="Correct ExportedProgram saves of Torch-TensorRT modules."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)
    doctor_parser = commands.add_parser(
        "doctor", help="report versions, CUDA, and whether torch_tensorrt.save is patched"
    )
    doctor_parser.set_defaults(run=_run_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
        return code
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        else:
            first_line = (str(exc).strip().splitlines() or [""])[0]
            print(f"trt-inline {args.command}: {type(exc).__name__}: {first_line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
