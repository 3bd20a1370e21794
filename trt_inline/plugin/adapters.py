"""The replacements for ``torch_tensorrt.dynamo._exporter``'s functions, built per release.

Which functions a release gets replaced, and why, is its record in
:mod:`trt_inline.releases`; the release is recognised by the parameters of its
stock ``inline_trt_modules`` (the installed version picks among releases that
share them). This module builds each replacement:

* ``inline_torch_modules``: :func:`trt_inline.inlining.passes.inline_torch_modules`.
* ``inline_trt_modules``: :func:`trt_inline.inlining.passes.inline_trt_modules`; 2.5's
  ``(gm, outputs_map)`` form types engine outputs from the engine
  (:func:`inline_trt_modules_with_outputs_map`); 2.14's keeps the stock
  KV-cache mutation exposure (:func:`exposing_inline_trt_modules`).
* ``transform`` (2.5): :func:`transform_recording_engine_outputs`, no shape analysis.
* ``lift``: :func:`lift` before 2.14; the stock one, after removing what its
  serializer cannot take, from 2.14 (:func:`lift_serializable`).
* ``create_trt_exp_program``: :func:`completing_program` (ranges of every symbol, sample inputs).
* ``copy`` (the module ``transform`` deep-copies with): :func:`sharing_copy_module`.
* ``export`` (2.11+, where it re-exports the inlined graph): :func:`size_oblivious_export`.
* ``replace_execute_engine_no_op_node`` (the cross-compiled program's loader, 2.6+):
  :func:`loading_engine_outputs_once`.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import operator
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch
import torch.fx
from torch.export import ExportGraphSignature
from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument

from trt_inline import compat, engines, releases
from trt_inline.errors import PatchError, SaveError
from trt_inline.inlining import passes
from trt_inline.inlining.flat_program import add_missing_ranges, drop_guard_calls, drop_unserializable, lift_into
from trt_inline.inlining.module_state import buffers_restored
from trt_inline.plugin.save import sample_inputs_of_this_save

__all__ = ["lift", "preflight", "record_engine_outputs", "release_of", "replacements_for", "torch_tensorrt_version"]

log = logging.getLogger(__name__)


def torch_tensorrt_version() -> str | None:
    """The installed or imported Torch-TensorRT's version (:func:`trt_inline.releases.installed_version`)."""
    return releases.installed_version()


def inline_trt_modules_with_outputs_map(gm: torch.fx.GraphModule, outputs_map: dict[Any, Any]) -> torch.fx.GraphModule:
    """2.5's form: engine output shapes come from shape analysis instead of ``meta["val"]``.

    The dtype and device of each output come from the engine itself
    (:func:`trt_inline.engines.output_specs`), not float32 as the stock 2.5 pass
    assumes. An engine that does not record them (Torch-TensorRT's C++ module
    in 2.5) gets float32 on the CPU with a warning naming it.
    """
    fake_mode = compat.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
    for node in gm.graph.nodes:
        if not engines.is_accelerated_call(gm, node) or "val" in node.meta:
            continue
        shapes = outputs_map.get(node.name, outputs_map.get(str(node.target)))
        if shapes is None:
            continue
        specs = engines.output_specs(gm.get_submodule(str(node.target)))
        if specs is None or len(specs) != len(shapes):
            warnings.warn(
                f"trt-inline: {node.target} does not record its output dtypes; they are assumed to be float32",
                RuntimeWarning,
                stacklevel=2,
            )
            specs = [(torch.float32, torch.device("cpu"))] * len(shapes)
        node.meta["val"] = [
            _fake_empty(tuple(shape), dtype, device, fake_mode)
            for shape, (dtype, device) in zip(shapes, specs, strict=True)
        ]
    return passes.inline_trt_modules(gm)


def transform_recording_engine_outputs(
    gm: torch.fx.GraphModule, inputs: Sequence[Any], kwarg_inputs: dict[str, Any] | None = None
) -> torch.fx.GraphModule:
    """2.5's ``transform(gm, inputs, kwarg_inputs)``, typing engine outputs from one run of the module.

    The stock 2.5 ``transform`` takes engine output shapes from
    ``partitioning.run_shape_analysis``, which reads ``.shape`` of every input and
    output of every submodule (running the whole module once per submodule): a
    scalar crossing any boundary fails there, before anything is inlined
    (``AttributeError: 'int' object has no attribute 'shape'``). This copies the
    module, runs the copy once with a forward hook on each engine whose call has
    no ``meta["val"]`` and records what it returned (a tensor as a fake tensor of
    its dtype, device and shape; a scalar as itself, as ``compile_module`` records
    it), then flattens the copy with both passes.

        before:  acc = _run_on_acc_0(x)                    (no meta["val"])
        after:   acc = _run_on_acc_0(x)  meta["val"] = [FakeTensor(f32[4, 5]), 4]
                 ... then passes.flatten_in_place
    """
    flat = passes.copy_module(gm)
    record_engine_outputs(flat, tuple(inputs), dict(kwarg_inputs or {}))
    return passes.flatten_in_place(flat)


def record_engine_outputs(gm: torch.fx.GraphModule, inputs: tuple[Any, ...], kwarg_inputs: dict[str, Any]) -> None:
    """Set ``meta["val"]`` of each engine call lacking it from the outputs of one run of ``gm``."""
    untyped = {str(n.target): n for n in gm.graph.nodes if engines.is_accelerated_call(gm, n) and "val" not in n.meta}
    if not untyped:
        return
    produced: dict[str, Any] = {}
    handles = [
        gm.get_submodule(target).register_forward_hook(
            lambda _module, _args, output, target=target: produced.__setitem__(target, output)
        )
        for target in untyped
    ]
    try:
        with torch.no_grad(), buffers_restored(gm):
            gm(*inputs, **kwarg_inputs)
    finally:
        for handle in handles:
            handle.remove()
    fake_mode = compat.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
    for target, call_node in untyped.items():
        if target not in produced:
            raise SaveError(f"{target}: the engine did not run when the module ran on the save's inputs")
        output = produced[target]
        values = list(output) if isinstance(output, (tuple, list)) else [output]
        call_node.meta["val"] = [
            _fake_empty(tuple(v.shape), v.dtype, v.device, fake_mode) if isinstance(v, torch.Tensor) else v
            for v in values
        ]


def _fake_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, fake_mode: Any) -> torch.Tensor:
    if fake_mode is None:
        return torch.empty(shape, dtype=dtype, device="meta")
    with fake_mode:
        return torch.empty(shape, dtype=dtype, device=device)


def exposing_inline_trt_modules(exporter: ModuleType) -> Callable[..., torch.fx.GraphModule]:
    """2.14's form: after each engine, the stock helper exposes aliased (KV-cache) buffer mutations."""
    expose = exporter._expose_aliased_buffer_mutations

    def inline_trt_modules(
        gm: torch.fx.GraphModule, cross_compile_module: bool | None = False, expose_aliased_mutations: bool = True
    ) -> torch.fx.GraphModule:
        on_engine = None
        if expose_aliased_mutations and not cross_compile_module:

            def on_engine(engine_call: torch.fx.Node, module: torch.nn.Module, num_outputs: int) -> None:
                expose(gm, engine_call, module, num_outputs)

        return passes.inline_engines(gm, cross_compile_module=bool(cross_compile_module), on_engine=on_engine)

    inline_trt_modules.__doc__ = passes.inline_trt_modules.__doc__
    return inline_trt_modules


def lift(
    gm: torch.fx.GraphModule, graph_signature: ExportGraphSignature
) -> tuple[torch.fx.GraphModule, ExportGraphSignature, dict[str, Any], dict[str, Any]]:
    """Drop-in for Torch-TensorRT's ``_exporter.lift`` (the legacy ``retrace=False`` exporter).

    Same contract (:func:`trt_inline.inlining.flat_program.lift_into`). Unlike the stock
    function before 2.14, buffer specs carry ``persistent`` (torch >= 2.3 refuses
    them without it), non-persistent buffers are not saved as state, and
    ``_guards_fn`` calls left by ``ExportedProgram.module()`` are dropped instead
    of reaching the serializer.
    """
    return lift_into(gm, graph_signature)


def lift_serializable(stock_lift: Callable[..., Any]) -> Callable[..., Any]:
    """2.14's ``lift``, after removing what the serializer cannot take.

    That is the ``_guards_fn`` call the inlined fallback brought along, and
    settled assertions where torch cannot write them.
    """

    def lift(gm: torch.fx.GraphModule, graph_signature: Any) -> Any:
        drop_unserializable(gm)
        return stock_lift(gm, graph_signature)

    lift.__doc__ = stock_lift.__doc__
    return lift


def completing_program(stock_create: Callable[..., Any]) -> Callable[..., Any]:
    """The legacy exporter's ``create_trt_exp_program``, completed with what the stock one leaves out.

    * A range for every symbol the graph mentions: the stock function records
      ranges for input sizes only (none at all before 2.11), so a program holding
      an unbacked size, such as one read back with ``item()`` from a fallback or
      across an engine boundary, cannot be loaded.
    * The sample inputs, where the save has them: without them AOTInductor
      refuses to compile the program (``output_format="aot_inductor"`` with
      ``retrace=False``).
    * The names of the inputs (``forward_arg_names``), where the stock program
      has none: with sample inputs, torch compiles input guards that name the
      inputs (``L['ids'].size()[1] == L['mask'].size()[1]`` for two inputs
      sharing a ``Dim``), and a loaded module whose ``forward`` takes ``*args``
      cannot resolve them (``NameError: name 'L' is not defined`` on every call).

    This only ever adds what is known; if that fails, the stock result stands.
    """

    @functools.wraps(stock_create)
    def create_trt_exp_program(*args: Any, **kwargs: Any) -> Any:
        program = stock_create(*args, **kwargs)
        try:
            placeholders = [n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"]
            add_missing_ranges(program.graph, compat.detect_fake_mode(placeholders), program.range_constraints)
            given = kwargs.get("arg_inputs")
            inputs = sample_inputs_of_this_save() if given is None else (tuple(given), kwargs.get("kwarg_inputs") or {})
            if program.example_inputs is None and inputs is not None and inputs[0]:
                name_user_inputs(program)
                compat.set_example_inputs(program, tuple(inputs[0]), dict(inputs[1]))
        except Exception as exc:  # never worse than stock
            log.warning("could not complete the saved program (range constraints, sample inputs): %s", exc)
        return program

    return create_trt_exp_program


def size_oblivious_export(stock_export: Callable[..., Any]) -> Callable[..., Any]:
    """The exporter's ``export`` (``torch_tensorrt.dynamo.export``), re-exporting size-obliviously.

    From 2.11 ``export`` inlines with ``transform`` and, unless
    ``use_legacy_exporter`` is set, re-exports the flat graph with
    ``torch.export.export``. There a scalar an engine returns, equated with an
    input size, inherits that size's internal range ``[2, max]``: a
    ``Dim(min=1)`` is narrowed to 2 and the program rejects batch 1. The
    re-export is traced size-obliviously, as :func:`trt_inline.save` traces it
    (the legacy exporter is not traced and is left as it is).

    Cross-compiling (``save_cross_compiled_exported_program``) calls it with
    ``cross_compile_module=True`` and no inputs, which a re-export cannot trace
    (``missing a required argument``): there the legacy exporter writes the
    program, as it did for this door before 2.11.
    """

    @functools.wraps(stock_export)
    def export(*args: Any, **kwargs: Any) -> Any:
        given = kwargs.get("arg_inputs") is not None or bool(kwargs.get("kwarg_inputs"))
        if kwargs.get("cross_compile_module") and not given and "use_legacy_exporter" not in kwargs:
            kwargs["use_legacy_exporter"] = True
        if kwargs.get("use_legacy_exporter"):
            return stock_export(*args, **kwargs)
        with compat.backed_size_oblivious():
            return stock_export(*args, **kwargs)

    return export


def name_user_inputs(program: Any) -> None:
    """Name the root call signature's inputs after their placeholders, where it has none and takes them positionally."""
    entry = next((e for e in program.module_call_graph if e.fqn == ""), None)
    signature = getattr(entry, "signature", None)
    if signature is None or not hasattr(signature, "forward_arg_names") or signature.forward_arg_names:
        return
    names = list(program.graph_signature.user_inputs)
    in_spec = signature.in_spec
    if in_spec is None or in_spec.num_children != 2:
        return
    args_spec, kwargs_spec = in_spec.children_specs
    if args_spec.num_children != len(names) or kwargs_spec.num_children:
        return  # nested or keyword inputs: their names are not the placeholders'
    signature.forward_arg_names = names


def release_of(exporter: ModuleType) -> releases.Release:
    """The record of the release ``exporter`` belongs to, recognised by its stock ``inline_trt_modules``."""
    stock = getattr(exporter, "inline_trt_modules", None)
    if not callable(stock) or not callable(getattr(exporter, "inline_torch_modules", None)):
        raise PatchError(f"{exporter.__name__} has no inline_trt_modules / inline_torch_modules")
    params = tuple(inspect.signature(stock).parameters)
    release = releases.for_signature(params, torch_tensorrt_version())
    if release is None:
        raise PatchError(f"{exporter.__name__}.inline_trt_modules has an unknown signature ({', '.join(params)})")
    return release


def replacements_for(exporter: ModuleType) -> dict[str, Any]:
    """The functions of ``exporter`` to replace, and their replacements, as its release's record lists them.

    A function the record lists but the exporter lacks is left out.
    """
    release = release_of(exporter)
    result: dict[str, Any] = {}
    for name in release.replaced:
        stock = getattr(exporter, name, None)
        if callable(stock) or (name == "copy" and stock is copy):
            result[name] = _REPLACEMENTS[name](exporter, release, stock)
    return result


def _inline_trt_replacement(exporter: ModuleType, release: releases.Release, stock: Any) -> Any:
    params = release.inline_trt_params
    if params[1:] == ("outputs_map",):
        return inline_trt_modules_with_outputs_map
    if "expose_aliased_mutations" in params:
        if not callable(getattr(exporter, "_expose_aliased_buffer_mutations", None)):
            raise PatchError(f"{exporter.__name__}: 2.14-style signature without _expose_aliased_buffer_mutations")
        return exposing_inline_trt_modules(exporter)
    return passes.inline_trt_modules


_REPLACEMENTS: dict[str, Callable[[ModuleType, releases.Release, Any], Any]] = {
    "inline_torch_modules": lambda exporter, release, stock: passes.inline_torch_modules,
    "inline_trt_modules": _inline_trt_replacement,
    "transform": lambda exporter, release, stock: transform_recording_engine_outputs,
    "lift": lambda exporter, release, stock: lift_serializable(stock) if release.lift_persistent else lift,
    "create_trt_exp_program": lambda exporter, release, stock: completing_program(stock),
    "copy": lambda exporter, release, stock: sharing_copy_module(),
    "export": lambda exporter, release, stock: size_oblivious_export(stock),
    "replace_execute_engine_no_op_node": lambda exporter, release, stock: loading_engine_outputs_once(stock),
}


def loading_engine_outputs_once(stock: Callable[..., Any]) -> Callable[..., Any]:
    """The Windows loader of a cross-compiled program (2.6+), reading each engine output once.

    Every release's ``replace_execute_engine_no_op_node`` finds its placeholder
    calls by node name, and so takes the getitem torch names
    ``<call>_unused_<i>`` (an engine output nothing reads) for one and fails on
    it: those dead getitems are dropped first. 2.6's also puts a
    ``getitem(engine, 0)`` of its own in front of the ``getitem(..., 0)`` the
    exporter (stock or ours) wrote for a one-output engine, so the program reads
    the first row of that output (2.7 dropped it)::

        before:  execute_engine -> getitem(_, 0) [the loader's] -> getitem(_, 0) -> relu
        after:   execute_engine -> getitem(_, 0) -> relu

    and types a multi-output engine's getitems by the order of its users; each
    is typed by its index instead.
    """

    def replace_execute_engine_no_op_node(exp_program: Any) -> Any:
        graph = exp_program.graph_module.graph
        for node in list(graph.nodes):
            if not node.users and _engine_getitem(node) is not None:
                graph.erase_node(node)
        program = stock(exp_program)
        gm = program.graph_module
        for node in list(gm.graph.nodes):
            inserted = node.args[0] if node.target is operator.getitem and node.args else None
            if (
                isinstance(inserted, torch.fx.Node)
                and _engine_getitem(inserted) is not None
                and isinstance(inserted.meta.get("val"), (list, tuple))  # the whole output list: the loader's own
                and len(inserted.meta["val"]) == 1
            ):
                node.replace_input_with(inserted, inserted.args[0])  # type: ignore[arg-type]
                if not inserted.users:
                    gm.graph.erase_node(inserted)
        for node in gm.graph.nodes:
            engine_call = _engine_getitem(node)
            values = engine_call.meta.get("val") if engine_call is not None else None
            if isinstance(values, (list, tuple)) and isinstance(node.args[1], int) and node.args[1] < len(values):
                node.meta["val"] = values[node.args[1]]
        gm.recompile()
        return program

    replace_execute_engine_no_op_node.__doc__ = (stock.__doc__ or "") + (loading_engine_outputs_once.__doc__ or "")
    return replace_execute_engine_no_op_node


def _engine_getitem(node: torch.fx.Node) -> torch.fx.Node | None:
    """The engine call ``node`` takes an output of, where ``node`` is ``getitem(engine call, i)``."""
    if node.op != "call_function" or node.target is not operator.getitem or not node.args:
        return None
    source = node.args[0]
    return source if isinstance(source, torch.fx.Node) and engines.is_engine_call(source) else None


def sharing_copy_module() -> ModuleType:
    """The ``copy`` module as the exporter sees it: ``deepcopy`` of a GraphModule shares tensors and engines.

    Every release's ``transform`` starts with ``gm = copy.deepcopy(gm)`` (the
    exporter's module global ``copy``). That copies every weight, buffer and
    constant, and re-creates each engine (deserializing it again where
    ``TorchTensorRTModule`` has no ``__deepcopy__``, 2.5 to 2.11); the passes
    after it only rewire graphs. With this module bound there instead,
    ``deepcopy(gm)`` is :func:`trt_inline.inlining.passes.copy_module`; anything else is
    the standard library's ``copy``.
    """
    shared = ModuleType("trt_inline.plugin.copy", copy.__doc__)
    shared.__dict__.update({k: v for k, v in vars(copy).items() if not k.startswith("__")})

    def deepcopy(value: Any, memo: dict[int, Any] | None = None, _nil: Any = None) -> Any:
        if memo is None and isinstance(value, torch.fx.GraphModule):
            return passes.copy_module(value)
        return copy.deepcopy(value, memo)

    shared.__dict__["deepcopy"] = deepcopy
    return shared


# ---------------------------------------------------------------------------
# Preflight: a replacement that fails on a probe graph is not installed
# ---------------------------------------------------------------------------


def preflight(replacements: dict[str, Any]) -> dict[str, str]:
    """Run the replacements on a tiny partitioned probe; ``{function: why}`` for each that failed.

    The probe (an engine, then a fallback reading its output, on this torch) is
    what every save pushes through the replaced functions, so a replacement that
    cannot work here fails on it, at import, rather than inside a user's
    ``torch_tensorrt.save``. A second probe has dynamic shapes of the kinds real
    models have (two inputs sharing a ``Dim``, a derived ``2 * half``, a size
    crossing an engine boundary as a scalar); both inline passes must flatten it
    (2.5's ``outputs_map`` form takes static shapes only and skips it). What
    depends on a failed step is refused too.
    """
    refused: dict[str, str] = {}
    probe, example = _probe()
    steps: list[tuple[str, Callable[[], Any]]] = []
    if "copy" in replacements:
        steps.append(("copy", lambda: _copy_shares(replacements["copy"], _probe()[0])))
    if "inline_trt_modules" in replacements:
        inline_trt = replacements["inline_trt_modules"]
        outputs_map = {_PROBE_ENGINE: [example.shape]}
        args: tuple[Any, ...] = (outputs_map,) if _takes_outputs_map(inline_trt) else (False,)
        steps.append(("inline_trt_modules", lambda: inline_trt(probe, *args)))
    steps.append(("inline_torch_modules", lambda: replacements["inline_torch_modules"](probe)))
    if "inline_trt_modules" in replacements and not _takes_outputs_map(replacements["inline_trt_modules"]):
        dynamic = _dynamic_probe()
        steps.append(("inline_trt_modules", lambda: replacements["inline_trt_modules"](dynamic, False)))
        steps.append(("inline_torch_modules", lambda: _flat(replacements["inline_torch_modules"](dynamic))))
    if "transform" in replacements:
        untyped, _ = _probe()
        for node in untyped.graph.nodes:
            if node.target == _PROBE_ENGINE:
                del node.meta["val"]  # as 2.5 leaves it: the replacement records it from a run
        steps.append(("transform", lambda: replacements["transform"](untyped, (example,))))
    if "lift" in replacements:
        steps.append(("lift", lambda: replacements["lift"](_cleaned(probe), _signature(probe))))
    for name, step in steps:
        if refused:
            refused.setdefault(name, f"not tried: {next(iter(refused))} failed first")
            continue
        try:
            step()
        except Exception as exc:
            refused.setdefault(name, f"{type(exc).__name__}: {exc}".splitlines()[0])
    return refused


class _DynamicProbe(torch.nn.Module):
    """Two inputs sharing a batch ``Dim`` and a derived one (``2 * half``); the engine's ``shape[1] // 2`` is sliced."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = ids * 2.0
        half = h.shape[1] // 2
        return torch.relu(h[:, 0:half]) * mask[:, 0:half]


def _dynamic_probe() -> torch.fx.GraphModule:
    """:class:`_DynamicProbe` compiled by the reference backend's own partitioner (the release's would fold a
    one-node block into the fallback), ``slice`` falling back: a scalar crosses a boundary."""
    from trt_inline import reference

    batch, half = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("half", min=2, max=4)
    shapes = ({0: batch, 1: 2 * half}, {0: batch, 1: 2 * half})
    example = (torch.ones(2, 6), torch.ones(2, 6))
    return reference.compile(
        _DynamicProbe(), example, pipeline="own", torch_executed_ops=["aten.slice.Tensor"], dynamic_shapes=shapes
    )


def _flat(gm: torch.fx.GraphModule) -> None:
    """Raise unless ``gm`` is one linted graph: no submodule call left but input-guard calls (dropped at save)."""
    gm.graph.lint()
    drop_guard_calls(gm)
    left = [str(node.target) for node in gm.graph.nodes if node.op == "call_module"]
    if left:
        raise PatchError(f"submodules still called after inlining: {', '.join(left)}")


def _takes_outputs_map(function: Callable[..., Any]) -> bool:
    return list(inspect.signature(function).parameters)[1:2] == ["outputs_map"]


_PROBE_ENGINE = f"{engines.ACC_PREFIX}0"
_PROBE_FALLBACK = f"{engines.FALLBACK_PREFIX}1"


def _probe() -> tuple[torch.fx.GraphModule, torch.Tensor]:
    """``x -> _run_on_acc_0 (x * 2) -> _run_on_gpu_1 (relu) -> output``, with fake values as compile sets them."""
    from trt_inline.reference.engine import build_engine

    example = torch.ones(2, 3)
    fake = compat.fake_tensor_mode().from_tensor(example)
    block = torch.fx.symbolic_trace(lambda a: torch.ops.aten.mul.Tensor(a, 2.0))
    fallback = torch.fx.symbolic_trace(lambda a: torch.ops.aten.relu.default(a))
    for module in (block, fallback):
        for node in module.graph.nodes:
            node.meta["val"] = fake
    root = torch.nn.Module()
    root.add_module(_PROBE_ENGINE, build_engine(block, _PROBE_ENGINE))
    root.add_module(_PROBE_FALLBACK, fallback)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    acc = graph.call_module(_PROBE_ENGINE, (x,))
    gpu = graph.call_module(_PROBE_FALLBACK, (acc,))
    graph.output((gpu,))
    x.meta["val"], acc.meta["val"], gpu.meta["val"] = fake, [fake], fake
    return torch.fx.GraphModule(root, graph), example


def _copy_shares(shared_copy: ModuleType, probe: torch.fx.GraphModule) -> None:
    """Raise unless ``shared_copy.deepcopy(probe)`` is a separate module sharing every tensor of ``probe``."""
    copied = shared_copy.deepcopy(probe)
    if copied is probe or copied.graph is probe.graph:
        raise PatchError("the copy is the module itself")
    originals = {t.untyped_storage().data_ptr() for t in (*probe.parameters(), *probe.buffers())}
    copies = {t.untyped_storage().data_ptr() for t in (*copied.parameters(), *copied.buffers())}
    if originals != copies:
        raise PatchError("the copy does not share the module's tensors")


def _cleaned(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    gm.delete_all_unused_submodules()
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _signature(gm: torch.fx.GraphModule) -> ExportGraphSignature:
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return ExportGraphSignature(
        input_specs=[InputSpec(InputKind.USER_INPUT, TensorArgument(name=n.name), n.target) for n in inputs],
        output_specs=[OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(name=n.name), None) for n in outputs],
    )
