"""The GPU job's assets agree: Dockerfile pins, the workflow matrix, the README."""

from __future__ import annotations

import re

from support import pairs
from support.processes import REPO


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def dockerfile_defaults() -> dict[str, str]:
    text = (REPO / "Dockerfile").read_text()
    defaults: dict[str, str] = {}
    for name, value in re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.MULTILINE):
        assert defaults.get(name, value) == value, f"Dockerfile declares ARG {name} with two defaults"
        defaults[name] = value
    return defaults


def workflow_matrix() -> list[dict[str, str]]:
    text = (REPO / ".github" / "workflows" / "gpu.yml").read_text()
    entries = re.findall(r'- torch_tensorrt: "([\d.]+)"\s+torch: "([\d.]+)"', text)
    return [{"torch_tensorrt": trt, "torch": torch} for trt, torch in entries]


def readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_matrix_covers_a_buggy_and_a_fixed_release() -> None:
    matrix = workflow_matrix()
    assert len(matrix) >= 2
    minors = [_minor(entry["torch_tensorrt"]) for entry in matrix]
    assert any(m <= (2, 13) for m in minors) and any(m >= (2, 14) for m in minors), minors


def test_each_torch_tensorrt_is_paired_with_its_torch() -> None:
    for entry in workflow_matrix():
        assert _minor(entry["torch"]) == _minor(entry["torch_tensorrt"]), entry


def test_dockerfile_defaults_are_a_matrix_entry() -> None:
    defaults = dockerfile_defaults()
    entry = {"torch_tensorrt": defaults["TORCH_TENSORRT_VERSION"], "torch": defaults["TORCH_VERSION"]}
    assert entry in workflow_matrix()
    assert f"--build-arg TORCH_TENSORRT_VERSION={entry['torch_tensorrt']}" in (REPO / "Dockerfile").read_text()


def compatibility_rows() -> dict[str, str]:
    """{Torch-TensorRT release: the torch it was tested on} from the README's compatibility table."""
    table = readme_section("`torch_tensorrt.save` with no change to user code")
    return dict(re.findall(r"^\| (2\.\d+\.\d+) \| (2\.\d+\.\d+) \|", table, flags=re.MULTILINE))


def test_compatibility_table_names_every_supported_pair() -> None:
    assert compatibility_rows() == pairs.PAIRS
    table = readme_section("`torch_tensorrt.save` with no change to user code")
    assert re.search(rf"^\| none yet \| {re.escape(pairs.FUTURE_TORCH)} \|", table, flags=re.MULTILINE)


def test_ci_matrix_runs_every_supported_pair() -> None:
    text = (REPO / ".github" / "workflows" / "ci.yml").read_text()
    listed = re.search(r"release: \[([^\]]*)\]", text, flags=re.DOTALL)
    assert listed is not None
    assert re.findall(r'"([^"]+)"', listed.group(1)) == [*pairs.PAIRS, f"torch-{pairs.FUTURE_TORCH}"]


def test_readme_builds_every_gpu_matrix_entry_and_covers_it_in_the_compatibility_table() -> None:
    section = readme_section("Running the GPU suite")
    rows = compatibility_rows()
    for entry in workflow_matrix():
        build = (
            f"docker build --build-arg TORCH_VERSION={entry['torch']} "
            f"--build-arg TORCH_TENSORRT_VERSION={entry['torch_tensorrt']}"
        )
        assert build in section, build
        assert any(_minor(release) == _minor(entry["torch_tensorrt"]) for release in rows), entry


def test_gpu_script_runs_the_gpu_marker_and_verifies() -> None:
    script = (REPO / ".ci" / "gpu").read_text()
    assert "pytest -m gpu tests/gpu -n 0" in script  # one GPU: one worker
    assert "trt-inline verify" in script
    assert 'CMD ["bash", ".ci/gpu"]' in (REPO / "Dockerfile").read_text()


def test_torch_requirement_is_the_range_the_matrix_runs() -> None:
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(r'"torch>=(\d+\.\d+),<(\d+\.\d+)"', text)
    assert found is not None, "pyproject.toml must bound torch on both sides"
    low, high = _minor(found.group(1)), _minor(found.group(2))
    assert low == min(_minor(torch) for torch in pairs.PAIRS.values())
    future = _minor(pairs.FUTURE_TORCH)
    assert high == (future[0], future[1] + 1)
