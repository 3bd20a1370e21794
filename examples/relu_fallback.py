"""The seed scenario end to end: compile with relu falling back, save, load, compare, verify.

Compiles a conv -> batchnorm -> relu network with ``relu`` forced to run in
PyTorch, on TensorRT when ``torch_tensorrt`` and CUDA are available and on the
CPU reference backend otherwise (the installed release's own pipeline, dry-run,
with reference engines; trt-inline's own partitioner where no release is
installed); saves it with trt_inline's positional passes as an ExportedProgram
(or, with ``--format aot_inductor``, as an AOTInductor package); loads it in a
fresh interpreter; verifies the file (``trt_inline.verify``, in a sandboxed
child); and prints the engines, the fallback ops, the verdict and the max abs
difference between the loaded and the in-memory module. Exits 1 if verify fails
or they differ beyond the backend's tolerance.

    python examples/relu_fallback.py [--backend auto|reference|tensorrt] [--format exported_program|aot_inductor]
                                     [--out model.pt2] [--no-retrace] [--device cpu|cuda]

``--device cuda`` runs the reference backend on a CUDA device (a machine with CUDA and no TensorRT);
TensorRT always runs on CUDA.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

import trt_inline
from trt_inline import reference

# torch's own deprecation notice from deep-copying pytree specs; nothing to act on here.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

# A loaded file must reproduce the in-memory module exactly on the reference
# backend; TensorRT may pick different kernels after deserialisation.
TOLERANCE = {"reference": 0.0, "tensorrt": 1e-3}


class ConvBnRelu(nn.Module):
    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, channels, 3, padding=1)
        self.b1 = nn.BatchNorm2d(channels)
        self.c2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.b2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        a, b = x.chunk(2, dim=1)  # a multi-output engine after the fallbacks
        scaled = a * 2
        return torch.relu(scaled) + b, scaled


def tensorrt_available() -> str | None:
    """None if TensorRT can be used here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import torch_tensorrt  # noqa: F401
    except Exception as exc:  # a missing libnvinfer raises OSError, not ImportError
        return f"torch_tensorrt not importable ({type(exc).__name__}: {exc})"
    return None


def compile_model(backend: str, model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    if backend == "tensorrt":
        import torch_tensorrt

        exported = torch.export.export(model, inputs)
        compiled: torch.fx.GraphModule = torch_tensorrt.dynamo.compile(
            exported, inputs, min_block_size=1, torch_executed_ops={torch.ops.aten.relu.default}
        )
        return compiled
    # min_block_size=1 as for TensorRT above (the releases' default, 5, folds these small blocks into the fallbacks).
    return reference.compile(model, inputs, min_block_size=1, torch_executed_ops=[torch.ops.aten.relu.default])


def describe(compiled: torch.fx.GraphModule) -> None:
    for node in compiled.graph.nodes:
        if node.op != "call_module":
            continue
        module = compiled.get_submodule(str(node.target))
        args = ", ".join(a.name for a in node.args if isinstance(a, torch.fx.Node))
        if isinstance(module, torch.fx.GraphModule):
            ops = [
                str(n.target).removeprefix("aten.")
                for n in module.graph.nodes
                if n.op in ("call_function", "call_module")
            ]
            print(f"  fallback {node.target}({args}): {', '.join(ops) or '(no ops)'}")
        else:
            outputs = len(node.meta.get("val", []))
            print(f"  engine   {node.target}({args}) -> {outputs} output(s)")


_LOAD_AND_RUN = """
import sys, torch, trt_inline
inputs = torch.load(sys.argv[2], weights_only=True)
device = inputs[0].device
if sys.argv[4] == "aot_inductor":
    run = trt_inline.package.load_package(sys.argv[1])  # loads the package's shared library
else:
    program = torch.export.load(sys.argv[1])
    program.graph_module.graph.lint()
    run = program.module().to(device)
with torch.no_grad():
    outputs = run(*inputs)
torch.save([o.cpu() for o in outputs], sys.argv[3])
"""


def load_in_fresh_process(
    path: Path, inputs: tuple[torch.Tensor, ...], workdir: Path, output_format: str
) -> list[torch.Tensor]:
    inputs_file, outputs_file = workdir / "inputs.pt", workdir / "outputs.pt"
    torch.save(list(inputs), inputs_file)
    command = [sys.executable, "-c", _LOAD_AND_RUN, str(path), str(inputs_file), str(outputs_file), output_format]
    subprocess.run(command, check=True)
    outputs: list[torch.Tensor] = torch.load(outputs_file, weights_only=True)
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("auto", "reference", "tensorrt"), default="auto")
    parser.add_argument("--out", type=Path, help="where to write the ExportedProgram (default: a temporary file)")
    parser.add_argument("--no-retrace", action="store_true", help="build the program without re-exporting")
    parser.add_argument(
        "--format",
        choices=("exported_program", "aot_inductor"),
        default="exported_program",
        help="what to save: an ExportedProgram, or an AOTInductor package (compiles C++, takes a while)",
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), help="where the model runs (default: cuda for TensorRT, else cpu)"
    )
    args = parser.parse_args(argv)

    backend = args.backend
    why_not = tensorrt_available()
    if backend == "auto":
        backend = "reference" if why_not else "tensorrt"
        if why_not:
            print(f"TensorRT not used: {why_not}; compiling with the reference backend")
    elif backend == "tensorrt" and why_not:
        print(f"error: --backend tensorrt: {why_not}", file=sys.stderr)
        return 2

    device = args.device or ("cuda" if backend == "tensorrt" else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device on this machine", file=sys.stderr)
        return 2
    if backend == "tensorrt" and device != "cuda":
        print("error: TensorRT engines run on CUDA: drop --device cpu or pass --backend reference", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = ConvBnRelu().eval().to(device)
    inputs = (torch.randn(2, 3, 16, 16, device=device),)
    compiled = compile_model(backend, model, inputs)
    print(f"compiled on the {backend} backend, on {device}:")
    if backend == "reference":
        print(f"  rehearsed on {compiled.trt_inline_pipeline}")
    describe(compiled)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = args.out or workdir / "relu_fallback.pt2"
        started = time.monotonic()
        trt_inline.save(compiled, path, arg_inputs=inputs, retrace=not args.no_retrace, output_format=args.format)
        seconds = time.monotonic() - started
        print(
            f"saved {path} ({args.format}, {path.stat().st_size} bytes, retrace={not args.no_retrace}, {seconds:.1f} s)"
        )
        loaded = load_in_fresh_process(path, inputs, workdir, args.format)
        # Verified as a file from anyone would be (sandboxed child); our own file, so its TensorRT engines
        # and package library (native code) may be loaded.
        native = backend == "tensorrt" or args.format == "aot_inductor"
        report = trt_inline.verify(path, allow_native_code=native)
        print(report.to_text().splitlines()[0])

    with torch.no_grad():
        expected: Any = compiled(*inputs)
        eager: Any = model(*inputs)
    diff = max((a.cpu() - b).abs().max().item() for a, b in zip(expected, loaded, strict=True))
    eager_diff = max((a - b).abs().max().item() for a, b in zip(eager, expected, strict=True))
    on_device = all(o.device.type == device for o in expected)
    print(f"max abs diff, loaded vs in-memory compiled module: {diff:.3g}")
    print(f"max abs diff, compiled vs eager PyTorch:            {eager_diff:.3g}")
    if not report.ok:
        print(f"FAIL: verify: {report.to_text()}", file=sys.stderr)
        return 1
    if not on_device:
        print(f"FAIL: the compiled module's outputs are not on {device}", file=sys.stderr)
        return 1
    if diff > TOLERANCE[backend]:
        print(f"FAIL: loaded program differs by {diff} (tolerance {TOLERANCE[backend]})", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
