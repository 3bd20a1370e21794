"""Verdicts that hold, round five: size expressions bounded before anything evaluates them.

torch's deserializer hands a file's size expressions to ``sympify`` (which evaluates constant arithmetic as it
parses) and runs its guards on every call; trt-inline's engines fold their own scalar expressions. An expression
such as ``9**9**9`` is now refused by its shape, in one line, before any of them runs: not left to the child's
time and memory limits. (The other classes of the round have their tests beside the code they guard:
``test_run_checks.py`` (every run, the engine op wherever it runs), ``test_compare_exact.py`` (complex parts)
and ``test_check_crafted.py``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support.hostile import edit_engine, edit_program
from support.programs import SavedSeed
from support.verdicts import inputs_and_cases, modes

import trt_inline
from trt_inline.archive.program_checks import check_expression, check_guard
from trt_inline.errors import EngineFormatError, RefusedOperatorError, UnsafeArchiveError
from trt_inline.inlining import symbolic

_TOWER = "Pow(Integer(9), Pow(Integer(9), Integer(9)))"
GUARDS_FIELD = [True]  # whether this torch's program document has guards_code (set where the craft is made)


class _Twice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


@pytest.fixture(scope="module")
def towers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("towers")
    x = torch.arange(6.0).reshape(2, 3)
    honest = root / "honest.pt2"
    trt_inline.save(torch.export.export(_Twice(), (x,)), honest, arg_inputs=(x,))
    inputs_and_cases(root, x, [_Twice()(x)])

    def tower_constraint(document: dict[str, Any]) -> None:
        document["range_constraints"][_TOWER] = {"min_val": 2, "max_val": 8}

    def tower_guard(document: dict[str, Any]) -> None:
        GUARDS_FIELD[0] = "guards_code" in document  # (torch 2.5's schema has no such field)
        document["guards_code"] = ["L['x'].size()[0] ** 999999999 > 0"]

    return {
        "honest": honest,
        "root": root,
        "constraint": edit_program(honest, root / "constraint.pt2", tower_constraint),
        "guard": edit_program(honest, root / "guard.pt2", tower_guard),
    }


@pytest.mark.parametrize(
    ("craft", "said"),
    [
        ("constraint", "a size expression raising to a computed power"),
        ("guard", "a guard whose values may exceed 65536 bits"),
    ],
)
def test_a_tower_of_powers_is_refused_by_its_shape_in_every_mode(
    towers: dict[str, Path], craft: str, said: str, tmp_path: Path
) -> None:
    """Before: the expression passed the syntax check (every name one sympy's printer uses) and torch's loader
    evaluated it until the child's limits ended the run; now every mode is exit 2, naming it, in seconds."""
    assert trt_inline.verify(towers["honest"], isolate=False).ok
    if craft == "guard" and not GUARDS_FIELD[0]:  # (a field this torch's schema lacks: refused as one)
        said = "ExportedProgram has no field 'guards_code'"
    for mode, (code, out) in modes(towers[craft], towers["honest"], towers["root"], tmp_path).items():
        assert code == 2, (mode, out)
        assert said in out, (mode, out)
    with pytest.raises(UnsafeArchiveError, match=said):
        trt_inline.load(towers[craft])


@pytest.mark.parametrize(
    "text",
    [
        "9**9**9",
        _TOWER,
        "PowByNatural(s0, s1)",
        "1 << 10**9",
        "LShift(Integer(1), Integer(100000))",
        "((s0*2)**64)**64",
        "FloatPow(Float(2.0), Integer(1000000))",
        "Mul(Symbol('s0'), 'aaaa' * 999999999)",
        "-" * 3000 + "1",
        "Integer(Float('1e2000000'))",  # (sympy builds the number digit by digit)
        "floor(Float('1e9000000'))",
        "sqrt(Float(2, 2000000))",  # (a precision of two million bits)
        "Float(2, precision=2000000) * 3",
        "Float(2, dps=5000)",
        "s0 # a comment runs to the end of the line torch pastes the guard into",
        "s0; 1",
    ],
)
def test_expressions_that_grow_past_their_bound_are_refused_unevaluated(text: str) -> None:
    problem = check_expression(text)
    assert problem is not None and problem.startswith("a size expression"), problem
    guard = check_guard(f"L['x'].size()[0] == {text}")
    assert guard is not None and guard.startswith("a guard"), guard


@pytest.mark.parametrize(
    "text",
    [
        "Add(Symbol('s0', integer=True, positive=True), Integer(-1))",
        "Pow(Symbol('s0'), Integer(2)) + FloorDiv(s1, 2)",
        "Pow(Symbol('s0'), Rational(1, 2))",
        "PowByNatural(s0, 3)",
        "Max(2, s0*s1*s2)",
        "s0 << 2",
        "Float(2.5) * s0",
        "Float('12345', precision=53)",
        "Integer('99') + Rational(1, 3)",
    ],
)
def test_expressions_torch_writes_still_pass(text: str) -> None:
    assert check_expression(text) is None


def test_an_engine_scalar_expression_is_bounded_before_it_is_folded(saved_seed: SavedSeed, tmp_path: Path) -> None:
    """The engines' own expressions (JSON): a product of 300 terms, one nested 40 deep, a 70-bit constant and a
    product that could pass 4096 bits are each refused in one line; the expressions this package writes pass."""
    size = {"sym": "s0"}
    assert symbolic.checked({"Add": [-1, {"Mul": [2, size]}]}) == {"Add": [-1, {"Mul": [2, size]}]}
    nested: Any = size
    for _ in range(40):
        nested = {"Add": [1, nested]}
    for crafted in ({"Mul": [size] * 300}, nested, {"Add": [2**70, size]}, {"Mul": [{"Mul": [size] * 60}] * 2}):
        with pytest.raises(ValueError, match="size expression") as refused:
            symbolic.checked(crafted)
        assert len(str(refused.value)) < 200

    def multiply(program: dict[str, Any]) -> None:
        program.setdefault("input_specs", [None] * int(program["inputs"]))
        specs = program["input_specs"]
        specs[0] = {**(specs[0] or {}), "expr": {"Mul": [{"Mul": [7**20] * 200}] * 2}}

    crafted = edit_engine(saved_seed.good, tmp_path / "crafted.pt2", multiply)
    with pytest.raises(EngineFormatError, match="size expression") as raised:
        trt_inline.load(crafted).module()(saved_seed.x)
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 400, str(raised.value)


class _Keywords(torch.nn.Module):
    def forward(self, x: torch.Tensor, *, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x + 2 * a - b


def test_keyword_inputs_listed_in_another_order_than_the_spec_pairs_them_are_refused(tmp_path: Path) -> None:
    """The generated ``forward`` pairs the input spec's keys with the parameters after the positional ones by
    position: a file listing its parameters ``(x, b, a)`` computes ``x + 2b - a`` for ``f(x, a=a, b=b)``. Before,
    every run of verify paired them by name (``x + 2a - b``) and passed it in every mode; now it is refused in one
    line, and the runs pair inputs as the generated code does."""
    from support.commands import cli
    from support.hostile import edit_program

    from trt_inline.verify.checked_run import ProgramInputs

    x, a, b = torch.randn(4), torch.ones(4), torch.full((4,), 5.0)
    honest = tmp_path / "honest.pt2"
    trt_inline.save(torch.export.export(_Keywords(), (x,), {"a": a, "b": b}), honest, arg_inputs=(x,),
                    kwarg_inputs={"a": a, "b": b})  # fmt: skip

    listed = [True]

    def swap(document: dict[str, Any]) -> None:
        signature = document["graph_module"]["module_call_graph"][0]["signature"]
        listed[0] = "forward_arg_names" in signature  # (torch 2.5's schema has no such field)
        assert signature.get("forward_arg_names", ["x", "a", "b"]) == ["x", "a", "b"]  # (what the craft changes)
        signature["forward_arg_names"] = ["x", "b", "a"]

    crafted = edit_program(honest, tmp_path / "crafted.pt2", swap)
    if not listed[0]:  # (a torch whose programs do not list them: the field is refused as one it lacks)
        done = cli("verify", str(crafted))
        assert done.returncode == 2 and "has no field 'forward_arg_names'" in done.stderr, done.stdout + done.stderr
        assert cli("verify", str(honest)).returncode == 0
        return
    plain = torch.export.load(crafted).module()
    assert torch.equal(plain(x, a=a, b=b), x + 2 * b - a)  # (what a normal call computes)
    assert torch.equal(ProgramInputs(plain).flatten([x], {"a": a, "b": b})[1], b)  # (paired as that call pairs)
    for args in (("verify", crafted), ("verify", crafted, "--expected-from", honest), ("diff", crafted, honest)):
        done = cli(*map(str, args))
        assert done.returncode == 2, done.stdout + done.stderr
        assert "the program's keyword inputs (b, a) are not the ones its input spec names" in done.stderr
    # (trt_inline.load is for a trusted file: it computes what torch's own load computes)
    assert torch.equal(trt_inline.load(crafted).module()(x, a=a, b=b), x + 2 * b - a)
    assert cli("verify", str(honest)).returncode == 0


def test_later_runs_are_the_generated_code_with_checked_calls_and_it_is_put_back() -> None:
    """``run_checks`` runs the module's own generated code (its input processing included), each checked
    operator's call wrapped; leaving it puts the code back as it was."""
    from support.verdicts import repeat_interleave_program

    from trt_inline import allowed_ops
    from trt_inline.verify.checked_run import run_checks

    program = repeat_interleave_program([2, 0, 1])
    before = program.code
    with run_checks(program):
        assert "checked_" in program.code and "torch.ops.aten.add.Tensor" in program.code, program.code
        program.repeats.copy_(torch.tensor([5, -3, 1]))
        with allowed_ops.allowing(()), pytest.raises(RefusedOperatorError, match="repeat_interleave"):
            program(torch.randn(4))
    assert program.code == before


def test_an_engine_program_counting_infinity_is_its_documented_error(saved_seed: SavedSeed, tmp_path: Path) -> None:
    def infinite(program: dict[str, Any]) -> None:
        program["inputs"] = float("inf")

    crafted = edit_engine(saved_seed.good, tmp_path / "infinite.pt2", infinite)
    with pytest.raises(EngineFormatError, match="OverflowError"):
        trt_inline.load(crafted).module()(saved_seed.x)
