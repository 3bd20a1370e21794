"""The inlining core: a partitioned module flattened into one graph, and that graph made an ExportedProgram.

``inline_trt_modules`` and ``inline_torch_modules`` (:mod:`.passes`) wire every submodule input
to its producer by argument position; the rest is what they stand on.

================  ====================================================================
module            concern
================  ====================================================================
``passes``        ``inline_trt_modules``, ``inline_torch_modules``, ``transform`` (a pass
                  per function, the graph before and after drawn in each docstring)
``flat_program``  an ExportedProgram built from a flat graph: attributes lifted, the
                  serializer's clean-ups
``scalars``       scalars at engine boundaries: what is one, the dtype it travels in,
                  both conversions
``symbolic``      size expressions: encoded for an engine program, evaluated, rebuilt as
                  ``sym_size`` arithmetic
``attributes``    dotted attributes resolved on a module
``module_state``  runs of a module that leave it as they found it (buffers put back)
================  ====================================================================

It sits on the core floor (``python3 .ci/imports``): the reference backend, the archive and
verification use it; it imports only :mod:`trt_inline.compat`, :mod:`trt_inline.engines` and the
other core modules.
"""
