"""What a save embeds so that the file can be checked later, and when it leaves it out.

Reference I/O (the sample inputs and the compiled module's outputs for them, the
expected outputs) goes into the file as an extra entry encoded by
:mod:`trt_inline.verify.reference_io`; an AOTInductor package also records what
kind of value each output is. Above a size limit nothing is embedded, with a
warning that says how to verify without it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trt_inline import package
from trt_inline.errors import VerifyInputError
from trt_inline.formats import PACKAGE_INFO_FILE
from trt_inline.verify.reference_io import REFERENCE_IO_FILE, capture_reference_io, encode_reference_io

__all__ = ["DEFAULT_REFERENCE_LIMIT_BYTES", "reference_extra_files"]

DEFAULT_REFERENCE_LIMIT_BYTES = 64 << 20


def reference_extra_files(
    module: Any,
    arg_inputs: Sequence[Any] | None,
    kwarg_inputs: dict[str, Any] | None,
    target: Path,
    limit: int,
    *,
    with_output_kinds: bool = False,
) -> dict[str, str]:
    """The extra file carrying reference I/O, or nothing (with a warning saying why).

    ``with_output_kinds`` adds a package's output-kinds file, as the sample run saw them.
    """
    try:
        reference_io = capture_reference_io(module, list(arg_inputs or ()), kwarg_inputs)
    except VerifyInputError as exc:
        warnings.warn(f"trt-inline: reference I/O not embedded in {target}: {exc}", stacklevel=3)
        return {}
    size = reference_io.nbytes()
    if size > limit:
        warnings.warn(
            f"trt-inline: reference I/O not embedded in {target}: the sample inputs and outputs take "
            f"{size / 2**20:.1f} MiB, over the limit of {limit / 2**20:.1f} MiB "
            "(reference_limit_bytes); raise it, or verify with --inputs/--expected",
            stacklevel=3,
        )
        return {}
    extra = {REFERENCE_IO_FILE: encode_reference_io(reference_io)}
    if with_output_kinds:
        extra[PACKAGE_INFO_FILE] = package.package_info(reference_io.output_kinds)
    return extra
