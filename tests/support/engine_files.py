"""Files with TensorRT engines made as each release writes them (engine info fields per runtime ABI, the pickled
metadata, a stand-in engine op), and the command line as ``inspect`` and ``check`` tests run it."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import zipfile
from pathlib import Path

import torch

from support.commands import cli
from support.hostile import read_entries, write_entries
from support.processes import new_interpreter, run_forked
from trt_inline.engine_fields import FIELDS_BY_ABI

_PLAN = b"plan bytes " * 40


class _Tiny(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu() + 1


def _metadata() -> str:
    """base64 of the pickle Torch-TensorRT writes: a dict holding its settings object (a class torch_tensorrt
    defines: reading it as data must import nothing)."""
    settings_state = {"immutable_weights": False, "strip_engine_weights": True, "enable_weight_streaming": False,
                      "enabled_precisions": {torch.float16}}  # fmt: skip
    # The settings object: GLOBAL, EMPTY_TUPLE, NEWOBJ, its dict, BUILD (what copyreg.__newobj__ writes).
    settings = b"ctorch_tensorrt.dynamo._settings\nCompilationSettings\n)\x81" + pickle.dumps(settings_state, 2)[2:-1]
    document = b"\x80\x02}(X\x08\x00\x00\x00settings" + settings + b"bX\x0f\x00\x00\x00weight_name_map}u."
    return base64.b64encode(document).decode()


def _base_file(tmp_path: Path) -> Path:
    path = tmp_path / "base.pt2"
    torch.export.save(torch.export.export(_Tiny(), (torch.randn(2, 3),)), path)
    return path


def _torch_save_zip(data_pkl: bytes) -> bytes:
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    return buffer.getvalue()


_STAND_IN_OP = """
import torch
torch.library.define("tensorrt::no_op_placeholder_for_execute_engine", "(Tensor[] inputs, " + ", ".join(
    f"str field_{index}" for index in range(int(__import__("sys").argv[2]))) + ") -> Tensor[]")
torch.library.impl("tensorrt::no_op_placeholder_for_execute_engine", "CompositeExplicitAutograd")(
    lambda inputs, *fields: [inputs[0] + 1])
torch.library.register_fake("tensorrt::no_op_placeholder_for_execute_engine")(
    lambda inputs, *fields: [torch.empty_like(inputs[0])])
"""


def fields_for(
    abi: str,
    *,
    cc: str = "8.9",
    name: str = "L4",
    hardware_compatible: bool = False,
    platform: str = "linux_x86_64",
    output_allocator: bool = False,
    engine: str = "_run_on_acc_0_engine",
) -> list[str]:
    """An engine info list as a release of runtime ABI ``abi`` writes it."""
    major, minor = cc.split(".")
    values = {
        "abi": abi, "name": engine, "device": f"0%{major}%{minor}%0%NVIDIA {name}",
        "engine": base64.b64encode(_PLAN).decode(), "inputs": "x%y", "outputs": "output0",
        "hardware_compatible": "1" if hardware_compatible else "0", "metadata": _metadata(),
        "platform": platform, "output_allocator": "1" if output_allocator else "0",
        "resource_allocation": "0", "multi_device": "0", "aliased_io": "",
    }  # fmt: skip
    return [values[field] for field in FIELDS_BY_ABI[abi]]


def python_engine_pickle(fields: list[str]) -> bytes:
    """Torch-TensorRT 2.13+'s Python engine: ``_reconstruct_trt_engine`` called with its fields (``__reduce__``)."""
    head = b"\x80\x02ctorch_tensorrt.dynamo.runtime._TRTEngine\n_reconstruct_trt_engine\n"
    return head + pickle.dumps(fields, 2)[2:-1] + b"\x85R."


def with_engine(
    tmp_path: Path, payload: bytes, name: str = "planted.pt2", key: str = "custom_obj_0", base: Path | None = None
) -> Path:
    """``base`` (default: a small program of this torch) with an engine object among its constants, where the
    layout of this torch keeps them."""
    entries = read_entries(base if base is not None else _base_file(tmp_path))
    config = next((n for n in entries if n.endswith("_constants_config.json")), None)
    if config is not None:  # torch 2.9+: one payload per constant, named in the config
        document = json.loads(entries[config])
        document.setdefault("config", {})["_run_on_acc_0_engine"] = {
            "path_name": key, "is_param": False, "use_pickle": True, "tensor_meta": None,
        }  # fmt: skip
        entries[config] = json.dumps(document).encode()
        entries[f"{config.rpartition('/')[0]}/{key}"] = payload
    else:  # torch 2.5 ... 2.8: every constant in one torch.save blob, an engine beside the tensors
        blob = next(n for n in entries if n.endswith(("data/constants/model.pt", "serialized_constants.pt")))
        entries[blob] = _torch_save_zip(b"\x80\x02}X\x14\x00\x00\x00_run_on_acc_0_engine" + payload[2:-1] + b"s.")
    return write_entries(tmp_path / name, entries)


def cross_compiled(tmp_path: Path, fields: list[str], name: str = "cross.pt2") -> Path:
    """A cross-compiled program (what ``cross_compile_module=True`` saves): its engine's info as the text
    arguments of Torch-TensorRT's placeholder op, exported in a process of its own (forked from a clean interpreter:
    conftest.run_forked) that defines the op as the release does."""
    path = tmp_path / name
    script = (
        _STAND_IN_OP
        + f"""
import json
fields = json.loads({json.dumps(json.dumps(fields))})
class M(torch.nn.Module):
    def forward(self, x):
        return torch.ops.tensorrt.no_op_placeholder_for_execute_engine([x], *fields)[0].relu()
torch.export.save(torch.export.export(M(), (torch.randn(2, 3),)), __import__("sys").argv[1])
"""
    )
    proc = run_forked(script, [str(path), str(len(fields))], tmp_path, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return path


def command(*args: str) -> subprocess.CompletedProcess[str]:
    """The command line; ``check`` (which reads the file as data, in the calling process) in this process, every
    other command (which starts a child or asks torch about CUDA) in a new interpreter, as a user runs it."""
    if args[:1] == ("check",):
        return cli(*args)
    return new_interpreter("-m", "trt_inline", *args, timeout=300)
