"""Models from the hub, end to end through the commands: transformers BERT and GPT-2 from configs.

A user's script builds the model (``transformers`` imported), compiles it with the reference backend in fp32
and in fp16 and saves both; then ``trt-inline verify``, ``inspect`` and ``diff`` run as commands of their own in
processes where ``transformers`` is not even on the path (its output types are rebuilt from the file as data,
:mod:`trt_inline.archive.output_types`), and ``trt-inline fix`` runs the user's script. Each model comes honest
and planted (one Linear's weights scaled past fp16's range): the honest fp16 build agrees
with the fp32 save within fp16's tolerance, no problem line; the planted one diverges, the drill names the
planted module, not the causal mask's ``-inf`` that changes no output; the fix search names the module by its
path, and its ``--out`` verifies.

transformers (and what it imports) is installed without dependencies into a cached folder
(:func:`releases.transformers_site`), the way the README says to add it beside the pinned torch. torchvision's
registry wheels are CUDA builds of the torch they pair with: with the CPU torch 2.13.0 the one that pairs
(0.28.0) does not import (``operator torchvision::nms does not exist``), so resnet18 runs where torchvision
imports (torch 2.14.1 with torchvision 0.29.0: the README's line) and says why it does not run elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.pairs import Unavailable, fp16_settings, torchvision_site, transformers_site
from support.processes import python_path

pytestmark = pytest.mark.hub

# Each model: the module planted, the library, how the script builds it and its inputs.
MODELS = {
    "bert": ("encoder.layer.1.output.dense", "transformers", "transformers.BertModel(transformers.BertConfig("
             "num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=100, "
             "max_position_embeddings=32))", "torch.randint(0, 100, (2, 16), generator=generator)"),
    "gpt2": ("transformer.h.1.mlp.c_proj", "transformers", "transformers.GPT2LMHeadModel(transformers.GPT2Config("
             "n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, use_cache=False, bos_token_id=0, "
             "eos_token_id=0))", "torch.randint(0, 100, (2, 16), generator=generator)"),
    "resnet18": ("layer3.0.conv1", "torchvision", "torchvision.models.resnet18(num_classes=10)",
                 "torch.randn(2, 3, 32, 32, generator=generator)"),
}  # fmt: skip


def _imports(library: str) -> str | None:
    """Why ``library`` does not import with this torch (its last line), or None where it does."""
    env = {**os.environ, "PYTHONPATH": python_path(_site(library))}
    proc = subprocess.run([sys.executable, "-c", f"import {library}"], capture_output=True, text=True, timeout=300,
                          env=env, check=False)  # fmt: skip
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]


SCRIPT = """
import os, sys
import torch
import {library}

PLANTED = {planted}


def model():
    torch.manual_seed(0)
    module = {build}.eval()
    if PLANTED:
        with torch.no_grad():
            module.get_submodule("{path}").weight.mul_(1e8)  # its weights past fp16's largest value
    generator = torch.Generator().manual_seed(1)
    return module, ({inputs},)


settings = {settings!r}


if __name__ == "__main__":
    import trt_inline

    module, inputs = model()
    for name, extra in (("fp32", {{}}), ("fp16", settings)):
        compiled = trt_inline.reference.compile(module, inputs, **extra)
        trt_inline.save(compiled, os.path.join(sys.argv[1], name + ".pt2"), arg_inputs=list(inputs))
"""


def _site(library: str) -> Path:
    """The cached folder ``library`` is installed in (:mod:`releases`)."""
    import torch

    try:
        return transformers_site() if library == "transformers" else torchvision_site(str(torch.__version__))
    except Unavailable as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(str(exc))


def _run(args: list[str], *, cwd: Path, library: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` as a process of its own; with ``library`` on the path (the user's script), else without it
    (the commands)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = python_path(*([_site(library)] if library else []))
    env["TRT_INLINE_PIPELINE"] = "own"
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )


def _cli(*args: str, cwd: Path, library: str | None = None) -> subprocess.CompletedProcess[str]:
    return _run(["-m", "trt_inline.cli", *args], library=library, cwd=cwd)


@pytest.fixture(scope="module", params=sorted(MODELS))
def hub_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    name = request.param
    path, library, build, inputs = MODELS[name]
    why = _imports(library)
    if why is not None:
        # (the registry's torchvision is a CUDA build of the torch it pairs with: the CPU torch cannot load it)
        pytest.skip(f"{library} does not import with torch {torch_version()} ({why}): {name} runs where it does")
    root = tmp_path_factory.mktemp(name)
    for planted in (False, True):
        folder = root / ("planted" if planted else "honest")
        folder.mkdir()
        script = folder / "model.py"
        text = textwrap.dedent(SCRIPT).format(
            planted=planted, library=library, build=build, inputs=inputs, path=path, settings=fp16_settings()
        )
        script.write_text(text)
        done = _run([str(script), str(folder)], library=library, cwd=folder)
        assert done.returncode == 0, done.stdout + done.stderr
    # The structure under test: the saves return transformers' own output type, named in their specs.
    shown = _cli("inspect", str(root / "honest" / "fp32.pt2"), cwd=root)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert library != "transformers" or "out['" in shown.stdout, shown.stdout  # (fields by name)
    return name, root


def test_every_command_reads_the_saves_without_the_library(hub_model: tuple[str, Path]) -> None:
    _, root = hub_model
    for build in ("fp32.pt2", "fp16.pt2"):
        proc = _cli("verify", str(root / "honest" / build), cwd=root)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "problem:" not in proc.stdout, proc.stdout
    # An honest fp16 build against its fp32 save, within fp16's tolerance: no false alarm.
    proc = _cli("diff", str(root / "honest" / "fp16.pt2"), str(root / "honest" / "fp32.pt2"), "--atol", "1e-2",
                "--rtol", "1e-2", cwd=root)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "problem:" not in proc.stdout and "differs between" not in proc.stdout, proc.stdout


def test_the_planted_module_is_what_diff_names(hub_model: tuple[str, Path]) -> None:
    name, root = hub_model
    path = MODELS[name][0]
    proc = _cli("diff", str(root / "planted" / "fp16.pt2"), str(root / "planted" / "fp32.pt2"), "--atol", "1e-2",
                "--rtol", "1e-2", cwd=root)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    inside = [line for line in proc.stdout.splitlines() if line.startswith("  inside it: ")]
    assert inside and "reaches the engine's outputs" in inside[0], proc.stdout
    module = [line for line in proc.stdout.splitlines() if line.startswith("    module: ")]
    assert module and module[0].split(": ", 1)[1].startswith(f"{path} ("), proc.stdout


def test_the_fix_names_the_module_and_its_build_verifies(hub_model: tuple[str, Path]) -> None:
    name, root = hub_model
    path = MODELS[name][0]
    folder = root / "planted"
    proc = _cli(
        "fix", str(folder / "model.py"), "--out", str(folder / "fixed.pt2"), cwd=folder, library=MODELS[name][1]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("fixed: "), proc.stdout
    assert f"\n  {path} (" in proc.stdout, proc.stdout
    proc = _cli("verify", str(folder / "fixed.pt2"), cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def torch_version() -> str:
    import torch

    return str(torch.__version__)
