"""The bridge to a Torch-TensorRT release's own pipeline: its lowering, autocast and partitioner, our engines.

Where a release's Python package can be imported (a real install, or ``pip install --no-deps
torch-tensorrt==X`` beside its pure-Python requirements on a machine without TensorRT or a GPU:
:data:`INSTALL`), :func:`compile_on_release` hands the exported program to that release's own
``torch_tensorrt.dynamo.compile(..., dryrun=True)``, which runs everything but the engine build (the
pre-export lowering, the decomposition table, the post-lowering passes, the rule-based autocast, the
converter registry, the partitioner, with the release's defaults) and returns the partitioned module, each
``_run_on_acc_N`` a ``GraphModule`` in the dtypes the release chose. Each of those becomes a
:class:`~trt_inline.reference.engine.ReferenceEngine` running that graph, with TensorRT's fp32 accumulation
(and TF32, where asked) emulated (:func:`~trt_inline.reference.precision.emulate_accumulation`); the
fallbacks, node names and metadata are the release's.

It runs in a child forked from the caller's process (:func:`trt_inline.isolation.interpreter.call_forked`), so that
whatever the release's import does to the process — the operators and dynamo backends it registers, the
loggers it configures, the modules it imports — and whatever trt-inline stands in for it ends with the
child: the caller's ``sys.modules``, ``torch.cuda`` and every other global are as they were. What the child
provides where the real thing is absent (each only then):

* ``tensorrt``: where the bindings do not import, a module whose every attribute is an inert class (its
  version is the one the release pins, so that version-gated converters register as they would with it);
  the release only needs the names to exist until it builds an engine, which a dry run never does;
* the native runtime (``torch_tensorrt/lib``): seen as absent, so that the release takes its own Python
  runtime (a configuration every release supports) instead of loading a library that needs CUDA and
  TensorRT;
* ``torch._C._CudaDeviceProperties`` (absent from a CPU build, named in the release's annotations) and the
  answers to the CUDA queries its import and ``compile`` make (the device's compute capability, the current
  device, free memory): the child never starts CUDA (it could not, forked from a process that has);
* ``to_torch_device``: the release moves fallback submodules and decomposition constants to its device,
  ``cuda:0``; in the child that is the CPU, and the caller moves the result to the inputs' device.

The module handed back (:mod:`trt_inline.reference.handover`) is rebuilt in the caller with the fake
values of the caller's own exported program. Where no release is importable, :func:`own_pipeline_note`
says so in one line, naming the release to install and the line that installs it.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import pickle
import re
import sys
import tempfile
import textwrap
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx

from trt_inline import compat, releases
from trt_inline.engines import ACC_PREFIX
from trt_inline.errors import CompileError
from trt_inline.isolation import interpreter
from trt_inline.reference import handover
from trt_inline.reference.engine import block_outputs, build_engine
from trt_inline.reference.lowered import LOWERED_ATTRIBUTE, lowered_nodes
from trt_inline.reference.precision import emulate_accumulation

__all__ = [
    "INSTALL",
    "PIPELINE_ATTRIBUTE",
    "InstalledRelease",
    "Rehearsal",
    "compile_on_release",
    "installed_release",
    "own_pipeline_note",
    "rehearsed_release",
    "release_pipeline_note",
]

log = logging.getLogger(__name__)

# What makes a release's pipeline importable on a machine without TensorRT: its package without its
# requirements (which would resolve torch and TensorRT), then its pure-Python ones (`trt-inline[rehearsal]`).
INSTALL = (
    "pip install --no-deps torch-tensorrt=={version} && "
    "pip install packaging typing-extensions filelock dllist psutil numpy"
)
# Where a compiled module says which pipeline built it (read by the fix report and by saves).
PIPELINE_ATTRIBUTE = "trt_inline_pipeline"
# The compute capability the child answers with where no CUDA device is visible: a data-centre part
# (TF32, no Jetson special case), as a rehearsal for a GPU the caller does not have.
_DEFAULT_CAPABILITY = (8, 0)
# trt-inline's own partitioner's settings, which no release takes.
_OWN_ONLY = ("scalar_boundaries", "collectives_in_engines")


@dataclass(frozen=True)
class InstalledRelease:
    """A Torch-TensorRT package ``import torch_tensorrt`` would find, read without importing it."""

    version: str
    tensorrt_version: str
    location: Path

    @property
    def name(self) -> str:
        return f"Torch-TensorRT {self.version}"


def installed_release() -> InstalledRelease | None:
    """The release ``import torch_tensorrt`` would import here (its ``_version.py`` read as text), or None."""
    try:
        spec = importlib.util.find_spec("torch_tensorrt")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        return None
    folder = Path(locations[0])
    try:
        text = (folder / "_version.py").read_text()
    except OSError:
        return None
    version = _assigned(text, "__version__")
    if version is None:
        return None
    return InstalledRelease(version, _assigned(text, "__tensorrt_version__") or "", folder)


def _assigned(text: str, name: str) -> str | None:
    found = re.search(rf"^{name}\s*=\s*[\"']([^\"']+)[\"']", text, flags=re.MULTILINE)
    return found.group(1) if found else None


def rehearsed_release() -> releases.Release | None:
    """The release a rehearsal here stands for: the importable one's record, else the one this torch pairs with
    (which trt-inline's own pipeline emulates); None where neither is known."""
    found = installed_release()
    record = releases.for_version(found.version) if found is not None else None
    return record or releases.for_torch(torch.__version__)


def release_pipeline_note(release: InstalledRelease) -> str:
    """What a module compiled on ``release``'s pipeline says of itself, in one line."""
    return f"{release.name}'s own pipeline (dry run), reference engines where it builds TensorRT engines"


def own_pipeline_note(chosen: bool = False) -> str:
    """What a module compiled on trt-inline's own partitioner says of itself, in one line: that it was asked for
    (``chosen``, ``pipeline='own'``), or which release to install to rehearse on its pipeline, and how."""
    head = "trt-inline's own partitioner and precision emulation, not a Torch-TensorRT release's pipeline"
    if chosen:
        return f"{head} (pipeline='own')"
    record = releases.for_torch(torch.__version__)
    version = record.version if record is not None else "X"
    return f"{head} (none is importable here): to rehearse on {version}'s, {INSTALL.format(version=version)}"


def compile_on_release(
    release: InstalledRelease,
    exported: torch.export.ExportedProgram,
    arg_inputs: Sequence[Any],
    kwarg_inputs: Mapping[str, Any] | None,
    settings: Mapping[str, Any],
    *,
    tf32: bool,
) -> torch.fx.GraphModule:
    """``release``'s ``dynamo.compile(exported, dryrun=True, **settings)`` in a forked child, each accelerated block
    a reference engine (TF32 rounding of fp32 matmuls where ``tf32``), rebuilt here under the release's names.

    Raises :class:`~trt_inline.errors.CompileError` in one line where the release refuses the settings or its
    pipeline fails (the child's traceback in ``details``).
    """
    with Rehearsal(release, exported, arg_inputs, kwarg_inputs) as rehearsal:
        return rehearsal.compile(settings, tf32=tf32)


class Rehearsal:
    """One exported program on ``release``'s pipeline, under as many settings as asked: the release is imported
    once, in a child forked once (:class:`~trt_inline.isolation.interpreter.ForkedServer`), and each
    :meth:`compile` runs in a child of that one, from the exported program as the release first saw it. What a
    search of compile settings
    (:func:`trt_inline.find_fix`) compiles with, so that it pays for the import once."""

    def __init__(
        self,
        release: InstalledRelease,
        exported: torch.export.ExportedProgram,
        arg_inputs: Sequence[Any],
        kwarg_inputs: Mapping[str, Any] | None = None,
    ) -> None:
        _check_release(release)
        self.release, self.exported = release, exported
        self.device = _device_of(exported, arg_inputs)
        cpu = torch.device("cpu")
        self._program = exported if self.device.type == "cpu" else compat.program_copy_on(exported, cpu)
        self._inputs = [value.to(cpu) if isinstance(value, torch.Tensor) else value for value in arg_inputs]
        self._kwarg_inputs = dict(kwarg_inputs or {})
        self._capability = (
            torch.cuda.get_device_capability(self.device) if self.device.type == "cuda" else _DEFAULT_CAPABILITY
        )
        self._output = tempfile.NamedTemporaryFile(prefix="trt-inline-rehearsal-", suffix=".log")
        self._server: interpreter.ForkedServer | None = None

    def dry_run(self, settings: Mapping[str, Any]) -> torch.fx.GraphModule:
        """The module the release's dry run returns with ``settings``, as it returns it: each ``_run_on_acc_N`` the
        ``GraphModule`` the release would hand to TensorRT, which PyTorch runs in the dtypes the release chose
        (what :meth:`compile`'s engines are checked against)."""
        return self.compile(settings, tf32=False, engines=False)

    def compile(self, settings: Mapping[str, Any], *, tf32: bool, engines: bool = True) -> torch.fx.GraphModule:
        """The module the release's dry run partitions with ``settings``, its engines reference engines."""
        own = sorted(set(settings) & set(_OWN_ONLY))
        if own:
            raise CompileError(
                f"reference.compile: {', '.join(own)} belong to trt-inline's own partitioner, which "
                f"{self.release.name}'s pipeline does not use: leave them out, or pass pipeline='own'"
            )
        try:
            request = handover.dumps((dict(settings), tf32, engines))
        except Exception:  # (a setting that does not pickle, a data loader of lambdas: asked in a child of its own)
            request = None
        try:
            if request is None:
                data = interpreter.call_forked(
                    lambda: self._answer(dict(settings), tf32, engines, imported=False), output=self._output.name
                )
            else:
                data = self._started().call(request)
        except interpreter.ForkedCallError as exc:
            said = (
                exc.message if exc.kind == CompileError.__name__
                else f"reference.compile: {self.release.name}'s dynamo.compile (dry run) failed: {exc.summary}"
            )  # fmt: skip
            error = CompileError(said)
            error.details = exc.details  # type: ignore[attr-defined]
            raise error from None
        finally:
            if log.isEnabledFor(logging.DEBUG):
                said = Path(self._output.name).read_text(errors="replace")
                log.debug("%s's dry runs said:\n%s", self.release.name, said)
        return self._rebuilt(data)

    def _started(self) -> interpreter.ForkedServer:
        if self._server is None or not self._server.pid:  # (none yet, or closed by an interrupted call)
            release, capability = self.release, self._capability

            def setup() -> None:
                torch.set_num_threads(1)  # (see call_forked: no OpenMP thread pool after a fork)
                _import_release(release, capability)

            def handle(request: bytes) -> bytes:
                settings, tf32, engines = pickle.loads(request)  # (this process's own request, to its own child)
                return self._answer(settings, tf32, engines, imported=True)

            self._server = interpreter.ForkedServer(setup, handle, output=self._output.name)
        return self._server

    def _answer(self, settings: dict[str, Any], tf32: bool, engines: bool, *, imported: bool) -> bytes:
        """In the child: the dry run with ``settings``, its blocks made engines, described for the caller."""
        if not imported:
            torch.set_num_threads(1)
            _import_release(self.release, self._capability)
        return _dry_run(self.release, self._program, self._inputs, self._kwarg_inputs, settings, tf32, engines)

    def _rebuilt(self, data: bytes) -> torch.fx.GraphModule:
        exported = self.exported
        fake_mode = compat.detect_fake_mode([n.meta.get("val") for n in exported.graph.nodes if n.op == "placeholder"])
        flat = exported.module()
        device = None if self.device.type == "cpu" else self.device
        try:
            split = handover.rebuild(handover.loads(data), fake_mode, device, own=flat)
        except Exception as exc:  # (what the child handed over names something this process lacks)
            first = (str(exc).strip().splitlines() or [""])[0]
            raise CompileError(
                f"reference.compile: the module {self.release.name}'s dry run returned cannot be rebuilt here "
                f"({type(exc).__name__}: {first}): pass pipeline='own'"
            ) from exc
        compat.set_codegen(split.graph, compat.graph_codegen(flat.graph))
        for attr in ("_in_spec", "_out_spec"):
            if hasattr(flat, attr):
                setattr(split, attr, getattr(flat, attr))
        split.recompile()
        setattr(split, PIPELINE_ATTRIBUTE, release_pipeline_note(self.release))
        return split

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._output.close()

    def __enter__(self) -> Rehearsal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_release(release: InstalledRelease) -> None:
    """A release whose pipeline can run with this torch: the one it requires (its minor version)."""
    record = releases.for_version(release.version)
    if record is None:
        supported = ", ".join(r.version for r in releases.RELEASES)
        raise CompileError(
            f"reference.compile: {release.name} (at {release.location}) is not a release trt-inline knows "
            f"({supported}): install one of them, or pass pipeline='own'"
        )
    if releases.minor(record.torch) != releases.minor(torch.__version__):
        raise CompileError(
            f"reference.compile: {release.name} requires torch {record.torch}, and this is torch "
            f"{torch.__version__}: install the pair (pip install torch=={record.torch}), or pass pipeline='own'"
        )


def _device_of(exported: torch.export.ExportedProgram, arg_inputs: Sequence[Any]) -> torch.device:
    """Where the rehearsed module runs: its inputs' device (its weights' where it takes no tensor)."""
    for value in (*arg_inputs, *exported.state_dict.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


# ---------------------------------------------------------------------------
# The child
# ---------------------------------------------------------------------------


def _dry_run(
    release: InstalledRelease,
    exported: torch.export.ExportedProgram,
    arg_inputs: list[Any],
    kwarg_inputs: dict[str, Any],
    settings: dict[str, Any],
    tf32: bool,
    engines: bool = True,
) -> bytes:
    """In the child, the release imported: its dry run, the accelerated blocks made engines (unless not
    ``engines``: the release's own blocks, as its dry run returns them), the result described (with the nodes it
    lowered)."""
    torch_tensorrt = sys.modules["torch_tensorrt"]
    compile_function = torch_tensorrt.dynamo.compile
    _check_settings(release, compile_function, settings)
    inputs_keyword = "arg_inputs" if "arg_inputs" in inspect.signature(compile_function).parameters else "inputs"
    extra = {"kwarg_inputs": kwarg_inputs} if kwarg_inputs else {}
    partitioned = compile_function(exported, **{inputs_keyword: arg_inputs}, **extra, **settings, dryrun=True)
    if not isinstance(partitioned, torch.fx.GraphModule):
        raise TypeError(f"its dry run returned a {type(partitioned).__qualname__}, not a partitioned GraphModule")
    table = lowered_nodes(partitioned)
    for name, block in list(partitioned.named_children()):
        if engines and name.startswith(ACC_PREFIX) and isinstance(block, torch.fx.GraphModule):
            _refuse_engine_collectives(release, name, block)
    for module in partitioned.modules():
        if isinstance(module, torch.fx.GraphModule):
            _unfuse_collectives(module)
    calls = {str(node.target): node for node in partitioned.graph.nodes if node.op == "call_module"}
    for name, block in list(partitioned.named_children()):
        if engines and name.startswith(ACC_PREFIX) and isinstance(block, torch.fx.GraphModule):
            call = calls.get(name)
            if call is not None and not isinstance(call.meta.get("val"), (list, tuple)):
                # (2.5 records the engine's output values on the block's nodes only: its exporter reads them there)
                call.meta["val"] = [out.meta.get("val") for out in block_outputs(block)]
            emulate_accumulation(block, tf32=tf32)
            setattr(partitioned, name, build_engine(block, name, release_pipeline_note(release)))
    record = handover.describe(partitioned)
    record.attributes[LOWERED_ATTRIBUTE] = table
    return handover.dumps(record)


# The collectives the releases' ``fuse_distributed_ops`` (2.6+) fuse with their wait into one call of their own: a
# Python function of the release (``tensorrt_fused_nccl_all_gather_op``, to 2.12) or an operator of the ``tensorrt``
# namespace (``tensorrt::fused_nccl_all_gather``, 2.13+), either of which exists only where the release is
# imported. Each is its c10d collective then ``wait_tensor`` (the fused call's own PyTorch implementation), with the
# same arguments.
_FUSED_COLLECTIVES = {
    "all_gather": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter_tensor",
    "all_reduce": "all_reduce",
    "all_to_all": "all_to_all_single",
}
_FUSED_FUNCTION = re.compile(r"^tensorrt_fused_nccl_(\w+)_op$")


def _fused_collective(target: Any) -> str | None:
    """``"all_gather"`` for a fused collective's call (either form), None for any other target."""
    schema = compat.op_schema_name(target)
    if schema is not None:
        name = schema.removeprefix("tensorrt::fused_nccl_")
        return name if name != schema else None
    module = getattr(target, "__module__", None) or ""
    match = _FUSED_FUNCTION.match(getattr(target, "__name__", "") or "")
    return match.group(1) if match is not None and module.startswith("torch_tensorrt") else None


def _refuse_engine_collectives(release: InstalledRelease, name: str, block: torch.fx.GraphModule) -> None:
    """Raise CompileError where the release put a collective inside a block it would build into a TensorRT engine
    (its converter runs it on TensorRT-LLM's NCCL plugin), which a reference engine does not hold."""
    for node in block.graph.nodes:
        if node.op == "call_function" and _fused_collective(node.target) is not None:
            raise CompileError(
                f"reference.compile: {release.name}'s pipeline puts the collective {node.name} in engine {name}, to "
                "run on TensorRT-LLM's NCCL plugin, which reference engines do not emulate: pass pipeline='own' "
                "(collectives stay in PyTorch)"
            )


def _unfuse_collectives(module: torch.fx.GraphModule) -> None:
    """In the child: each fused collective the release made put back as the two calls it stands for, so that the
    module runs (and unpickles) where the release is not imported. Raises CompileError naming any other operator
    the release's import registered.

    Before::

        fused = tensorrt.fused_nccl_all_reduce(mm, "sum", "0")
        add = aten.add(fused, bias)

    After::

        all_reduce = _c10d_functional.all_reduce(mm, "sum", "0")
        wait_tensor = _c10d_functional.wait_tensor(all_reduce)
        add = aten.add(wait_tensor, bias)
    """
    changed = False
    for fused in list(module.graph.nodes):
        if fused.op != "call_function":
            continue
        name = _fused_collective(fused.target)
        schema = compat.op_schema_name(fused.target) or ""
        if name is None and not schema.startswith("tensorrt::"):
            continue
        if name not in _FUSED_COLLECTIVES:
            raise CompileError(
                f"reference.compile: the release's pipeline put {schema or name} (node {fused.name}) where PyTorch "
                "runs it, and it exists only where the release is imported: pass pipeline='own'"
            )
        collective = compat.op_by_name(f"_c10d_functional::{_FUSED_COLLECTIVES[name]}", "default")
        wait = compat.op_by_name("_c10d_functional::wait_tensor", "default")
        with module.graph.inserting_before(fused):
            started = module.graph.call_function(collective, fused.args, fused.kwargs)
            waited = module.graph.call_function(wait, (started,))
        for node in (started, waited):
            node.meta = dict(fused.meta)
        fused.replace_all_uses_with(waited)
        module.graph.erase_node(fused)
        changed = True
    if changed:
        module.recompile()


def _import_release(release: InstalledRelease, capability: tuple[int, int]) -> None:
    """``import torch_tensorrt`` in the child, with what it needs and this machine lacks stood in for."""
    if not _tensorrt_imports():
        sys.modules["tensorrt"] = _tensorrt_stand_in(release.tensorrt_version)
        if releases.minor(release.version) < (2, 8):
            # 2.6 and 2.7 import the bindings' QDP plugin module (TensorRT 10.7+) whatever the features: it
            # stands in too, with no plugin registered. Later releases ask for it first, and are told it is absent.
            _plugin_stand_in(sys.modules["tensorrt"])
    compat.answer_cuda_queries(capability)
    if not hasattr(torch.fx.GraphModule, "set_output_tensors_as_unowned"):
        # 2.10 and 2.11's dry run asks each block that returns a model output to hand its outputs over unowned,
        # as the engine module it would have built does (2.12 on ask only outside a dry run): the block does
        # nothing, as there is no engine memory to hand over.
        torch.fx.GraphModule.set_output_tensors_as_unowned = _no_engine_memory  # type: ignore[attr-defined]
    with _native_runtime_hidden(release.location):
        torch_tensorrt = importlib.import_module("torch_tensorrt")
    _rebind(torch_tensorrt, "to_torch_device", _to_torch_device)


def _no_engine_memory(self: torch.fx.GraphModule, unowned: bool) -> None:
    """A dry run's block asked what an engine module is (``set_output_tensors_as_unowned``): nothing to do."""


def _tensorrt_imports() -> bool:
    """Whether the real bindings import here (then nothing stands in for them)."""
    try:
        importlib.import_module("tensorrt")
    except Exception:  # (not installed, or its libraries missing: OSError, ImportError)
        for name in [m for m in sys.modules if m == "tensorrt" or m.startswith("tensorrt.")]:
            del sys.modules[name]
        return False
    return True


class _Inert(type):
    """A class whose every attribute is another inert class (cached, so that two reads give the same one)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        made = _inert(name)
        setattr(cls, name, made)
        return made


def _inert(name: str) -> type:
    def anything(self: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def attribute(self: Any, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _inert(attr)

    return _Inert(name, (), {"__init__": anything, "__getattr__": attribute})


class _TensorRTStandIn(types.ModuleType):
    """The ``tensorrt`` bindings' names, each an inert class; ``tensorrt.tensorrt`` is the module itself, as the
    bindings' ``from .tensorrt import *`` makes it. It has no ``tensorrt_rtx`` (the release checks for it to pick
    the RTX variant) and no ``plugin`` (no QDP plugins)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("tensorrt_rtx", "_package_name", "plugin"):
            raise AttributeError(name)
        made = _inert(name)
        setattr(self, name, made)
        return made


def _tensorrt_stand_in(version: str) -> types.ModuleType:
    module = _TensorRTStandIn("tensorrt")
    vars(module).update(
        __version__=version or "10.0.0", __file__=os.devnull, __path__=[], tensorrt=module,
        __spec__=importlib.util.spec_from_loader("tensorrt", loader=None, is_package=True),
    )  # fmt: skip
    return module


def _plugin_stand_in(bindings: types.ModuleType) -> None:
    """``tensorrt.plugin`` and ``tensorrt.plugin._lib`` (``QDP_REGISTRY`` empty), every other attribute inert."""
    plugin, lib = _TensorRTStandIn("tensorrt.plugin"), _TensorRTStandIn("tensorrt.plugin._lib")
    vars(lib).update(QDP_REGISTRY={}, __spec__=importlib.util.spec_from_loader("tensorrt.plugin._lib", loader=None))
    vars(plugin).update(
        _lib=lib, __path__=[], __spec__=importlib.util.spec_from_loader("tensorrt.plugin", loader=None, is_package=True)
    )
    vars(bindings)["plugin"] = plugin
    sys.modules.update({"tensorrt.plugin": plugin, "tensorrt.plugin._lib": lib})


@contextlib.contextmanager
def _native_runtime_hidden(package: Path) -> Iterator[None]:
    """While the release imports, its native runtime (``torch_tensorrt/lib/*``, which needs CUDA and TensorRT's
    libraries) is seen as absent: the release then uses its own Python runtime."""
    library = str(package / "lib") + os.sep
    is_file = os.path.isfile

    def seen(path: Any) -> bool:
        return False if os.fspath(path).startswith(library) else is_file(path)

    os.path.isfile = seen  # type: ignore[assignment]
    try:
        yield
    finally:
        os.path.isfile = is_file  # type: ignore[assignment]


def _to_torch_device(device: Any) -> torch.device:
    """The release's ``to_torch_device`` in the child: its GPU is the CPU here."""
    if device is None or isinstance(device, int) or compat.is_torch_tensorrt_device(device):
        return torch.device("cpu")
    resolved = torch.device(device)
    return torch.device("cpu") if resolved.type == "cuda" else resolved


def _rebind(package: types.ModuleType, name: str, replacement: Any) -> None:
    """Replace the release's function ``name`` wherever one of its modules bound it (``from .utils import name``)."""
    prefix = package.__name__ + "."
    original = getattr(sys.modules.get(prefix + "dynamo.utils"), name, None)
    if original is None:
        return
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == package.__name__ or module_name.startswith(prefix)):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)


def _check_settings(release: InstalledRelease, compile_function: Any, settings: Mapping[str, Any]) -> None:
    """Every setting given is one ``compile`` reads: a parameter, or a key it looks up in ``**kwargs``. (Anything
    else falls into ``**kwargs`` and is ignored without a word: ``enabled_precisions`` from 2.13.)"""
    taken = accepted_settings(compile_function)
    unread = sorted(name for name in settings if name not in taken)
    if unread:
        hints = [_HINTS.get(name) or _closest(name, taken) for name in unread]
        said = "; ".join(hint for hint in hints if hint)
        raise CompileError(
            f"reference.compile: {release.name}'s dynamo.compile does not read {', '.join(unread)} (it would ignore "
            f"{'them' if len(unread) > 1 else 'it'} without a word)" + (f": {said}" if said else "")
        )


# What to give instead of a setting a release does not read, where the setting is one of an older release.
_HINTS = {
    "enabled_precisions": "for fp16 layers give enable_autocast=True, autocast_low_precision_type=torch.float16",
    "use_explicit_typing": "its graphs are always strongly typed",
}


def _closest(name: str, taken: frozenset[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, sorted(taken), n=1)
    return f"did you mean {close[0]}?" if close else ""


def accepted_settings(compile_function: Any) -> frozenset[str]:
    """The settings a release's ``dynamo.compile`` reads: its keyword parameters, and the keys its body reads
    from ``**kwargs`` (``kwargs["refit"]``, ``kwargs.get("debug")``, ``"refit" in kwargs.keys()``)."""
    signature = inspect.signature(compile_function)
    named = {
        name for name, parameter in signature.parameters.items()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }  # fmt: skip
    named -= {"exported_program", "inputs", "arg_inputs", "kwarg_inputs", "dryrun"}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(compile_function)))
    except (OSError, TypeError, SyntaxError):
        return frozenset(named)
    return frozenset(named | _keys_read_from_kwargs(tree))


def _keys_read_from_kwargs(tree: ast.AST) -> set[str]:
    def is_kwargs(node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id == "kwargs"
        return (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_kwargs(node.func.value)
            and node.func.attr == "keys"
        )  # fmt: skip

    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_kwargs(node.value) and isinstance(node.slice, ast.Constant):
            found.add(str(node.slice.value))
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and is_kwargs(node.func.value) and node.args and isinstance(node.args[0], ast.Constant)
        ):  # fmt: skip
            found.add(str(node.args[0].value))
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
            if any(isinstance(op, ast.In) for op in node.ops) and any(is_kwargs(c) for c in node.comparators):
                found.add(str(node.left.value))
    return found
