"""A call's arguments reach a program's placeholders as its generated forward flattens them, in every run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.hostile import entry_named, rewrite

import trt_inline
from trt_inline import reference
from trt_inline.archive import REFERENCE_IO_FILE, decode_reference_io, encode_reference_io
from trt_inline.errors import SaveError, VerifyInputError
from trt_inline.verify.boundaries import trace_program
from trt_inline.verify.checked_run import ProgramInputs, checking


class _Asymmetric(torch.nn.Module):
    """Swapping any two of its inputs changes its result."""

    def forward(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], *, scale: torch.Tensor) -> torch.Tensor:
        return (x * 2 - inputs["a"]) * 3 + inputs["b"] * scale


def _program() -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    x, a, b, scale = (torch.full((2, 3), float(v)) for v in (1, 10, 100, 1000))
    exported = torch.export.export(_Asymmetric(), (x, {"a": a, "b": b}), {"scale": scale})
    return exported.module(), (x, a, b, scale)


def test_dict_keys_and_keywords_in_the_callers_order_reach_the_right_placeholders() -> None:
    module, (x, a, b, scale) = _program()
    expected = _Asymmetric()(x, {"a": a, "b": b}, scale=scale)
    placeholders = [n.name for n in module.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 4, placeholders  # (the structure under test: four flat inputs)
    swapped = {"b": b, "a": a}  # the caller's key order, not the exported one
    flat = ProgramInputs(module).flatten((x, swapped), {"scale": scale})
    assert [float(t[0, 0]) for t in flat] == [1.0, 10.0, 100.0, 1000.0]

    try:
        module(x, swapped, scale=scale)
    except ValueError:  # (torch 2.5's program refuses a dict in another key order: so must every run of it)
        with pytest.raises(VerifyInputError, match="does not accept the inputs"):
            trace_program(module, [x, swapped], {"scale": scale}, None)
        return
    trace = trace_program(module, [x, swapped], {"scale": scale}, None)
    assert trace.crash is None
    assert torch.equal(trace.outputs[0], expected), (trace.outputs[0], expected)

    with checking(module, None, "the test") as check:
        returned = module(x, swapped, scale=scale)
    assert check is not None and check.declared.summary() == []
    assert torch.equal(returned, expected)


class _ThreeInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2 + y - z


@pytest.mark.parametrize("retrace", [True], ids=["retrace"])
def test_keyword_inputs_in_another_order_than_the_signature_are_saved_by_name(tmp_path: Path, retrace: bool) -> None:
    """``kwarg_inputs={"z": z, "y": y}`` for ``forward(x, y, z)``: the saved program still computes ``y - z``."""
    torch.manual_seed(0)
    x, y, z = torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 4)
    model = _ThreeInputs().eval()
    compiled = reference.compile(model, (x, y, z), torch_executed_ops=[torch.ops.aten.relu.default])
    assert any(name.startswith("_run_on_acc_") for name, _ in compiled.named_children())  # an engine is there
    path = tmp_path / "keywords.pt2"
    if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 6):
        with pytest.raises(SaveError, match="cannot export the flattened module with keyword inputs"):
            trt_inline.save(compiled, path, arg_inputs=[x], kwarg_inputs={"z": z, "y": y}, retrace=retrace)
        return  # (torch 2.5's export hands keywords to the GraphModule's interpreter: a clear refusal there)
    trt_inline.save(compiled, path, arg_inputs=[x], kwarg_inputs={"z": z, "y": y}, retrace=retrace)
    loaded = torch.export.load(path).module()
    assert torch.allclose(loaded(x, y=y, z=z), model(x, y, z))
    report = trt_inline.verify(path, random_inputs=2)  # (the embedded reference, in a fresh child process)
    assert report.ok, report.to_text()
    assert len(report.random_runs) == 2 and not any(run.get("problem") for run in report.random_runs), report.to_text()
    other = trt_inline.diff(path, path, random_inputs=2)  # (random draws passed by keyword, as a call does)
    assert other.ok, other.to_text()


def test_a_trace_refuses_inputs_the_program_itself_refuses() -> None:
    """A dict input with a key missing or one too many: the program's own input check, not a trace that drops it."""
    module, (x, a, b, scale) = _program()
    for given in ({"a": a}, {"a": a, "b": b, "c": b}):
        with pytest.raises(VerifyInputError, match="does not accept the inputs"):
            trace_program(module, [x, given], {"scale": scale}, None)
        with pytest.raises(Exception, match="flatten user inputs"):  # (what the program itself says)
            module(x, given, scale=scale)


def test_a_file_whose_own_inputs_do_not_fit_fails_not_errors(tmp_path: Path) -> None:
    """Reference inputs a file carries are the file's: a program that refuses them fails verify (exit 1)."""
    torch.manual_seed(0)
    x, y, z = torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 4)
    model = _ThreeInputs().eval()
    compiled = reference.compile(model, (x, y, z), torch_executed_ops=[torch.ops.aten.relu.default])
    good, forged = tmp_path / "good.pt2", tmp_path / "forged.pt2"
    trt_inline.save(compiled, good, arg_inputs=[x, y, z])

    def one_input_gone(entries: dict[str, bytes]) -> None:
        name = entry_named(entries, REFERENCE_IO_FILE)
        carried = decode_reference_io(entries[name].decode())
        assert len(carried.args) == 3  # (the structure under test: the inputs carried)
        carried.args = carried.args[:2]  # one input the program needs gone
        entries[name] = encode_reference_io(carried).encode()

    rewrite(good, forged, one_input_gone)
    report = trt_inline.verify(forged)
    assert not report.ok
    assert report.problems[0].startswith("the program raises on its reference inputs"), report.problems
