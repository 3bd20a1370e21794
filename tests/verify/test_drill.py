"""Down to the op: inside the first divergent engine, the first op whose own error crosses its tolerance.

One nested model (``Net``: a stem, three stages of layer norm, linear, a gain and its inverse, tanh and a
residual, a head) compiles into one reference engine of 28 ops; its fp16 build into one of 148 (the roundings
the build inserts). Saved with the fp32 build's boundary data, the fp16 build's engine diverges and the drill
names the op that overflows float16, its module path and the line of this file it was traced from. A gain
altered in the saved fp32 program overflows float32 the same way; a weight moved in the payload does not make
any op lose precision, and no op is named; a TensorRT engine has no op-level program.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from support.commands import cli
from support.hostile import edit_engine, reference_io_text
from support.pairs import fp16_settings
from support.programs import engine_calls
from torch import nn

import trt_inline
from trt_inline.archive import REFERENCE_IO_FILE, EngineBoundary
from trt_inline.engines import CROSS_COMPILE_OP, REFERENCE_OP, TENSORRT_OP
from trt_inline.errors import EngineFormatError
from trt_inline.reference.program import FORMAT, EngineProgram, load_program
from trt_inline.verify.boundaries import EngineCall, ProgramTrace, trace_program
from trt_inline.verify.compare import Criteria
from trt_inline.verify.drill import NO_PROGRAM, drill_call, op_level_program, own_errors
from trt_inline.verify.localize import Reference, localize
from trt_inline.verify.report import VerifyReport


class Boost(nn.Module):
    """A gain and its inverse: with a large gain, an activation past the fp16 range brought back down."""

    def __init__(self, gain: float) -> None:
        super().__init__()
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = x * self.gain
        return big / self.gain


class Stage(nn.Module):
    def __init__(self, width: int, gain: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)
        self.boost = Boost(gain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.boost(self.fc(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.stages = nn.Sequential(Stage(32, 4.0), Stage(32, 1e5), Stage(32, 4.0))  # stages.1: past 65504
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def _gain_line() -> str:
    """``test_drill.py:N in forward: big = x * self.gain``: where this file computes the gain, as reports say it."""
    lines, start = inspect.getsourcelines(Boost.forward)
    offset = next(i for i, line in enumerate(lines) if "big = x * self.gain" in line)
    return f"{Path(__file__).name}:{start + offset} in forward: big = x * self.gain"


@dataclass
class Files:
    root: Path
    x: torch.Tensor
    good: Path  # the fp32 build, saved with its boundary data
    half: Path  # the fp16 build, saved with the fp32 build's boundary data: its engine diverges


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    root = tmp_path_factory.mktemp("op_drill")
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(8, 16) * 3
    good, half = root / "good.pt2", root / "half.pt2"
    trt_inline.save(trt_inline.reference.compile(model, (x,)), good, arg_inputs=[x], embed_reference="boundaries")
    fp16 = trt_inline.reference.compile(model, (x,), **fp16_settings())
    trt_inline.save(fp16, root / "fp16.pt2", arg_inputs=[x])
    torch.export.save(
        torch.export.load(root / "fp16.pt2"), half, extra_files={REFERENCE_IO_FILE: reference_io_text(good)}
    )
    return Files(root, x, good, half)


def _engine(path: Path) -> tuple[torch.fx.Node, EngineProgram]:
    """The file's one engine call and its program (structure first: there is exactly one)."""
    calls = engine_calls(torch.export.load(path))
    assert len(calls) == 1, [c.name for c in calls]
    return calls[0], load_program(calls[0].args[2])


def program_text(path: Path) -> str:
    text = _engine(path)[0].args[2]
    assert isinstance(text, str)
    return text


def _steps(program: EngineProgram, name: str, module: str) -> list[int]:
    """The steps calling ``name`` that a module at path ``module`` computes."""
    names, origins = program.step_names(), program.step_origins()
    return [i for i, (n, o) in enumerate(zip(names, origins, strict=True)) if n == name and o.module == module]


def test_an_fp16_build_names_the_op_that_overflows_float16(files: Files) -> None:
    _, program = _engine(files.half)
    assert len(program.steps) >= 20
    (gain,) = _steps(program, "aten::mul.Tensor", "stages.1.boost (Boost)")
    assert program.step_origins()[gain].source == _gain_line()
    first = program.num_inputs + len(program.weights)
    stores = [i for i, n in enumerate(program.step_names()) if n == "aten::_to_copy.default"]
    (rounding,) = [i for i in stores if program.step_reads(i) == [first + gain]]  # the build's float16 store of it
    assert not program.step_origins()[rounding].module  # (inserted: no module path of its own)

    report = trt_inline.verify(files.half, per_engine=True)  # (in the sandboxed child)
    assert report.status == "FAIL" and report.divergence is not None and report.divergence.kind == "engine"
    drill = report.divergence.op_drill
    assert drill is not None, report.to_text()
    assert (drill.step, drill.op) == (rounding, "aten::_to_copy.default"), drill
    assert (drill.module, drill.source) == ("stages.1.boost (Boost)", _gain_line())
    assert f"step {rounding} of {len(program.steps)} (aten::_to_copy.default, which the build inserted, on the " \
           f"result of step {gain}, aten::mul.Tensor)" in drill.summary  # fmt: skip
    assert "Inf where the reference is finite in float16" in drill.summary and "more after it" not in drill.summary
    text = report.to_text()
    assert f"    module: stages.1.boost (Boost)\n    source: {_gain_line()}" in text, text
    again = VerifyReport.from_dict(json.loads(report.to_json()))
    assert again.divergence is not None and again.divergence.op_drill == drill

    # The same engine in diff, against the fp32 build.
    compared = trt_inline.diff(files.half, files.good)
    assert compared.divergence is not None and compared.divergence.op_drill == drill


def test_each_op_is_held_to_its_own_error_not_the_one_it_inherits(files: Files) -> None:
    """After the overflow every value downstream differs from the fp32 run, yet only the store that overflows has
    an own error past tolerance: each op is run again on its inputs as the engine computed them."""
    _, program = _engine(files.half)
    (call,) = trace_program(trt_inline.load(files.half).module(), [files.x], {}, None).calls
    assert call.op is REFERENCE_OP and call.engine[1] == program_text(files.half)
    errors = own_errors(program, call.engine[0], call.inputs)
    assert len(errors) == len(program.steps)
    past = [e.step for e in errors if e is not None and not e.ok]
    (gain,) = _steps(program, "aten::mul.Tensor", "stages.1.boost (Boost)")
    assert len(past) == 1 and program.step_reads(past[0]) == [program.num_inputs + len(program.weights) + gain]
    measured = [e for e in errors if e is not None]
    assert len(measured) >= len(program.steps) - 5 and all(e.ok for e in measured if e.step != past[0])


@pytest.mark.parametrize("divisor", [1e39, 4.0])
def test_verify_per_engine_names_a_planted_op_and_its_source_line(files: Files, tmp_path: Path, divisor: float) -> None:
    """stages.2's gain (and, with ``divisor`` 1e39, its inverse) altered in the saved fp32 program to one float32
    cannot hold: that op overflows float32. With its inverse altered alike, the overflow is what the outputs lose
    (x * 1e39 / 1e39 is x in float64): the op is named, with how far its float64 value moves the outputs. With the
    inverse left at 4, x * 1e39 / 4 gives tanh 1 either way: the overflow changes no output, the op is passed
    over, and the drill says the program differs."""
    _, program = _engine(files.good)
    assert len(program.steps) >= 20
    gains = _steps(program, "aten::mul.Tensor", "stages.2.boost (Boost)")
    assert len(gains) == 1 and program.step_origins()[gains[0]].source == _gain_line()
    (inverse,) = [i for i in _steps(program, "aten::div.Tensor", "stages.2.boost (Boost)")]

    def plant(document: dict[str, Any]) -> None:
        step = document["steps"][gains[0]]
        assert step["args"][1] == 4.0 and step["origin"][0] == "stages.2.boost (Boost)", step
        step["args"][1] = 1e39
        assert document["steps"][inverse]["args"][1] == 4.0, document["steps"][inverse]
        document["steps"][inverse]["args"][1] = divisor

    planted = edit_engine(files.good, tmp_path / "planted.pt2", plant)
    proc = cli("verify", str(planted), "--per-engine")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "first divergence: engine 0 (" in proc.stdout, proc.stdout
    step = f"step {gains[0]} of {len(program.steps)} (aten::mul.Tensor)"
    if divisor == 4.0:
        assert (
            "  inside it: the own error of one op crosses its tolerance and reaches none of the engine's outputs: "
            f"with its float64 value put back, the outputs do not move ({step}: a value no output depends on"
        ) in proc.stdout, proc.stdout
        assert "the program or its weights differ from the reference's" in proc.stdout
        return
    assert (
        f"  inside it: {step} is the first op whose own error crosses its tolerance and reaches the engine's outputs: "
    ) in proc.stdout, proc.stdout
    assert "Inf where the reference is finite in float32" in proc.stdout
    assert "with its float64 value put back, the outputs move by up to " in proc.stdout
    assert f"    module: stages.2.boost (Boost)\n    source: {_gain_line()}\n" in proc.stdout, proc.stdout


def test_a_clean_engine_names_no_op(files: Files, tmp_path: Path) -> None:
    module = trt_inline.load(files.good).module()
    trace = trace_program(module, [files.x], {}, None)
    assert len(trace.calls) == 1 and trace.calls[0].op is REFERENCE_OP
    drill = drill_call(trace.calls[0])
    assert drill is not None and drill.step is None and not drill.module, drill
    assert drill.summary.startswith("no op's own error crosses its tolerance: each of the "), drill.summary

    # A weight moved in the payload: the engine diverges, and every op still computes what it says exactly.
    source = torch.export.load(files.good)
    node = engine_calls(source)[0]
    weight = json.loads(node.args[2])["weights"][0]
    constant = next(s.target for s in source.graph_signature.input_specs if s.arg.name == node.args[1].name)
    payload = source.constants[constant]
    payload[weight["offset"] : weight["offset"] + weight["nbytes"]].view(torch.float32).add_(0.05)
    moved = tmp_path / "moved.pt2"
    torch.export.save(source, moved, extra_files={REFERENCE_IO_FILE: reference_io_text(files.good)})
    report = trt_inline.verify(moved, per_engine=True, isolate=False)
    assert report.divergence is not None and report.divergence.kind == "engine", report.to_text()
    assert report.divergence.op_drill is not None and report.divergence.op_drill.step is None
    assert "the program or its weights differ from the reference's" in report.divergence.op_drill.summary


def test_a_tensorrt_engine_has_no_op_level_program() -> None:
    assert op_level_program(TENSORRT_OP, (object(),)) == NO_PROGRAM
    assert op_level_program(CROSS_COMPILE_OP, ("abi", "name", b"plan")) == NO_PROGRAM
    assert op_level_program(None, ()) is None
    text = json.dumps({"format": FORMAT, "inputs": 1, "weights": [], "steps": [], "outputs": [0]})
    payload = torch.zeros(0, dtype=torch.uint8)
    assert isinstance(op_level_program(REFERENCE_OP, (payload, text)), EngineProgram)
    broken = op_level_program(REFERENCE_OP, (payload, "{"))
    assert isinstance(broken, str) and broken.startswith(
        "its program does not decode (engine program is not valid JSON"
    )

    # Localization of a run whose TensorRT engine diverges: the report says so in one line.
    x, out = torch.ones(2), torch.full((2,), 2.0)
    call = EngineCall(0, "execute_engine", "_run_on_acc_0", [x], [out], ["x (user input)"], [], ["OUTPUT"])
    call.op, call.engine = TENSORRT_OP, (object(),)
    trace = ProgramTrace([call], [out], ["engine 0 output 0"], [])
    reference = Reference("the compiled module", [EngineBoundary("_run_on_acc_0", [x], [torch.ones(2)])], [x])
    _, divergence = localize(trace, reference, Criteria())
    assert divergence is not None and divergence.kind == "engine" and divergence.op_drill is not None
    assert divergence.op_drill.summary == NO_PROGRAM and divergence.op_drill.step is None
    assert [line for line in divergence.to_text().splitlines() if "inside it" in line] == [f"  inside it: {NO_PROGRAM}"]


def test_a_step_origin_is_read_as_text_from_a_file() -> None:
    def program(origin: Any) -> str:
        step = {"target": "aten::relu.default", "args": [{"ref": 0}], "kwargs": {}, "origin": origin}
        return json.dumps({"format": FORMAT, "inputs": 1, "weights": [], "steps": [step], "outputs": [1]})

    (origin,) = load_program(program(["a (A)", "m.py:3 in forward: \x1b[2Jy = x"])).step_origins()
    assert origin.module == "a (A)" and origin.source == "m.py:3 in forward: \\x1b[2Jy = x"
    for bad in (["only one"], [1, 2], "a (A)"):
        with pytest.raises(EngineFormatError, match="step origin"):
            load_program(program(bad))
    assert load_program(program(None)).step_origins()[0].describe() == ""


def test_a_report_with_an_op_drill_is_read_strictly() -> None:
    data = {
        "source": "f.pt2", "problems": [], "notes": [], "outputs": [], "expected_source": "embedded",
        "divergence": {"kind": "engine", "where": "engine 0 (_run_on_acc_0)", "detail": "d",
                       "op_drill": {"summary": "s", "step": 3, "op": "aten::mul.Tensor", "module": "m", "source": ""}},
    }  # fmt: skip
    report = VerifyReport.from_dict(data)
    assert report.divergence is not None and report.divergence.op_drill is not None
    assert report.divergence.op_drill.step == 3
    for field, value in (("step", -1), ("step", "3"), ("module", 4), ("extra", "x")):
        bad = json.loads(json.dumps(data))
        bad["divergence"]["op_drill"][field] = value
        with pytest.raises(ValueError, match="op_drill"):
            VerifyReport.from_dict(bad)


class _Square(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * h


class MaskedAttention(nn.Module):
    """Attention with a causal mask built from float32's minimum (as transformers builds one), which an fp16 build
    stores as -inf: an op past its tolerance that changes no output (exp gives 0 either way); ``planted``: an
    activation past fp16's range after it (``spot``), which does."""

    def __init__(self, planted: bool) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.spot, self.planted = _Square(), planted

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        scores = self.q(x) @ self.k(x).transpose(-1, -2)
        mask = torch.full((length, length), torch.finfo(torch.float32).min).triu(1)
        out = torch.softmax(scores + mask, -1) @ self.v(x)
        return self.spot(out * 300.0) / 1e5 if self.planted else out


@pytest.mark.parametrize("planted", [False, True])
def test_an_op_whose_error_reaches_no_output_is_passed_over(tmp_path: Path, planted: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    path = tmp_path / "masked.pt2"
    trt_inline.save(trt_inline.reference.compile(MaskedAttention(planted).eval(), (x,), **fp16_settings()), path,
                    arg_inputs=[x])  # fmt: skip
    (call,) = trace_program(trt_inline.load(path).module(), [x], {}, None).calls
    program = load_program(call.engine[1])
    first = program.num_inputs + len(program.weights)
    (mask,) = [i for i, name in enumerate(program.step_names()) if name == "aten::_to_copy.default"
               and program.step_reads(i)[0] - first >= 0
               and program.step_names()[program.step_reads(i)[0] - first] == "aten::full.default"]  # fmt: skip
    errors = own_errors(program, call.engine[0], call.inputs)
    assert errors[mask] is not None and not errors[mask].ok, errors[mask]  # (the structure: the mask is past it)
    drill = drill_call(call)
    assert drill is not None
    mask_text = f"step {mask} of {len(program.steps)} (aten::_to_copy.default, which the build inserted, on the result"
    if not planted:
        assert drill.step is None, drill
        assert drill.summary.startswith(
            "the own error of one op crosses its tolerance and reaches none of the engine's outputs: with its float64 "
            f"value put back, the outputs do not move ({mask_text}"
        ), drill.summary
        return
    assert drill.module == "spot (_Square)" and drill.op == "aten::_to_copy.default", drill
    assert "is the first op whose own error crosses its tolerance and reaches the engine's outputs" in drill.summary
    assert "with its float64 value put back, the outputs move by up to " in drill.summary, drill.summary
    assert f"; passed over: {mask_text}" in drill.summary, drill.summary


def test_the_reach_of_an_op_counts_every_kind_of_output() -> None:
    """An index or a mask that changes, or a shape, reaches the outputs whatever its size; a float within its
    dtype's tolerance does not."""
    from trt_inline.verify.drill import _moved

    kinds = [torch.float32, torch.int64, torch.bool]
    same = [torch.ones(3), torch.tensor([1, 4, 0]), torch.tensor([True, False, True])]
    assert _moved(same, [t.clone() for t in same], kinds) == (0.0, False)
    assert _moved(same, [same[0], torch.tensor([4, 4, 0]), same[2]], kinds)[1]
    assert _moved(same, [same[0], same[1], torch.tensor([True, True, True])], kinds)[1]
    assert _moved(same, [torch.ones(4), same[1], same[2]], kinds)[1]
    assert not _moved(same, [same[0] * (1 + 1e-6), same[1], same[2]], kinds)[1]
