"""One step of the save -> load -> verify loop on a large model, measured in its own process.

``python tests/support/memory_steps.py STEP FOLDER --layers L --width W`` builds a chain of
``L`` ``Linear(W, W)`` layers with ``relu`` falling back between them (``L``
engines, every weight in an engine), runs ``STEP`` and prints one JSON line:
the step's peak resident memory above the resident memory just before it (the
compiled module and its inputs for a save; ``import trt_inline`` for a load or a
verify), and of that the peaks of anonymous memory (heap, copies) and of
file-backed memory (mapped weights, sampled every few milliseconds), the tensor
bytes of the module, the file's size and the seconds taken.

Peak memory is the kernel's high-water mark (``VmHWM``), reset before the step
through ``/proc/self/clear_refs``; for ``verify`` and ``inspect`` it is the child
process that loads the file, as it reports it, above that child's own resident
memory once its imports are done.

Steps (the file each writes or reads is ``FOLDER/<name>``):

* ``floor``: ``torch.export.save`` of the plain model's ExportedProgram (``plain.pt2``).
* ``save`` / ``save-no-retrace``: ``trt_inline.save`` with ``retrace=True`` / ``False`` (``model.pt2``).
* ``plugin-save``: the registration's patched save path (``trt_inline.plugin.save``) where
  ``torch_tensorrt`` is importable; else reported as not run.
* ``package``: ``trt_inline.save(output_format="aot_inductor")`` (``model.package.pt2``).
* ``package-floor``: AOTInductor's own compile of the plain model (``plain.package.pt2``).
* ``load``: ``trt_inline.load`` of ``model.pt2`` (weights mapped) and one call of its module.
* ``load-stock``: ``torch.export.load`` of ``model.pt2`` and one call of its module.
* ``load-floor``: ``torch.export.load`` of ``plain.pt2`` (what torch's own loader costs).
* ``verify``: ``trt_inline.verify`` of ``model.pt2`` against its embedded reference I/O.
* ``verify-per-engine``: the same, engine by engine (``per_engine=True``; the saves embed boundary data).
* ``inspect``: ``trt-inline inspect``'s child on ``model.pt2`` (the program without its weights).

The benchmark (``benchmarks/bench_memory.py``) and the memory test both run it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

STEPS = (
    "floor", "save", "save-no-retrace", "package", "package-floor", "load", "load-stock", "load-floor", "verify",
    "verify-per-engine", "inspect",
)  # fmt: skip
READ_STEPS = ("load", "load-stock", "load-floor", "verify", "verify-per-engine", "inspect")


def resident() -> int:
    """This process's resident memory now, in bytes."""
    return _status_field("VmRSS")


def peak_resident() -> int:
    """This process's resident high-water mark since the last :func:`reset_peak`, in bytes."""
    return _status_field("VmHWM")


def reset_peak() -> None:
    """Reset the kernel's high-water mark to the current resident memory (Linux 4.0 and later)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _status_field(name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {name}")


def build_chain(layers: int, width: int) -> tuple[Any, tuple[Any, ...]]:
    """A chain of ``layers`` ``Linear(width, width)`` with ``relu`` between them, and one input row batch."""
    import torch

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width, device="meta") for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    model = Chain()
    generator = torch.Generator().manual_seed(0)
    scale = width**-0.5
    for layer in model.layers:
        # Filled in place: the default initialisation would cost more time than any step measured.
        weight = torch.empty(width, width).uniform_(-scale, scale, generator=generator)
        bias = torch.empty(width).uniform_(-scale, scale, generator=generator)
        layer.weight = torch.nn.Parameter(weight)
        layer.bias = torch.nn.Parameter(bias)
    return model.eval(), (torch.randn(4, width, generator=generator),)


def tensor_bytes(module: Any) -> int:
    """Bytes of every distinct tensor storage a module holds (parameters, buffers, engine payloads)."""
    seen: dict[int, int] = {}
    for tensor in (*module.parameters(), *module.buffers()):
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def run_step(step: str, folder: Path, layers: int, width: int) -> dict[str, Any]:
    """Run one step in this process; the figures described in the module docstring."""
    import torch

    import trt_inline

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    warnings.filterwarnings("ignore")
    result: dict[str, Any] = {"step": step, "layers": layers, "width": width}
    action: Callable[[], Any]
    if step in READ_STEPS:
        path = folder / ("plain.pt2" if step == "load-floor" else "model.pt2")
        result["file_bytes"] = path.stat().st_size
        if step in ("load", "load-stock", "load-floor"):
            opener = trt_inline.load if step == "load" else torch.export.load

            def action() -> Any:
                program = opener(path)
                with torch.no_grad():
                    return program, program.module()(*program.example_inputs[0])

        elif step == "inspect":

            def action() -> Any:
                from trt_inline.commands.inspect import InspectRequest
                from trt_inline.isolation import Limits, run_isolated
                from trt_inline.verify.options import Trust

                request = InspectRequest.of(str(path), Trust())
                limits = Limits.for_file(path, None, None)
                return run_isolated(request, None, limits, where=str(path), files=(str(path),))

        else:

            def action() -> Any:
                report = trt_inline.verify(path, per_engine=step == "verify-per-engine")
                if not report.ok:
                    raise RuntimeError(f"verify failed: {report.to_text()}")
                return report

        _measure(action, result)
        if step in ("load", "load-stock", "load-floor"):
            program, outputs = result.pop("value")
            expected = torch.load(folder / f"{path.stem}.expected.pt", weights_only=True)
            result["max_abs_diff"] = float((outputs - expected).abs().max())
            result["engine_calls"] = sum(1 for n in program.graph.nodes if "execute_engine" in str(n.target))
            result["call_modules"] = sum(1 for n in program.graph.nodes if n.op == "call_module")
        result.pop("value", None)
        return result

    model, inputs = build_chain(layers, width)
    if step in ("floor", "package-floor"):
        program = torch.export.export(model, inputs)
        result["tensor_bytes"] = tensor_bytes(model)
        target = folder / ("plain.pt2" if step == "floor" else "plain.package.pt2")
        if step == "floor":
            action = lambda: torch.export.save(program, target)  # noqa: E731
        else:
            action = lambda: torch._inductor.aoti_compile_and_package(program, package_path=str(target))  # noqa: E731
    else:
        compiled = trt_inline.reference.compile(model, inputs, torch_executed_ops={"torch.ops.aten.relu.default"})
        model = None
        gc.collect()
        result["tensor_bytes"] = tensor_bytes(compiled)
        if step == "package":
            target = folder / "model.package.pt2"
            action = lambda: trt_inline.save(compiled, target, arg_inputs=inputs, output_format="aot_inductor")  # noqa: E731
        else:
            target = folder / "model.pt2"
            retrace = step == "save"
            action = lambda: trt_inline.save(  # noqa: E731
                compiled, target, arg_inputs=inputs, retrace=retrace, embed_reference="boundaries"
            )
    _measure(action, result)
    result.pop("value", None)
    result["file_bytes"] = target.stat().st_size
    if step != "package-floor":
        with torch.no_grad():
            reference = model if step == "floor" else compiled
            torch.save(reference(*inputs), folder / f"{target.name.split('.')[0]}.expected.pt")
    return result


def _measure(action: Callable[[], Any], result: dict[str, Any]) -> dict[str, Any]:
    from trt_inline.isolation import MemorySampler

    gc.collect()
    before = resident()
    reset_peak()
    start = time.perf_counter()
    with MemorySampler() as sampler:
        value = action()
    result["seconds"] = time.perf_counter() - start
    result["peak_extra_bytes"] = peak_resident() - before
    result["peak_anonymous_bytes"], result["peak_file_bytes"] = sampler.peaks()
    result["value"] = value
    if result["step"] in ("verify", "verify-per-engine", "inspect"):
        # The file is loaded and run in a child; its own peaks above its imports are what loading costs.
        result["parent_extra_bytes"] = result["peak_extra_bytes"]
        if result["step"] == "inspect":
            result["peak_extra_bytes"] = max(0, value.peak_rss - value.base_rss)
            result["peak_anonymous_bytes"], result["peak_file_bytes"] = value.peak_anonymous, value.peak_file
        else:
            result["peak_extra_bytes"] = value.child_peak_extra_bytes
            result["peak_anonymous_bytes"] = value.child_peak_anonymous_bytes
            result["peak_file_bytes"] = value.child_peak_file_bytes
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=STEPS)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--width", type=int, default=2048)
    args = parser.parse_args(argv)
    print(json.dumps(run_step(args.step, args.folder, args.layers, args.width)))
    return 0


def measure_in_child(step: str, folder: Path, layers: int, width: int, timeout: float = 1800) -> dict[str, Any]:
    """:func:`run_step` in a fresh interpreter (so nothing an earlier step allocated counts)."""
    import subprocess

    command = [sys.executable, __file__, step, str(folder), "--layers", str(layers), "--width", str(width)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"step {step} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    sys.exit(main())
