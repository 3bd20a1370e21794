"""Wall one: torch only ever loads the canonical archive the strict reader wrote, and good files run the same on it."""

from __future__ import annotations

import ctypes
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from support.hostile import model_json_entry, read_entries, write_entries
from support.models import ConvBnRelu, scalar_cases
from support.programs import SavedSeed
from support.scalars import compile_case
from support.values import as_list

import trt_inline
from trt_inline import compat
from trt_inline.archive import open_file
from trt_inline.archive.program_checks import canonical_bytes, canonical_document
from trt_inline.archive.reader import TensorRecord
from trt_inline.archive.views import FileView


def _program_entry(path: Path) -> tuple[str, bytes]:
    entries = read_entries(path)
    name = model_json_entry(entries)
    return name, entries[name]


def test_what_torch_loads_is_the_canonical_archive(
    saved_seed: SavedSeed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A good file with someone's extra entry: torch gets the rebuilt document, mapped tensors, none of the extra."""
    entries = read_entries(saved_seed.good)
    extra = next(n for n in entries if "/extra/" in n or n.startswith("extra_files/")).rpartition("/")[0] + "/notes.txt"
    entries[extra] = b"not for torch"
    path = write_entries(tmp_path / "with_extra.pt2", entries)
    handed: list[tuple[bytes, dict[str, Any], dict[str, Any], Any]] = []
    real = compat.deserialize_program

    def spy(document: bytes, state_dict: Any, constants: Any, example_inputs: Any) -> Any:
        handed.append((document, state_dict, constants, example_inputs))
        return real(document, state_dict, constants, example_inputs)

    monkeypatch.setattr(compat, "deserialize_program", spy)
    loaded = open_file(path)
    assert loaded.canonical is not None and len(handed) == 1
    document, _, constants, example_inputs = handed[0]

    name, original = _program_entry(path)
    assert b"stack_trace" in original, "the original carries metadata torch does not need"
    assert document == canonical_bytes(canonical_document(json.loads(original), path, name))
    assert b"stack_trace" not in document and b"nn_module_stack" not in document
    parts = loaded.canonical.entries()
    assert not [p for p in parts if "notes" in p or ".data" in p or "archive_format" in p], parts
    assert [p for p in parts if p.startswith("data/constants/")], parts
    assert loaded.unread == [extra]

    # Tensor data is the file's, mapped: every constant a view of the mapping, not a copy (raw records, torch 2.9+;
    # before, the constants are one torch.save blob whose records the strict reader maps the same way).
    view = FileView(path)
    assert view.mapped is not None, view.unmapped_reason
    records = [r for r in loaded.canonical.constants.values() if isinstance(r, TensorRecord)]
    if records:
        start = ctypes.addressof(ctypes.c_char.from_buffer(records[0].view.mapped))  # type: ignore[attr-defined]
        for tensor in constants.values():
            if tensor.numel():
                assert start <= tensor.data_ptr() < start + records[0].view.size
    assert isinstance(example_inputs, tuple) and torch.equal(example_inputs[0][0], saved_seed.x)
    assert trt_inline.verify(path, isolate=False).ok


def _weights_file(saved_seed: SavedSeed) -> Path:
    path = saved_seed.root / "canonical_weights.pt2"
    if not path.exists():
        compiled = trt_inline.reference.compile(
            ConvBnRelu().eval(), (saved_seed.x,), torch_executed_ops=["aten.convolution.default"]
        )
        trt_inline.save(compiled, path, arg_inputs=(saved_seed.x,))
    return path


@pytest.mark.parametrize("retrace", [True, False])
def test_good_files_compute_the_same_through_the_canonical_path(
    saved_seed: SavedSeed, tmp_path: Path, retrace: bool
) -> None:
    """Bitwise the same outputs as torch.export.load of the original, on engines, weights and dynamic sizes."""
    case = scalar_cases()[0]
    dynamic = tmp_path / "dynamic.pt2"
    trt_inline.save(
        compile_case(case), dynamic, arg_inputs=case.inputs, dynamic_shapes=case.dynamic_shapes, retrace=retrace
    )
    files = [
        (saved_seed.good, [(saved_seed.x,)]),
        (_weights_file(saved_seed), [(saved_seed.x,)]),
        (dynamic, case.checks),
    ]
    for path, input_sets in files:
        canonical = open_file(path).module
        stock = torch.export.load(path).module()
        assert canonical is not stock
        for inputs in input_sets:
            with torch.no_grad():
                ours, theirs = as_list(canonical(*inputs)), as_list(stock(*inputs))
            assert len(ours) == len(theirs)
            for a, b in zip(ours, theirs, strict=True):
                assert torch.equal(torch.as_tensor(a), torch.as_tensor(b)), (path.name, inputs[0].shape)
        report = trt_inline.verify(path)
        assert report.ok, report.to_text()


def test_type_hints_cached_while_deserializing_give_the_same_program_and_are_put_back(saved_seed: SavedSeed) -> None:
    """The deserializer's type-hint lookups answered from a cache: the same dataclasses, torch's module as it was."""
    import typing

    from torch._export.serde import serialize

    _, document = _program_entry(saved_seed.good)
    program_class = compat.export_schema().ExportedProgram
    stock = serialize._dict_to_dataclass(program_class, json.loads(document))
    with compat._type_hints_cached(serialize):
        assert serialize.typing is not typing
        cached = serialize._dict_to_dataclass(program_class, json.loads(document))
        assert serialize.typing._hints  # torch asked, and the cache answered
    assert serialize.typing is typing
    assert _plain(cached) == _plain(stock)
    with pytest.raises(RuntimeError), compat._type_hints_cached(serialize):
        raise RuntimeError("put back on the way out of an error too")
    assert serialize.typing is typing


def _plain(value: Any) -> Any:
    """A schema object as nested builtins, read from its fields (2.6/2.7 one-ofs raise on ``==``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, {name: _plain(field) for name, field in vars(value).items()})
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


class _NonFinite(torch.nn.Module):
    """Float arguments JSON cannot hold: torch writes them as the words "NaN", "Infinity" and "-Infinity"."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, torch.full_like(x, float("nan")), x).clamp(float("-inf"), float("inf"))


def test_float_fields_keep_torchs_words_for_nan_and_infinity_and_nothing_else(tmp_path: Path) -> None:
    """The three words torch writes for non-finite floats pass the strict reader unchanged, and the file loads and
    computes; any other string in a float field (another spelling ``float()`` would also take) is refused, naming
    the field."""
    x = torch.tensor([[-1.0, 2.0], [3.0, -4.0]])
    path = tmp_path / "non_finite.pt2"
    torch.export.save(torch.export.export(_NonFinite(), (x,)), path)
    name, original = _program_entry(path)
    # torch 2.5 writes them bare (Python's JSON extension: read back as floats), later torches as strings.
    quoted = b'"NaN"' in original
    words = (b'"NaN"', b'"-Infinity"', b'"Infinity"') if quoted else (b"NaN", b"-Infinity", b"Infinity")
    for word in words:
        assert word in original, word  # (the structure: torch's own spellings in the file)
    document = canonical_bytes(canonical_document(json.loads(original), path, name))
    for word in words:
        assert word in document, word
    assert quoted or b'"NaN"' not in document  # (each as torch spells it)
    loaded = trt_inline.load(path)
    assert torch.equal(loaded.module()(x).isnan(), _NonFinite()(x).isnan())
    assert torch.equal(loaded.module()(x).nan_to_num(), _NonFinite()(x).nan_to_num())

    entries = read_entries(path)
    for other in (b'"nan"', b'"inf"', b'"1e308"', b'"  NaN"'):
        crafted = dict(entries)
        crafted[name] = original.replace(b'"NaN"' if quoted else b": NaN", other if quoted else b": " + other, 1)
        bad = write_entries(tmp_path / "crafted.pt2", crafted)
        with pytest.raises(trt_inline.UnsafeArchiveError, match="expected a number, found str"):
            trt_inline.load(bad)
