"""Crafted engine infos against reading them as data and against the ``check`` verdicts.

Each test is a way a file could get a wrong verdict, hide an engine, cost far more than its size, or stop a
trusted file from loading; the runtime behaviour quoted is Torch-TensorRT 2.13's C++ runtime
(``core/runtime/TRTEngine.cpp``, ``RTDevice.cpp``, ``Platform.cpp``, ``runtime.cpp``) and its Python runtime
(``dynamo/runtime/_TRTEngine.py``, ``_serialized_engine_layout.py``).
"""

from __future__ import annotations

import base64
import collections
import pickle
import subprocess
from pathlib import Path

import pytest
from support.engine_files import fields_for, python_engine_pickle, with_engine
from support.processes import new_interpreter

import trt_inline
from trt_inline.archive.engine_info import _info, metadata_summary, read_engine_infos
from trt_inline.deployment import Gpu, Machine, engine_problems
from trt_inline.engine_fields import FIELDS_BY_ABI
from trt_inline.errors import VerifyInputError

_LAYOUT = FIELDS_BY_ABI["9"]


def _fields(cc: str = "8.9", name: str = "_run_on_acc_0_engine", **changes: str) -> list[str]:
    fields = fields_for("9", cc=cc, engine=name)
    fields[_LAYOUT.index("resource_allocation")] = "0"  # (what 2.13 writes: str(int(...)); the runtime stoi's it)
    for key, value in changes.items():
        fields[_LAYOUT.index(key)] = value
    return fields


def _target(*gpus: Gpu) -> Machine:
    return Machine("the target", "linux_x86_64", gpus or (Gpu(8, 9, "GPU"),), "2.13.0", "9")


# (engine info changes, the target's GPU): each an engine the 2.13 runtime refuses, checked "runnable" here.
REFUSED_BY_THE_RUNTIME = {
    # std::stoi("00") / int("00") == 0: not hardware-compatible, and built on 8.6 it finds no 8.9 GPU
    "hardware_compatible 00": (dict(cc="8.6", hardware_compatible="00"), Gpu(8, 9)),
    "hardware_compatible +0": (dict(cc="8.6", hardware_compatible="+0"), Gpu(8, 9)),
    # std::stoi throws on text without digits
    "hardware_compatible true": (dict(hardware_compatible="true"), Gpu(8, 9)),
    "hardware_compatible empty": (dict(hardware_compatible=""), Gpu(8, 9)),
    # std::stoi throws std::out_of_range past 32 bits, however many digits (Python's int() refuses 4300 and more)
    "hardware_compatible 2**31": (dict(cc="8.6", hardware_compatible="2147483648"), Gpu(8, 9)),
    "hardware_compatible 5000 digits": (dict(cc="8.6", hardware_compatible="1" * 5000), Gpu(8, 9)),
    "output_allocator x": (dict(output_allocator="x"), Gpu(8, 9)),
    # RTDevice(string) and parse_device_info: exactly 5 '%'-separated tokens
    "device name with %": (dict(device="0%8%9%0%NVIDIA%L4"), Gpu(8, 9)),
    # std::stoi does not read Arabic-Indic digits (Python's \\d and int() do)
    "non-ASCII digits": (dict(device="0%\u0668%\u0669%0%NVIDIA L4"), Gpu(8, 9)),
    # find_compatible_devices: a device type neither kGPU nor kDLA throws
    "device type 7": (dict(device="0%8%6%7%X"), Gpu(8, 9)),
    # Platform("unknown") is kUNKNOWN, and is_supported_on_current_platform compares it with linux_x86_64
    "platform unknown": (dict(platform="unknown"), Gpu(8, 9)),
    "platform empty": (dict(platform=""), Gpu(8, 9)),
}


@pytest.mark.parametrize("case", sorted(REFUSED_BY_THE_RUNTIME))
def test_an_engine_the_runtime_refuses_is_not_called_runnable(case: str) -> None:
    changes, gpu = REFUSED_BY_THE_RUNTIME[case]
    info = _info("engine 0 (_run_on_acc_0_engine)", _fields(**changes))
    assert engine_problems(info, _target(gpu)), f"{case}: checked runnable, the runtime refuses it"


def test_several_gpus_of_the_capability_but_another_name() -> None:
    """runtime.cpp get_most_compatible_device: with two or more GPUs of the engine's capability, one of the
    engine's device name is needed unless it is hardware-compatible (else "No compatible device was found")."""
    info = _info("engine 0 (x)", _fields(cc="8.0", device="0%8%0%0%NVIDIA A100-SXM4-40GB"))
    two = _target(Gpu(8, 0, "NVIDIA A100-SXM4-80GB"), Gpu(8, 0, "NVIDIA A100-SXM4-80GB"))
    assert engine_problems(info, two), "two A100-80GB: the runtime finds no device for an A100-40GB engine"


def _engine_body(fields: list[str]) -> bytes:
    return python_engine_pickle(fields)[2:-1]


_GOOD, _BAD = _engine_body(_fields("8.9")), _engine_body(_fields("7.5", name="other"))
HIDDEN = {
    "second in a list": b"\x80\x02(" + _GOOD + _BAD + b"l.",
    "in a frozenset": b"\x80\x02(" + _BAD + b"\x91.",
    "a dict key": b"\x80\x02}" + _BAD + b"K\x01s.",
    "nested nine tuples deep": b"\x80\x02" + _BAD + b"\x85" * 9 + b".",
}


@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_no_engine_of_a_payload_escapes_the_check(tmp_path: Path, case: str) -> None:
    """pickle.loads (torch's loader of an opaque object) builds every engine of the payload; each is checked."""
    path = with_engine(tmp_path, HIDDEN[case], key="opaque_obj_0")
    try:
        _, infos = read_engine_infos(path)
    except VerifyInputError:
        return  # (refused: fine)
    problems = [p for info in infos for p in engine_problems(info, _target(Gpu(8, 9)))]
    assert problems, f"{case}: an engine built on 7.5 is hidden, the file is called runnable on 8.9"


def test_a_cross_compiled_name_does_not_hide_an_engine_object(tmp_path: Path) -> None:
    from support.engine_files import cross_compiled

    crossed = cross_compiled(tmp_path, _fields("8.9"))  # (its name field: _run_on_acc_0_engine)
    planted = python_engine_pickle(_fields("7.5", name="real"))
    both = with_engine(tmp_path, planted, name="both.pt2", key="opaque_obj_0", base=crossed)
    _, infos = read_engine_infos(both)
    assert any(info.fields.get("device", "").startswith("0%7%5") for info in infos), [i.where for i in infos]


def test_a_bytes_plan_is_still_an_engine(tmp_path: Path) -> None:
    """_reconstruct_trt_engine takes ENGINE_IDX as bytes too (raw b'ftrt...' or base64 bytes)."""
    fields: list = _fields("7.5")
    fields[_LAYOUT.index("engine")] = b"ftrt" + bytes(64)
    head = b"\x80\x02ctorch_tensorrt.dynamo.runtime._TRTEngine\n_reconstruct_trt_engine\n"
    path = with_engine(tmp_path, head + pickle.dumps(fields, 2)[2:-1] + b"\x85R.", key="opaque_obj_0")
    try:
        _, infos = read_engine_infos(path)
    except VerifyInputError:
        return
    assert [p for info in infos for p in engine_problems(info, _target(Gpu(8, 9)))], "an engine, said to be none"


def _dag(width: int, levels: int) -> bytes:
    """A list whose members are one list ``width`` times, ``levels`` deep: a few hundred bytes, width**levels
    paths."""
    out = b"]q\x00X\x01\x00\x00\x00xa0"
    for level in range(1, levels + 1):
        out += b"(" + (b"h" + bytes([level - 1])) * width + b"l" + b"q" + bytes([level]) + b"0"
    return out + b"h" + bytes([levels])


def _answer(code: str, seconds: float) -> str:
    """What ``code``, run in a new interpreter, prints last: it must end within ``seconds``, with exit status 0
    and no traceback (a refusal is printed by the code, as a result)."""
    try:
        proc = new_interpreter("-c", code, timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still working after {seconds} s")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def test_a_shared_list_is_walked_once(tmp_path: Path) -> None:
    """An engine payload of 850 bytes whose argument is a list of a list ... (40 references each): the walk for
    engines in it took 40**7 steps (days here; an hour of CPU for ``check`` and ``inspect`` by their default
    timeout, unbounded in ``trt_inline.load`` and the patched ``torch_tensorrt.load``)."""
    head = b"\x80\x02ctorch_tensorrt.dynamo.runtime._TRTEngine\n_reconstruct_trt_engine\n"
    path = with_engine(tmp_path, head + _dag(40, 9) + b"\x85R.", key="opaque_obj_0")
    code = (
        "from trt_inline.archive.engine_info import read_engine_infos\n"
        f"_, infos = read_engine_infos({str(path)!r})\n"
        "print([info.problems for info in infos])"
    )
    # One engine, said not to read as data (not checked): an answer, in seconds.
    assert _answer(code, 30) == "[['an engine whose info does not read as data: not checked']]"


def test_a_metadata_key_is_not_printed_whole() -> None:
    """metadata_summary shows each key as printable(str(key)): a key that is an object over a shared list is a
    repr of width**levels items (memory exhausted), and an integer of 5000 digits raises ValueError."""
    dag_key = b"\x80\x02}cx\ny\n" + _dag(8, 30) + b"\x85RK\x01s."
    big_key = b"\x80\x02}" + pickle.dumps((1 << (8 * 2000)) - 1, 2)[2:-1] + b"K\x01s."
    for data in (dag_key, big_key):
        text = base64.b64encode(data).decode()
        answer = _answer(
            "import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
            "from trt_inline.archive.engine_info import metadata_summary\n"
            "from trt_inline.errors import VerifyInputError\n"
            "try:\n"
            f"    print(metadata_summary({text!r})[1])\n"
            "except VerifyInputError as exc:\n"
            "    print('refused:', exc)",
            30,
        )
        # A summary of the bytes (the key left out), or a refusal: within 4 GiB and in seconds, never a crash.
        assert answer.endswith("bytes, read as data") or answer.startswith("refused: "), answer
    with pytest.raises(VerifyInputError):  # (or a summary: but never a ValueError out of the reader)
        try:
            metadata_summary(base64.b64encode(big_key).decode())
        except ValueError as exc:
            if isinstance(exc, VerifyInputError):
                raise
            pytest.fail(f"a bare ValueError: {exc}")
        raise VerifyInputError("summarized")


def test_a_plan_and_metadata_over_2000_characters_are_read_whole(tmp_path: Path) -> None:
    """Strings in the objects-mode pickle are cut at MAX_TEXT (2000) as they are decoded: a 64 KiB plan was
    shown as 1.5 KiB, and any metadata of more than 1500 bytes (Torch-TensorRT's settings) as opaque."""
    plan = bytes(range(256)) * 256
    metadata = pickle.dumps({"settings": None, "weight_name_map": {f"w{i}": "x" * 20 for i in range(200)}}, 2)
    fields = _fields(engine=base64.b64encode(plan).decode(), metadata=base64.b64encode(metadata).decode())
    _, infos = read_engine_infos(with_engine(tmp_path, python_engine_pickle(fields)))
    assert infos[0].engine_bytes == len(plan)
    assert "read as data" in infos[0].metadata_note, infos[0].metadata_note


def test_a_trusted_file_with_an_ordered_dict_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An opaque object pickled with an OrderedDict of items (torch.export.load loads it): the engine check
    must not refuse it, and TRT_INLINE_CHECK_ENGINES=0 must not even read it."""
    path = with_engine(tmp_path, pickle.dumps(collections.OrderedDict(a=1), 2), key="opaque_obj_0")
    monkeypatch.setenv("TRT_INLINE_CHECK_ENGINES", "0")
    assert trt_inline.load(path).constants["_run_on_acc_0_engine"] == {"a": 1}
    monkeypatch.delenv("TRT_INLINE_CHECK_ENGINES")
    assert trt_inline.load(path).constants["_run_on_acc_0_engine"] == {"a": 1}


def test_an_engine_info_number_of_thousands_of_digits_is_the_runtimes_refusal_everywhere(tmp_path: Path) -> None:
    """A numeric field of 5,000 digits (past Python's integer-string limit): ``check`` exit 1 in one line naming the
    field, as the runtime refuses it; ``trt_inline.load`` its documented LoadError, never a bare ValueError."""
    from support.engine_files import command

    path = with_engine(tmp_path, python_engine_pickle(_fields(output_allocator="7" * 5000)))
    proc = command("check", str(path), "--target", "cc=8.9,platform=linux_x86_64,torch_tensorrt=2.13.0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "output_allocator" in line]
    assert lines and all(len(line) < 400 for line in lines), proc.stdout
    with pytest.raises(trt_inline.LoadError) as raised:
        trt_inline.load(path)
    assert "\n" not in str(raised.value) and "output_allocator" in str(raised.value), str(raised.value)
