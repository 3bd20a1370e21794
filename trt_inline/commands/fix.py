"""``trt-inline fix SCRIPT``: :func:`trt_inline.find_fix` on the model a script builds, its report printed, and
with ``--out`` the build with the settings found saved and verified (:mod:`trt_inline.fixing.out`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from trt_inline.commands.arguments import argparse_keywords
from trt_inline.commands.output import print_text
from trt_inline.errors import first_line
from trt_inline.verify.options import Tolerances, declarations, from_flags

__all__ = ["add_parser", "run"]

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


def add_parser(commands: Any) -> None:
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
            keywords = argparse_keywords(item, declaration, None)
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
    fix_parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trt_inline.fixing import FixError, find_fix
    from trt_inline.fixing.out import save_verified
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
            print_text(json.dumps(found.to_dict(), indent=2) if args.json else found.to_text())
        raise
    if not args.json:  # (the set found is printed before anything is saved: a failed save loses nothing)
        print_text(report.to_text())
    saved: tuple[dict[str, Any], str] | None = None
    failure: Exception | None = None
    if args.out is not None:
        try:
            saved = save_verified(report, script.module, script.arg_inputs, tolerance, out=args.out, seed=args.seed)
        except KeyboardInterrupt:
            if args.json:  # (the report, said before --out as the help promises, with the save it stopped)
                stopped = {"path": args.out, "status": None, "worst_error": None, "error": "interrupted"}
                print_text(json.dumps({**report.to_dict(), "out": stopped}, indent=2))
            print("trt-inline fix: interrupted", file=sys.stderr)
            return _FIX_INTERRUPTED
        except Exception as exc:  # (said after the report, one line; the exit status is unusable input's)
            failure = exc
            saved = ({"path": args.out, "status": None, "worst_error": None, "error": first_line(exc)},
                     f"--out {args.out}: not written ({type(exc).__name__}: {first_line(exc)})")  # fmt: skip
    if args.json:
        document = report.to_dict()
        print_text(json.dumps({**document, **({"out": saved[0]} if saved else {})}, indent=2))
    elif saved is not None:
        print_text(saved[1])
    if failure is not None:
        return 2
    if report.interrupted:
        return _FIX_INTERRUPTED
    return 0 if report.fixed and (saved is None or saved[0]["status"] == "PASS") else 1
