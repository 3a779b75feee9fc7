"""Numbers that several modules of gnnfuse must agree on, defined once.

What belongs here: a value read by two or more modules, which would have to change everywhere at
once -- the dtype tables, the limits of the index types, numerical conventions copied from PyG and
hardware fallbacks. Reduce names and their integer codes have their own table (gnnfuse/reductions.py,
mirrored by csrc/reduce_codes.h); settings read from the environment are in gnnfuse/config.py.

What does not: per-kernel tuning (tile sizes, warps, edges per program, the thresholds of a dispatch
plan) stays next to its kernel, with the measurement that chose it (triton/gather_scatter_dispatch.py,
triton/attention.py, triton/schedule.py, ...); so do a module's own knobs (the locality windows, the
METIS part size) and Triton's own rules that a module mirrors (the int32 test of its specialisation
key in triton/_launch.py).
"""
from __future__ import annotations

import torch

# ---- dtypes ---------------------------------------------------------------------------------------
INDEX_DTYPES = (torch.int32, torch.int64)  # node and edge ids the ops take
VALUE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # features, weights
HALF_DTYPES = (torch.float16, torch.bfloat16)  # 16-bit floats: accumulated (and atomically added) in float32

# ---- limits ---------------------------------------------------------------------------------------
INT32_MAX = 2**31 - 1  # int32 indices address at most this many nodes, edges or map voxels
SEED_BOUND = 2**31  # dropout seeds are ints in [0, SEED_BOUND): the kernels take them as int32

# ---- numerical conventions ------------------------------------------------------------------------
# PyG's StdAggregation: sqrt(max(var, STD_FLOOR)), set to 0 where that is <= STD_CUT. The C++ kernel
# (csrc/multi_aggregate.cpp) writes the same numbers; tests compare both backends with the reference.
STD_FLOOR = 1e-5
STD_CUT = STD_FLOOR**0.5

# ---- hardware fallbacks ---------------------------------------------------------------------------
DEFAULT_L2_BYTES = 50 * 2**20  # an H100's L2, assumed where the device's own size cannot be read
