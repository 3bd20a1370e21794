"""``python -m trt_inline``: the ``trt-inline`` command line."""

import sys

from trt_inline.cli import main

sys.exit(main())
