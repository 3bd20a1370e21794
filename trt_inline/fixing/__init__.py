"""From finding to fixing: the compile settings that bring a reduced-precision build within tolerance.

:func:`find_fix` compiles a model with the user's settings (``torch_tensorrt.dynamo.compile`` where TensorRT
runs here, the reference backend otherwise, whose engines compute as a reduced-precision build does:
:mod:`trt_inline.reference.precision`), compares every case with the model's own fp32 outputs, and where a
case is out of tolerance searches for a small set of nodes that, kept in fp32
(``strategy="higher_precision"``: ``autocast_excluded_nodes``) or run in PyTorch (``strategy="fallback"``:
``torch_executed_ops``, by operator), brings every case within it. It answers in the user's terms: the
settings to pass and the call to paste, each node with its module path and source line. ``trt-inline fix
SCRIPT`` runs it on a script that builds the model (:mod:`.script`). Nothing in :mod:`trt_inline.verify`
imports this package: it uses verify's comparison and options, never the other way.

==================  ==========================================================================
module              concern
==================  ==========================================================================
``runner``          ``find_fix``: the compiles, the budget, Ctrl-C, the report put together
``search``          the search: a small set of candidates that passes, by group testing
``candidates``      what the search chooses among (nodes, or operators), in the user's terms
``builds``          one build with a set changed: the default compile, its settings, the call
                    to paste, its error per case, its engines and fallbacks
``build_cases``     the cases a build is held to: a ``--cases`` folder, or inputs run in fp32
``fix_report``      ``FixReport`` (text and JSON), ``FixedNode``, ``CaseError``
``script``          a user's script as ``trt-inline fix`` reads it: the model, its inputs, settings
``out``             ``fix --out``: the build with the settings found saved and verified
==================  ==========================================================================
"""

from trt_inline.errors import FixError
from trt_inline.fixing.fix_report import FixedNode, FixReport
from trt_inline.fixing.runner import find_fix

__all__ = ["FixError", "FixReport", "FixedNode", "find_fix"]
