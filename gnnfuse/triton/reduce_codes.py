"""The reduce codes as Triton compile-time constants, for kernels that take ``REDUCE: tl.constexpr``
(``if REDUCE == MAX:`` is resolved when the kernel compiles). The values come from the one table,
gnnfuse/reductions.py, which csrc/reduce_codes.h mirrors (tests/test_reductions.py checks that the
three agree). Host code passes the plain ints of gnnfuse.reductions as ``REDUCE=``."""
from __future__ import annotations

import triton.language as tl

from ..reductions import CODES

SUM = tl.constexpr(CODES["sum"])
MEAN = tl.constexpr(CODES["mean"])
MAX = tl.constexpr(CODES["max"])
MIN = tl.constexpr(CODES["min"])
MUL = tl.constexpr(CODES["mul"])
VAR = tl.constexpr(CODES["var"])
STD = tl.constexpr(CODES["std"])
