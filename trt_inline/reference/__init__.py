"""A CPU reference backend with the module structure of ``torch_tensorrt.dynamo.compile``.

``trt_inline.reference.compile(model, inputs, torch_executed_ops=..., ...)`` gives
a partitioned module of ``_run_on_acc_N`` engines (:class:`ReferenceEngine`) and
``_run_on_gpu_N`` fallbacks: the importable Torch-TensorRT release's own pipeline
where there is one (its dry run, engines replaced), trt-inline's own otherwise.
The engine op ``torch.ops.trt_inline.execute_engine`` (what loading a saved file
needs) is defined by trt-inline's entry point at ``import torch``, or by ``import
trt_inline`` where that did not run (:mod:`trt_inline.operators`); the partitioners,
which reach into ``torch.fx.passes.splitter_base`` or a release, are imported only
when ``compile`` is first used.

=============  =====================================================================
module         concern
=============  =====================================================================
``backend``    ``reference.compile``: the release's pipeline where one imports, else trt-inline's own
``release``    the bridge to a Torch-TensorRT release's own pipeline (dry run in a forked child)
``handover``   the partitioned module handed back from that child, rebuilt node by node
``lowered``    the nodes a build lowered: operator, module path, dtype, block
``partition``  trt-inline's own partitioner: which nodes become engines, which fall back
``engine``     the reference engine, a CPU (and CUDA) stand-in for a TensorRT engine
``program``    an engine's ATen graph as JSON, decoded and run
``precision``  reduced precision (fp16, bf16, TF32) as a TensorRT build computes it,
               emulated in an engine's own program
=============  =====================================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trt_inline.reference.engine import ReferenceEngine

if TYPE_CHECKING:
    from trt_inline.reference.backend import compile

__all__ = ["ReferenceEngine", "compile"]


def __getattr__(name: str) -> Any:
    if name == "compile":
        from trt_inline.reference.backend import compile

        return compile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
