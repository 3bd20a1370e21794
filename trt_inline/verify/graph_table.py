"""A readable table of a flat program at engine / fallback granularity (``trt-inline inspect``).

For each engine: which producer feeds each input position, and who consumes each
output. For each op left to PyTorch: its producers and consumers. A miswired
input shows up as an engine output feeding the wrong position, or an op reading
a producer from the wrong engine.

In the user's terms (:mod:`trt_inline.module_paths`), each engine shows the
modules its steps come from where its engine records them (a reference engine's
program does, step by step; a TensorRT plan does not)::

    engine 1 execute_engine_1   trt_inline.execute_engine.default (_run_on_acc_3)
      in[0]                     <- relu
      covers                    0.proj (Linear), 1.fc (Linear)

and an op left to PyTorch its module path and source line where its node
carries them (``[1.act (ReLU); model.py:32 in forward: h = self.act(h)]``: a
program torch loaded itself; a file's strict reading drops node metadata).
Where nothing shown carries them, one line says so.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from trt_inline import compat, formats
from trt_inline.archive.loading import AOTI_PACKAGE, LoadedFile
from trt_inline.distributed.manifest import (
    REDUCING_OPS,
    RankManifest,
    decode_manifest,
    group_argument,
    is_collective,
)
from trt_inline.engines import REFERENCE_OP, engine_inputs, engine_op, engine_submodule_name, is_engine_call
from trt_inline.errors import EngineFormatError, RefusedOperatorError, printable
from trt_inline.formats import format_size
from trt_inline.module_paths import NOT_RECORDED, Coverage, NodeOrigin, covered, node_origin
from trt_inline.output_tree import describe_spec
from trt_inline.reference.program import load_program
from trt_inline.verify.report import describe_value

__all__ = ["Region", "Vocabulary", "brief", "describe_file", "describe_program", "engine_coverage"]


def describe_file(loaded: LoadedFile) -> str:
    """The table of a file's program; for an AOTInductor package, first what the package holds.

    Nothing of a package's native code is loaded: its graph is shown from the
    ExportedProgram it carries, or the table says plainly that it cannot be.
    """
    manifest = decode_manifest(loaded.manifest_text, str(loaded.path)) if loaded.manifest_text is not None else None
    if loaded.kind != AOTI_PACKAGE and loaded.program is not None:
        return describe_program(loaded.program, manifest)
    # Entry names come from the file: escaped before they reach a terminal.
    marker = f"/{formats.AOTI_FOLDER}"
    native = [(printable(name), size) for name, size in loaded.entries if marker in f"/{name}"]
    models = sorted({f"/{name}".split(marker, 1)[1].split("/", 1)[0] for name, _ in native})
    libraries = [f"{name.rsplit('/', 1)[1]} ({size} bytes)" for name, size in native if name.endswith(".so")]
    lines = [
        f"AOTInductor package: model {', '.join(models)}; {len(native)} AOTInductor files, shared library "
        + (", ".join(libraries) or "none"),
        f"reference I/O: {'embedded' if loaded.has_reference else 'none'}; "
        f"outputs: {', '.join(loaded.output_kinds) or 'not recorded'}",
    ]
    if loaded.program is None:
        lines.append(
            "the package carries no ExportedProgram: its graph exists only as compiled native code, which inspect "
            "does not load, so engines and fallbacks cannot be shown"
        )
        return "\n".join(lines)
    lines.append("graph of the ExportedProgram the package was compiled from:")
    return "\n".join([*lines, describe_program(loaded.program, manifest)])


@dataclass
class Region:
    """The nodes left to PyTorch that produce one engine input (or program output), back to the last boundary.

    ``nodes`` in graph order; ``reads`` the boundary values they start from
    (engine outputs, program inputs), in the ``inspect`` vocabulary. Empty
    ``nodes``: the value is a boundary value itself (wired straight through).
    """

    nodes: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    # In the user's terms (:mod:`trt_inline.module_paths`), "" or empty where the file does not record them: the
    # module path and class and the source line of the node computing the value, the modules of all its nodes,
    # and what each value it reads is in the model (parallel to ``reads``).
    module: str = ""
    source: str = ""
    modules: list[str] = field(default_factory=list)
    read_origins: list[str] = field(default_factory=list)

    def name(self) -> str:
        """``fallback region relu_1``: its nodes, the middle of a long region elided."""
        return f"fallback region {brief(self.nodes)}"

    def describe(self) -> str:
        if not self.nodes:
            return f"wired straight from {', '.join(self.reads) or 'nothing'}"
        return f"{self.name()} (reads {', '.join(self.reads) or 'nothing'})"


def brief(names: list[str], limit: int = 6) -> str:
    """Names joined by commas; past ``limit``, the first three and the last two around a count."""
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:3])}, ... ({len(names) - 5} more) ..., {', '.join(names[-2:])}"


class Vocabulary:
    """Names of a flat graph's values as ``trt-inline inspect`` prints them (and per-engine reports repeat).

    ``kinds``: what each placeholder is (``"user input"``, ``"parameter"`` ...),
    for a lifted program's graph; without it every placeholder is a user input.
    """

    def __init__(self, graph: torch.fx.Graph, kinds: dict[str, str] | None = None) -> None:
        self.engine_index = {n: i for i, n in enumerate(n for n in graph.nodes if is_engine_call(n))}
        self.kinds = kinds or {}
        self._order = {n: i for i, n in enumerate(graph.nodes)}
        self._regions: dict[torch.fx.Node, Region] = {}
        self._coverage: dict[torch.fx.Node, Coverage] = {}

    def engine_output(self, node: torch.fx.Node) -> bool:
        return bool(
            node.target is operator.getitem
            and isinstance(node.args[0], torch.fx.Node)
            and node.args[0] in self.engine_index
        )

    def producer(self, node: Any) -> str:
        if not isinstance(node, torch.fx.Node):
            return repr(node)
        if node.op == "placeholder":
            return f"{node.name} ({self.kinds.get(node.name, 'user input')})"
        if self.engine_output(node):
            return f"{node.name} = engine {self.engine_index[node.args[0]]} output {node.args[1]}"
        return node.name

    def consumers(self, node: torch.fx.Node) -> list[str]:
        users: list[str] = []
        for user in node.users:
            if user.op == "output":
                users.append("OUTPUT")
            elif user in self.engine_index:
                position = engine_inputs(user).index(node)
                users.append(f"engine {self.engine_index[user]} in[{position}]")
            else:
                users.append(user.name)
        return users

    def region(self, value: Any) -> Region:
        """The torch nodes between ``value`` and the boundary values it is computed from."""
        if not isinstance(value, torch.fx.Node):
            return Region()
        if value not in self._regions:
            nodes, reads = self.region_nodes(value)
            origin = self.origin(value) if nodes else NodeOrigin("", "")
            self._regions[value] = Region(
                [n.name for n in nodes], [self.producer(n) for n in reads], origin.module, origin.source,
                list(covered(nodes).modules), [self.in_model(n) for n in reads],
            )  # fmt: skip
        return self._regions[value]

    def origin(self, node: torch.fx.Node) -> NodeOrigin:
        """A torch node's module path and source line (both empty for an engine call, its outputs, an input)."""
        if node.op != "call_function" or node in self.engine_index or self.engine_output(node):
            return NodeOrigin("", "")
        return node_origin(node)

    def coverage(self, engine_node: torch.fx.Node) -> Coverage:
        """The modules and source lines an engine call's steps come from, where its engine records them."""
        if engine_node not in self._coverage:
            self._coverage[engine_node] = engine_coverage(engine_node)
        return self._coverage[engine_node]

    def in_model(self, node: Any) -> str:
        """What a value is in the user's terms: a torch node's module and source line, the modules of the engine an
        engine output comes from; "" where the file does not say (a program input is its own name)."""
        if not isinstance(node, torch.fx.Node):
            return ""
        engine = node.args[0] if self.engine_output(node) else node if node in self.engine_index else None
        if isinstance(engine, torch.fx.Node):
            modules = self.coverage(engine).module_text()
            return f"engine {self.engine_index[engine]} covers {modules}" if modules else ""
        return self.origin(node).describe()

    def near(self, engine_node: torch.fx.Node) -> list[str]:
        """What an engine call reads and feeds, in the user's terms: ``reads relu: 0.act (ReLU); model.py:31 ...``
        for each producer and consumer the file records an origin of."""
        found: dict[str, None] = {}
        for value in engine_inputs(engine_node):
            if isinstance(value, torch.fx.Node) and (origin := self.in_model(value)):
                found.setdefault(f"reads {self.producer(value)}: {origin}")
        for output in engine_node.users:
            value = output if self.engine_output(output) else engine_node
            for user in value.users if value is output else [output]:
                if user.op != "output" and (origin := self.in_model(user)):
                    what = f"engine {self.engine_index[user]} in[{engine_inputs(user).index(value)}]" if (
                        user in self.engine_index) else user.name  # fmt: skip
                    found.setdefault(f"feeds {what}: {origin}")
        return list(found)

    def recorded(self, graph: torch.fx.Graph) -> bool:
        """Whether any torch node or engine of ``graph`` carries a module path or a source line."""
        return any(
            self.coverage(node) if node in self.engine_index else self.origin(node).describe()
            for node in graph.nodes
            if node.op == "call_function"
        )

    def region_nodes(self, value: torch.fx.Node) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
        """:meth:`region` as nodes: the region's torch nodes and the boundary values it reads, in graph order."""
        nodes: set[torch.fx.Node] = set()
        reads: set[torch.fx.Node] = set()
        stack = [value]
        while stack:
            node = stack.pop()
            if node in nodes or node in reads:
                continue
            if node.op == "placeholder" and self.kinds.get(node.name, "user input") != "user input":
                continue  # a weight lifted to a placeholder: part of the region, not a boundary
            if node.op == "placeholder" or self.engine_output(node) or node in self.engine_index:
                reads.add(node)
            elif node.op == "call_function":
                nodes.add(node)
                stack.extend(node.all_input_nodes)
            # get_attr (a weight or constant): part of the region, not a boundary
        return sorted(nodes, key=self._order.__getitem__), sorted(reads, key=self._order.__getitem__)


def engine_coverage(engine_node: torch.fx.Node) -> Coverage:
    """What an engine call covers in the user's terms, where its engine records the nodes it was built from.

    A reference engine's program records, step by step, the module path and source line of the node each step
    was built from (:meth:`~trt_inline.reference.program.EngineProgram.step_origins`); a TensorRT plan records
    none: its coverage is empty, as is that of a program that does not decode (said where it is run).
    """
    text = engine_node.args[2] if len(engine_node.args) > 2 else None
    if engine_op(engine_node) is not REFERENCE_OP or not isinstance(text, str):
        return Coverage()
    try:
        return covered(load_program(text).step_origins())
    except (EngineFormatError, RefusedOperatorError):
        return Coverage()


def _built_on(engine_index: dict[torch.fx.Node, int]) -> str:
    """Which pipeline built the file's reference engines, as their programs say (the first that says; "" where none
    does): a Torch-TensorRT release's own, or trt-inline's emulation of one."""
    for engine_node in engine_index:
        text = engine_node.args[2] if len(engine_node.args) > 2 else None
        if engine_op(engine_node) is REFERENCE_OP and isinstance(text, str):
            try:
                built = load_program(text).built_on
            except (EngineFormatError, RefusedOperatorError):
                continue
            if built:
                return built
    return ""


def _input_kinds(program: ExportedProgram) -> dict[str, str]:
    kinds = {}
    for spec in program.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if name is not None:
            kinds[name] = (
                "user input" if spec.kind is InputKind.USER_INPUT else spec.kind.name.lower().replace("_", " ")
            )
    return kinds


def _shape(node: torch.fx.Node) -> str:
    val = node.meta.get("val")
    return describe_value(val) if val is not None else ""


def describe_program(program: ExportedProgram, manifest: RankManifest | None = None) -> str:
    """One row per input, engine (with its inputs by position and outputs by index), op left to PyTorch, output.

    A rank file (``manifest``) is introduced by its rank and world size; each
    collective says its reduction and its group (name and members).
    """
    graph = program.graph
    kinds = _input_kinds(program)
    words = Vocabulary(graph, kinds)
    engine_index, producer = words.engine_index, words.producer
    lifted = {
        spec.arg.name: spec.target
        for spec in program.graph_signature.input_specs
        if spec.target is not None and isinstance(getattr(spec.arg, "name", None), str)
    }

    def consumers(node: torch.fx.Node) -> str:
        names = [u.name if u.op != "output" else "OUTPUT" for u in node.users]
        return ", ".join(names) or "(unused)"

    rows: list[tuple[str, str, str, str]] = []

    def row(kind: str, name: object, value: str, wiring: str) -> tuple[str, str, str, str]:
        return (kind, str(name), value, wiring)

    groups = manifest.group_ranks() if manifest is not None else {}

    def collective(node: torch.fx.Node) -> str:
        position = group_argument(node.target)
        if position is None or len(node.args) <= position:
            return ""
        name = str(node.args[position])
        members = groups.get(name)
        reducing = compat.op_schema_name(node.target) in REDUCING_OPS and len(node.args) > 1
        reduce_op = f"{printable(str(node.args[1]))[:40]} " if reducing else ""
        who = f"ranks {', '.join(map(str, members))}" if members is not None else "members not recorded"
        return f"  [{reduce_op}on group {printable(name)!r}: {who}]"

    lines = rows
    lines.append(row("kind", "node", "value", "wiring"))
    for node in graph.nodes:
        if node.op == "placeholder" and kinds.get(node.name) == "user input":
            lines.append(row("input", node.name, _shape(node), f"-> {consumers(node)}"))
        elif is_engine_call(node):
            submodule = engine_submodule_name(node, lifted)
            target = f"{node.target} ({submodule})" if submodule else str(node.target)
            lines.append(row(f"engine {engine_index[node]}", node.name, "", target))
            for position, arg in enumerate(engine_inputs(node)):
                lines.append(row(f"  in[{position}]", "", "", f"<- {producer(arg)}"))
            for user in node.users:
                index = user.args[1] if user.target is operator.getitem else "?"
                lines.append(row(f"  out[{index}]", user.name, _shape(user), f"-> {consumers(user)}"))
            if modules := words.coverage(node).module_text(_COVERS_SHOWN):
                lines.append(row("  covers", "", "", modules))
        elif node.op == "call_function" and not words.engine_output(node):
            target = str(node.target).removeprefix("aten.")
            sources = ", ".join(producer(a) for a in node.all_input_nodes if kinds.get(a.name) not in _WEIGHT_KINDS)
            wiring = f"{target}({sources}) -> {consumers(node)}"
            if is_collective(node.target):
                wiring += collective(node)
            if origin := words.origin(node).describe():
                wiring += f"  [{origin}]"
            lines.append(row("torch", node.name, _shape(node), wiring))
        elif node.op == "output":
            outputs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
            paths = _output_paths(program, len(outputs))
            for position, value in enumerate(outputs):
                lines.append(row(f"output {position}", paths[position], "", f"<- {producer(value)}"))
    table = _aligned(rows)
    if not words.recorded(graph) and any(cells[0] == "torch" or cells[0].startswith("engine ") for cells in rows):
        table.append(NOT_RECORDED)  # (once, not on every row)
    if manifest is not None:
        table.insert(
            0,
            f"{manifest.describe()} of a tensor-parallel rank set (backend {manifest.backend}, save "
            f"{manifest.save_id[:12]}, {len(manifest.collectives)} collectives)",
        )
    built = _built_on(engine_index)
    return "\n".join([*table, _summary(program, kinds, engine_index, rows), *([f"built on: {built}"] if built else [])])


def _aligned(rows: list[tuple[str, str, str, str]]) -> list[str]:
    """The rows in columns as wide as their widest cell (any number of engines, any name), a space apart."""
    widths = [max(len(cells[column]) for cells in rows) for column in range(3)]
    return [
        (" ".join(cell.ljust(width) for cell, width in zip(cells[:3], widths, strict=True)) + " " + cells[3]).rstrip()
        for cells in rows
    ]


def _output_paths(program: ExportedProgram, count: int) -> list[str]:
    """How a caller reads each output (``out['scores']``), where the program's output spec says; else blanks."""
    try:
        tree = describe_spec(program.call_spec.out_spec)
    except Exception:  # (a spec torch cannot unflatten here: the positions alone)
        return [""] * count
    return list(tree.paths) if tree.named and len(tree.paths) == count else [""] * count


def _summary(
    program: ExportedProgram,
    input_kinds: dict[str, str],
    engine_index: dict[torch.fx.Node, int],
    rows: list[tuple[str, str, str, str]],
) -> str:
    """One line: engines, ops left to PyTorch, inputs, outputs, weights (count and size, from their declarations)."""
    kinds = [cells[0] for cells in rows]
    weights = [
        node.meta.get("val")
        for node in program.graph.nodes
        if node.op == "placeholder" and input_kinds.get(node.name) in _WEIGHT_KINDS
    ]
    nbytes = sum(
        value.numel() * value.element_size()
        for value in weights
        if isinstance(value, torch.Tensor) and all(isinstance(d, int) for d in value.shape)
    )

    def count(number: int, noun: str) -> str:
        return f"{number} {noun}{'' if number == 1 else 's'}"

    return (
        f"{count(len(engine_index), 'engine')}, {count(kinds.count('torch'), 'op')} left to PyTorch, "
        f"{count(kinds.count('input'), 'input')}, {count(sum(k.startswith('output ') for k in kinds), 'output')}, "
        f"{count(len(weights), 'weight')} ({format_size(nbytes)})"
    )


_WEIGHT_KINDS = {"parameter", "buffer", "constant tensor", "custom obj"}
_COVERS_SHOWN = 6  # modules an engine's row of inspect names before a count
