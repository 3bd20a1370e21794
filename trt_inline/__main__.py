"""``python -m trt_inline``: the ``trt-inline`` command line, started as the ``trt-inline`` script starts it (the
package's import started the child's interpreter first: :mod:`trt_inline`)."""

import sys

from trt_inline.cli import main
from trt_inline_command import exit_with

exit_with(main())
sys.exit(2)  # (not reached)
