"""Files from strangers: nothing in a crafted archive runs; miswired stock files are caught; old files checked.

Every crafted file is generated here from a good trt_inline file (none is
checked in). Each refusal must exit 2 with one stderr line naming the archive
entry, and the marker file its payload would create must not exist afterwards.
"""

from __future__ import annotations

import json
import logging
import operator
import pickle
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from support.commands import assert_unusable, cli
from support.hostile import Plant, entry_named, model_json_entry, rewrite, sample_inputs_entry, torch_saved
from support.models import ConvBnRelu, MultiOutputBothSides, TaggedTensor
from support.programs import SavedSeed, engine_calls

import trt_inline
from trt_inline.archive import REFERENCE_IO_FILE


def _payload_configs(entries: dict[str, bytes]) -> bool:
    """Whether the archive has per-payload configs (torch 2.9+), or one torch.save file per kind (2.5 ... 2.8)."""
    return any(name.endswith("_constants_config.json") for name in entries)


# Where archives without payload configs keep all weights / all constants in one torch.save file.
_WHOLE_FILES = {
    "weights": ("/data/weights/model.pt", "serialized_state_dict.pt"),  # torch 2.7/2.8, torch 2.5/2.6
    "constants": ("/data/constants/model.pt", "serialized_constants.pt"),
}


def _flip_to_pickle(entries: dict[str, bytes], kind: str, payload: bytes) -> str:
    """Make a weight / constant load through the unpickler with ``payload``; return the entry's name.

    Archives with payload configs (torch 2.9+): mark the first payload
    ``use_pickle`` and replace its file. Older archives pickle all weights
    (constants) in one torch.save file: replace it.
    """
    if not _payload_configs(entries):
        name = entry_named(entries, *_WHOLE_FILES[kind])
        entries[name] = payload
        return name
    config_name = entry_named(entries, f"_{kind}_config.json")
    config = json.loads(entries[config_name])
    first = next(iter(config["config"].values()))
    first["use_pickle"] = True
    entries[config_name] = json.dumps(config).encode()
    name = f"{config_name.rpartition('/')[0]}/{first['path_name']}"
    entries[name] = payload
    return name


def _extra_folder(entries: dict[str, bytes]) -> str:
    reference = entry_named(entries, REFERENCE_IO_FILE)
    return reference.rpartition("/")[0]


CRAFTED: dict[str, Callable[[dict[str, bytes], Path], str]] = {}


def crafted(name: str) -> Callable[[Callable[[dict[str, bytes], Path], str]], Callable[[dict[str, bytes], Path], str]]:
    def register(make: Callable[[dict[str, bytes], Path], str]) -> Callable[[dict[str, bytes], Path], str]:
        CRAFTED[name] = make
        return make

    return register


@crafted("sample inputs")
def _sample_inputs(entries: dict[str, bytes], marker: Path) -> str:
    name = sample_inputs_entry(entries)
    entries[name] = torch_saved(Plant(marker))
    return name


@crafted("pickled weight")
def _pickled_weight(entries: dict[str, bytes], marker: Path) -> str:
    return _flip_to_pickle(entries, "weights", torch_saved(Plant(marker)))


@crafted("pickled constant")
def _pickled_constant(entries: dict[str, bytes], marker: Path) -> str:
    return _flip_to_pickle(entries, "constants", torch_saved(Plant(marker)))


@crafted("raw pickle of protocol 0 as a constant")
def _protocol_0_constant(entries: dict[str, bytes], marker: Path) -> str:
    return _flip_to_pickle(entries, "constants", pickle.dumps(Plant(marker), protocol=0))


@crafted("reference I/O")
def _reference_io(entries: dict[str, bytes], marker: Path) -> str:
    import base64

    name = entry_named(entries, REFERENCE_IO_FILE)
    entries[name] = base64.b64encode(torch_saved({"version": 1, "args": [Plant(marker)]}))
    return name


@crafted("use_pickle flag pointing at a missing file")
def _missing(entries: dict[str, bytes], marker: Path) -> str:
    if not _payload_configs(entries):
        pytest.skip(f"torch {torch.__version__} writes no payload configs, so no use_pickle flags")
    name = _flip_to_pickle(entries, "constants", b"")
    del entries[name]
    return name


# What the single stderr line says, per case, besides the entry's name.
REASONS = {
    "sample inputs": "it calls posix.system",
    "pickled weight": "it calls posix.system",
    "pickled constant": "it calls posix.system",
    "raw pickle of protocol 0 as a constant": "it calls posix.system",
    "reference I/O": "embedded reference I/O refused",
    "use_pickle flag pointing at a missing file": "declared by a payload config but missing",
}


@pytest.fixture(scope="module")
def with_weights(saved_seed: SavedSeed) -> Path:
    """The seed model with convolution falling back, so the file carries weights (parameters of fallbacks)."""
    path = saved_seed.root / "weights.pt2"
    if not path.exists():
        compiled = trt_inline.reference.compile(
            ConvBnRelu().eval(), (saved_seed.x,), torch_executed_ops=["aten.convolution.default"]
        )
        trt_inline.save(compiled, path, arg_inputs=(saved_seed.x,))
    return path


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_archive_is_refused_and_nothing_runs(
    saved_seed: SavedSeed, with_weights: Path, tmp_path: Path, case: str
) -> None:
    marker = tmp_path / "marker"
    entry_holder: list[str] = []
    source = with_weights if case == "pickled weight" else saved_seed.good
    path = rewrite(
        source, tmp_path / "crafted.pt2", lambda entries: entry_holder.append(CRAFTED[case](entries, marker))
    )
    (entry,) = entry_holder
    for command in ("verify", "inspect"):
        proc = cli(command, str(path))
        if case == "reference I/O" and command == "inspect":
            # inspect reads the program and the archive's directory only: it shows the graph.
            assert proc.returncode == 0 and "engine 0" in proc.stdout, proc.stdout + proc.stderr
            continue
        assert_unusable(proc, REASONS[case])
        if case != "reference I/O":
            assert entry in proc.stderr, proc.stderr
        assert not marker.exists(), f"{command} ran code planted in {entry}"
    with pytest.raises(trt_inline.VerifyInputError):
        trt_inline.verify(path)
    assert not marker.exists()


def test_an_extra_file_of_someone_else_is_never_read(saved_seed: SavedSeed, tmp_path: Path) -> None:
    """A planted pickle as an extra file: accounted for, named in a note, never read, never handed to torch."""
    marker = tmp_path / "marker"
    names: list[str] = []

    def plant(entries: dict[str, bytes]) -> None:
        names.append(f"{_extra_folder(entries)}/notes.pkl")
        entries[names[0]] = pickle.dumps(Plant(marker))

    path = rewrite(saved_seed.good, tmp_path / "crafted.pt2", plant)
    proc = cli("verify", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"note: extra files not read (they are never loaded as code): {names[0]}" in proc.stdout
    assert cli("inspect", str(path)).returncode == 0
    assert not marker.exists()


def test_zip_bomb_is_refused_before_anything_is_decompressed(saved_seed: SavedSeed, tmp_path: Path) -> None:
    path = tmp_path / "bomb.pt2"
    shutil.copy(saved_seed.good, path)
    with zipfile.ZipFile(path) as archive:
        name = f"{_extra_folder({n: b'' for n in archive.namelist()})}/padding.bin"
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, b"\0" * (256 << 20))
    info = zipfile.ZipFile(path).getinfo(name)
    assert info.file_size / info.compress_size > 200, "the entry must really be a bomb"
    for command in ("verify", "inspect"):
        assert_unusable(cli(command, str(path)), f"refused: entry '{name}' is compressed (torch writes its archives")


def test_allow_pickle_loads_a_benign_pickled_constant(saved_seed: SavedSeed, tmp_path: Path) -> None:
    """A constant only a full unpickler can read (a tensor subclass): refused by default, verified with the flag."""
    extra = {REFERENCE_IO_FILE: ""}
    program = torch.export.load(saved_seed.good, extra_files=extra)
    name = next(iter(program.constants))
    program.constants[name] = program.constants[name].as_subclass(TaggedTensor)
    path = tmp_path / "subclass.pt2"
    torch.export.save(program, path, extra_files=extra)

    assert_unusable(cli("verify", str(path)), "it calls torch._tensor._rebuild_from_type_v2")
    proc = cli("verify", str(path), "--allow-pickle")  # its child imports TaggedTensor from the tests' folder
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "note: pickles in the file were allowed (allow_pickle)" in proc.stdout
    assert proc.stdout.count("max abs diff 0 ") == 2
    report = trt_inline.verify(path, allow_pickle=True)
    assert report.ok and report.allow_pickle and json.loads(report.to_json())["allow_pickle"] is True


# ---------------------------------------------------------------------------
# Orphaned engine outputs: the silent form of the seed bug, in files without reference I/O
# ---------------------------------------------------------------------------


def _stock_like(source: Path, target: Path, rewire: Callable[[torch.export.ExportedProgram], None]) -> Path:
    """A file as the stock exporter leaves it when name matching did not crash: rewired, no reference I/O."""
    program = torch.export.load(source)
    rewire(program)
    program.graph.eliminate_dead_code()
    program.graph_module.recompile()
    program.graph.lint()
    torch.export.save(program, target)
    return target


def _engine_targets(program: torch.export.ExportedProgram) -> set[str]:
    return {str(spec.target) for spec in program.graph_signature.input_specs if "_engine" in str(spec.target)}


def _rewire_single_output(program: torch.export.ExportedProgram) -> None:
    relus = [n for n in program.graph.nodes if n.target is torch.ops.aten.relu.default]
    assert relus[0].args[0].meta["val"].shape == relus[1].args[0].meta["val"].shape
    relus[1].replace_input_with(relus[1].args[0], relus[0].args[0])


def _rewire_multi_output(program: torch.export.ExportedProgram) -> None:
    engine = next(n for n in engine_calls(program) if len(n.meta["val"]) == 2)
    first, second = sorted((u for u in engine.users if u.target is operator.getitem), key=lambda u: u.args[1])
    assert first.meta["val"].shape == second.meta["val"].shape
    consumer = next(iter(second.users))
    consumer.replace_input_with(second, first)


def test_rewired_single_output_engine_is_reported(saved_seed: SavedSeed, tmp_path: Path) -> None:
    path = _stock_like(saved_seed.good, tmp_path / "stock_single.pt2", _rewire_single_output)
    program = torch.export.load(path)
    engines = engine_calls(program)
    assert len(engines) == 3, "the engine whose consumer was rewired is dead code now"
    used = {str(spec.target) for spec in program.graph_signature.input_specs if spec.arg.name in
            {n.args[1].name for n in engines}}  # fmt: skip
    (dead,) = _engine_targets(program) - used
    proc = cli("verify", str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        f"problem: engine constant {dead!r} is never read: its engine was removed as dead code; "
        "the likely cause is a consumer wired to another tensor" in proc.stdout
    )


def test_orphaned_output_of_a_multi_output_engine_is_reported(saved_seed: SavedSeed, tmp_path: Path) -> None:
    path = _stock_like(saved_seed.good, tmp_path / "stock_multi.pt2", _rewire_multi_output)
    engines = engine_calls(torch.export.load(path))
    position, engine = next((i, n) for i, n in enumerate(engines) if len(n.meta["val"]) == 2)
    proc = cli("verify", str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    expected = f"problem: engine {position} ({engine.name}): output 1 is never read; the likely cause is a consumer"
    assert expected in proc.stdout, proc.stdout


def test_correct_files_have_no_orphans(saved_seed: SavedSeed) -> None:
    for path in (saved_seed.good, saved_seed.bare):
        report = trt_inline.verify(path)
        assert not report.problems, report.problems


# ---------------------------------------------------------------------------
# --expected-from: an old (stock-saved) file against a new trt-inline save of the same module
# ---------------------------------------------------------------------------


def test_expected_from_a_new_file(saved_seed: SavedSeed, tmp_path: Path) -> None:
    miswired_old = tmp_path / "old_miswired.pt2"
    program = torch.export.load(saved_seed.good)
    relus = [n for n in program.graph.nodes if n.target is torch.ops.aten.relu.default]
    relus[1].replace_input_with(relus[1].args[0], relus[0].args[0])  # loadable, wrong; engine 3 kept alive below
    torch.export.save(program, miswired_old)  # no dead-code elimination: no orphan, only wrong numbers

    proc = cli("verify", str(miswired_old), "--expected-from", str(saved_seed.good))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"(expected outputs: from {saved_seed.good})" in proc.stdout
    assert "problem: output 0 differs: max abs diff" in proc.stdout

    proc = cli("verify", str(saved_seed.bare), "--expected-from", str(saved_seed.good))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("max abs diff 0 ") == 2


def test_expected_from_a_file_of_another_signature(saved_seed: SavedSeed, tmp_path: Path) -> None:
    v = torch.randn(4, 16)
    other = tmp_path / "other.pt2"
    compiled = trt_inline.reference.compile(
        MultiOutputBothSides().eval(), (v,), torch_executed_ops=["aten.topk.default"]
    )
    trt_inline.save(compiled, other, arg_inputs=(v,))
    assert_unusable(
        cli("verify", str(saved_seed.bare), "--expected-from", str(other)),
        f"{saved_seed.bare} input 0 (x) is float32[2, 3, 8, 8], the reference in {other} gives float32[4, 16]",
    )
    assert_unusable(
        cli("verify", str(saved_seed.bare), "--expected-from", str(saved_seed.bare)), "carries no reference I/O"
    )


# ---------------------------------------------------------------------------
# One line on stderr, always
# ---------------------------------------------------------------------------


def test_torch_warnings_stay_off_stderr(
    saved_seed: SavedSeed, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """torch's deserializer warns (a log record) of a range for a symbol its graph lacks: shown only with --debug."""
    path = rewrite(saved_seed.good, tmp_path / "model.pt2", _unused_symbol_range)
    with caplog.at_level(logging.WARNING):
        torch.export.load(path)
    assert any("s999" in record.getMessage() for record in caplog.records), "torch warns of the unused symbol"
    quiet = cli("verify", str(path))
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert quiet.stderr == ""
    loud = cli("--debug", "verify", str(path))
    assert loud.returncode == 0
    assert "s999" in loud.stderr, loud.stderr


def _unused_symbol_range(entries: dict[str, bytes]) -> None:
    name = model_json_entry(entries)
    document = json.loads(entries[name])
    document["range_constraints"]["s999"] = {"min_val": 2, "max_val": 8}
    entries[name] = json.dumps(document).encode()
