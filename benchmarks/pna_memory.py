"""Where the memory of a gnnfuse PNAConv training step goes: every operator of one step (forward,
then the gradients of every parameter) with the bytes live after it and its peak, above what was
allocated before the step, the largest first.

    PYTHONPATH=. python -m benchmarks.pna_memory --device cuda --nodes 170000 --edges 1170000
    GNNFUSE_BACKEND=triton TRITON_INTERPRET=1 PYTHONPATH=. python -m benchmarks.pna_memory --nodes 600 --edges 4000

On CUDA the numbers are the caching allocator's (``memory_allocated``; an operator's peak includes
its internal temporaries, Triton buffers too). On CPU only tensors that operators return are
counted (a weak reference per storage), so a custom op's internal temporaries are missing: use it
for the order of what lives when, scaled by nodes, and the CUDA run for the real peak.
Same layer as benchmarks.bench_aggregation's ``pna`` table (4 towers, mean/min/max/std, three
scalers, x of width F, no gradient of x).
"""
from __future__ import annotations

import argparse
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Live:
    """Bytes of the storages operators have returned and that are still alive (CPU)."""

    def __init__(self):
        self.bytes, self.seen = 0, {}
        self.peak, self.at_peak = 0, []

    def add(self, t, origin):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self.seen or st.nbytes() == 0:
            return
        self.seen[key] = (st.nbytes(), origin, tuple(t.shape))
        self.bytes += st.nbytes()
        weakref.finalize(st, self._drop, key, st.nbytes())
        if self.bytes > self.peak:
            self.peak, self.at_peak = self.bytes, sorted(self.seen.values(), reverse=True)

    def _drop(self, key, n):
        self.seen.pop(key, None)
        self.bytes -= n


class MemoryLog(TorchDispatchMode):
    """Records (phase, operator, live bytes after it, its peak) for every operator dispatched."""

    def __init__(self, cuda: bool):
        super().__init__()
        self.cuda, self.phase, self.rows, self.live = cuda, "forward", [], _Live()
        self.base = torch.cuda.memory_allocated() if cuda else 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        out = func(*args, **(kwargs or {}))
        if self.cuda:
            live, peak = torch.cuda.memory_allocated() - self.base, torch.cuda.max_memory_allocated() - self.base
        else:
            if not func.is_view:  # a view shares its input's storage (counted where made, or an input)
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                        self.live.add(t, f"{self.phase} #{len(self.rows)} {func.name()}")
            live = peak = self.live.bytes
        shapes = [tuple(t.shape) for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.rows.append((self.phase, str(func.name()), live, peak, shapes))
        return out


def main(argv=None):
    import torch_geometric.nn as pyg_nn

    import gnnfuse.nn as G

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--nodes", type=int, default=600)
    p.add_argument("--edges", type=int, default=4000)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--chunk", default="default", help="aggregation_chunk_features: an int, 'none' or 'default'")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, args.nodes, (2, args.edges), generator=g).to(device)
    deg = torch.bincount(torch.bincount(edge_index[1].cpu(), minlength=args.nodes))
    x = torch.randn(args.nodes, args.width, generator=g).to(device)
    conv = G.PNAConv(args.width, args.width, ["mean", "min", "max", "std"],
                     ["identity", "amplification", "attenuation"], deg, towers=4).to(device).train()
    if args.chunk != "default":
        conv.aggregation_chunk_features = None if args.chunk == "none" else int(args.chunk)
    params = list(conv.parameters())
    torch.autograd.grad(conv(x, edge_index).square().mean(), params)  # per-graph caches count as inputs
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    log = MemoryLog(cuda)
    with log:
        loss = conv(x, edge_index).square().mean()
        log.phase = "backward"
        saved = sorted(log.live.seen.values(), reverse=True)
        torch.autograd.grad(loss, params)
    mb = 2**20
    output = args.nodes * 4 * args.width * x.element_size()
    print(f"chunk {conv.aggregation_chunk_features}, device {device}, N={args.nodes}, E={args.edges}, F={args.width}; one [N, 4F] output: {output / mb:.1f} MB")
    for phase in ("forward", "backward"):
        rows = [r for r in log.rows if r[0] == phase]
        top = max(rows, key=lambda r: r[3])
        print(f"{phase}: {len(rows)} ops, peak {top[3] / mb:.1f} MB ({top[3] / output:.2f} outputs) at {top[1]}, "
              f"live at its end {rows[-1][2] / mb:.1f} MB")
    if not cuda:
        print(f"\nlive after the forward ({sum(n for n, *_ in saved) / mb:.1f} MB: the loss's input and what "
              "autograd saved), the largest first (MB, made by, shape):")
        for n, origin, shape in saved[:args.top]:
            print(f"  {n / mb:8.2f}  {origin:55s} {shape}")
        print(f"\nlive at the peak ({log.live.peak / mb:.1f} MB), the largest first (MB, made by, shape):")
        for n, origin, shape in log.live.at_peak[:args.top]:
            print(f"  {n / mb:8.2f}  {origin:55s} {shape}")
    print(f"\nthe {args.top} operators with the highest peak (phase, op, live MB after, peak MB, output shapes):")
    order = sorted(range(len(log.rows)), key=lambda i: -log.rows[i][3])[:args.top]
    for i in sorted(order):
        phase, name, live, peak, shapes = log.rows[i]
        print(f"  #{i:4d} {phase:8s} {name:45s} {live / mb:9.2f} {peak / mb:9.2f}  {shapes}")


if __name__ == "__main__":
    main()
