"""Every run holds a checked operator to its run checks (``allowed_ops.RUN_CHECKS``), wherever the program runs.

A checked operator (``repeat_interleave`` with ``output_size``, ``segment_reduce``, ``embedding_bag``, ...) writes
past its result when its arguments are out of range. verify checks the values each call is given in its first,
checked call; these tests hold the other runs to the same checks: the inference-mode and layout runs of verify
and ``diff``, the range-end and random runs, and a reference engine's steps wherever its file is loaded
(``torch.export.load`` without verify, ``trt_inline.load``). A refusal names the run and the operator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support.hostile import edit_engine, short_batch
from support.processes import new_interpreter
from support.programs import SavedSeed
from support.verdicts import repeat_interleave_program

from trt_inline import allowed_ops
from trt_inline.errors import RefusedOperatorError
from trt_inline.verify.compare import run_on


def test_every_run_of_verify_holds_the_checked_operators_to_their_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The normal call, the inference-mode run and the layout run each check every call they make (counted), and
    the same kernels compute the same bits as the generated code."""
    checked: list[tuple[str, bool]] = []
    real = allowed_ops.check_run

    def counting(target: Any, args: Any, kwargs: Any, **options: Any) -> None:
        checked.append((str(target), torch.is_inference_mode_enabled()))
        real(target, args, kwargs, **options)

    monkeypatch.setattr(allowed_ops, "check_run", counting)
    program = repeat_interleave_program([2, 0, 1])
    x = torch.randn(4)
    with allowed_ops.allowing(()):
        run = run_on(program, [x], {}, None, layouts=True)
    assert run.problems == [], run.problems
    calls = [name for name, _ in checked if "repeat_interleave" in name]
    assert len(calls) == 3, checked  # (the checked call, the inference-mode run, the layout run)
    assert any(inference for name, inference in checked if "repeat_interleave" in name)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(run.outputs, program(x), strict=True))


def test_a_refusal_in_a_later_run_names_the_run_and_the_operator() -> None:
    """A program whose values differ between runs (here a pre-hook stands for what differs: the thread count, the
    inputs' layout) hands the checked operator out-of-range arguments in a later run only: refused there, naming
    that run; and diff's runs after its traced call (``checked=False``) are checked as well."""

    def later_runs_out_of_range(calls: list[int]) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            calls.append(1)
            module.repeats.copy_(torch.tensor([2, 0, 1] if len(calls) == 1 else [5, -3, 1]))

        return hook

    for checked, run in ((True, "under torch.inference_mode()"), (False, "as a normal call (grad mode on)")):
        program, calls = repeat_interleave_program([2, 0, 1]), []
        program.register_forward_pre_hook(later_runs_out_of_range(calls))
        if not checked:
            calls.append(1)  # (diff: its traced call was the first)
        with allowed_ops.allowing(()), pytest.raises(RefusedOperatorError) as refused:
            run_on(program, [torch.randn(4)], {}, None, checked=checked, run_name="on the given inputs")
        message = str(refused.value)
        assert message.startswith(f"its run on the given inputs {run}: calls "), message
        assert "aten::repeat_interleave.Tensor with repeats that are negative or do not sum to its output_size=3" in (
            message
        )


_RUN = """
import sys, torch
import trt_inline
path, how = sys.argv[1], sys.argv[2]
program = torch.export.load(path) if how == "torch" else trt_inline.load(path)
try:
    program.module()(torch.load(sys.argv[3]))
except Exception as exc:
    print(type(exc).__name__, str(exc).splitlines()[0])
    raise SystemExit(3)
print("ran")
"""


@pytest.mark.heavy
@pytest.mark.parametrize("how", ["torch", "trt_inline"])
def test_a_reference_engine_checks_its_steps_wherever_its_file_is_loaded(
    saved_seed: SavedSeed, tmp_path: Path, how: str
) -> None:
    """Installing trt-inline never lets a file's engine do what verify refuses: under a plain ``torch.export.load``
    (the entry point's operator) and under ``trt_inline.load``, the step out of range is refused in one line, the
    process not aborted; the same step in range runs."""
    short = edit_engine(saved_seed.good, tmp_path / "short.pt2", short_batch(1))
    fine = edit_engine(saved_seed.good, tmp_path / "fine.pt2", short_batch(4))
    inputs = tmp_path / "x.pt"
    torch.save(saved_seed.x, inputs)
    proc = new_interpreter("-c", _RUN, str(short), how, str(inputs), timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # (refused, not killed by a signal)
    assert proc.stdout.startswith(
        "RefusedOperatorError "
    ) and "aten::segment_reduce.default with lengths of shape " in (proc.stdout), proc.stdout
    proc = new_interpreter("-c", _RUN, str(fine), how, str(inputs), timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stdout + proc.stderr


class _SumGated(torch.nn.Module):
    """Repeats in range only where ``x.sum()`` is exactly ``total`` (its value over the sample inputs, contiguous):
    on the same values laid out as strided views, the sum adds in another order and the repeats go out of range.
    ``total=None``: the repeats in range always (the honest twin)."""

    def __init__(self, total: float | None) -> None:
        super().__init__()
        self.total = total
        self.register_buffer("good", torch.tensor([2, 0, 1]))
        self.register_buffer("bad", torch.tensor([5000, -4998, 1]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        repeats = self.good if self.total is None else torch.where(x.sum() == self.total, self.good, self.bad)
        return x + 1, torch.ops.aten.repeat_interleave.Tensor(repeats, output_size=3)


def test_a_file_whose_later_run_goes_out_of_range_is_refused_in_one_line_in_every_mode(tmp_path: Path) -> None:
    """The crafted file (before: its unchecked layout run handed repeat_interleave repeats that write past its
    result; the child died of a signal in every mode): each mode now refuses it in one line naming the operator
    and the argument, in the run that met them."""
    from support.verdicts import inputs_and_cases, modes

    import trt_inline

    torch.manual_seed(0)
    x = torch.randn(64, 64)
    big = torch.zeros(64, 80)
    big[:, :64] = x
    assert not torch.equal(big[:, :64].sum(), x.sum())  # (the structure: the layout changes the sum's bits)
    crafted, honest = tmp_path / "crafted.pt2", tmp_path / "honest.pt2"
    trt_inline.save(torch.export.export(_SumGated(float(x.sum())), (x,)), crafted, arg_inputs=(x,))
    trt_inline.save(torch.export.export(_SumGated(None), (x,)), honest, arg_inputs=(x,))
    root = tmp_path / "root"
    root.mkdir()
    inputs_and_cases(root, x, list(_SumGated(None)(x)))
    for mode, (code, out) in modes(crafted, honest, root, tmp_path).items():
        assert code == 2, (mode, out)
        assert "calls aten::repeat_interleave.Tensor with repeats that are negative" in out, (mode, out)
        assert "its run " in out and "signal" not in out, (mode, out)
