"""Files crafted against verify itself, built from a good trt_inline file (none is checked in).

Each :class:`Case` edits a good file the way an attacker would and says what
``trt-inline verify`` (or ``inspect``) must answer: exit 2 and one stderr line
containing ``expect``. ``tests/archive/test_hostile.py`` runs every case;
``benchmarks/bench_hostile.py`` prints each one's exit code, stderr line and
peak memory.

The traps: a marker file that code from the file would create, a secret file
that a read would leak into the output, a victim file that a write would change.

The other test files craft their files with the same helpers: reading, editing
and writing archive entries (:func:`rewrite`, :class:`Plant`, :func:`torch_saved`)
and the unusable files (:func:`truncated`, :func:`torchscript_archive`,
:func:`tampered_reference_io`).
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import struct
import warnings
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trt_inline.archive import REFERENCE_IO_FILE
from trt_inline.formats import PACKAGE_INFO_FILE

SECRET = "s3cr3t-token-0f-the-user"
ESCAPE = "\x1b]0;owned\x07\x1b[2J"


@dataclass
class Traps:
    """Files a hostile payload would create, read or change."""

    root: Path
    marker: Path = field(init=False)
    secret: Path = field(init=False)
    victim: Path = field(init=False)

    def __post_init__(self) -> None:
        self.marker = self.root / "marker"
        self.secret = self.root / "secret.txt"
        self.victim = self.root / "victim.txt"
        self.secret.write_text(SECRET)
        self.victim.write_text("untouched")

    def sprung(self) -> list[str]:
        """What the payload managed: empty when nothing happened."""
        found = []
        if self.marker.exists():
            found.append("marker created: code from the file ran")
        if self.victim.read_text() != "untouched":
            found.append("victim changed: the file wrote to disk")
        return found


# ---------------------------------------------------------------------------
# Editing archives
# ---------------------------------------------------------------------------


class Plant:
    """Unpickled, it creates the marker file: the proof that code from the file ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def torch_saved(value: object) -> bytes:
    """``value`` as ``torch.save`` writes it."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def entry_named(names: Iterable[str], *suffixes: str) -> str:
    """The first of ``names`` (an archive's entries) that ends with one of ``suffixes`` (the archive's root folder
    differs between torch releases)."""
    return next(name for name in names if name.endswith(suffixes))


def model_json_entry(entries: dict[str, bytes]) -> str:
    """The serialized program: ``models/model.json`` (torch 2.6+), ``serialized_exported_program.json`` (2.5)."""
    return entry_named(entries, "models/model.json", "serialized_exported_program.json")


def sample_inputs_entry(entries: dict[str, bytes]) -> str:
    """The sample inputs, which torch.export.load unpickles: ``serialized_example_inputs.pt`` on torch 2.5."""
    return entry_named(entries, "/data/sample_inputs/model.pt", "serialized_example_inputs.pt")


def read_entries(source: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(source) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def reference_io_text(source: Path) -> str:
    """The reference I/O a save embedded (``extra/trt_inline_reference_io.b64``): to save again with a program."""
    with zipfile.ZipFile(source) as archive:
        return archive.read(entry_named(archive.namelist(), f"/{REFERENCE_IO_FILE}")).decode()


def write_entries(
    target: Path, entries: list[tuple[str, bytes]] | dict[str, bytes], offsets: dict[str, int] | None = None
) -> Path:
    """A stored zip archive of ``entries``, each entry's data at a multiple of 64 bytes in the file as torch's
    writer lays them out (a local extra field pads the header), or at ``offsets[suffix]`` modulo 64 for an entry
    whose name ends in ``suffix``."""
    items = list(entries.items()) if isinstance(entries, dict) else entries
    with open(target, "wb") as handle, zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED) as archive:
        for name, data in items:
            want = next((r for suffix, r in (offsets or {}).items() if name.endswith(suffix)), 0)
            start = handle.tell() + 30 + len(name.encode())  # where the data starts with no extra field
            pad = (want - (start + 4)) % 64
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.extra = struct.pack("<HH", 0x4246, pad) + b"\0" * pad
            archive.writestr(info, data)
    return target


def edit_program(source: Path, target: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """Rewrite the serialized ExportedProgram (``models/model.json``) with ``edit``."""
    entries = read_entries(source)
    name = model_json_entry(entries)
    document = json.loads(entries[name])
    edit(document)
    entries[name] = json.dumps(document).encode()
    return write_entries(target, entries)


def _engine_nodes(document: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = document["graph_module"]["graph"]["nodes"]
    return [n for n in nodes if n["target"] == "torch.ops.trt_inline.execute_engine.default"]


def edit_engine(source: Path, target: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """Rewrite the first reference engine's program (a JSON string argument of its call) with ``edit``."""

    def edit_document(document: dict[str, Any]) -> None:
        node = _engine_nodes(document)[0]
        argument = next(a for a in node["inputs"] if a["name"] == "program")
        program = json.loads(argument["arg"]["as_string"])
        edit(program)
        argument["arg"]["as_string"] = json.dumps(program)

    return edit_program(source, target, edit_document)


def add_steps(program: dict[str, Any], *steps: tuple[Any, ...]) -> None:
    """Append steps ``(target, args[, kwargs])``; their results are not returned, only computed."""
    for target, args, *kwargs in steps:
        program["steps"].append({"target": target, "args": args, "kwargs": kwargs[0] if kwargs else {}})


def _first_value(program: dict[str, Any]) -> int:
    """Reference number of the step results appended next."""
    return int(program["inputs"]) + len(program["weights"]) + len(program["steps"])


def short_batch(rows: int) -> Callable[[dict[str, Any]], None]:
    """An engine program edit (for :func:`edit_engine`): steps of ``segment_reduce`` through ``rows`` rows of
    lengths over data of 4 rows (past them where ``rows`` is under 4), their results computed, not returned."""

    def edit(program: dict[str, Any]) -> None:
        first = _first_value(program)
        add_steps(
            program,
            ("aten::arange.default", [24], {"dtype": {"dtype": "float32"}}),
            ("aten::view.default", [{"ref": first}, [4, 6]]),
            ("aten::full.default", [[rows, 2], 3], {"dtype": {"dtype": "int64"}}),
            ("aten::segment_reduce.default", [{"ref": first + 1}, "sum"], {"lengths": {"ref": first + 2}, "axis": 1}),
        )

    return edit


def rewrite(source: Path, target: Path, edit: Callable[[dict[str, bytes]], None]) -> Path:
    """Copy an archive entry by entry, letting ``edit`` change the {name: bytes} map (order kept)."""
    entries = read_entries(source)
    edit(entries)
    return write_entries(target, entries)


# ---------------------------------------------------------------------------
# Unusable files the other tests share
# ---------------------------------------------------------------------------


def truncated(source: Path, target: Path, fraction: float) -> Path:
    """The first ``fraction`` of ``source``'s bytes."""
    data = source.read_bytes()
    target.write_bytes(data[: int(len(data) * fraction)])
    return target


def torchscript_archive(target: Path) -> Path:
    """A TorchScript archive (``torch.jit.save``): a zip file, but no ExportedProgram."""
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(target))
    return target


def tampered_reference_io(source: Path, target: Path, marker: Path) -> Path:
    """``source`` with its reference I/O replaced by a pickle that would create ``marker`` if unpickled."""
    payload = base64.b64encode(pickle.dumps({"version": 1, "args": [Plant(marker)]})).decode()
    torch.export.save(torch.export.load(source), target, extra_files={REFERENCE_IO_FILE: payload})
    return target


# ---------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One crafted file: how to build it from a good file, the CLI arguments, and the stderr line's fragment."""

    name: str
    kind: str  # the threat-model family it belongs to
    build: Callable[[Path, Path, Traps], Path]
    # What the stderr line says; one of several where torch versions differ (a field an older schema lacks).
    expect: str | tuple[str, ...]
    args: tuple[str, ...] = ()
    command: str = "verify"


def _engine_any_callable(good: Path, out: Path, traps: Traps) -> Path:
    return edit_engine(good, out, lambda p: add_steps(p, ("load_library::__call__.__call__", [str(traps.secret)])))


def _engine_import_module(good: Path, out: Path, traps: Traps) -> Path:
    return edit_engine(good, out, lambda p: add_steps(p, ("importlib.import_module", ["os"])))


def _engine_reads_a_file(good: Path, out: Path, traps: Traps) -> Path:
    return edit_engine(
        good, out, lambda p: add_steps(p, ("aten::from_file.default", [str(traps.secret), False, len(SECRET)]))
    )


def _engine_writes_a_file(good: Path, out: Path, traps: Traps) -> Path:
    def edit(program: dict[str, Any]) -> None:
        first = _first_value(program)
        add_steps(
            program,
            ("aten::ones.default", [[len("untouched")]]),
            ("aten::fill_.Scalar", [{"ref": first}, 88]),
        )

    return edit_engine(good, out, edit)


def _graph_reads_a_file(good: Path, out: Path, traps: Traps) -> Path:
    def edit(document: dict[str, Any]) -> None:
        relu = next(n for n in document["graph_module"]["graph"]["nodes"] if "relu" in n["target"])
        relu["target"] = "torch.ops.aten.from_file.default"

    return edit_program(good, out, edit)


def _graph_walks_attributes(good: Path, out: Path, traps: Traps) -> Path:
    def edit(document: dict[str, Any]) -> None:
        relu = next(n for n in document["graph_module"]["graph"]["nodes"] if "relu" in n["target"])
        relu["target"] = "torch.os.system"

    return edit_program(good, out, edit)


def _size_expression_runs_python(good: Path, out: Path, traps: Traps) -> Path:
    def edit(document: dict[str, Any]) -> None:
        document["range_constraints"][f"__import__('os').system('touch {traps.marker}')"] = {
            "min_val": 2,
            "max_val": 8,
        }

    return edit_program(good, out, edit)


def _guard_runs_python(good: Path, out: Path, traps: Traps) -> Path:
    def edit(document: dict[str, Any]) -> None:
        document["guards_code"] = [f"__import__('os').system('touch {traps.marker}') == 0"]

    return edit_program(good, out, edit)


def _placeholder_name_runs_python(good: Path, out: Path, traps: Traps) -> Path:
    def edit(document: dict[str, Any]) -> None:
        graph = document["graph_module"]["graph"]
        graph["inputs"][0]["as_tensor"]["name"] = f"x=__import__('os').system('touch {traps.marker}')"

    return edit_program(good, out, edit)


def _tensorrt_engine(good: Path, out: Path, traps: Traps) -> Path:
    def edit(document: dict[str, Any]) -> None:
        _engine_nodes(document)[0]["target"] = "torch.ops.tensorrt.execute_engine.default"

    return edit_program(good, out, edit)


def _legacy_stream(good: Path, out: Path, traps: Traps) -> Path:
    """Sample inputs as a legacy torch.save stream: the magic number's pickle first, the payload later."""
    entries = read_entries(good)
    buffer = io.BytesIO()
    torch.save(Plant(traps.marker), buffer, _use_new_zipfile_serialization=False)
    entries[sample_inputs_entry(entries)] = buffer.getvalue()
    return write_entries(out, entries)


def _duplicate_names(good: Path, out: Path, traps: Traps) -> Path:
    """Two sample-input entries: torch's reader takes the first (planted), Python's zipfile the last (benign)."""
    entries = read_entries(good)
    name = sample_inputs_entry(entries)
    planted = io.BytesIO()
    torch.save(Plant(traps.marker), planted)
    items = [(n, d) for n, d in entries.items() if n != name]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        return write_entries(out, [(name, planted.getvalue()), *items, (name, entries[name])])


def _two_central_directories(good: Path, out: Path, traps: Traps) -> Path:
    """A second archive appended whose end record points at the first one's directory offsets, shifted."""
    planted_entries = read_entries(good)
    planted = io.BytesIO()
    torch.save(Plant(traps.marker), planted)
    planted_entries[sample_inputs_entry(planted_entries)] = planted.getvalue()
    evil = write_entries(out.with_suffix(".evil"), planted_entries).read_bytes()
    benign = good.read_bytes()
    out.write_bytes(evil + benign)  # zipfile reads the benign archive as "prepended data" + archive
    out.with_suffix(".evil").unlink()
    return out


def _bytes_between_entries(good: Path, out: Path, traps: Traps) -> Path:
    """A planted pickle hidden after the last entry, before the central directory (offsets fixed up)."""
    data = bytearray(good.read_bytes())
    end = data.rfind(b"PK\x05\x06")
    cd_offset = struct.unpack("<I", data[end + 16 : end + 20])[0]
    hidden = io.BytesIO()
    torch.save(Plant(traps.marker), hidden)
    padding = hidden.getvalue()
    tail = data[cd_offset:]
    new_offset = cd_offset + len(padding)
    tail_end = tail.rfind(b"PK\x05\x06")
    tail[tail_end + 16 : tail_end + 20] = struct.pack("<I", new_offset)
    locator = tail.rfind(b"PK\x06\x07")
    if locator >= 0:  # torch writes zip64 records too: move the record offset and the directory offset
        record = struct.unpack("<Q", tail[locator + 8 : locator + 16])[0] + len(padding)
        tail[locator + 8 : locator + 16] = struct.pack("<Q", record)
        record_at = tail.rfind(b"PK\x06\x06")
        tail[record_at + 48 : record_at + 56] = struct.pack("<Q", new_offset)
    out.write_bytes(bytes(data[:cd_offset]) + padding + bytes(tail))
    return out


def _program_in_utf16(good: Path, out: Path, traps: Traps) -> Path:
    """A program this check and torch's reader would decode differently: refused, not left to torch."""
    entries = read_entries(good)
    name = model_json_entry(entries)
    entries[name] = entries[name].decode().encode("utf-16")
    return write_entries(out, entries)


def _sparse_crash(good: Path, out: Path, traps: Traps) -> Path:
    """An unchecked sparse tensor with an index far out of range, densified: native code reads out of bounds."""

    def edit(program: dict[str, Any]) -> None:
        first = _first_value(program)
        add_steps(
            program,
            ("aten::full.default", [[2, 1], 1 << 40], {"dtype": {"dtype": "int64"}}),
            ("aten::ones.default", [[1]]),
            ("aten::_sparse_coo_tensor_unsafe.default", [{"ref": first}, {"ref": first + 1}, [4, 4]]),
            ("aten::to_dense.default", [{"ref": first + 2}]),
            ("aten::sum.default", [{"ref": first + 3}]),
        )

    return edit_engine(good, out, edit)


def _huge_allocation(good: Path, out: Path, traps: Traps) -> Path:
    return edit_engine(
        good, out, lambda p: add_steps(p, ("aten::ones.default", [[4 << 30]], {"dtype": {"dtype": "uint8"}}))
    )


def _endless_compute(good: Path, out: Path, traps: Traps) -> Path:
    def edit(program: dict[str, Any]) -> None:
        first = _first_value(program)
        add_steps(program, ("aten::ones.default", [[2048, 2048]]))
        for step in range(400):
            add_steps(program, ("aten::mm.default", [{"ref": first + step}, {"ref": first}]))

    return edit_engine(good, out, edit)


def _split_zip_bomb(good: Path, out: Path, traps: Traps) -> Path:
    """Twenty deflated entries of 60 MiB zeros each: every one under the ratio rule, 1.2 GiB together."""
    source = read_entries(good)
    zeros = bytes(60 << 20)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name, data in source.items():
            archive.writestr(name, data)
        for index in range(20):
            archive.writestr(f"archive/extra/padding_{index}", zeros, compress_type=zipfile.ZIP_DEFLATED)
    return out


def _escape_in_entry_name(good: Path, out: Path, traps: Traps) -> Path:
    entries = read_entries(good)
    planted = io.BytesIO()
    torch.save(Plant(traps.marker), planted)
    entries[f"archive/extra/{ESCAPE}.pkl"] = planted.getvalue()
    return write_entries(out, entries)


def _package(out: Path, library: str, kinds: list[str]) -> Path:
    """A package (no program, never run) with one library entry and recorded output kinds."""
    info = json.dumps({"outputs": kinds}).encode()
    return write_entries(
        out,
        [
            (f"package/data/aotinductor/model/{library}", b"\x7fELF not really"),
            (f"package/extra/{PACKAGE_INFO_FILE}", info),
            ("package/archive_format", b"pt2"),
        ],
    )


def _escape_in_package(good: Path, out: Path, traps: Traps) -> Path:
    """Recorded output kinds (data, shown by inspect) carrying escape sequences."""
    return _package(out, "model.so", [f"tensor{ESCAPE}"])


def _escape_in_package_entry(good: Path, out: Path, traps: Traps) -> Path:
    """An entry name carrying escape sequences: no name torch writes."""
    return _package(out, f"{ESCAPE}.so", ["tensor"])


def _deep_nesting(good: Path, out: Path, traps: Traps) -> Path:
    entries = read_entries(good)
    entries[model_json_entry(entries)] = b"[" * 200_000 + b"]" * 200_000
    return write_entries(out, entries)


# -- The classes of issue "verify that holds against an attacker who has read the code" -------------------


def _nested_entries(blob: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        return [(name, archive.read(name)) for name in archive.namelist()]


def _zip(entries: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about names given twice
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
            for name, data in entries:
                archive.writestr(name, data)
    return buffer.getvalue()


def _case_folded_pickle(good: Path, out: Path, traps: Traps) -> Path:
    """Sample inputs whose torch.save archive holds ``DATA.PKL`` (planted) beside ``data.pkl``: miniz finds either."""
    entries = read_entries(good)
    name = sample_inputs_entry(entries)
    nested = _nested_entries(entries[name])
    root = nested[0][0].partition("/")[0]
    planted = dict(_nested_entries(torch_saved(Plant(traps.marker))))
    evil = next(data for entry, data in planted.items() if entry.endswith("/data.pkl"))
    entries[name] = _zip([(f"{root}/DATA.PKL", evil), *nested])
    return write_entries(out, entries)


def _case_folded_entry(good: Path, out: Path, traps: Traps) -> Path:
    """A second sample-inputs entry, named as the first but for case, holding a planted pickle."""
    entries = read_entries(good)
    name = sample_inputs_entry(entries)
    folder, slash, base = name.rpartition("/")
    return write_entries(out, [(f"{folder}{slash}{base.upper()}", torch_saved(Plant(traps.marker))), *entries.items()])


def _second_program(good: Path, out: Path, traps: Traps) -> Path:
    """``models/evil.JSON``: torch deserializes it as a program too, sympifying its size expressions."""
    entries = read_entries(good)
    name = model_json_entry(entries)
    document = json.loads(entries[name])
    document["range_constraints"][f"__import__('os').system('touch {traps.marker}')"] = {"min_val": 2, "max_val": 8}
    folder = name.rpartition("/")[0] or "models"  # torch 2.5 ... 2.7 keep their program at the top level
    entries[f"{folder}/evil.JSON"] = json.dumps(document).encode()
    return write_entries(out, entries)


def _older_layout(good: Path, out: Path, traps: Traps) -> Path:
    """torch 2.7's layout, whose loader unpickles ``serialized_constants.json`` with ``weights_only=False``."""
    entries = read_entries(good)
    document = entries[model_json_entry(entries)]
    return write_entries(
        out,
        [
            ("serialized_exported_program.json", document),
            ("serialized_state_dict.pt", torch_saved({})),
            ("serialized_constants.json", pickle.dumps(Plant(traps.marker))),
            ("serialized_example_inputs.pt", entries[sample_inputs_entry(entries)]),
            ("version", b"8.20"),
        ],
    )


def _opaque_object(good: Path, out: Path, traps: Traps) -> Path:
    """A constant torch would ``pickle.loads`` (an opaque object, torch 2.9+) or, in older layouts, the constants
    blob it would unpickle with ``weights_only=False``."""
    entries = read_entries(good)
    config = next((n for n in entries if n.endswith("_constants_config.json")), None)
    if config is None:
        name = next(n for n in entries if n.endswith(("data/constants/model.pt", "serialized_constants.pt")))
        entries[name] = torch_saved(Plant(traps.marker))
        return write_entries(out, entries)
    document = json.loads(entries[config])
    document["config"]["planted"] = {
        "path_name": "opaque_obj_0",
        "is_param": False,
        "use_pickle": True,
        "tensor_meta": None,
    }
    entries[config] = json.dumps(document).encode()
    entries[f"{config.rpartition('/')[0]}/opaque_obj_0"] = pickle.dumps(Plant(traps.marker))
    return write_entries(out, entries)


def _carriage_return_in_buffer_name(good: Path, out: Path, traps: Traps) -> Path:
    """A lifted buffer's name ending a line of the code FX writes (``getattr(self, "...")``) and starting another."""

    def edit(document: dict[str, Any]) -> None:
        spec = next(s for s in document["graph_module"]["signature"]["input_specs"] if "buffer" in s)
        spec["buffer"]["buffer_name"] += f'")\rimport os; os.system("touch {traps.marker}")#'

    return edit_program(good, out, edit)


def _carriage_return_in_pytree_key(good: Path, out: Path, traps: Traps) -> Path:
    """A keyword-argument key of the input spec, written by FX as ``'...'`` into the code it generates."""

    def edit(document: dict[str, Any]) -> None:
        signature = document["graph_module"]["module_call_graph"][0]["signature"]
        version, spec = json.loads(signature["in_spec"])
        leaf = {"type": None, "context": None, "children_spec": []}
        key = f"x'\rimport os; os.system('touch {traps.marker}')#"
        spec["children_spec"][1] = {"type": "builtins.dict", "context": json.dumps([key]), "children_spec": [leaf]}
        signature["in_spec"] = json.dumps([version, spec])

    return edit_program(good, out, edit)


def _input_mutation(good: Path, out: Path, traps: Traps) -> Path:
    """An output spec that makes ``module()`` copy a value into the caller's input after the operator check."""

    def edit(document: dict[str, Any]) -> None:
        graph = document["graph_module"]["graph"]
        signature = document["graph_module"]["signature"]
        name = graph["outputs"][0]["as_tensor"]["name"]
        user_input = next(
            s["user_input"]["arg"]["as_tensor"]["name"] for s in signature["input_specs"] if "user_input" in s
        )
        graph["outputs"].insert(0, {"as_tensor": {"name": name}})
        signature["output_specs"].insert(
            0, {"user_input_mutation": {"arg": {"name": name}, "user_input_name": user_input}}
        )

    return edit_program(good, out, edit)


def _uninitialized_memory(good: Path, out: Path, traps: Traps) -> Path:
    """A node reading fresh memory: filled with NaN under deterministic algorithms, garbage in a server."""

    def edit(document: dict[str, Any]) -> None:
        relu = next(n for n in document["graph_module"]["graph"]["nodes"] if "relu" in n["target"])
        relu["target"] = "torch.ops.aten.empty_like.default"

    return edit_program(good, out, edit)


def _global_random_state(good: Path, out: Path, traps: Traps) -> Path:
    """An engine step drawing from the global generator: the seed verify would set could be read back."""
    return edit_engine(good, out, lambda p: add_steps(p, ("aten::rand.default", [[4]])))


CASES: tuple[Case, ...] = (
    Case("engine step reaches torch.ops.load_library", "operators", _engine_any_callable, "step"),
    Case("engine step names importlib.import_module", "operators", _engine_import_module, "not an operator name"),
    Case("engine step reads a file (aten::from_file)", "operators", _engine_reads_a_file, "reads files"),
    Case("engine step writes in place (aten::fill_)", "operators", _engine_writes_a_file, "writes to its arguments"),
    Case("graph node calls aten::from_file", "operators", _graph_reads_a_file, "node relu calls aten::from_file"),
    Case("graph target walks to os.system", "operators", _graph_walks_attributes, "not an operator name"),
    Case("size expression run by sympify", "python in the program", _size_expression_runs_python, "size expression"),
    Case(
        "guard code executed by torch",
        "python in the program",
        _guard_runs_python,
        ("a guard", "has no field 'guards_code'"),
    ),
    Case(
        "placeholder name in generated code",
        "python in the program",
        _placeholder_name_runs_python,
        "not a dotted path",
    ),
    Case("TensorRT engine without --allow-native-code", "native code", _tensorrt_engine, "allow-native-code"),
    Case("legacy torch.save stream as sample inputs", "one view", _legacy_stream, "legacy torch.save"),
    Case("two entries with the same name", "one view", _duplicate_names, "two entries are named"),
    Case("two archives, two central directories", "one view", _two_central_directories, "different files"),
    Case("bytes hidden before the central directory", "one view", _bytes_between_entries, "belong to no entry"),
    Case("program JSON in UTF-16", "one view", _program_in_utf16, "not a readable program"),
    Case("unchecked sparse tensor (refused)", "crashes", _sparse_crash, "builds tensors unchecked"),
    Case(
        "unchecked sparse tensor, allowed by the user",
        "crashes",
        _sparse_crash,
        "died on SIGSEGV",
        ("--allow-op", "aten::_sparse_coo_tensor_unsafe", "--allow-op", "aten::to_dense"),
    ),
    Case("4 GiB allocation", "exhaustion", _huge_allocation, "memory limit", ("--memory-limit", "1GiB")),
    Case("endless matrix products", "exhaustion", _endless_compute, "time limit", ("--timeout", "4")),
    Case("zip bomb split over entries", "exhaustion", _split_zip_bomb, "is compressed"),
    Case("deep nesting", "exhaustion", _deep_nesting, "nested too deeply"),
    Case("DATA.PKL beside data.pkl in sample inputs", "case", _case_folded_pickle, "differ only in case"),
    Case("an entry named as the sample inputs but for case", "case", _case_folded_entry, "differ only in case"),
    Case(
        "a second program, models/evil.JSON",
        "programs",
        _second_program,
        ("every entry under models/", "not in one folder"),
    ),
    Case("torch 2.7's layout with serialized_constants.json", "older layout", _older_layout, "not part of a torch"),
    Case("an opaque object torch would pickle.loads", "pickles", _opaque_object, "refused"),
    Case("carriage return in a lifted buffer's name", "generated code", _carriage_return_in_buffer_name, "dotted path"),
    Case("carriage return in a pytree key", "generated code", _carriage_return_in_pytree_key, "pytree key"),
    Case("output spec mutating the caller's input", "what runs", _input_mutation, "writes to the caller's input"),
    Case("node reading uninitialized memory", "honest verdicts", _uninitialized_memory, "uninitialized memory"),
    Case("engine step drawing from the global RNG", "honest verdicts", _global_random_state, "global random state"),
    Case("escape sequences in a refused entry's name", "terminal", _escape_in_entry_name, "refused"),
    Case(
        "escape sequences in a package entry's name",
        "terminal",
        _escape_in_package_entry,
        "characters torch never writes",
        command="inspect",
    ),
)

# Not refused, but printed: inspect shows what the file holds, every string escaped.
INSPECTED: tuple[Case, ...] = (
    Case("escape sequences in a package's output kinds", "terminal", _escape_in_package, "", command="inspect"),
)
