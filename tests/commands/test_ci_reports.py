"""Comparison reports for CI: SQNR and cosine similarity, top-k agreement of logits, a folder of cases verified
one by one (worst first), and JUnit XML reports, each against values computed by hand; the JUnit files are read
back with junitparser, a JUnit XML parser as CI systems use."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from junitparser import Error, Failure, JUnitXml, Skipped
from support.commands import cli
from support.programs import SavedSeed
from support.report_probe import report_of
from support.values import DTYPES, differ, from_bytes

from trt_inline.commands.junit import write_junit
from trt_inline.errors import VerifyInputError
from trt_inline.verify import VerifyReport, verify
from trt_inline.verify.cases import CaseResult, read_cases, worst_first
from trt_inline.verify.compare import compare_output, top_k_agreement

# --- SQNR -----------------------------------------------------------------------------------------------------


def test_sqnr_is_the_ratio_of_signal_to_error_power_in_db() -> None:
    # sum(ref**2) = 1 + 4 + 9 + 16 = 30, sum((ref - act)**2) = 1.
    found = compare_output(0, torch.tensor([1.0, 2.0, 3.0, 5.0]), torch.tensor([1.0, 2.0, 3.0, 4.0]), None, None)
    assert found.sqnr_db == pytest.approx(10 * math.log10(30 / 1), rel=1e-12)
    # The same values in float16 and as integers (their widened values): the same SQNR.
    half = compare_output(0, torch.tensor([1.0, 2, 3, 5]).half(), torch.tensor([1.0, 2, 3, 4]).half(), None, None)
    integers = compare_output(0, torch.tensor([1, 2, 3, 5]), torch.tensor([1, 2, 3, 4]), None, None)
    assert half.sqnr_db == integers.sqnr_db == pytest.approx(10 * math.log10(30), rel=1e-12)
    # Complex: |1+1j|**2 = 2 against |(1+2j) - (1+1j)|**2 = 1.
    complex_found = compare_output(0, torch.tensor([1 + 2j]), torch.tensor([1 + 1j]), None, None)
    assert complex_found.sqnr_db == pytest.approx(10 * math.log10(2), rel=1e-12)
    # Over the values finite on both sides only: the NaN is counted apart, the rest measured.
    with_nan = compare_output(0, torch.tensor([1.0, 2.0, float("nan")]), torch.tensor([1.0, 1.0, 1.0]), None, None)
    assert with_nan.nan_count == 1 and with_nan.sqnr_db == pytest.approx(10 * math.log10(2 / 1), rel=1e-12)
    assert "SQNR 14.8 dB" in found.statistics_text() and "cosine similarity" in found.statistics_text()


def test_sqnr_at_the_edges() -> None:
    # Identical: no error at all, +inf; a zero reference against anything else: -inf (only error, no signal).
    same = compare_output(0, torch.tensor([1.0, -2.0]), torch.tensor([1.0, -2.0]), None, None)
    assert same.sqnr_db == math.inf and "SQNR inf dB" in same.statistics_text()
    assert compare_output(0, torch.zeros(3), torch.zeros(3), None, None).sqnr_db == math.inf
    assert compare_output(0, torch.tensor([0.0, 1.0]), torch.zeros(2), None, None).sqnr_db == -math.inf
    # -0.0 against 0.0 differs (by the smallest float64, 5e-324): never +inf, however small the error. Signal 1,
    # error (5e-324)**2, which underflows to 0 in float64 unless scaled: 20 * log10(1 / 5e-324) dB.
    signed = compare_output(0, torch.tensor([-0.0, 1.0], dtype=torch.float64), torch.tensor([0.0, 1.0],
                            dtype=torch.float64), None, None)  # fmt: skip
    assert signed.sqnr_db == pytest.approx(-20 * math.log10(math.ulp(0.0)), rel=1e-12)
    # A difference past float64's range (2e308) of finite values: signal 2 * 1e308**2, error 2 * 2e308**2.
    big = torch.tensor([1e308, -1e308], dtype=torch.float64)
    assert compare_output(0, -big, big, None, None).sqnr_db == pytest.approx(10 * math.log10(1 / 4), rel=1e-12)
    # Integers far apart: never rounded into a smaller error (int64 extremes: error (2**64 - 1)**2 vs 2 * 2**126).
    extremes = torch.tensor([-(2**63), 2**63 - 1])
    flipped = compare_output(0, extremes.flip(0), extremes, None, None)
    assert flipped.sqnr_db == pytest.approx(10 * math.log10(2**126 * 2 / (2 * (2**64 - 1) ** 2)), rel=1e-9)
    # Nothing finite on both sides, another shape: not measured.
    assert compare_output(0, torch.tensor([math.nan]), torch.tensor([math.inf]), None, None).sqnr_db is None
    assert compare_output(0, torch.zeros(3), torch.zeros(2), None, None).sqnr_db is None


@settings(max_examples=300, deadline=None)
@given(dtype=st.sampled_from(DTYPES), data=st.data())
def test_sqnr_of_values_that_differ_is_never_infinite(dtype: torch.dtype, data: st.DataObject) -> None:
    """In every dtype (random bits): a value is +inf dB from itself where anything is finite, and a value that
    differs where both are finite is never +inf nor NaN, however small the difference."""
    size = torch.empty(0, dtype=dtype).element_size()
    count = data.draw(st.integers(1, 8))
    expected = from_bytes(data.draw(st.binary(min_size=size * count, max_size=size * count)), dtype)
    same = compare_output(0, expected.clone(), expected, 0.0, 0.0)
    assert same.sqnr_db == (math.inf if same.finite_count else None), same
    actual = expected.clone()
    position = data.draw(st.integers(0, count - 1))
    actual[position] = from_bytes(data.draw(st.binary(min_size=size, max_size=size)), dtype)[0]
    pair = torch.stack([actual[position], expected[position]])
    wide = pair.to(torch.complex128) if pair.is_floating_point() or pair.is_complex() else None  # (float8 too)
    finite = wide is None or bool(wide.isfinite().all())
    if finite and differ(actual[position : position + 1], expected[position : position + 1]):
        sqnr = compare_output(0, actual, expected, 0.0, 0.0).sqnr_db
        assert sqnr is not None and sqnr < math.inf and not math.isnan(sqnr), (dtype, actual, expected, sqnr)


# --- top-k ----------------------------------------------------------------------------------------------------


def _logits() -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of shape [2, 2, 5]: 4 rows. Row 1 ranks its top 2 in another order (the same set: agrees), row 2
    (index [1, 0]) has another class in its top 2."""
    reference = torch.tensor(
        [[[5.0, 4.0, 0.0, 1.0, 2.0], [0.0, 9.0, 8.0, 1.0, 2.0]], [[1.0, 2.0, 3.0, 4.0, 5.0], [7.0, 0.0, 0.0, 0.0, 6.0]]]
    )
    actual = reference.clone()
    actual[0, 1, 2] = 9.5  # 8 -> 9.5: classes 1 and 2 swap places, the set {1, 2} stays
    actual[1, 0, 2] = 6.0  # class 2 (3 -> 6) enters the top 2, class 3 leaves: the set is {2, 4}, not {3, 4}
    return actual, reference


def test_top_k_agreement_counts_rows_whose_top_k_sets_agree() -> None:
    actual, reference = _logits()
    assert top_k_agreement(actual, reference, 2) == (4, 3, 2)
    # Top-1: row 1's best class is 2 (9.5), not 1 (9); row 2's is 2 (6), not 4 (5).
    assert top_k_agreement(actual, reference, 1) == (4, 2, 1)
    assert top_k_agreement(reference, reference, 5) == (4, 4, None)
    # Not ranked: too few classes, integers, a 0-d value, another shape.
    assert top_k_agreement(actual, reference, 6) is None
    assert top_k_agreement(actual.long(), reference.long(), 2) is None
    assert top_k_agreement(torch.tensor(1.0), torch.tensor(1.0), 1) is None
    assert top_k_agreement(actual[0], reference, 2) is None

    found = compare_output(0, actual, reference, 10.0, 0.0, top_k=2)
    assert found.ok and (found.top_k, found.top_k_rows, found.top_k_agreement) == (2, 4, 0.75)
    assert found.top_k_first_disagreement == 2
    assert found.top_k_text() == "top-2: 3 of 4 rows agree (0.75), the first that does not is row 2"
    # Reported only, unless a floor is given: 0.75 is not below 0.75; it is below 0.8.
    assert compare_output(0, actual, reference, 10.0, 0.0, top_k=2, min_top_k_agreement=0.75).ok
    floored = compare_output(0, actual, reference, 10.0, 0.0, top_k=2, min_top_k_agreement=0.8)
    assert not floored.ok
    assert floored.problem == (
        "output 0: its top-2 indices agree in 3 of 4 rows (0.75), fewer than --min-top-k-agreement 0.8; the "
        "first row that does not is 2"
    )


# --- the strict reader --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("sqnr_db", "14.8", "outputs[0].sqnr_db: a str, not a number"),
        ("sqnr_db", True, "outputs[0].sqnr_db: true or false, not a number"),
        ("sqnr_db", math.nan, "outputs[0].sqnr_db: nan, not a number other than NaN"),
        ("top_k", 2.0, "outputs[0].top_k: a float, not an integer"),
        ("top_k", 0, "outputs[0].top_k: 0, not at least 1"),
        ("top_k_rows", -3, "outputs[0].top_k_rows: -3, not at least 1"),
        ("top_k_agreement", 1.5, "outputs[0].top_k_agreement: 1.5, not from 0 to 1"),
        ("top_k_agreement", math.nan, "outputs[0].top_k_agreement: nan, not from 0 to 1"),
        ("top_k_first_disagreement", "2", "outputs[0].top_k_first_disagreement: a str, not an integer"),
    ],
)
def test_the_new_fields_are_read_strictly(field: str, value: object, fragment: str) -> None:
    document = report_of(3)
    document["outputs"][0][field] = value
    with pytest.raises(ValueError, match=re.escape(fragment)):
        VerifyReport.from_dict(document)


def test_the_new_fields_cross_from_a_child_as_they_were() -> None:
    actual, reference = _logits()
    outputs = [
        compare_output(0, actual, reference, 10.0, 0.0, top_k=2),
        compare_output(1, torch.ones(2), torch.ones(2), None, None),
        compare_output(2, torch.ones(2), torch.zeros(2), None, None),
    ]
    report = VerifyReport("a.pt2", outputs=outputs, expected_source="given")
    crossed = VerifyReport.from_dict(json.loads(report.to_json()))  # (inf is written as JSON's Infinity)
    assert crossed.outputs == outputs
    assert [o.sqnr_db for o in crossed.outputs][1:] == [math.inf, -math.inf]


# --- JUnit, by hand -------------------------------------------------------------------------------------------


def _report(source: str, *outputs: tuple[torch.Tensor, torch.Tensor], problems: tuple[str, ...] = ()) -> VerifyReport:
    report = VerifyReport(source, expected_source="given", problems=list(problems))
    for index, (actual, reference) in enumerate(outputs):
        report.outputs.append(compare_output(index, actual, reference, None, None))
        if report.outputs[-1].problem:
            report.problems.append(report.outputs[-1].problem or "")
    return report


def test_junit_report_by_hand(tmp_path: Path) -> None:
    ones = torch.ones(4)
    failing = _report(
        "m.pt2", (ones, ones), (torch.tensor([1.0, 2.0, 3.0, 5.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])),
        (ones * 2, ones), problems=("the graph has a dangling node",),
    )  # fmt: skip
    unverified = VerifyReport("m.pt2", notes=["no reference I/O: outputs were not compared (give inputs...)"])
    results = [
        CaseResult("m.pt2", "bad", failing, seconds=1.5),
        CaseResult("m.pt2", "good", _report("m.pt2", (ones, ones)), seconds=0.25),
        CaseResult("m.pt2", "bare", unverified),
        CaseResult("m.pt2", "broken\x1b[2J", None, "the program does not accept <inputs> & \x00\ud800more"),
    ]
    path = tmp_path / "report.xml"
    write_junit(path, results, "trt-inline verify")

    xml = JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert len(suites) == 1
    suite = suites[0]
    assert (suite.name, suite.tests, suite.failures, suite.errors, suite.skipped) == ("trt-inline verify", 4, 1, 1, 1)
    assert suite.time == pytest.approx(1.75)
    cases = {case.name: case for case in suite}
    assert set(cases) == {"m.pt2 [bad]", "m.pt2 [good]", "m.pt2 [bare]", "m.pt2 [broken[2J]"}
    assert cases["m.pt2 [good]"].is_passed and cases["m.pt2 [good]"].time == pytest.approx(0.25)
    # One failure per output that differs (output 1: SQNR 10*log10(30) = 14.8 dB; output 2: 10*log10(4/4) = 0 dB),
    # one for the problem that is about no output.
    failures = cases["m.pt2 [bad]"].result
    assert all(isinstance(f, Failure) for f in failures)
    assert [(f.type, f.message) for f in failures] == [
        ("output", "output 1: max abs diff 1, SQNR 14.8 dB"),
        ("output", "output 2: max abs diff 1, SQNR 0 dB"),
        ("problem", "the graph has a dangling node"),
    ]
    assert failures[0].text.startswith("output 1 differs: max abs diff 1, max rel diff 0.25")
    assert [type(r) for r in cases["m.pt2 [bare]"].result] == [Skipped]
    (error,) = cases["m.pt2 [broken[2J]"].result
    # Markup escaped and read back as it was; what XML 1.0 cannot hold (NUL, a lone surrogate, ESC) removed.
    assert isinstance(error, Error) and error.message == "the program does not accept <inputs> & more"
    assert "\x1b" not in path.read_text(encoding="utf-8")


def test_worst_first() -> None:
    def result(case: str, *errors: float, problem: bool = False, compared: bool = True) -> CaseResult:
        report = _report("m.pt2", *((torch.tensor([e]), torch.tensor([0.0])) for e in errors))
        report.expected_source = "given" if compared else "none"
        report.problems += ["a problem"] if problem else []
        return CaseResult("m.pt2", case, report)

    results = [
        result("pass-small", 0.0), result("fail-small", 2.0), result("unverified", compared=False),
        result("pass-large", 5e-5), result("fail-large", 5.0, 1.0), result("structural", problem=True),
        CaseResult("m.pt2", "error", None, "refused"), result("fail-nan", math.nan),
    ]  # fmt: skip
    assert [(r.status, r.case) for r in worst_first(results)] == [
        ("ERROR", "error"), ("FAIL", "fail-nan"), ("FAIL", "fail-large"), ("FAIL", "fail-small"),
        ("FAIL", "structural"), ("UNVERIFIED", "unverified"), ("PASS", "pass-large"), ("PASS", "pass-small"),
    ]  # fmt: skip


# --- the command line, end to end ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cases(saved_seed: SavedSeed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three cases of the seed model: two real ones and one whose expected output 1 puts another class in the
    top 3 of row 0 (so it fails, and top-3 agrees in 63 of 64 rows)."""
    root = tmp_path_factory.mktemp("cases")
    inputs = {"cat": saved_seed.x, "dog": torch.randn(2, 3, 8, 8), "perturbed": torch.randn(2, 3, 8, 8)}
    for name, x in inputs.items():
        with torch.no_grad():
            expected = [o.clone() for o in saved_seed.compiled(x)]
        if name == "perturbed":
            row = expected[1][0, 0, 0]
            row[int(row.argmin())] = float(row.max()) + 100.0
        (root / name).mkdir()
        torch.save([x], root / name / "inputs.pt")
        torch.save(expected, root / name / "expected.pt")
    return root


def test_cases_folder_worst_first_with_junit(saved_seed: SavedSeed, cases: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.xml"
    # trt-inline's main in this process (each case's file opened in a child of its own), under a 2 GiB limit.
    proc = _cli("verify", str(saved_seed.bare), "--cases", str(cases), "--junit", str(out), "--top-k", "3")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the worst case's: FAIL
    lines = proc.stdout.splitlines()
    assert lines[0] == f"3 cases of {saved_seed.bare} in {cases} (1 FAIL, 2 PASS), the worst first:"
    verdicts = [line.split(None, 2) for line in lines[1:4]]
    assert [v[:2] for v in verdicts[:1]] == [["FAIL", "perturbed"]] and "output 1 differs" in lines[1], proc.stdout
    # The passes: the larger error first (both may be 0 here: then by name).
    passes = [(float(re.findall(r"max abs diff (\S+),", v[2])[0]), v[1]) for v in verdicts[1:] if v[0] == "PASS"]
    assert sorted(name for _, name in passes) == ["cat", "dog"]
    assert passes == sorted(passes, key=lambda p: (-p[0], p[1])), proc.stdout
    assert "top-3: 63 of 64 rows agree (0.984375), the first that does not is row 0" in proc.stdout
    assert proc.stdout.count("top-3: 64 of 64 rows agree (1)") == 5  # both outputs of the others, output 0 here

    suite = next(iter(JUnitXml.fromfile(str(out))))
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (3, 1, 0, 0)
    cases_found = {case.name: case for case in suite}
    assert set(cases_found) == {f"{saved_seed.bare} [{name}]" for name in ("perturbed", "cat", "dog")}
    failures = cases_found[f"{saved_seed.bare} [perturbed]"].result
    assert [f.message.split(":")[0] for f in failures] == ["output 1"]
    assert "top-3: 63 of 64 rows agree" in failures[0].text
    assert cases_found[f"{saved_seed.bare} [cat]"].is_passed and cases_found[f"{saved_seed.bare} [dog]"].is_passed


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in this process (its child process still loads the file), ``diff`` too under a 2 GiB limit."""
    return cli(*args, "--memory-limit", "2GiB")


def test_an_unusable_case_is_one_line_naming_it(saved_seed: SavedSeed, cases: Path, tmp_path: Path) -> None:
    broken = tmp_path / "cases"
    for name in ("a", "b"):
        (broken / name).mkdir(parents=True)
        for file in ("inputs.pt", "expected.pt"):
            (broken / name / file).write_bytes((cases / "cat" / file).read_bytes())
    (broken / "b" / "expected.pt").unlink()
    proc = _cli("verify", str(saved_seed.bare), "--cases", str(broken), "--junit", str(tmp_path / "x.xml"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"trt-inline verify: case b ({broken / 'b'}) has no expected.pt"]
    # With --junit, the error is the report's one test case.
    (error,) = next(iter(next(iter(JUnitXml.fromfile(str(tmp_path / "x.xml")))))).result
    assert isinstance(error, Error) and "case b" in error.message

    (broken / "b" / "expected.pt").write_bytes(b"not a tensor file")
    with pytest.raises(VerifyInputError, match=r"case b: expected file .* is not a tensor file"):
        read_cases(broken)
    (broken / "b" / "expected.pt").unlink()
    (broken / "a" / "inputs.pt").unlink()
    (broken / "a" / "expected.pt").unlink()
    assert "case a" in _cli("verify", str(saved_seed.bare), "--cases", str(broken)).stderr
    # Cases give the inputs and expected outputs themselves.
    proc = _cli("verify", str(saved_seed.bare), "--cases", str(cases), "--inputs", str(cases / "cat" / "inputs.pt"))
    assert proc.returncode == 2 and "--inputs do not apply with it" in proc.stderr


def test_a_case_the_program_refuses_is_an_error_ranked_first(saved_seed: SavedSeed, cases: Path,
                                                             tmp_path: Path) -> None:  # fmt: skip
    folder = tmp_path / "cases"
    (folder / "wrong").mkdir(parents=True)
    torch.save([torch.randn(2, 5, 8, 8)], folder / "wrong" / "inputs.pt")  # 5 channels where the model takes 3
    torch.save([torch.zeros(1)], folder / "wrong" / "expected.pt")
    (folder / "cat").mkdir()
    for file in ("inputs.pt", "expected.pt"):
        (folder / "cat" / file).write_bytes((cases / "cat" / file).read_bytes())
    proc = _cli("verify", str(saved_seed.bare), "--cases", str(folder), "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)
    assert [(d["case"], d["status"]) for d in document] == [("wrong", "ERROR"), ("cat", "PASS")]
    assert "does not accept the given inputs" in document[0]["error"] and document[1]["report"]["ok"]
    assert proc.stderr.startswith("trt-inline verify: case wrong: ") and proc.stderr.count("\n") == 1


def test_diff_writes_junit_too(saved_seed: SavedSeed, tmp_path: Path) -> None:
    from support.commands import miswire

    miswired = miswire(saved_seed.good, tmp_path / "miswired.pt2")
    out = tmp_path / "diff.xml"
    proc = _cli("diff", str(miswired), str(saved_seed.good), "--junit", str(out), "--top-k", "3")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "SQNR dB" in proc.stdout and "top-3: " in proc.stdout
    suite = next(iter(JUnitXml.fromfile(str(out))))
    assert (suite.name, suite.tests, suite.failures) == ("trt-inline diff", 1, 1)
    (case,) = list(suite)
    assert case.name == f"{miswired} against {saved_seed.good}"
    kinds = [(f.type, f.message.split(":")[0]) for f in case.result]
    assert ("output", "output 0") in kinds and ("output", "output 1") in kinds
    assert any(kind == "problem" and message.startswith("first divergence") for kind, message in kinds), kinds

    same = tmp_path / "same.xml"
    assert _cli("diff", str(saved_seed.good), str(saved_seed.good), "--junit", str(same)).returncode == 0
    (passed,) = list(next(iter(JUnitXml.fromfile(str(same)))))
    assert passed.is_passed


def test_verify_top_k_floor_travels_to_the_child(saved_seed: SavedSeed, cases: Path) -> None:
    (x,) = torch.load(cases / "perturbed" / "inputs.pt", weights_only=True)
    expected = torch.load(cases / "perturbed" / "expected.pt", weights_only=True)
    tolerant = verify(saved_seed.bare, arg_inputs=[x], expected=expected, atol=1e3, top_k=3)
    assert tolerant.ok and tolerant.outputs[1].top_k_agreement == 63 / 64  # reported only
    floored = verify(saved_seed.bare, arg_inputs=[x], expected=expected, atol=1e3, top_k=3, min_top_k_agreement=0.99)
    assert not floored.ok and floored.problems == [
        "output 1: its top-3 indices agree in 63 of 64 rows (0.984375), fewer than --min-top-k-agreement 0.99; the "
        "first row that does not is 0"
    ]
    with pytest.raises(VerifyInputError, match="needs top_k"):
        verify(saved_seed.bare, min_top_k_agreement=0.5)


def test_what_is_wrong_for_every_case_is_said_once_before_any_runs(
    saved_seed: SavedSeed, cases: Path, tmp_path: Path
) -> None:
    """A missing file or an unusable option is one line and exit 2, not one ERROR per case."""
    for arguments, said in (
        ((str(tmp_path / "missing.pt2"), "--cases", str(cases)), "missing.pt2: no such file"),
        ((str(saved_seed.bare), "--cases", str(cases), "--top-k", "0"), "top_k (--top-k) is a whole number"),
    ):
        proc = _cli("verify", *arguments)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert len(proc.stderr.strip().splitlines()) == 1 and said in proc.stderr, proc.stderr
