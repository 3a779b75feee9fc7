"""Forward kernels that run the hybrid plan's id-ordered task list (schedule.task_list) in one
launch: a task is a row group (code g >= 0, _row_group) or a long-row piece (code -1 - s,
_csr_piece). Each row is reduced by the same code as in the two-launch plan, whichever program
runs it: bitwise the same result.

  * ``_one_pass_kernel``: one program per (task, feature tile).
  * ``_sm_queue_kernel``: a persistent grid. The task list is cut into one contiguous share per
    SM (a queue, one per feature tile); a program takes the next task of the queue of the SM it
    runs on (one atomic per task), then steals from the other queues once its own is empty. The
    programs that share an SM's L1 thus work on neighbouring rows at the same time, which read the
    same source rows when the ids carry locality. Where the SM's id cannot be read (the
    interpreter), every program starts at queue 0: the same tasks, the same results.

Eviction hints (X_EVICT, STREAM_EVICT): see _csr_piece.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import fast_kernel
from .gather_scatter_fwd_kernels import _csr_piece, _row_group


@triton.jit
def _run_task(code, ft, x_ptr, rows_ptr, num_rows, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr,
              seg_row_ptr, seg_ptr_ptr, slot_ptr, F,
              REDUCE: tl.constexpr, HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr,
              ROWS: tl.constexpr, SEG: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
              X_EVICT: tl.constexpr, STREAM_EVICT: tl.constexpr):
    if code >= 0:
        _row_group(code, ft, x_ptr, rows_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, num_rows, F,
                   REDUCE, HAS_W, ACC64, TRACK, ROWS, BLOCK_F, X_EVICT, STREAM_EVICT)
    else:
        _csr_piece(-1 - code, ft, x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr,
                   seg_row_ptr, seg_ptr_ptr, slot_ptr, F, REDUCE, HAS_W, ACC64, TRACK, SEG, BLOCK_E, BLOCK_F,
                   X_EVICT, STREAM_EVICT)


@fast_kernel
@triton.jit
def _one_pass_kernel(x_ptr, rows_ptr, num_rows, task_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr,
                     parg_ptr, seg_row_ptr, seg_ptr_ptr, slot_ptr, F,
                     REDUCE: tl.constexpr, HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr,
                     ROWS: tl.constexpr, SEG: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
                     X_EVICT: tl.constexpr, STREAM_EVICT: tl.constexpr):
    """The hybrid plan in one launch: program (t, ft) runs task t, so the long rows of a window
    run next to its short rows and the source rows they share are read from DRAM once, not once
    per kernel."""
    code = tl.load(task_ptr + tl.program_id(0))
    _run_task(code, tl.program_id(1), x_ptr, rows_ptr, num_rows, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr,
              part_ptr, parg_ptr, seg_row_ptr, seg_ptr_ptr, slot_ptr, F, REDUCE, HAS_W, ACC64, TRACK, ROWS, SEG,
              BLOCK_E, BLOCK_F, X_EVICT, STREAM_EVICT)


@triton.jit
def _sm_id(READ_SMID: tl.constexpr):
    """The id of the SM this program runs on (PTX %smid), or 0 when READ_SMID is off."""
    if READ_SMID:
        smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    else:
        smid = tl.program_id(0) * 0
    return smid


@fast_kernel
@triton.jit
def _sm_queue_kernel(x_ptr, rows_ptr, num_rows, task_ptr, num_tasks, share, queue_ptr, num_queues, rowptr_ptr,
                     col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr, seg_row_ptr, seg_ptr_ptr, slot_ptr, F,
                     REDUCE: tl.constexpr, HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr,
                     ROWS: tl.constexpr, SEG: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
                     READ_SMID: tl.constexpr, X_EVICT: tl.constexpr, STREAM_EVICT: tl.constexpr):
    """Persistent programs over SM queues (module docstring). Queue q of feature tile ft holds
    tasks [q * share, (q + 1) * share); queue_ptr[ft * num_queues + q] counts the tasks taken
    from it (zeroed before the launch). A program leaves once every queue of its tile is empty,
    so every task runs exactly once whichever SMs the programs land on."""
    ft = tl.program_id(1)
    home = _sm_id(READ_SMID) % num_queues
    counters = queue_ptr + ft * num_queues
    i = 0
    while i < num_queues:
        q = (home + i) % num_queues
        k = tl.atomic_add(counters + q, 1, sem="relaxed")
        t = q.to(tl.int64) * share + k
        if (k < share) & (t < num_tasks):
            code = tl.load(task_ptr + t)
            _run_task(code, ft, x_ptr, rows_ptr, num_rows, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr,
                      parg_ptr, seg_row_ptr, seg_ptr_ptr, slot_ptr, F, REDUCE, HAS_W, ACC64, TRACK, ROWS, SEG,
                      BLOCK_E, BLOCK_F, X_EVICT, STREAM_EVICT)
        else:
            i += 1
