"""Names and formats of what trt-inline writes and reads: output formats, archive entries, environment switches.

One place for each: the save paths, the package writer, the archive checks, the
``inspect`` table and the plugin read them from here. Also the one atomic write
every writer uses, and the one parser of each environment variable.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

# The switches' names and their one parser live where the entry point, which runs while torch is being imported,
# reads them too.
from trt_inline.switches import DISABLE_ENV, env_flag

__all__ = [
    "AOTI_FOLDER",
    "AOT_INDUCTOR",
    "BOUNDARIES",
    "DISABLE_ENV",
    "EXECUTORCH",
    "EXPORTED_PROGRAM",
    "EXTRA_FOLDER",
    "OUTPUT_FORMATS",
    "OWN_EXTRA_FILES",
    "PACKAGE_INFO_FILE",
    "REFERENCE_IO_ENV",
    "PIPELINE_ENV",
    "PIPELINES",
    "default_pipeline",
    "RANK_MANIFEST_FILE",
    "REFERENCE_IO_FILE",
    "atomic_write",
    "format_size",
    "env_flag",
    "plugin_embeds_reference_io",
    "plugin_reference_mode",
]

# output_format of trt_inline.save and torch_tensorrt.save; also the kind of a file verify opens.
EXPORTED_PROGRAM = "exported_program"
AOT_INDUCTOR = "aot_inductor"
OUTPUT_FORMATS = (EXPORTED_PROGRAM, AOT_INDUCTOR)
# torch_tensorrt.save's ExecuTorch program (2.12+): lowered by ExecuTorch from the flat program; verify cannot open it.
EXECUTORCH = "executorch"

# Under an archive's root folder: AOTInductor's compiled model, and extra files (torch.export.save's extra_files).
AOTI_FOLDER = "data/aotinductor/"
EXTRA_FOLDER = "extra/"
# Extra files trt-inline adds: reference I/O (trt_inline.archive.reference_io), a package's output kinds.
REFERENCE_IO_FILE = "trt_inline_reference_io.b64"
PACKAGE_INFO_FILE = "trt_inline_package.json"
# A tensor-parallel rank file's manifest (trt_inline.distributed.manifest).
RANK_MANIFEST_FILE = "trt_inline_ranks.json"
# The extra files trt-inline writes and reads back (as UTF-8 text, through the strict reader).
OWN_EXTRA_FILES = (REFERENCE_IO_FILE, PACKAGE_INFO_FILE, RANK_MANIFEST_FILE)

# TRT_INLINE_REFERENCE_IO=0 (or false, no, off): the patched torch_tensorrt.save embeds no reference I/O;
# =boundaries: it also embeds every engine's inputs and outputs (embed_reference="boundaries").
REFERENCE_IO_ENV = "TRT_INLINE_REFERENCE_IO"
BOUNDARIES = "boundaries"


# TRT_INLINE_PIPELINE=own (or release, auto): which pipeline reference.compile(pipeline="auto") takes; unset or
# anything else: auto (the importable release's, else trt-inline's own).
PIPELINE_ENV = "TRT_INLINE_PIPELINE"
PIPELINES = ("auto", "release", "own")


def default_pipeline() -> str:
    """What ``pipeline="auto"`` means here (:data:`PIPELINE_ENV`): ``"auto"``, or ``"own"`` / ``"release"``."""
    value = os.environ.get(PIPELINE_ENV, "").strip().lower()
    return value if value in PIPELINES else "auto"


def plugin_embeds_reference_io() -> bool:
    """Whether the patched ``torch_tensorrt.save`` embeds reference I/O (:data:`REFERENCE_IO_ENV`, default on)."""
    return plugin_reference_mode() is not False


def plugin_reference_mode() -> bool | str:
    """What the patched ``torch_tensorrt.save`` embeds, as ``trt_inline.save``'s ``embed_reference`` says it."""
    if os.environ.get(REFERENCE_IO_ENV, "").strip().lower() == BOUNDARIES:
        return BOUNDARIES
    return env_flag(REFERENCE_IO_ENV, default=True)


def _created_beside(target: Path) -> str:
    """A new, empty file with a random name beside ``target``, created with mode 0666 and so the umask applied.

    (``tempfile.mkstemp`` creates 0600: a file saved for a serving container's other user would be unreadable.)
    """
    for _ in range(100):
        path = os.path.join(target.parent, f".{target.name}.{secrets.token_hex(6)}{target.suffix or '.tmp'}")
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free temporary name beside {target}")


def format_size(size: int) -> str:
    """``1.5 GiB``, ``312 MiB``, ``12 KiB``, ``7 B``: the one way trt-inline writes a number of bytes."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.3g} {unit}"
    return f"{size} B"


@contextlib.contextmanager
def atomic_write(target: Path) -> Iterator[Path]:
    """A temporary path beside ``target`` to write; renamed onto ``target`` when the block succeeds.

    An interrupted or failed write never leaves a truncated file where a good
    one was, and leaves no temporary file behind. The file gets the permissions
    ``open()`` (and ``torch.export.save``) would give it: 0666 less the umask.
    """
    tmp = _created_beside(target)
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
