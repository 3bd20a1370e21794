"""Verification of saved programs: is its graph sound, does it compute the same, and where not, which engine.

A file is opened by :mod:`trt_inline.archive` in a sandboxed child process
(:mod:`trt_inline.isolation`); everything here runs on what they hand over.

==================  ===================================================================
module              concern
==================  ===================================================================
``verifier``        ``verify``: its request (``VerifyRequest``), the caller's side (the
                    expected module, the child, what it hands back written: the one
                    reader of a verification child's report, ``report_of_child``) and
                    the child's job (``verify_job``)
``pipeline``        one verification, a step each: open, reference, run, compare,
                    localize, more runs; what it hands back, typed
``options``         the option groups every entry point takes, each option declared once
``structure``       structural checks on the graph, one function each
``compare``         running on reference inputs and comparing values (error statistics)
``checked_run``     a normal call that runs the graph node by node, checking each value
``declared``        each value a run computes against the metadata its node declares
``garbage``         outputs that look like garbage without a reference (zeros, NaN,
                    constant across runs, the same in every row)
``random_inputs``   inputs drawn within a program's declared dynamic ranges
``range_ends``      the sizes at the ends of those ranges (minimum, maximum, the
                    optimization point a file records) and the inputs run there
``boundaries``      recording engine boundaries from a compiled module, tracing a
                    saved program's run at them
``graph_table``     the program's regions by engine, as ``inspect`` prints them
``localize``        boundary by boundary against a reference: the first divergence
``drill``           inside the first divergent engine, op by op: the first op whose own
                    error (run again in float64 on its inputs) crosses its tolerance,
                    with its module path and source line; a TensorRT engine's region
                    rebuilt one engine per step
``extract``         the diverging engine cut out as a program of its own
``report``          ``VerifyReport`` and its text / JSON forms
``diff``            ``diff``: two files on the same inputs, boundary by boundary (its
                    request and its child's job too)
``cases``           ``verify --cases DIR``: a folder of (inputs, expected) cases, one
                    verify each, the worst first
==================  ===================================================================

It is the top floor of reading and checking: it imports :mod:`trt_inline.archive`,
:mod:`trt_inline.isolation` and the core modules, and none of them imports it. The commands that
use it (``inspect``, ``check``, the JUnit file, the chart, rank sets) are :mod:`trt_inline.commands`'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trt_inline.errors import UnsafeArchiveError, VerifyInputError
from trt_inline.importing import lazy_exports
from trt_inline.verify.compare import default_tolerance
from trt_inline.verify.diff import diff
from trt_inline.verify.options import Inputs, Isolation, Outputs, Reference, Tolerances, Trust
from trt_inline.verify.report import OutputComparison, VerifyReport, describe_value
from trt_inline.verify.structure import structural_problems
from trt_inline.verify.verifier import verify

if TYPE_CHECKING:
    from trt_inline.archive import AOTI_PACKAGE as AOTI_PACKAGE
    from trt_inline.archive import EXPORTED_PROGRAM as EXPORTED_PROGRAM
    from trt_inline.archive import REFERENCE_IO_FILE as REFERENCE_IO_FILE
    from trt_inline.archive import EngineBoundary as EngineBoundary
    from trt_inline.archive import LoadedFile as LoadedFile
    from trt_inline.archive import ReferenceIO as ReferenceIO
    from trt_inline.archive import capture_reference_io as capture_reference_io
    from trt_inline.archive import classify_file as classify_file
    from trt_inline.archive import decode_reference_io as decode_reference_io
    from trt_inline.archive import encode_reference_io as encode_reference_io
    from trt_inline.archive import load as load
    from trt_inline.archive import load_exported_program as load_exported_program
    from trt_inline.archive import open_file as open_file

# The archive's names, importable from here as before the archive package held them (``from trt_inline.verify import
# load``): defined in trt_inline.archive only, each imported from there on its first use here.
_FORMER_HOMES = (
    "AOTI_PACKAGE", "EXPORTED_PROGRAM", "REFERENCE_IO_FILE", "EngineBoundary", "LoadedFile", "ReferenceIO",
    "capture_reference_io", "classify_file", "decode_reference_io", "encode_reference_io", "load",
    "load_exported_program", "open_file",
)  # fmt: skip
lazy_exports(__name__, {name: f"trt_inline.archive:{name}" for name in _FORMER_HOMES})

__all__ = [
    "Inputs",
    "Isolation",
    "OutputComparison",
    "Outputs",
    "Reference",
    "Tolerances",
    "Trust",
    "UnsafeArchiveError",
    "VerifyInputError",
    "VerifyReport",
    "default_tolerance",
    "describe_value",
    "diff",
    "structural_problems",
    "verify",
    *_FORMER_HOMES,
]
