"""A divergence as a standalone repro: the one engine that diverged, its recorded inputs and expected outputs.

``verify --extract DIR`` (:func:`engine_repro`) turns the first divergent engine
of a file into a program of its own::

    before (the whole file)                      after (DIR/repro.pt2)

    x ─► engine 0 ─► relu ─► engine 1 ─► ...      in_0 ─┐
                 └──────────►┘                    in_1 ─┴► engine 1 ─► getitem ─► OUTPUT
                                                                    └► getitem_1 ─┘

The engine call keeps its target, its engine object (stored under the same
attribute name, so reports name it as before) and every other argument; its
inputs become placeholders. The reference I/O it embeds is what the engine
was recorded taking and returning in the compiled module, so ``trt-inline
verify DIR/repro.pt2`` reproduces the divergence on its own, and
``python DIR/repro.py`` does the same from Python (sandboxed as well: the
archive comes from the child that ran the file, and is as untrusted as it).
"""

from __future__ import annotations

import io
import operator
import os
import re
from pathlib import Path

import torch
import torch.fx

from trt_inline import compat
from trt_inline.engines import engine_inputs, is_engine_call
from trt_inline.errors import VerifyInputError
from trt_inline.flat_program import exported_program_from_graph
from trt_inline.formats import atomic_write
from trt_inline.verify.reference_io import REFERENCE_IO_FILE, EngineBoundary, ReferenceIO, encode_reference_io
from trt_inline.verify.report import Divergence

__all__ = ["diverged_engine", "engine_repro", "repro_folder", "write_repro"]

_ENGINE = re.compile(r"^engine (\d+) \(")


def diverged_engine(divergence: Divergence | None) -> int | None:
    """The index of the engine call a divergence names (an engine, one that raised, or one that does not fit)."""
    match = _ENGINE.match(divergence.where) if divergence is not None else None
    return int(match.group(1)) if match else None


REPRO_SCRIPT = '''"""Reproduces {what} of {source}: alone on its recorded inputs, against its recorded outputs.

    python repro.py [repro.pt2]      (exit 1 when it diverges, as trt-inline verify)

The file is checked and run in a sandboxed child process, as trt-inline verify runs any file: the
engine in it came from the file that was verified.
"""

import sys
from pathlib import Path

import trt_inline

path = sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("repro.pt2")
report = trt_inline.verify(path, per_engine=True{trust})
print(report.to_text())
sys.exit(0 if report.ok else 1)
'''


def write_repro(
    folder: str | os.PathLike[str], what: str, archive: bytes, source: str, native_code: bool
) -> list[Path]:
    """``folder/repro.pt2`` and ``folder/repro.py`` (atomically; ``folder`` is made, its parent must exist).

    ``what`` comes from the file verified (an engine's name): only plain characters
    of it reach the script, so no name can end its docstring.
    """
    target = repro_folder(folder)
    target.mkdir(exist_ok=True)
    script = REPRO_SCRIPT.format(
        what=_plain(what), source=_plain(Path(source).name), trust=", allow_native_code=True" if native_code else ""
    )
    written = [target / "repro.pt2", target / "repro.py"]
    for path, data in zip(written, (archive, script.encode()), strict=True):
        with atomic_write(path) as tmp:
            tmp.write_bytes(data)
    return written


def repro_folder(folder: str | os.PathLike[str]) -> Path:
    """``folder`` if a repro can be written there (checked before the run, so a bad one costs no run)."""
    target = Path(folder)
    if not target.parent.is_dir():
        raise VerifyInputError(f"--extract: directory {target.parent} does not exist")
    if target.exists() and not target.is_dir():
        raise VerifyInputError(f"--extract: {target} exists and is not a directory")
    return target


def _plain(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_ .()\[\]-]", "?", text)[:200]


def engine_repro(module: torch.fx.GraphModule, engine_node_name: str, record: EngineBoundary) -> bytes:
    """A ``.pt2`` archive of one engine call of ``module`` on ``record``'s inputs, expecting its outputs.

    Raises :class:`VerifyInputError` when the engine's arguments are computed by
    the program (only its inputs may be) or torch cannot build the program.
    """
    engine_node = next((n for n in module.graph.nodes if n.name == engine_node_name and is_engine_call(n)), None)
    if engine_node is None:
        raise VerifyInputError(f"no engine call {engine_node_name} to extract")
    if len(engine_inputs(engine_node)) != len(record.inputs):
        raise VerifyInputError(f"{engine_node_name}: its recorded inputs do not fit it")
    fake_mode = compat.fake_tensor_mode()
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    placeholders = []
    for index, value in enumerate(record.inputs):
        placeholder = graph.placeholder(f"in_{index}")
        placeholder.meta["val"] = fake_mode.from_tensor(value)
        placeholders.append(placeholder)
    rest = []
    for argument in engine_node.args[1:]:
        if isinstance(argument, torch.fx.Node):
            if argument.op != "get_attr":
                raise VerifyInputError(f"{engine_node_name}: an engine argument is computed by the program")
            target = str(argument.target)
            setattr(root, target, getattr(module, target))  # one level: get_attr targets of a flat program
            attribute = graph.get_attr(target)
            attribute.meta.update(argument.meta)
            rest.append(attribute)
        else:
            rest.append(argument)
    call_node = graph.call_function(engine_node.target, (placeholders, *rest), dict(engine_node.kwargs))
    outputs = [fake_mode.from_tensor(value) for value in record.outputs]
    call_node.meta["val"] = outputs
    getitems = []
    for index, value in enumerate(outputs):
        getitem = graph.call_function(operator.getitem, (call_node, index))
        getitem.meta["val"] = value
        getitems.append(getitem)
    graph.output(tuple(getitems))
    try:
        program = exported_program_from_graph(torch.fx.GraphModule(root, graph), None, (tuple(record.inputs), {}))
        reference = ReferenceIO(list(record.inputs), {}, list(record.outputs), boundaries=[record])
        buffer = io.BytesIO()
        torch.export.save(program, buffer, extra_files={REFERENCE_IO_FILE: encode_reference_io(reference)})
    except VerifyInputError:
        raise
    except Exception as exc:
        raise VerifyInputError(f"{engine_node_name}: torch cannot build a program of it alone ({exc})") from exc
    return buffer.getvalue()
