"""Torch-TensorRT releases trt-inline supports, the torch each requires, and an importable shell of their save path.

``torch_tensorrt`` cannot be imported on a CPU machine (it needs ``libnvinfer``),
so the plugin tests build a ``torch_tensorrt`` package in a temporary folder
holding the release's real ``dynamo/_exporter.py`` and the real ``save`` and
``load`` of its ``_compile.py`` (with the functions they call), plus stand-ins for what those
import from the rest of Torch-TensorRT. For 2.5, whose ``transform`` calls
``partitioning.run_shape_analysis``, that function is taken from the same
release. The wheel is downloaded with pip once and cached.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
if str(REPO) not in sys.path:  # .ci/matrix imports this file from a Python that has not installed the project
    sys.path.insert(0, str(REPO))

# Loaded by path, not through the package: trt_inline/__init__ imports torch.
_spec = importlib.util.spec_from_file_location("_trt_inline_releases", REPO / "trt_inline" / "releases.py")
assert _spec is not None and _spec.loader is not None
_records = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _records  # dataclasses look their module up while the class is built
_spec.loader.exec_module(_records)
RELEASES, FUTURE_TORCH, Release, for_torch, minor = (
    _records.RELEASES,
    _records.FUTURE_TORCH,
    _records.Release,
    _records.for_torch,
    _records.minor,
)

# Torch-TensorRT release -> the torch it requires, from trt_inline's release records.
PAIRS: dict[str, str] = {release.version: release.torch for release in RELEASES}

CACHE = Path(os.environ.get("TRT_INLINE_TEST_CACHE", Path.home() / ".cache" / "trt-inline-tests"))
# A folder laid out as the package (dynamo/_exporter.py, _compile.py, dynamo/partitioning/common.py) whose
# sources stand in for those of the release the installed torch belongs to: an unreleased Torch-TensorRT
# (a checkout of its main branch) tested against the release it will follow.
SOURCES_OVERRIDE = os.environ.get("TRT_INLINE_TORCH_TENSORRT_SOURCES")


def release_for_torch(torch_version: str | None = None) -> Release | None:
    """The record of the release that requires this torch's (default: the installed one's) minor version."""
    if torch_version is None:
        import torch  # not at import time: .ci/matrix reads PAIRS with a Python that has no torch

        torch_version = torch.__version__
    return for_torch(torch_version)


def fp16_settings(torch_version: str | None = None) -> dict[str, Any]:
    """The settings of an fp16 build as the release this torch pairs with takes them: ``enable_autocast=True,
    autocast_low_precision_type=torch.float16`` where it has autocast (2.10+, whose default low type is fp32),
    ``enabled_precisions={torch.float16}`` before (a torch no release requires yet: the newest's)."""
    import torch

    record = release_for_torch(torch_version) or RELEASES[-1]
    if record.autocast:
        return {"enable_autocast": True, "autocast_low_precision_type": torch.float16}
    return {"enabled_precisions": {torch.float16}}


def autocast_skip(torch_version: str | None = None) -> str | None:
    """Why a test of rule-based autocast cannot run on this torch's release (None where it can)."""
    import torch

    record = release_for_torch(torch_version)
    if record is None or record.autocast:
        return None
    torch_version = torch_version or torch.__version__
    return f"Torch-TensorRT {record.version} (the release of torch {torch_version}) has no rule-based autocast"


def documented_skips(release: str | None, torch_version: str) -> list[str]:
    """Regexes of the skip reasons a CPU run of the suite may report for ``release`` on ``torch_version``.

    ``release`` is a Torch-TensorRT version, or None for a torch no release
    requires yet. ``.ci/matrix`` fails a pair reporting any other skip: a skip
    that is not one of these hides a test that should have run. The README's
    compatibility table explains each.
    """
    record = for_torch(torch_version) if release is not None else None
    allowed = [
        r"real TensorRT engines: ",  # the GPU suite (Docker GPU job)
        r"reference engines on CUDA tensors: no CUDA device",
        r"needs a CUDA device, and this machine has none",  # the cuda lane (.ci/cuda)
        r"tests at scale \(1 GiB model, reports at the cap\) run with --memory",  # .ci/run runs them on their own
        r"the torchrun rank-set tests run with --tensor-parallel",  # .ci/run runs them on their own
        r"the runnable code blocks of README\.md and docs/ run with --docs",  # .ci/run runs them on their own
        r"the hub models \(transformers\) run with --hub",  # .ci/run runs them on their own
        r"the random-graph property suites run with --property",  # .ci/run runs them on their own
    ]
    if minor(torch_version) < (2, 9):
        allowed.append(r"writes no payload configs")  # measured on 2.8.0 too
        allowed.append(r"keeps tensors in one torch\.save blob")  # no raw records to cut short
    if minor(torch_version) < (2, 8):
        allowed.append(r"AOTInductor packages: ")
    if minor(torch_version) < (2, 7):  # (where torch.export.passes has no move_to_device_pass)
        allowed.append(r"has no torch\.export\.passes\.move_to_device_pass")
        allowed.append(r"has no aten::rrelu_with_noise_functional")  # (a functional variant of later releases)
    if minor(torch_version) < (2, 6):
        allowed.append(r"export keeps no size floor-divided by 2")
    if minor(torch_version) < (2, 7):  # (the flag exists from 2.7.1: compat.traces_size_obliviously)
        allowed.append(r"traces without size-oblivious sizes")
    if (2, 7) <= minor(torch_version) < (2, 10):  # the size-oblivious flag, still guarding there (2.7.1 ... 2.9.1)
        allowed.append(r"guards on an engine's unbacked size scalar in slice_forward")
    if (2, 8) <= minor(torch_version) < (2, 13):
        allowed.append(r"AOTInductor before torch 2\.13 \(here [^)]*\) cannot recompile a slice sized by a scalar")
    if record is None:
        allowed.append(r"no Torch-TensorRT release requires torch ")
        return allowed
    if not record.autocast:
        allowed.append(r"has no rule-based autocast")
    if not record.aot_inductor:
        allowed.append(r"has no output_format='aot_inductor'")
    if not record.executorch:
        allowed.append(r"has no output_format='executorch'")
    if record.minor < (2, 6):
        allowed.append(r"has no cross-compiling")
    if "expose_aliased_mutations" not in record.inline_trt_params:
        allowed.append(r"has no aliased \(KV-cache\) mutations")
    if not record.retrace_inlines:
        allowed += [r"retraces the compiled module directly", r"export\(\) does not re-export the inlined graph"]
    if not record.wires_by_name:
        allowed.append(r"already wires fallback inputs by position")
    if record.lift_persistent:
        allowed.append(r"keeps its own lift \(wrapped\)")
    return allowed


class Unavailable(Exception):
    """The release's wheel could not be fetched (no package index reachable)."""


# The files of a release's wheel the tests read (extracted once per release into the cache).
RELEASE_MEMBERS = (
    "dynamo/_exporter.py", "_compile.py", "dynamo/partitioning/common.py", "dynamo/__init__.py", "dynamo/_refit.py",
    "dynamo/_compiler.py", "dynamo/runtime/_serialized_engine_layout.py", "dynamo/_defaults.py",
)  # fmt: skip
# Members only some releases have (the engine info layout in Python: 2.13+): absent ones are marked as such.
_OPTIONAL_MEMBERS = ("dynamo/runtime/_serialized_engine_layout.py",)


def exporter_imports(source: str) -> str:
    """The statements of a module's source that bind exporter names when it is imported (``from ..._exporter import``).

    Those of its top level, also inside an ``if`` or a ``try`` (``torch_tensorrt.dynamo``
    imports ``export`` inside an ``if``), come out as top-level statements, relative imports made
    absolute; an import inside a function runs when it is called and reads the exporter then.
    """

    def executed_at_import(body: list[ast.stmt]) -> Iterator[ast.stmt]:
        for statement in body:
            yield statement
            if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(statement, field, None)
                    if isinstance(inner, list):
                        yield from executed_at_import([s for s in inner if isinstance(s, ast.stmt)])
                for handler in getattr(statement, "handlers", []):
                    yield from executed_at_import(handler.body)

    found = []
    for node in executed_at_import(ast.parse(source).body):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "_exporter":
            names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
            found.append(f"from torch_tensorrt.dynamo._exporter import {names}")
    return "\n".join(found) + "\n"


def release_file(version: str, member: str) -> str:
    """Source of ``torch_tensorrt/<member>`` in a release's wheel (downloaded once, cached).

    Under ``TRT_INLINE_TORCH_TENSORRT_SOURCES``, the file of that folder instead.
    """
    if SOURCES_OVERRIDE:
        return (Path(SOURCES_OVERRIDE) / member).read_text()
    cached = CACHE / version / member
    absent = cached.with_name(cached.name + ".absent")
    if absent.exists():
        raise FileNotFoundError(f"torch-tensorrt {version} has no {member}")
    if not cached.exists():
        download = CACHE / version / "wheel"
        download.mkdir(parents=True, exist_ok=True)
        wheels = sorted(download.glob("torch_tensorrt-*.whl"))
        if not wheels:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                 f"torch-tensorrt=={version}", "-d", str(download)],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            wheels = sorted(download.glob("torch_tensorrt-*.whl"))
            if proc.returncode != 0 or not wheels:
                reason = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
                raise Unavailable(f"cannot download torch-tensorrt=={version}: {reason}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            present = set(wheel.namelist())
            for name in RELEASE_MEMBERS:
                target = CACHE / version / name
                target.parent.mkdir(parents=True, exist_ok=True)
                if name in _OPTIONAL_MEMBERS and f"torch_tensorrt/{name}" not in present:
                    target.with_name(target.name + ".absent").write_text("")
                    continue
                target.write_bytes(wheel.read(f"torch_tensorrt/{name}"))
        for wheel_file in wheels:
            wheel_file.unlink()
    if absent.exists():
        raise FileNotFoundError(f"torch-tensorrt {version} has no {member}")
    return cached.read_text()


# What a release's pipeline imports beyond torch and the test extra (its other pure-Python requirements, packaging,
# typing-extensions, filelock and numpy, come with them): the rest of `pip install torch-tensorrt==X`, less
# TensorRT and torch.
RELEASE_REQUIREMENTS = ("dllist==2.0.0", "psutil==7.2.2")


def release_site(version: str) -> Path:
    """A folder holding Torch-TensorRT ``version``'s whole Python package, installed from its wheel without its
    requirements, and the pure-Python requirements it imports (:data:`RELEASE_REQUIREMENTS`): what ``pip install
    --no-deps torch-tensorrt==X`` gives a machine without TensorRT, to put first on ``sys.path``. Installed into the
    cache once (the folder is renamed into place only when whole)."""
    target = CACHE / version / "site"
    if (target / "torch_tensorrt" / "_version.py").is_file():
        return target
    partial = target.with_name("site.partial")
    subprocess.run(["rm", "-rf", str(partial)], check=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--only-binary=:all:", "--target", str(partial), f"torch-tensorrt=={version}", *RELEASE_REQUIREMENTS],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0 or not (partial / "torch_tensorrt" / "_version.py").is_file():
        reason = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise Unavailable(f"cannot install torch-tensorrt=={version} --no-deps: {reason}")
    subprocess.run(["rm", "-rf", str(target)], check=True)
    partial.rename(target)
    return target


def release_site_or_skip(version: str) -> Path:
    """:func:`release_site`, or the test skipped where the wheel cannot be fetched (failed under ``CI=true``,
    where the package registry must be reachable)."""
    import pytest

    try:
        return release_site(version)
    except Unavailable as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))


# ExecuTorch's Python package and what `executorch.exir` imports (its other requirements are for its
# runtimes and tools): what a user installs with `torch_tensorrt[executorch]`, less the GPU runtime.
EXECUTORCH = ("executorch==1.5.1", "flatbuffers==25.12.19", "ruamel.yaml==0.19.1", "tabulate==0.10.0")


def executorch_site() -> Path:
    """A folder to put on ``PYTHONPATH`` for ``import executorch.exir`` (installed into the cache once)."""
    return _site(EXECUTORCH, Path("executorch") / "exir")


# transformers and what `import transformers` and its models import beside torch, numpy and the test venv's own
# packages (pinned: the closure pip resolves for transformers 5.25.0 on this venv, less torch). What a user adds to
# the README's venv with `pip install transformers` (which needs no torch of its own).
TRANSFORMERS = (
    "transformers==5.25.0", "huggingface_hub==2.4.0", "tokenizers==0.23.3", "safetensors==0.8.0",
    "regex==2026.12.2", "tqdm==4.70.1", "hf-xet==1.8.0", "httpx2==2.17.0", "httpcore2==2.17.0", "h11==0.16.0",
    "anyio==4.16.0", "typer==0.29.2", "rich==15.0.0", "shellingham==1.5.4", "markdown-it-py==4.3.0",
    "mdurl==0.1.2", "annotated-doc==0.0.7", "truststore==0.10.5", "tomlkit==0.15.3", "pydantic==2.14.4",
    "pydantic_core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5", "kernels==0.19.1",
)  # fmt: skip


def transformers_site() -> Path:
    """A folder to put on ``PYTHONPATH`` for ``import transformers`` (installed into the cache once)."""
    return _site(TRANSFORMERS, Path("transformers") / "models" / "gpt2")


# The torchvision each torch pairs with (its registry wheels are CUDA builds of that torch).
TORCHVISION = {(2, 13): "torchvision==0.28.0", (2, 14): "torchvision==0.29.0"}


def torchvision_site(torch_version: str) -> Path:
    """A folder to put on ``PYTHONPATH`` for the torchvision ``torch_version`` pairs with (installed into the cache
    once; whether it imports with that torch is another matter: :class:`Unavailable` where none pairs)."""
    pinned = TORCHVISION.get(minor(torch_version))
    if pinned is None:
        raise Unavailable(f"no torchvision is pinned for torch {torch_version} (tests/support/pairs.py, TORCHVISION)")
    return _site((pinned,), Path("torchvision") / "models" / "resnet.py")


def _site(packages: Sequence[str], probe: Path) -> Path:
    """``packages`` installed into a cached folder (once: ``probe`` in it says so), without dependencies, so that no
    other torch is ever resolved; :class:`Unavailable` where pip cannot fetch them."""
    target = CACHE / packages[0].replace("==", "-")
    if (target / probe).exists():
        return target
    partial = target.with_name(target.name + ".partial")
    subprocess.run(["rm", "-rf", str(partial)], check=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--only-binary=:all:", "--target", str(partial), *packages],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise Unavailable(f"cannot install {' '.join(packages)}: {reason}")
    partial.rename(target)
    return target


# ---------------------------------------------------------------------------
# Extracting real functions from a release's module, with stand-ins for the rest
# ---------------------------------------------------------------------------

_STUBS = """
import types as _types


class _Features:
    def __getattr__(self, name):
        return False


ENABLED_FEATURES = _Features()


class _ShapeMode:
    STATIC = "static"
    DYNAMIC = "dynamic"


class Input:
    _ShapeMode = _ShapeMode


def _stub_class(name):
    return type(name, (), {})


def _stub_function(name):
    def unavailable(*args, **kwargs):
        raise NotImplementedError(f"{name} is not part of the test shell of Torch-TensorRT")
    return unavailable
"""


def _free_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def extract(source: str, roots: list[str]) -> str:
    """A module with the real top-level definitions ``roots`` need (decorators dropped) and stand-ins for the rest."""
    tree = ast.parse(source)
    definitions: dict[str, ast.stmt] = {}
    kept_imports: list[ast.stmt] = []
    imported: set[str] = set()
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
            definitions[statement.name] = statement
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    definitions[target.id] = statement
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            module = statement.module if isinstance(statement, ast.ImportFrom) else statement.names[0].name
            names = {(alias.asname or alias.name).split(".")[0] for alias in statement.names}
            if not (module or "").startswith("torch_tensorrt") and not (
                isinstance(statement, ast.ImportFrom) and statement.module == "__future__"
            ):
                kept_imports.append(statement)
                imported |= names
    needed: list[str] = []
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in needed or name not in definitions:
            continue
        needed.append(name)
        todo += sorted(_free_names(definitions[name]))
    chosen = [s for s in tree.body if any(definitions.get(name) is s for name in needed)]
    for statement in chosen:
        if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
            statement.decorator_list = []
    loaded = set().union(*(_free_names(s) for s in chosen))
    bound = {n.id for s in chosen for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {n.arg for s in chosen for n in ast.walk(s) if isinstance(n, ast.arg)}
    missing = loaded - set(definitions) - imported - bound - set(vars(builtins)) - {"ENABLED_FEATURES", "Input"}
    stubs = [
        f"{name} = _stub_class({name!r})" if name[:1].isupper() else f"{name} = _stub_function({name!r})"
        for name in sorted(missing)
    ]
    header = "from __future__ import annotations\n" + "\n".join(ast.unparse(s) for s in kept_imports)
    extra = "import torch\nimport torch.fx\nfrom torch.export import ExportedProgram\n"
    body = "\n\n".join(ast.unparse(s) for s in chosen)
    return f"{header}\n{extra}{_STUBS}\n" + "\n".join(stubs) + f"\n\n{body}\n"


# The stock inline_trt_modules emits tensorrt::execute_engine for every accelerated block; with reference
# engines (a uint8 payload where TensorRT has an Engine object) it needs an op of that name to build the graph.
_STAND_IN_ENGINE_OP = """
import torch

torch.library.define("tensorrt::execute_engine", "(Tensor[] input_tensors, Tensor engine) -> Tensor[]")
"""


# What `output_format="executorch"` imports from Torch-TensorRT around ExecuTorch's own lowering (real): its
# partitioner hands TensorRT engines to the TensorRT delegate. The shell's engines are reference engines, which
# no ExecuTorch runtime runs: a stand-in delegate takes them (its blob is the engine call's graph), so that
# ExecuTorch writes the .pte; every edge program handed to the partitioner is kept in EDGE_PROGRAMS.
_EXECUTORCH_STAND_INS = """
import copy

import torch.fx
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult

EDGE_PROGRAMS = []


class StandInEngineBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs):
        return PreprocessResult(processed_bytes=str(edge_program.graph).encode())


class TensorRTPartitioner(Partitioner):
    def __init__(self, compile_specs=None):
        super().__init__()

    def partition(self, exported_program):
        EDGE_PROGRAMS.append(copy.deepcopy(exported_program))  # before its engine calls become delegate calls
        tags = {}
        for index, node in enumerate(exported_program.graph.nodes):
            if node.op == "call_function" and "execute_engine" in str(node.target):
                tag = f"engine_{index}"
                tags[tag] = DelegationSpec(StandInEngineBackend.__name__, [])
                holder = node.args[1]  # the engine's payload (a lifted buffer or constant): part of the delegate
                held = [holder] if isinstance(holder, torch.fx.Node) and holder.op == "placeholder" else []
                for tagged in [node, *node.users, *held]:
                    tagged.meta["delegation_tag"] = tag
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)


def get_edge_compile_config():
    return EdgeCompileConfig(_check_ir_validity=False)


def export(exported_program, *, partitioners=None, compile_config=None, **ignored):
    return to_edge_transform_and_lower(
        exported_program,
        partitioner=[TensorRTPartitioner(), *(partitioners or [])],
        compile_config=compile_config or get_edge_compile_config(),
    )
"""

# The engine info layout of Torch-TensorRT's runtime (2.14: dynamo/runtime/_serialized_engine_layout.py and
# _TorchTensorRTModule.py) and its text fields: binding names joined by "%", aliased I/O as
# "output@input@kind" records joined by "%".
_STAND_IN_ENGINE_LAYOUT = """
ABI_TARGET_IDX, NAME_IDX, DEVICE_IDX, ENGINE_IDX, INPUT_BINDING_NAMES_IDX, OUTPUT_BINDING_NAMES_IDX = range(6)
ALIASED_IO_IDX = 12
SERIALIZATION_LEN = 13


def deserialize_binding_names(text):
    return text.split("%") if text else []


def serialize_aliased_io(aliased_io):
    return "%".join(f"{out}@{inp}@{kind}" for out, (inp, kind) in aliased_io.items())


def deserialize_aliased_io(text):
    records = [record.split("@") for record in text.split("%")] if text else []
    return {fields[0]: (fields[1], fields[2]) for fields in records if len(fields) == 3}
"""

# What 2.14's save reads an engine's info with (torch_tensorrt.executorch.backend): here the engine is a
# uint8 tensor holding the info as JSON, found as Torch-TensorRT finds its engine: the argument's
# get_attr, or the placeholder a program lifted it to (a buffer or a constant).
_STAND_IN_ENGINE_INFO_READER = """
import json


def _get_engine_info_for_node(program, node, *, metadata_only=False):
    holder = node.args[1]
    if holder.op == "get_attr":
        engine = getattr(program.graph_module, holder.target)
    else:
        spec = next(spec for spec in program.graph_signature.input_specs if spec.arg.name == holder.name)
        engine = program.state_dict.get(spec.target)
        engine = program.constants[spec.target] if engine is None else engine
    return json.loads(bytes(engine.tolist()).decode())
"""

_STAND_IN_NO_OP = """
torch.library.define("tensorrt::no_op_placeholder_for_execute_engine", "(Tensor[] inputs) -> Tensor[]")
"""

# Cross-compiling's placeholder op in the layout the releases give it (2.13+: the engine slot typed Tensor,
# though the exporter puts its base64 text there, and the Windows loader reads text): inputs, then one
# argument per field of an engine's packed info (_STAND_IN_ENGINE_LAYOUT.SERIALIZATION_LEN), the engine at ENGINE_IDX.
_STAND_IN_CROSS_COMPILE_OP = """
torch.library.define(
    "tensorrt::no_op_placeholder_for_execute_engine",
    "(Tensor[] inputs, str abi_version, str name, str serialized_device_info, Tensor serialized_engine, "
    + ", ".join(f"str field_{index}" for index in range(4, 13))
    + ") -> Tensor[]",
)
"""


def package_tree(
    root: Path,
    version: str,
    exporter_source: str | None = None,
    *,
    with_save: bool = False,
    stand_in_engine_op: bool = False,
    executorch: bool = False,
    cross_compile: bool = False,
    kv_cache: bool = False,
) -> Path:
    """A ``torch_tensorrt`` package around the release's real exporter (and its real ``save`` and ``load``).

    ``executorch``: with stand-ins for Torch-TensorRT's ExecuTorch partitioner
    (``executorch`` itself must be importable where the shell is used).
    ``cross_compile``: with cross-compiling's placeholder op.
    ``kv_cache``: with the reader of an engine's info that 2.14's save uses to declare aliased
    (KV-cache) mutations; engines' info is JSON in their uint8 payload.
    """
    package = root / "torch_tensorrt"
    (package / "dynamo" / "runtime").mkdir(parents=True)
    (package / "dynamo" / "partitioning").mkdir()
    # 2.14's save looks the engine op up on every call (the real package registers it at import).
    needs_op = stand_in_engine_op or executorch or cross_compile or kv_cache or minor(version) >= (2, 14)
    init = f"__version__ = {version!r}\n" + (_STAND_IN_ENGINE_OP if needs_op else "")
    init += _STAND_IN_NO_OP if executorch else _STAND_IN_CROSS_COMPILE_OP if cross_compile else ""
    if with_save:
        init += "from torch_tensorrt._compile import *  # noqa: F403\n"
        # (the release's own `load` too: the plugin wraps it to refuse another rank's file)
        compile_source = extract(release_file(version, "_compile.py"), ["save", "load"])
        if executorch:  # what the stand-ins stand for: the runtime and the ExecuTorch extra
            compile_source += "\nENABLED_FEATURES.torch_tensorrt_runtime = True\n"
            (package / "executorch").mkdir()
            (package / "executorch" / "__init__.py").write_text(_EXECUTORCH_STAND_INS)
            # 2.14's save checks this option before anything else (None: no budget).
            (package / "executorch" / "partitioner.py").write_text(
                "def normalize_weight_streaming_budget_per_engine(budget):\n    return budget\n"
            )
            (package / "dynamo" / "runtime" / "meta_ops").mkdir()
            (package / "dynamo" / "runtime" / "meta_ops" / "__init__.py").write_text("")
            (package / "dynamo" / "runtime" / "meta_ops" / "register_meta_ops.py").write_text("")
        (package / "_compile.py").write_text(compile_source + '\n__all__ = ["save", "load"]\n')
    (package / "__init__.py").write_text(init)
    (package / "_features.py").write_text(
        "from types import SimpleNamespace\n"
        "ENABLED_FEATURES = SimpleNamespace(torch_tensorrt_runtime=False, fx_frontend=False,\n"
        "    torchscript_frontend=False, dynamo_frontend=True, windows_cross_compile=False)\n"
    )
    # The release's own `from ..._exporter import ...` bindings of the modules that have them (the public
    # `torch_tensorrt.dynamo.export`, refit's `inline_torch_modules`); their other imports need TensorRT.
    (package / "dynamo" / "__init__.py").write_text("")
    if with_save:
        dynamo_init = exporter_imports(release_file(version, "dynamo/__init__.py"))
        (package / "dynamo" / "__init__.py").write_text(dynamo_init)
        (package / "dynamo" / "_refit.py").write_text(exporter_imports(release_file(version, "dynamo/_refit.py")))
        (package / "dynamo" / "_compiler.py").write_text(exporter_imports(release_file(version, "dynamo/_compiler.py")))
    partitioning = ""
    if minor(version) <= (2, 5):
        partitioning = extract(release_file(version, "dynamo/partitioning/common.py"), ["run_shape_analysis"])
    (package / "dynamo" / "partitioning" / "__init__.py").write_text(partitioning)
    (package / "dynamo" / "runtime" / "__init__.py").write_text("")
    runtime = package / "dynamo" / "runtime"
    # What the 2.13+ save imports to convert TensorRT engine constants, and what 2.14's imports to declare
    # aliased KV-cache mutations: the engine info layout and its text fields (as the release's runtime
    # writes them). It reads engines only through torch_tensorrt.executorch.backend, which only the
    # kv_cache shell has: elsewhere no engine is read.
    (runtime / "_TorchTensorRTModule.py").write_text(_STAND_IN_ENGINE_LAYOUT)
    (runtime / "_serialized_engine_layout.py").write_text(_STAND_IN_ENGINE_LAYOUT)
    if kv_cache:
        (package / "executorch").mkdir(exist_ok=True)
        if not (package / "executorch" / "__init__.py").exists():
            (package / "executorch" / "__init__.py").write_text("")
        (package / "executorch" / "backend.py").write_text(_STAND_IN_ENGINE_INFO_READER)
    # The engine the Windows loader (replace_execute_engine_no_op_node) builds from packed info: kept as given.
    (runtime / "_TRTEngine.py").write_text(
        "class EngineSerializer:\n    pass\n\n\nclass TRTEngine:\n    def __init__(self, info=None):\n"
        "        self.info = info\n"
    )
    source = exporter_source if exporter_source is not None else release_file(version, "dynamo/_exporter.py")
    (package / "dynamo" / "_exporter.py").write_text(source)
    return root
