"""Structural checks on a saved program's graph, one function per check.

Each check takes the program and returns ``Findings``: problems (verification
fails) and notes (it does not). Engine-specific knowledge (which nodes are
engines, what an engine declares about its inputs and outputs) comes from the
engine registry, :mod:`trt_inline.engines`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from trt_inline import engines
from trt_inline.distributed.manifest import rank_check_problem
from trt_inline.errors import TrtInlineError, first_line
from trt_inline.inlining.attributes import resolve_attribute
from trt_inline.verify.declared import output_spec_problems
from trt_inline.verify.report import describe_value

__all__ = ["CHECKS", "Findings", "structural_problems"]


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_lint(program: ExportedProgram) -> Findings:
    """FX's own consistency check of the graph."""
    try:
        program.graph.lint()
    except Exception as exc:
        return Findings([f"lint: {first_line(exc)}"])
    return Findings()


def check_definition_order(program: ExportedProgram) -> Findings:
    """Every node reads only nodes defined before it (the seed bug's "used before it has been defined")."""
    found = Findings()
    defined: set[torch.fx.Node] = set()
    for node in program.graph.nodes:
        for arg in node.all_input_nodes:
            if arg not in defined:
                found.problems.append(f"node {node.name} uses {arg.name} before it is defined")
        defined.add(node)
    return found


def check_unused_inputs(program: ExportedProgram) -> Findings:
    """An unread user input is a problem; an unread lifted weight is worth a note."""
    found = Findings()
    user_inputs = set(program.graph_signature.user_inputs)
    engine_constants = _engine_constant_placeholders(program)
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.users or node.name in engine_constants:
            continue
        if node.name in user_inputs:
            found.problems.append(f"user input {node.name} is never used")
        else:
            found.notes.append(f"lifted input {node.name} is never used")
    return found


def check_get_attr_targets(program: ExportedProgram) -> Findings:
    """Every ``get_attr`` names an attribute the module has."""
    found = Findings()
    for node in program.graph.nodes:
        if node.op != "get_attr":
            continue
        try:
            resolve_attribute(program.graph_module, str(node.target))
        except AttributeError:
            found.problems.append(f"get_attr {node.name} names {node.target!r}, which the module does not have")
    return found


def check_no_call_modules(program: ExportedProgram) -> Findings:
    """An ExportedProgram calls no submodules: they were all inlined."""
    return Findings(
        [
            f"node {node.name} calls submodule {node.target!r}; an ExportedProgram may not"
            for node in program.graph.nodes
            if node.op == "call_module"
        ]
    )


def check_engine_inputs(program: ExportedProgram) -> Findings:
    """Each engine call gets as many inputs as its engine takes, of the dtypes and static dims it declares."""
    found = Findings()
    for node in program.graph.nodes:
        if not engines.is_engine_call(node):
            continue
        try:
            signature = engines.engine_signature(node)
        except TrtInlineError as exc:
            found.problems.append(f"engine {node.name}: unreadable program ({exc})")
            continue
        if signature is None:
            continue
        wired = engines.engine_inputs(node)
        if len(wired) != len(signature.inputs):
            found.problems.append(
                f"engine {node.name}: {len(wired)} inputs wired, the engine takes {len(signature.inputs)}"
            )
        for index, (arg, spec) in enumerate(zip(wired, signature.inputs, strict=False)):
            val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
            if spec is None or not isinstance(val, torch.Tensor) or _matches(val, spec):
                continue
            expected = "a scalar (0-d " if spec.scalar else ""
            expected += f"{str(spec.dtype).removeprefix('torch.')}{list(spec.dims)}" + (")" if spec.scalar else "")
            found.problems.append(
                f"engine {node.name}: input {index} is {arg.name} ({describe_value(val)}), "
                f"the engine expects {expected}"
            )
        val = node.meta.get("val")
        if isinstance(val, (list, tuple)) and len(val) != len(signature.outputs):
            found.problems.append(
                f"engine {node.name}: meta lists {len(val)} outputs, the engine has {len(signature.outputs)}"
            )
    if any(engines.is_engine_call(n) and engines.engine_op(n) is not engines.REFERENCE_OP for n in program.graph.nodes):
        found.notes.append("TensorRT engine inputs are not checked without the TensorRT runtime")
    return found


def _matches(val: torch.Tensor, spec: engines.ValueSpec) -> bool:
    if val.dtype != spec.dtype or val.dim() != len(spec.dims):
        return False
    return all(d is None or not isinstance(v, int) or v == d for v, d in zip(val.shape, spec.dims, strict=True))


def check_getitems(program: ExportedProgram) -> Findings:
    """``getitem(producer, i)`` reads an output the producer has, and its ``meta["val"]`` agrees with it."""
    found = Findings()
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not operator.getitem:
            continue
        producer, index = node.args[0], node.args[1]
        if not isinstance(producer, torch.fx.Node) or not isinstance(index, int):
            continue
        count = _output_count(producer)
        if count is not None and not -count <= index < count:
            found.problems.append(f"{node.name} reads output {index} of {producer.name}, which has {count}")
            continue
        vals = producer.meta.get("val")
        if isinstance(vals, (list, tuple)) and -len(vals) <= index < len(vals):
            if not _same_meta(node.meta.get("val"), vals[index]):
                found.problems.append(
                    f"{node.name}: meta {describe_value(node.meta.get('val'))} disagrees with output {index} "
                    f"of {producer.name} ({describe_value(vals[index])})"
                )
    return found


def _output_count(producer: torch.fx.Node) -> int | None:
    if engines.is_engine_call(producer):
        try:
            return engines.output_count(producer)
        except TrtInlineError:
            return None
    vals = producer.meta.get("val")
    return len(vals) if isinstance(vals, (list, tuple)) else None


def _same_meta(a: Any, b: Any) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return True  # nothing to compare
    if a.dtype != b.dtype or a.dim() != b.dim():
        return False
    return all(not (isinstance(x, int) and isinstance(y, int)) or x == y for x, y in zip(a.shape, b.shape, strict=True))


def check_orphaned_engine_outputs(program: ExportedProgram) -> Findings:
    """Every engine output, every engine, and every lifted engine constant is read by something.

    Torch-TensorRT's partitioner only makes a value an engine output when a node
    outside the engine reads it. An output nobody reads, an engine whose outputs
    nobody reads (dead code elimination removes it, leaving its constant), is what
    a consumer wired to the wrong tensor leaves behind: the seed bug's silent form.
    """
    found = Findings()
    engine_calls = [node for node in program.graph.nodes if engines.is_engine_call(node)]
    for position, node in enumerate(engine_calls):
        try:
            count = engines.output_count(node)
        except TrtInlineError:
            count = None
        by_index, others = engines.engine_output_users(node)
        if others or count is None:
            continue
        # A getitem nobody reads does not count: deserialisation makes one for every output of an op.
        unread = [i for i in range(count) if not any(getitem.users for getitem in by_index.get(i, []))]
        if len(unread) == count:
            found.problems.append(
                f"engine {position} ({node.name}): none of its {count} outputs is read; "
                "the likely cause is a consumer wired to another tensor"
            )
        elif unread:
            outputs = ", ".join(map(str, unread))
            found.problems.append(
                f"engine {position} ({node.name}): output {outputs} is never read; "
                "the likely cause is a consumer wired to another tensor"
            )
    for name, target in sorted(_engine_constant_placeholders(program).items()):
        placeholder = next(n for n in program.graph.nodes if n.name == name)
        if not placeholder.users:
            found.problems.append(
                f"engine constant {target!r} is never read: its engine was removed as dead code; "
                "the likely cause is a consumer wired to another tensor"
            )
    return found


def _engine_constant_placeholders(program: ExportedProgram) -> dict[str, str]:
    """{placeholder name: target} of the lifted inputs that hold an engine (by the exporter's naming)."""
    result: dict[str, str] = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind is InputKind.USER_INPUT or spec.target is None:
            continue
        name = getattr(spec.arg, "name", None)
        if isinstance(name, str) and engines.is_engine_attribute(spec.target):
            result[name] = spec.target
    return result


def check_output_specs(program: ExportedProgram) -> Findings:
    """Each user output's spec says the kind of value its graph declares (a SymInt is no tensor)."""
    return Findings(output_spec_problems(program))


def check_rank_check(program: ExportedProgram) -> Findings:
    """A rank check (``trt_inline::check_ranks``) is called once, first, with a manifest: verify never runs it
    against a live process group, so where it stands and what it carries are checked here (the manifest against
    the file's own in every verify of a file: ``verifier._carried_rank_check``)."""
    problem = rank_check_problem(program.graph_module)
    return Findings([problem] if problem is not None else [])


CHECKS: tuple[Callable[[ExportedProgram], Findings], ...] = (
    check_lint,
    check_definition_order,
    check_unused_inputs,
    check_get_attr_targets,
    check_no_call_modules,
    check_engine_inputs,
    check_getitems,
    check_orphaned_engine_outputs,
    check_output_specs,
    check_rank_check,
)


def structural_problems(program: ExportedProgram) -> tuple[list[str], list[str]]:
    """(problems, notes) of a program's graph. Problems fail verification; notes do not."""
    problems: list[str] = []
    notes: list[str] = []
    for check in CHECKS:
        found = check(program)
        problems += found.problems
        notes += found.notes
    return problems, notes
