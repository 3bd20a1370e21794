"""Verification of saved programs: does it load safely, is its graph sound, does it compute the same.

==========================  =================================================================
module                      concern
==========================  =================================================================
``reader``                  the one strict reader: every byte of a file from a stranger
                            enters here (``zip_layout``: one view of a zip archive;
                            ``pickles``: torch.save blobs read without unpickling;
                            ``views``: the file mapped, never copied)
``program_checks``          the program document against this torch's schema, rebuilt; the
                            runnable module and its reference engines against the allow-list
``canonical``               the archive torch is given instead of the file, and its loader
``archive``                 opening files: read, canonical, loaded, what runs checked
``isolation``               the sandboxed child process, with time and memory limits, that
                            loads and runs a file (the sandbox itself: ``trt_inline.sandbox``)
``structure``               structural checks on the graph, one function each
``compare``                 running on reference inputs and comparing values (error statistics)
``checked_run``             a normal call that runs the graph node by node, checking each value
``declared``                each value a run computes against the metadata its node declares
``garbage``                 outputs that look like garbage without a reference (zeros, NaN,
                            constant across runs, the same in every row)
``boundaries``              recording engine boundaries from a compiled module, tracing a
                            saved program's run at them
``localize``                boundary by boundary against a reference: the first divergence
``random_inputs``           inputs drawn within a program's declared dynamic ranges
``report``                  ``VerifyReport`` and its text / JSON forms
``reference_io``            the reference I/O a save embeds (used by ``trt_inline.save`` too)
``verifier``                ``verify``: all of the above in order
``diff``                    ``diff``: two files on the same inputs, boundary by boundary
``cases``                   ``verify --cases DIR``: a folder of (inputs, expected) cases, one
                            verify each, the worst first
``junit``                   verdicts as a JUnit XML report (``--junit FILE``)
==========================  =================================================================
"""

from __future__ import annotations

from trt_inline.errors import UnsafeArchiveError, VerifyInputError
from trt_inline.verify.archive import (
    AOTI_PACKAGE,
    EXPORTED_PROGRAM,
    LoadedFile,
    classify_file,
    load,
    load_exported_program,
    open_file,
)
from trt_inline.verify.compare import default_tolerance
from trt_inline.verify.diff import diff
from trt_inline.verify.reference_io import (
    REFERENCE_IO_FILE,
    EngineBoundary,
    ReferenceIO,
    capture_reference_io,
    decode_reference_io,
    encode_reference_io,
)
from trt_inline.verify.report import OutputComparison, VerifyReport, describe_value
from trt_inline.verify.structure import structural_problems
from trt_inline.verify.verifier import verify

__all__ = [
    "AOTI_PACKAGE",
    "EXPORTED_PROGRAM",
    "EngineBoundary",
    "REFERENCE_IO_FILE",
    "LoadedFile",
    "OutputComparison",
    "ReferenceIO",
    "UnsafeArchiveError",
    "VerifyInputError",
    "VerifyReport",
    "capture_reference_io",
    "classify_file",
    "decode_reference_io",
    "default_tolerance",
    "describe_value",
    "diff",
    "encode_reference_io",
    "load",
    "load_exported_program",
    "open_file",
    "structural_problems",
    "verify",
]
