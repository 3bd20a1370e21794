"""The GPU job's assets agree: Dockerfile pins, the workflow matrix, the README."""

from __future__ import annotations

import re

from conftest import REPO


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


def test_readme_builds_every_matrix_entry_and_covers_it_in_the_compatibility_table() -> None:
    section = readme_section("Running the GPU suite")
    table = readme_section("`torch_tensorrt.save` with no change to user code")
    rows = re.findall(r"^\| (2\.\d+)(?: \.\.\. (2\.\d+))? \|", table, flags=re.MULTILINE)
    assert rows
    for entry in workflow_matrix():
        build = (
            f"docker build --build-arg TORCH_VERSION={entry['torch']} "
            f"--build-arg TORCH_TENSORRT_VERSION={entry['torch_tensorrt']}"
        )
        assert build in section, build
        minor = _minor(entry["torch_tensorrt"])
        assert any(_minor(low) <= minor <= _minor(high or low) for low, high in rows), entry


def test_gpu_script_runs_the_gpu_marker_and_verifies() -> None:
    script = (REPO / ".ci" / "gpu").read_text()
    assert "pytest -m gpu tests/gpu" in script
    assert "trt-inline verify" in script
    assert 'CMD ["bash", ".ci/gpu"]' in (REPO / "Dockerfile").read_text()
