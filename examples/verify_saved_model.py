"""Verify a saved ExportedProgram before serving it: usable in a CI job with only torch and trt_inline.

    python examples/verify_saved_model.py model.pt2 [--inputs in.pt --expected out.pt] [--atol A] [--rtol R]

Exit status: 0 the file loads, its graph is sound and its outputs match the
reference (embedded by ``trt_inline.save``, or the given tensor files); 1 a
structural problem or a mismatch; 2 the input is unusable (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys

import torch

import trt_inline
from trt_inline.errors import VerifyInputError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path")
    parser.add_argument("--inputs", help="torch.save'd list of input tensors")
    parser.add_argument("--expected", help="torch.save'd list of expected output tensors")
    parser.add_argument("--atol", type=float)
    parser.add_argument("--rtol", type=float)
    parser.add_argument(
        "--allow-native-code", action="store_true", help="load TensorRT engines (native code): trusted files only"
    )
    args = parser.parse_args(argv)

    try:
        given = {}
        if args.inputs or args.expected:
            if not (args.inputs and args.expected):
                raise VerifyInputError("--inputs and --expected go together")
            given = {
                "arg_inputs": list(torch.load(args.inputs, weights_only=True)),
                "expected": list(torch.load(args.expected, weights_only=True)),
            }
        report = trt_inline.verify(
            args.path, atol=args.atol, rtol=args.rtol, allow_native_code=args.allow_native_code, **given
        )
    except (VerifyInputError, OSError) as exc:
        print(f"verify_saved_model: {exc}", file=sys.stderr)
        return 2

    print(f"{'PASS' if report.ok else 'FAIL'} {args.path} (expected outputs: {report.expected_source})")
    for output in report.outputs:
        print(
            f"  output {output.index}: max abs diff {output.max_abs_diff:.6g}, max rel diff {output.max_rel_diff:.6g}"
        )
    for problem in report.problems:
        print(f"  problem: {problem}")
    if not report.compared and not report.problems:
        print("verify_saved_model: no reference I/O in the file; pass --inputs and --expected", file=sys.stderr)
        return 2
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
