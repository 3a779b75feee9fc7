"""Compiled-kernel check of the attention ops on CUDA (no C++ extension needed): every op's Triton
forward and gradients against the reference backend on the same GPU, on a sparse graph (4-edge
tiles: one warp in the forward, 2 in the backward; with wide heads, 2 x 64, one warp in both) and a
denser one (32-edge tiles), each with a hub row (split rows), with and without edge features, self
loops and dropout. The forwards run their row groups (rows of up to 64 edges, several rows per
program) next to the per-piece kernel (the longer rows, the hub's pieces) on every graph. The unit tests cover the same maths in the interpreter; this runs the compiled
kernels with the tile shapes the GPU actually gets.

    PYTHONPATH=. python benchmarks/gpu/check_attention.py
    PYTHONPATH=. TRITON_INTERPRET=1 python benchmarks/gpu/check_attention.py --small   # CPU, interpreter
    PYTHONPATH=. python benchmarks/gpu/check_attention.py --case wide   # only the graphs whose label has "wide"
    PYTHONPATH=. python benchmarks/gpu/check_attention.py --ahead 1   # the forwards with loads 1 step ahead
"""
from __future__ import annotations

import sys

import torch

import gnnfuse
from gnnfuse.graphs import random_graph


def grads(fn, tensors):
    out = fn()
    weight = torch.linspace(-1, 1, out.numel(), device=out.device, dtype=out.dtype).view_as(out)
    return [out, *torch.autograd.grad((out * weight).sum(), tensors)]


def compare(name, make, tensors):
    first = grads(lambda: make("triton"), tensors)  # Triton's own launch (compiles)
    got, ref = grads(lambda: make("triton"), tensors), grads(lambda: make("reference"), tensors)  # fast launch
    worst = max(float((a - b).abs().max() / (b.abs().max() + 1e-6)) for a, b in zip(got, ref))
    print(f"{name}: max relative error {worst:.2e}", flush=True)
    assert worst < 1e-4, name
    assert all(torch.equal(a, b) for a, b in zip(first, got)), f"{name}: the two launch paths differ"


def main():
    if "--ahead" in sys.argv:  # every forward loop's load order (attention.FORWARD_AHEAD)
        from gnnfuse.triton import attention

        attention.FORWARD_AHEAD = int(sys.argv[sys.argv.index("--ahead") + 1])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    div = 20 if "--small" in sys.argv else 1
    for label, n, e, H, F in (("sparse (average degree 6)", 3000 // div, 18000 // div, 4, 8),
                              ("dense (average degree 40)", 500 // div, 20000 // div, 4, 8),
                              ("sparse, wide heads 2x64", 3000 // div, 18000 // div, 2, 64)):
        if "--case" in sys.argv and sys.argv[sys.argv.index("--case") + 1] not in label:
            continue
        ei = random_graph(n, n, e, seed=1, power_law=True).to(dev)
        ei[1, : e // 10] = 0  # a hub row: split into pieces
        E = ei.shape[1]
        g = torch.Generator(device=dev).manual_seed(0)
        make = lambda *s: torch.randn(*s, device=dev, generator=g, requires_grad=True)  # noqa: E731
        q, k, v, att = make(n, H, F), make(n, H, F), make(n, H, F), make(H, F)
        edge = make(E + n, H, F)
        w = torch.rand(E, H, device=dev, generator=g, requires_grad=True)
        a_src, a_dst = make(n, H), make(n, H)
        for loops, p in ((False, 0.0), (True, 0.3)):
            kw = dict(add_self_loops=loops, dropout=p, seed=5)
            ea = edge[: E + (n if loops else 0)]
            compare(f"{label} gatv2 loops={loops} p={p}",
                    lambda b: gnnfuse.gatv2_attention(k, q, att, ei, backend=b, **kw), [q, k, att])
            compare(f"{label} gatv2+edge loops={loops} p={p}",
                    lambda b: gnnfuse.gatv2_attention(k, q, att, ei, edge_attr=ea, backend=b, **kw), [q, k, att, edge])
            compare(f"{label} dot loops={loops} p={p}",
                    lambda b: gnnfuse.dot_attention(q, k, v, ei, backend=b, **kw), [q, k, v])
            compare(f"{label} dot+edge loops={loops} p={p}",
                    lambda b: gnnfuse.dot_attention(q, k, v, ei, edge_attr=ea, backend=b, **kw), [q, k, v, edge])
            compare(f"{label} gat loops={loops} p={p}",
                    lambda b: gnnfuse.gat_attention(k, a_src, a_dst, ei, backend=b, **kw), [k, a_src, a_dst])
        for reduce in ("sum", "mean"):
            compare(f"{label} head weights {reduce}",
                    lambda b: gnnfuse.fused_gather_scatter(k, ei, reduce, edge_weight=w, backend=b), [k, w])
    print("all attention checks passed")


if __name__ == "__main__":
    main()
