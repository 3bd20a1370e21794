"""The ``trt-inline`` commands: one module per verb over shared argument groups.

Each verb's module holds its parser (``add_parser``: the argument groups it subscribes to, and its own
arguments), the parent's call (``run``), and, where it opens a file, its request type and the job its child
runs (registered with :func:`trt_inline.isolation.job`). :mod:`trt_inline.cli` only dispatches.

==============  ====================================================================
module          concern
==============  ====================================================================
``arguments``   the argument groups every command subscribes to: each flag declared
                once (:mod:`trt_inline.verify.options`' groups, ``CommandFlags``)
``output``      what every command writes: reports printed escaped, JUnit, the chart,
                the exit status of a verdict; the tensor files a command line names
``junit``       verdicts as a JUnit XML report (``--junit FILE``)
``plot``        the error at each boundary as a chart (``--plot FILE``)
``doctor``      ``trt-inline doctor``: versions, CUDA, rehearsal, sandbox, patch
``verify``      ``trt-inline verify``: one file, or the cases of ``--cases DIR``
``ranks``       rank sets: ``verify --ranks N`` and a template under torchrun (one
                sandboxed child per rank, collectives relayed, one report)
``diff``        ``trt-inline diff``: two saves compared at every engine boundary
``inspect``     ``trt-inline inspect``: the table of engines and fallbacks
                (``InspectRequest``, ``inspect_job``)
``check``       ``trt-inline check``: what each engine needs, against this machine
                or ``--target`` (``NeedsRequest``, ``needs_job``)
``fix``         ``trt-inline fix``: ``find_fix`` on a script's model; ``--out``
==============  ====================================================================

It is the top floor with the other entry points: it imports :mod:`trt_inline.verify`,
:mod:`trt_inline.fixing`, :mod:`trt_inline.isolation` and what is below them.
"""
