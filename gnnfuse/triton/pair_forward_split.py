"""The pair forward's loop (GATv2 / dot product without edge features; attention_forward_kernels.py's
``_pair_forward_one_pass_kernel`` with SPLIT > 1) on [T, R, HB, SPLIT, V] tiles: a head's FB features
as SPLIT pieces of T threads x V elements (V: one 16-byte vector; feature s * T * V + t * V + v), so that
a thread holds SPLIT vectors of one (row, head) pair instead of one vector of SPLIT pairs.

Why: Triton lays a [R, HB, FB] tile out with one 16-byte vector a thread along the features (FB / V
threads a head: 8 at 64 bfloat16 features) and puts the tile's further elements on more rows or heads, so
each (row, head) pair's per-edge work (the logit's cross-thread sum, the dropout hash, the online softmax's
max and exponential) runs on every one of those threads, for each of its pairs. Triton 3.6 gives the
contiguous axis (V) the vector, then fills lanes and warps along the other axes in index order and repeats
the last one inside a thread: here T, R and HB take the lanes and warps and SPLIT stays in the thread, so
SPLIT x fewer threads share a pair and a thread does a pair's work once for SPLIT vectors (the wide GATv2
loop with dropout: 213 instructions a step for one pair of 16 bfloat16 features a thread, against 253 for
two pairs of 8; 190 since the logit's rewrite and _widen; sm_90 SASS, see the results files named in
FORWARD_LOOP's comment).

Bits: the dot product's logit sum is written in the 3D kernel's order (each thread's vector in order, then the
threads' sums by the butterfly: here the SPLIT pieces of a thread first, which is the butterfly's first step there),
kept where the compiler keeps it, not promised (it may fuse another product of a thread's sum into an FMA: float32
at 3 x 16 differed in the last bit on an H100). GATv2's logit is computed another way than the 3D loop's
(_logit5: a . leaky_relu(k + q) as slope (a . k) + (1 - slope) (a . max(k, -q)) + a . q, one instruction a
feature fewer), so its logits, hence its outputs and saved row statistics, differ from the 3D loop's and the
backward's recomputed logits by rounding (the backward normalises its recomputed weights by the saved max and sum;
the tests' reference tolerances hold). A split row's lanes fold in another order (R lanes over threads, not warps),
so its sums round differently too. Same bits run to run.
Only SPLIT 2 (the in-thread step that matches the butterfly's first), 16-byte loads (DENSE) and rows
filling the program's threads (R >= 32 * num_warps / (T * HB)); the kernel checks the first two. Loads
one step ahead or not (AHEAD 0 or 1; a larger AHEAD, e.g. attention.FORWARD_AHEAD = 2, runs as 1).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .attention_kernels import NEG_INF, _endpoints, _piece_at
from .pair_attention_kernels import _masked_logit

# bfloat16 widened by a shift and a mask in inline PTX (_widen) where the kernels are compiled; the interpreter
# runs no PTX (triton.jit makes interpreted functions by the same setting, read at import as here)
BF16_BITS = tl.constexpr(not triton.knobs.runtime.interpret)


@triton.jit
def _feats5(SPLIT: tl.constexpr, T: tl.constexpr, V: tl.constexpr):
    """[T, 1, 1, SPLIT, V]: a head's feature index of each tile element."""
    t = tl.arange(0, T)[:, None, None, None, None]
    s = tl.arange(0, SPLIT)[None, None, None, :, None]
    v = tl.arange(0, V)[None, None, None, None, :]
    return s * (T * V) + t * V + v


@triton.jit
def _gather5(t, j, v2, heads, f5, H, FB: tl.constexpr, ACC: tl.constexpr):
    """[T, R, HB, SPLIT, V]: rows ``j`` [R] of a [N, H, FB] tensor where v2 [R, HB], 0 elsewhere."""
    ptrs = t + j[None, :, None, None, None] * H * FB + heads[None, None, :, None, None] * FB + f5
    mask = tl.broadcast_to(v2[None, :, :, None, None], ptrs.shape)
    return _widen(tl.load(ptrs, mask=mask, other=0), ACC)


@triton.jit
def _widen(x, ACC: tl.constexpr):
    """x as ACC. bfloat16 (with float32 ACC): each 32-bit register of two, a thread's consecutive elements, by a
    shift (the first) and a mask (the second), one instruction an element; the conversion takes 1.5 (the second
    half moved down, then shifted up: PRMT and IMAD.U32 in sm_90 SASS)."""
    if BF16_BITS and x.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise("shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000;", "=r,=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=2)
    return x.to(ACC)


@triton.jit
def _loads5(ks, ids, end, stop, node, heads, hmask, f5, k, v, H, SELF_LOOPS: tl.constexpr, KV_SAME: tl.constexpr,
            FB: tl.constexpr, ACC: tl.constexpr):
    """A step's loads (as _pair_terms and _values): (valid [R, HB], real edge [R], keys, values)."""
    real = ks < end
    other = tl.where(real, ids.to(node.dtype), node)
    valid = ks < stop
    if SELF_LOOPS:
        valid = valid & ~(real & (other == node))
    else:
        valid = valid & real
    v2 = valid[:, None] & hmask[None, :]
    kv = _gather5(k, other, v2, heads, f5, H, FB, ACC)
    if KV_SAME:
        xv = kv
    else:
        xv = _gather5(v, other, v2, heads, f5, H, FB, ACC)
    return v2, real, kv, xv


@triton.jit
def _logit5(kv, qi, a, aq, v2, real, ks, node, heads, N_EDGES, H, slope, qk_scale, seed, threshold, scale,
            DROPOUT: tl.constexpr, GATV2: tl.constexpr, ACC: tl.constexpr):
    """_pair_logit's maths on [T, R, HB, SPLIT, V] tiles: (e [R, HB], -inf where invalid; dropout factor).
    GATv2 as a . leaky_relu(k + q) = slope (a . k) + (1 - slope) (a . max(k, -q)) + a . q (leaky_relu(u) =
    slope u + (1 - slope) relu(u), relu(k + q) = max(k, -q) + q, any slope): qi holds -q and aq [R, HB] the row's
    a . q, so that a feature takes a max and two FMAs instead of an add, a compare, a multiply and an FMA."""
    if GATV2:
        s1 = tl.sum(tl.sum(kv * a, 4), 3)  # [T, R, HB]: a thread's vectors in order, then its SPLIT pieces
        s2 = tl.sum(tl.sum(tl.maximum(kv, qi) * a, 4), 3)
        e = tl.sum(s2 + (s1 - s2) * slope, 0) + aq  # then its T threads
    else:
        # a thread's vectors in order, its SPLIT pieces, then its T threads (the 3D sum's order)
        e = tl.sum(tl.sum(tl.sum(kv * qi, 4), 3), 0) * qk_scale
    return _masked_logit(e, v2, real, ks, node, heads, N_EDGES, H, seed, threshold, scale, DROPOUT, ACC)


@triton.jit
def _step5(m, z, acc, e, keep, xv):
    """_online_step with acc [T, R, HB, SPLIT, V] (the same values, bit for bit)."""
    m_new = tl.maximum(m, e)
    m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)
    rises = e > m
    x = tl.exp(tl.where(rises, m, e) - m_safe)
    rescale = tl.where(rises, x, 1.0)
    w = tl.where(rises, 1.0, x)
    return m_new, z * rescale + w, acc * rescale[None, :, :, None, None] + (w * keep)[None, :, :, None, None] * xv


@triton.jit
def _pair_split_loop(q, k, v, att, rowptr, col, out, m_out, z_out, seg_row, seg_ptr, slot, p_acc, p_m, p_z,
                     group, code, node, used, start, end, stop, step, steps, NUM_LOOPS, N_EDGES, H, slope,
                     qk_scale, seed, threshold, scale, SELF_LOOPS: tl.constexpr, DROPOUT: tl.constexpr,
                     GATV2: tl.constexpr, KV_SAME: tl.constexpr, ACC: tl.constexpr, HB: tl.constexpr,
                     FB: tl.constexpr, R: tl.constexpr, SEG: tl.constexpr, DENSE: tl.constexpr, AHEAD: tl.constexpr,
                     SPLIT: tl.constexpr):
    """The pair forward's loop and stores for the task _task_lanes gave (module docstring)."""
    V: tl.constexpr = 128 // k.dtype.element_ty.primitive_bitwidth
    T: tl.constexpr = FB // (SPLIT * V)
    tl.static_assert(DENSE and SPLIT == 2 and T * SPLIT * V == FB)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    hmask = heads < H
    f5 = _feats5(SPLIT, T, V)
    qi = _gather5(q, node, used[:, None] & hmask[None, :], heads, f5, H, FB, ACC)
    if GATV2:
        a = tl.load(att + heads[None, None, :, None, None] * FB + f5,
                    mask=tl.broadcast_to(hmask[None, None, :, None, None], (T, 1, HB, SPLIT, V)), other=0).to(ACC)
    else:
        a = tl.zeros((T, 1, HB, SPLIT, V), ACC)
    if GATV2:  # _logit5's terms: -q and the row's a . q
        aq = tl.sum(tl.sum(tl.sum(qi * a, 4), 3), 0)
        qi = -qi
    else:
        aq = tl.zeros((R, HB), ACC)
    m = tl.full((R, HB), NEG_INF, ACC)
    z = tl.zeros((R, HB), ACC)
    acc = tl.zeros((T, R, HB, SPLIT, V), ACC)
    ids = _endpoints(col, start, end)
    if AHEAD > 0:  # step t + 1's loads before step t's maths (as the 3D loop)
        nxt = _loads5(start, ids, end, stop, node, heads, hmask, f5, k, v, H, SELF_LOOPS, KV_SAME, FB, ACC)
        ids = _endpoints(col, start + step, end)
    for t in range(0, steps):
        ks = start + t * step
        if AHEAD > 0:
            v2, real, kv, xv = nxt
            nxt = _loads5(ks + step, ids, end, stop, node, heads, hmask, f5, k, v, H, SELF_LOOPS, KV_SAME, FB, ACC)
            ids = _endpoints(col, ks + 2 * step, end)
        else:
            ids_this = ids
            ids = _endpoints(col, ks + step, end)
            v2, real, kv, xv = _loads5(ks, ids_this, end, stop, node, heads, hmask, f5, k, v, H, SELF_LOOPS, KV_SAME,
                                       FB, ACC)
        e, keep = _logit5(kv, qi, a, aq, v2, real, ks, node, heads, N_EDGES, H, slope, qk_scale, seed, threshold, scale,
                          DROPOUT, GATV2, ACC)
        m, z, acc = _step5(m, z, acc, e, keep, xv)
    _finish5(group, code, node, used, seg_row, seg_ptr, slot, rowptr, out, m_out, z_out, p_acc, p_m, p_z, heads,
             hmask, f5, H, m, z, acc, NUM_LOOPS, FB, SEG)


@triton.jit
def _finish5(group, code, node, used, seg_row, seg_ptr, slot, rowptr, out, m_out, z_out, p_acc, p_m, p_z, heads,
             hmask, f5, H, m, z, acc, NUM_LOOPS, FB: tl.constexpr, SEG: tl.constexpr):
    """attention_forward_kernels._finish on [T, R, HB, SPLIT, V] tiles."""
    if group:
        inv = tl.where(z > 0, 1.0 / tl.where(z > 0, z, 1.0), 0.0)
        rh = used[:, None] & hmask[None, :]
        ptrs = out + node[None, :, None, None, None] * H * FB + heads[None, None, :, None, None] * FB + f5
        tl.store(ptrs, (acc * inv[None, :, :, None, None]).to(out.dtype.element_ty),
                 mask=tl.broadcast_to(rh[None, :, :, None, None], ptrs.shape))
        tl.store(m_out + node[:, None] * H + heads[None, :], tl.where(z > 0, m, 0.0), mask=rh)
        tl.store(z_out + node[:, None] * H + heads[None, :], z, mask=rh)
    else:
        m1 = tl.max(m, 0)
        m_safe = tl.where(m1 == NEG_INF, 0.0, m1)  # no edge in the piece
        lane_scale = tl.exp(m - m_safe[None, :])  # 0 for lanes without an edge
        z1 = tl.sum(z * lane_scale, 0)
        acc1 = tl.sum(acc * lane_scale[None, :, :, None, None], 1)  # [T, HB, SPLIT, V]
        row, _k, _first, _end, _stop, part = _piece_at(-1 - code, seg_row, seg_ptr, slot, rowptr, NUM_LOOPS, SEG)
        offs = heads[None, :, None, None] * FB + tl.reshape(f5, (f5.shape[0], 1, f5.shape[3], f5.shape[4]))
        hm = tl.broadcast_to(hmask[None, :, None, None], acc1.shape)
        if part < 0:  # the whole row
            inv = tl.where(z1 > 0, 1.0 / tl.where(z1 > 0, z1, 1.0), 0.0)
            tl.store(out + row * H * FB + offs, (acc1 * inv[None, :, None, None]).to(out.dtype.element_ty), mask=hm)
            tl.store(m_out + row * H + heads, tl.where(z1 > 0, m1, 0.0), mask=hmask)
            tl.store(z_out + row * H + heads, z1, mask=hmask)
        else:
            tl.store(p_acc + part * H * FB + offs, acc1, mask=hm)
            tl.store(p_m + part * H + heads, m1, mask=hmask)
            tl.store(p_z + part * H + heads, z1, mask=hmask)


def split_for(split: int, F: int, fb: int, hb: int, rows: int, warps: int, itemsize: int, flags: tuple) -> int:
    """The SPLIT the pair forward runs with (host side): the loop table's where this loop applies (SPLIT 2, no
    edge features, 16-byte loads (F == fb), a head of at least SPLIT vectors, and T x rows x heads lanes enough
    for the program's threads, so that no thread or warp splits a pair's SPLIT axis), else 1 (the 3D loop)."""
    vec = 16 // itemsize
    if split != 2 or dict(flags).get("HAS_EDGE") or F != fb or fb % (split * vec):
        return 1
    return split if fb // (split * vec) * hb * rows >= 32 * warps else 1
