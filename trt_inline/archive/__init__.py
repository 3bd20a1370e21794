"""Reading saved files: every byte of a file from a stranger through one strict reader, and the loader.

A file is read once, strictly, rebuilt as an archive trt-inline wrote, and only
that is given to torch (:mod:`trt_inline.archive.loading` tells the steps).
:func:`load` is the public loader of trusted files (``trt_inline.load``); verification
(:mod:`trt_inline.verify`) opens untrusted ones with :func:`open_file` in a
sandboxed child (:mod:`trt_inline.isolation`).

==================  ===================================================================
module              concern
==================  ===================================================================
``reader``          the one strict reader: every byte of a file from a stranger enters
                    here, and only what it checked leaves (``Contents``)
``zip_layout``      one view of a zip archive: entries, names, offsets, no overlap
``pickles``         ``torch.save`` blobs read without unpickling
``views``           the file mapped, never copied (read ahead by
                    :mod:`trt_inline.isolation.read_ahead`)
``program_checks``  the program document against this torch's schema, rebuilt; the
                    runnable module and its reference engines against the allow-list
``canonical``       the archive torch is given instead of the file, and its loader
``output_types``    output types a file names that this process does not import,
                    rebuilt from the file as data in a child
``reference_io``    the reference inputs, outputs and engine boundaries a save embeds
``loading``         opening files: read, canonical, loaded, what runs checked; ``load``
``engine_info``     what each TensorRT engine of a file needs, read as data (nothing
                    deserialized)
==================  ===================================================================

It imports the floors below it (the core modules, :mod:`trt_inline.isolation`)
and nothing from :mod:`trt_inline.verify`.
"""

from __future__ import annotations

from trt_inline.archive.loading import (
    AOTI_PACKAGE,
    EXPORTED_PROGRAM,
    LoadedFile,
    classify_file,
    load,
    load_exported_program,
    open_file,
)
from trt_inline.archive.reference_io import (
    REFERENCE_IO_FILE,
    EngineBoundary,
    ReferenceIO,
    capture_reference_io,
    decode_reference_io,
    encode_reference_io,
)

__all__ = [
    "AOTI_PACKAGE",
    "EXPORTED_PROGRAM",
    "REFERENCE_IO_FILE",
    "EngineBoundary",
    "LoadedFile",
    "ReferenceIO",
    "capture_reference_io",
    "classify_file",
    "decode_reference_io",
    "encode_reference_io",
    "load",
    "load_exported_program",
    "open_file",
]
