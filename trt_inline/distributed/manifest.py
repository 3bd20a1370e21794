"""What a rank file records about the rank set that saved it, and the checks made against a live one.

A tensor-parallel model is saved as one file per rank. Each file carries a
manifest (the extra file :data:`MANIFEST_FILE`, JSON)::

    {"format": "trt_inline.ranks/1", "save_id": "5f0c...", "rank": 1, "world_size": 2, "backend": "gloo",
     "groups": [{"name": "0", "ranks": [0, 1]}],
     "collectives": [{"op": "_c10d_functional::all_reduce.default", "group": "0", "reduce_op": "sum",
                      "shape": ["s0", 16], "dtype": "float32"}, ...]}

``groups`` are the process groups the program's collectives name, with their
members (global ranks); ``collectives`` the program's collective operators in
graph order (a reference engine's own, in its program's order, where the
engine is called). The same ``save_id`` marks every file of one collective save.

A rank file may also carry the manifest in its program, as the argument of
:data:`RANK_CHECK_OP` called first (:mod:`trt_inline.distributed.rank_check`);
:func:`rank_check_problem` says where that call is not the one a save inserts.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.fx

from trt_inline import compat, engines, formats
from trt_inline.errors import VerifyInputError, printable
from trt_inline.switches import RANK_CHECK_OP

__all__ = [
    "COLLECTIVE_OPS",
    "REDUCING_OPS",
    "FORMAT",
    "MANIFEST_FILE",
    "RANK_CHECK_OP",
    "Collective",
    "agreed_shape",
    "describe_shape",
    "shape_fits",
    "Group",
    "RankManifest",
    "collectives_of",
    "decode_manifest",
    "first_difference",
    "group_argument",
    "is_collective",
    "is_count",
    "live_group_ranks",
    "live_mismatch",
    "program_mismatch",
    "rank_check_nodes",
    "rank_check_problem",
    "rebind_groups",
]

MANIFEST_FILE = formats.RANK_MANIFEST_FILE
FORMAT = "trt_inline.ranks/1"

# The collective operators a rank file may call, with the position of their group-name argument.
# torch's functional collectives (what export writes for dist.* and DTensor) and Torch-TensorRT's
# fused NCCL ops (registered by torch_tensorrt; GPU only).
COLLECTIVE_OPS: dict[str, int | None] = {
    "_c10d_functional::all_reduce": 2,
    "_c10d_functional::all_gather_into_tensor": 2,
    "_c10d_functional::reduce_scatter_tensor": 3,
    "_c10d_functional::all_to_all_single": 3,
    "_c10d_functional::broadcast": 2,
    "_c10d_functional::wait_tensor": None,
    "tensorrt::fused_nccl_all_gather": None,
    "tensorrt::fused_nccl_reduce_scatter": None,
    "tensorrt::fused_nccl_all_reduce": None,
    "tensorrt::fused_nccl_all_to_all": None,
    "tensorrt::fused_nccl_gather": None,
    "tensorrt::fused_nccl_scatter": None,
}
# The collectives whose second argument names a reduction ("sum", "max", ...).
REDUCING_OPS = frozenset({"_c10d_functional::all_reduce", "_c10d_functional::reduce_scatter_tensor"})
_MAX_GROUPS = 64
_MAX_COLLECTIVES = 1 << 16


def _base_name(target: Any) -> str | None:
    name = compat.op_schema_name(target) if isinstance(target, compat.OpOverload) else None
    if name is None and isinstance(target, str):
        name = target.partition(".")[0]
    return name


def is_collective(target: Any) -> bool:
    """Whether a node target (an OpOverload, or a qualified name) is a collective operator."""
    return _base_name(target) in COLLECTIVE_OPS


def group_argument(target: Any) -> int | None:
    """The position of the group-name argument of a collective target (None: it names no group)."""
    name = _base_name(target)
    return COLLECTIVE_OPS.get(name) if name is not None else None


@dataclass(frozen=True)
class Group:
    name: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Collective:
    op: str  # qualified, with overload
    group: str | None
    reduce_op: str | None
    shape: tuple[int | str, ...]
    dtype: str
    where: str  # the node (or engine and step) that calls it

    def signature(self) -> tuple[Any, ...]:
        """What every rank of a set must agree on (the node names may differ): operator, group, reduction, dtype
        and the shape of the tensor it sends (:func:`agreed_shape`: the part every rank sends alike)."""
        return self.op, self.group, self.reduce_op, self.dtype, list(self.shape)


def agreed_shape(op: str, shape: Sequence[int | str]) -> tuple[int | str, ...]:
    """The part of a collective's input shape every rank of its group sends alike: all of it, but the rows of an
    ``all_to_all_single`` (each rank may send its own number, as its splits say)."""
    if op.partition(".")[0] == "_c10d_functional::all_to_all_single" and shape:
        return ("*", *shape[1:])
    return tuple(shape)


def shape_fits(declared: Sequence[int | str], shape: Sequence[int]) -> bool:
    """Whether a tensor of ``shape`` is one a manifest's ``declared`` shape describes: the same rank, each static
    dimension equal (a symbol, or ``*``, stands for any size)."""
    return len(declared) == len(shape) and all(
        isinstance(d, str) or (type(d) is int and d == n) for d, n in zip(declared, shape, strict=True)
    )


def describe_shape(shape: Sequence[int | str]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


@dataclass
class RankManifest:
    rank: int
    world_size: int
    backend: str
    save_id: str
    groups: list[Group] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)

    def group_ranks(self) -> dict[str, tuple[int, ...]]:
        return {group.name: group.ranks for group in self.groups}

    def encode(self) -> str:
        document = {"format": FORMAT, **asdict(self)}
        return json.dumps(document, sort_keys=True)

    def describe(self) -> str:
        return f"rank {self.rank} of {self.world_size}"


def _dim(value: Any) -> int | str:
    return int(value) if isinstance(value, int) else str(value)


def _tensor_of(node: torch.fx.Node) -> tuple[tuple[int | str, ...], str]:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return tuple(_dim(d) for d in value.shape), str(value.dtype).removeprefix("torch.")
    return (), "unknown"


def _collective_of_node(node: torch.fx.Node, where: str) -> Collective:
    target = node.target
    name = compat.op_schema_name(target) or str(target)
    position = group_argument(target)
    group = None
    if position is not None:
        raw = node.args[position] if len(node.args) > position else node.kwargs.get("group_name")
        group = str(raw) if raw is not None else None
    reduce_op = str(node.args[1]) if name in REDUCING_OPS and len(node.args) > 1 else None
    source = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else node
    shape, dtype = _tensor_of(source)
    overload = compat.op_overload_name(target) if isinstance(target, compat.OpOverload) else "default"
    return Collective(f"{name}.{overload}", group, reduce_op, shape, dtype, where)


def collectives_of(module: torch.nn.Module) -> list[Collective]:
    """The collectives a module calls, in the order it calls them.

    ``module`` is a compiled module (fallback submodules are walked where they
    are called) or a flat program's module; reference engines' programs are
    read for their own collectives. A TensorRT engine's NCCL layers are inside
    its plan and are not listed.
    """
    return list(_walk(module, ""))


def _walk(module: torch.nn.Module, prefix: str) -> Iterator[Collective]:
    if not isinstance(module, torch.fx.GraphModule):
        return
    for node in module.graph.nodes:
        where = f"{prefix}{node.name}"
        if node.op == "call_function" and is_collective(node.target):
            yield _collective_of_node(node, where)
        elif node.op == "call_function" and engines.is_engine_call(node):
            yield from _engine_collectives(node, where)
        elif node.op == "call_module":
            child = module.get_submodule(str(node.target))
            if isinstance(child, torch.fx.GraphModule):
                yield from _walk(child, f"{where}.")
            else:
                program = getattr(child, "program", None)
                if isinstance(program, str):
                    yield from _program_collectives(program, where)


def _program_args(node: torch.fx.Node) -> Iterator[tuple[int, str]]:
    """(position, text) of an engine call's program arguments: a reference engine's JSON program."""
    for position, arg in enumerate(node.args):
        if isinstance(arg, str) and arg.startswith("{"):
            yield position, arg


def _engine_collectives(node: torch.fx.Node, where: str) -> Iterator[Collective]:
    for _, program in _program_args(node):
        yield from _program_collectives(program, where)


def _collective_steps(document: Any) -> Iterator[tuple[int, str, str, list[Any]]]:
    """(index, target, base name, args) of each collective step of a decoded reference-engine program."""
    steps = document.get("steps", []) if isinstance(document, dict) else []
    for index, step in enumerate(steps if isinstance(steps, list) else []):
        target = str(step.get("target", "")) if isinstance(step, dict) else ""
        base = target.partition(".")[0]
        args = step.get("args", []) if base in COLLECTIVE_OPS else None
        if isinstance(args, list):
            yield index, target, base, args


def _program_collectives(program: str, where: str) -> Iterator[Collective]:
    """A reference engine's collectives, from its program's steps (by name: nothing is resolved here)."""
    try:
        document = json.loads(program)
    except ValueError:
        return
    for index, target, base, args in _collective_steps(document):
        position = COLLECTIVE_OPS[base]
        group = args[position] if position is not None and len(args) > position else None
        reduce_op = args[1] if base in REDUCING_OPS and len(args) > 1 else None
        yield Collective(
            target if "." in target else f"{target}.default",
            str(group) if group is not None else None,
            str(reduce_op) if reduce_op is not None else None,
            (),
            "unknown",
            f"{where} step {index}",
        )


def decode_manifest(text: str, where: str) -> RankManifest:
    """A manifest read from a file (untrusted): every field checked, every string escaped."""
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ValueError(f"not in format {FORMAT!r}")
        groups = document["groups"]
        collectives = document["collectives"]
        if not isinstance(groups, list) or len(groups) > _MAX_GROUPS:
            raise ValueError("groups is not a list of at most 64")
        if not isinstance(collectives, list) or len(collectives) > _MAX_COLLECTIVES:
            raise ValueError("collectives is not a list of at most 65536")
        manifest = RankManifest(
            rank=_count(document["rank"]),
            world_size=_count(document["world_size"]),
            backend=_text(document["backend"]),
            save_id=_text(document["save_id"]),
            groups=[Group(_text(g["name"]), tuple(_count(r) for r in g["ranks"])) for g in groups],
            collectives=[
                Collective(
                    _text(c["op"]),
                    None if c["group"] is None else _text(c["group"]),
                    None if c["reduce_op"] is None else _text(c["reduce_op"]),
                    tuple(d if isinstance(d, int) and not isinstance(d, bool) else _text(d) for d in c["shape"]),
                    _text(c["dtype"]),
                    _text(c["where"]),
                )
                for c in collectives
            ],
        )
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise VerifyInputError(
            f"{where}: its rank manifest ({MANIFEST_FILE}) is unusable: {printable(str(exc))}"
        ) from None
    if not manifest.rank < manifest.world_size:
        raise VerifyInputError(f"{where}: its rank manifest records rank {manifest.rank} of {manifest.world_size}")
    names = [group.name for group in manifest.groups]
    for group in manifest.groups:
        if not group.ranks or any(r >= manifest.world_size for r in group.ranks):
            raise VerifyInputError(f"{where}: its rank manifest's group {group.name!r} has ranks outside the world")
        if len(set(group.ranks)) != len(group.ranks) or list(group.ranks) != sorted(group.ranks):
            raise VerifyInputError(f"{where}: its rank manifest's group {group.name!r} lists its ranks out of order")
        if manifest.rank not in group.ranks:
            raise VerifyInputError(f"{where}: its rank manifest's group {group.name!r} does not hold its own rank")
    if len(set(names)) != len(names):
        raise VerifyInputError(f"{where}: its rank manifest names a group twice")
    used = {c.group for c in manifest.collectives if c.group is not None}
    if used != set(names):
        raise VerifyInputError(
            f"{where}: its rank manifest's groups ({', '.join(sorted(names))}) are not the ones its collectives name "
            f"({', '.join(sorted(used))})"
        )
    for collective in manifest.collectives:
        if collective.op.partition(".")[0] not in COLLECTIVE_OPS:
            raise VerifyInputError(f"{where}: its rank manifest lists {collective.op}, which is not a collective")
    return manifest


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice in one object")
    return dict(pairs)


def is_count(value: Any, bound: int) -> bool:
    """An int (not a bool) in [0, bound]: a rank, a size, a byte count read from something untrusted."""
    return type(value) is int and 0 <= value <= bound


def _count(value: Any) -> int:
    if not is_count(value, (1 << 20) - 1):
        raise ValueError(f"{printable(repr(value))[:40]} is not a rank or a count")
    return int(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 200:
        raise ValueError("a field is not a string of at most 200 characters")
    return printable(value)


def first_difference(first: Sequence[Any], second: Sequence[Any]) -> int:
    """The first index where two sequences differ (the shorter one's length if one continues the other)."""
    pairs = enumerate(zip(first, second, strict=False))
    return next((i for i, (a, b) in pairs if a != b), min(len(first), len(second)))


def _declared(collective: Collective) -> tuple[Any, ...]:
    """What a manifest must say of a collective the program calls: operator, group, reduction, dtype and shape
    (a dimension as its size, or as a symbol of any name: a loaded program may name its symbols otherwise)."""
    shape = tuple(d if type(d) is int else "symbol" for d in collective.shape)
    return collective.op, collective.group, collective.reduce_op, collective.dtype, shape


def program_mismatch(manifest: RankManifest, module: torch.nn.Module, where: str) -> str | None:
    """Why ``manifest`` does not describe ``module``'s collectives (operator, group, reduction, dtype and shape, in
    order: a reference engine's as "unknown", its steps record none), or None.

    The agreement between ranks and the relay's checks go by the manifest: a
    stale or forged one would let the ranks' runs pair different collectives.
    The rank check the program carries, if any, must carry ``manifest``
    (:func:`rank_check_problem`): verify never runs it against a live process group.
    """
    found = [_declared(c) for c in collectives_of(module)]
    recorded = [_declared(c) for c in manifest.collectives]
    if found == recorded:
        check = rank_check_problem(module, manifest)
        return None if check is None else f"{where}: {check}"
    index = first_difference(found, recorded)

    def side(declared: list[tuple[Any, ...]]) -> str:
        if index >= len(declared):
            return "nothing"
        op, group, _, dtype, shape = declared[index]
        return f"{op} on group {group!r} of {dtype}{describe_shape(shape)}"

    program_side, manifest_side = side(found), side(recorded)
    return (
        f"{where}: its rank manifest does not describe its program: collective {index} is {printable(program_side)} in "
        f"the program and {printable(manifest_side)} in the manifest"
    )


def is_rank_check(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls :data:`RANK_CHECK_OP`."""
    target = node.target
    is_op = node.op == "call_function" and isinstance(target, compat.OpOverload)
    return is_op and compat.op_schema_name(target) == RANK_CHECK_OP


def rank_check_nodes(module: torch.nn.Module) -> list[torch.fx.Node]:
    """The calls of :data:`RANK_CHECK_OP` in ``module``'s graph (a program's ``graph_module``), in graph order."""
    if not isinstance(module, torch.fx.GraphModule):
        return []
    return [node for node in module.graph.nodes if is_rank_check(node)]


def rank_check_problem(module: torch.nn.Module, manifest: RankManifest | None = None) -> str | None:
    """Why the rank check in ``module``'s graph is not the one a save inserts, or None (also where there is none).

    The one a save inserts is called once, as the first node after the
    placeholders, with a manifest that decodes; with ``manifest`` (the file's
    own), that one. A check elsewhere would run after work that another rank's
    collectives wait on, or twice; one carrying another manifest would pass, in
    use, a process the file's manifest does not describe.
    """
    checks = rank_check_nodes(module)
    if not checks:
        return None
    if len(checks) > 1:
        names = ", ".join(node.name for node in checks)
        return f"nodes {names} each call {RANK_CHECK_OP}: a rank file calls it once, first"
    check_node = checks[0]
    label = f"node {check_node.name} ({RANK_CHECK_OP})"
    assert isinstance(module, torch.fx.GraphModule)  # (rank_check_nodes found a graph)
    first = next(node for node in module.graph.nodes if node.op != "placeholder")
    if first is not check_node:
        return f"{label} is not the first node after the program's inputs ({first.name} runs before it)"
    text = check_node.args[0] if check_node.args else check_node.kwargs.get("manifest")
    if not isinstance(text, str):
        return f"{label} is given no rank manifest"
    try:
        carried = decode_manifest(text, label)
    except VerifyInputError as exc:
        return str(exc)
    # (A save carries no save id in the check: a graph the same for every save of one model. The file's
    # manifest entry says which save it was.)
    if manifest is not None and dataclasses.replace(carried, save_id="") != dataclasses.replace(manifest, save_id=""):
        theirs, ours = (_named(m) for m in (carried, manifest))
        also = ", of other groups or collectives" if theirs == ours else ""
        return f"{label} carries a manifest other than the file's{also}: {theirs} there, {ours} in {MANIFEST_FILE}"
    return None


def _named(manifest: RankManifest) -> str:
    """``rank 1 of 2 (save 5f0c1a2b3c4d)``; without the save where the manifest names none (a rank check's)."""
    return manifest.describe() + (f" (save {manifest.save_id[:12]})" if manifest.save_id else "")


def live_mismatch(manifest: RankManifest, path: str) -> str | None:
    """Why this process cannot run the rank file ``path`` (its rank, world size or groups differ); None if it can."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return (
            f"{path} is {manifest.describe()} of a tensor-parallel rank set: load it in a process group of "
            f"{manifest.world_size} ranks (torchrun --nproc-per-node {manifest.world_size})"
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    if (rank, world) != (manifest.rank, manifest.world_size):
        return (
            f"{path} is {_named(manifest)}, but this process is rank {rank} of "
            f"{world}: load the file saved for this rank"
        )
    live = {tuple(members): name for name, members in live_group_ranks().items()}
    for group in manifest.groups:
        if group.ranks not in live:
            return (
                f"{path} calls collectives on group {group.name!r} of ranks {list(group.ranks)}, and no process group "
                f"of this job has those members: create it (torch.distributed.new_group({list(group.ranks)})) first"
            )
    return None


def live_group_ranks() -> dict[str, tuple[int, ...]]:
    """This process's process groups: {name: global ranks}."""
    import torch.distributed as dist

    return {name: tuple(dist.get_process_group_ranks(group)) for name, group in compat.live_groups().items()}


def rebind_groups(module: torch.fx.GraphModule, manifest: RankManifest) -> dict[str, str]:
    """Point the module's collectives at this job's process groups with the recorded members.

    A collective names its group by a string fixed when the model was traced
    (``"0"`` for the world, ``"1"`` for the first ``new_group`` ...); in another
    job the group with the same members may have another name. Returns {recorded: live} for the names changed.

    Before / after (group ``"3"`` saved; this job made the same members ``"1"``)::

        all_reduce(x, "sum", "3")    ->    all_reduce(x, "sum", "1")
    """
    current = live_group_ranks()
    by_members: dict[tuple[int, ...], str] = {}
    for name, members in sorted(current.items(), key=lambda item: (len(item[0]), item[0])):
        by_members.setdefault(members, name)  # the first group made with those members
    renamed = {
        group.name: by_members[group.ranks]
        for group in manifest.groups
        if current.get(group.name) != group.ranks and group.ranks in by_members  # (a live name that fits is kept)
    }
    if not renamed:
        return renamed
    for node in module.graph.nodes:
        position = group_argument(node.target) if node.op == "call_function" else None
        if position is not None and len(node.args) > position and node.args[position] in renamed:
            node.update_arg(position, renamed[str(node.args[position])])
        elif node.op == "call_function" and engines.is_engine_call(node):
            for index, program in _program_args(node):
                node.update_arg(index, _rebind_program(program, renamed))
    module.recompile()
    return renamed


def _rebind_program(program: str, renamed: dict[str, str]) -> str:
    """A reference engine's program with its collectives' group names replaced (other steps untouched)."""
    try:
        document = json.loads(program)
    except ValueError:
        return program
    changed = False
    for _, _, base, args in _collective_steps(document):
        position = COLLECTIVE_OPS[base]
        if position is not None and len(args) > position and args[position] in renamed:
            args[position] = renamed[args[position]]
            changed = True
    return json.dumps(document) if changed else program
