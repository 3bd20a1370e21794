"""Torch-TensorRT's other public doors to the passes: ``torch_tensorrt.dynamo.export`` and refit.

``torch_tensorrt.dynamo`` and ``dynamo/_refit.py`` bind exporter functions by
name when they are imported (``from torch_tensorrt.dynamo._exporter import
export`` / ``inline_torch_modules``): the test shell of the installed torch's
release carries exactly those statements of the release's own files
(``tests/support/pairs.py``), around its real exporter. Each case runs as a user
would, in a process of its own; files are loaded in another fresh process and
compared bit for bit with the compiled module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support import pairs
from support.models import SIZE_OBLIVIOUS_REASON
from support.plugin_runs import RELEASE, release_tree, run_python, run_python_forks, unavailable
from support.processes import load_runs_in_fresh_process
from support.values import as_list, max_abs_diff

from trt_inline import compat

_BINDINGS = """
    import json, os, torch
    import torch_tensorrt, torch_tensorrt.dynamo, torch_tensorrt.dynamo._refit as refit
    import torch_tensorrt.dynamo._compiler as compiler
    import torch_tensorrt.dynamo._exporter as ex
    import trt_inline
    from trt_inline import plugin
    from trt_inline.inlining import passes

    def state():
        return {"refit": refit.inline_torch_modules is passes.inline_torch_modules,
                "export_is_the_exporters": torch_tensorrt.dynamo.export is ex.export,
                "export_wrapped": hasattr(torch_tensorrt.dynamo.export, "__wrapped__"),  # functools.wraps
                # the Windows loader of cross-compiled programs (2.6+): replaced on 2.6, bound by name in _compiler
                "loader_is_the_exporters": getattr(compiler, LOADER, None) is getattr(ex, LOADER, None),
                "loader_replaced": "loading_engine_outputs_once" in getattr(getattr(ex, LOADER, None),
                                                                            "__qualname__", "")}

    LOADER = "replace_execute_engine_no_op_node"

    states = [state()]
    if os.environ.get("TRT_INLINE_DISABLE"):
        trt_inline.install()      # after every binding was made with the stock functions
        states.append(state())
    trt_inline.uninstall()
    states.append(state())
    trt_inline.install()
    states.append(state())
    print(json.dumps({"states": states, "doors": plugin.doors()}))
"""


@pytest.mark.parametrize("when", ["at import", "install() after import"])
def test_dynamo_export_and_refit_bindings_follow_install_and_uninstall(tmp_path: Path, when: str) -> None:
    tree = release_tree(tmp_path)
    proc = run_python(_BINDINGS, tree, disable=when != "at import")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert RELEASE is not None
    # `export` is replaced where it re-exports the inlined graph (2.11+); elsewhere it reaches the passes stock.
    loader = "replace_execute_engine_no_op_node" in RELEASE.replaced
    active = {"refit": True, "export_is_the_exporters": True, "export_wrapped": RELEASE.retrace_inlines,
              "loader_is_the_exporters": True, "loader_replaced": loader}  # fmt: skip
    stock = {"refit": False, "export_is_the_exporters": True, "export_wrapped": False,
             "loader_is_the_exporters": True, "loader_replaced": False}  # fmt: skip
    expected = [active, stock, active] if when == "at import" else [stock, active, stock, active]
    assert report["states"] == expected
    assert report["doors"] == {
        "save": "trt-inline's passes, reference I/O embedded",
        "dynamo.export": "trt-inline's passes",
        "cross-compile": "trt-inline's passes",
        "refit": "trt-inline's passes",
        "executorch": "trt-inline's passes" if RELEASE.executorch else "absent in this release",
    }


_EXPORT = """
    import json, sys, torch
    import torch_tensorrt, torch_tensorrt.dynamo, trt_inline   # the real package imports dynamo itself
    from support.models import FlattenRows

    folder, release_retraces = sys.argv[1], sys.argv[2] == "retraces"
    if sys.argv[3] == "unwrapped":  # the plugin's passes, the release's own export(): the door as it was
        import torch_tensorrt.dynamo._exporter as ex
        torch_tensorrt.dynamo.export = ex.export = ex.export.__wrapped__
    batch = torch.export.Dim("batch", min=1, max=8)
    x = torch.randn(4, 3, 2)
    compiled = trt_inline.reference.compile(
        FlattenRows(), (x,), torch_executed_ops=["aten.view.default"], dynamic_shapes=({0: batch},)
    )
    if release_retraces:
        program = torch_tensorrt.dynamo.export(compiled, arg_inputs=[x], dynamic_shapes=({0: batch},))
    else:  # the legacy exporter: 2.5's export takes the inputs, 2.6 ... 2.10's only the module
        import inspect
        takes_inputs = "inputs" in inspect.signature(torch_tensorrt.dynamo.export).parameters
        export = torch_tensorrt.dynamo.export
        program = export(compiled, [x]) if takes_inputs else export(compiled)
    path = f"{folder}/exported.pt2"
    torch.export.save(program, path)
    checks = [(torch.randn(n, 3, 2),) for n in (1, 5, 8)]
    with torch.no_grad():
        torch.save((checks, [compiled(*c) for c in checks]), f"{folder}/expected.pt")
    errors = {}
    loaded = torch.export.load(path).module()
    for inputs in checks:   # in this process too: what the file does at each size
        try:
            loaded(*inputs)
        except Exception as exc:
            errors[inputs[0].shape[0]] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    asserts = [str(n.args[1]) for n in program.graph.nodes if "_assert_scalar" in str(n.target)]
    print(json.dumps({"path": path, "errors": errors, "asserts": asserts}))
"""


def _export(tmp_path: Path, *, unwrapped: bool) -> dict[str, object]:
    tree = release_tree(tmp_path)
    if not compat.traces_size_obliviously():  # a scalar equated with a Dim(min=1) size: see the README
        pytest.skip(SIZE_OBLIVIOUS_REASON)
    assert RELEASE is not None
    mode = "retraces" if RELEASE.retrace_inlines else "legacy"
    proc = run_python(_EXPORT, tree, str(tmp_path), mode, "unwrapped" if unwrapped else "wrapped")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def test_dynamo_export_of_a_scalar_crossing_accepts_batch_one(tmp_path: Path) -> None:
    """``torch_tensorrt.dynamo.export`` + ``torch.export.save``: batch 1, 5 and 8 in a fresh process, bit for bit."""
    report = _export(tmp_path, unwrapped=False)
    assert report["errors"] == {}
    assert not [a for a in report["asserts"] if ">= 2" in a], report["asserts"]  # type: ignore[union-attr]
    path = Path(str(report["path"]))
    program = torch.export.load(path)
    assert not [n for n in program.graph.nodes if n.op == "call_module"]
    assert any(n.target is torch.ops.trt_inline.execute_engine.default for n in program.graph.nodes)
    checks, outputs = torch.load(tmp_path / "expected.pt", weights_only=True)
    runs = load_runs_in_fresh_process(tmp_path, [path], checks)[str(path)]
    for inputs, want, loaded in zip(checks, outputs, runs, strict=True):
        assert loaded["call_modules"] == []
        assert max_abs_diff(loaded["outputs"], as_list(want)) == 0.0, inputs[0].shape


def test_without_the_export_replacement_the_file_rejects_batch_one(tmp_path: Path) -> None:
    """The plugin's passes with the release's own ``export()``: the re-export narrows the batch to ``[2, 8]``."""
    if RELEASE is not None and not RELEASE.retrace_inlines:
        pytest.skip(f"Torch-TensorRT {RELEASE.version}: export() does not re-export the inlined graph")
    report = _export(tmp_path, unwrapped=True)
    errors = report["errors"]
    assert isinstance(errors, dict) and list(errors) == ["1"], errors
    assert ">= 2" in errors["1"], errors


_REFIT_MATCHING = """
    import json, sys, torch
    import torch_tensorrt, trt_inline
    import torch_tensorrt.dynamo._refit as refit
    from support.models import CrossedHalves

    torch.manual_seed(0)
    x = torch.randn(3, 8)
    model = CrossedHalves().eval()
    compiled = trt_inline.reference.compile(model, (x,), torch_executed_ops=["aten.relu.default"])
    path = f"{sys.argv[1]}/refit.pt2"
    torch_tensorrt.save(compiled, path, output_format="exported_program", arg_inputs=[x], retrace=False)

    # refit_module_weights(loaded program, new weights): what it matches before refitting any engine.
    compiled_module = torch.export.load(path).module()
    held = [*compiled_module.__dict__, *compiled_module._buffers]   # TensorRT engines sit in __dict__
    compiled_submodules_map = {name.replace("_engine", ""): None for name in held if "engine" in name}
    compiled_submodules_map.update(dict.fromkeys(name for name, _ in compiled_module.named_children()))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    new_partitioned_module = trt_inline.reference.compile(model, (x,), torch_executed_ops=["aten.relu.default"])
    refit.inline_torch_modules(new_partitioned_module)
    new_partitioned_module.delete_all_unused_submodules()
    print(json.dumps({
        "ours": refit.inline_torch_modules.__module__,
        "loaded": sorted(compiled_submodules_map),
        "new": sorted(name for name, _ in new_partitioned_module.named_children()),
    }))
"""


def test_refit_matches_a_trt_inline_file_with_a_new_partition(tmp_path: Path) -> None:
    """Refit's structural check of a loaded trt-inline file: the engines it finds equal the new partition's.

    The refit of each engine needs TensorRT (the GPU suite); this is the part of
    ``refit_module_weights`` that runs before it, with the release's own binding
    of ``inline_torch_modules``.
    """
    tree = release_tree(tmp_path)
    proc = run_python(_REFIT_MATCHING, tree, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ours"] == "trt_inline.inlining.passes"
    engines = [name for name in report["new"] if name.startswith("_run_on_acc_")]
    assert len(engines) == 3, report
    assert report["loaded"] == report["new"], report


_EXECUTORCH = """
    import json, sys, torch
    import torch_tensorrt, trt_inline
    from support.values import as_list, max_abs_diff
    from support.models import CrossedHalves, FlattenRows
    from torch_tensorrt.executorch import EDGE_PROGRAMS
    from trt_inline import plugin

    folder, case, retrace = sys.argv[1], sys.argv[2], sys.argv[3] == "retrace"
    if case == "seed":  # three engines, two relu fallbacks: the stock passes of 2.12/2.13 miswire it by name
        torch.manual_seed(0)
        x = torch.randn(3, 8)
        compiled = trt_inline.reference.compile(CrossedHalves().eval(), (x,), torch_executed_ops=["aten.relu.default"])
        extra, checks = {}, [(x,)]
    else:  # the batch size crosses an engine boundary as a scalar
        batch = torch.export.Dim("batch", min=1, max=8)
        x = torch.randn(4, 3, 2)
        compiled = trt_inline.reference.compile(
            FlattenRows(), (x,), torch_executed_ops=["aten.view.default"], dynamic_shapes=({0: batch},)
        )
        extra, checks = {"dynamic_shapes": ({0: batch},)}, [(torch.randn(n, 3, 2),) for n in (1, 5, 8)]
    path = f"{folder}/{case}_{sys.argv[3]}.pte"
    torch_tensorrt.save(compiled, path, output_format="executorch", arg_inputs=[x], retrace=retrace, **extra)
    (edge,) = EDGE_PROGRAMS   # what ExecuTorch lowered: the flat program in the edge dialect
    diffs, errors = {}, {}
    with torch.no_grad():
        for inputs in checks:
            try:
                got = edge.module()(*inputs)
            except RuntimeError as exc:
                errors[inputs[0].shape[0]] = str(exc).splitlines()[0]
                continue
            diffs[inputs[0].shape[0]] = max_abs_diff(as_list(got), as_list(compiled(*inputs)))
    with open(path, "rb") as pte:
        head = pte.read(8)
    print(json.dumps({
        "door": plugin.doors()["executorch"],
        "engines": sum(1 for n in edge.graph.nodes if "trt_inline.execute_engine" in str(n.target)),
        "call_modules": sum(1 for n in edge.graph.nodes if n.op == "call_module"),
        "diffs": diffs,
        "errors": errors,
        "identifier": head[4:8].decode("ascii", "replace"),
    }))
"""


@pytest.mark.heavy
def test_executorch_lowers_the_program_trt_inline_flattened(tmp_path: Path) -> None:
    """``torch_tensorrt.save(..., output_format="executorch")``: ExecuTorch's own lowering of trt-inline's program.

    Torch-TensorRT's ExecuTorch partitioner and the TensorRT delegate need the
    GPU; in the test shell a stand-in delegate takes the reference engines
    (``tests/support/pairs.py``), ExecuTorch (real) writes the ``.pte``, and the edge
    program it lowered is run against the compiled module, bit for bit. Each
    case (a static and a scalar-crossing model, each exporter) in a process of
    its own, forked from one that has imported torch and ExecuTorch.
    """
    if RELEASE is not None and not RELEASE.executorch:
        pytest.skip(f"Torch-TensorRT {RELEASE.version} has no output_format='executorch'")
    tree = release_tree(tmp_path, executorch=True)
    try:
        site = pairs.executorch_site()
    except pairs.Unavailable as exc:
        unavailable(exc)
    cases = [("seed", "legacy"), ("seed", "retrace"), ("scalar", "legacy"), ("scalar", "retrace")]
    if pairs.minor(torch.__version__) < (2, 8):  # a scalar equated with a Dim(min=1) size: see the README
        cases = cases[:2]
    runs = run_python_forks(
        _EXECUTORCH, tree, [[str(tmp_path), *case] for case in cases],
        preload=("torch_tensorrt", "trt_inline", "executorch.exir"), path=[site],
    )  # fmt: skip
    for (case, exporter), (status, output) in zip(cases, runs, strict=True):
        assert status == 0, f"{case} {exporter}: {output[-4000:]}"
        report = json.loads(output.strip().splitlines()[-1])
        assert report["door"] == "trt-inline's passes"
        assert report["engines"] == (3 if case == "seed" else 2) and report["call_modules"] == 0, report
        assert report["identifier"] == "ET12", report  # an ExecuTorch program was written
        assert set(report["diffs"].values()) == {0.0}, (case, exporter, report["diffs"])
        warned = "output_format='executorch' from the legacy exporter" in output
        if (case, exporter) == ("scalar", "legacy"):
            # ExecuTorch's own retrace narrows the size engine 0 returns to [2, 8]: said at save, batch 1 refused.
            assert warned and "_run_on_acc_1 output 1" in output, output[-2000:]
            assert list(report["errors"]) == ["1"] and ">= 2" in report["errors"]["1"], report
            assert sorted(report["diffs"]) == ["5", "8"], report
        else:
            assert not warned and report["errors"] == {}, (case, exporter, report)


_CROSS_COMPILE = """
    import inspect, io, json, operator, sys, torch
    import torch_tensorrt, trt_inline
    import torch_tensorrt.dynamo._compiler as compiler  # load_cross_compiled_exported_program's loader binding
    import torch_tensorrt.dynamo._exporter as ex  # save_cross_compiled_exported_program imports export when called
    from torch_tensorrt.dynamo.runtime import _TorchTensorRTModule as runtime
    from support.values import as_list, max_abs_diff
    from support.models import CrossedHalves
    from trt_inline.reference.engine import ReferenceEngine

    class TorchTensorRTModule(torch.nn.Module):
        '''Stands for Torch-TensorRT's engine module: its packed info carries a reference engine.'''

        def __init__(self, engine):
            super().__init__()
            self.reference = engine

        def forward(self, *inputs):
            return self.reference(*inputs)

        def _pack_engine_info(self):
            info = [""] * runtime.SERIALIZATION_LEN
            blob = io.BytesIO()
            torch.save({"program": self.reference.program, "payload": self.reference.engine}, blob)
            info[runtime.NAME_IDX], info[runtime.ENGINE_IDX] = self.reference.name, blob.getvalue()
            return info

    TorchTensorRTModule.__module__ = runtime.__name__
    runtime.TorchTensorRTModule = TorchTensorRTModule
    folder, step = sys.argv[1], sys.argv[2]
    if step in ("save", "stock"):
        if step == "stock":  # the release's own export(), the plugin's passes otherwise
            ex.export = getattr(ex.export, "__wrapped__", ex.export)  # replaced on 2.11+
        torch.manual_seed(0)
        x = torch.randn(3, 8)
        compiled = trt_inline.reference.compile(CrossedHalves().eval(), (x,), torch_executed_ops=["aten.relu.default"])
        for name, module in list(compiled.named_children()):
            if isinstance(module, ReferenceEngine):
                setattr(compiled, name, TorchTensorRTModule(module))
        # What save_cross_compiled_exported_program (dynamo/_compiler.py) does: export, then torch.export.save.
        flag = "cross_compile_flag" if "cross_compile_flag" in inspect.signature(ex.export).parameters else (
            "cross_compile_module")
        try:
            program = ex.export(compiled, **{flag: True})
        except Exception as exc:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
            sys.exit(0)
        torch.export.save(program, f"{folder}/cross.pt2")
        with torch.no_grad():
            torch.save(((x,), as_list(compiled(x))), f"{folder}/expected.pt")
        print(json.dumps({"error": None}))
    else:  # load_cross_compiled_exported_program's conversion (Windows), in a fresh process
        from torch_tensorrt.dynamo.runtime._TRTEngine import TRTEngine

        torch.classes.tensorrt.Engine = TRTEngine  # the runtime's engine class (2.6 ... 2.12 build it): a stand-in
        program = torch.export.load(f"{folder}/cross.pt2")
        calls = [n for n in program.graph.nodes if "no_op_placeholder" in str(n.target)]
        slots = [type(n.args[1 + runtime.ENGINE_IDX]).__name__ for n in calls]
        if sys.argv[3] == "unread":  # an engine output nothing reads: torch names its getitem after the call
            with program.graph.inserting_after(calls[0]):
                unread = program.graph.call_function(operator.getitem, (calls[0], 1))
            unread.name = f"{calls[0].name}_unused_1"
        try:
            gm = compiler.replace_execute_engine_no_op_node(program).graph_module
        except Exception as exc:
            print(json.dumps({"slots": slots, "error": f"{type(exc).__name__}: {exc}"}))
            sys.exit(0)
        engines = 0
        for node in list(gm.graph.nodes):   # each engine the release's loader rebuilt runs as its reference engine
            if node.target is not torch.ops.tensorrt.execute_engine.default:
                continue
            packed = torch.load(io.BytesIO(getattr(gm, node.args[1].target).info[runtime.ENGINE_IDX]))
            gm.register_buffer(f"payload_{engines}", packed["payload"])
            with gm.graph.inserting_before(node):
                payload = gm.graph.get_attr(f"payload_{engines}")
            node.target = torch.ops.trt_inline.execute_engine.default
            node.args = (node.args[0], payload, packed["program"])
            engines += 1
        gm.recompile()
        inputs, expected = torch.load(f"{folder}/expected.pt")
        with torch.no_grad():
            got = as_list(gm(*inputs))
        shapes = [list(t.shape) for t in got]
        diff = max_abs_diff(got, expected) if shapes == [list(t.shape) for t in expected] else None
        print(json.dumps({"slots": slots, "engines": engines, "shapes": shapes, "diff": diff, "error": None}))
"""


def test_cross_compiled_program_is_wired_by_position_and_loads_as_windows_does(tmp_path: Path) -> None:
    """Cross-compiling: ``export(gm, cross_compile_module=True)`` + save, then the release's own Windows loader.

    Engines stand in for TensorRT's (their packed info carries a reference
    engine); the loader's conversion (``replace_execute_engine_no_op_node``)
    is the release's own, then each engine it rebuilt runs as that reference
    engine, and the program is compared with the compiled module bit for bit.
    """
    if RELEASE is not None and pairs.minor(RELEASE.version) < (2, 6):
        pytest.skip(f"Torch-TensorRT {RELEASE.version} has no cross-compiling")
    tree = release_tree(tmp_path, cross_compile=True)
    (tmp_path / "stock").mkdir()
    (status, saved), (_, stock) = run_python_forks(
        _CROSS_COMPILE, tree, [[str(tmp_path), "save"], [str(tmp_path / "stock"), "stock"]]
    )
    assert status == 0 and json.loads(saved.strip().splitlines()[-1]) == {"error": None}, saved[-4000:]
    assert RELEASE is not None
    stock_error = json.loads(stock.strip().splitlines()[-1])["error"]
    if RELEASE.retrace_inlines:  # 2.11+: export() re-exports with torch.export.export, and is given no inputs
        assert stock_error is not None and "missing a required argument" in stock_error, stock_error
    loads = {}
    for variant in ("plugin", "stock"):  # the load with the plugin's loader, and with the release's own
        for case in ("as saved", "unread"):
            proc = run_python(_CROSS_COMPILE, tree, str(tmp_path), "load", case, disable=variant == "stock")
            assert proc.returncode == 0, proc.stderr[-4000:]
            loads[variant, case] = json.loads(proc.stdout.strip().splitlines()[-1])
    for case in ("as saved", "unread"):
        report = loads["plugin", case]
        assert report["slots"] == ["str", "str", "str"], report  # base64 text, as the loader reads it
        assert report["error"] is None and report["engines"] == 3 and report["diff"] == 0.0, (case, report)
    # The release's own loader finds its calls by node name: an engine output nothing reads is taken for one.
    assert "IndexError" in (loads["stock", "unread"]["error"] or ""), loads["stock", "unread"]
    stock = loads["stock", "as saved"]
    if RELEASE.minor < (2, 7):  # 2.6 indexes the one-output last engine's result twice: its first row
        assert stock["error"] is None and stock["shapes"] == [[8]] and stock["diff"] is None, stock
    else:
        assert stock == loads["plugin", "as saved"], stock


# A KV cache updated inside an engine, as Torch-TensorRT 2.14 builds one (IKVCacheUpdateLayer): the engine
# takes the cache buffer as an input, updates it in place, and returns it as an extra output binding after
# the ones the graph sees, recorded in its info as aliased I/O ("cache_out" aliases input "cache").
# The TensorRT runtime stands in: its execute_engine runs that update on the CPU.
_KV_CACHE = """
    import json, sys, torch
    import torch.fx
    import torch_tensorrt
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch_tensorrt.dynamo.runtime import _TorchTensorRTModule as runtime
    from support.values import as_list, max_abs_diff

    @torch.library.impl("tensorrt::execute_engine", "CPU")
    def execute_engine(inputs, engine):
        x, cache = inputs
        y = x * 2 + cache.sum(0)
        cache.mul_(0.5).add_(y[: cache.shape[0]])
        return [y, cache]

    @torch.library.register_fake("tensorrt::execute_engine")
    def execute_engine_fake(inputs, engine):  # the outputs the graph sees, as TensorRT's meta kernel gives them
        return [torch.empty_like(inputs[0])]

    class TorchTensorRTModule(torch.nn.Module):
        '''Stands for Torch-TensorRT's engine module; its engine (uint8) holds the engine info as JSON.'''

        def __init__(self, info):
            super().__init__()
            self.register_buffer("engine", torch.tensor(list(json.dumps(info).encode()), dtype=torch.uint8))
            self.input_binding_names = runtime.deserialize_binding_names(info[runtime.INPUT_BINDING_NAMES_IDX])
            self.output_binding_names = runtime.deserialize_binding_names(info[runtime.OUTPUT_BINDING_NAMES_IDX])
            self.aliased_io = runtime.deserialize_aliased_io(info[runtime.ALIASED_IO_IDX])

        def forward(self, *inputs):
            return torch.ops.tensorrt.execute_engine(list(inputs), self.engine)[0]  # the cache: updated in place

    TorchTensorRTModule.__module__ = runtime.__name__
    runtime.TorchTensorRTModule = TorchTensorRTModule

    def compiled_module():
        '''What dynamo.compile gives for it: x and the cache buffer into engine 0, its output into a relu fallback.'''
        torch.manual_seed(0)
        root = torch.nn.Module()
        root.register_buffer("cache", torch.randn(2, 4))
        info = [""] * runtime.SERIALIZATION_LEN
        info[runtime.NAME_IDX] = "_run_on_acc_0"
        info[runtime.INPUT_BINDING_NAMES_IDX] = "x%cache"
        info[runtime.OUTPUT_BINDING_NAMES_IDX] = "y%cache_out"
        info[runtime.ALIASED_IO_IDX] = runtime.serialize_aliased_io({"cache_out": ("cache", "kv_cache")})
        root._run_on_acc_0 = TorchTensorRTModule(info)
        fake = FakeTensorMode()
        with fake:
            x_val, cache_val = torch.empty(3, 4), torch.empty(2, 4)
        fallback = torch.fx.Graph()
        y = fallback.placeholder("y")
        y.meta["val"] = x_val
        relu = fallback.call_function(torch.ops.aten.relu.default, (y,))
        relu.meta["val"] = x_val
        fallback.output(relu)
        root._run_on_gpu_1 = torch.fx.GraphModule(torch.nn.Module(), fallback)
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        cache = graph.get_attr("cache")
        x.meta["val"], cache.meta["val"] = x_val, cache_val
        engine_call = graph.call_module("_run_on_acc_0", (x, cache))
        engine_call.meta["val"] = [x_val]
        out = graph.call_module("_run_on_gpu_1", (engine_call,))
        graph.output((out,))
        return torch.fx.GraphModule(root, graph)

    folder, step = sys.argv[1], sys.argv[2]
    x = torch.arange(12.0).reshape(3, 4) / 10
    if step != "load":
        compiled = compiled_module()
        before = compiled.cache.clone()
        exporter, _, output_format = step.partition(".")
        options = {"legacy": {"retrace": False}, "reexport": {"retrace": False, "use_legacy_exporter": False},
                   "retrace": {"retrace": True}}[exporter]
        try:
            torch_tensorrt.save(compiled, f"{folder}/{step}", output_format=output_format, arg_inputs=[x], **options)
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        kept = torch.equal(compiled.cache, before)
        with torch.no_grad():  # three calls: each reads the cache the one before it left
            runs = [as_list(compiled(x)) for _ in range(3)]
        torch.save({"runs": runs, "cache": compiled.cache.clone()}, f"{folder}/expected.pt")
        from torch_tensorrt.dynamo import _exporter

        passes = _exporter.inline_trt_modules.__module__  # whose passes flattened it
        print(json.dumps({"error": error, "cache_kept_by_save": kept, "passes": passes}))
    else:
        program = torch.export.load(sys.argv[3])
        module = program.module()
        expected = torch.load(f"{folder}/expected.pt")
        with torch.no_grad():
            runs = [as_list(module(x)) for _ in range(3)]
        print(json.dumps({
            "mutations": sorted(program.graph_signature.buffers_to_mutate.values()),
            "engines": sum(1 for n in program.graph.nodes if "tensorrt.execute_engine" in str(n.target)),
            "call_modules": sum(1 for n in program.graph.nodes if n.op == "call_module"),
            "diffs": [max_abs_diff(got, want) for got, want in zip(runs, expected["runs"], strict=True)],
            "cache_diff": max_abs_diff([module.cache], [expected["cache"]]),
        }))
"""


def test_kv_cache_updated_inside_an_engine_loads_and_runs_as_stock_does(tmp_path: Path) -> None:
    """2.14's aliased (KV-cache) mutations through each ``exported_program`` save path, plugin and stock.

    The release's own ``save``, exporter, ``_expose_aliased_buffer_mutations``
    (legacy exporter) and ``_declare_aliased_kv_mutations_on_ep`` (re-exported
    programs) declare the cache a buffer mutation; each file is loaded in a
    fresh process and called three times (each call reads the cache the last
    one left) against the compiled module, bit for bit, cache included. The
    plugin's sample run at save leaves the module's cache as it found it.
    """
    if RELEASE is not None and "expose_aliased_mutations" not in RELEASE.inline_trt_params:
        pytest.skip(f"Torch-TensorRT {RELEASE.version} has no aliased (KV-cache) mutations")
    tree = release_tree(tmp_path, kv_cache=True)  # (a torch no release requires: skips, saying so)
    files = [f"{exporter}.exported_program" for exporter in ("legacy", "reexport", "retrace")]
    reports = {}
    for variant in ("plugin", "stock"):
        folder = tmp_path / variant
        folder.mkdir()
        saves = run_python_forks(
            _KV_CACHE, tree, [[str(folder), path] for path in files], preload=("torch_tensorrt",),
            disable=variant == "stock",
        )  # fmt: skip
        for path, (status, output) in zip(files, saves, strict=True):
            assert status == 0, f"{variant} {path}: {output[-4000:]}"
            saved = json.loads(output.strip().splitlines()[-1])
            assert saved["error"] is None, (variant, path, saved)
            assert saved["cache_kept_by_save"], (variant, path)
            ours = "trt_inline.plugin.adapters" if variant == "plugin" else "torch_tensorrt.dynamo._exporter"
            assert saved["passes"] == ours, (variant, saved)
        for path in files:  # each file in a fresh process
            proc = run_python(_KV_CACHE, tree, str(folder), "load", str(folder / path))
            assert proc.returncode == 0, f"{variant} {path}: {proc.stderr[-4000:]}"
            reports[variant, path] = json.loads(proc.stdout.strip().splitlines()[-1])
    for path in files:
        report = reports["plugin", path]
        assert report["engines"] == 1 and report["call_modules"] == 0, (path, report)
        assert report["mutations"] == ["cache"], (path, report)
        assert report["diffs"] == [0.0, 0.0, 0.0] and report["cache_diff"] == 0.0, (path, report)
        assert reports["stock", path] == report, (path, reports["stock", path], report)
