"""Will it run there: each TensorRT engine's info read from the file as data, checked before anything native runs.

Engines are made as the releases write them: the field layout of each runtime ABI (the 2.13 and 2.14 layouts
compared with those releases' own ``_serialized_engine_layout.py``), in the three forms a file holds them (a
TorchBind engine's pickle, a Python engine's pickle, a cross-compiled call's arguments). Every refusal is
checked to happen before deserialization: the function that would hand an engine to torch fails the test
if it is called.
"""

from __future__ import annotations

import ast
import json
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.engine_files import (
    _PLAN,
    _base_file,
    command,
    cross_compiled,
    fields_for,
    python_engine_pickle,
    with_engine,
)
from support.pairs import Unavailable, release_file

import trt_inline
from trt_inline import deployment
from trt_inline.archive import canonical
from trt_inline.archive.engine_info import read_engine_infos
from trt_inline.deployment import Gpu, Machine, described_machine, engine_problems
from trt_inline.engine_fields import FIELDS_BY_ABI
from trt_inline.errors import VerifyInputError

_UPSTREAM = {
    "ABI_TARGET_IDX": "abi", "NAME_IDX": "name", "DEVICE_IDX": "device", "ENGINE_IDX": "engine",
    "INPUT_BINDING_NAMES_IDX": "inputs", "OUTPUT_BINDING_NAMES_IDX": "outputs",
    "HW_COMPATIBLE_IDX": "hardware_compatible", "SERIALIZED_METADATA_IDX": "metadata",
    "TARGET_PLATFORM_IDX": "platform", "REQUIRES_OUTPUT_ALLOCATOR_IDX": "output_allocator",
    "RESOURCE_ALLOCATION_STRATEGY_IDX": "resource_allocation", "REQUIRES_NATIVE_MULTIDEVICE_IDX": "multi_device",
    "ALIASED_IO_IDX": "aliased_io",
}  # fmt: skip


@pytest.mark.parametrize("version", ["2.13.0", "2.14.0"])
def test_layout_is_the_release_runtime_layout(version: str) -> None:
    """The releases that write their layout in Python: its ABI and its fields, in order, are ours."""
    try:
        source = release_file(version, "dynamo/runtime/_serialized_engine_layout.py")
    except Unavailable as exc:
        pytest.fail(f"the release's wheel is needed: {exc}")
    tree = ast.parse(source)
    abi = next(
        n.value.value for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "ABI_VERSION"
        and isinstance(n.value, ast.Constant)
    )  # fmt: skip
    enum = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SerializedInfoIndex")
    members = [(s.targets[0].id, s.value.value) for s in enum.body if isinstance(s, ast.Assign)]  # type: ignore[attr-defined]
    assert [index for _, index in members] == list(range(len(members)))
    record = trt_inline.releases.for_version(version)
    assert record is not None and record.runtime_abi == abi
    assert FIELDS_BY_ABI[abi] == tuple(_UPSTREAM[name] for name, _ in members)


class _Settings:
    """Stands for Torch-TensorRT's CompilationSettings in an engine's metadata (pickled as upstream pickles it)."""


_Settings.__module__, _Settings.__qualname__ = "torch_tensorrt.dynamo._settings", "CompilationSettings"


def torchbind_pickle(fields: list[str]) -> bytes:
    """A TorchBind engine as TorchScript's pickler writes it: the class, an empty tuple, NEWOBJ, its state, BUILD."""
    return b"\x80\x02c__torch__.torch.classes.tensorrt\nEngine\n)\x81" + pickle.dumps(fields, 2)[2:-1] + b"b."


@pytest.fixture
def no_deserializing(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What would hand a passed-through payload (an engine) to torch fails the test when it is asked to."""
    asked: list[str] = []

    def refuse(value: Any) -> None:
        if type(value).__name__ == "_Passthrough":
            asked.append(value.path_name)
            raise AssertionError(f"an engine was about to be deserialized: {value.path_name}")

    monkeypatch.setattr(canonical, "passthrough_loader", refuse)
    load = canonical.Canonical.load

    def refuse_blobs(self: canonical.Canonical, *args: Any, **kwargs: Any) -> Any:
        if self.blobs:  # (torch 2.5 ... 2.8: an engine inside the constants blob torch would unpickle)
            asked.extend(self.blobs)
            raise AssertionError(f"an engine was about to be deserialized: {sorted(self.blobs)}")
        return load(self, *args, **kwargs)

    monkeypatch.setattr(canonical.Canonical, "load", refuse_blobs)
    yield asked


def _machine(cc: str = "8.9", abi: str | None = "9", release: str | None = "2.13.0") -> Machine:
    major, minor = (int(p) for p in cc.split("."))
    return Machine("this machine", "linux_x86_64", (Gpu(major, minor, "GPU"),), release, abi)


@pytest.mark.parametrize("abi", sorted(FIELDS_BY_ABI))
@pytest.mark.parametrize("form", ["torchbind", "python engine", "cross-compiled"])
def test_engine_info_is_read_as_data_in_every_form(tmp_path: Path, abi: str, form: str) -> None:
    fields = fields_for(abi, hardware_compatible=True)
    if form == "cross-compiled":
        path = cross_compiled(tmp_path, fields)
    else:
        path = with_engine(tmp_path, (torchbind_pickle if form == "torchbind" else python_engine_pickle)(fields))
    before = set(sys.modules)
    _, infos = read_engine_infos(path)
    assert not {m for m in set(sys.modules) - before if m.startswith("torch_tensorrt")}  # (nothing imported)
    assert len(infos) == 1, infos
    info = infos[0].to_dict()
    assert info["runtime_abi"] == abi and info["name"] == "_run_on_acc_0_engine"
    assert info["device"] == {"id": 0, "major": 8, "minor": 9, "device_type": 0, "name": "NVIDIA L4"}
    assert info["hardware_compatible"] is True and info["target_platform"] == "linux_x86_64"
    assert info["inputs"] == ["x", "y"] and info["outputs"] == ["output0"] and info["engine_bytes"] == len(_PLAN)
    assert info["requires_output_allocator"] is (False if abi != "6" else None)
    assert info["metadata"]["settings"] == {
        "immutable_weights": False, "strip_engine_weights": True, "enable_weight_streaming": False,
    }  # fmt: skip
    assert info["problems"] == [] and infos[0].where.startswith(("engine 0", "engine object"))


# (what the engine is, what the machine is, the line that says why it would not run)
MISMATCHES = {
    "platform": (dict(platform="windows_x86_64"), {}, "built for windows_x86_64, this machine is linux_x86_64"),
    "abi": (dict(), dict(abi="6", release="2.6.1"), "saved for Torch-TensorRT 2.12.1 ... 2.13.0 (runtime ABI 9)"),
    "compute capability": (dict(), dict(cc="9.0"), "built on compute capability 8.9 (NVIDIA L4), and an engine runs"),
    "hardware-compatible on an older GPU": (
        dict(hardware_compatible=True), dict(cc="7.5"), "which runs on compute capability 8.0 (Ampere) and newer"),
    "output allocator": (
        dict(output_allocator=True, abi="7"), dict(abi="6", release="2.6.1"), "needs the output allocator"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_each_mismatch_is_refused_before_deserialization(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch, no_deserializing: list[str]
) -> None:
    engine, machine, expected = MISMATCHES[case]
    engine = dict(engine)  # (the table is shared by the tests)
    abi = engine.pop("abi", "9")
    path = with_engine(tmp_path, python_engine_pickle(fields_for(abi, **engine)))
    _, infos = read_engine_infos(path)
    assert len(infos) == 1  # (the engine is there to be checked)
    described = _machine(**machine)
    assert any(expected in line for line in engine_problems(infos[0], described)), engine_problems(infos[0], described)
    monkeypatch.setattr(deployment, "this_machine", lambda: described)
    for opening in (lambda: trt_inline.load(path), lambda: trt_inline.verify(path, allow_native_code=True,
                                                                              isolate=False)):  # fmt: skip
        with pytest.raises(VerifyInputError) as refused:
            opening()
        assert expected in str(refused.value) and "nothing was deserialized" in str(refused.value), refused.value
        assert str(path) in str(refused.value)
    assert no_deserializing == []
    # The same file on a machine that has what it needs goes on to deserialize it (the check was the gate).
    fits = Machine("this machine", engine.get("platform", "linux_x86_64"), (Gpu(8, 9, "L4"),), None, abi)
    assert engine_problems(infos[0], fits) == []
    monkeypatch.setattr(deployment, "this_machine", lambda: fits)
    with pytest.raises((AssertionError, VerifyInputError), match="about to be deserialized"):
        trt_inline.load(path)
    assert no_deserializing, "the engine was not handed on once its needs were met"
    # The override: checked no more.
    monkeypatch.setattr(deployment, "this_machine", lambda: described)
    monkeypatch.setenv(deployment.CHECK_ENGINES_ENV, "0")
    with pytest.raises((AssertionError, VerifyInputError), match="about to be deserialized"):
        trt_inline.load(path)


def test_patched_torch_tensorrt_load_checks_before_the_stock_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trt_inline.plugin.load import load_checking_ranks

    path = with_engine(tmp_path, torchbind_pickle(fields_for("9")))
    called: list[str] = []
    load = load_checking_ranks(lambda file_path, *a, **k: called.append(file_path))
    monkeypatch.setattr(deployment, "this_machine", lambda: _machine(cc="9.0"))
    with pytest.raises(VerifyInputError, match=r"engine 0 \(_run_on_acc_0_engine\)|engine object"):
        load(str(path))
    assert called == []
    monkeypatch.setattr(deployment, "this_machine", lambda: _machine(cc="8.9"))
    load(str(path))
    assert called == [str(path)]
    script = tmp_path / "model.ts"  # (a TorchScript file: not read here, the stock load takes it)
    script.write_bytes(b"not a zip")
    load(str(script))
    assert called[-1] == str(script)


def test_check_target_names_each_engine_that_would_not_run(tmp_path: Path) -> None:
    path = cross_compiled(tmp_path, fields_for("9"))
    fits = command("check", str(path), "--target", "cc=8.9,platform=linux_x86_64,torch_tensorrt=2.13.0")
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert "its engine can run on the target" in fits.stdout and "not checked" not in fits.stdout
    cases = {
        "cc=9.0,platform=linux_x86_64,torch_tensorrt=2.13.0": "built on compute capability 8.9 (NVIDIA L4)",
        "cc=8.9,platform=windows_x86_64,abi=9": "built for linux_x86_64",
        "cc=8.9,platform=linux_x86_64,torch_tensorrt=2.11.0": "saved for Torch-TensorRT 2.12.1 ... 2.13.0",
    }
    for target, line in cases.items():
        proc = command("check", str(path), "--target", target)
        assert proc.returncode == 1 and line in proc.stdout, (target, proc.stdout, proc.stderr)
        assert proc.stdout.count("\n") == 2  # (one line for the engine, one verdict)
    partial = command("check", str(path), "--target", "cc=8.9")
    assert partial.returncode == 0 and "not checked: platform, Torch-TensorRT runtime ABI" in partial.stdout
    for bad in ("cc=8", "gpu=8.9", "platform=solaris", "torch_tensorrt=1.0", str(tmp_path / "none.json")):
        proc = command("check", str(path), "--target", bad)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--target" in proc.stderr, (bad, proc.stderr)
    as_json = json.loads(command("check", str(path), "--target", "cc=9.0", "--json").stdout)
    assert as_json["ok"] is False and as_json["engines"][0]["device"]["major"] == 8


@pytest.mark.heavy
def test_doctor_json_describes_this_machine_for_check(tmp_path: Path) -> None:
    proc = command("doctor", "--json")
    document = json.loads(proc.stdout)
    machine = document["machine"]
    assert machine["gpus"] == [] or torch.cuda.is_available()
    target = tmp_path / "here.json"
    target.write_text(proc.stdout)
    assert described_machine(str(target)).to_dict() == machine
    path = cross_compiled(tmp_path, fields_for("9"))
    checked = command("check", str(path), "--target", str(target))
    here = command("check", str(path))
    assert checked.returncode == here.returncode
    assert here.returncode == 1 or torch.cuda.is_available()  # (no GPU, no Torch-TensorRT: it would not run here)
    described = checked.stdout.replace(f"the machine described in {target}", "this machine")
    assert described.splitlines()[:-1] == here.stdout.splitlines()[:-1]


def test_inspect_shows_what_each_engine_needs_without_native_code(tmp_path: Path) -> None:
    path = with_engine(tmp_path, python_engine_pickle(fields_for("7", output_allocator=True)))
    proc = command("inspect", str(path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    row = next(line for line in lines if "_run_on_acc_0_engine" in line and "compute capability" in line)
    for cell in ("7 (2.7.0 ... 2.10.0)", "compute capability 8.9 (NVIDIA L4)", "linux_x86_64", "yes", "440 B"):
        assert cell in row, row
    assert any("inputs x, y; outputs output0" in line and "strip_engine_weights=True" in line for line in lines)
    assert "shown with --allow-native-code" in lines[-1]
    document = json.loads(command("inspect", "--json", str(path)).stdout)
    assert document["engines"][0]["requires_output_allocator"] is True
    assert document["engines"][0]["metadata"]["settings"]["strip_engine_weights"] is True


def test_a_file_without_engines_needs_nothing(tmp_path: Path) -> None:
    proc = command("check", str(_base_file(tmp_path)), "--target", "cc=7.0")
    assert proc.returncode == 0 and "no TensorRT engine" in proc.stdout, proc.stdout


@pytest.mark.heavy
def test_a_cross_compiled_file_says_what_it_needs_before_the_missing_operator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Here nothing registers Torch-TensorRT's placeholder op: the reason the file cannot load is its engine's."""
    path = cross_compiled(tmp_path, fields_for("9"))
    monkeypatch.setattr(deployment, "this_machine", lambda: _machine(cc="9.0"))
    with pytest.raises(VerifyInputError, match=r"engine 0 \(_run_on_acc_0_engine\): built on compute capability 8\.9"):
        trt_inline.load(path)
    proc = command("verify", str(path), "--allow-native-code")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "engine 0 (_run_on_acc_0_engine): needs Torch-TensorRT 2.12.1 ... 2.13.0" in proc.stderr
    assert "nothing was deserialized" in proc.stderr
    monkeypatch.setattr(deployment, "this_machine", lambda: _machine(cc="8.9"))
    with pytest.raises(VerifyInputError, match="not registered in this process"):  # (its needs met: torch's reason)
        trt_inline.load(path)


def test_load_raises_a_load_error(tmp_path: Path) -> None:
    """``trt_inline.load`` of a file that cannot load here: a LoadError (still a VerifyInputError), one line."""
    directory = tmp_path / "out"
    directory.mkdir()
    for path, words in ((tmp_path / "missing.pt2", "no such file"), (directory, "is a directory")):
        with pytest.raises(trt_inline.LoadError, match=words) as raised:
            trt_inline.load(path)
        assert isinstance(raised.value, VerifyInputError) and "\n" not in str(raised.value)


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_check_target_on_each_mismatch(tmp_path: Path, case: str) -> None:
    """``check --target`` describing the machine of each mismatch: exit 1 and the engine's line; the machine the
    engine was built for: exit 0."""
    engine, machine, expected = MISMATCHES[case]
    engine = dict(engine)
    abi = engine.pop("abi", "9")
    path = with_engine(tmp_path, python_engine_pickle(fields_for(abi, **engine)))
    release = machine.get("release", "2.13.0")
    target = f"cc={machine.get('cc', '8.9')},platform=linux_x86_64,torch_tensorrt={release}"
    proc = command("check", str(path), "--target", target)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert expected.split(", this machine")[0] in proc.stdout, proc.stdout
    built_for = f"cc=8.9,platform={engine.get('platform', 'linux_x86_64')},abi={abi}"
    fits = command("check", str(path), "--target", built_for)
    assert fits.returncode == 0 and "can run on the target" in fits.stdout, fits.stdout + fits.stderr
