"""A divergence as a standalone repro: the engine or fallback region that diverged, its recorded inputs and outputs.

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
A diverging fallback region is extracted the same way (:func:`region_repro`):
its PyTorch nodes alone, on the engine outputs and inputs it was recorded reading.
"""

from __future__ import annotations

import io
import operator
import os
import re
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.fx
from torch.utils import _pytree as pytree

from trt_inline import compat
from trt_inline.archive.reference_io import REFERENCE_IO_FILE, EngineBoundary, ReferenceIO, encode_reference_io
from trt_inline.engines import engine_inputs, is_engine_call
from trt_inline.errors import VerifyInputError
from trt_inline.formats import atomic_write
from trt_inline.inlining.attributes import resolve_attribute
from trt_inline.inlining.flat_program import exported_program_from_graph
from trt_inline.verify.graph_table import Vocabulary
from trt_inline.verify.report import Divergence

__all__ = ["diverged_engine", "diverged_value", "engine_repro", "region_repro", "repro_folder", "write_repro"]

_ENGINE = re.compile(r"^engine (\d+) \(")
_FEEDING = re.compile(r"\(feeding (?:engine (\d+) in\[(\d+)\]|output (\d+))\)$")


def diverged_engine(divergence: Divergence | None) -> int | None:
    """The index of the engine call a divergence names (an engine, one that raised, or one that does not fit)."""
    match = _ENGINE.match(divergence.where) if divergence is not None else None
    return int(match.group(1)) if match else None


def diverged_value(divergence: Divergence | None) -> tuple[int, int] | int | None:
    """What a diverging fallback region computes: (engine, input position), or a program output's index."""
    if divergence is None or divergence.kind != "fallback":
        return None
    match = _FEEDING.search(divergence.where)
    if match is None:
        return None
    engine, position, output = match.groups()
    return int(output) if output is not None else (int(engine), int(position))


REPRO_SCRIPT = '''"""Reproduces {what} of {source}: alone on its recorded inputs, against its recorded outputs.

    python repro.py [repro.pt2]      (exit 1 when it diverges, as trt-inline verify)

The file is checked and run in a sandboxed child process, as trt-inline verify runs any file: what
it holds came from the file that was verified.
"""

import sys
from pathlib import Path

import trt_inline

path = sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("repro.pt2")
report = trt_inline.verify(path{per_engine}{trust})
print(report.to_text())
sys.exit(0 if report.ok else 1)
'''


def write_repro(
    folder: str | os.PathLike[str], what: str, archive: bytes, source: str, native_code: bool
) -> list[Path]:
    """``folder/repro.pt2`` and ``folder/repro.py`` (atomically; ``folder`` is made, its parent must exist).

    ``what`` comes from the file verified (an engine's or a region's name): only
    plain characters of it reach the script, so no name can end its docstring.
    """
    target = repro_folder(folder)
    target.mkdir(exist_ok=True)
    script = REPRO_SCRIPT.format(
        what=_plain(what),
        source=_plain(Path(source).name),
        per_engine=", per_engine=True" if _ENGINE.match(what) else "",  # a region's repro has no engine
        trust=", allow_native_code=True" if native_code else "",
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
        archive = _archive(root, graph, ReferenceIO(list(record.inputs), {}, list(record.outputs), boundaries=[record]))
    except VerifyInputError:
        raise
    except Exception as exc:
        raise VerifyInputError(f"{engine_node_name}: torch cannot build a program of it alone ({exc})") from exc
    return archive


def region_repro(
    module: torch.fx.GraphModule,
    fed: tuple[int, int] | int,
    recorded: Sequence[EngineBoundary],
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
) -> bytes:
    """A ``.pt2`` archive of the fallback region computing an engine input or program output, on recorded values.

    ::

        before (the whole file)                              after (DIR/repro.pt2)

        engine 1 ─► getitem_3 ─► relu_1 ─► mul ─► engine 2     getitem_3 ─► relu_1 ─► mul ─► OUTPUT
                                          ▲                                         ▲
        x ────────────────────────────────┘                   x ───────────────────┘

    ``fed``: the engine input (engine, position) or program output (index) the
    region computes (:func:`diverged_value`); what the compiled module recorded
    there (``recorded``, ``outputs``) is the repro's expected output. The
    region's nodes are copied with their weights; each value it reads (an
    engine's output, a program input) becomes a placeholder of the same name,
    holding what was recorded there (``inputs`` for the program's own inputs).
    Raises :class:`VerifyInputError` where a value it reads was not recorded or
    torch cannot build the program.
    """
    value, expected = _fed_value(module, fed, recorded, outputs)
    try:
        root, graph, read_values = _region_graph(module, value, recorded, inputs)
        archive = _archive(root, graph, ReferenceIO(list(read_values), {}, [expected]))
    except VerifyInputError:
        raise
    except Exception as exc:  # a graph this cannot copy is a repro not written, never a verify that fails
        raise VerifyInputError(f"{value.name}: torch cannot build a program of its region alone ({exc})") from exc
    return archive


def _region_graph(
    module: torch.fx.GraphModule,
    value: torch.fx.Node,
    recorded: Sequence[EngineBoundary],
    inputs: Sequence[torch.Tensor],
) -> tuple[torch.nn.Module, torch.fx.Graph, list[torch.Tensor]]:
    """The region computing ``value`` as a graph of its own (with the weights it reads), and its recorded inputs."""
    words = Vocabulary(module.graph)
    nodes, reads = words.region_nodes(value)
    if not nodes:
        raise VerifyInputError(f"{value.name} is wired straight from another value: there is no region to extract")
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    read_values = []
    for read in reads:
        if read.op == "placeholder" and placeholders.index(read) < len(inputs):
            read_values.append(inputs[placeholders.index(read)])
        elif words.engine_output(read) and isinstance(read.args[1], int):
            engine = words.engine_index[read.args[0]]  # type: ignore[index]
            engine_outputs = recorded[engine].outputs if engine < len(recorded) else []
            if read.args[1] >= len(engine_outputs):
                raise VerifyInputError(f"{read.name}: engine {engine} output {read.args[1]} was not recorded")
            read_values.append(engine_outputs[read.args[1]])
        else:
            raise VerifyInputError(f"{read.name}: the region reads a value that was not recorded")
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    copied: dict[torch.fx.Node, torch.fx.Node] = {}
    for read in reads:
        copied[read] = graph.placeholder(read.name)
        copied[read].meta.update(read.meta)
    weights = 0
    for node in nodes:
        for argument in node.all_input_nodes:
            if argument not in copied and argument.op == "get_attr":
                name = f"_{weights}_{str(argument.target).replace('.', '_')}"
                root.register_buffer(name, _attribute(module, str(argument.target)))
                weights += 1
                copied[argument] = graph.get_attr(name)
                copied[argument].meta.update(argument.meta)
        copied[node] = graph.node_copy(node, copied.__getitem__)
    graph.output((copied[value],))
    return root, graph, read_values


def _fed_value(
    module: torch.fx.GraphModule,
    fed: tuple[int, int] | int,
    recorded: Sequence[EngineBoundary],
    outputs: Sequence[torch.Tensor],
) -> tuple[torch.fx.Node, torch.Tensor]:
    """The node computing an engine input (engine, position) or a program output (index), and its recorded value."""
    expected: Sequence[torch.Tensor]
    if isinstance(fed, tuple):
        engine, position = fed
        engine_nodes = [n for n in module.graph.nodes if is_engine_call(n)]
        wired = engine_inputs(engine_nodes[engine]) if engine < len(engine_nodes) else []
        expected = recorded[engine].inputs if engine < len(recorded) else []
        value, index = (wired[position] if position < len(wired) else None), position
    else:
        output_node = next(n for n in reversed(module.graph.nodes) if n.op == "output")
        returned = pytree.tree_leaves(output_node.args[0])
        value, index, expected = (returned[fed] if fed < len(returned) else None), fed, outputs
    if not isinstance(value, torch.fx.Node) or index >= len(expected):
        raise VerifyInputError("the value the diverging region computes was not recorded")
    return value, expected[index]


def _archive(root: torch.nn.Module, graph: torch.fx.Graph, reference: ReferenceIO) -> bytes:
    """The ``.pt2`` bytes of a repro: ``graph`` as a program on ``reference``'s inputs, embedding ``reference``."""
    program = exported_program_from_graph(torch.fx.GraphModule(root, graph), None, (tuple(reference.args), {}))
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={REFERENCE_IO_FILE: encode_reference_io(reference)})
    return buffer.getvalue()


def _attribute(module: torch.nn.Module, target: str) -> torch.Tensor:
    value = resolve_attribute(module, target)[2]
    if not isinstance(value, torch.Tensor):
        raise VerifyInputError(f"{target}: the region reads a {type(value).__name__}, not a tensor")
    return value
