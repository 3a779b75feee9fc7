"""Per-call cost on CPU where the graph is small (Cora-sized, and a tiny 4-node ring where the
kernel is ~1 us): what a call spends above its kernel.

    python -m benchmarks.bench_cpu_overhead --out "$OUT" [--graph Cora] [--widths 16,64] [--threads 1]
        [--clock cpu|wall]

Rows, timed in turns (variants interleaved; median and min of per-call times over batches of calls): the
public call given a CSR (inference; the forward recording the autograd node; forward+backward), the
registered op ``torch.ops.gnnfuse.gather_scatter`` (the route torch.compile takes; its CPU kernel is
registered in C++), the C++ kernels called alone (forward; forward then backward), and the anchors
torch.sparse.mm (prebuilt CSR, forward and forward+backward) and ``x * 1`` forward+backward (the
autograd round trip's floor). "(before)" rows time the earlier per-call path in the same run: the
kernels through their pybind11 binding instead of csrc/fast_call.h's, the autograd node through
``torch.autograd.Function.apply`` instead of the C apply it ends in, and (the oldest) the settings
read through ``os.environ`` and the argument scan in Python. Three rows show why a wider row costs
more above the kernel although the layer does no work that grows with F (no copy, no zeroing, one
output allocation): the kernel alone with its previous output kept alive (one more output buffer
in the caches), the call's checks alone (``check_call``, no kernel), and the kernel followed by
those checks, which costs more than the two apart as x and the outputs grow (Cora F=128, 2.9 MB
of them: checks of 1.6 us alone cost 4.7-6.7 us run after the kernel): after any Python code the kernel runs on colder caches
and TLB than back to back (glibc also hands back two alternating blocks for an output this size,
since torch's 64-byte-aligned allocations cannot reuse the block just freed). ``above_kernel_us`` = the row's time minus the kernels alone (same
graph and width; ``above_kernel_min_us`` the same from the fastest rounds). The tiny graph measures
the per-call cost best: on Cora the difference is a few us between two 30-50 us timings, within
their spread on a loaded machine, and it also counts the kernel running colder after Python code
(back to back, the kernel keeps its cache and TLB entries). The default clock is the process's CPU time (``--clock cpu``): on a shared,
loaded machine it leaves out the time other processes hold the core, which wall time counts (with
one thread the two agree on a quiet machine; with several, CPU time adds the threads up: use
``--clock wall``). Cora comes from the shared data folder when present,
else a random graph of Cora's size (2708 nodes, 10556 edges) is used (the ``graph`` column says which).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import time

import torch

from benchmarks.common import device_label, machine, save_results


def per_call_us(fns: dict, calls: int = 200, rounds: int = 9, clock=time.perf_counter,
                contexts: dict | None = None) -> dict[str, float]:
    """Median over rounds of (time of ``calls`` back-to-back calls) / calls, variants in turns.
    ``contexts``: name -> a context manager factory entered around that variant's batches (untimed)."""
    names = list(fns)
    contexts = contexts or {}
    for name in names:
        with contexts.get(name, contextlib.nullcontext)():
            for _ in range(50):
                fns[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    gc.disable()
    try:
        for r in range(rounds):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                fn = fns[name]
                with contexts.get(name, contextlib.nullcontext)():
                    t0 = clock()
                    for _ in range(calls):
                        fn()
                    samples[name].append((clock() - t0) / calls * 1e6)
    finally:
        gc.enable()
    return {n: (statistics.median(v), min(v)) for n, v in samples.items()}


def _graph(name: str) -> tuple[torch.Tensor, int, str]:
    try:
        from benchmarks.graphs import real_edge_index

        found = real_edge_index(name)
    except Exception:  # noqa: BLE001  (no PyG or no data: fall back to a graph of the same size)
        found = None
    if found is not None:
        return found[0], found[1], name
    g = torch.Generator().manual_seed(0)
    n, e = 2708, 10556
    return torch.randint(0, n, (2, e), generator=g), n, f"random({n} nodes, {e} edges)"


def _kernels(ext):
    """The C++ forward and backward kernels with the ops' arguments (pybind), also on code from
    before they were registered in C++ (whose pybind forward took a flag instead of the transpose)."""
    if hasattr(ext, "gather_scatter"):
        return ext.gather_scatter, ext.gather_scatter_backward
    old = ext.gather_scatter_forward
    return (lambda x, rowptr, col, w, t_rowptr, t_col, t_pos, reduce: old(x, rowptr, col, w, reduce,
                                                                           t_rowptr is not None),
            ext.gather_scatter_backward)


@contextlib.contextmanager
def python_helpers():
    """The per-call path without its two C++ helpers, as before they existed: settings read through
    ``os.environ.get`` and the eager route's argument scan in Python (the 'before' of one run)."""
    from gnnfuse import config
    from gnnfuse.ops import _opdef

    saved = config._getenv, _opdef._scan_args
    config._getenv, _opdef._scan_args = os.environ.get, None
    try:
        yield
    finally:
        config._getenv, _opdef._scan_args = saved


@contextlib.contextmanager
def before_bindings(ext):
    """The per-call path as before csrc/fast_call.h and the C apply of the autograd node: the
    gather-scatter kernels through pybind11, the node through torch.autograd.Function.apply."""
    from gnnfuse.ops import _opdef
    from gnnfuse.ops import gather_scatter as ops

    if not hasattr(ext, "gather_scatter_pybind") or not hasattr(_opdef, "_eager_apply"):  # an older tree: it is "before"
        yield
        return
    ops.FORWARD.kernels["cpu"](*_EMPTY_CALL)  # (loads the extension: the first call replaces the loader)
    saved = ops.FORWARD.kernels["cpu"], ops.BACKWARD.kernels["cpu"], _opdef._eager_apply
    ops.FORWARD.kernels["cpu"], ops.BACKWARD.kernels["cpu"] = ext.gather_scatter_pybind, ext.gather_scatter_backward_pybind
    _opdef._eager_apply = _opdef._Eager.apply
    try:
        yield
    finally:
        ops.FORWARD.kernels["cpu"], ops.BACKWARD.kernels["cpu"], _opdef._eager_apply = saved


_EMPTY_CALL = (torch.zeros(1, 1), torch.zeros(2, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), None, None,
               None, None, "sum")


def _rows(graph: str, csr, ext, F: int, clock, calls: int, rounds: int) -> list[dict]:
    import gnnfuse
    from gnnfuse.ops.gather_scatter import check_call

    n = csr.num_dst
    adj = torch.sparse_csr_tensor(csr.rowptr.long(), csr.col.long(), torch.ones(csr.num_edges), (n, n))
    x = torch.randn(n, F)
    xr = x.clone().requires_grad_()
    g = torch.randn(n, F)
    t = csr.transpose_parts()
    forward, backward = _kernels(ext)
    kept = [None]
    fns = {
        "kernel alone (C++), forward": lambda: forward(x, csr.rowptr, csr.col, None, None, None, None, "sum"),
        "kernels alone (C++), forward+backward": lambda: backward(
            g, x, csr.rowptr, csr.col, None, *t, forward(x, csr.rowptr, csr.col, None, *t, "sum")[1], "sum", True,
            False),
        "kernel alone, previous output kept alive": lambda: kept.__setitem__(
            0, forward(x, csr.rowptr, csr.col, None, None, None, None, "sum")),
        "the call's checks alone (check_call)": lambda: check_call(x, csr, "sum", None, None, "auto"),
        "kernel, then the call's checks": lambda: (forward(x, csr.rowptr, csr.col, None, None, None, None, "sum"),
                                                   check_call(x, csr, "sum", None, None, "auto")),
        "public call, forward (no grad)": lambda: gnnfuse.fused_gather_scatter(x, csr, "sum"),
        "same, pybind11 binding (before)": lambda: gnnfuse.fused_gather_scatter(x, csr, "sum"),
        "same, Python helpers (before)": lambda: gnnfuse.fused_gather_scatter(x, csr, "sum"),
        "registered op, forward": lambda: torch.ops.gnnfuse.gather_scatter(x, csr.rowptr, csr.col, None,
                                                                           None, None, None, "sum"),
        "torch.sparse.mm, forward": lambda: torch.sparse.mm(adj, x),
        "public call, forward recording the autograd node": lambda: gnnfuse.fused_gather_scatter(xr, csr, "sum"),
        "same, Function.apply and pybind11 (before)": lambda: gnnfuse.fused_gather_scatter(xr, csr, "sum"),
        "public call, forward+backward": lambda: torch.autograd.grad(
            gnnfuse.fused_gather_scatter(xr, csr, "sum"), xr, g),
        "forward+backward, Function.apply and pybind11 (before)": lambda: torch.autograd.grad(
            gnnfuse.fused_gather_scatter(xr, csr, "sum"), xr, g),
        "registered op, forward+backward": lambda: torch.autograd.grad(
            torch.ops.gnnfuse.gather_scatter(xr, csr.rowptr, csr.col, None, *t, "sum")[0], xr, g),
        "torch.sparse.mm, forward+backward": lambda: torch.autograd.grad(torch.sparse.mm(adj, xr), xr, g),
        "autograd floor: (x * 1) forward+backward": lambda: torch.autograd.grad(xr * 1.0, xr, g),
    }
    before = lambda: before_bindings(ext)  # noqa: E731
    contexts = {"same, Python helpers (before)": python_helpers, "same, pybind11 binding (before)": before,
                "same, Function.apply and pybind11 (before)": before,
                "forward+backward, Function.apply and pybind11 (before)": before}
    timed = per_call_us(fns, calls=calls, rounds=rounds, clock=clock, contexts=contexts)
    times = {name: med for name, (med, _) in timed.items()}
    rows = []
    for name, us in times.items():
        both = "backward" in name
        anchor = times["torch.sparse.mm, forward+backward" if both else "torch.sparse.mm, forward"]
        kernel_name = "kernels alone (C++), forward+backward" if both else "kernel alone (C++), forward"
        kernel, kernel_min = times[kernel_name], timed[kernel_name][1]
        ours = not ("floor" in name or "sparse" in name or "checks alone" in name)  # (rows that run no kernel)
        rows.append(dict(graph=graph, F=F, call=name, us_per_call=round(us, 2), min_us=round(timed[name][1], 2),
                         above_kernel_us=round(us - kernel, 2) if ours else None,
                         above_kernel_min_us=round(timed[name][1] - kernel_min, 2) if ours else None,
                         vs_sparse_mm=round(anchor / us, 2)))
        print(f"{graph[:10]:10s} F={F:4d} {name:42s} {us:8.2f} us  x{anchor / us:.2f}", flush=True)
    return rows


def main(argv=None):
    import gnnfuse
    from gnnfuse._build import load_extension

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--graph", default="Cora")
    ap.add_argument("--widths", default="16,64")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: the process's CPU time (default; robust on a loaded machine); wall: elapsed time")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (median and fastest reported)")
    ap.add_argument("--calls", type=int, default=200, help="calls per batch on the Cora-sized graph (1000 on the tiny)")
    ap.add_argument("--label", default="", help="a tag for the result file name (e.g. before/after)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    load_before = os.getloadavg()[0]
    ei, n, graph = _graph(args.graph)
    ext = load_extension()
    tiny = gnnfuse.CSR.from_edge_index(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), 4)
    rows = _rows("tiny (4-node ring)", tiny, ext, 8, clock, calls=1000, rounds=args.rounds)
    csr = gnnfuse.CSR.from_edge_index(ei, n)
    for F in map(int, args.widths.split(",")):
        rows += _rows(graph, csr, ext, F, clock, calls=args.calls, rounds=args.rounds)
    meta = machine("cpu")
    meta.update(benchmark="bench_cpu_overhead", graph=graph, nodes=n, edges=csr.num_edges,
                threads=torch.get_num_threads(), clock=args.clock,
                load_average_1min=f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    tag = f"_{args.label}" if args.label else ""
    save_results(f"cpu-overhead_{device_label('cpu')}_{time.strftime('%Y-%m-%d')}{tag}", meta, rows,
                 ["graph", "F", "call", "us_per_call", "min_us", "above_kernel_us", "above_kernel_min_us",
                  "vs_sparse_mm"], args.out,
                 notes=__doc__.split("\n\n", 2)[2])


if __name__ == "__main__":
    main()
