"""``trt-inline`` (``python -m trt_inline``): ``doctor``, ``verify``, ``diff``, ``inspect``, ``check``, ``fix``.

Errors print one line on stderr and exit 2 (unusable input) or 1 (a check
failed). Warnings and log records torch emits while loading a file are kept off
stderr; ``--debug`` shows them, the traceback of an error, and trt_inline's own
DEBUG records (the graph before and after each pass).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.metadata
import io
import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trt_inline import progress
from trt_inline.errors import TrtInlineError, VerifyInputError, first_line, printable
from trt_inline.isolation import reusing_interpreter
from trt_inline.logs import debug_to_stderr
from trt_inline.verify.cases import CaseResult, expected_outputs, load_tensor_file, split_inputs
from trt_inline.verify.options import (
    CASES,
    CHECK,
    DIFF,
    ENTRY_POINTS,
    GROUPS,
    INSPECT,
    RANKS,
    VERIFY,
    Declaration,
    Inputs,
    Isolation,
    Options,
    Outputs,
    Reference,
    Tolerances,
    Trust,
    declarations,
    declared,
    from_flags,
)
from trt_inline.verify.report import EXIT_STATUS
from trt_inline_interpreter import take_prestarted

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
        if entry.value.startswith("trt_inline_autoload"):
            return f"{entry.name} = {entry.value}"
    return None


def doctor() -> list[Finding]:
    import torch

    import trt_inline_switches
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
    autoload_off = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "1"
    if trt_inline_switches.disabled_by_env():
        autoload = f"off ({trt_inline_switches.DISABLE_ENV}={os.environ[trt_inline_switches.DISABLE_ENV]})"
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
    from trt_inline.isolation import Limits, run_isolated

    try:
        result = run_isolated("sandbox", {}, None, Limits(120.0, 2 << 30), where="sandbox")
    except TrtInlineError as exc:
        return [Finding("sandbox", f"UNAVAILABLE: {first_line(exc)}", ok=False)]
    findings = [Finding("sandbox", str(result.sandbox))]
    cuda = result.value.get("cuda") if isinstance(result.value, dict) else None
    if cuda is not None:
        findings.append(Finding("CUDA in sandbox", printable(str(cuda))[:300], ok=str(cuda).startswith("works")))
    return findings


def _run_doctor(args: argparse.Namespace) -> int:
    findings = doctor()
    if args.json:
        from trt_inline.deployment import this_machine

        machine = this_machine()  # (after doctor's sandboxed child: CUDA may initialize here now)
        document = {
            "findings": [{"label": f.label, "value": f.value, "ok": f.ok} for f in findings],
            "machine": machine.to_dict(),
        }
        _print_text(json.dumps(document, indent=2))
        return 0 if all(f.ok for f in findings) else 1
    width = max(len(f.label) for f in findings)
    for finding in findings:
        print(f"{finding.label:<{width}}  {finding.value}")
    return 0 if all(f.ok for f in findings) else 1


def _inputs_file(path: str | None) -> tuple[list[Any] | None, dict[str, Any] | None]:
    if path is None:
        return None, None
    return split_inputs(load_tensor_file(path, "inputs"))


def _finish(report: Any, args: argparse.Namespace, *, unverified: str | None) -> int:
    """Print the report (text or JSON), draw its chart and write its JUnit file if asked; the exit status."""
    _write_junit(args, [CaseResult(report.source, None, report, seconds=time.monotonic() - args.started)])
    if args.plot is not None:
        from trt_inline.verify.plot import plot_boundaries

        plot_boundaries(report, args.plot)
    _print_text(report.to_json() if args.json else report.to_text())
    if report.problems:
        return 1
    if unverified is not None and not report.compared:
        print(f"trt-inline {args.command}: UNVERIFIED: {unverified}", file=sys.stderr)
        return EXIT_STATUS["UNVERIFIED"]
    return 0


def _options(args: argparse.Namespace) -> Options:
    """Every option group as this command line gave it (its flags are declared by the groups' fields)."""
    given = vars(args)
    return Options(
        inputs=from_flags(Inputs, given),
        reference=from_flags(Reference, given),
        tolerances=from_flags(Tolerances, given),
        trust=from_flags(Trust, given),
        isolation=from_flags(Isolation, given),
        outputs=from_flags(Outputs, given),
    )


def _given_but_not_for(args: argparse.Namespace, entry: str) -> list[str]:
    """The flags of this command line, other than at their defaults, that ``entry`` (a mode of verify) does not take."""
    given = vars(args)
    return [
        declaration.flags[0]
        for item, declaration in _flags()
        if item.name in given
        and entry not in declaration.used_by
        and given[item.name] != _flag_default(item, declaration)
    ]


def _write_junit(args: argparse.Namespace, results: list[CaseResult]) -> None:
    """With ``--junit FILE``: the verdicts written there (:mod:`trt_inline.verify.junit`), once."""
    if getattr(args, "junit", None) is None:
        return
    from trt_inline.verify.junit import write_junit

    write_junit(args.junit, results, f"trt-inline {args.command}")
    args.junit_written = True


def _junit_of_error(args: argparse.Namespace, exc: BaseException) -> None:
    """With ``--junit FILE``: an error that stopped ``verify`` or ``diff`` written there as the file's error (a CI
    job shows it with the rest), unless the verdicts were written already or the file cannot be."""
    if getattr(args, "junit", None) is None or getattr(args, "junit_written", False):
        return
    source = args.path if args.command == "verify" else f"{args.path_a} against {args.path_b}"
    error = first_line(exc) if isinstance(exc, TrtInlineError) else f"{type(exc).__name__}: {first_line(exc)}"
    with contextlib.suppress(OSError, TrtInlineError):  # (the one line on stderr says what went wrong)
        _write_junit(args, [CaseResult(source, None, None, error, time.monotonic() - args.started)])


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse an unwritable --plot or --junit before the (possibly long) run, not after it (the files verify and
    diff write themselves, they check before they start)."""
    if args.plot is not None:
        from trt_inline.verify.plot import check_plot_target

        check_plot_target(args.plot)
    if getattr(args, "junit", None) is not None:
        from trt_inline.verify.verifier import save_target

        save_target(args.junit, "--junit")


def _run_diff(args: argparse.Namespace) -> int:
    from trt_inline.verify import diff

    _check_outputs(args)
    arg_inputs, kwarg_inputs = _inputs_file(args.inputs)
    options = _options(args)
    report = diff(
        args.path_a,
        args.path_b,
        inputs=replace(options.inputs, arg_inputs=arg_inputs, kwarg_inputs=kwarg_inputs),
        tolerances=options.tolerances,
        trust=options.trust,
        isolation=options.isolation,
        outputs=options.outputs,
    )
    return _finish(report, args, unverified=None)


def _run_verify(args: argparse.Namespace) -> int:
    from trt_inline.verify import verify

    if args.ranks is not None:
        from trt_inline.distributed.rank_set import launch, under_launcher

        if under_launcher(args.path) or os.environ.get("TRT_INLINE_RANK_SET_RESULT"):
            raise VerifyInputError("--ranks starts the ranks itself: run it outside torchrun, or drop --ranks under it")
        _refuse_for_rank_set(args)  # (here, before N ranks start to refuse it each)
        return launch(args.ranks, _without_ranks(sys.argv[1:] if args.argv is None else args.argv), debug=args.debug)
    if rank_set_job(args.path):
        return _run_rank_set(args)
    _check_outputs(args)
    if args.cases is not None:
        return _run_cases(args)
    if args.expected is not None and args.inputs is None:
        raise VerifyInputError("--expected needs --inputs: the inputs the expected outputs were computed from")
    if args.inputs is not None and args.expected_from is not None:
        raise VerifyInputError("--expected-from replaces --inputs/--expected; give one or the other")
    if args.load_boundaries is not None and (args.inputs is not None or args.expected_from is not None):
        raise VerifyInputError(
            "--load-boundaries is the reference: give it without --inputs/--expected/--expected-from"
        )
    arg_inputs = kwarg_inputs = expected = None
    if args.inputs is not None:
        arg_inputs, kwarg_inputs = split_inputs(load_tensor_file(args.inputs, "inputs"))
        if args.expected is not None:
            expected = expected_outputs(load_tensor_file(args.expected, "expected"))
    options = _options(args)
    report = verify(
        args.path,
        inputs=replace(options.inputs, arg_inputs=arg_inputs, kwarg_inputs=kwarg_inputs),
        reference=replace(options.reference, expected=expected),
        tolerances=options.tolerances,
        trust=options.trust,
        isolation=options.isolation,
        outputs=options.outputs,
    )
    return _finish(
        report,
        args,
        unverified=(
            f"{args.path} ran on the inputs in {args.inputs}, with nothing to compare its outputs with: give the "
            "expected outputs with --expected FILE"
            if args.inputs is not None
            else f"{args.path} carries no reference I/O: structural checks passed, comparing outputs needs "
            "--inputs FILE --expected FILE or --expected-from NEW.pt2"
        ),
    )


# The exit status of a set of cases is its worst case's: as that verdict exits for one file (ERROR: 2, unusable
# input).
_CASE_EXIT = {status: EXIT_STATUS[status] for status in ("ERROR", "FAIL", "UNVERIFIED", "PASS")}


def _run_cases(args: argparse.Namespace) -> int:
    """``verify PATH --cases DIR``: one verify per case, one verdict per case (the worst first), the worst's exit."""
    from trt_inline.verify.cases import verify_cases

    given = _given_but_not_for(args, CASES)
    if given:
        raise VerifyInputError(f"--cases gives each case its inputs and expected outputs, and writes one report: "
                               f"{', '.join(given)} do not apply with it")  # fmt: skip
    options = _options(args)
    results = verify_cases(
        args.path,
        args.cases,
        inputs=options.inputs,
        reference=options.reference,
        tolerances=options.tolerances,
        trust=options.trust,
        isolation=options.isolation,
    )
    _write_junit(args, results)
    if args.json:
        document = [
            {"case": r.case, "status": r.status, "error": r.error, "report": r.report and r.report.to_dict()}
            for r in results
        ]
        _print_text(json.dumps(document, indent=2, sort_keys=True))
    else:
        _print_text("\n".join(_cases_text(results, args.path, args.cases)))
    for result in results:
        if result.error is not None:
            print(f"trt-inline verify: case {result.case}: {result.error}", file=sys.stderr)
    return _CASE_EXIT.get(results[0].status, 2)


def _cases_text(results: list[CaseResult], path: str, folder: str) -> list[str]:
    """The verdicts in a table, the worst first, then each case's report."""
    counts = ", ".join(
        f"{sum(r.status == status for r in results)} {status}"
        for status in _CASE_EXIT
        if any(r.status == status for r in results)
    )
    width, status_width = max(len(r.case or "") for r in results), max(len(r.status) for r in results)
    lines = [f"{len(results)} cases of {path} in {folder} ({counts}), the worst first:"]
    for result in results:
        lines.append(f"  {result.status:<{status_width}}  {result.case or '':<{width}}  {_case_summary(result)}")
    for result in results:
        lines += ["", f"case {result.case}:"]
        lines.append(f"ERROR {result.error}" if result.report is None else result.report.to_text())
    return lines


def _case_summary(result: CaseResult) -> str:
    """A case's verdict in a few words: its error, its first problem, or its worst output's error and SQNR."""
    report = result.report
    if report is None:
        return result.error or ""
    if report.problems:
        more = len(report.problems) - 1
        return report.problems[0][:200] + (f" (and {more} more)" if more else "")
    if not report.outputs:
        return "outputs not compared"
    worst = max(report.outputs, key=lambda output: output.max_abs_diff)
    sqnrs = [output.sqnr_db for output in report.outputs if output.sqnr_db is not None]
    return f"{worst.error_text()}" + (f", lowest SQNR {min(sqnrs):.3g} dB" if sqnrs else "")


def rank_set_job(path: str) -> bool:
    from trt_inline.distributed.rank_set import under_launcher

    return under_launcher(path)


def _without_ranks(argv: Sequence[str]) -> list[str]:
    """A verify command line without its ``--ranks N`` (each rank runs the rest)."""
    result: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
        elif item in ("--ranks", "--rank"):  # (argparse takes an unambiguous prefix too)
            skip = True
        elif not item.startswith(("--ranks=", "--rank=")):
            result.append(item)
    return result


def _refuse_for_rank_set(args: argparse.Namespace) -> None:
    """Refuse the flags that apply to single files, which a rank set (``--ranks``, or a template under torchrun)
    does not take."""
    unsupported = _given_but_not_for(args, RANKS)
    if unsupported:
        raise VerifyInputError(f"a rank set is verified against its embedded reference I/O: {', '.join(unsupported)} "
                               "apply to single files")  # fmt: skip


def _run_rank_set(args: argparse.Namespace) -> int:
    """One rank of ``torchrun ... -m trt_inline verify 'model_rank{rank}_of_{world_size}.pt2'``."""
    from trt_inline.distributed.rank_set import finish_rank, verify_rank_set

    _refuse_for_rank_set(args)
    options = _options(args)
    result = verify_rank_set(
        args.path,
        reference=options.reference,
        tolerances=options.tolerances,
        trust=options.trust,
        isolation=options.isolation,
    )
    if result.rank == 0:
        _print_text(json.dumps(result.to_dict(), indent=2, sort_keys=True) if args.json else result.to_text())
    return finish_rank(result)


def _run_inspect(args: argparse.Namespace) -> int:
    from trt_inline.archive.reader import check_path
    from trt_inline.isolation import Limits, run_isolated
    from trt_inline.verify.jobs import InspectRequest, InspectResponse, response_of_child

    trust, isolation = from_flags(Trust, vars(args)), from_flags(Isolation, vars(args))
    check_path(args.path)  # (said at once, before a child starts)
    limits = Limits.for_file(args.path, isolation.timeout, isolation.memory_limit)
    result = run_isolated(
        "inspect", InspectRequest.of(args.path, trust), None, limits, where=args.path, files=(args.path,),
        sandbox=isolation.sandbox, imports=trust.allow_pickle, native_code=trust.allow_native_code,
        debug=isolation.debug,
    )  # fmt: skip
    answer = response_of_child(InspectResponse, result.value, args.path)
    lines, engines = answer.lines, answer.engines
    if args.json:
        document = {"path": args.path, "lines": [printable(line) for line in lines],
                    "engines": [info.to_dict() for info in engines]}  # fmt: skip
        _print_text(json.dumps(document, indent=2))
    else:
        _print_lines(lines)
    if result.sandbox is None:
        print("note: opened WITHOUT the OS sandbox (--no-sandbox)", file=sys.stderr)
    return 0


def _run_check(args: argparse.Namespace) -> int:
    from trt_inline.deployment import described_machine
    from trt_inline.verify.engine_needs import check_engines

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
    _print_text(json.dumps(report.to_dict(), indent=2) if args.json else report.to_text())
    return 0 if report.ok else 1


# ----------------------------------------------------------------------------------------------------------------
# trt-inline fix SCRIPT: find_fix from a script that builds the model (trt_inline.fixing)

# The tolerance fields find_fix holds a build to, flagged as verify flags them (strict is verify's own check).
_FIX_TOLERANCES = ("atol", "rtol", "check_error_stat", "top_k", "min_top_k_agreement")
_FIX_INTERRUPTED = 128 + 2  # (the status of a program Ctrl-C stopped)
_FIX_DESCRIPTION = """\
Search for the modules to keep in fp32 (--strategy higher_precision: autocast_excluded_nodes, which every release
matches against module paths) or the operators to run in PyTorch (--strategy fallback: torch_executed_ops) that
bring a reduced-precision build within tolerance on every case, and print the settings, the compile(...) call to
paste, and each module by path and source line. The builds are torch_tensorrt.dynamo.compile's where TensorRT
and CUDA run here, the reference backend's otherwise (the importable release's own pipeline, or trt-inline's
emulation of the release this torch pairs with).

SCRIPT is your own Python script, run in this process (as python SCRIPT runs it, but its
'if __name__ == "__main__":' block does not run). It defines either model(), a function returning
(module, arg_inputs), or model (the nn.Module) and arg_inputs (its example inputs, a tuple); and optionally
settings, a dict of compile settings, in the names of the Torch-TensorRT release rehearsed (the importable one,
else the one this torch pairs with). --settings is merged over them; with neither, an fp16 build of that release:
{"enable_autocast": true, "autocast_low_precision_type": "float16"} (2.10+) or {"enabled_precisions":
["float16"]}.

The report is printed before --out saves anything (with --json: once, after, the save's verdict in it,
and on Ctrl-C during the save too); a save that fails is said after it.

Exit 0: fixed, or nothing to fix (and --out verified). 1: no set works, or --max-compiles ran out (the best set
found is printed), or the --out file did not verify. 2: unusable input (a missing script, one without the
names, bad JSON), or the --out build could not be saved. 130: Ctrl-C stopped the search (the best set found so
far is printed)."""


def _add_fix_command(commands: Any) -> None:
    fix_parser = commands.add_parser(
        "fix",
        help="search for the compile settings that bring a reduced-precision build within tolerance (runs SCRIPT)",
        description=_FIX_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fix_parser.add_argument("script", metavar="SCRIPT", help="a Python script that builds the model and its inputs")
    fix_parser.add_argument(
        "--strategy", choices=("higher_precision", "fallback"),
        help="keep modules in fp32 (higher_precision: autocast_excluded_nodes; needs enable_autocast) or run "
        "operators in PyTorch (fallback: torch_executed_ops); default: the first where the settings enable autocast",
    )  # fmt: skip
    fix_parser.add_argument(
        "--settings", metavar="JSON",
        help='compile settings as a JSON object, over the script\'s: {"enable_autocast": true}; precisions by name '
        '({"enabled_precisions": ["float16"]})',
    )  # fmt: skip
    for item, declaration in declarations(Tolerances):
        if item.name in _FIX_TOLERANCES:
            keywords = _argparse_keywords(item, declaration, None)
            if item.name in ("atol", "rtol"):
                keywords["help"] = keywords["help"].replace("default: per dtype", "default: 1e-2")
            fix_parser.add_argument(*declaration.flags, **keywords)
    fix_parser.add_argument(
        "--cases", metavar="DIR",
        help="hold the build to every case of DIR as verify --cases reads it (DIR/CASE/inputs.pt and expected.pt) "
        "instead of the model's own outputs on its example inputs",
    )  # fmt: skip
    fix_parser.add_argument(
        "--max-compiles", type=int, metavar="N",
        help="stop after N compiles and print the best set found by then (default: 4 per candidate, plus 10)",
    )  # fmt: skip
    fix_parser.add_argument(
        "--seed", type=int, default=0,
        help="the random state each compile and run starts from (default 0): the same search, the same lines",
    )  # fmt: skip
    fix_parser.add_argument(
        "--out", metavar="FILE.pt2",
        help="compile with the settings found, save the build there (trt_inline.save) and verify it against the "
        "model in fp32 within the tolerance (trt_inline.verify)",
    )  # fmt: skip
    fix_parser.add_argument("--json", action="store_true", help="print the report as JSON")
    fix_parser.add_argument(
        "--progress", action="store_true",
        help="print a line per compile on stderr (the default when stderr is a terminal; never with --json)",
    )  # fmt: skip
    fix_parser.set_defaults(run=_run_fix)


def _run_fix(args: argparse.Namespace) -> int:
    from trt_inline.fixing import FixError, find_fix
    from trt_inline.fixing.runner import with_default_tolerance
    from trt_inline.fixing.script import default_settings, load_script, settings_from_json

    given = settings_from_json(args.settings) if args.settings is not None else {}
    if args.max_compiles is not None and args.max_compiles < 1:
        raise FixError(f"--max-compiles {args.max_compiles}: at least 1")
    if args.out is not None:
        from trt_inline.verify.verifier import save_target

        save_target(args.out, "--out")
    tolerance = with_default_tolerance(from_flags(Tolerances, vars(args)))
    try:
        script = load_script(args.script)
        settings = {**script.settings, **given} or default_settings()
        report = find_fix(
            script.module, script.arg_inputs, settings=settings, tolerances=tolerance, strategy=args.strategy,
            cases=args.cases, max_compiles=args.max_compiles, seed=args.seed,
        )  # fmt: skip
    except KeyboardInterrupt:  # (outside the search, which reports what it found itself)
        print("trt-inline fix: interrupted", file=sys.stderr)
        return _FIX_INTERRUPTED
    except FixError as error:  # (a set found that the pipeline read otherwise: the report, then the one line)
        found = getattr(error, "report", None)
        if found is not None:
            _print_text(json.dumps(found.to_dict(), indent=2) if args.json else found.to_text())
        raise
    if not args.json:  # (the set found is printed before anything is saved: a failed save loses nothing)
        _print_text(report.to_text())
    saved: tuple[dict[str, Any], str] | None = None
    failure: Exception | None = None
    if args.out is not None:
        try:
            saved = _fix_out(args, report, script.module, script.arg_inputs, tolerance)
        except KeyboardInterrupt:
            if args.json:  # (the report, said before --out as the help promises, with the save it stopped)
                stopped = {"path": args.out, "status": None, "worst_error": None, "error": "interrupted"}
                _print_text(json.dumps({**report.to_dict(), "out": stopped}, indent=2))
            print("trt-inline fix: interrupted", file=sys.stderr)
            return _FIX_INTERRUPTED
        except Exception as exc:  # (said after the report, one line; the exit status is unusable input's)
            failure = exc
            saved = ({"path": args.out, "status": None, "worst_error": None, "error": first_line(exc)},
                     f"--out {args.out}: not written ({type(exc).__name__}: {first_line(exc)})")  # fmt: skip
    if args.json:
        document = report.to_dict()
        _print_text(json.dumps({**document, **({"out": saved[0]} if saved else {})}, indent=2))
    elif saved is not None:
        _print_text(saved[1])
    if failure is not None:
        return 2
    if report.interrupted:
        return _FIX_INTERRUPTED
    return 0 if report.fixed and (saved is None or saved[0]["status"] == "PASS") else 1


def _fix_out(
    args: argparse.Namespace, report: Any, module: Any, arg_inputs: tuple[Any, ...], tolerance: Tolerances
) -> tuple[dict[str, Any], str]:
    """``--out``: the build with the report's settings saved, and verified against the model in fp32 (what
    ``--json`` says of it, and the line the text ends with)."""
    import torch

    from trt_inline.export import save
    from trt_inline.fixing.builds import default_compile
    from trt_inline.fixing.report import plain
    from trt_inline.verify import verify

    if not report.works or report.interrupted:
        why = "the search was interrupted" if report.interrupted else "no set that works was found"
        return {"path": args.out, "status": None, "worst_error": None}, f"--out {args.out}: not written ({why})"
    progress.report(f"compiling with the settings found and saving the build to {args.out}")
    torch.manual_seed(args.seed)
    compiled = default_compile()(module, arg_inputs, **report.settings)
    save(compiled, args.out, arg_inputs=arg_inputs)
    with torch.no_grad():
        expected = module(*arg_inputs)
    verdict = verify(args.out, arg_inputs=list(arg_inputs), expected=expected, tolerances=tolerance)
    worst = max((output.max_abs_diff for output in verdict.outputs), default=0.0)
    line = f"{verdict.status} {args.out}: saved, and verified against the model in fp32 (worst error {worst:.3g})"
    return {"path": args.out, "status": verdict.status, "worst_error": plain(worst)}, line


def _print_text(text: str) -> None:
    """Print a report line by line with control characters escaped: nothing from a file reaches the terminal raw.

    Strings from a file were escaped where they were decoded (no newline of theirs is left to split on);
    this escapes again whatever reaches the terminal.
    """
    _print_lines(text.split("\n"))


class _StdoutGone(Exception):
    """The reader of stdout left (``| head -1``) while the report was written."""


def _print_lines(lines: list[str]) -> None:
    try:
        print("\n".join(printable(line) for line in lines))
        sys.stdout.flush()  # (here, where a reader that left is seen, not at the interpreter's exit)
    except BrokenPipeError:
        raise _StdoutGone() from None


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr and exit 2, like every other unusable input (``--help`` shows usage)."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (--help shows usage)\n")


@dataclass(frozen=True)
class CommandFlags:
    """The flags of the command line alone (the files it reads, what it prints, verify's modes), declared as the
    options of :mod:`trt_inline.verify.options` are: each once, with its help text and who takes it."""

    # fmt: off
    inputs: str | None = field(default=None, metadata=declared(
        "torch.save'd tensor, list of tensors, or {'args', 'kwargs'}", "--inputs", used_by=(VERIFY, DIFF),
        help_for={DIFF: "torch.save'd inputs (default: the reference inputs embedded in A, else in B)"}))
    expected: str | None = field(default=None, metadata=declared(
        "torch.save'd tensor or list of tensors: the expected outputs", "--expected", used_by=(VERIFY,)))
    cases: str | None = field(default=None, metadata=declared(
        "verify PATH on every case of DIR, each a folder DIR/CASE holding inputs.pt (as --inputs) and "
        "expected.pt (as --expected): one verdict per case, the worst first; the exit status is the worst's",
        "--cases", used_by=(VERIFY, CASES), metavar="DIR"))
    ranks: int | None = field(default=None, metadata=declared(
        "verify a tensor-parallel rank set: PATH is a template ('model_rank{rank}_of_{world_size}.pt2'), "
        "N ranks are started through torch.distributed.run, each verifies its file in its own sandbox, their "
        "collectives are relayed; one report (the same as running this command under torchrun without --ranks)",
        "--ranks", used_by=(VERIFY, RANKS), type=int, metavar="N"))
    plot: str | None = field(default=None, metadata=declared(
        "draw the per-boundary errors (needs matplotlib: pip install trt-inline[plot])",
        "--plot", used_by=(VERIFY, DIFF), metavar="FILE.png"))
    json: bool = field(default=False, metadata=declared(
        "print the report as JSON", "--json", used_by=(VERIFY, DIFF, CASES, RANKS, INSPECT, CHECK),
        action="store_true", help_for={INSPECT: "print the table's lines and what each engine needs as JSON",
                                       CHECK: "print each engine's needs, the machine and the reasons as JSON"}))
    target: str | None = field(default=None, metadata=declared(
        "the deployment machine instead of this one: cc=8.9,platform=linux_x86_64,torch_tensorrt=2.13.0 "
        "(cc=8.9+9.0 for several GPUs; abi=9 instead of a release; any part left out is not checked), or the "
        ".json that trt-inline doctor --json wrote there", "--target", used_by=(CHECK,), metavar="DESCRIPTION"))
    junit: str | None = field(default=None, metadata=declared(
        "also write the verdict as a JUnit XML report (what CI systems display): a test case per file and case, "
        "a failure per output or engine boundary that differs",
        "--junit", used_by=(VERIFY, DIFF, CASES), metavar="FILE.xml"))
    progress: bool = field(default=False, metadata=declared(
        "report each phase of long work on stderr (the default when stderr is a terminal; never with --json)",
        "--progress", used_by=ENTRY_POINTS, action="store_true"))
    # fmt: on


# The order --help lists the flags in; each command shows those its entry points take (_COMMANDS).
_HELP_ORDER = (
    "--inputs", "--expected", "--expected-from", "--strict", "--cases", "--per-engine", "--save-boundaries",
    "--load-boundaries", "--extract", "--ranks", "--atol", "--rtol", "--check-error-stat", "--device",
    "--random-inputs", "--seed", "--range-ends", "--save-outputs", "--plot", "--json", "--target", "--top-k",
    "--min-top-k-agreement", "--junit",
    "--allow-pickle", "--allow-native-code", "--allow-op", "--timeout", "--memory-limit", "--progress", "--no-sandbox",
    "--verbose", "--debug",
)  # fmt: skip
# The entry points of each command: verify's flags are also those of its modes (--cases DIR, --ranks N).
_COMMANDS = {"verify": {VERIFY, CASES, RANKS}, "diff": {DIFF}, "inspect": {INSPECT}, "check": {CHECK}}


def _flags() -> list[tuple[dataclasses.Field[Any], Declaration]]:
    """Every declared option that has a flag, the groups' and the command line's own, in --help's order."""
    found = [(item, declaration) for item, declaration in declarations(*GROUPS, CommandFlags) if declaration.flags]
    return sorted(found, key=lambda pair: _HELP_ORDER.index(pair[1].flags[0]))


def _flag_default(item: dataclasses.Field[Any], declaration: Declaration) -> Any:
    """What a flag not given leaves: the field's default, as argparse holds it."""
    default: Any = item.default
    if declaration.action in ("store_true", "store_false"):
        return declaration.action == "store_false"
    if declaration.action == "append" and default is not None:
        return list(default)  # (argparse appends to a copy of it)
    return default


def _argparse_keywords(item: dataclasses.Field[Any], declaration: Declaration, command: str | None) -> dict[str, Any]:
    """``add_argument``'s keywords for a declared option of ``command`` (None: before the command): parsed into the
    field's name, with the help text that command shows."""
    text = declaration.help if command is None else declaration.help_of(_COMMANDS[command])
    keywords: dict[str, Any] = {
        "dest": item.name,
        "action": declaration.action,
        "help": text.replace("%", "%%"),
    }
    if declaration.action in ("store", "append"):
        keywords["default"] = _flag_default(item, declaration)
    for name in ("type", "metavar", "choices"):
        if getattr(declaration, name) is not None:
            keywords[name] = getattr(declaration, name)
    return keywords


def _add_flags(parser: argparse.ArgumentParser, command: str | None) -> None:
    """The declared flags of ``command`` (None: the flags given before the command) to its parser."""
    for item, declaration in _flags():
        if command is None:
            wanted = declaration.before_command
        else:
            wanted = not declaration.before_command and bool(declaration.used_by & _COMMANDS[command])
        if wanted:
            parser.add_argument(*declaration.flags, **_argparse_keywords(item, declaration, command))


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="trt-inline", description="Correct ExportedProgram saves of Torch-TensorRT modules.")
    _add_flags(parser, None)
    commands = parser.add_subparsers(dest="command", required=True)
    doctor_parser = commands.add_parser(
        "doctor", help="report versions, CUDA, and whether torch_tensorrt.save is patched"
    )
    doctor_parser.add_argument(
        "--json", action="store_true",
        help="print the findings and this machine's description as JSON (what trt-inline check --target reads)",
    )  # fmt: skip
    doctor_parser.set_defaults(run=_run_doctor)

    verify_parser = commands.add_parser(
        "verify",
        help="check a saved ExportedProgram or AOTInductor package: loads safely, graph sound, outputs match",
        description="Exit 0: passed. 1: a structural problem or an output mismatch. 2: unusable or refused input, "
        "or the child process that loads the file hit a limit or crashed.",
    )
    verify_parser.add_argument("path")
    _add_flags(verify_parser, "verify")
    verify_parser.set_defaults(run=_run_verify)

    diff_parser = commands.add_parser(
        "diff",
        help="run two saves of one model on the same inputs and compare them at every engine boundary",
        description="B is the reference. Exit 0: every boundary agrees within tolerance. 1: they diverge (the "
        "first divergence is named). 2: unusable or refused input.",
    )
    diff_parser.add_argument("path_a", metavar="A.pt2")
    diff_parser.add_argument("path_b", metavar="B.pt2")
    _add_flags(diff_parser, "diff")
    diff_parser.set_defaults(run=_run_diff)

    inspect_parser = commands.add_parser("inspect", help="table of engines, fallback ops and their wiring")
    inspect_parser.add_argument("path")
    _add_flags(inspect_parser, "inspect")
    inspect_parser.set_defaults(run=_run_inspect)

    check_parser = commands.add_parser(
        "check",
        help="will its TensorRT engines run on this machine, or on --target? (read as data, nothing deserialized)",
        description="Exit 0: every engine's needs (runtime ABI, platform, GPU compute capability) are met. 1: one "
        "line per engine that would not run. 2: unusable input.",
    )
    check_parser.add_argument("path")
    _add_flags(check_parser, "check")
    check_parser.set_defaults(run=_run_check)
    _add_fix_command(commands)
    return parser


@contextlib.contextmanager
def _quiet(debug: bool) -> Iterator[None]:
    """Unless debugging: no warnings and no log records reach stderr; both restored afterwards."""
    if debug:
        with debug_to_stderr(True):
            yield
        return
    previous = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            yield
        finally:
            logging.disable(previous)


def _shows_progress(args: argparse.Namespace) -> bool:
    """Progress lines on stderr: asked for, or stderr a terminal; never with --json."""
    if getattr(args, "json", False) or not hasattr(args, "progress"):
        return False
    return bool(args.progress) or sys.stderr.isatty()


def _forking_interpreter() -> contextlib.AbstractContextManager[None]:
    """The command's children forked from the interpreter ``trt-inline`` started before it imported torch
    (:mod:`trt_inline_command`), where it did; otherwise each child starts as it would."""
    started = take_prestarted()
    return contextlib.nullcontext() if started is None else reusing_interpreter(started)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.argv = None if argv is None else list(argv)
    args.started = time.monotonic()  # (a JUnit report says how long each case took)
    try:
        with _quiet(args.debug), progress.printing(_shows_progress(args)), _forking_interpreter():
            code: int = args.run(args)
        return code
    except _StdoutGone:
        # The reader of stdout left (``| head -1``): no traceback, nothing more to write there, and the status of
        # a program a closed pipe stopped (never 0: the verdict was not all written).
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except Exception as exc:
        _junit_of_error(args, exc)
        if args.debug:
            traceback.print_exc()
        else:
            kind = "" if isinstance(exc, TrtInlineError) else f"{type(exc).__name__}: "
            print(f"trt-inline {args.command}: {kind}{first_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
