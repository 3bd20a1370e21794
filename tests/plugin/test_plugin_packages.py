"""The release's own ``torch_tensorrt.save(output_format="aot_inductor")`` with the plugin active."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch
from support.commands import cli
from support.plugin_runs import RELEASE, release_tree, run_python
from support.processes import load_in_fresh_process
from support.values import max_abs_diff

from trt_inline import compat
from trt_inline.archive import REFERENCE_IO_FILE

WHY_NOT = compat.aoti_packages()
pytestmark = [
    pytest.mark.packages,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"AOTInductor packages: {WHY_NOT}"),
]

_PLUGIN_SAVE = """
    import sys, torch
    import torch_tensorrt, trt_inline
    from support.models import ConvBnRelu
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    compiled = trt_inline.reference.compile(ConvBnRelu().eval(), (x,), torch_executed_ops=["aten.relu.default"])
    for retrace in (False, True):
        torch_tensorrt.save(compiled, f"{sys.argv[1]}/plugin_{retrace}.package.pt2", output_format="aot_inductor",
                            arg_inputs=[x], retrace=retrace)
    with torch.no_grad():
        torch.save([[x], list(compiled(x))], f"{sys.argv[1]}/plugin.expected")
"""


def test_released_save_writes_packages_through_our_passes(tmp_path: Path) -> None:
    """The release's own save (2.8+) with the plugin: packages of both retrace values, exact, verifiable."""
    tree = release_tree(tmp_path)
    if RELEASE is not None and not RELEASE.aot_inductor:
        pytest.skip(f"Torch-TensorRT {RELEASE.version} has no output_format='aot_inductor'")
    proc = run_python(_PLUGIN_SAVE, tree, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    inputs, expected = torch.load(tmp_path / "plugin.expected", weights_only=True)
    paths = [tmp_path / f"plugin_{retrace}.package.pt2" for retrace in (False, True)]
    results = load_in_fresh_process(tmp_path, paths, inputs)
    for path in paths:
        assert max_abs_diff(results[str(path)]["outputs"], expected) == 0.0, path.name
        verified = cli("verify", str(path), "--allow-native-code")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        with zipfile.ZipFile(path) as archive:
            assert any(n.endswith(f"/extra/{REFERENCE_IO_FILE}") for n in archive.namelist())
