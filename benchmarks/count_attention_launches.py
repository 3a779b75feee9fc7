"""What one attention layer's training step asks of the device: per layer and phase (forward /
backward), the Triton kernel launches and the torch ops, split into those that launch a CUDA kernel
(or a memset / copy) and those that only make views or allocate. Runs anywhere: on CUDA tensors where a GPU
is present, else on CPU tensors with the Triton kernels in the interpreter (TRITON_INTERPRET=1, set
by ``main`` and by the tests' conftest); either way each torch op is counted
as the CUDA build would run it (torch.profiler's top-level ``aten::`` events; a Triton launch's own
inner work is not counted). On a GPU the profile (benchmarks/gpu/profile_attention.py) counts the
real kernels; this count is what the Python side issues, so it can pin the count in a test
(tests/test_attention_launches.py).

    PYTHONPATH=. python -m benchmarks.count_attention_launches [--layers GATConv] [--heads 8 --width 8] [--ops]
"""
from __future__ import annotations

import argparse
import os
from collections import Counter
from contextlib import contextmanager

import torch

LAYERS = ("GATConv", "GATv2Conv", "TransformerConv")
# torch ops that launch nothing on a GPU (views, metadata, allocation without a fill)
NO_KERNEL = {
    "aten::view", "aten::_reshape_alias", "aten::_unsafe_view", "aten::as_strided", "aten::t", "aten::transpose",
    "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::detach", "aten::alias",
    "aten::slice", "aten::select", "aten::split", "aten::unbind", "aten::empty", "aten::empty_like",
    "aten::new_empty", "aten::empty_strided", "aten::new_empty_strided", "aten::resize_", "aten::lift_fresh",
    "aten::result_type", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::view_as",
    "aten::expand_as", "aten::narrow", "aten::resolve_conj", "aten::resolve_neg", "aten::diagonal",
    "aten::randint", "aten::random_",  # (the dropout seed: drawn on the CPU generator)
}
# composite ops: what they launch is their children's (counted one level down)
COMPOSITE = {"aten::linear", "aten::matmul", "aten::einsum", "aten::contiguous", "aten::to", "aten::_to_copy",
             "aten::reshape", "aten::reshape_as", "aten::flatten", "aten::zeros_like", "aten::zeros",
             "aten::new_zeros", "aten::ones_like", "aten::square", "aten::dropout", "aten::clone", "aten::stack"}


@contextmanager
def _triton_marks():
    """Marks each Triton launch with a profiler range ``triton::<kernel>`` (what it runs inside is
    the interpreter's, not counted): FastKernel's launches and a setup's bound ones
    (BoundLaunches, which on a GPU launch without FastKernel once bound; where they go through it,
    the inner mark is inside the outer one, which alone is counted)."""
    from gnnfuse.triton import _launch

    original, original_bound = _launch.FastKernel._launch, _launch.BoundLaunches.__call__

    def name_of(kernel):
        kernel = getattr(kernel, "kernel", kernel)  # (a FastKernel's JIT function)
        return getattr(getattr(kernel, "fn", kernel), "__name__", "kernel")

    def marked(self, grid, args, meta):
        with torch.profiler.record_function(f"triton::{name_of(self.kernel)}"):
            return original(self, grid, args, meta)

    def marked_bound(self, step, kernel, grid, args, meta, fast):
        with torch.profiler.record_function(f"triton::{name_of(kernel)}"):
            return original_bound(self, step, kernel, grid, args, meta, fast)

    _launch.FastKernel._launch, _launch.BoundLaunches.__call__ = marked, marked_bound
    try:
        yield
    finally:
        _launch.FastKernel._launch, _launch.BoundLaunches.__call__ = original, original_bound


def _launches(events) -> tuple[Counter, Counter]:
    """(device launches by name, host-only ops by name) of profiler events: the top-level aten ops
    (and, for composite ops, their children that launch) and the Triton marks."""
    launches, host = Counter(), Counter()

    def visit(evt):
        name = evt.name
        if name.startswith("triton::"):
            launches[name] += 1
            return
        if not name.startswith("aten::"):
            for child in evt.cpu_children:
                visit(child)
            return
        if name in COMPOSITE:
            host[name] += 1
            for child in evt.cpu_children:
                visit(child)
            return
        if name in NO_KERNEL:
            host[name] += 1
            return
        launches[name] += 1  # the op's own kernel(s); its children are its implementation

    for evt in events:
        if evt.cpu_parent is None:
            visit(evt)
    return launches, host


def count_step(layer_name: str, heads: int = 8, width: int = 8, nodes: int = 12, dropout: float = 0.6,
               seed: int = 0) -> dict[str, tuple[Counter, Counter]]:
    """{"forward": (launches, host ops), "backward": (...)} of one training step of gnnfuse.nn's
    ``layer_name`` on a small random graph (every row short: no split rows), Triton backend (CUDA
    tensors where a GPU is present, else CPU tensors: the interpreter)."""
    import gnnfuse.nn as G

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    src = torch.randint(0, nodes, (4 * nodes,))
    dst = torch.randint(0, nodes, (4 * nodes,))
    edge_index = torch.stack([src, dst]).to(device)
    x = torch.randn(nodes, 16, device=device)
    layer = getattr(G, layer_name)(16, width, heads=heads, dropout=dropout).to(device).train()
    layer.gnnfuse_backend = "triton"
    params = list(layer.parameters())
    out = layer(x, edge_index)  # first call: builds and caches the graph's CSR, transpose, work lists
    torch.autograd.grad(out.square().mean(), params)
    result = {}
    with _triton_marks():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = layer(x, edge_index)
            loss = out.square().mean()
        result["forward"] = _launches(prof.profiler.function_events)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            torch.autograd.grad(loss, params)
        result["backward"] = _launches(prof.profiler.function_events)
    return result


def main() -> None:
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first Triton kernel module is imported
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--ops", action="store_true", help="list every op by name")
    args = parser.parse_args()
    print("| layer | phase | Triton launches | torch launches | host-only torch ops |")
    print("|---|---|---|---|---|")
    details = []
    for layer in args.layers.split(","):
        for phase, (launches, host) in count_step(layer, args.heads, args.width).items():
            triton = sum(c for n, c in launches.items() if n.startswith("triton::"))
            torch_l = sum(c for n, c in launches.items() if not n.startswith("triton::"))
            print(f"| {layer} | {phase} | {triton} | {torch_l} | {sum(host.values())} |")
            details.append((layer, phase, launches, host))
    if args.ops:
        for layer, phase, launches, host in details:
            print(f"\n{layer} {phase}:\n  launches: {dict(sorted(launches.items()))}")
            print(f"  host: {dict(sorted(host.items()))}")


if __name__ == "__main__":
    main()
