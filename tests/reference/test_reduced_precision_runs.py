"""The run on strided views with fewer threads, for engines that compute in reduced precision.

An fp16 engine rounds each value it stores to fp16, and a sum made in another order by fewer threads can round
the other way: one unit in the last place of fp16 is about 1e-3 relative, past fp32's tolerance. Verify's and
diff's run :data:`~trt_inline.verify.compare.LAYOUT_RUN` holds such a program's outputs to its engines'
precision's relative tolerance (float16: rtol 1e-2), saying so in a note; a program that computes otherwise on
that run is still named; only the relative tolerance is widened (an output's own atol holds, a float64 output
keeps its own tolerance). Whether the thread count moves a rounding depends on the model's size and the machine, so the
engines here are made to move it: on the layout run (while the threads are halved) each engine's output is
nudged by one fp16 step, or, for the program that computes otherwise, by 1.0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from support.models import TransformerBlock
from support.pairs import autocast_skip, fp16_settings

import trt_inline
from trt_inline.reference.program import EngineProgram
from trt_inline.verify.compare import LAYOUT_RUN, engine_precision, modes_disagree

pytestmark = pytest.mark.skipif(autocast_skip() is not None, reason=autocast_skip() or "")


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reduced")
    torch.manual_seed(0)
    model, x = TransformerBlock().eval(), torch.randn(2, 8, 32)
    files = {}
    for name, settings in (("fp32", {}), ("fp16", fp16_settings())):
        compiled = trt_inline.reference.compile(model, (x,), **settings)
        files[name] = root / f"{name}.pt2"
        trt_inline.save(compiled, files[name], arg_inputs=[x])
    return files


@pytest.fixture
def nudged(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Engines whose outputs move by ``step[0]`` (relative, or absolute where ``step[1]``) on the layout run: the
    run between the two ``torch.set_num_threads`` calls it makes."""
    step = [0.0, 0.0]
    layout = [False]
    stock_threads, stock_run = torch.set_num_threads, EngineProgram.run

    def set_num_threads(count: int) -> None:
        layout[0] = not layout[0]  # (halved, then put back)
        stock_threads(count)

    def run(self: EngineProgram, inputs: Sequence[torch.Tensor], payload: torch.Tensor) -> list[torch.Tensor]:
        outputs = stock_run(self, inputs, payload)
        if not layout[0]:
            return outputs
        return [o * (1 + step[0]) + step[1] if o.is_floating_point() else o for o in outputs]

    monkeypatch.setattr(torch, "set_num_threads", set_num_threads)
    monkeypatch.setattr(EngineProgram, "run", run)
    yield step


def test_the_engines_precision_is_read_from_their_programs(builds: dict[str, Path]) -> None:
    assert engine_precision(trt_inline.load(builds["fp16"]).module()) is torch.float16
    assert engine_precision(trt_inline.load(builds["fp32"]).module()) is None
    one_step = [torch.tensor([1.0, 2.0]) * (1 + 2**-10)]
    assert modes_disagree([torch.tensor([1.0, 2.0])], one_step, "a", "b", exact=False)  # (past fp32's tolerance)
    assert not modes_disagree([torch.tensor([1.0, 2.0])], one_step, "a", "b", exact=False, at=torch.float16)
    assert modes_disagree([torch.tensor([1.0, 2.0])], [torch.tensor([2.0, 3.0])], "a", "b", exact=False,
                          at=torch.float16)  # fmt: skip
    # Relative only: a small value rewritten (1e-3 to 2e-3) is past float32's atol whatever the precision; a
    # float64 output keeps its own tolerance.
    small = [torch.tensor([1e-3, 1.0])]
    assert modes_disagree(small, [torch.tensor([2e-3, 1.0])], "a", "b", exact=False, at=torch.bfloat16)
    wide = [torch.tensor([1.0, 2.0], dtype=torch.float64)]
    assert modes_disagree(wide, [w * (1 + 2**-10) for w in wide], "a", "b", exact=False, at=torch.float16)


def test_an_fp16_build_whose_roundings_move_passes_with_a_note(builds: dict[str, Path], nudged: list[float]) -> None:
    nudged[0] = 2**-10  # (one fp16 step at 1.0)
    report = trt_inline.verify(builds["fp16"], isolate=False)
    assert report.status == "PASS", report.to_text()
    assert any(note.startswith(f"its run {LAYOUT_RUN} was compared within float16's relative tolerance") for note in
               report.notes), report.to_text()  # fmt: skip
    # An fp32 build moved alike is named: its engines compute in fp32.
    report = trt_inline.verify(builds["fp32"], isolate=False)
    assert report.status == "FAIL" and f"and a run {LAYOUT_RUN}" in " ".join(report.problems), report.to_text()


def test_an_fp16_build_that_computes_otherwise_on_the_run_is_named(
    builds: dict[str, Path], nudged: list[float]
) -> None:
    nudged[1] = 1.0
    report = trt_inline.verify(builds["fp16"], isolate=False)
    assert report.status == "FAIL", report.to_text()
    assert any(f"differs between a run as a normal call (grad mode on) and a run {LAYOUT_RUN}" in problem
               for problem in report.problems), report.to_text()  # fmt: skip
