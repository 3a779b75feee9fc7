"""Helpers shared by the test suite and benchmarks: graphs, dtypes, tolerances, data paths."""
from __future__ import annotations

import torch

from .constants import INDEX_DTYPES  # noqa: F401  (re-exported for tests)
from .datasets import data_root  # noqa: F401  (re-exported for tests)
from .graphs import hub_graph, random_graph  # noqa: F401  (the graph generators live in gnnfuse.graphs)

# the value dtypes the ops accept (gnnfuse.constants.VALUE_DTYPES, a test checks), in the tests' order
VALUE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# (atol, rtol) against a float64 reference, per value dtype
TOLERANCES = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-2, 2e-2),
    torch.bfloat16: (1e-1, 5e-2),
}


def through_registered_op():
    """A context manager that makes the public functions take their registered torch.library op
    instead of the eager shortcut (any active dispatch mode does; this one changes nothing else)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return PassThrough()


def outputs_at_thread_counts(run, counts=None) -> list:
    """``run()``'s result once per intra-op thread count in ``counts`` (default: 1 and at least 2),
    torch's own count restored afterwards: the determinism tests compare them bit for bit."""
    threads = torch.get_num_threads()
    results = []
    try:
        for n in counts or (1, max(2, threads)):
            torch.set_num_threads(n)
            results.append(run())
    finally:
        torch.set_num_threads(threads)
    return results


def assert_compiled_like_eager(conv, x, graph, num_edges: int, edge_dim: int) -> None:
    """``torch.compile(conv, fullgraph=True)`` against eager ``conv`` on an edge_attr [num_edges, edge_dim]
    with and without a gradient (eager keeps a constant edge_attr's copy in CSR order, compiled code does
    not): outputs, and the gradients of x and of an edge_attr that asks for one."""
    for ea_grad in (False, True):
        ea = torch.randn(num_edges, edge_dim, requires_grad=ea_grad)
        out, eager = torch.compile(conv, fullgraph=True)(x, graph, ea), conv(x, graph, ea)
        torch.testing.assert_close(out, eager)
        leaves = (x, ea) if ea_grad else (x,)
        for g, r in zip(torch.autograd.grad(out.sum(), leaves), torch.autograd.grad(eager.sum(), leaves)):
            torch.testing.assert_close(g, r)


class TwoLayerNet(torch.nn.Module):
    """``conv2(relu(conv1(x, graph)), graph)`` for any conv class: the model the nn tests and the
    end-to-end benchmark compare between stock PyG and gnnfuse.nn."""

    def __init__(self, conv, f_in: int, hidden: int, f_out: int, **kw):
        super().__init__()
        self.conv1, self.conv2 = conv(f_in, hidden, **kw), conv(hidden, f_out, **kw)

    def forward(self, x, graph):
        return self.conv2(self.conv1(x, graph).relu(), graph)
